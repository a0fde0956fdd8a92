"""What the cluster admin decides for every tenant (``prefixtune run`` flags, the chart's values),
and the checks of a tenant's spec against it. One place for these facts:

- ``allowed_images``: registries/repositories engine and router pods may run (default: the engines'
  and the routers' default images' repositories). spec.routing.image, when it names another image
  than the router's default, is the tenant's choice, as spec.image is, and would run next to a
  ServiceAccount that may list pods: the policy holds it whatever the routing policy. The routers'
  default images are the operator's own, as its image is, and always allowed;
- ``prometheus_url``: the Prometheus the operator queries for ``metrics.source: prometheus``; a
  spec's own ``metrics.url`` is used only when its host is in ``prometheus_hosts`` (default: none),
  so a tenant cannot make the operator fetch an address of its choosing from the operator's network;
- ``prometheus_ca_file``: the CA bundle for an https Prometheus (TLS is always verified);
- ``prometheus_operator_labels``: every queried series must also carry the operator's own pod labels
  (``render.prometheus_labels``: the ServiceMonitor it renders copies them; a ``labelmap`` of the pod
  labels does too), so a series of a pod the operator does not manage never counts. Off by default
  for scrape configs that drop pod labels; the chart turns it on;
- ``allow_host_path``: whether ``spec.pod.volumes`` may hold a hostPath volume (default: no: a node's
  directory is outside the tenant's namespace, and a writable one can reach the node itself);
- ``router_images``: the image each router runs when spec.routing.image is left out (default:
  ``routing.policy.DEFAULT_ROUTER_IMAGE``, which nobody publishes: a platform team builds
  ``Dockerfile.router`` into its own registry and names it here). Like the defaults, they always run;
- ``auto_routing``: whether spec.routing.policy ``auto`` may put a router in front of a resource's
  engines (default: yes; off, ``auto`` means kube-proxy and only an explicit policy gets a router, so
  an upgrade adds no router to a cluster that has no router image yet).

``AdminPolicy.admitted`` applies the last two to a valid spec: the reconcile, ``prefixtune render``
and the last-valid-spec fallback all render the admitted spec, never the raw one.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from prefixtune.api.models import ServingDeploymentSpec
from prefixtune.api.references import image_problem, policy_problem, repository
from prefixtune.engines.base import EngineName
from prefixtune.engines.registry import get_adapter
from prefixtune.routing.policy import AUTO_POLICY, DEFAULT_ROUTER_IMAGE, Router, RoutingPolicy


def engine_repositories() -> tuple[str, ...]:
    """The repositories of the engines' and the routers' default images (the default image policy)."""
    defaults = [get_adapter(name).default_image for name in EngineName] + list(DEFAULT_ROUTER_IMAGE.values())
    return tuple(sorted({repository(image) for image in defaults}))


@dataclass(frozen=True)
class AdminPolicy:
    allowed_images: tuple[str, ...] = field(default_factory=engine_repositories)
    prometheus_url: str | None = None
    prometheus_hosts: tuple[str, ...] = ()
    prometheus_ca_file: str | None = None
    prometheus_operator_labels: bool = False
    allow_host_path: bool = False
    router_images: tuple[tuple[Router, str], ...] = ()  # (router, image): overrides of the defaults
    auto_routing: bool = True

    def router_image(self, router: Router) -> str:
        """The image ``router`` runs when spec.routing.image is left out: the admin's, else the default."""
        return dict(self.router_images).get(router, DEFAULT_ROUTER_IMAGE[router])

    def admitted(self, spec: ServingDeploymentSpec) -> ServingDeploymentSpec:
        """``spec`` with the admin's routing defaults (module docstring): the router's default image
        replaced by the admin's, and ``auto`` turned into ``kube-proxy`` when auto routing is off.
        ``spec`` itself is left as it was (validation filled the default image in: an image equal to
        the built-in default is taken as left out)."""
        routing = spec.routing
        router = routing.router
        image = self.router_image(router) if router is not None else None
        swap_image = (
            router is not None and routing.image == DEFAULT_ROUTER_IMAGE[router] and image != routing.image
        )
        no_auto = not self.auto_routing and routing.policy == AUTO_POLICY
        if not swap_image and not no_auto:
            return spec
        update: dict[str, object] = {}
        if swap_image:
            update["image"] = image
        if no_auto:
            update["policy"] = RoutingPolicy.KUBE_PROXY.value
        return spec.model_copy(update={"routing": routing.model_copy(update=update)})

    def spec_problems(self, spec: ServingDeploymentSpec) -> list[str]:
        """Why the admin's policy refuses this spec ("path: reason"; empty: it does not)."""
        problems: list[str] = []
        image = spec.image or get_adapter(spec.engine).default_image
        problem = policy_problem(image, self.allowed_images)
        if problem:
            problems.append(f"spec.image: {problem}")
        router, chosen = spec.routing.router, spec.routing.image
        # A tenant's router image is checked whatever the policy (a listed space policy or an explicit
        # one may run it); the router's default image is the operator's, as its own image is.
        if (
            chosen
            and router is not None
            and chosen not in (DEFAULT_ROUTER_IMAGE[router], self.router_image(router))
        ):
            problem = policy_problem(chosen, self.allowed_images)
            if problem:
                problems.append(f"spec.routing.image: {problem}")
        if not self.allow_host_path and spec.pod is not None:
            problems += [
                f"spec.pod.volumes[{i}].hostPath: the admin does not allow hostPath volumes "
                "(prefixtune run --allow-host-path-volumes); use a persistentVolumeClaim or an emptyDir"
                for i, volume in enumerate(spec.pod.volumes)
                if volume.host_path is not None
            ]
        metrics = spec.tuning.metrics
        if metrics.url is not None and not self.host_allowed(metrics.url):
            problems.append(
                "spec.tuning.metrics.url: the operator queries only its own Prometheus (--prometheus-url) "
                "or hosts the admin allowed (--prometheus-allowed-hosts: "
                f"{', '.join(self.prometheus_hosts) or 'none'}); remove the field to use the operator's"
            )
        elif metrics.source.value == "prometheus" and metrics.url is None and self.prometheus_url is None:
            problems.append(
                "spec.tuning.metrics.source: prometheus, but the operator has no Prometheus configured "
                "(--prometheus-url, the chart's prometheus.url); use source: scrape"
            )
        return problems

    def host_allowed(self, url: str) -> bool:
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").lower()
            netloc = f"{host}:{parts.port}" if parts.port else host
        except ValueError:
            return False
        if parts.username or parts.password or parts.query or parts.fragment:
            return False  # no credentials or attacker-chosen query strings in the admin's URL either
        return any(entry.lower() in (host, netloc) for entry in self.prometheus_hosts)

    def prometheus_for(self, spec: ServingDeploymentSpec) -> str | None:
        """The Prometheus base URL a resource's windows are queried at (None: none configured)."""
        url = spec.tuning.metrics.url
        if url is not None and self.host_allowed(url):
            return url
        return self.prometheus_url


def parse_list(values: Sequence[str]) -> tuple[str, ...]:
    """Repeatable or comma-separated flag values."""
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


# The admin's Prometheus: an http(s) URL without credentials, query or fragment.
PROMETHEUS_URL = re.compile(r"^https?://[^\s/?#@]+[^\s?#@]*$")


def add_spec_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """The admin flags a tenant's spec is checked against (``spec_problems``): ``prefixtune run``
    takes them, and ``prefixtune render`` takes the same to check a spec as that operator would."""
    parser.add_argument(
        "--allowed-images",
        action="append",
        default=[],
        help="registries/repositories engine pods may run, comma-separated or repeated "
        f"(default: the engines' own: {', '.join(engine_repositories())})",
    )
    parser.add_argument(
        "--prometheus-url", default=None, help="the Prometheus queried for metrics.source: prometheus"
    )
    parser.add_argument(
        "--prometheus-allowed-hosts",
        action="append",
        default=[],
        help="host[:port]s a spec's metrics.url may name (default: none; the operator's own URL is used)",
    )
    parser.add_argument(
        "--allow-host-path-volumes",
        action="store_true",
        help="let spec.pod.volumes mount a node's directory (hostPath; default: refused)",
    )
    parser.add_argument(
        "--router-image",
        action="append",
        default=[],
        metavar="ROUTER=IMAGE",
        help="the image a router runs when spec.routing.image is left out, repeated per router "
        f"({', '.join(r.value for r in Router)}; default: {', '.join(DEFAULT_ROUTER_IMAGE.values())})",
    )
    parser.add_argument(
        "--no-auto-routing",
        action="store_true",
        help="spec.routing.policy auto means kube-proxy: only an explicit policy gets a router",
    )


def spec_policy_from_args(args: argparse.Namespace) -> AdminPolicy:
    """The policy of ``add_spec_policy_arguments``' flags; raises ValueError for a bad URL."""
    if args.prometheus_url is not None and not PROMETHEUS_URL.match(args.prometheus_url):
        raise ValueError(
            "--prometheus-url must be an http(s) URL without credentials, query or fragment, "
            f"got {args.prometheus_url!r}"
        )
    return AdminPolicy(
        allowed_images=parse_list(args.allowed_images) or engine_repositories(),
        prometheus_url=args.prometheus_url,
        prometheus_hosts=parse_list(args.prometheus_allowed_hosts),
        allow_host_path=bool(args.allow_host_path_volumes),
        router_images=parse_router_images(parse_list(args.router_image)),
        auto_routing=not args.no_auto_routing,
    )


def parse_router_images(values: Sequence[str]) -> tuple[tuple[Router, str], ...]:
    """``--router-image`` values (``ROUTER=IMAGE``), one per router; raises ValueError naming the bad one."""
    images: dict[Router, str] = {}
    routers = ", ".join(r.value for r in Router)
    for value in values:
        name, sep, image = value.partition("=")
        try:
            router = Router(name.strip())
        except ValueError:
            raise ValueError(f"--router-image {value!r}: the router must be one of {routers}") from None
        image = image.strip()
        if not sep or not image:
            raise ValueError(
                f"--router-image {value!r}: expected ROUTER=IMAGE, e.g. {router.value}=REGISTRY/IMAGE:TAG"
            )
        problem = image_problem(image)
        if problem:
            raise ValueError(f"--router-image {value!r}: {problem}")
        if router in images and images[router] != image:
            raise ValueError(f"--router-image: {router.value} is given twice ({images[router]!r}, {image!r})")
        images[router] = image
    return tuple(sorted(images.items()))

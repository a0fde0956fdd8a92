"""The router's Kubernetes objects, rendered from ``RoutingSettings`` (pure functions, plain dicts).

A resource whose routing resolves to a router (``RoutingSettings.routed``) gets five objects, all
named ``<resource>-router`` and owned by it: a Deployment running the router's binary, a Service in
front of the router pods, a ServiceAccount, a Role that lets it get/list/watch pods in its own
namespace (the routers' Kubernetes service discovery watches the engine pods; nothing else), and a
RoleBinding. The user-facing Service keeps the resource's name: with a router it selects the router
pods (clients keep their URL and port and go through the router), and the engine pods get their own
Service, ``<resource>-engines`` (the ServiceMonitor's engine endpoints, direct access).

Flags, checked against ``sglang-router launch --help`` (0.3.2) and ``vllm-router --help`` (0.1.17):
``--host``, ``--port``, ``--policy``, ``--cache-threshold``, ``--balance-abs-threshold``,
``--balance-rel-threshold``, ``--max-tree-size``, ``--prometheus-host``, ``--prometheus-port``,
``--service-discovery``, ``--selector k=v ...`` (nargs +), ``--service-discovery-namespace``,
``--service-discovery-port``.

The controller supplies who owns the objects (``RouterOwner``: namespace, name, owner reference,
the operator's labels) and the engine pods' selector and port; this module knows no controller.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prefixtune.api import owned
from prefixtune.api.models import ServingDeploymentSpec
from prefixtune.engines.base import KnobConfig
from prefixtune.engines.knobs import PREFIX_CACHING, ROUTING_POLICY
from prefixtune.routing.policy import (
    DEFAULT_MAX_TREE_SIZE,
    DEFAULT_ROUTER_IMAGE,
    ROUTER_COMMAND,
    ROUTER_METRICS_PORT,
    ROUTER_NEEDS,
    ROUTER_PORT,
    Router,
    RoutingPolicy,
)
from prefixtune.routing.settings import ENGINE_ROUTER, RoutingSettings

ROUTER_SUFFIX = "-router"
ENGINES_SUFFIX = "-engines"
COMPONENT = "router"  # app.kubernetes.io/component of the router's objects and pods
CONTAINER = "router"
PORT_NAME = "http"
# Both routers' own probe paths (sglang-router 0.3.2 and vllm-router 0.1.17 serve both; /readiness is
# 503 until a worker is healthy, checked against the wheels in tests/sandbox/test_sandbox_router.py).
READINESS_PATH = "/readiness"
LIVENESS_PATH = "/liveness"
# A deleted router pod drains this long before SIGTERM (preStop), within this grace period: time for
# the endpoints to drop it and for the generations in flight through it to finish.
ROUTER_DRAIN_S = 30
ROUTER_GRACE_S = ROUTER_DRAIN_S + 60
METRICS_PORT_NAME = "metrics"
# The router pods' own selector label: they carry no prefixtune.io/resource label, so no selector of
# the engine pods (the engines' Service, the operator's pod index, the router's discovery) sees them.
LABEL_ROUTER = "prefixtune.io/router"
# The router pod template's label of the routing it runs (``routing_hash``): a rollout of a routing
# change is ready when the router Deployment runs this hash on every replica (controller/observe.py).
LABEL_ROUTING_HASH = "prefixtune.io/routing-hash"
CHARS_PER_TOKEN = 4  # the routers' trees count characters; an engine's pool counts tokens
# The role's one rule: the routers' service discovery gets, lists and watches pods (kube-rs watcher).
POD_RULE: dict[str, Any] = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
# Requests: the tree dominates the router's memory (a few bytes a character of each worker's tree).
TREE_BYTES_PER_CHAR = 2
BASE_MEMORY_MIB = 256
MIB = 1 << 20


def router_name(resource: str) -> str:
    return f"{resource}{ROUTER_SUFFIX}"


def engines_service_name(resource: str) -> str:
    return f"{resource}{ENGINES_SUFFIX}"


def routing_hash(settings: RoutingSettings) -> str:
    """A short stable hash of the routing a config asks for: the router, its resolved policy and
    thresholds (the tuned knobs). The tree size is not in it: it follows the engines' reported pool,
    not a trial, and re-renders without a rollout to wait for."""
    content = {"router": settings.router.value, **settings.knob_values()}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:10]


def tree_size_for(router: Router, pool_tokens: int | None) -> int:
    """The tree budget mirrored from the engines' KV pool: the pool's tokens as characters, at most
    the router's own default (a tree larger than what the engines hold routes to prefixes they have
    evicted); the router's default while no pod has reported its pool."""
    default = DEFAULT_MAX_TREE_SIZE[router]
    if pool_tokens is None or pool_tokens <= 0:
        return default
    return min(default, pool_tokens * CHARS_PER_TOKEN)


def settings_for(
    spec: ServingDeploymentSpec, config: KnobConfig, pool_tokens: int | None = None
) -> RoutingSettings:
    """The resource's router, resolved: spec.routing's router, image, replicas and tree size, the
    routing knobs of ``config`` (spec.routing's baseline, or a trial's), ``auto`` resolved by the
    engines' replicas and whether they cache prefixes (``config``'s prefix caching). An adopting
    resource gets no router: the adopted Deployment's pods carry its team's labels, not ours."""
    routing = spec.routing
    router = router_of(spec)
    tree = routing.max_tree_size or tree_size_for(router, pool_tokens)
    base = RoutingSettings(
        policy=RoutingPolicy.KUBE_PROXY,  # the config's policy follows (with_knobs)
        router=router,
        image=routing.image or DEFAULT_ROUTER_IMAGE[router],
        replicas=routing.replicas,
        max_tree_size=tree,
    )
    if spec.adopt is not None:  # the adopted Deployment's pods are its team's, not the router's
        return base
    try:
        return base.with_knobs(config, spec.replicas, bool(config.get(PREFIX_CACHING)))
    except ValueError:
        # A config from before a change of router (consistent_hash, then sglang-router): the policy
        # is not this router's. The spec's own baseline is (validation refuses the other), so the
        # router runs that until the policy's new epoch decides; raising here wedged every tick.
        baseline = spec.knob_config()
        return base.with_knobs(baseline, spec.replicas, bool(baseline.get(PREFIX_CACHING)))


def router_of(spec: ServingDeploymentSpec) -> Router:
    """The router that fronts the resource's engines when one runs: spec.routing.router, or the
    engine's (``ENGINE_ROUTER``)."""
    return spec.routing.router or ENGINE_ROUTER[spec.engine]


def engines_config(spec: ServingDeploymentSpec, config: KnobConfig) -> KnobConfig:
    """``config`` as the engine pods' command renders it: its engine knobs, and for the routing policy
    whether a router may ever be in front of this resource's engines (the adapters render what a
    router needs of the engines from it: ``engines._common.router_in_front``), never the policy a
    trial or the search holds. The search resolves ``auto`` by the replicas of the moment (kube-proxy
    at one replica) and may list kube-proxy beside a router's policies; a routing trial restarts the
    router, not the engines, and a scale from one replica to two leaves the engines' pods as they are.

    A router may be in front unless the resource adopts a Deployment (it gets no router), or its
    spec.routing.policy is kube-proxy and its space lists no router policy: then kube-proxy, else the
    spec's policy (``auto`` included) or the first listed router policy. A router that needs nothing
    of the engines (``ROUTER_NEEDS``: sglang-router, even in front of vLLM) counts as none: the
    engines then serve no route only a router would call."""
    policy = spec.routing.policy
    if spec.adopt is not None or not ROUTER_NEEDS[router_of(spec)]:
        policy = RoutingPolicy.KUBE_PROXY.value
    elif policy == RoutingPolicy.KUBE_PROXY.value:
        listed = [str(p) for p in spec.tuning.space.listed().get(ROUTING_POLICY) or ()]
        policy = next((p for p in listed if p != RoutingPolicy.KUBE_PROXY.value), policy)
    return config.with_(**{ROUTING_POLICY: policy})


@dataclass(frozen=True)
class RouterOwner:
    """Who owns the router's objects: the resource's namespace and name, its owner reference, and
    the operator's labels for its objects (``prefixtune.io/resource`` and managed-by among them)."""

    namespace: str
    name: str
    reference: Mapping[str, Any]
    labels: Mapping[str, str] = field(default_factory=dict)


def router_args(
    settings: RoutingSettings, namespace: str, engine_selector: Mapping[str, str], engine_port: int
) -> list[str]:
    """The router's arguments: where it listens, its policy and thresholds, its metrics, and the
    engine pods it discovers (their selector labels, namespace and port)."""
    selector = [f"{key}={value}" for key, value in sorted(engine_selector.items())]
    return [
        "--host", "0.0.0.0",
        "--port", str(ROUTER_PORT),
        "--policy", settings.policy.value,
        "--cache-threshold", f"{settings.cache_threshold:g}",
        "--balance-abs-threshold", str(settings.balance_abs_threshold),
        "--balance-rel-threshold", f"{settings.balance_rel_threshold:g}",
        "--max-tree-size", str(settings.tree_size),
        "--prometheus-host", "0.0.0.0",
        "--prometheus-port", str(ROUTER_METRICS_PORT),
        "--service-discovery",
        "--selector", *selector,
        "--service-discovery-namespace", namespace,
        "--service-discovery-port", str(engine_port),
    ]  # fmt: skip


def _labels(owner: RouterOwner, settings: RoutingSettings) -> dict[str, str]:
    return {
        **owner.labels,
        owned.LABEL_NAME: settings.router.value,
        owned.LABEL_COMPONENT: COMPONENT,
    }


def _meta(owner: RouterOwner, name: str, labels: Mapping[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": dict(labels),
        "ownerReferences": [dict(owner.reference)],
        **extra,
    }


def pod_labels(owner: RouterOwner, settings: RoutingSettings) -> dict[str, str]:
    """The router pods' labels: the component (the sandbox kubelet runs the router's binary for a pod
    labelled ``router``) and the router's own selector label, no ``prefixtune.io/resource``."""
    return {
        owned.LABEL_NAME: settings.router.value,
        owned.LABEL_INSTANCE: owner.name,
        owned.LABEL_COMPONENT: COMPONENT,
        owned.LABEL_MANAGED_BY: owner.labels.get(owned.LABEL_MANAGED_BY, "prefixtune"),
        LABEL_ROUTER: owner.name,
    }


def memory_request(settings: RoutingSettings, engine_replicas: int) -> str:
    """256 MiB + 2 bytes a character of each worker's full tree, in MiB."""
    tree = settings.tree_size * max(engine_replicas, 1) * TREE_BYTES_PER_CHAR
    return f"{BASE_MEMORY_MIB + math.ceil(tree / MIB)}Mi"


SCRATCH, SCRATCH_VOLUME, SCRATCH_LIMIT = "/tmp", "scratch", "1Gi"  # the router's writable directory


def render_deployment(
    owner: RouterOwner,
    settings: RoutingSettings,
    engine_selector: Mapping[str, str],
    engine_port: int,
    engine_replicas: int,
) -> dict[str, Any]:
    """The router's Deployment: ``settings.replicas`` pods of the router's binary."""
    labels = _labels(owner, settings)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": settings.image,
        "command": list(ROUTER_COMMAND[settings.router]),
        "args": router_args(settings, owner.namespace, engine_selector, engine_port),
        "ports": [
            {"name": PORT_NAME, "containerPort": ROUTER_PORT, "protocol": "TCP"},
            {"name": METRICS_PORT_NAME, "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": {"requests": {"cpu": "500m", "memory": memory_request(settings, engine_replicas)}},
        # The root filesystem is read-only; the routers write only their caches (sglang-router fetches
        # the model's tokenizer from the Hugging Face hub into $HOME/.cache when it can reach it).
        "env": [{"name": "HOME", "value": SCRATCH}],
        "volumeMounts": [{"name": SCRATCH_VOLUME, "mountPath": SCRATCH}],
        # Ready = the router has a healthy worker to send to (its own /readiness, 503 "insufficient
        # healthy workers" before discovery), so the Service never switches to a router that would
        # refuse every request. Alive = it answers at all: it is not restarted when the engines go.
        "readinessProbe": {
            "httpGet": {"path": READINESS_PATH, "port": PORT_NAME},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": LIVENESS_PATH, "port": PORT_NAME},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        # A router pod being deleted (a routing trial's restart, the switch back to kube-proxy) has
        # already left the Service's endpoints; it keeps serving the requests in flight on it for
        # ROUTER_DRAIN_S before it is signalled (sleep: the images run the wheel on a Python base).
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(ROUTER_DRAIN_S)]}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    pods = pod_labels(owner, settings)
    annotations = dict(
        zip(owned.PROMETHEUS_ANNOTATIONS, ("true", str(ROUTER_METRICS_PORT), "/metrics"), strict=True)
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(owner, router_name(owner.name), labels),
        "spec": {
            "replicas": settings.replicas,
            "selector": {"matchLabels": {LABEL_ROUTER: owner.name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    "labels": {**pods, LABEL_ROUTING_HASH: routing_hash(settings)},
                    "annotations": annotations,
                },
                "spec": {
                    "serviceAccountName": router_name(owner.name),
                    "automountServiceAccountToken": True,  # its discovery reads pods with this token
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": ROUTER_GRACE_S,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [{"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": SCRATCH_LIMIT}}],
                    "restartPolicy": "Always",
                },
            },
        },
    }


def render_service(owner: RouterOwner, settings: RoutingSettings, port: int) -> dict[str, Any]:
    """The user-facing Service (the resource's name) in front of the router pods, on the port the
    engines' Service had (``port``): clients keep their URL."""
    annotations = dict(
        zip(owned.PROMETHEUS_ANNOTATIONS, ("true", str(ROUTER_METRICS_PORT), "/metrics"), strict=True)
    )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, owner.name, _labels(owner, settings), annotations=annotations),
        "spec": {
            "type": "ClusterIP",
            "selector": {LABEL_ROUTER: owner.name},
            "ports": [{"name": PORT_NAME, "port": port, "targetPort": PORT_NAME, "protocol": "TCP"}],
        },
    }


def render_service_account(owner: RouterOwner, settings: RoutingSettings) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(owner, router_name(owner.name), _labels(owner, settings)),
    }


def render_role(owner: RouterOwner, settings: RoutingSettings) -> dict[str, Any]:
    """get/list/watch pods in the resource's namespace: all the routers' discovery reads."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(owner, router_name(owner.name), _labels(owner, settings)),
        "rules": [dict(POD_RULE)],
    }


def render_role_binding(owner: RouterOwner, settings: RoutingSettings) -> dict[str, Any]:
    name = router_name(owner.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(owner, name, _labels(owner, settings)),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
    }

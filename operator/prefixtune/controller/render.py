"""Render the children of a ServingDeployment: Deployment(s), Service, ConfigMap, ServiceMonitor.

Pure functions from (resource identity, validated spec, knob config, role) to manifests (plain
dicts). The engine adapter renders the real command line; this module only wraps it in Kubernetes
objects. Every child carries an ownerReference to the ServingDeployment, so deleting the resource
deletes its children through the garbage collector (no finalizer is needed).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from prefixtune.api import owned
from prefixtune.api.models import GROUP_VERSION, KIND, ServingDeploymentSpec
from prefixtune.controller import engine_pod, pod_overrides, podspec
from prefixtune.engines import get_adapter
from prefixtune.engines.base import KnobConfig, RenderedCommand
from prefixtune.engines.knobs import engine_dict
from prefixtune.routing import render as routing_render
from prefixtune.routing.settings import RoutingSettings

DeploymentRole = Literal["baseline", "canary"]
ROLES: tuple[DeploymentRole, ...] = ("baseline", "canary")

# The names the operator owns in its children (one place, api/owned.py: spec.pod may not set them).
LABEL_NAME = owned.LABEL_NAME
LABEL_INSTANCE = owned.LABEL_INSTANCE
LABEL_COMPONENT = owned.LABEL_COMPONENT
LABEL_MANAGED_BY = owned.LABEL_MANAGED_BY
LABEL_RESOURCE = owned.LABEL_RESOURCE
LABEL_ROLE = owned.LABEL_ROLE
LABEL_CONFIG_HASH = owned.LABEL_CONFIG_HASH
ANNOTATION_CONFIG = owned.ANNOTATION_CONFIG
GPU_PRODUCT_LABEL = owned.GPU_PRODUCT_LABEL  # GPU feature discovery's node label (the sandbox reads it)
GPU_RESOURCE = owned.GPU_RESOURCE
OPTIONS_VOLUME = owned.OPTIONS_VOLUME
MANAGER = "prefixtune"
SERVING = "serving"  # app.kubernetes.io/component of the engines' objects and pods
CONTAINER = "engine"
PORT_NAME = "http"
# On an engine Deployment: the pod label and annotation keys spec.pod gave (JSON {"labels": [...],
# "annotations": [...]}), so that a key removed from spec.pod is removed from the pods too (a merge
# patch keeps the map keys it does not name).
POD_METADATA_KEYS = "prefixtune.io/pod-metadata-keys"

# GPU feature discovery product names of the GPU types the twin models (by its catalog's names).
GPU_PRODUCTS: Mapping[str, str] = {
    "H100-80GB": "NVIDIA-H100-80GB-HBM3",
    "H200": "NVIDIA-H200",
    "A100-80GB": "NVIDIA-A100-SXM4-80GB",
}


def gpu_product(gpu_type: str) -> str:
    """The ``nvidia.com/gpu.product`` node label value of a GPU type: GPU feature discovery's name
    for a type the twin models (by its name or an alias: ``H200``, ``h100``), else the type as
    written (``NVIDIA-L40S``, ``NVIDIA-B200``: GPU feature discovery's names)."""
    from prefixtune.twin.catalog import find_gpu

    known = find_gpu(gpu_type)
    return gpu_type if known is None else GPU_PRODUCTS.get(known.name, gpu_type)


@dataclass(frozen=True)
class Owner:
    """The ServingDeployment that owns the children."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str] | None = None
    adopted: str | None = None  # the existing Deployment it adopted (spec.adopt): its baseline

    def deployment(self, role: DeploymentRole) -> str:
        """The name of the engine Deployment of ``role``: an adopted Deployment is the baseline."""
        if role == "baseline" and self.adopted is not None:
            return self.adopted
        return deployment_name(self.name, role)

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": GROUP_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    @classmethod
    def of(cls, body: Mapping[str, Any], spec: ServingDeploymentSpec | None = None) -> Owner:
        meta = body.get("metadata") or {}
        adopt = None if spec is None or spec.adopt is None else spec.adopt.deployment
        return cls(
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta["name"]),
            uid=str(meta.get("uid") or ""),
            annotations=dict(meta.get("annotations") or {}),
            adopted=adopt,
        )


def config_hash(config: KnobConfig) -> str:
    """A short stable hash of a config's engine knobs (a label value: 10 hex characters): a routing
    knob's change restarts the router, never the engine pods (``engine_dict``)."""
    text = json.dumps(engine_dict(config), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def deployment_name(owner_name: str, role: DeploymentRole) -> str:
    return owner_name if role == "baseline" else f"{owner_name}-canary"


def configmap_name(owner_name: str, role: DeploymentRole) -> str:
    return f"{deployment_name(owner_name, role)}-options"


def service_name(owner_name: str) -> str:
    return owner_name


def selector_labels(owner_name: str, role: DeploymentRole | None = None) -> dict[str, str]:
    """Labels that select the pods: both roles for the Service, one role for a Deployment."""
    labels = {LABEL_RESOURCE: owner_name}
    if role is not None:
        labels[LABEL_ROLE] = role
    return labels


def selector_string(labels: Mapping[str, str]) -> str:
    """Equality-based labels as a label selector string (``a=b,c=d``, keys sorted): the form the
    scale subresource's ``status.selector`` carries and ``kubectl get -l`` / an HPA parse."""
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def prometheus_labels(owner_name: str) -> dict[str, str]:
    """The operator's own pod labels as Prometheus names them once a scrape copies them (the
    ServiceMonitor's ``podTargetLabels``, or the usual ``labelmap`` of ``__meta_kubernetes_pod_label_*``):
    every character outside ``[a-zA-Z0-9_]`` becomes ``_``."""
    return {
        re.sub(r"[^a-zA-Z0-9_]", "_", LABEL_MANAGED_BY): MANAGER,
        re.sub(r"[^a-zA-Z0-9_]", "_", LABEL_RESOURCE): owner_name,
    }


def common_labels(owner: Owner, spec: ServingDeploymentSpec) -> dict[str, str]:
    return {
        LABEL_NAME: str(spec.engine),
        LABEL_INSTANCE: owner.name,
        LABEL_COMPONENT: SERVING,
        LABEL_MANAGED_BY: MANAGER,
        LABEL_RESOURCE: owner.name,
    }


def _meta(
    owner: Owner, name: str, labels: Mapping[str, str], annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": owner.namespace,
        "labels": dict(labels),
        "ownerReferences": [owner.reference()],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def render_command(spec: ServingDeploymentSpec, config: KnobConfig) -> RenderedCommand:
    """The engine's command for ``config``: what a router needs of the engines follows the resource,
    not the config's routing knobs (``routing.render.engines_config``)."""
    adapter = get_adapter(spec.engine)
    slo = spec.tuning.slo
    engines = routing_render.engines_config(spec, config)
    return adapter.render(
        spec.model, engines, spec.extra_args, None, spec.gpu.count,
        ttft_slo_s=float(slo.ttft_p99), itl_slo_s=float(slo.itl_p99),
    )  # fmt: skip


def _options_data(files: Mapping[str, str]) -> dict[str, str]:
    return {posixpath.basename(path): content for path, content in sorted(files.items())}


def render_configmap(
    owner: Owner, spec: ServingDeploymentSpec, config: KnobConfig, role: DeploymentRole
) -> dict[str, Any] | None:
    """The ConfigMap with the engine's option files (TensorRT-LLM's YAML); None when it reads none."""
    command = render_command(spec, config)
    if not command.files:
        return None
    labels = {**common_labels(owner, spec), LABEL_ROLE: role, LABEL_CONFIG_HASH: config_hash(config)}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(owner, configmap_name(owner.name, role), labels),
        "data": _options_data(command.files),
    }


def rolling_subset(spec: ServingDeploymentSpec) -> int | None:
    """A rolling trial capped below spec.replicas (``rollout.maxTrialReplicas``): the replicas it
    moves, which then run beside the stable ones (the canary Deployment); None: no cap applies."""
    cap = spec.tuning.rollout.max_trial_replicas
    if spec.effective_rollout().value == "rolling" and cap is not None and cap < spec.replicas:
        return cap
    return None


def trial_replicas(spec: ServingDeploymentSpec) -> int:
    """The pods a trial beside the stable ones runs on: one for a canary trial, the capped subset
    of a rolling one (at least one stable replica stays)."""
    return rolling_subset(spec) or 1


def replicas_for(
    spec: ServingDeploymentSpec, role: DeploymentRole, canary_active: bool, canary_ready: int | None = None
) -> int:
    """During a trial beside the stable pods the baseline gives the trial's pods their replicas, one
    for each trial pod that is ready (``canary_ready``; None: all of them), never before: a serving
    pod is not removed before its replacement serves (as Argo Rollouts scales the stable down)."""
    moved = trial_replicas(spec)
    if role == "canary":
        return moved
    if not canary_active:
        return spec.replicas
    given = moved if canary_ready is None else min(max(canary_ready, 0), moved)
    return max(spec.replicas - given, 1)


def deployment_strategy(role: DeploymentRole) -> dict[str, Any]:
    """The stable pods roll one at a time, a new one ready before an old one goes (maxSurge 1,
    maxUnavailable 0). The canary is recreated: its next config is applied only once the stable
    Deployment is back at full strength (``observe.scale_plan``), and a surge pod would need a GPU
    beyond the replicas and the canary's own (with one spare GPU, every second trial would wait
    for capacity); its old pods go first and free their GPUs for the new ones."""
    if role == "canary":
        return {"type": "Recreate"}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def render_deployment(
    owner: Owner, spec: ServingDeploymentSpec, config: KnobConfig, role: DeploymentRole, replicas: int
) -> dict[str, Any]:
    """The engine Deployment of one role running ``config``."""
    adapter = get_adapter(spec.engine)
    command = render_command(spec, config)
    port = adapter.metrics_port
    digest = config_hash(config)
    image = spec.image or adapter.default_image
    labels = {**common_labels(owner, spec), LABEL_ROLE: role, LABEL_CONFIG_HASH: digest}
    pod_annotations = {
        **dict(zip(owned.PROMETHEUS_ANNOTATIONS, ("true", str(port), adapter.metrics_path), strict=True)),
        ANNOTATION_CONFIG: json.dumps(engine_dict(config), sort_keys=True),
    }
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "command": list(command.command),
        "args": list(command.args),
        "ports": [{"name": PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "resources": {
            "limits": {GPU_RESOURCE: str(spec.gpu.count)},
            "requests": {GPU_RESOURCE: str(spec.gpu.count)},
        },
        # Engines load weights for minutes: the startup probe waits for that (sized from the model),
        # the readiness probe gates traffic, the liveness probe restarts an engine that hung.
        **podspec.probes(spec, PORT_NAME),
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "nodeSelector": {GPU_PRODUCT_LABEL: gpu_product(spec.gpu.type)},
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "restartPolicy": "Always",
    }
    engine_pod.harden(container, pod_spec, spec)
    if command.files:
        container["volumeMounts"] = [
            {"name": OPTIONS_VOLUME, "mountPath": path, "subPath": posixpath.basename(path), "readOnly": True}
            for path in sorted(command.files)
        ]
        pod_spec["volumes"] = [
            {"name": OPTIONS_VOLUME, "configMap": {"name": configmap_name(owner.name, role)}}
        ]
    shm = podspec.shm_volume(spec)
    if shm is not None:
        pod_spec.setdefault("volumes", []).append(shm[0])
        container.setdefault("volumeMounts", []).append(shm[1])
    template_meta: dict[str, Any] = {"labels": dict(labels), "annotations": pod_annotations}
    pod_overrides.apply(container, pod_spec, template_meta, spec.pod)
    given = pod_overrides.metadata_keys(spec.pod)
    recorded = {POD_METADATA_KEYS: json.dumps(given, sort_keys=True)} if given else None
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(owner, owner.deployment(role), labels, recorded),
        "spec": {
            "replicas": int(replicas),
            "selector": {"matchLabels": selector_labels(owner.name, role)},
            "strategy": deployment_strategy(role),
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def render_service(owner: Owner, spec: ServingDeploymentSpec, name: str | None = None) -> dict[str, Any]:
    """One Service over both roles: a canary pod takes its share of the same traffic. ``name``: the
    engines' own Service beside a router (``routing.render.engines_service_name``)."""
    adapter = get_adapter(spec.engine)
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(adapter.metrics_port),
        "prometheus.io/path": adapter.metrics_path,
    }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, name or service_name(owner.name), common_labels(owner, spec), annotations),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner.name),
            "ports": [
                {"name": PORT_NAME, "port": adapter.metrics_port, "targetPort": PORT_NAME, "protocol": "TCP"}
            ],
        },
    }


def render_service_monitor(owner: Owner, spec: ServingDeploymentSpec) -> dict[str, Any]:
    """A prometheus-operator ServiceMonitor (created only when its CRD is installed)."""
    adapter = get_adapter(spec.engine)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta(owner, owner.name, common_labels(owner, spec)),
        "spec": {
            # The engines' Services only (component serving): not the router's, which is the
            # resource's user-facing Service when a router runs (``routing.render``).
            "selector": {
                "matchLabels": {
                    LABEL_RESOURCE: owner.name,
                    LABEL_MANAGED_BY: MANAGER,
                    LABEL_COMPONENT: SERVING,
                }
            },
            "namespaceSelector": {"matchNames": [owner.namespace]},
            # Copied onto every series: the operator's queries can then require them
            # (--prometheus-operator-labels), so a series of a pod it does not manage never counts.
            "podTargetLabels": [LABEL_MANAGED_BY, LABEL_RESOURCE],
            "endpoints": [{"port": PORT_NAME, "path": adapter.metrics_path, "interval": "15s"}],
        },
    }


# --- the router in front of the engines (routing/render.py renders it; this is the glue) -----------


def engine_selector(owner_name: str) -> dict[str, str]:
    """The labels the router discovers the engine pods by (both roles; never its own pods)."""
    return {LABEL_RESOURCE: owner_name, LABEL_COMPONENT: SERVING}


def router_owner(owner: Owner, spec: ServingDeploymentSpec) -> routing_render.RouterOwner:
    return routing_render.RouterOwner(
        owner.namespace, owner.name, owner.reference(), common_labels(owner, spec)
    )


def render_routed(
    owner: Owner,
    spec: ServingDeploymentSpec,
    settings: RoutingSettings,
    *,
    router_ready: bool,
    monitoring: bool,
) -> list[dict[str, Any]]:
    """The router's objects for a routed resource, and its Services: the user-facing one (the
    resource's name) selects the router pods once one is ready (before that, and if none ever is,
    the engine pods: kube-proxy's spread, never an outage); the engines' own Service beside it where
    the ServiceMonitor needs their endpoints (``monitoring``)."""
    router = router_owner(owner, spec)
    port = get_adapter(spec.engine).metrics_port
    objects = [
        routing_render.render_service_account(router, settings),
        routing_render.render_role(router, settings),
        routing_render.render_role_binding(router, settings),
        routing_render.render_deployment(router, settings, engine_selector(owner.name), port, spec.replicas),
    ]
    front = routing_render.render_service(router, settings, port)
    if not router_ready:
        front["spec"]["selector"] = selector_labels(owner.name)
    objects.append(front)
    if monitoring:
        objects.append(render_service(owner, spec, routing_render.engines_service_name(owner.name)))
    return objects


def pod_config(pod_or_template: Mapping[str, Any]) -> KnobConfig | None:
    """The knob config a pod (or pod template) was rendered with, from its annotation (the engine
    knobs; the router's read as unset: the pod does not carry them)."""
    annotations = (pod_or_template.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(ANNOTATION_CONFIG)
    if not text:
        return None
    try:
        return KnobConfig.from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError):
        return None


def template_hash(deployment: Mapping[str, Any]) -> str | None:
    labels = (((deployment.get("spec") or {}).get("template") or {}).get("metadata") or {}).get(
        "labels"
    ) or {}
    value = labels.get(LABEL_CONFIG_HASH)
    return None if value is None else str(value)

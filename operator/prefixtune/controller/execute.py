"""The shell's writes: bring the children to the desired state, post Events.

Level-triggered: ``ensure_children`` makes the Deployments, Service, ConfigMaps (and a
ServiceMonitor where the CRD exists) match what the policy state asks for right now. The policy's
RollOut/RollBack actions therefore need no imperative execution here: they changed the state, and
the next ensure applies it. An operator restarted mid-rollout simply ensures the same state again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefixtune.api.models import ServingDeploymentSpec
from prefixtune.controller.api_calls import require
from prefixtune.controller.kube import KubeClient, KubeError, ns_path
from prefixtune.controller.observe import Desired, PodView, pod_view
from prefixtune.controller.render import (
    ROLES,
    Owner,
    Role,
    configmap_name,
    deployment_name,
    render_configmap,
    render_deployment,
    render_service,
    render_service_monitor,
    replicas_for,
    selector_labels,
)
from prefixtune.controller.status import iso
from prefixtune.tuning.actions import EmitEvent

logger = logging.getLogger(__name__)

APPS = "/apis/apps/v1"
CORE = "/api/v1"
MONITORING = "/apis/monitoring.coreos.com/v1"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
SERVICEMONITOR_CRD = "servicemonitors.monitoring.coreos.com"
COMPONENT = "prefixtune-operator"


@dataclass
class Children:
    deployments: dict[Role, dict[str, Any] | None] = field(default_factory=dict)
    pods: list[PodView] = field(default_factory=list)


async def read_children(client: KubeClient, owner: Owner) -> Children:
    require("apps", "deployments", "get")
    require("", "pods", "list")
    deployments: dict[Role, dict[str, Any] | None] = {}
    for role in ROLES:
        deployments[role] = await client.get(
            ns_path(APPS, owner.namespace, "deployments", deployment_name(owner.name, role))
        )
    pods = await client.list(ns_path(CORE, owner.namespace, "pods"), selector_labels(owner.name))
    return Children(deployments, [pod_view(p) for p in pods])


RENDERED_HASH = "prefixtune.io/rendered-hash"


def rendered_hash(body: Mapping[str, Any]) -> str:
    """A hash of what the operator renders (spec/data and labels), kept as an annotation, so a
    re-apply patches only when the rendering changed (defaulted server fields do not count)."""
    content = {k: body.get(k) for k in ("spec", "data")}
    content["labels"] = (body.get("metadata") or {}).get("labels") or {}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


async def _apply(
    client: KubeClient, path: str, body: dict[str, Any], group: str, resource: str
) -> str | None:
    """Create ``body`` at ``path`` or merge-patch the existing object; returns what was done."""
    name = body["metadata"]["name"]
    digest = rendered_hash(body)
    body = {**body, "metadata": {**body["metadata"]}}
    body["metadata"]["annotations"] = {**(body["metadata"].get("annotations") or {}), RENDERED_HASH: digest}
    require(group, resource, "get")
    existing = await client.get(f"{path}/{name}")
    if existing is None:
        require(group, resource, "create")
        await client.create(path, body)
        return f"created {body['kind']} {name}"
    have = ((existing.get("metadata") or {}).get("annotations") or {}).get(RENDERED_HASH)
    if have == digest:
        return None
    patch: dict[str, Any] = {k: body[k] for k in ("spec", "data") if k in body}
    patch["metadata"] = {"labels": body["metadata"]["labels"], "annotations": body["metadata"]["annotations"]}
    require(group, resource, "patch")
    await client.merge_patch(f"{path}/{name}", patch)
    return f"updated {body['kind']} {name}"


async def _delete(client: KubeClient, path: str, group: str, resource: str) -> bool:
    require(group, resource, "delete")
    return await client.delete(path)


async def monitoring_installed(client: KubeClient) -> bool:
    require("apiextensions.k8s.io", "customresourcedefinitions", "get")
    try:
        return await client.get(f"{CRDS}/{SERVICEMONITOR_CRD}") is not None
    except KubeError:
        return False


async def ensure_children(
    client: KubeClient,
    owner: Owner,
    spec: ServingDeploymentSpec,
    want: Desired,
    *,
    monitoring: bool = False,
) -> list[str]:
    """Make the children match ``want``; returns a line per change (for the log)."""
    done: list[str] = []
    ns = owner.namespace
    canary_active = want.canary is not None
    for role in ROLES:
        config = want.config_of(role)
        dep_path = ns_path(APPS, ns, "deployments")
        cm_path = ns_path(CORE, ns, "configmaps")
        if config is None:
            if await _delete(
                client, f"{dep_path}/{deployment_name(owner.name, role)}", "apps", "deployments"
            ):
                done.append(f"deleted Deployment {deployment_name(owner.name, role)}")
            if render_configmap(owner, spec, want.baseline, role) is not None:
                await _delete(client, f"{cm_path}/{configmap_name(owner.name, role)}", "", "configmaps")
            continue
        configmap = render_configmap(owner, spec, config, role)
        if configmap is not None:
            change = await _apply(client, cm_path, configmap, "", "configmaps")
            if change:
                done.append(change)
        deployment = render_deployment(owner, spec, config, role, replicas_for(spec, role, canary_active))
        change = await _apply(client, dep_path, deployment, "apps", "deployments")
        if change:
            done.append(change)
    change = await _apply(client, ns_path(CORE, ns, "services"), render_service(owner, spec), "", "services")
    if change:
        done.append(change)
    if monitoring:
        monitor = render_service_monitor(owner, spec)
        try:
            change = await _apply(
                client,
                ns_path(MONITORING, ns, "servicemonitors"),
                monitor,
                "monitoring.coreos.com",
                "servicemonitors",
            )
        except KubeError as err:  # the CRD went away, or no RBAC for it: not fatal for serving
            logger.warning("ServiceMonitor %s/%s not applied: %s", ns, owner.name, err)
            change = None
        if change:
            done.append(change)
    return done


def ready_condition(spec: ServingDeploymentSpec, children: Children) -> tuple[bool, str, str]:
    """(ready, reason, message) for the Ready condition: all serving replicas ready."""
    ready = sum(1 for p in children.pods if p.ready and not p.deleting)
    if children.deployments.get("baseline") is None:
        return False, "Creating", "the engine Deployment does not exist yet"
    if ready >= spec.replicas:
        return True, "ReplicasReady", f"{ready}/{spec.replicas} engine pods ready"
    return False, "ReplicasNotReady", f"{ready}/{spec.replicas} engine pods ready"


_INSTANCE = f"{socket.gethostname()}-{os.getpid()}"


def event_body(body: Mapping[str, Any], event: EmitEvent, now: float) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    ns = str(meta.get("namespace") or "default")
    stamp = iso(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name')}.", "namespace": ns},
        "involvedObject": {
            "apiVersion": str(body.get("apiVersion", "prefixtune.io/v1alpha1")),
            "kind": str(body.get("kind", "ServingDeployment")),
            "name": str(meta.get("name")),
            "namespace": ns,
            "uid": str(meta.get("uid", "")),
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message[:1024],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": _INSTANCE,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


async def post_events(
    client: KubeClient, body: Mapping[str, Any], events: Sequence[EmitEvent], now: float
) -> None:
    """Post one Event per decision; a failed post is logged, never fatal."""
    ns = str((body.get("metadata") or {}).get("namespace") or "default")
    require("", "events", "create")
    for event in events:
        try:
            await client.create(ns_path(CORE, ns, "events"), event_body(body, event, now))
        except (KubeError, OSError) as err:
            logger.warning("event %s not posted: %s", event.reason, err)
        log = logger.warning if event.type == "Warning" else logger.info
        log("%s/%s %s: %s", ns, (body.get("metadata") or {}).get("name"), event.reason, event.message)

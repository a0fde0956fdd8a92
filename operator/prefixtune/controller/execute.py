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
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefixtune.api.models import ServingDeploymentSpec
from prefixtune.controller import pod_overrides
from prefixtune.controller.adoption import claim_adopted, render_engine_deployment
from prefixtune.controller.api_calls import require
from prefixtune.controller.children import Freshness, Indexes
from prefixtune.controller.drift import OWNED_POD_KEYS, OWNED_POD_MAPS, OWNED_TOP, Drift, owned_drift
from prefixtune.controller.kube import KubeClient, KubeError, ns_path
from prefixtune.controller.observe import Desired, PodView, Scale, failure_detail, pod_view
from prefixtune.controller.ownership import Claim, Foreign, claim, foreign
from prefixtune.controller.render import (
    POD_METADATA_KEYS,
    ROLES,
    DeploymentRole,
    Owner,
    configmap_name,
    render_configmap,
    render_routed,
    render_service,
    render_service_monitor,
    selector_labels,
)
from prefixtune.controller.status import iso
from prefixtune.routing.render import engines_service_name, router_name, settings_for
from prefixtune.tuning.actions import EmitEvent

logger = logging.getLogger(__name__)

APPS = "/apis/apps/v1"
CORE = "/api/v1"
MONITORING = "/apis/monitoring.coreos.com/v1"
RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC = f"/apis/{RBAC_GROUP}/v1"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
SERVICEMONITOR_CRD = "servicemonitors.monitoring.coreos.com"
COMPONENT = "prefixtune-operator"


@dataclass
class Children:
    deployments: dict[DeploymentRole, Mapping[str, Any] | None] = field(default_factory=dict)
    pods: list[PodView] = field(default_factory=list)
    foreign: list[Foreign] = field(default_factory=list)  # objects of our names that are not ours
    router: Mapping[str, Any] | None = None  # the router's Deployment (``<name>-router``), when ours
    # Deployments of the resource's names (engine roles, router) as this tick read them from kopf's
    # indexes, by API path; None: no Deployment of that name exists. A name held by a Deployment
    # without our labels is left out. ``ensure_children`` reads these instead of GETs.
    known: dict[str, Mapping[str, Any] | None] = field(default_factory=dict)

    @property
    def router_ready(self) -> bool:
        """A router pod is ready: the user-facing Service may select the router pods."""
        return self.router is not None and _ready_replicas(self.router) > 0


@dataclass
class Ensured:
    """What one ensure did: a line per change, and the objects it left alone (not ours)."""

    changes: list[str] = field(default_factory=list)
    foreign: list[Foreign] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)  # owned fields someone else changed, restored
    written: list[str] = field(default_factory=list)  # names of the Deployments created, patched, deleted


async def read_children(
    client: KubeClient,
    owner: Owner,
    indexes: Indexes | None = None,
    fresh: Freshness | None = None,
    list_pods: bool = False,
) -> Children:
    """The resource's Deployments (a Deployment of our name that is not ours reads as absent: its
    pods are not ours to measure or judge) and the pods of our selector. From kopf's indexes when
    given (``children.py``; a Deployment this process wrote is read from the API server until the
    index has caught up with the write), else two lists by the resource label, whatever the number
    of roles (the Deployments carry the pods' resource label, as the pods do). An adopted
    Deployment is read by its name either way: it carries its owner team's labels, not ours.
    ``list_pods``: the pods by a list even with indexes (``POD_RELIST_SHARE``: the index can hold a
    pod deleted while the watch was paused)."""
    ns = owner.namespace
    if indexes is not None:
        by_name: dict[str, Mapping[str, Any]] = indexes.deployments_of(ns, owner.name)
        for role in ROLES:
            name = owner.deployment(role)
            if name == owner.adopted:
                continue  # read below
            if fresh is not None and fresh.stale(ns, name, by_name.get(name)):
                require("apps", "deployments", "get")
                got = await client.get(ns_path(APPS, ns, "deployments", name))
                fresh.read(ns, name, got)
                by_name.pop(name, None)
                if got is not None:
                    by_name[name] = got
        if list_pods:
            require("", "pods", "list")
            listed_pods = await client.list(ns_path(CORE, ns, "pods"), selector_labels(owner.name))
            views = [pod_view(p) for p in listed_pods]
        else:
            views = indexes.pods_of(ns, owner.name)
    else:
        require("apps", "deployments", "list")
        require("", "pods", "list")
        selector = selector_labels(owner.name)
        listed = await client.list(ns_path(APPS, ns, "deployments"), selector)
        by_name = {str((d.get("metadata") or {}).get("name")): d for d in listed}
        views = [pod_view(p) for p in await client.list(ns_path(CORE, ns, "pods"), selector)]
    if owner.adopted is not None:
        require("apps", "deployments", "get")
        adopted = await client.get(ns_path(APPS, ns, "deployments", owner.adopted))
        by_name.pop(owner.adopted, None)
        if adopted is not None:
            by_name[owner.adopted] = adopted
    deployments: dict[DeploymentRole, Mapping[str, Any] | None] = {}
    found: list[Foreign] = []
    for role in ROLES:
        live = by_name.get(owner.deployment(role))
        relation = claim_adopted if role == "baseline" and owner.adopted else claim
        if live is not None and relation(live, owner) is Claim.FOREIGN:
            found.append(foreign(live, "Deployment", owner))
            live = None
        deployments[role] = live
    # The router's Deployment carries the resource's label too (read with the engines' above); one
    # of its name that is not ours is reported by the ensure that finds it (``_ensure_routing``).
    router = by_name.get(router_name(owner.name))
    if router is not None and claim(router, owner) is not Claim.OURS:
        router = None
    known: dict[str, Mapping[str, Any] | None] = {}
    if indexes is not None:
        names = [owner.deployment(role) for role in ROLES if owner.deployment(role) != owner.adopted]
        for name in [*names, router_name(owner.name)]:
            if name in by_name:
                known[ns_path(APPS, ns, "deployments", name)] = by_name[name]
            elif indexes.exists(ns, name) is False:
                known[ns_path(APPS, ns, "deployments", name)] = None
            # else: one without our labels (or no index of names): an ensure reads it by its name
    return Children(deployments, views, found, router, known)


Known = Mapping[str, Mapping[str, Any] | None]


async def _read(client: KubeClient, path: str, known: Known) -> Mapping[str, Any] | None:
    """The object at ``path``: as this tick read it (``Children.known``), else from the API server.
    At N resources a periodic ensure's GETs of Deployments the watch already holds were most of the
    operator's API requests (``bench scale``)."""
    return known[path] if path in known else await client.get(path)


RENDERED_HASH = "prefixtune.io/rendered-hash"


def rendered_hash(body: Mapping[str, Any]) -> str:
    """A hash of what the operator renders (spec/data and labels), kept as an annotation, so a
    re-apply patches only when the rendering changed (defaulted server fields do not count)."""
    # spec and data always (None when absent), the rest only where rendered: the hashes of objects
    # written before the Role's rules and the RoleBinding's subjects counted stay as they were.
    content = {k: body.get(k) for k in ("spec", "data")} | {k: body[k] for k in OWNED_TOP if k in body}
    content["labels"] = (body.get("metadata") or {}).get("labels") or {}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


class NotOurs(Exception):
    """An object of the name the operator wants exists and is not controlled by the resource."""

    def __init__(self, found: Foreign) -> None:
        super().__init__(found.message())
        self.found = found


def annotated(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``body`` with its rendered-hash annotation, and the hash."""
    digest = rendered_hash(body)
    out = {**body, "metadata": {**body["metadata"]}}
    out["metadata"]["annotations"] = {**(body["metadata"].get("annotations") or {}), RENDERED_HASH: digest}
    return out, digest


def live_drift(body: Mapping[str, Any], existing: Mapping[str, Any]) -> tuple[str, ...]:
    """The owned fields someone else changed in ``existing``, an object of ours that the operator
    last wrote with this very rendering (its hash annotation says so). An object the operator last
    wrote from another rendering is an update in flight (a new trial config, a spec change), not
    drift: () then, and the caller re-applies it anyway."""
    have = ((existing.get("metadata") or {}).get("annotations") or {}).get(RENDERED_HASH)
    if have != rendered_hash(body):
        return ()
    return owned_drift(body, existing)


@dataclass
class DriftMemo:
    """The last ``live_drift`` verdict per engine Deployment (namespace, name), reused while
    neither the live object (its uid and resourceVersion) nor what its rendering is made of (the
    owner, the spec, the config, the role, the replicas) changed: a Deployment at rest is not
    rendered and hashed again on every tick (that was ~13% of the operator's CPU at N = 500, ``bench
    scale``). A cache, not state: one entry per Deployment, dropped with its resource."""

    verdicts: dict[tuple[str, str], tuple[Hashable, tuple[str, ...]]] = field(default_factory=dict)

    def forget(self, namespace: str, names: Iterable[str]) -> None:
        for name in names:
            self.verdicts.pop((namespace, name), None)


def _fingerprint(
    owner: Owner, spec: ServingDeploymentSpec, rendering: Hashable, live: Mapping[str, Any]
) -> Hashable:
    """What a Deployment's drift verdict depends on (``rendering``: its config, role, replicas)."""
    meta = live.get("metadata") or {}
    annotations = tuple(sorted((owner.annotations or {}).items()))
    version = (meta.get("uid"), meta.get("resourceVersion"))
    return (owner.uid, annotations, spec.model_dump_json(), rendering, version)


def deployment_drift(
    owner: Owner,
    spec: ServingDeploymentSpec,
    want: Desired,
    scale: Scale,
    deployments: Mapping[DeploymentRole, Mapping[str, Any] | None],
    memo: DriftMemo | None = None,
) -> list[Drift]:
    """Drift in the engine Deployments just read: what ``ensure_children`` will restore, rendered
    at the replicas of ``scale`` as it renders them (a canary kept while the stable comes back is
    not rendered, so not compared). Pure but for ``memo`` (the last verdicts, see ``DriftMemo``)."""
    out = []
    adopted = deployments.get("baseline") if owner.adopted else None
    for role in ROLES:
        config, live = want.config_of(role), deployments.get(role)
        if config is None or live is None or (role == "canary" and scale.keep_canary):
            continue
        if owner.adopted and adopted is None:
            continue  # nothing to lay the rendering over (the adopted Deployment is gone or refused)
        replicas = scale.canary if role == "canary" else scale.baseline
        key = (owner.namespace, owner.deployment(role))
        # An adopted rendering is laid over the live adopted Deployment: not memoized.
        memoized = memo if owner.adopted is None else None
        mark = None if memoized is None else _fingerprint(owner, spec, (config, role, replicas), live)
        known = None if memoized is None else memoized.verdicts.get(key)
        if known is not None and known[0] == mark:
            fields = known[1]
        else:
            body = render_engine_deployment(owner, spec, config, role, replicas, adopted)
            fields = live_drift(body, live)
            if memoized is not None:
                memoized.verdicts[key] = (mark, fields)
        if fields:
            out.append(Drift("Deployment", owner.deployment(role), fields))
    return out


def with_removals(template: Mapping[str, Any], existing: Mapping[str, Any]) -> dict[str, Any]:
    """The pod template of a merge patch, with what the rendering no longer holds named null (a
    merge patch replaces lists but keeps the map keys it does not name): an owned pod field it does
    not render (an init container someone added, an affinity removed from spec.pod), a node
    selector key it does not render, a pod label or annotation a former spec.pod gave."""
    live = (existing.get("spec") or {}).get("template") or {}
    live_pod = live.get("spec") or {}
    pod = dict(template["spec"])
    for key in OWNED_POD_KEYS:
        if key not in pod and not _empty_value(live_pod.get(key)):
            pod[key] = None
    for key in OWNED_POD_MAPS:
        mine, theirs = pod.get(key), live_pod.get(key)
        if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
            pod[key] = {**{k: None for k in theirs if k not in mine}, **mine}
    meta = dict(template.get("metadata") or {})
    recorded = ((existing.get("metadata") or {}).get("annotations") or {}).get(POD_METADATA_KEYS)
    for key, nulls in pod_overrides.stale_metadata(recorded, meta).items():
        meta[key] = {**nulls, **(meta.get(key) or {})}
    return {**template, "metadata": meta, "spec": pod}


def _empty_value(value: object) -> bool:
    return value is None or value == "" or value == [] or value == {}


async def _apply(
    client: KubeClient,
    path: str,
    body: dict[str, Any],
    group: str,
    resource: str,
    owner: Owner,
    adopted: Mapping[str, Any] | None = None,
    known: Known | None = None,
) -> tuple[str | None, Drift | None]:
    """Create ``body`` at ``path`` or merge-patch the existing object if it is ours (an orphan with
    our markers is adopted: our controller reference is added); raises ``NotOurs`` otherwise.
    ``adopted``: ``body`` is the adopted Deployment, rendered over this very read of it (never
    created; patched only while it opts in, guarded by the read's resourceVersion). ``known``: what
    this tick read (``Children.known``); an object of our name that it lacks (one without our labels)
    is found by the create's conflict and read then.

    An object of ours is patched when the rendering changed (its hash annotation) or when a field
    the operator owns was changed by someone else (``live_drift``: returned, to be reported)."""
    name = body["metadata"]["name"]
    body, digest = annotated(body)
    if adopted is not None:
        existing: Mapping[str, Any] | None = adopted
        relation = claim_adopted(adopted, owner)
    else:
        require(group, resource, "get")
        existing = await _read(client, f"{path}/{name}", known or {})
        if existing is None:
            require(group, resource, "create")
            try:
                await client.create(path, body)
                return f"created {body['kind']} {name}", None
            except KubeError as err:
                if err.status != 409 or f"{path}/{name}" not in (known or {}):
                    raise
            existing = await client.get(f"{path}/{name}")  # not in the tick's view: not our labels
            if existing is None:
                raise KubeError(409, "POST", path, f"{name} exists and cannot be read")
        relation = claim(existing, owner)
    assert existing is not None
    if relation is Claim.FOREIGN:
        raise NotOurs(foreign(existing, str(body["kind"]), owner))
    have = ((existing.get("metadata") or {}).get("annotations") or {}).get(RENDERED_HASH)
    drifted = live_drift(body, existing) if relation is Claim.OURS else ()
    if have == digest and relation is Claim.OURS and not drifted:
        return None, None
    patch: dict[str, Any] = {k: body[k] for k in OWNED_TOP if k in body}
    if body["kind"] == "Service":  # a selector key the rendering dropped (router <-> engines): null
        theirs = ((existing.get("spec") or {}).get("selector")) or {}
        mine = patch["spec"].get("selector") or {}
        patch["spec"] = {**patch["spec"], "selector": {**{k: None for k in theirs if k not in mine}, **mine}}
    template = (patch.get("spec") or {}).get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        patch["spec"] = {**patch["spec"], "template": with_removals(template, existing)}
    patch["metadata"] = {"labels": body["metadata"]["labels"], "annotations": body["metadata"]["annotations"]}
    if POD_METADATA_KEYS in ((existing.get("metadata") or {}).get("annotations") or {}):
        patch["metadata"]["annotations"] = {POD_METADATA_KEYS: None, **patch["metadata"]["annotations"]}
    if relation is Claim.ORPHAN:
        refs = list((existing.get("metadata") or {}).get("ownerReferences") or [])
        patch["metadata"]["ownerReferences"] = [*refs, owner.reference()]
    if relation is Claim.ORPHAN or adopted is not None:
        # Guarded: if the object changed hands (or, adopted, was edited) since the read, the API
        # server refuses the patch.
        patch["metadata"]["resourceVersion"] = (existing.get("metadata") or {}).get("resourceVersion")
    require(group, resource, "patch")
    await client.merge_patch(f"{path}/{name}", patch)
    if drifted:
        return f"restored {body['kind']} {name}", Drift(str(body["kind"]), name, drifted)
    return f"{'adopted' if relation is Claim.ORPHAN else 'updated'} {body['kind']} {name}", None


async def _delete(
    client: KubeClient,
    path: str,
    group: str,
    resource: str,
    kind: str,
    owner: Owner,
    known: Known | None = None,
) -> bool | Foreign:
    """Delete the object at ``path`` only if this resource controls it (the uid is a precondition
    of the DELETE, so an object replaced since the read is not deleted either). ``known``: what this
    tick read (``Children.known``)."""
    require(group, resource, "get")
    existing = await _read(client, path, known or {})
    if existing is None:
        return False
    if claim(existing, owner) is not Claim.OURS:
        return foreign(existing, kind, owner)
    require(group, resource, "delete")
    uid = str((existing.get("metadata") or {}).get("uid") or "")
    return await client.delete(path, preconditions={"uid": uid} if uid else None)


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
    scale: Scale,
    *,
    monitoring: bool = False,
    pool_tokens: int | None = None,
    known: Known | None = None,
) -> Ensured:
    """Make the children match ``want`` at the replicas of ``scale`` (``observe.scale_plan``: canary
    up first); objects of our names that are not ours are left alone and reported in
    ``Ensured.foreign``. ``known``: the Deployments as this tick read them (``Children.known``),
    read instead of GETs."""
    seen: Known = known or {}
    done = Ensured()
    ns = owner.namespace
    adopted: dict[str, Any] | None = None
    if owner.adopted is not None:
        require("apps", "deployments", "get")
        adopted = await client.get(ns_path(APPS, ns, "deployments", owner.adopted))
        if adopted is None or claim_adopted(adopted, owner) is not Claim.OURS:
            return done  # gone or no longer opting in: nothing is written (the reconcile says why)

    async def apply(
        path: str, body: dict[str, Any], group: str, resource: str, live: dict[str, Any] | None = None
    ) -> bool:
        """Create or patch ``body``; False when an object of its name is not ours (left alone)."""
        try:
            change, drift = await _apply(client, path, body, group, resource, owner, live, seen)
        except NotOurs as err:
            done.foreign.append(err.found)
            return False
        except KubeError as err:
            if live is None or err.status != 409:
                raise
            return True  # the adopted Deployment was edited since the read: rendered over it next time
        if change:
            done.changes.append(change)
            if resource == "deployments" and body["metadata"]["name"] != router_name(owner.name):
                done.written.append(str(body["metadata"]["name"]))  # an engine Deployment
        if drift is not None:
            done.drift.append(drift)
        return True

    async def delete(path: str, group: str, resource: str, kind: str) -> None:
        result = await _delete(client, path, group, resource, kind, owner, seen)
        if isinstance(result, Foreign):
            done.foreign.append(result)
        elif result:
            done.changes.append(f"deleted {kind} {path.rsplit('/', 1)[-1]}")
            if resource == "deployments" and path.rsplit("/", 1)[-1] != router_name(owner.name):
                done.written.append(path.rsplit("/", 1)[-1])

    for role in ROLES:
        config = want.config_of(role)
        dep_path = ns_path(APPS, ns, "deployments")
        cm_path = ns_path(CORE, ns, "configmaps")
        if role == "canary" and scale.keep_canary:
            continue  # its earlier pods serve until the stable replicas are back (scale_plan)
        if config is None:
            if role == "baseline" and adopted is not None:
                continue  # never deleted: the adopted Deployment is its owner's
            await delete(f"{dep_path}/{owner.deployment(role)}", "apps", "deployments", "Deployment")
            if render_configmap(owner, spec, want.baseline, role) is not None:
                await delete(f"{cm_path}/{configmap_name(owner.name, role)}", "", "configmaps", "ConfigMap")
            continue
        configmap = render_configmap(owner, spec, config, role)
        if configmap is not None:
            await apply(cm_path, configmap, "", "configmaps")
        replicas = scale.canary if role == "canary" else scale.baseline
        deployment = render_engine_deployment(owner, spec, config, role, replicas, adopted)
        await apply(dep_path, deployment, "apps", "deployments", adopted if role == "baseline" else None)
    await _ensure_routing(client, owner, spec, want, monitoring, pool_tokens, apply, delete, seen)
    if monitoring:
        try:
            await apply(
                ns_path(MONITORING, ns, "servicemonitors"),
                render_service_monitor(owner, spec),
                "monitoring.coreos.com",
                "servicemonitors",
            )
        except KubeError as err:  # the CRD went away, or no RBAC for it: not fatal for serving
            logger.warning("ServiceMonitor %s/%s not applied: %s", ns, owner.name, err)
    return done


Apply = Callable[[str, dict[str, Any], str, str], Awaitable[bool]]
Delete = Callable[[str, str, str, str], Awaitable[None]]


async def _ensure_routing(
    client: KubeClient,
    owner: Owner,
    spec: ServingDeploymentSpec,
    want: Desired,
    monitoring: bool,
    pool_tokens: int | None,
    apply: Apply,
    delete: Delete,
    known: Known,
) -> None:
    """The user-facing Service, and the router's objects when the routing resolves to a router (the
    baseline config's routing knobs: the fleet's; a routing knob's change re-renders only these).
    Without a router, the router's objects are deleted if its Deployment exists (they are created
    and deleted together; an unrouted resource costs one GET here)."""
    ns = owner.namespace
    settings = settings_for(spec, want.baseline, pool_tokens)
    services = ns_path(CORE, ns, "services")
    name = router_name(owner.name)
    require("apps", "deployments", "get")
    live = await _read(client, ns_path(APPS, ns, "deployments", name), known)

    async def put(body: dict[str, Any]) -> bool:
        group, resource = _COLLECTIONS[str(body["kind"])]
        return await apply(ns_path(_API[group], ns, resource), body, group, resource)

    if settings.routed:
        ready = live is not None and claim(live, owner) is Claim.OURS and _ready_replicas(live) > 0
        objects = render_routed(owner, spec, settings, router_ready=ready, monitoring=monitoring)
        # The account first, then its Role and binding, each only while the ones before are ours.
        identity = sorted(
            (body for body in objects if body["kind"] in ROUTER_IDENTITY),
            key=lambda body: ROUTER_IDENTITY_ORDER.index(str(body["kind"])),
        )
        ours = True
        for body in identity:
            ours = ours and await put(body)
        rest = [body for body in objects if body["kind"] not in ROUTER_IDENTITY]
        if not ours:
            # An account, Role or binding of the router's name is someone else's (reported): no pod
            # of ours runs under it and no Role of ours grants it anything. The Service stays on the
            # engines; our router Deployment, Role and binding go.
            objects = render_routed(owner, spec, settings, router_ready=False, monitoring=monitoring)
            rest = [body for body in objects if body["kind"] not in ROUTER_IDENTITY | {"Deployment"}]
            if live is not None:
                await delete(ns_path(APPS, ns, "deployments", name), "apps", "deployments", "Deployment")
            for kind in ("RoleBinding", "Role"):
                group, resource = _COLLECTIONS[kind]
                await delete(ns_path(_API[group], ns, resource, name), group, resource, kind)
        for body in rest:
            await put(body)
        if not monitoring:
            await delete(f"{services}/{engines_service_name(owner.name)}", "", "services", "Service")
        return
    await apply(services, render_service(owner, spec), "", "services")
    if live is None:
        return
    await delete(f"{services}/{engines_service_name(owner.name)}", "", "services", "Service")
    await delete(ns_path(APPS, ns, "deployments", name), "apps", "deployments", "Deployment")
    for kind in ("RoleBinding", "Role", "ServiceAccount"):
        group, resource = _COLLECTIONS[kind]
        await delete(ns_path(_API[group], ns, resource, name), group, resource, kind)


# The router's object kinds: (API group, resource), and each group's API path.
_COLLECTIONS: dict[str, tuple[str, str]] = {
    "ServiceAccount": ("", "serviceaccounts"),
    "Role": (RBAC_GROUP, "roles"),
    "RoleBinding": (RBAC_GROUP, "rolebindings"),
    "Deployment": ("apps", "deployments"),
    "Service": ("", "services"),
}
_API: dict[str, str] = {"": CORE, "apps": APPS, RBAC_GROUP: RBAC}
# What the router's pods run as: a Deployment of ours never names an account that is not.
ROUTER_IDENTITY_ORDER = ("ServiceAccount", "Role", "RoleBinding")  # each refers to the one before
ROUTER_IDENTITY = frozenset(ROUTER_IDENTITY_ORDER)


def _ready_replicas(deployment: Mapping[str, Any]) -> int:
    return int((deployment.get("status") or {}).get("readyReplicas") or 0)


def ready_condition(
    spec: ServingDeploymentSpec, children: Children, found: Sequence[Foreign] = ()
) -> tuple[bool, str, str]:
    """(ready, reason, message) for the Ready condition: all serving replicas ready; an object of
    our names that is not ours comes first (``ResourceExists``, naming it). Short of replicas with
    an engine pod failing (crashing, or exited for good), ``EngineFailing`` with why: the engine's
    own exit message (weights that do not fit, an unsupported GPU count), bounded (``pod_message``)."""
    if found:
        return False, "ResourceExists", "; ".join(f.message() for f in found)[:1024]
    ready = sum(1 for p in children.pods if p.ready and not p.deleting)
    if children.deployments.get("baseline") is None:
        return False, "Creating", "the engine Deployment does not exist yet"
    if ready >= spec.replicas:
        return True, "ReplicasReady", f"{ready}/{spec.replicas} engine pods ready"
    failing = [p for p in children.pods if p.crashed and not p.ready and not p.deleting]
    if failing:
        more = f" (and {len(failing) - 1} more)" if len(failing) > 1 else ""
        detail = failure_detail(failing[0])
        return False, "EngineFailing", f"{ready}/{spec.replicas} engine pods ready; {detail}{more}"
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

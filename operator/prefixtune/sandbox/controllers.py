"""The Deployment, ReplicaSet and Endpoints controllers of the sandbox, as pure functions.

Each takes the objects as the API server returns them and says what to write; the controller
manager (``controller_manager.py``) lists, calls these, and sends the writes. Behaviour follows
kube-controller-manager where an operator can observe it:

* **Deployment** (``reconcile_deployment``): the new ReplicaSet is the one whose
  ``pod-template-hash`` label matches the hash of the current pod template; it is created (name
  ``<deployment>-<hash>``, ownerReference with ``controller: true``, the revision annotation) when
  missing. RollingUpdate scales the new ReplicaSet up while the total stays within
  ``replicas + maxSurge`` and scales old ones down while the available pods stay at least
  ``replicas - maxUnavailable`` (percentages: surge rounds up, unavailable down; both 0 means
  unavailable 1), first dropping old replicas that are not available (kube's cleanup of unhealthy
  replicas). Recreate scales old ReplicaSets to 0 and waits for their pods to go before scaling up.
  Old ReplicaSets stay at 0 replicas (history) up to ``revisionHistoryLimit``. ``paused`` stops
  scaling. Status: replicas, updatedReplicas, readyReplicas, availableReplicas, unavailableReplicas,
  observedGeneration and the Available/Progressing conditions (NewReplicaSetAvailable,
  ReplicaSetUpdated, ProgressDeadlineExceeded after ``progressDeadlineSeconds``, in sandbox time).
* **ReplicaSet** (``reconcile_replicaset``): creates pods from the template (``generateName
  <rs>-``, ownerReference) up to ``replicas`` active pods; deletes surplus pods in kube's order (not
  scheduled, pending, not ready, more restarts, newest first); status replicas, readyReplicas,
  availableReplicas, fullyLabeledReplicas, observedGeneration. Failed pods are replaced.
* **Endpoints / EndpointSlice** (``endpoints_for``): the pods matching a Service's selector that have
  an IP, ready ones under ``addresses``, others under ``notReadyAddresses``; each Service port's
  ``targetPort`` resolved (numbers, or a container port name).

``minReadySeconds`` is honoured as 0 (ready means available). Not emulated: pod adoption and
orphaning by label, the scale subresource, ``kubectl rollout undo`` (the rollback annotations).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefixtune.sandbox import pods as podlib

HASH_LABEL = "pod-template-hash"
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # kube's SafeEncodeString alphabet

Obj = Mapping[str, Any]


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _spec(obj: Obj) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _status(obj: Obj) -> Mapping[str, Any]:
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


def owned_by(obj: Obj, owner: Obj) -> bool:
    uid = _meta(owner).get("uid")
    return any(ref.get("uid") == uid for ref in _meta(obj).get("ownerReferences") or ())


def owner_reference(owner: Obj, kind: str, api_version: str) -> dict[str, Any]:
    meta = _meta(owner)
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def template_hash(template: Obj) -> str:
    """A stable hash of a pod template, spelled like kube's pod-template-hash (10 safe characters)."""
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).digest()
    return "".join(_SAFE_ALPHABET[b % len(_SAFE_ALPHABET)] for b in digest[:10])


def labels_match(selector: Mapping[str, Any] | None, labels: Mapping[str, Any]) -> bool:
    """A LabelSelector (matchLabels + matchExpressions) or a plain map (Service selector) matches."""
    if not selector:
        return False
    plain = "matchLabels" not in selector and "matchExpressions" not in selector
    match_labels = selector if plain else (selector.get("matchLabels") or {})
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for expr in () if plain else (selector.get("matchExpressions") or ()):
        key, op, values = expr.get("key"), expr.get("operator"), list(expr.get("values") or ())
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def resolve_int_or_percent(value: Any, total: int, *, round_up: bool, field_name: str) -> int:
    if value is None:
        value = "25%"
    if isinstance(value, bool):
        raise ValueError(f"{field_name}: must be an integer or a percentage like '25%', got {value!r}")
    if isinstance(value, int):
        return max(value, 0)
    text = str(value).strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            raise ValueError(
                f"{field_name}: must be an integer or a percentage like '25%', got {value!r}"
            ) from None
        raw = pct * total / 100.0
        return max(int(math.ceil(raw) if round_up else math.floor(raw)), 0)
    try:
        return max(int(text), 0)
    except ValueError:
        raise ValueError(
            f"{field_name}: must be an integer or a percentage like '25%', got {value!r}"
        ) from None


def surge_and_unavailable(deployment: Obj) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) as numbers of pods, with kube's rounding and the 0/0 rule."""
    replicas = int(_spec(deployment).get("replicas", 1))
    rolling = (_spec(deployment).get("strategy") or {}).get("rollingUpdate") or {}
    surge = resolve_int_or_percent(
        rolling.get("maxSurge"), replicas, round_up=True, field_name="spec.strategy.rollingUpdate.maxSurge"
    )
    unavailable = resolve_int_or_percent(
        rolling.get("maxUnavailable"),
        replicas,
        round_up=False,
        field_name="spec.strategy.rollingUpdate.maxUnavailable",
    )
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, min(unavailable, replicas) if replicas else unavailable


# --------------------------------------------------------------------------------------------------
# Writes


@dataclass(frozen=True)
class Create:
    path: str  # the collection URL path
    body: dict[str, Any]


@dataclass(frozen=True)
class Patch:
    path: str  # the object's URL path (with /status for status)
    body: dict[str, Any]  # a merge patch


@dataclass(frozen=True)
class Delete:
    path: str


Write = Create | Patch | Delete


def _apps_path(namespace: str, plural: str, name: str = "") -> str:
    base = f"/apis/apps/v1/namespaces/{namespace}/{plural}"
    return f"{base}/{name}" if name else base


def _core_path(namespace: str, plural: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{namespace}/{plural}"
    return f"{base}/{name}" if name else base


# --------------------------------------------------------------------------------------------------
# ReplicaSet


def _available(rs: Obj) -> int:
    return int(_status(rs).get("availableReplicas", 0))


def _rs_replicas(rs: Obj) -> int:
    return int(_spec(rs).get("replicas", 0))


def _delete_rank(pod: Obj) -> tuple[int, int, int, int, str]:
    """Lower ranks are deleted first (kube's ActivePods ordering, simplified)."""
    spec, status = _spec(pod), _status(pod)
    scheduled = 1 if spec.get("nodeName") else 0
    phase = {"Pending": 0, "Unknown": 1, "Running": 2}.get(str(status.get("phase", "Pending")), 0)
    ready = 1 if podlib.is_ready(pod) else 0
    created = str(_meta(pod).get("creationTimestamp", ""))
    # more restarts first, then newer first: negate by sorting on the complement below
    return (scheduled, phase, ready, -podlib.restart_count(pod), _invert(created))


def _invert(text: str) -> str:
    return "".join(chr(0x10FFFF - ord(c)) for c in text)


def reconcile_replicaset(rs: Obj, pods: Sequence[Obj]) -> list[Write]:
    """Pods to create or delete so that ``spec.replicas`` active pods exist; then the status."""
    meta = _meta(rs)
    ns, name = str(meta.get("namespace", "default")), str(meta.get("name"))
    mine = [p for p in pods if owned_by(p, rs)]
    active = [p for p in mine if podlib.is_active(p)]
    failed = [p for p in mine if not podlib.is_active(p) and not _meta(p).get("deletionTimestamp")]
    want = _rs_replicas(rs)
    writes: list[Write] = []
    template = _spec(rs).get("template") or {}
    for _ in range(max(want - len(active), 0)):
        tmeta = dict(template.get("metadata") or {})
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{name}-",
                "namespace": ns,
                "labels": dict(tmeta.get("labels") or {}),
                "annotations": dict(tmeta.get("annotations") or {}),
                "ownerReferences": [owner_reference(rs, "ReplicaSet", "apps/v1")],
            },
            "spec": copy.deepcopy(dict(template.get("spec") or {})),
        }
        body["spec"].setdefault("restartPolicy", "Always")
        writes.append(Create(_core_path(ns, "pods"), body))
    surplus = len(active) - want
    if surplus > 0:
        for pod in sorted(active, key=_delete_rank)[:surplus]:
            writes.append(Delete(_core_path(ns, "pods", str(_meta(pod).get("name")))))
    for pod in failed:  # a Failed pod of a ReplicaSet is replaced and removed
        writes.append(Delete(_core_path(ns, "pods", str(_meta(pod).get("name")))))
    ready = sum(1 for p in active if podlib.is_ready(p))
    labels = (template.get("metadata") or {}).get("labels") or {}
    status = {
        "replicas": len(active),
        "fullyLabeledReplicas": sum(
            1 for p in active if all((_meta(p).get("labels") or {}).get(k) == v for k, v in labels.items())
        ),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "observedGeneration": int(meta.get("generation", 1)),
    }
    if _subset_differs(status, _status(rs)):
        writes.append(Patch(_apps_path(ns, "replicasets", name) + "/status", {"status": status}))
    return writes


def _subset_differs(wanted: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    return any(current.get(k, 0 if isinstance(v, int) else None) != v for k, v in wanted.items())


# --------------------------------------------------------------------------------------------------
# Deployment


@dataclass
class _Scale:
    """ReplicaSet sizes decided during one reconcile (applied as patches at the end)."""

    sizes: dict[str, int] = field(default_factory=dict)

    def get(self, rs: Obj) -> int:
        return self.sizes.get(str(_meta(rs).get("name")), _rs_replicas(rs))

    def set(self, rs: Obj, value: int) -> None:
        self.sizes[str(_meta(rs).get("name"))] = max(int(value), 0)


def _revision(rs: Obj) -> int:
    try:
        return int((_meta(rs).get("annotations") or {}).get(REVISION_ANNOTATION, 0))
    except ValueError:
        return 0


def _new_replicaset(deployment: Obj, pod_hash: str, revision: int, replicas: int) -> dict[str, Any]:
    meta, spec = _meta(deployment), _spec(deployment)
    template = copy.deepcopy(dict(spec.get("template") or {}))
    tmeta = template.setdefault("metadata", {})
    tmeta["labels"] = {**(tmeta.get("labels") or {}), HASH_LABEL: pod_hash}
    selector = copy.deepcopy(dict(spec.get("selector") or {}))
    selector["matchLabels"] = {**(selector.get("matchLabels") or {}), HASH_LABEL: pod_hash}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": f"{meta.get('name')}-{pod_hash}",
            "namespace": meta.get("namespace", "default"),
            "labels": dict(tmeta["labels"]),
            "annotations": {REVISION_ANNOTATION: str(revision)},
            "ownerReferences": [owner_reference(deployment, "Deployment", "apps/v1")],
        },
        "spec": {"replicas": replicas, "selector": selector, "template": template},
    }


def reconcile_deployment(
    deployment: Obj, replicasets: Sequence[Obj], now_s: float, speedup: float = 1.0
) -> list[Write]:
    """Create the new ReplicaSet, scale ReplicaSets for the strategy, and write the Deployment status.

    ``now_s`` is wall-clock epoch seconds; ``progressDeadlineSeconds`` is divided by ``speedup``. The
    time of the last progress is the Progressing condition's ``lastUpdateTime``, as in Kubernetes.
    """
    meta, spec = _meta(deployment), _spec(deployment)
    ns, name = str(meta.get("namespace", "default")), str(meta.get("name"))
    replicas = int(spec.get("replicas", 1))
    owned = [rs for rs in replicasets if owned_by(rs, deployment)]
    pod_hash = template_hash(spec.get("template") or {})
    new = next((rs for rs in owned if (_meta(rs).get("labels") or {}).get(HASH_LABEL) == pod_hash), None)
    olds = sorted(
        (rs for rs in owned if rs is not new), key=lambda rs: str(_meta(rs).get("creationTimestamp", ""))
    )
    writes: list[Write] = []
    scale = _Scale()
    strategy = str((spec.get("strategy") or {}).get("type", "RollingUpdate"))
    surge, unavailable = surge_and_unavailable(deployment)
    newest_old = max([_revision(rs) for rs in olds] or [0])
    revision = newest_old + 1
    if new is not None and _revision(new) <= newest_old:
        # an old template is current again (a rollback): its ReplicaSet becomes the newest revision
        writes.append(
            Patch(
                _apps_path(ns, "replicasets", str(_meta(new).get("name"))),
                {"metadata": {"annotations": {REVISION_ANNOTATION: str(revision)}}},
            )
        )
    elif new is not None:
        revision = _revision(new)
    paused = bool(spec.get("paused"))

    if new is None and not paused:
        if strategy == "Recreate":
            start = 0
        else:
            total = sum(_rs_replicas(rs) for rs in olds)
            start = min(max(replicas + surge - total, 0), replicas) if olds else replicas
        body = _new_replicaset(deployment, pod_hash, revision, start)
        writes.append(Create(_apps_path(ns, "replicasets"), body))
        new_size = start
        new_status: Mapping[str, Any] = {}
    else:
        new_size = _rs_replicas(new) if new is not None else 0
        new_status = _status(new) if new is not None else {}

    if not paused:
        if strategy == "Recreate":
            old_pods = sum(int(_status(rs).get("replicas", 0)) for rs in olds)
            for rs in olds:
                scale.set(rs, 0)
            if new is not None and old_pods == 0 and all(_rs_replicas(rs) == 0 for rs in olds):
                scale.set(new, replicas)
        elif new is not None:
            _rolling(replicas, surge, unavailable, new, olds, scale)
        for rs in [*olds, *([new] if new is not None else [])]:
            if scale.get(rs) != _rs_replicas(rs):
                writes.append(
                    Patch(
                        _apps_path(ns, "replicasets", str(_meta(rs).get("name"))),
                        {"spec": {"replicas": scale.get(rs)}},
                    )
                )
        if new is not None:
            new_size = scale.get(new)
        writes.extend(_prune_history(deployment, olds, scale))

    # Revision annotation on the Deployment (kubectl rollout history reads it).
    current_rev = str(revision)
    if (meta.get("annotations") or {}).get(REVISION_ANNOTATION) != current_rev:
        writes.append(
            Patch(
                _apps_path(ns, "deployments", name),
                {"metadata": {"annotations": {REVISION_ANNOTATION: current_rev}}},
            )
        )

    status = deployment_status(deployment, new_status, new_size, olds, unavailable, now_s, speedup)
    if _status_changed(status, _status(deployment)):
        writes.append(Patch(_apps_path(ns, "deployments", name) + "/status", {"status": status}))
    return writes


def _rolling(
    replicas: int, surge: int, unavailable: int, new: Obj, olds: Sequence[Obj], scale: _Scale
) -> None:
    """kube's rolloutRolling: scale the new ReplicaSet up, then the old ones down, within the bounds."""
    all_rs = [*olds, new]
    total = sum(scale.get(rs) for rs in all_rs)
    new_size = scale.get(new)
    if new_size < replicas:
        room = replicas + surge - total
        if room > 0:
            scale.set(new, min(new_size + room, replicas))
    elif new_size > replicas:
        scale.set(new, replicas)

    min_available = replicas - unavailable
    pods_now = sum(int(_status(rs).get("replicas", 0)) for rs in all_rs)
    new_unavailable = scale.get(new) - _available(new)
    max_down = pods_now - min_available - max(new_unavailable, 0)
    if max_down <= 0:
        return
    # Old replicas that are not available go first: scaling them down costs no availability.
    for rs in olds:
        if max_down <= 0:
            break
        unhealthy = scale.get(rs) - _available(rs)
        if unhealthy <= 0:
            continue
        step = min(max_down, unhealthy)
        scale.set(rs, scale.get(rs) - step)
        max_down -= step
    available = sum(_available(rs) for rs in all_rs)
    budget = available - min_available
    for rs in olds:
        if budget <= 0:
            break
        step = min(scale.get(rs), budget)
        if step <= 0:
            continue
        scale.set(rs, scale.get(rs) - step)
        budget -= step


def _prune_history(deployment: Obj, olds: Sequence[Obj], scale: _Scale) -> list[Write]:
    limit = int(_spec(deployment).get("revisionHistoryLimit", 10))
    idle = [rs for rs in olds if scale.get(rs) == 0 and int(_status(rs).get("replicas", 0)) == 0]
    surplus = len(idle) - limit
    if surplus <= 0:
        return []
    idle.sort(key=_revision)
    return [
        Delete(
            _apps_path(str(_meta(rs).get("namespace", "default")), "replicasets", str(_meta(rs).get("name")))
        )
        for rs in idle[:surplus]
    ]


def _iso(epoch_s: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch_s, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text: str) -> float | None:
    import datetime

    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC).timestamp()
    except (TypeError, ValueError):
        return None


def deployment_status(
    deployment: Obj,
    new_status: Mapping[str, Any],
    new_size: int,
    olds: Sequence[Obj],
    unavailable: int,
    now_s: float,
    speedup: float = 1.0,
) -> dict[str, Any]:
    """The Deployment's status from its ReplicaSets' statuses (counts of pods, not desired sizes)."""
    spec, meta = _spec(deployment), _meta(deployment)
    replicas = int(spec.get("replicas", 1))
    all_status = [new_status, *(_status(rs) for rs in olds)]
    total = sum(int(s.get("replicas", 0)) for s in all_status)
    ready = sum(int(s.get("readyReplicas", 0)) for s in all_status)
    available = sum(int(s.get("availableReplicas", 0)) for s in all_status)
    updated = int(new_status.get("replicas", 0))
    complete = (
        updated == replicas
        and total == replicas
        and available == replicas
        and new_size == replicas
        and int(new_status.get("availableReplicas", 0)) == replicas
    )
    now = _iso(now_s)
    before = {c.get("type"): c for c in _status(deployment).get("conditions") or ()}

    def condition(kind: str, ok: bool, reason: str, message: str, progress: bool = False) -> dict[str, Any]:
        old = before.get(kind) or {}
        status_text = "True" if ok else "False"
        same_status = old.get("status") == status_text
        same = same_status and old.get("reason") == reason
        cond = {
            "type": kind,
            "status": status_text,
            "reason": reason,
            "message": message,
            "lastTransitionTime": old.get("lastTransitionTime", now) if same_status else now,
            "lastUpdateTime": old.get("lastUpdateTime", now) if same and not progress else now,
        }
        return cond

    name = meta.get("name")
    available_ok = available >= replicas - unavailable
    conditions = [
        condition(
            "Available",
            available_ok,
            "MinimumReplicasAvailable" if available_ok else "MinimumReplicasUnavailable",
            "Deployment has minimum availability."
            if available_ok
            else "Deployment does not have minimum availability.",
        )
    ]
    rs_name = f"{name}-{template_hash(spec.get('template') or {})}"
    progress_fields = (total, updated, ready, available)
    prev = _status(deployment)
    moved = progress_fields != (
        int(prev.get("replicas", 0)),
        int(prev.get("updatedReplicas", 0)),
        int(prev.get("readyReplicas", 0)),
        int(prev.get("availableReplicas", 0)),
    ) or int(prev.get("observedGeneration", 0)) != int(meta.get("generation", 1))
    if complete:
        progressing = condition(
            "Progressing",
            True,
            "NewReplicaSetAvailable",
            f'ReplicaSet "{rs_name}" has successfully progressed.',
        )
    else:
        deadline = float(spec.get("progressDeadlineSeconds", 600)) / max(speedup, 1e-9)
        old = before.get("Progressing") or {}
        last = _epoch(str(old.get("lastUpdateTime", "")))
        stalled = (
            not moved
            and old.get("reason") in {"ReplicaSetUpdated", "NewReplicaSetCreated", "ProgressDeadlineExceeded"}
            and last is not None
            and now_s - last > deadline
        )
        if stalled:
            progressing = condition(
                "Progressing",
                False,
                "ProgressDeadlineExceeded",
                f'ReplicaSet "{rs_name}" has timed out progressing.',
            )
        else:
            progressing = condition(
                "Progressing",
                True,
                "ReplicaSetUpdated",
                f'ReplicaSet "{rs_name}" is progressing.',
                progress=moved,
            )
    conditions.append(progressing)
    return {
        "observedGeneration": int(meta.get("generation", 1)),
        "replicas": total,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": available,
        "unavailableReplicas": max(replicas - available, 0),
        "conditions": conditions,
    }


def _status_changed(wanted: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    return json.dumps(wanted, sort_keys=True) != json.dumps(dict(current), sort_keys=True)


# --------------------------------------------------------------------------------------------------
# Services


def _target_port(port: Mapping[str, Any], pod: Obj) -> int | None:
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int):
        return target
    text = str(target)
    if text.isdigit():
        return int(text)
    for container in _spec(pod).get("containers") or ():
        for cport in container.get("ports") or ():
            if cport.get("name") == text:
                return int(cport["containerPort"])
    return None


def endpoints_for(service: Obj, pods: Sequence[Obj]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The Endpoints and EndpointSlice a Service should have; None for a Service without a selector."""
    meta, spec = _meta(service), _spec(service)
    selector = spec.get("selector")
    if not selector:
        return None
    ns, name = str(meta.get("namespace", "default")), str(meta.get("name"))
    members = sorted(
        (
            p
            for p in pods
            if labels_match(selector, _meta(p).get("labels") or {})
            and _status(p).get("podIP")
            and not _meta(p).get("deletionTimestamp")
            and podlib.is_active(p)
        ),
        key=lambda p: str(_meta(p).get("name")),
    )
    subsets: list[dict[str, Any]] = []
    slice_ports: list[dict[str, Any]] = []
    slice_endpoints: list[dict[str, Any]] = []
    service_ports = list(spec.get("ports") or ())
    groups: dict[tuple[tuple[str, int, str], ...], dict[str, list[dict[str, Any]]]] = {}
    for pod in members:
        resolved = []
        for sp in service_ports:
            target = _target_port(sp, pod)
            if target is not None:
                resolved.append((str(sp.get("name", "")), target, str(sp.get("protocol", "TCP"))))
        key = tuple(resolved)
        address = {
            "ip": _status(pod)["podIP"],
            "nodeName": _spec(pod).get("nodeName", podlib.NODE_NAME),
            "targetRef": {
                "kind": "Pod",
                "namespace": ns,
                "name": _meta(pod).get("name"),
                "uid": _meta(pod).get("uid"),
            },
        }
        bucket = groups.setdefault(key, {"addresses": [], "notReadyAddresses": []})
        ready = podlib.is_ready(pod)
        bucket["addresses" if ready else "notReadyAddresses"].append(address)
        slice_endpoints.append(
            {
                "addresses": [address["ip"]],
                "conditions": {"ready": ready, "serving": ready, "terminating": False},
                "nodeName": address["nodeName"],
                "targetRef": address["targetRef"],
            }
        )
        if not slice_ports:
            slice_ports = [
                {**({"name": n} if n else {}), "port": p, "protocol": proto} for n, p, proto in resolved
            ]
    for key, bucket in groups.items():
        subset: dict[str, Any] = {
            "ports": [{**({"name": n} if n else {}), "port": p, "protocol": proto} for n, p, proto in key]
        }
        for field_name in ("addresses", "notReadyAddresses"):
            if bucket[field_name]:
                subset[field_name] = bucket[field_name]
        subsets.append(subset)
    owner = {
        "apiVersion": "v1",
        "kind": "Service",
        "name": name,
        "uid": meta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }
    endpoints = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": name, "namespace": ns, "labels": dict(meta.get("labels") or {})},
        "subsets": subsets,
    }
    endpoint_slice = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{name}-sandbox",
            "namespace": ns,
            "labels": {
                "kubernetes.io/service-name": name,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
            "ownerReferences": [owner],
        },
        "addressType": "IPv4",
        "endpoints": slice_endpoints,
        "ports": slice_ports,
    }
    return endpoints, endpoint_slice


def endpoint_targets(endpoints: Obj) -> list[tuple[str, int]]:
    """(ip, port) of every ready address of an Endpoints object (first port of each subset)."""
    out: list[tuple[str, int]] = []
    for subset in endpoints.get("subsets") or ():
        ports = subset.get("ports") or ()
        if not ports:
            continue
        port = int(ports[0]["port"])
        out.extend((str(a["ip"]), port) for a in subset.get("addresses") or ())
    return out


__all__ = [
    "HASH_LABEL",
    "REVISION_ANNOTATION",
    "Create",
    "Delete",
    "Patch",
    "Write",
    "deployment_status",
    "endpoint_targets",
    "endpoints_for",
    "labels_match",
    "owned_by",
    "owner_reference",
    "reconcile_deployment",
    "reconcile_replicaset",
    "resolve_int_or_percent",
    "surge_and_unavailable",
    "template_hash",
]

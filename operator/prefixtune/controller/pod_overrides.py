"""``spec.pod`` merged under the operator's own fields of a rendered engine pod (pure, in place).

The validation (``api.rules``) has already refused every override that names what the operator
sets (``api.owned``: its env vars, volumes, mount paths, label and annotation keys), so this merge
only adds: the tenant's env before the operator's (``$(VAR)`` references of the operator's args
still resolve), its volumes and mounts after the operator's, its tolerations after the operator's,
its node selector over the GPU label (the one key it may replace). Should an unvalidated spec get
here anyway, the operator's fields still win: a colliding item of the tenant's is dropped, never
written over the operator's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from prefixtune.api import owned
from prefixtune.api.models import MAX_MAP_ENTRIES, PodOverrides

MAX_RECORDED = 2 * MAX_MAP_ENTRIES * 400  # bytes of the recorded-keys annotation read back


def _named(items: list[dict[str, Any]]) -> set[str]:
    return {str(item.get("name")) for item in items}


def apply(
    container: dict[str, Any],
    pod_spec: dict[str, Any],
    template_meta: dict[str, Any],
    pod: PodOverrides | None,
) -> None:
    """Merge ``pod`` into a rendered engine container, pod spec and pod template metadata."""
    if pod is None:
        return
    overrides = pod.to_dict()
    theirs_env = [
        var
        for var in overrides.get("env", [])
        if not owned.owned_env(var["name"]) and var["name"] not in _named(container.get("env", []))
    ]
    if theirs_env:
        container["env"] = [*theirs_env, *container.get("env", [])]
    volumes = [
        v for v in overrides.get("volumes", []) if v["name"] not in _named(pod_spec.get("volumes", []))
    ]
    if volumes:
        pod_spec["volumes"] = [*pod_spec.get("volumes", []), *volumes]
    taken = {str(m.get("mountPath")) for m in container.get("volumeMounts", [])}
    mounts = [m for m in overrides.get("volumeMounts", []) if m["mountPath"] not in taken]
    if mounts:
        container["volumeMounts"] = [*container.get("volumeMounts", []), *mounts]
    if "nodeSelector" in overrides:
        pod_spec["nodeSelector"] = {**pod_spec.get("nodeSelector", {}), **overrides["nodeSelector"]}
    if overrides.get("tolerations"):
        pod_spec["tolerations"] = [*pod_spec.get("tolerations", []), *overrides["tolerations"]]
    for key in ("affinity", "priorityClassName"):
        if key in overrides:
            pod_spec[key] = overrides[key]
    if overrides.get("imagePullSecrets"):
        pod_spec["imagePullSecrets"] = overrides["imagePullSecrets"]
    for key, taken_keys in (("labels", owned.OWNED_LABELS), ("annotations", owned.OWNED_ANNOTATIONS)):
        given: Mapping[str, str] = overrides.get(key) or {}
        mine = template_meta.setdefault(key, {})
        extra = {k: v for k, v in given.items() if not owned.owned_key(k, taken_keys) and k not in mine}
        template_meta[key] = {**mine, **extra}


def metadata_keys(pod: PodOverrides | None) -> dict[str, list[str]]:
    """The pod label and annotation keys ``pod`` gives ({"labels": [...], "annotations": [...]};
    empty when it gives none)."""
    if pod is None:
        return {}
    given = {"labels": sorted(pod.labels or {}), "annotations": sorted(pod.annotations or {})}
    return {key: names for key, names in given.items() if names}


def stale_metadata(recorded: object, template_meta: Mapping[str, Any]) -> dict[str, dict[str, None]]:
    """The template label/annotation keys a former rendering gave from spec.pod (``recorded``: the
    Deployment's ``POD_METADATA_KEYS`` annotation, JSON) that ``template_meta`` no longer has, as the
    nulls of a merge patch ({"labels": {key: None}}); the operator's own keys are never among them."""
    try:
        parsed = json.loads(recorded) if isinstance(recorded, str) and len(recorded) <= MAX_RECORDED else {}
    except ValueError:
        parsed = {}
    out: dict[str, dict[str, None]] = {}
    for key, taken in (("labels", owned.OWNED_LABELS), ("annotations", owned.OWNED_ANNOTATIONS)):
        names = parsed.get(key) if isinstance(parsed, dict) else None
        have = template_meta.get(key) or {}
        gone = {
            str(n): None
            for n in (names if isinstance(names, list) else [])
            if isinstance(n, str) and n not in have and not owned.owned_key(n, taken)
        }
        if gone:
            out[key] = gone
    return out

"""The three PATCH flavours of the Kubernetes API, as pure functions over JSON-like values.

* JSON merge patch (RFC 7386, ``application/merge-patch+json``): maps merge recursively, ``null``
  deletes a key, every other value (lists included) replaces the old one.
* Strategic merge patch (``application/strategic-merge-patch+json``): like a merge patch, but the lists
  that Kubernetes declares with ``patchStrategy: merge`` are merged item by item on their merge key
  (``containers`` by ``name``, ``volumeMounts`` by ``mountPath``...), lists of scalars with that strategy
  (``finalizers``) are merged as ordered sets, and the ``$patch`` / ``$deleteFromPrimitiveList``
  directives are honoured. The real server reads the merge keys from the Go struct tags of each type;
  here they are keyed by field name only (see ``MERGE_KEYS``), which is right for the built-in types
  that operators patch (pods, pod templates, services, conditions, owner references).
* JSON patch (RFC 6902, ``application/json-patch+json``): a list of operations, applied with the
  ``jsonpatch`` package that kmock itself depends on.

Nothing here mutates its arguments.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import jsonpatch

# Field name -> merge key(s) for lists with patchStrategy=merge, tried in order (first present wins).
# "ports" is both container ports (containerPort) and service ports (port).
MERGE_KEYS: Mapping[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "ports": ("containerPort", "port"),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "volumeDevices": ("devicePath",),
    "conditions": ("type",),
    "ownerReferences": ("uid",),
    "imagePullSecrets": ("name",),
    "hostAliases": ("ip",),
    "resourceClaims": ("name",),
    "topologySpreadConstraints": ("topologyKey",),
}

# Lists of scalars with patchStrategy=merge: merged as ordered sets.
MERGED_SCALAR_LISTS: frozenset[str] = frozenset({"finalizers"})

_DELETE_FROM_PRIMITIVE = "$deleteFromPrimitiveList/"
_SET_ELEMENT_ORDER = "$setElementOrder/"


class PatchError(ValueError):
    """A patch that cannot be applied: malformed, or (JSON patch) a path that does not exist."""


class PatchTestFailed(PatchError):
    """A JSON-patch ``test`` operation did not hold (the API answers 422 Invalid)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 JSON merge patch; returns a new value."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: dict[str, Any] = dict(copy.deepcopy(target)) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Apply a strategic merge patch; returns a new value."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if not isinstance(target, Mapping):
        target = {}
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return {}
    if directive is not None:
        raise PatchError(f"$patch: unknown directive {directive!r} (allowed: replace, delete)")

    result: dict[str, Any] = copy.deepcopy(dict(target))
    for key, value in patch.items():
        if key.startswith(_DELETE_FROM_PRIMITIVE):
            field = key[len(_DELETE_FROM_PRIMITIVE) :]
            if not isinstance(value, list):
                raise PatchError(f"{key}: must be a list, got {type(value).__name__}")
            if isinstance(result.get(field), list):
                result[field] = [item for item in result[field] if item not in value]
            continue
        if key.startswith("$"):  # $setElementOrder/..., $retainKeys: ordering/pruning hints, not data
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(key, result[key], value)
        elif isinstance(value, Mapping):
            result[key] = strategic_merge_patch(result.get(key), value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merge_list(field: str, current: list[Any], patch: list[Any]) -> list[Any]:
    if field in MERGED_SCALAR_LISTS:
        union = list(current)
        union.extend(item for item in patch if item not in union)
        return copy.deepcopy(union)
    keys = MERGE_KEYS.get(field)
    if keys is None or not all(isinstance(item, Mapping) for item in [*current, *patch]):
        if any(isinstance(item, Mapping) and "$patch" in item for item in patch):
            raise PatchError(f"{field}: $patch directives need a list with a merge key")
        return copy.deepcopy(patch)

    def key_of(item: Mapping[str, Any]) -> tuple[str, Any] | None:
        for name in keys:
            if name in item:
                return name, item[name]
        return None

    merged: list[Any] = copy.deepcopy(current)
    for item in patch:
        item_key = key_of(item)
        if item_key is None:
            raise PatchError(f"{field}: every item needs its merge key ({' or '.join(keys)})")
        position = next((i for i, old in enumerate(merged) if key_of(old) == item_key), None)
        if item.get("$patch") == "delete":
            if position is not None:
                del merged[position]
        elif item.get("$patch") == "replace":
            replacement = {k: copy.deepcopy(v) for k, v in item.items() if k != "$patch"}
            if position is None:
                merged.append(replacement)
            else:
                merged[position] = replacement
        elif position is None:
            merged.append(strategic_merge_patch({}, item))
        else:
            merged[position] = strategic_merge_patch(merged[position], item)
    return merged


def json_patch(target: Mapping[str, Any], operations: Sequence[Any]) -> dict[str, Any]:
    """Apply an RFC 6902 JSON patch; a failed ``test`` raises PatchTestFailed, other faults PatchError."""
    if not all(isinstance(op, Mapping) for op in operations):
        raise PatchError("a JSON patch must be a list of operation objects")
    try:
        result = jsonpatch.apply_patch(copy.deepcopy(dict(target)), list(operations), in_place=False)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise PatchTestFailed(str(exc)) from exc
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise PatchError(str(exc)) from exc
    if not isinstance(result, dict):
        raise PatchError("a JSON patch must leave an object at the document root")
    return result

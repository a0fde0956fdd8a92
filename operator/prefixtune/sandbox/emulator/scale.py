"""The scale subresource of custom resources, as kube-apiserver serves it (``autoscaling/v1`` Scale).

Pure functions over the stored object and the CRD's ``subresources.scale`` paths, following
apiextensions-apiserver's ``pkg/registry/customresource/etcd.go`` (``ScaleREST``,
``scaleFromCustomResource``, ``scaleUpdatedObjectInfo``):

* GET ``.../NAME/scale``: a Scale whose metadata is the resource's (name, namespace, uid,
  resourceVersion, creationTimestamp), ``spec.replicas`` read at ``specReplicasPath`` (absent: 500
  InternalError "the spec replicas field ... does not exist"), ``status.replicas`` at
  ``statusReplicasPath`` (absent: 0), ``status.selector`` at ``labelSelectorPath`` (absent: "").
* PUT or PATCH: the body replaces, or the patch is applied to, that Scale (absent spec replicas
  read as a sentinel that a write must replace: else 400 "cannot be empty"); only its
  ``spec.replicas`` is written back, at ``specReplicasPath`` of the resource; a
  ``metadata.resourceVersion`` in it is the precondition of the resource's update (409 when
  stale). The answer is the Scale of the updated resource. The rest of the Scale (its status, its
  labels) is ignored, as there.

Not emulated, as elsewhere in the emulator: the resource's schema validation on that update (a CRD's
minimum or CEL rule on replicas rejects a scale on the real server, 422) and managedFields.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefixtune.sandbox.emulator.errors import api_error

SCALE_API_VERSION = "autoscaling/v1"
_META_FIELDS = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
# What the real server's sentinel (the smallest int32) stands for: no spec replicas before the write.
_UNSET = -2147483648
_INT32 = (-(2**31), 2**31 - 1)


@dataclass(frozen=True)
class ScalePaths:
    """A CRD version's ``subresources.scale``: where the replicas and the selector live."""

    spec_replicas: str
    status_replicas: str
    label_selector: str = ""

    @classmethod
    def from_crd(cls, scale: Mapping[str, Any]) -> ScalePaths:
        spec, status = scale.get("specReplicasPath"), scale.get("statusReplicasPath")
        selector = scale.get("labelSelectorPath") or ""
        problems = [
            f"spec.versions[].subresources.scale.{name}: Invalid value: {value!r}: {why}"
            for name, value, root, why in (
                ("specReplicasPath", spec, ".spec.", "should be a json path under .spec"),
                ("statusReplicasPath", status, ".status.", "should be a json path under .status"),
            )
            if not isinstance(value, str) or not value.startswith(root) or "[" in value
        ]
        if selector and (
            not isinstance(selector, str)
            or not selector.startswith((".spec.", ".status."))
            or "[" in selector
        ):
            problems.append(
                f"spec.versions[].subresources.scale.labelSelectorPath: Invalid value: {selector!r}: "
                "should be a json path under either .spec or .status"
            )
        if problems:
            raise api_error(422, "; ".join(problems))
        assert isinstance(spec, str) and isinstance(status, str)
        return cls(spec, status, str(selector))


def _split(path: str) -> list[str]:
    return path.removeprefix(".").split(".")


def _nested(obj: Mapping[str, Any], path: str) -> tuple[Any, bool]:
    """(value, found) at a dotted path; a non-object on the way is not found (as NestedFieldNoCopy)."""
    here: Any = obj
    for part in _split(path):
        if not isinstance(here, Mapping) or part not in here:
            return None, False
        here = here[part]
    return here, True


def _int_at(obj: Mapping[str, Any], path: str) -> tuple[int, bool]:
    value, found = _nested(obj, path)
    if not found:
        return 0, False
    if isinstance(value, bool) or not isinstance(value, int):
        raise api_error(
            500, f"{path} accessor error: {value!r} is of the type {type(value).__name__}, expected int64"
        )
    return value, True


def _scale(obj: Mapping[str, Any], paths: ScalePaths) -> tuple[dict[str, Any], bool]:
    """The Scale of ``obj``, and whether its spec replicas exist (``scaleFromCustomResource``)."""
    spec_replicas, found = _int_at(obj, paths.spec_replicas)
    status_replicas, _ = _int_at(obj, paths.status_replicas)
    selector = ""
    if paths.label_selector:
        value, present = _nested(obj, paths.label_selector)
        if present and not isinstance(value, str):
            raise api_error(
                500, f"{paths.label_selector} accessor error: {value!r} is of the type "
                f"{type(value).__name__}, expected string",
            )  # fmt: skip
        selector = value if isinstance(value, str) else ""
    meta = obj.get("metadata") or {}
    scale = {
        "apiVersion": SCALE_API_VERSION,
        "kind": "Scale",
        "metadata": {k: meta[k] for k in _META_FIELDS if k in meta},
        "spec": {"replicas": spec_replicas},
        "status": {"replicas": status_replicas, **({"selector": selector} if selector else {})},
    }
    return scale, found


def scale_of(obj: Mapping[str, Any], paths: ScalePaths) -> dict[str, Any]:
    """GET ``.../scale``: the Scale of the stored resource."""
    scale, found = _scale(obj, paths)
    if not found:
        raise api_error(500, f"the spec replicas field {paths.spec_replicas!r} does not exist")
    return scale


def old_scale(obj: Mapping[str, Any], paths: ScalePaths) -> dict[str, Any]:
    """The Scale a PUT replaces or a PATCH applies to (absent spec replicas: the sentinel)."""
    scale, found = _scale(obj, paths)
    if not found:
        scale["spec"]["replicas"] = _UNSET
    return scale


def with_scale(obj: Mapping[str, Any], paths: ScalePaths, scale: Any) -> dict[str, Any]:
    """The resource after a write of ``scale`` to its scale subresource: ``spec.replicas`` set at
    the spec replicas path, the Scale's resourceVersion (if any) as the update's precondition."""
    if not isinstance(scale, Mapping):
        raise api_error(400, "the Scale must be a JSON object")
    if scale.get("kind") not in (None, "Scale") or scale.get("apiVersion") not in (None, SCALE_API_VERSION):
        raise api_error(
            400, f"wrong object passed to Scale update: {scale.get('apiVersion')}, Kind={scale.get('kind')}"
        )
    spec = scale.get("spec")
    replicas = spec.get("replicas", 0) if isinstance(spec, Mapping) else 0
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not _INT32[0] <= replicas <= _INT32[1]:
        raise api_error(400, f"Scale.spec.replicas: {replicas!r} is not an int32")
    if replicas == _UNSET:
        raise api_error(400, f"the spec replicas field {paths.spec_replicas!r} cannot be empty")
    new = copy.deepcopy(dict(obj))
    here = new
    parts = _split(paths.spec_replicas)
    for part in parts[:-1]:
        child = here.get(part)
        if not isinstance(child, dict):
            if child is not None:
                raise api_error(500, f"value cannot be set because {paths.spec_replicas} is not an object")
            child = here[part] = {}
        here = child
    here[parts[-1]] = replicas
    meta = scale.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    new["metadata"] = dict(new.get("metadata") or {})
    if version:
        new["metadata"]["resourceVersion"] = str(version)
    else:
        new["metadata"].pop("resourceVersion", None)
    return new


__all__ = ["SCALE_API_VERSION", "ScalePaths", "old_scale", "scale_of", "with_scale"]

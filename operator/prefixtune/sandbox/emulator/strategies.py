"""What kube-apiserver's registry strategies set on a new object's status (``PrepareForCreate``).

A built-in object's ``status`` is a Go struct, never a pointer, so the real server always returns it,
empty on create: a fresh Deployment reads ``"status": {}`` (kubernetes ``pkg/registry/apps/deployment/
strategy.go``: ``deployment.Status = apps.DeploymentStatus{}``), and so do the other built-in kinds
with a status subresource. Two strategies set more:

* Pods (``pkg/registry/core/pod/strategy.go``): ``phase: Pending`` and the ``qosClass``
  (``pkg/apis/core/helper/qos``: BestEffort without CPU or memory requests and limits, Guaranteed
  when every container limits both and requests what it limits, Burstable otherwise; quantities are
  compared as written, not normalised).
* Namespaces (``pkg/registry/core/namespace/strategy.go``): ``phase: Active``, and the
  ``kubernetes`` finalizer in ``spec.finalizers``.

A custom resource with a status subresource has no status until one is written (its status is
dropped on create), as on the real server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_QOS_RESOURCES = ("cpu", "memory")


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    found: list[Mapping[str, Any]] = []
    for key in ("initContainers", "containers"):
        value = spec.get(key)
        if isinstance(value, list):
            found.extend(c for c in value if isinstance(c, Mapping))
    return found


def pod_qos_class(pod: Mapping[str, Any]) -> str:
    """The pod's QoS class from its containers' CPU and memory requests and limits."""
    guaranteed, any_set = True, False
    for container in _containers(pod):
        resources = container.get("resources") if isinstance(container.get("resources"), Mapping) else {}
        assert isinstance(resources, Mapping)
        requests = resources.get("requests") if isinstance(resources.get("requests"), Mapping) else {}
        limits = resources.get("limits") if isinstance(resources.get("limits"), Mapping) else {}
        assert isinstance(requests, Mapping) and isinstance(limits, Mapping)
        for name in _QOS_RESOURCES:
            if name in requests or name in limits:
                any_set = True
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def initial_status(group: str, plural: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The status a built-in object with a status subresource gets on create."""
    if (group, plural) == ("", "pods"):
        return {"phase": "Pending", "qosClass": pod_qos_class(obj)}
    if (group, plural) == ("", "namespaces"):
        return {"phase": "Active"}
    return {}

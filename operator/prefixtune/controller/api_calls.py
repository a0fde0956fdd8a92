"""Every Kubernetes API call the operator makes: (group, resource, verbs). One list, kept by hand.

The Helm chart's RBAC rules are tested against this list, and each call site in the controller
names its entry, so a new call without an RBAC rule fails the chart test instead of a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ApiCall:
    group: str  # "" is the core group
    resource: str  # plural, with "/status" for a subresource
    verbs: tuple[str, ...]
    why: str


API_CALLS: tuple[ApiCall, ...] = (
    # The custom resource: kopf lists and watches it, the controller reads it and writes its status.
    ApiCall("prefixtune.io", "servingdeployments", ("get", "list", "watch", "patch"),
            "kopf watches ServingDeployments; the timer re-reads one; kopf patches its progress annotations"),
    ApiCall("prefixtune.io", "servingdeployments/status", ("get", "patch"),
            "the one status patch per reconcile"),
    # Children.
    ApiCall("apps", "deployments", ("get", "list", "watch", "create", "patch", "delete"),
            "the engine Deployment and the canary Deployment (deleted after a trial)"),
    ApiCall("", "services", ("get", "list", "create", "patch"), "the Service in front of the engine pods"),
    ApiCall("", "configmaps", ("get", "list", "create", "patch", "delete"), "TensorRT-LLM option files"),
    ApiCall("", "pods", ("get", "list", "watch"), "readiness, restarts, crash loops and pod IPs to scrape"),
    ApiCall("monitoring.coreos.com", "servicemonitors", ("get", "create", "patch"),
            "a ServiceMonitor when the prometheus-operator CRD is installed"),
    ApiCall("apiextensions.k8s.io", "customresourcedefinitions", ("get", "list", "watch"),
            "discovery of the monitoring CRD; kopf scans CRDs"),
    # Events (kopf's poster and the controller's decisions).
    ApiCall("", "events", ("create", "patch"), "an Event for every decision, with its evidence"),
    ApiCall("events.k8s.io", "events", ("create", "patch"), "newer Events API (same Events)"),
    # kopf's own needs: namespaces for --all-namespaces scanning, peering for HA.
    ApiCall("", "namespaces", ("get", "list", "watch"), "kopf scans namespaces"),
    ApiCall("kopf.dev", "clusterkopfpeerings", ("get", "list", "watch", "patch"),
            "peering (--all-namespaces)"),
    ApiCall("kopf.dev", "kopfpeerings", ("get", "list", "watch", "patch"), "peering (--namespace)"),
)  # fmt: skip


def verbs_for(group: str, resource: str) -> frozenset[str]:
    return frozenset(v for c in API_CALLS if c.group == group and c.resource == resource for v in c.verbs)


def require(group: str, resource: str, verb: str) -> None:
    """Assert that a call site is listed (cheap; used in the client wrappers and tests)."""
    if verb not in verbs_for(group, resource):
        raise AssertionError(
            f"API call {verb} {group or 'core'}/{resource} is not listed in api_calls.API_CALLS"
        )

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
    # "operator": the controller's own calls (require() guards each); "kopf"; "grant": not called,
    # held so that the operator may grant it to the router's Role (RBAC's escalation check)
    by: str = "operator"


# Exactly the calls made (issue #17): the operator's are recorded through the sandbox by a test
# (tests/packaging/test_packaging_chart.py: the recorded calls equal the "operator" entries); kopf's
# are what kopf 1.x documents and calls (watching, progress annotations, Events, peering, scanning).
API_CALLS: tuple[ApiCall, ...] = (
    # The custom resource: the controller re-reads one and writes its status; kopf watches it and
    # patches its progress annotations.
    ApiCall("prefixtune.io", "servingdeployments", ("get",), "the reconcile re-reads the resource"),
    ApiCall("prefixtune.io", "servingdeployments", ("list", "watch", "patch"),
            "kopf watches ServingDeployments and patches its progress annotations", "kopf"),
    ApiCall("prefixtune.io", "servingdeployments/status", ("patch",), "the one status patch per reconcile"),
    # Children (each patched or deleted only when controlled by the resource's uid).
    ApiCall("apps", "deployments", ("get", "create", "patch", "delete"),
            "the engine Deployment and the canary Deployment (deleted after a trial)"),
    ApiCall("apps", "deployments", ("list",), "each reconcile reads its Deployments by their resource label"),
    ApiCall("", "services", ("get", "create", "patch"), "the Service in front of the engine pods"),
    ApiCall("", "services", ("delete",), "the engines' own Service when the router goes"),
    # The router in front of the engines (spec.routing): its Deployment (above), its ServiceAccount,
    # and the Role and RoleBinding that let its service discovery get/list/watch pods.
    ApiCall("", "serviceaccounts", ("get", "create", "patch", "delete"), "the router's ServiceAccount"),
    ApiCall("rbac.authorization.k8s.io", "roles", ("get", "create", "patch", "delete"),
            "the router's Role (get/list/watch pods in its namespace)"),
    ApiCall("rbac.authorization.k8s.io", "rolebindings", ("get", "create", "patch", "delete"),
            "the router's RoleBinding to its ServiceAccount"),
    ApiCall("", "pods", ("get",),
            "held to grant it: RBAC lets the operator create the router's Role (get/list/watch pods) only "
            "with every rule it grants, as it holds no escalate or bind", "grant"),
    ApiCall("", "configmaps", ("get", "create", "patch", "delete"), "TensorRT-LLM option files"),
    ApiCall("", "pods", ("list",), "readiness, restarts, crash loops and pod IPs to scrape"),
    ApiCall("apps", "deployments", ("list", "watch"),
            "kopf indexes the operator's own Deployments (by its managed-by label) for the ticks", "kopf"),
    ApiCall("", "pods", ("list", "watch"),
            "kopf indexes the operator's own pods (by its managed-by label) for the ticks", "kopf"),
    ApiCall("monitoring.coreos.com", "servicemonitors", ("get", "create", "patch"),
            "a ServiceMonitor when the prometheus-operator CRD is installed"),
    ApiCall("apiextensions.k8s.io", "customresourcedefinitions", ("get",),
            "discovery of the ServiceMonitor CRD"),
    ApiCall("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch"), "kopf scans CRDs",
            "kopf"),
    # Events (the controller's decisions; kopf's poster for handler failures).
    ApiCall("", "events", ("create",), "an Event for every decision, with its evidence"),
    ApiCall("", "events", ("create",), "kopf posts handler failures as Events", "kopf"),
    # kopf's own needs: namespaces for --namespace scanning, peering for HA.
    ApiCall("", "namespaces", ("list", "watch"), "kopf follows the watched namespaces", "kopf"),
    ApiCall("kopf.dev", "clusterkopfpeerings", ("get", "list", "watch", "patch"),
            "peering (--all-namespaces)", "kopf"),
    ApiCall("kopf.dev", "kopfpeerings", ("get", "list", "watch", "patch"), "peering (--namespace)", "kopf"),
)  # fmt: skip


def verbs_for(group: str, resource: str) -> frozenset[str]:
    return frozenset(v for c in API_CALLS if c.group == group and c.resource == resource for v in c.verbs)


def require(group: str, resource: str, verb: str) -> None:
    """Assert that a call site is listed (cheap; used in the client wrappers and tests)."""
    if verb not in verbs_for(group, resource):
        raise AssertionError(
            f"API call {verb} {group or 'core'}/{resource} is not listed in api_calls.API_CALLS"
        )

"""Reading ServingDeployments and their Events from the cluster (the I/O edge of status and report).

Uses the ``kubernetes`` client with the current (or a given) kubeconfig. Every failure becomes a
``ClusterError`` whose message says what to do: no kubeconfig, API server unreachable, CRD not
installed, resource not found.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from prefixtune.api.models import API_GROUP, API_VERSION, KIND, PLURAL

REQUEST_TIMEOUT_S = 10.0


class ClusterError(Exception):
    """The cluster could not answer; the message is meant for the user."""


def _clients(kubeconfig: str | None) -> tuple[Any, Any]:
    from kubernetes import client, config

    try:
        api_client = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError, TypeError, ValueError) as exc:
        where = kubeconfig or "the default kubeconfig (KUBECONFIG or ~/.kube/config)"
        raise ClusterError(
            f"no cluster: cannot load {where}: {exc}. Pass --kubeconfig FILE "
            "(e.g. the sandbox's, from 'prefixtune sandbox')"
        ) from exc
    api_client.configuration.retries = 0
    return client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)


def _call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        response = fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)
        return json.loads(response.data)
    except ApiException as exc:
        if exc.status == 404:
            raise ClusterError(f"{what}: not found (404)") from exc
        if exc.status == 409:
            raise ClusterError(
                f"{what}: changed by someone else meanwhile (409 Conflict); run it again"
            ) from exc
        if exc.status == 422:
            raise ClusterError(f"{what}: the API server refused the change (422): {_message(exc)}") from exc
        if exc.status in (401, 403):
            raise ClusterError(f"{what}: access denied ({exc.status} {exc.reason})") from exc
        raise ClusterError(f"{what}: the API server answered {exc.status} {exc.reason}") from exc
    except (HTTPError, OSError) as exc:
        raise ClusterError(f"{what}: cannot reach the API server: {exc}") from exc
    except ValueError as exc:
        raise ClusterError(f"{what}: the API server sent something that is not JSON: {exc}") from exc


MAX_MESSAGE = 300  # characters of an API server's refusal shown to the user


def _message(exc: Any) -> str:
    """The ``message`` of a Kubernetes Status in an error's body, bounded and printable."""
    try:
        text = str(json.loads(exc.body or "{}").get("message") or "")
    except (ValueError, AttributeError):
        text = ""
    text = "".join(c if c.isprintable() else " " for c in text)
    return (text[:MAX_MESSAGE] + " ...") if len(text) > MAX_MESSAGE else text or str(exc.reason)


def patch_deployment(
    namespace: str, name: str, patch: Mapping[str, Any], kubeconfig: str | None = None
) -> dict[str, Any]:
    """A JSON merge patch of a ServingDeployment (its spec or metadata; a ``resourceVersion`` in the
    patch makes it conditional: 409 when the resource changed since it was read)."""
    custom, _ = _clients(kubeconfig)
    body = _call(
        f"ServingDeployment {namespace}/{name}",
        custom.patch_namespaced_custom_object,
        API_GROUP,
        API_VERSION,
        namespace,
        PLURAL,
        name,
        dict(patch),
        _content_type="application/merge-patch+json",
    )
    return dict(body)


def get_deployment(namespace: str, name: str, kubeconfig: str | None = None) -> dict[str, Any]:
    custom, _ = _clients(kubeconfig)
    try:
        body = _call(
            f"ServingDeployment {namespace}/{name}",
            custom.get_namespaced_custom_object,
            API_GROUP,
            API_VERSION,
            namespace,
            PLURAL,
            name,
        )
    except ClusterError as exc:
        if "not found" in str(exc):
            raise ClusterError(
                f"ServingDeployment {namespace}/{name} not found (is the name and namespace right? "
                f"list them with 'prefixtune status -n {namespace}'; is the CRD installed?)"
            ) from exc
        raise
    return dict(body)


def list_deployments(namespace: str | None, kubeconfig: str | None = None) -> list[dict[str, Any]]:
    custom, _ = _clients(kubeconfig)
    what = f"ServingDeployments in {namespace or 'all namespaces'}"
    try:
        if namespace is None:
            body = _call(what, custom.list_cluster_custom_object, API_GROUP, API_VERSION, PLURAL)
        else:
            body = _call(
                what, custom.list_namespaced_custom_object, API_GROUP, API_VERSION, namespace, PLURAL
            )
    except ClusterError as exc:
        if "not found" in str(exc):
            raise ClusterError(
                f"{what}: the API server does not know {PLURAL}.{API_GROUP}; install the CRD "
                "('prefixtune crd | kubectl apply -f -')"
            ) from exc
        raise
    return [dict(item) for item in body.get("items") or []]


def list_events(namespace: str, name: str, kubeconfig: str | None = None) -> list[dict[str, Any]]:
    """Events whose involvedObject is the ServingDeployment, oldest first."""
    _, core = _clients(kubeconfig)
    body = _call(f"Events of {namespace}/{name}", core.list_namespaced_event, namespace)
    return events_of(body.get("items") or [], namespace, name)


def events_of(items: Iterable[Mapping[str, Any]], namespace: str, name: str) -> list[dict[str, Any]]:
    """The Events among ``items`` whose involvedObject is this ServingDeployment, oldest first."""
    return sort_events(
        [
            dict(e)
            for e in items
            if (e.get("involvedObject") or {}).get("name") == name
            and (e.get("involvedObject") or {}).get("kind", KIND) == KIND
            and (e.get("involvedObject") or {}).get("namespace", namespace) == namespace
        ]
    )


def event_time(event: dict[str, Any]) -> str:
    meta = event.get("metadata") or {}
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or meta.get("creationTimestamp")
        or ""
    )


def sort_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(events, key=event_time)

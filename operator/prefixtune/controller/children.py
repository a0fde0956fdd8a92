"""The children a reconcile reads, from kopf's watch-fed indexes instead of the API server.

With N resources a tick every ``tick_s`` reads 2N lists a tick if it asks the API server (each a
scan of the namespace's Deployments or pods on the server's side); at N = 500 and the default
5 s tick that is 200 lists a second, all of them answering "nothing changed". Instead, as
controllers do with informers, kopf watches the operator's own Deployments and pods (by its
``managed-by`` label) and keeps them in two indexes keyed by (namespace, resource name); a tick
reads those. kopf populates its indexes from its first listing before any handler or daemon runs
(kopf 1.45 ``queueing.watcher``: ``operator_indexed``), so a tick never sees a half-filled index.

A watch lags the writes: right after an ensure wrote a Deployment, its index entry may still be
the version before. A read of an index entry older than a write of this process would look like
drift (owned fields changed by someone else) and invalidate a trial, so each Deployment the
operator wrote is read from the API server until the index holds the version that read returned
(``Freshness``): a couple of GETs after each write, none at rest. Pods are not written by the
operator; their index entries are as recent as the watch.

An ensure of the children (at least every ``ENSURE_EVERY_S``) reads the Deployments it renders from
the same view (``Children.known``) instead of a GET each (at N = 500, 48 GETs a second, nearly half
of the operator's API requests): the labeled index holds the resource's own, and a third index, of
every Deployment's name in the watched namespaces (kopf watches them all and filters by label on
its side), tells "no Deployment of that name" from "one without our labels" (read from the API
server then, and reported as someone else's, as before).

Without indexes (a reconcile called outside kopf: tests, the reliability harness) the children are
read from the API server as before.

An index entry is the operator's own copy, made once per watch event, and a tick reads it as it is,
typed read-only: copying every pod and Deployment on every tick instead cost ~8% of the operator's
CPU at N = 500 (``bench scale``), for objects that change far less often than they are read. A
Deployment's entry is the object (``index_entry``: an ensure compares its owned fields); a pod's is
what the operator reads of it (``pod_entry``: ``observe.PodView``), a few hundred bytes instead of
the whole pod, held for every pod of every resource.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prefixtune.controller.observe import PodView, pod_view
from prefixtune.controller.render import LABEL_MANAGED_BY, LABEL_RESOURCE, MANAGER

DEPLOYMENTS_INDEX = "prefixtune_deployments"  # kopf passes an index as a kwarg of this name
PODS_INDEX = "prefixtune_pods"
NAMES_INDEX = "prefixtune_deployment_names"  # every Deployment's (namespace, name), labeled or not
WATCH_LABELS = {LABEL_MANAGED_BY: MANAGER}

IndexKey = tuple[str, str]  # (namespace, the resource's name): LABEL_RESOURCE of the child
ABSENT = ""  # Freshness: the API server said the object does not exist


class IndexView(Protocol):
    """What kopf passes for an index (``kopf.Index``): a mapping of keys to stores of values."""

    def get(self, key: IndexKey, default: Any = None) -> Any: ...


def index_entry(
    namespace: str | None, labels: Mapping[str, str], body: Mapping[str, Any]
) -> dict[IndexKey, Any]:
    """A kopf index function's result for one child: keyed by its resource's name; nothing for an
    object with the managed-by label and no resource label (not one of a resource's children)."""
    owner = labels.get(LABEL_RESOURCE)
    if not owner or namespace is None:
        return {}
    return {
        (namespace, owner): {
            k: copy.deepcopy(body[k])
            for k in ("apiVersion", "kind", "metadata", "spec", "status")
            if k in body
        }
    }


def pod_entry(
    namespace: str | None, labels: Mapping[str, str], body: Mapping[str, Any]
) -> dict[IndexKey, Any]:
    """A kopf index function's result for one of the operator's pods: its ``PodView``, keyed by its
    resource (nothing for a pod with no resource label)."""
    owner = labels.get(LABEL_RESOURCE)
    if not owner or namespace is None:
        return {}
    return {(namespace, owner): pod_view(body)}


def name_entry(namespace: str | None, name: str | None) -> dict[IndexKey, bool]:
    """A kopf index function's result for any Deployment: its (namespace, name)."""
    return {} if namespace is None or name is None else {(namespace, name): True}


def _version(obj: Mapping[str, Any] | None) -> str:
    return ABSENT if obj is None else str((obj.get("metadata") or {}).get("resourceVersion") or "")


@dataclass
class Freshness:
    """Deployments this process wrote, by (namespace, name), with the version the API server last
    returned for each (``ABSENT``: deleted; None: not read since the write). The index entry of
    such a Deployment is used again once it holds that version."""

    pending: dict[tuple[str, str], str | None] = field(default_factory=dict)

    def wrote(self, namespace: str, name: str) -> None:
        self.pending[(namespace, name)] = None

    def stale(self, namespace: str, name: str, indexed: Mapping[str, Any] | None) -> bool:
        """Whether the index entry (None: not indexed) must not be used: a write of this process is
        not known to be in it. An entry at the version last read is: the write is no longer pending."""
        key = (namespace, name)
        if key not in self.pending:
            return False
        seen = self.pending[key]
        if seen is not None and seen == _version(indexed):
            del self.pending[key]
            return False
        return True

    def read(self, namespace: str, name: str, got: Mapping[str, Any] | None) -> None:
        """What the API server returned for a pending Deployment: the version the index must reach."""
        if (namespace, name) in self.pending:
            self.pending[(namespace, name)] = _version(got)

    def forget(self, namespace: str, names: Iterable[str]) -> None:
        for name in names:
            self.pending.pop((namespace, name), None)


@dataclass(frozen=True)
class Indexes:
    """kopf's indexes of the operator's children, as one reconcile reads them (``names``: every
    Deployment's name; None when the registry has no such index)."""

    deployments: IndexView
    pods: IndexView
    names: IndexView | None = None

    def exists(self, namespace: str, name: str) -> bool | None:
        """Whether a Deployment of this name exists, labeled or not (None: not known here)."""
        return None if self.names is None else bool(self.names.get((namespace, name)))

    def deployments_of(self, namespace: str, owner: str) -> dict[str, Mapping[str, Any]]:
        """The resource's indexed Deployments by name (the index's own entries: read, never write)."""
        return {str(d["metadata"]["name"]): d for d in self.deployments.get((namespace, owner)) or ()}

    def pods_of(self, namespace: str, owner: str) -> list[PodView]:
        return list(self.pods.get((namespace, owner)) or ())


def indexes_from(kwargs: Mapping[str, Any]) -> Indexes | None:
    """The indexes among a kopf handler's kwargs (None when the registry has none)."""
    deployments, pods = kwargs.get(DEPLOYMENTS_INDEX), kwargs.get(PODS_INDEX)
    if deployments is None or pods is None:
        return None
    return Indexes(deployments, pods, kwargs.get(NAMES_INDEX))

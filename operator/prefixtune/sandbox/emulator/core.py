"""The emulator's shared state and lookups: what its parts (store, watch, CRDs, GC, discovery) build on.

``EmulatorCore`` holds the fields every part reads (the seed, the faults, the resourceVersion
counter) and the lookups over kmock's object store; each part is a mixin over it (``store.py``
combines them into ``RealisticEmulator``).
"""

from __future__ import annotations

import datetime
import functools
import itertools
import random
import uuid
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import kmock
from kmock._internal import k8s_dicts, rendering

from prefixtune.sandbox import _selectors
from prefixtune.sandbox.emulator.errors import api_error, not_found
from prefixtune.sandbox.emulator.logs import PodLogSource
from prefixtune.sandbox.emulator.scale import ScalePaths
from prefixtune.sandbox.faults import ApiFaults

NAMESPACES = kmock.resource("", "v1", "namespaces")
ALL_VERBS = frozenset({"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"})


def _load_bundled(resources: kmock.ResourcesArray) -> None:
    with warnings.catch_warnings():  # kmock 0.8 uses the deprecated importlib.resources.read_binary
        warnings.simplefilter("ignore", DeprecationWarning)
        resources.load_bundled()


@functools.cache
def builtin_groups() -> frozenset[str]:
    """API groups of the bundled built-in resources (strategic merge patch is allowed only there)."""
    bundled = kmock.ResourcesArray()
    _load_bundled(bundled)
    return frozenset(str(res.group) for res in bundled)


def api_version(res: kmock.resource) -> str:
    return f"{res.version}" if not res.group else f"{res.group}/{res.version}"


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _content(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Everything that counts as a spec change for ``generation``: all but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


_Key = tuple[kmock.resource, str | None, str]
_Kind = tuple[str | None, str | None, str | None]  # a resource's (group, version, plural): its equality


def _kind(res: kmock.resource) -> _Kind:
    return (res.group, res.version, res.plural)


@attrs.define(kw_only=True)
class EmulatorCore(kmock.KubernetesEmulator):
    """kmock's emulator with the state and the lookups shared by the parts of ``RealisticEmulator``."""

    seed: int = 0  # names from generateName and uids are drawn from this seed
    builtins: bool = True  # declare kmock's bundled built-in resources (core, apps, events, CRDs...)
    namespaces: tuple[str, ...] = ("default", "kube-system", "kube-public")  # pre-created with builtins
    faults: ApiFaults | None = None  # fault injection for the clients under test (off by default)
    pod_logs: PodLogSource | None = None  # where pods/log reads containers' logs (the sandbox kubelet)
    # A mutating admission step, as a webhook would be: every created or updated object (not its
    # status) passes through it before it is validated and stored (the sandbox's --demo-timings).
    admission: Callable[[kmock.resource, dict[str, Any]], dict[str, Any]] | None = None
    _rv: int = attrs.field(default=0, init=False)
    # The scale subresource's paths of each custom resource whose CRD declares it (crds.py).
    _scales: dict[kmock.resource, ScalePaths] = attrs.field(factory=dict, init=False)
    _rng: random.Random = attrs.field(factory=random.Random, init=False)
    # The keys of kmock's store by resource and namespace, in the store's order, so that a list or a
    # watch's initial listing reads only its own kind (``_scan``) and not every object of every kind
    # (``bench scale``: thousands of Events, pods, ReplicaSets beside the Deployments listed).
    _by_kind: dict[_Kind, dict[str | None, dict[_Key, None]]] = attrs.field(factory=dict, init=False)
    _indexed: int = attrs.field(default=0, init=False)

    @property
    def resource_version(self) -> int:
        """The current value of the global resourceVersion counter."""
        return self._rv

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _stamp(self, res: kmock.resource, obj: dict[str, Any]) -> dict[str, Any]:
        """Server metadata of a new object stored without a request (the pre-created namespaces)."""
        obj["metadata"].update(
            uid=str(uuid.UUID(int=self._rng.getrandbits(128), version=4)),
            creationTimestamp=_now(),
            generation=1,
            resourceVersion=str(self._next_rv()),
        )
        obj.setdefault("apiVersion", api_version(res))
        obj.setdefault("kind", self._info(res).kind)
        return obj

    def _info(self, res: kmock.resource) -> kmock.ResourceInfo:
        if res in self.resources:
            return self.resources[res]
        if any(known == res for known in self._get_resources()):
            return kmock.ResourceInfo()
        raise api_error(
            404, f"the server could not find the requested resource ({api_version(res)}, {res.plural})"
        )

    def _key(
        self, res: kmock.resource, info: kmock.ResourceInfo, url_namespace: str | None, name: str
    ) -> _Key:
        if info.namespaced is False and url_namespace is not None:
            raise not_found(res, name)
        return (res, url_namespace, name)

    def _live(self, key: _Key) -> dict[str, Any] | None:
        if key not in self._objects:
            return None
        stored: k8s_dicts.Object = self._objects[key]
        return None if stored.deleted else stored.raw

    def _record(self, key: _Key, version: dict[str, Any]) -> None:
        """Store ``version`` as the object's current one (its last is all the API server serves).
        kmock keeps every version ever written under the key (its ``history``, for tests'
        assertions); kept, it grew by every status write of a fleet (``bench scale`` at N = 500:
        some 30,000 versions a minute), and the collector's pauses with it."""
        self._objects[key].history.append(version)
        self._keep_last(key)

    def _keep_last(self, key: _Key) -> None:
        """Drop every version of the object but its last (a deletion's marker, when deleted)."""
        history = self._objects[key].history
        if len(history) > 1:
            del history[:-1]

    def _store(self) -> dict[_Key, k8s_dicts.Object]:
        """kmock's own dict behind ``ObjectsArray`` (a private internal: kmock 0.8 is pinned)."""
        store: dict[_Key, k8s_dicts.Object] = self._objects._objects
        return store

    def _index(self) -> dict[_Kind, dict[str | None, dict[_Key, None]]]:
        """``_by_kind``, brought up to date. Keys are only ever added to the store (a delete keeps the
        object's history under its key), in order, so the new ones are the last; a store that shrank
        (a hard delete) is indexed again from scratch."""
        store = self._store()
        if len(store) < self._indexed:
            self._by_kind, self._indexed = {}, 0
        new = len(store) - self._indexed
        if new:
            for key in reversed(list(itertools.islice(reversed(store), new))):
                self._by_kind.setdefault(_kind(key[0]), {}).setdefault(key[1], {})[key] = None
            self._indexed = len(store)
        return self._by_kind

    def _scan(self, request: rendering.Request) -> list[tuple[_Key, dict[str, Any]]]:
        """Live objects of the request's resource, namespace and name, ordered as etcd keys are."""
        assert request.resource is not None
        store = self._store()
        by_namespace = self._index().get(_kind(request.resource), {})
        spaces = (
            by_namespace.values() if request.namespace is None else [by_namespace.get(request.namespace, {})]
        )
        found = [
            (key, stored.raw)
            for keys in spaces
            for key in keys
            if (request.name is None or key[2] == request.name) and not (stored := store[key]).deleted
        ]
        return sorted(found, key=lambda item: (item[0][1] or "", item[0][2]))

    @staticmethod
    def _selector(request: rendering.Request) -> _selectors.ObjectFilter:
        try:
            return _selectors.build_selector(
                request.params.get("labelSelector"), request.params.get("fieldSelector")
            )
        except _selectors.SelectorError as exc:
            raise api_error(400, str(exc)) from exc

    @staticmethod
    def _body_object(request: rendering.Request) -> dict[str, Any]:
        if not isinstance(request.data, Mapping):
            raise api_error(400, "the request body must be a JSON object")
        return dict(request.data)

    def _check_subresource(
        self, res: kmock.resource, info: kmock.ResourceInfo, subresource: str | None
    ) -> None:
        if subresource is None:
            return
        if subresource == "scale" and "scale" in info.subresources and res in self._scales:
            return
        if subresource != "status" or "status" not in info.subresources:
            raise api_error(
                404,
                f"the subresource {subresource!r} of {res.plural} is not served (emulated: status, and "
                "scale where a CRD declares it)",
            )

    if TYPE_CHECKING:  # the writes the other parts call, declared for the type checker only

        async def _update(  # store.py
            self,
            res: kmock.resource,
            key: _Key,
            current: dict[str, Any],
            new: Any,
            subresource: str | None,
            dry: bool,
        ) -> dict[str, Any]: ...

        async def _remove(  # store.py
            self, res: kmock.resource, key: _Key, final: dict[str, Any], orphan: bool = False
        ) -> dict[str, Any]: ...

        async def _emit(  # watch.py
            self, res: kmock.resource, kind: str, obj: dict[str, Any], old: dict[str, Any] | None
        ) -> None: ...

"""A Kubernetes API server emulator that behaves like kube-apiserver where operators depend on it.

``RealisticEmulator`` extends kmock 0.8's ``KubernetesEmulator`` (an in-memory object store over HTTP)
with the server-side behaviour that kopf, the official ``kubernetes`` client and kubectl rely on:

* Server metadata on create: ``uid``, ``creationTimestamp``, ``generation`` 1, a ``resourceVersion``
  from one global counter, ``metadata.namespace`` from the URL, names from ``generateName``; names
  are validated (DNS-1123 subdomains); 404 for undeclared resources; ``status`` is dropped on create
  when the resource has a status subresource.
* Writes: every write bumps the resourceVersion (a no-op write changes nothing, as on the real
  server); a stale ``metadata.resourceVersion`` in a merge patch, strategic merge patch or PUT body
  gives 409 Conflict; a failed JSON-patch ``test`` gives 422 Invalid; ``generation`` increments only
  when something outside ``metadata`` and ``status`` changes; the status subresource is isolated from
  the main resource in both directions; finalizers delay deletion (``deletionTimestamp``), and no new
  finalizer can be added to a terminating object.
* PATCH flavours (see ``_patches``): merge patch, strategic merge patch (named lists merged by key;
  415 for custom resources, as on the real server), JSON patch; PUT replace; ``dryRun=All``.
* Lists and watches: label and field selectors, ``kind``/``apiVersion`` and the real resourceVersion
  on lists; watches honour ``timeoutSeconds``, ``resourceVersion`` (events after it are replayed from
  a bounded log, nothing older; too old gives an ERROR 410 Expired event), ``sendInitialEvents`` (ends
  with the ``k8s.io/initial-events-end`` BOOKMARK), send ``Content-Type: application/json``, subscribe
  atomically with their snapshot, and turn selector transitions into ADDED/DELETED as the server does.
* CRDs: creating or replacing a CustomResourceDefinition validates its names, registers its served
  versions in discovery (kind, plural, singular, shortNames, categories, scope, status/scale
  subresources) and sets the ``NamesAccepted`` and ``Established`` conditions; deleting it removes the
  resource from discovery and deletes its objects.
* Discovery fixes: ``/api/v1`` says groupVersion ``v1``, ``/version/`` is served, subresources are
  listed like the real server does, the preferred version of a group is its highest-priority version.
* Errors are canonical ``Status`` objects: reasons NotFound, AlreadyExists, Conflict, Invalid,
  BadRequest, MethodNotAllowed, UnsupportedMediaType, Expired, InternalError, with code and details.
* Garbage collection: when an owner is really deleted, its dependents (``ownerReferences[].uid``) are
  deleted in the background, transitively; dependents that still have a live owner only lose the
  dangling reference; ``propagationPolicy: Orphan`` strips the references instead.
* Events (core v1 and events.k8s.io) are ordinary objects, so kopf's ``generateName`` events are stored.
* Fault injection (``faults=ApiFaults(...)``, off by default; ``faults.py``): 500/503 answers, 409 on
  status patches and dropped watches for the clients under test (by bearer token), and an audit of
  their requests.

What it does NOT emulate:

* Admission (webhooks, LimitRanges, quotas), authentication and RBAC (every request is allowed).
* Schema validation, pruning and defaulting by the server (no OpenAPI; kubectl needs
  ``--validate=false``), except the name checks above; field selectors accept any dotted path.
* Server-side apply (415), ``kubectl diff``, the scale subresource, protobuf bodies (415),
  pagination (``limit`` is ignored and everything is returned), periodic watch bookmarks.
* Controllers: Deployments never get ReplicaSets, Pods or status; whatever plays the kubelet must
  patch ``/status`` itself. Namespaces are served as objects (``default``, ``kube-system`` and
  ``kube-public`` exist from the start) but are not required for namespaced writes, and deleting one
  cascades nothing.
* Foreground deletion is treated as background; garbage collection timing is immediate, not real.

It relies on kmock **private internals** (``_objects``, ``_lock``, ``_buses``, ``_serve_*``,
``kmock._internal`` modules): the dependency is pinned to ``kmock==0.8`` and the layer is covered by
its own tests, including characterisation tests of the stock emulator.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import datetime
import functools
import logging
import random
import re
import uuid
import warnings
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, overload

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import k8s_dicts, parsing, rendering

from prefixtune.sandbox import _patches, _selectors
from prefixtune.sandbox.faults import ApiFaults, bearer

logger = logging.getLogger(__name__)

CRD_RESOURCE = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
NAMESPACES = kmock.resource("", "v1", "namespaces")
# kmock 0.8's URL parser reads /api/v1/namespaces/<x> as a namespace prefix and fails on the bare
# collection: the collection is routed through a marker name (no namespace can start with a dot).
_NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces(?:/(?P<name>[^/]+)(?:/(?P<sub>status|finalize))?)?/?$")
_NAMESPACE_COLLECTION = ".collection"
ALL_VERBS = frozenset({"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"})
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # the real server's generateName alphabet
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_PATH_SEGMENT_GROUPS = frozenset({"rbac.authorization.k8s.io"})  # names like "system:foo" are valid there
_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
}


class ApiError(kmock.KubernetesError):
    """An error rendered exactly as given: a canonical Kubernetes Status."""


def api_error(code: int, message: str, reason: str | None = None, **details: Any) -> ApiError:
    return ApiError(
        status=code, reason=reason or _REASONS.get(code, "Unknown"), message=message, details=details
    )


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


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes version priority: GA before beta before alpha, then higher numbers first."""
    match = _VERSION.match(version)
    if match is None:
        return (-1, 0, 0)
    stability = {None: 3, "beta": 2, "alpha": 1}[match[2]]
    return (stability, int(match[1]), int(match[3] or 0))


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _content(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Everything that counts as a spec change for ``generation``: all but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


@dataclass(frozen=True)
class _Change:
    """One committed write, as kept in the watch log and put on the resource's bus."""

    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None
    rv: int


_Key = tuple[kmock.resource, str | None, str]


@attrs.define(kw_only=True)
class RealisticEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus the kube-apiserver semantics listed in the module docstring."""

    seed: int = 0  # names from generateName and uids are drawn from this seed
    builtins: bool = True  # declare kmock's bundled built-in resources (core, apps, events, CRDs...)
    watch_log_size: int = 10_000  # events kept per resource for watches that resume from a resourceVersion
    namespaces: tuple[str, ...] = ("default", "kube-system", "kube-public")  # pre-created with builtins
    faults: ApiFaults | None = None  # fault injection for the clients under test (off by default)

    _rv: int = attrs.field(default=0, init=False)
    _rng: random.Random = attrs.field(factory=random.Random, init=False)
    _log: dict[kmock.resource, collections.deque[_Change]] = attrs.field(factory=dict, init=False)
    _log_floor: dict[kmock.resource, int] = attrs.field(factory=dict, init=False)
    _outcomes: dict[int, Any] = attrs.field(factory=dict, init=False)
    _custom: dict[str, set[kmock.resource]] = attrs.field(factory=dict, init=False)  # CRD name -> served
    _gc_tasks: set[asyncio.Task[None]] = attrs.field(factory=set, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._rng.seed(self.seed)
        if self.builtins:
            _load_bundled(self.resources)
            for name in self.namespaces:  # like a fresh cluster; stored before any watcher exists
                namespace = {"metadata": {"name": name}, "spec": {"finalizers": ["kubernetes"]}}
                self._objects[NAMESPACES, None, name] = self._stamp(NAMESPACES, namespace)
                self._objects[NAMESPACES, None, name].last["status"] = {"phase": "Active"}
        self.fallback["get /version/"] << self._serve_server_version
        self.fallback[kmock.method.PUT] << self._serve_outcome

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for task in list(self._gc_tasks):
            task.cancel()
        await asyncio.gather(*self._gc_tasks, return_exceptions=True)
        await super().__aexit__(exc_type, exc_value, traceback)

    # ----------------------------------------------------------------------------------- public helpers

    def declare(
        self,
        resource: str,
        *,
        kind: str,
        namespaced: bool = True,
        status: bool = True,
        shortnames: Iterable[str] = (),
    ) -> kmock.resource:
        """Declare a custom resource: ``declare('example.dev/v1/widgets', kind='Widget')``."""
        res = kmock.resource(resource)
        if not res.group or not res.version or not res.plural:
            raise ValueError(f"resource: need 'group/version/plural', got {resource!r}")
        self.resources[res] = kmock.ResourceInfo(
            kind=kind,
            singular=kind.lower(),
            namespaced=namespaced,
            verbs=ALL_VERBS,
            shortnames=shortnames,
            subresources={"status"} if status else set(),
        )
        self._custom.setdefault(f"{res.plural}.{res.group}", set()).add(res)
        return res

    def register_crd(self, crd: Mapping[str, Any]) -> list[kmock.resource]:
        """Register a CRD's served versions in discovery (without storing the CRD object)."""
        spec, names = self._crd_parts(crd)
        crd_name = f"{names['plural']}.{spec['group']}"
        served: set[kmock.resource] = set()
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            res = kmock.resource(spec["group"], version["name"], names["plural"])
            subresources = set(version.get("subresources") or {}) & {"status", "scale"}
            self.resources[res] = kmock.ResourceInfo(
                kind=names["kind"],
                singular=names.get("singular") or names["kind"].lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                verbs=ALL_VERBS,
                shortnames=names.get("shortNames") or (),
                categories=names.get("categories") or (),
                subresources=subresources,
            )
            served.add(res)
        for gone in self._custom.get(crd_name, set()) - served:
            del self.resources[gone]
        self._custom[crd_name] = served
        return sorted(served, key=lambda r: (str(r.group), str(r.version)))

    async def settle(self) -> None:
        """Wait until the background garbage collection has nothing left to do."""
        while self._gc_tasks:
            await asyncio.gather(*list(self._gc_tasks), return_exceptions=True)

    @property
    def resource_version(self) -> int:
        """The current value of the global resourceVersion counter."""
        return self._rv

    # ------------------------------------------------------------------------------------ dispatching

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw_request.path.rstrip("/") == "/api/v1/namespaces":
            marked = raw_request.rel_url.with_path(f"/api/v1/namespaces/{_NAMESPACE_COLLECTION}").with_query(
                raw_request.rel_url.query
            )
            raw_request = raw_request.clone(rel_url=marked)
        faults = self.faults
        client = bearer(raw_request.headers) if faults is not None else ""
        if faults is None or not client:
            return await super().__call__(raw_request)
        return await self._call_with_faults(faults, client, raw_request)

    async def _call_with_faults(
        self, faults: ApiFaults, client: str, raw_request: aiohttp.web.BaseRequest
    ) -> aiohttp.web.StreamResponse:
        """Serve a request of a client under test: maybe inject a fault, and audit it."""
        method, path = raw_request.method.upper(), raw_request.path
        if raw_request.query.get("watch") in ("true", "1"):
            return await super().__call__(raw_request)  # watch drops: see _watch_stream
        body = await raw_request.read() if method in ("POST", "PATCH", "PUT") else None
        kind, code = faults.decide(client, method, path, watch=False)
        if kind:
            faults.record(client, method, path, code, kind, body)
            message = (
                f'Operation cannot be fulfilled on "{path}": the object has been modified (injected conflict)'
                if code == 409
                else f"injected fault: the server answered {code}"
            )
            reason = {409: "Conflict", 503: "ServiceUnavailable"}.get(code, "InternalError")
            status = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                      "message": message, "reason": reason, "code": code}  # fmt: skip
            return aiohttp.web.json_response(status, status=code)
        response = await super().__call__(raw_request)
        faults.record(client, method, path, int(response.status), "", body)
        return response

    @staticmethod
    def _namespace_request(request: rendering.Request) -> rendering.Request:
        """Re-read /api/v1/namespaces[/<name>[/status]] as the namespaces resource (see _NAMESPACE_PATH)."""
        match = _NAMESPACE_PATH.match(request.url.path)
        if match is None:
            return request
        name = None if match["name"] in (None, _NAMESPACE_COLLECTION) else match["name"]
        path = parsing.ParsedPath("", "v1", "namespaces", None, name, match["sub"])
        action = parsing.guess_k8s(path, request.method, dict(request.params))
        return attrs.evolve(
            request, resource=NAMESPACES, namespace=None, name=name, subresource=match["sub"], action=action
        )

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        remapped = self._namespace_request(request)
        if remapped is not request:  # kmock matches reactions against its recorded requests
            self._requests[self._requests.index(request)] = request = remapped
        if request.resource is None:
            return await super(kmock.KubernetesEmulator, self)._handle(request)
        try:
            write = self._write_kind(request)
            if write is not None:
                if "protobuf" in request.headers.get("Content-Type", ""):
                    raise api_error(415, "protobuf request bodies are not emulated; send JSON")
                async with self._lock:
                    self._outcomes[request.id] = await self._write(write, request)
            # Skip the stock emulator's own state handling; serve the reactions (ours are fallbacks).
            return await super(kmock.KubernetesEmulator, self)._handle(request)
        finally:
            self._outcomes.pop(request.id, None)

    @staticmethod
    def _write_kind(request: rendering.Request) -> str | None:
        method = str(request.method.value).upper()
        if method == "POST" and request.name is None and request.subresource is None:
            return "create"
        if request.name is None:
            return None
        return {"PATCH": "patch", "PUT": "replace", "DELETE": "delete"}.get(method)

    async def _serve_outcome(self, request: rendering.Request) -> rendering.Payload:
        if request.id not in self._outcomes:
            raise api_error(405, f"{request.method.value} is not supported on {request.url.path}")
        status, payload = self._outcomes[request.id]
        return rendering.Response(status=status, payload=payload)

    # The stock emulator's reactions for writes: the state has already changed in _handle().
    async def _serve_create(self, request: rendering.Request) -> rendering.Payload:
        return await self._serve_outcome(request)

    async def _serve_update(self, request: rendering.Request) -> rendering.Payload:
        return await self._serve_outcome(request)

    async def _serve_delete(self, request: rendering.Request) -> rendering.Payload:
        return await self._serve_outcome(request)

    async def _write(self, kind: str, request: rendering.Request) -> tuple[int, dict[str, Any]]:
        res = request.resource
        assert res is not None  # dispatching guarantees it
        info = self._info(res)
        dry = request.params.get("dryRun") == "All"
        if kind == "create":
            return 201, await self._create(res, info, request, dry)
        key = self._key(res, info, request.namespace, str(request.name))
        current = self._live(key)
        if current is None:
            raise self._not_found(res, str(request.name))
        self._check_subresource(res, info, request.subresource)
        if kind == "delete":
            return 200, await self._delete(res, key, current, request, dry)
        if kind == "replace":
            body = self._body_object(request)
            if _meta(body).get("name") not in (None, key[2]):
                raise api_error(
                    400,
                    f"the name of the object ({_meta(body).get('name')}) does not match "
                    f"the name on the URL ({key[2]})",
                )
            new: Any = copy.deepcopy(body)
        else:
            new = self._apply_patch(res, request, current)
        return 200, await self._update(res, key, current, new, request.subresource, dry)

    # ---------------------------------------------------------------------------------------- writes

    async def _create(
        self, res: kmock.resource, info: kmock.ResourceInfo, request: rendering.Request, dry: bool
    ) -> dict[str, Any]:
        obj = copy.deepcopy(self._body_object(request))
        meta = dict(_meta(obj))
        namespace = self._create_namespace(res, info, request.namespace, meta.get("namespace"))
        name = meta.get("name")
        if not name:
            prefix = meta.get("generateName")
            if not prefix:
                raise api_error(422, "metadata.name: Required value: name or generateName is required")
            for _ in range(10):
                name = prefix + "".join(self._rng.choice(_NAME_CHARS) for _ in range(5))
                if self._live((res, namespace, name)) is None:
                    break
        self._validate_name(res, str(name))
        key: _Key = (res, namespace, str(name))
        if self._live(key) is not None:
            raise api_error(
                409,
                f'{self._kind_ref(res)} "{name}" already exists',
                "AlreadyExists",
                **self._details(res, name),
            )
        for server_field in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(server_field, None)
        meta.update(
            name=name,
            uid=str(uuid.UUID(int=self._rng.getrandbits(128), version=4)),
            creationTimestamp=_now(),
            generation=1,
        )
        if namespace is not None:
            meta["namespace"] = namespace
        obj["metadata"] = meta
        expected_kind = info.kind or str(res.plural).capitalize()
        if (
            obj.setdefault("apiVersion", api_version(res)) != api_version(res)
            or obj.setdefault("kind", expected_kind) != expected_kind
        ):
            raise api_error(
                400,
                f"the API version in the data ({obj['apiVersion']}) and kind ({obj['kind']}) "
                f"do not match the endpoint ({api_version(res)}, {expected_kind})",
            )
        if "status" in info.subresources:
            obj.pop("status", None)
        if res == CRD_RESOURCE:
            obj["status"] = self._crd_status(obj)
        if res == NAMESPACES:  # what the namespace strategy sets on create
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            obj["status"] = {"phase": "Active"}
        if dry:
            return obj
        meta["resourceVersion"] = str(self._next_rv())
        if key in self._objects:
            self._objects[key].create(obj)
        else:
            self._objects[key] = obj
        if res == CRD_RESOURCE:
            self.register_crd(obj)
        await self._emit(res, "ADDED", obj, None)
        self._collect_if_dangling(obj)
        return obj

    def _live_uids(self) -> set[Any]:
        return {_meta(o.raw).get("uid") for o in self._objects.values() if not o.deleted}

    def _collect_if_dangling(self, obj: Mapping[str, Any]) -> None:
        """A dependent created after all its owners are gone is collected, as kube's garbage
        collector does with dangling owner references: a controller acting on a stale list (a
        ReplicaSet replacing a crashed pod while its Deployment is being deleted) must not leave a
        pod behind that nothing will ever delete."""
        uids = [str(r["uid"]) for r in _meta(obj).get("ownerReferences") or [] if r.get("uid")]
        if not uids:
            return
        live = self._live_uids()
        if any(uid in live for uid in uids):
            return
        loop = asyncio.get_running_loop()
        for uid in uids:
            task = loop.create_task(self._collect_garbage(uid, False))
            self._gc_tasks.add(task)
            task.add_done_callback(self._gc_tasks.discard)

    def _apply_patch(self, res: kmock.resource, request: rendering.Request, current: dict[str, Any]) -> Any:
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        try:
            if ctype == "application/json-patch+json":
                if not isinstance(request.data, list):
                    raise api_error(
                        400, "a JSON patch (application/json-patch+json) must be a list of operations"
                    )
                return _patches.json_patch(current, request.data)
            if ctype == "application/strategic-merge-patch+json":
                if self._is_custom(res):
                    raise api_error(
                        415,
                        "the body of the request was in an unknown format - accepted media types include: "
                        "application/json-patch+json, application/merge-patch+json, "
                        "application/apply-patch+yaml "
                        "(strategic merge patch is not supported for custom resources)",
                    )
                return _patches.strategic_merge_patch(current, self._body_object(request))
            if ctype in ("application/merge-patch+json", "application/json", ""):
                # Plain application/json is a leniency for test code: the real server answers 415.
                return _patches.merge_patch(current, self._body_object(request))
            if ctype.startswith("application/apply-patch"):
                raise api_error(415, "server-side apply (application/apply-patch+yaml) is not emulated")
            raise api_error(
                415,
                f"unsupported patch type {ctype!r} (allowed: application/json-patch+json, "
                "application/merge-patch+json, application/strategic-merge-patch+json)",
            )
        except _patches.PatchTestFailed as exc:
            raise api_error(
                422, f"the JSON patch test operation failed: {exc}", **self._details(res, request.name)
            ) from exc
        except _patches.PatchError as exc:
            raise api_error(
                422, f"the patch cannot be applied: {exc}", **self._details(res, request.name)
            ) from exc

    async def _update(
        self,
        res: kmock.resource,
        key: _Key,
        current: dict[str, Any],
        new: Any,
        subresource: str | None,
        dry: bool,
    ) -> dict[str, Any]:
        if not isinstance(new, dict):
            raise api_error(422, "the patched or replaced object must be a JSON object")
        info = self._info(res)
        old_meta = _meta(current)
        sent_rv = _meta(new).get("resourceVersion")
        if sent_rv not in (None, "") and str(sent_rv) != old_meta.get("resourceVersion"):
            raise api_error(
                409,
                f'Operation cannot be fulfilled on {self._kind_ref(res)} "{key[2]}": '
                "the object has been modified; please apply your changes to the latest version and try again",
                **self._details(res, key[2]),
            )
        if subresource == "status":
            result = copy.deepcopy(current)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
        else:
            result = new
            if "status" in info.subresources:
                if "status" in current:
                    result["status"] = copy.deepcopy(current["status"])
                else:
                    result.pop("status", None)
        meta = result["metadata"] = dict(_meta(result))
        server_fields = ("name", "namespace", "uid", "creationTimestamp", "generation", "resourceVersion")
        for field in (*server_fields, "deletionTimestamp", "deletionGracePeriodSeconds"):
            if field in old_meta:
                meta[field] = old_meta[field]
            else:
                meta.pop(field, None)
        result.setdefault("apiVersion", current.get("apiVersion"))
        result.setdefault("kind", current.get("kind"))
        if res == CRD_RESOURCE:
            result["status"] = self._crd_status(result)
        if result == current:
            return current  # a no-op write: no new resourceVersion, no event (as the real server)
        terminating = "deletionTimestamp" in old_meta
        added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
        if terminating and added:
            raise api_error(
                422,
                "metadata.finalizers: Forbidden: no new finalizers can be added "
                f"if the object is being deleted, found new finalizers {sorted(added)!r}",
                **self._details(res, key[2]),
            )
        if _content(result) != _content(current):
            meta["generation"] = int(old_meta.get("generation", 0)) + 1
        if dry:
            return result
        meta["resourceVersion"] = str(self._next_rv())
        if terminating and not [f for f in meta.get("finalizers") or [] if f != "orphan"]:
            return await self._remove(res, key, result)  # the last finalizer is gone: really delete
        self._objects[key].history.append(result)
        if res == CRD_RESOURCE:
            self.register_crd(result)
        await self._emit(res, "MODIFIED", result, current)
        return result

    async def _delete(
        self,
        res: kmock.resource,
        key: _Key,
        current: dict[str, Any],
        request: rendering.Request,
        dry: bool,
    ) -> dict[str, Any]:
        options = request.data if isinstance(request.data, Mapping) else {}
        preconditions = options.get("preconditions") or {}
        for field in ("uid", "resourceVersion"):
            wanted = preconditions.get(field)
            if wanted is not None and wanted != _meta(current).get(field):
                raise api_error(
                    409,
                    f"Precondition failed: {field} in precondition: {wanted}, "
                    f"{field} in object meta: {_meta(current).get(field)}",
                    **self._details(res, key[2]),
                )
        policy = options.get("propagationPolicy") or request.params.get("propagationPolicy") or "Background"
        if policy not in ("Orphan", "Background", "Foreground"):
            raise api_error(
                400,
                f"propagationPolicy: Unsupported value {policy!r} (allowed: Orphan, Background, Foreground)",
            )
        orphan = policy == "Orphan" or options.get("orphanDependents") is True
        if dry:
            return current
        if _meta(current).get("finalizers"):
            if "deletionTimestamp" in _meta(current):
                return current
            marked = copy.deepcopy(current)
            meta = marked["metadata"]
            meta.update(
                deletionTimestamp=_now(),
                deletionGracePeriodSeconds=0,
                generation=int(meta.get("generation", 0)) + 1,
                resourceVersion=str(self._next_rv()),
            )
            if orphan:
                meta["finalizers"] = [*meta["finalizers"], "orphan"]
            self._objects[key].history.append(marked)
            await self._emit(res, "MODIFIED", marked, current)
            return marked
        final = copy.deepcopy(current)
        final["metadata"]["resourceVersion"] = str(self._next_rv())
        await self._remove(res, key, final, orphan=orphan)
        return {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Success",
            "details": {**self._details(res, key[2]), "uid": _meta(current).get("uid")},
        }

    async def _remove(
        self, res: kmock.resource, key: _Key, final: dict[str, Any], orphan: bool = False
    ) -> dict[str, Any]:
        """Really delete: soft-delete in kmock's store, emit DELETED, collect garbage in the background."""
        finalizers = _meta(final).get("finalizers") or []
        if "orphan" in finalizers:  # set by an Orphan deletion; the real GC removes it, so do we
            orphan = True
            final["metadata"]["finalizers"] = [f for f in finalizers if f != "orphan"]
        self._objects[key].delete()
        await self._emit(res, "DELETED", final, None)
        if res == CRD_RESOURCE:
            await self._drop_crd(final)
        uid = _meta(final).get("uid")
        if uid:
            task = asyncio.get_running_loop().create_task(self._collect_garbage(str(uid), orphan))
            self._gc_tasks.add(task)
            task.add_done_callback(self._gc_tasks.discard)
        return final

    async def _collect_garbage(self, owner_uid: str, orphan: bool) -> None:
        async with self._lock:
            live_uids = self._live_uids()
            for key, stored in list(self._objects.items()):
                if stored.deleted:
                    continue
                refs = _meta(stored.raw).get("ownerReferences") or []
                if not any(ref.get("uid") == owner_uid for ref in refs):
                    continue
                try:
                    await self._collect_one(key, stored, owner_uid, orphan, live_uids)
                except ApiError as exc:  # e.g. the dependent's resource was undeclared meanwhile
                    logger.warning("emulator: garbage collection of %s skipped: %s", key, exc.message)

    async def _collect_one(
        self, key: _Key, stored: k8s_dicts.Object, owner_uid: str, orphan: bool, live_uids: set[Any]
    ) -> None:
        """One dependent of a deleted owner: strip the reference, or delete it (finalizers respected)."""
        res, current = key[0], stored.raw
        others = [ref for ref in _meta(current).get("ownerReferences") or [] if ref.get("uid") != owner_uid]
        if orphan or any(ref.get("uid") in live_uids for ref in others):
            updated = copy.deepcopy(current)
            updated["metadata"]["ownerReferences"] = others
            if not others:
                del updated["metadata"]["ownerReferences"]
            await self._update(res, key, current, updated, None, dry=False)
        elif _meta(current).get("finalizers"):
            if "deletionTimestamp" not in _meta(current):
                marked = copy.deepcopy(current)
                marked["metadata"].update(
                    deletionTimestamp=_now(),
                    deletionGracePeriodSeconds=0,
                    resourceVersion=str(self._next_rv()),
                )
                stored.history.append(marked)
                await self._emit(res, "MODIFIED", marked, current)
        else:
            final = copy.deepcopy(current)
            final["metadata"]["resourceVersion"] = str(self._next_rv())
            await self._remove(res, key, final)

    async def _emit(
        self, res: kmock.resource, kind: str, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        change = _Change(kind, obj, old, int(_meta(obj)["resourceVersion"]))
        log = self._log.setdefault(res, collections.deque(maxlen=self.watch_log_size))
        if len(log) == log.maxlen:
            self._log_floor[res] = log[0].rv
        log.append(change)
        await self._buses[res].put(change)

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

    # ------------------------------------------------------------------------------------------ CRDs

    @staticmethod
    def _crd_parts(crd: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        spec = crd.get("spec")
        if not isinstance(spec, dict):
            raise api_error(422, "spec: Required value")
        names = spec.get("names")
        if not isinstance(names, dict) or not names.get("plural") or not names.get("kind"):
            raise api_error(422, "spec.names.plural, spec.names.kind: Required value")
        if not spec.get("group"):
            raise api_error(422, "spec.group: Required value")
        if spec.get("scope", "Namespaced") not in ("Namespaced", "Cluster"):
            raise api_error(
                422, f"spec.scope: Unsupported value {spec.get('scope')!r} (allowed: Namespaced, Cluster)"
            )
        versions = spec.get("versions")
        if not isinstance(versions, list) or not versions or not all(v.get("name") for v in versions):
            raise api_error(422, "spec.versions: Required value: at least one version with a name")
        return spec, names

    def _crd_status(self, crd: Mapping[str, Any]) -> dict[str, Any]:
        spec, names = self._crd_parts(crd)
        expected = f"{names['plural']}.{spec['group']}"
        if _meta(crd).get("name") != expected:
            raise api_error(
                422, f"metadata.name: Invalid value: {_meta(crd).get('name')!r}: must be {expected!r}"
            )
        accepted = {
            "plural": names["plural"],
            "singular": names.get("singular") or names["kind"].lower(),
            "kind": names["kind"],
            "listKind": names.get("listKind") or f"{names['kind']}List",
            **({"shortNames": names["shortNames"]} if names.get("shortNames") else {}),
            **({"categories": names["categories"]} if names.get("categories") else {}),
        }
        previous = crd.get("status") or {}
        stamp = {c.get("type"): c.get("lastTransitionTime") for c in previous.get("conditions") or []}
        conditions = [
            {
                "type": kind,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": stamp.get(kind) or _now(),
            }
            for kind, reason, message in (
                ("NamesAccepted", "NoConflicts", "no conflicts found"),
                ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
            )
        ]
        stored = [v["name"] for v in spec["versions"] if v.get("storage")]
        return {"conditions": conditions, "acceptedNames": accepted, "storedVersions": stored}

    async def _drop_crd(self, crd: Mapping[str, Any]) -> None:
        name = str(_meta(crd).get("name"))
        for res in self._custom.pop(name, set()):
            if res in self.resources:
                del self.resources[res]
            for key, stored in list(self._objects.items()):
                if key[0] == res and not stored.deleted:
                    final = copy.deepcopy(stored.raw)
                    final["metadata"]["resourceVersion"] = str(self._next_rv())
                    await self._remove(res, key, final)

    # -------------------------------------------------------------------------------------- reading

    async def _serve_fetch(self, request: rendering.Request) -> rendering.Payload:
        assert request.resource is not None
        info = self._info(request.resource)
        self._check_subresource(request.resource, info, request.subresource)
        key = self._key(request.resource, info, request.namespace, str(request.name))
        async with self._lock:
            current = self._live(key)
        if current is None:
            raise self._not_found(request.resource, request.name)
        return current

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        assert request.resource is not None
        res = request.resource
        info = self._info(res)
        selector = self._selector(request)
        async with self._lock:
            items = [obj for _, obj in self._scan(request) if selector(obj)]
            rv = self._rv
        return {
            "apiVersion": api_version(res),
            "kind": f"{info.kind or str(res.plural).capitalize()}List",
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    def _serve_watch(self, request: rendering.Request) -> rendering.Payload:  # type: ignore[override]
        assert request.resource is not None
        self._info(request.resource)
        selector = self._selector(request)
        since_text = request.params.get("resourceVersion", "")
        initial = request.params.get("sendInitialEvents") == "true"
        try:
            since = int(since_text) if since_text not in ("", "0") and not initial else None
            timeout = float(request.params["timeoutSeconds"]) if "timeoutSeconds" in request.params else None
        except ValueError as exc:
            raise api_error(400, f"resourceVersion/timeoutSeconds: must be numbers: {exc}") from exc
        stream = self._watch_stream(request, selector, since, initial, timeout)
        return rendering.Response(headers={"Content-Type": "application/json"}, payload=stream)

    async def _watch_stream(
        self,
        request: rendering.Request,
        selector: _selectors.Selector,
        since: int | None,
        initial_events: bool,
        timeout: float | None,
    ) -> AsyncIterator[rendering.Payload]:
        yield b""  # send the headers now, even if nothing happens for a while
        res = request.resource
        assert res is not None
        bus = self._buses[res]
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        drop_after = None if self.faults is None else self.faults.watch_deadline(bearer(request.headers))
        if drop_after is not None:  # an injected dropped watch: the stream ends early
            drop_at = loop.time() + drop_after
            if deadline is None or drop_at < deadline:
                deadline = drop_at
            else:
                drop_after = None
        async with self._lock:  # the snapshot and the subscription are atomic: nothing falls in between
            mark = await bus.mark()
            first: list[dict[str, Any]] = []
            if since is None:
                first = [{"type": "ADDED", "object": obj} for _, obj in self._scan(request) if selector(obj)]
                if initial_events:
                    first.append(self._initial_events_end(res))
            elif since < self._log_floor.get(res, 0):
                first = [self._expired(since)]
            else:
                changes = [c for c in self._log.get(res, ()) if c.rv > since]
                first = [e for c in changes if (e := self._wire(c, request, selector)) is not None]
        try:
            for event in first:
                yield event
            if first and first[-1]["type"] == "ERROR":
                return
            changes_iter = aiter(bus.stream(since=mark))
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    if drop_after is not None and self.faults is not None:
                        self.faults.count_watch_drop()
                    return
                try:
                    change = await asyncio.wait_for(anext(changes_iter), remaining)
                except TimeoutError:
                    if drop_after is not None and self.faults is not None:
                        self.faults.count_watch_drop()
                    return
                wired = self._wire(change, request, selector)
                if wired is not None:
                    yield wired
        finally:
            with contextlib.suppress(ValueError):
                await bus.unmark(mark)

    @staticmethod
    def _wire(
        change: _Change, request: rendering.Request, selector: _selectors.Selector
    ) -> dict[str, Any] | None:
        """The watch event a client sees for one change, or None; selector exits become DELETED."""
        meta = _meta(change.obj)
        if request.namespace is not None and meta.get("namespace") != request.namespace:
            return None
        if request.name is not None and meta.get("name") != request.name:
            return None
        now_in = selector(change.obj)
        was_in = change.old is not None and selector(change.old)
        if change.type != "MODIFIED":
            return {"type": change.type, "object": change.obj} if now_in else None
        if now_in:
            return {"type": "MODIFIED" if was_in else "ADDED", "object": change.obj}
        return {"type": "DELETED", "object": change.obj} if was_in else None

    def _initial_events_end(self, res: kmock.resource) -> dict[str, Any]:
        return {
            "type": "BOOKMARK",
            "object": {
                "apiVersion": api_version(res),
                "kind": self._info(res).kind,
                "metadata": {
                    "resourceVersion": str(self._rv),
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            },
        }

    def _expired(self, since: int) -> dict[str, Any]:
        return {
            "type": "ERROR",
            "object": {
                "apiVersion": "v1",
                "kind": "Status",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {since} ({self._rv})",
                "reason": "Expired",
                "code": 410,
            },
        }

    def _scan(self, request: rendering.Request) -> list[tuple[_Key, dict[str, Any]]]:
        """Live objects of the request's resource, namespace and name, ordered as etcd keys are."""
        found = [
            (key, stored.raw)
            for key, stored in self._objects.items()
            if key[0] == request.resource
            and not stored.deleted
            and (request.namespace is None or key[1] == request.namespace)
            and (request.name is None or key[2] == request.name)
        ]
        return sorted(found, key=lambda item: (item[0][1] or "", item[0][2]))

    @staticmethod
    def _selector(request: rendering.Request) -> _selectors.Selector:
        try:
            return _selectors.build_selector(
                request.params.get("labelSelector"), request.params.get("fieldSelector")
            )
        except _selectors.SelectorError as exc:
            raise api_error(400, str(exc)) from exc

    # ------------------------------------------------------------------------------------ discovery

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        assert request.resource is not None
        wanted = request.resource
        resources = sorted(
            (res for res in self._get_resources() if wanted.check(res) and res.plural),
            key=lambda res: str(res.plural),
        )
        if not resources and wanted.group != "":
            raise api_error(404, f"the server could not find the requested resource ({api_version(wanted)})")
        entries: list[dict[str, Any]] = []
        for res in resources:
            info = self.resources[res] if res in self.resources else kmock.ResourceInfo()
            kind = info.kind or str(res.plural).capitalize()
            entries.append(
                {
                    "name": res.plural,
                    "singularName": info.singular or kind.lower(),
                    "namespaced": bool(info.namespaced),
                    "kind": kind,
                    "verbs": sorted(info.verbs or ALL_VERBS),
                    **({"shortNames": sorted(info.shortnames)} if info.shortnames else {}),
                    **({"categories": sorted(info.categories)} if info.categories else {}),
                }
            )
            for sub in sorted(info.subresources):
                scale = sub == "scale"
                entries.append(
                    {
                        "name": f"{res.plural}/{sub}",
                        "singularName": "",
                        "namespaced": bool(info.namespaced),
                        "kind": "Scale" if scale else kind,
                        **({"group": "autoscaling", "version": "v1"} if scale else {}),
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "apiVersion": "v1",
            "kind": "APIResourceList",
            "groupVersion": api_version(wanted),
            "resources": entries,
        }

    def _group_entry(self, group: str) -> dict[str, Any] | None:
        versions = sorted(
            {str(r.version) for r in self._get_resources() if r.group == group and r.version},
            key=_version_priority,
            reverse=True,
        )
        if not versions:
            return None
        listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": listed, "preferredVersion": listed[0]}

    async def _serve_apis(self, request: rendering.Request) -> rendering.Payload:
        groups = sorted({str(r.group) for r in self._get_resources() if r.group})
        entries = [entry for group in groups if (entry := self._group_entry(group)) is not None]
        return {"apiVersion": "v1", "kind": "APIGroupList", "groups": entries}

    async def _serve_group(self, request: rendering.Request) -> rendering.Payload:
        assert request.resource is not None
        entry = self._group_entry(str(request.resource.group))
        if entry is None:
            raise api_error(
                404, f"the server could not find the requested resource (group {request.resource.group})"
            )
        return {"apiVersion": "v1", "kind": "APIGroup", **entry}

    # ------------------------------------------------------------------------------------- errors

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, ApiError):
            code, reason, message, details = exc.status, exc.reason, exc.message, exc.details or {}
        elif isinstance(exc, kmock.KubernetesError):  # stock kmock errors, made canonical
            code = exc.status
            reason = "AlreadyExists" if code == 409 else _REASONS.get(code, "InternalError")
            message, details = exc.message or reason, {}
        elif isinstance(exc, NotImplementedError):  # no reaction matched
            code, reason, message, details = (
                404,
                "NotFound",
                "the server could not find the requested resource",
                {},
            )
        else:
            logger.exception("emulator: internal error")
            code, reason, message, details = 500, "InternalError", f"internal error: {exc!r}", {}
        body = {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "details": details,
            "code": code,
        }
        return aiohttp.web.json_response(body, status=code)

    # ------------------------------------------------------------------------------------ helpers

    def _info(self, res: kmock.resource) -> kmock.ResourceInfo:
        if res in self.resources:
            return self.resources[res]
        if any(known == res for known in self._get_resources()):
            return kmock.ResourceInfo()
        raise api_error(
            404, f"the server could not find the requested resource ({api_version(res)}, {res.plural})"
        )

    def _is_custom(self, res: kmock.resource) -> bool:
        return (
            any(res in served for served in self._custom.values()) or str(res.group) not in builtin_groups()
        )

    def _key(
        self, res: kmock.resource, info: kmock.ResourceInfo, url_namespace: str | None, name: str
    ) -> _Key:
        if info.namespaced is False and url_namespace is not None:
            raise self._not_found(res, name)
        return (res, url_namespace, name)

    def _create_namespace(
        self, res: kmock.resource, info: kmock.ResourceInfo, url_namespace: str | None, body_namespace: Any
    ) -> str | None:
        if info.namespaced is False:
            if url_namespace is not None:
                raise api_error(
                    404, f"{res.plural} is cluster-scoped: POST it without a namespace in the URL"
                )
            return None
        if url_namespace is None:
            if info.namespaced:
                raise api_error(
                    405, f"{res.plural} is namespaced: POST it to /namespaces/<namespace>/{res.plural}"
                )
            return None
        if body_namespace not in (None, "", url_namespace):
            raise api_error(
                400, "the namespace of the provided object does not match the namespace sent on the request"
            )
        return url_namespace

    def _validate_name(self, res: kmock.resource, name: str) -> None:
        if name in (".", "..") or "/" in name or "%" in name or len(name) > 253:
            raise api_error(
                422, f"metadata.name: Invalid value: {name!r}: may not be '.', '..' or contain '/' or '%'"
            )
        if str(res.group) not in _PATH_SEGMENT_GROUPS and not _DNS_SUBDOMAIN.match(name):
            raise api_error(
                422,
                f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain must consist "
                "of lower case alphanumeric characters, '-' or '.', "
                "and must start and end with an alphanumeric character",
                **self._details(res, name),
            )

    def _check_subresource(
        self, res: kmock.resource, info: kmock.ResourceInfo, subresource: str | None
    ) -> None:
        if subresource is None:
            return
        if subresource != "status" or "status" not in info.subresources:
            raise api_error(
                404,
                f"the subresource {subresource!r} of {res.plural} is not served (only status is emulated)",
            )

    def _live(self, key: _Key) -> dict[str, Any] | None:
        if key not in self._objects:
            return None
        stored: k8s_dicts.Object = self._objects[key]
        return None if stored.deleted else stored.raw

    @staticmethod
    def _body_object(request: rendering.Request) -> dict[str, Any]:
        if not isinstance(request.data, Mapping):
            raise api_error(400, "the request body must be a JSON object")
        return dict(request.data)

    @staticmethod
    def _kind_ref(res: kmock.resource) -> str:
        return f"{res.plural}.{res.group}" if res.group else str(res.plural)

    @staticmethod
    def _details(res: kmock.resource, name: Any) -> dict[str, Any]:
        return {"name": name, "group": res.group, "kind": res.plural}

    def _not_found(self, res: kmock.resource, name: Any) -> ApiError:
        return api_error(404, f'{self._kind_ref(res)} "{name}" not found', **self._details(res, name))


# ---------------------------------------------------------------------------------------- serving


_E = TypeVar("_E", bound=RealisticEmulator)


@contextlib.asynccontextmanager
async def _serving(handler: _E, port: int, host: str) -> AsyncIterator[tuple[_E, str]]:
    async with handler, kmock.Server(handler, host=host, port=port or None) as server:
        yield handler, str(server.url).rstrip("/")


@overload
def serve_emulator(
    port: int = 0, host: str = "127.0.0.1", *, emulator: None = None
) -> contextlib.AbstractAsyncContextManager[tuple[RealisticEmulator, str]]: ...


@overload
def serve_emulator(
    port: int = 0, host: str = "127.0.0.1", *, emulator: _E
) -> contextlib.AbstractAsyncContextManager[tuple[_E, str]]: ...


def serve_emulator(
    port: int = 0, host: str = "127.0.0.1", *, emulator: RealisticEmulator | None = None
) -> contextlib.AbstractAsyncContextManager[tuple[RealisticEmulator, str]]:
    """Serve an emulator over HTTP: ``async with serve_emulator() as (emulator, url): ...``.

    ``port=0`` picks a free port. The emulator lives in the current event loop: sync clients must be
    called from another thread (``asyncio.to_thread``), kopf from its own thread (``KopfRunner``).
    Pass ``emulator=`` to serve a configured instance or a subclass (the same type is yielded back).
    """
    if not 0 <= port <= 65535:
        raise ValueError(f"port: must be 0..65535 (0 picks a free one), got {port}")
    return _serving(emulator if emulator is not None else RealisticEmulator(), port, host)


def kubeconfig(url: str, namespace: str = "default") -> dict[str, Any]:
    """A kubeconfig document for an emulator URL (no TLS, a dummy token: the emulator checks nothing)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url: must start with http:// or https://, got {url!r}")
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {"token": "emulator"}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
            }
        ],
        "current-context": "emulator",
        "preferences": {},
    }


def write_kubeconfig(path: str | Path, url: str, namespace: str = "default") -> Path:
    """Write a kubeconfig for ``url`` to ``path`` (kopf's default login, the kubernetes client, kubectl)."""
    target = Path(path)
    target.write_text(yaml.safe_dump(kubeconfig(url, namespace), sort_keys=False))
    return target


__all__ = [
    "CRD_RESOURCE",
    "ApiError",
    "RealisticEmulator",
    "api_error",
    "kubeconfig",
    "serve_emulator",
    "write_kubeconfig",
]

"""The store: requests dispatched, writes with the server's metadata, conflicts and finalizers, reads.

``RealisticEmulator`` combines the parts: this module's writes and reads, the watches
(``watch.py``), CRDs (``crds.py``), garbage collection (``gc.py``) and discovery (``discovery.py``).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import re
import uuid
from collections.abc import Mapping
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import parsing, rendering

from prefixtune.sandbox import _patches
from prefixtune.sandbox.emulator import openapi, scale, tables
from prefixtune.sandbox.emulator.core import (
    NAMESPACES,
    _content,
    _Key,
    _load_bundled,
    _meta,
    _now,
    api_version,
)
from prefixtune.sandbox.emulator.crds import CRD_RESOURCE, CustomResources
from prefixtune.sandbox.emulator.discovery import Discovery
from prefixtune.sandbox.emulator.errors import ApiError, api_error, details, kind_ref, not_found, render_error
from prefixtune.sandbox.emulator.gc import GarbageCollection
from prefixtune.sandbox.emulator.logs import pod_log
from prefixtune.sandbox.emulator.strategies import initial_status
from prefixtune.sandbox.emulator.watch import Watches
from prefixtune.sandbox.faults import ApiFaults, bearer

# kmock 0.8's URL parser reads /api/v1/namespaces/<x> as a namespace prefix and fails on the bare
# collection: the collection is routed through a marker name (no namespace can start with a dot).
_NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces(?:/(?P<name>[^/]+)(?:/(?P<sub>status|finalize))?)?/?$")
_NAMESPACE_COLLECTION = ".collection"
_PODS = kmock.resource("", "v1", "pods")
_POD_LOG_PATH = re.compile(r"^/api/v1/namespaces/(?P<namespace>[^/]+)/pods/(?P<name>[^/]+)/log/?$")
_OPENAPI_INFO_VERSION = "v1.26.4"  # kmock 0.8's /version gitVersion (v1.26.4+k3s1)
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # the real server's generateName alphabet
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_PATH_SEGMENT_GROUPS = frozenset({"rbac.authorization.k8s.io"})  # names like "system:foo" are valid there


@attrs.define(kw_only=True)
class RealisticEmulator(GarbageCollection, CustomResources, Watches, Discovery):
    """kmock's emulator plus the kube-apiserver semantics listed in the package docstring."""

    _outcomes: dict[int, Any] = attrs.field(factory=dict, init=False)

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

    # ------------------------------------------------------------------------------------ dispatching

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw_request.method == "GET" and raw_request.path.startswith("/openapi/"):
            return self._serve_openapi(raw_request.path)
        if "protobuf" in raw_request.headers.get("Content-Type", "") and raw_request.method in (
            "POST",
            "PUT",
            "PATCH",
        ):
            # kmock decodes bodies as text first: a real protobuf body (kubectl create deployment)
            # would be a 500 there, not the 415 below
            return render_error(api_error(415, "protobuf request bodies are not emulated; send JSON"))
        log_path = _POD_LOG_PATH.match(raw_request.path) if raw_request.method == "GET" else None
        if log_path is not None:  # plain text, outside kmock's reactions (they keep a reply's headers)
            return await self._serve_pod_log(log_path["namespace"], log_path["name"], raw_request.query)
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

    def _serve_openapi(self, path: str) -> aiohttp.web.StreamResponse:
        """``/openapi/v3`` and its group-version documents (``openapi.py``); v2 is not served."""
        by_gv: dict[str, list[openapi.ServedResource]] = {}
        for res in self.served_resources():
            by_gv.setdefault(res.gv_path, []).append(res)
        documents = {
            gv: openapi.group_version_document(items, _OPENAPI_INFO_VERSION) for gv, items in by_gv.items()
        }
        wanted = path.rstrip("/").removeprefix("/openapi/v3").lstrip("/")
        if path.rstrip("/") == "/openapi/v3":
            return aiohttp.web.json_response(openapi.index(documents))
        if path.startswith("/openapi/v3/") and wanted in documents:
            return aiohttp.web.json_response(documents[wanted])
        message = (
            "the sandbox's API server serves OpenAPI v3 only (/openapi/v3)"
            if path.startswith("/openapi/v2")
            else f"no OpenAPI v3 document for {wanted!r}"
        )
        return render_error(api_error(404, message))

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
            raise not_found(res, str(request.name))
        self._check_subresource(res, info, request.subresource)
        if request.subresource == "scale":
            return await self._write_scale(kind, res, key, current, request, dry)
        if kind == "delete":
            return 200, await self._delete(res, key, current, request, dry)
        self._admit_namespace(res, key[1], key[2], creating=False)
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
        if isinstance(new, Mapping):
            self.strict_check(res, new, request.params.get("fieldValidation"))
        return 200, await self._update(res, key, current, new, request.subresource, dry)

    async def _write_scale(
        self,
        kind: str,
        res: kmock.resource,
        key: _Key,
        current: dict[str, Any],
        request: rendering.Request,
        dry: bool,
    ) -> tuple[int, dict[str, Any]]:
        """PUT or PATCH of ``.../scale`` (``scale.py``): only spec replicas reach the resource,
        written as an update of the resource itself (its generation, its watch event)."""
        if kind == "delete":
            raise api_error(405, f"DELETE is not supported on {request.url.path}")
        paths = self._scales[res]
        if kind == "replace":
            body: Any = self._body_object(request)
        else:
            body = self._patch_object(res, request, scale.old_scale(current, paths), custom=False)
        updated = await self._update(res, key, current, scale.with_scale(current, paths, body), None, dry)
        return 200, scale.scale_of(updated, paths)

    # ---------------------------------------------------------------------------------------- writes

    async def _create(
        self, res: kmock.resource, info: kmock.ResourceInfo, request: rendering.Request, dry: bool
    ) -> dict[str, Any]:
        obj = copy.deepcopy(self._body_object(request))
        if self.admission is not None:
            obj = self.admission(res, obj)
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
        self._admit_namespace(res, namespace, str(name), creating=True)
        self.strict_check(res, obj, request.params.get("fieldValidation"))
        key: _Key = (res, namespace, str(name))
        if self._live(key) is not None:
            raise api_error(
                409,
                f'{kind_ref(res)} "{name}" already exists',
                "AlreadyExists",
                **details(res, name),
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
            if not self._is_custom(res):  # a built-in's status struct, as its strategy sets it
                obj["status"] = initial_status(str(res.group), str(res.plural), obj)
        if res == CRD_RESOURCE:
            obj["status"] = self._crd_status(obj)
        if res == NAMESPACES:  # what the namespace strategy sets on create (besides the status)
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        if dry:
            return obj
        meta["resourceVersion"] = str(self._next_rv())
        if key in self._objects:
            self._objects[key].create(obj)
            self._keep_last(key)
        else:
            self._objects[key] = obj
        if res == CRD_RESOURCE:
            self.register_crd(obj)
        await self._emit(res, "ADDED", obj, None)
        self._collect_if_dangling(obj)
        return obj

    def _apply_patch(self, res: kmock.resource, request: rendering.Request, current: dict[str, Any]) -> Any:
        return self._patch_object(res, request, current, custom=self._is_custom(res))

    def _patch_object(
        self, res: kmock.resource, request: rendering.Request, current: dict[str, Any], custom: bool
    ) -> Any:
        """``current`` with the request's patch applied; ``custom``: a custom resource's object
        (no strategic merge patch; a Scale, though served under one, is a built-in type)."""
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        try:
            if ctype == "application/json-patch+json":
                if not isinstance(request.data, list):
                    raise api_error(
                        400, "a JSON patch (application/json-patch+json) must be a list of operations"
                    )
                return _patches.json_patch(current, request.data)
            if ctype == "application/strategic-merge-patch+json":
                if custom:
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
                422, f"the JSON patch test operation failed: {exc}", **details(res, request.name)
            ) from exc
        except _patches.PatchError as exc:
            raise api_error(422, f"the patch cannot be applied: {exc}", **details(res, request.name)) from exc

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
                f'Operation cannot be fulfilled on {kind_ref(res)} "{key[2]}": '
                "the object has been modified; please apply your changes to the latest version and try again",
                **details(res, key[2]),
            )
        if subresource == "status":
            result = copy.deepcopy(current)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
        else:
            result = new if self.admission is None else self.admission(res, new)
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
                **details(res, key[2]),
            )
        if _content(result) != _content(current):
            meta["generation"] = int(old_meta.get("generation", 0)) + 1
        if dry:
            return result
        meta["resourceVersion"] = str(self._next_rv())
        if terminating and not [f for f in meta.get("finalizers") or [] if f != "orphan"]:
            return await self._remove(res, key, result)  # the last finalizer is gone: really delete
        self._record(key, result)
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
                    **details(res, key[2]),
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
            self._record(key, marked)
            await self._emit(res, "MODIFIED", marked, current)
            return marked
        grace = options.get("gracePeriodSeconds", request.params.get("gracePeriodSeconds"))
        final = copy.deepcopy(current)
        final["metadata"]["resourceVersion"] = str(self._next_rv())
        await self._remove(res, key, final, orphan=orphan, grace=grace)
        return {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Success",
            "details": {**details(res, key[2]), "uid": _meta(current).get("uid")},
        }

    async def _mark_terminating(
        self, res: kmock.resource, key: _Key, final: dict[str, Any], grace: Any
    ) -> dict[str, Any]:
        """A pod's graceful termination, compressed: the API server first sets its
        ``deletionTimestamp`` (watchers see it terminating: the routers' Kubernetes discovery, which
        watches applied objects only, removes a worker on that, never on DELETED), then the twin
        kubelet, which has no grace period, has it deleted at once. Returns the object to delete."""
        if grace is None:
            grace = (final.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        marked = copy.deepcopy(final)
        marked["metadata"].update(deletionTimestamp=_now(), deletionGracePeriodSeconds=int(grace))
        self._record(key, marked)
        await self._emit(res, "MODIFIED", marked, self._objects[key].raw)
        gone = copy.deepcopy(marked)
        gone["metadata"]["resourceVersion"] = str(self._next_rv())
        return gone

    async def _remove(
        self,
        res: kmock.resource,
        key: _Key,
        final: dict[str, Any],
        orphan: bool = False,
        grace: Any = None,
    ) -> dict[str, Any]:
        """Really delete: soft-delete in kmock's store, emit DELETED, collect garbage in the background.
        A pod not yet terminating is marked so first (``_mark_terminating``; ``grace``: the request's
        grace period), whoever deletes it: a client, or the garbage collector."""
        if not res.group and res.plural == "pods" and "deletionTimestamp" not in _meta(final):
            final = await self._mark_terminating(res, key, final, grace)
        finalizers = _meta(final).get("finalizers") or []
        if "orphan" in finalizers:  # set by an Orphan deletion; the real GC removes it, so do we
            orphan = True
            final["metadata"]["finalizers"] = [f for f in finalizers if f != "orphan"]
        self._objects[key].delete()
        self._keep_last(key)
        await self._emit(res, "DELETED", final, None)
        if res == CRD_RESOURCE:
            await self._drop_crd(final)
        uid = _meta(final).get("uid")
        if uid:
            task = asyncio.get_running_loop().create_task(self._collect_garbage(str(uid), orphan))
            self._gc_tasks.add(task)
            task.add_done_callback(self._gc_tasks.discard)
        return final

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

    def _admit_namespace(self, res: kmock.resource, namespace: str | None, name: str, creating: bool) -> None:
        """The NamespaceLifecycle admission plugin: no writes into a namespace that does not exist.

        As kube-apiserver's plugin (k8s.io/apiserver ``pkg/admission/plugin/namespace/lifecycle/
        admission.go``, kubernetes 04791b49): a create or an update of a namespaced object whose
        namespace is missing is refused with the namespace's NotFound (404, ``namespaces "x" not
        found``, details kind ``namespaces``); a create in a terminating namespace is Forbidden (403,
        cause ``NamespaceTerminating``); deletes always pass. Only with ``builtins`` (without them no
        namespaces are served).
        """
        if not self.builtins or namespace is None or res == NAMESPACES:
            return
        found = self._live((NAMESPACES, None, namespace))
        if found is None:
            raise api_error(404, f'namespaces "{namespace}" not found', name=namespace, kind="namespaces")
        terminating = "deletionTimestamp" in _meta(found) or (found.get("status") or {}).get("phase") == (
            "Terminating"
        )
        if creating and terminating:
            raise api_error(
                403,
                f'{kind_ref(res)} "{name}" is forbidden: unable to create new content in namespace '
                f"{namespace} because it is being terminated",
                name=name,
                group=res.group,
                kind=res.plural,
                causes=[
                    {
                        "reason": "NamespaceTerminating",
                        "message": f"namespace {namespace} is being terminated",
                        "field": "metadata.namespace",
                    }
                ],
            )

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
                **details(res, name),
            )

    # -------------------------------------------------------------------------------------- reading

    async def _serve_fetch(self, request: rendering.Request) -> rendering.Payload:
        assert request.resource is not None
        info = self._info(request.resource)
        self._check_subresource(request.resource, info, request.subresource)
        key = self._key(request.resource, info, request.namespace, str(request.name))
        async with self._lock:
            current = self._live(key)
        if current is None:
            raise not_found(request.resource, request.name)
        if request.subresource == "scale":
            return scale.scale_of(current, self._scales[request.resource])
        if request.subresource is None:
            table = self._as_table(request, [current], str(_meta(current).get("resourceVersion", "")))
            if table is not None:
                return table
        return current

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        assert request.resource is not None
        res = request.resource
        info = self._info(res)
        selector = self._selector(request)
        async with self._lock:
            items = [obj for _, obj in self._scan(request) if selector(obj)]
            rv = self._rv
        table = self._as_table(request, items, str(rv))
        if table is not None:
            return table
        return {
            "apiVersion": api_version(res),
            "kind": f"{info.kind or str(res.plural).capitalize()}List",
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    async def _serve_pod_log(
        self, namespace: str, name: str, query: Mapping[str, str]
    ) -> aiohttp.web.StreamResponse:
        """``GET pods/<name>/log`` (``logs.py``): plain text from the pod's log source."""
        async with self._lock:
            pod = self._live((_PODS, namespace, name))
        try:
            if pod is None:
                raise not_found(_PODS, name)
            body = pod_log(pod, dict(query), self.pod_logs)
        except ApiError as exc:
            return render_error(exc)
        return aiohttp.web.Response(body=body, content_type="text/plain")

    def _as_table(
        self, request: rendering.Request, objects: list[dict[str, Any]], resource_version: str
    ) -> dict[str, Any] | None:
        """The objects as a ``meta.k8s.io`` Table when the Accept header asks for one (``tables.py``)."""
        version = tables.requested_table(request.headers.get("Accept", ""))
        if version is None:
            return None
        assert request.resource is not None
        try:
            include = tables.include_object(request.params.get("includeObject"))
        except tables.TableRequestError as exc:
            raise api_error(400, str(exc)) from exc
        now = datetime.datetime.now(tz=datetime.UTC)
        return tables.to_table(
            objects,
            self.printer(request.resource),
            version=version,
            include=include,
            resource_version=resource_version,
            now=now,
        )

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        return render_error(exc)

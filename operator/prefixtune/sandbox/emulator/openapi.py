"""OpenAPI v3 documents (``/openapi/v3``) from the served resources and the CRDs' schemas (pure).

What kubectl reads, and so what is served:

* ``kubectl apply``/``create``/``edit`` (validation on, the default ``--validate=strict``) ask,
  per object, whether the server validates fields itself: cli-runtime's ``queryParamVerifierV3``
  (kubernetes 0457fbc8, ``staging/src/k8s.io/cli-runtime/pkg/resource/query_param_verifier_v3.go``)
  fetches the object's group-version document (``GET /openapi/v3`` lists
  ``{"paths": {"apis/<g>/<v>": {"serverRelativeURL": ...}}}``) and looks for a PATCH operation whose
  ``x-kubernetes-group-version-kind`` is the object's GVK and that declares the ``fieldValidation``
  query parameter. Found: kubectl sends ``?fieldValidation=Strict`` and leaves the checks to the
  server (``strict_field_errors``). Not found, or no document: it falls back to client-side
  validation with the protobuf OpenAPI v2 document, and without one fails with ``error validating
  data`` (the emulator's old answer, hence ``--validate=false``).
* ``kubectl explain`` (kubernetes/kubectl ``pkg/explain/v2/templates/plaintext.tmpl``) takes the
  GVK from an operation of the resource's path (``/apis/<g>/<v>/namespaces/{namespace}/<plural>``
  and the others) and prints the ``components.schemas`` entry that lists that GVK in its
  ``x-kubernetes-group-version-kind``.

A custom resource's schema is its CRD version's ``openAPIV3Schema`` with ``apiVersion``, ``kind``
and ``metadata`` described as apiextensions-apiserver's builder describes them (``metadata`` inline,
not a ``$ref`` to ObjectMeta). Built-in kinds get operations but an open schema (kmock bundles no
schemas): ``explain`` shows their kind and nothing below it, and their fields are not checked.

Deviations: no OpenAPI v2 (kubectl reads v2 only as protobuf, client-go ``discovery/discovery_client.go``
``openAPIV2mimePb``, and only when v3 is missing); one document per
group version holds only the operations kubectl looks at (get, list, create, replace, patch,
delete), without response schemas beyond the kind's.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_API_VERSION_DOC = (
    "APIVersion defines the versioned schema of this representation of an object. Servers should "
    "convert recognized schemas to the latest internal value, and may reject unrecognized values. More "
    "info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"
)
_KIND_DOC = (
    "Kind is a string value representing the REST resource this object represents. Servers may infer "
    "this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More "
    "info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"
)
_METADATA_DOC = (
    "Standard object's metadata. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
)
_FIELD_VALIDATION_DOC = (
    "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) "
    "containing unknown or duplicate fields. Valid values are: Ignore, Warn, Strict."
)


@dataclass(frozen=True)
class ServedResource:
    """One served resource as its OpenAPI document describes it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    schema: Mapping[str, Any] | None = None  # a CRD version's openAPIV3Schema; None for built-ins

    @property
    def gv_path(self) -> str:
        """The key of its group version in ``/openapi/v3`` (``api/v1``, ``apis/<g>/<v>``)."""
        return f"api/{self.version}" if not self.group else f"apis/{self.group}/{self.version}"

    @property
    def gvk(self) -> dict[str, str]:
        return {"group": self.group, "version": self.version, "kind": self.kind}

    @property
    def schema_name(self) -> str:
        """``io.prefixtune.v1alpha1.ServingDeployment`` (the group reversed), as the real builders name it."""
        group = ".".join(reversed(self.group.split("."))) if self.group else "io.k8s.api.core"
        return f"{group}.{self.version}.{self.kind}"


def _param(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "description": description,
        "schema": {"type": "string", "uniqueItems": True},
    }


_WRITE_PARAMS = (
    _param("dryRun", "When present, indicates that modifications should not be persisted."),
    _param(
        "fieldManager", "fieldManager is a name associated with the actor or entity making these changes."
    ),
    _param("fieldValidation", _FIELD_VALIDATION_DOC),
)


def _operation(res: ServedResource, action: str, verb: str, write: bool) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{res.schema_name}"}
    return {
        "description": f"{verb} {res.kind}",
        "operationId": f"{verb}{res.kind}",
        "parameters": list(_WRITE_PARAMS) if write else [],
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": res.gvk,
    }


def _paths(res: ServedResource) -> dict[str, dict[str, Any]]:
    prefix = f"/{res.gv_path}"
    collection = (
        f"{prefix}/namespaces/{{namespace}}/{res.plural}" if res.namespaced else f"{prefix}/{res.plural}"
    )
    paths = {
        collection: {
            "get": _operation(res, "list", "list", write=False),
            "post": _operation(res, "post", "create", write=True),
        },
        f"{collection}/{{name}}": {
            "get": _operation(res, "get", "read", write=False),
            "put": _operation(res, "put", "replace", write=True),
            "patch": _operation(res, "patch", "patch", write=True),
            "delete": _operation(res, "delete", "delete", write=False),
        },
    }
    if res.namespaced:
        paths[f"{prefix}/{res.plural}"] = {"get": _operation(res, "list", "listAllNamespaces", write=False)}
    return paths


def kind_schema(res: ServedResource) -> dict[str, Any]:
    """The ``components.schemas`` entry of a kind: the CRD's schema, or an open one for a built-in."""
    if res.schema is None:
        schema: dict[str, Any] = {
            "type": "object",
            "description": f"{res.kind} (a built-in kind: the sandbox's API server serves no schema for it)",
            "x-kubernetes-preserve-unknown-fields": True,
        }
    else:
        schema = copy.deepcopy(dict(res.schema))
    properties = schema.setdefault("properties", {})
    properties["apiVersion"] = {"type": "string", "description": _API_VERSION_DOC}
    properties["kind"] = {"type": "string", "description": _KIND_DOC}
    properties["metadata"] = {"type": "object", "description": _METADATA_DOC}
    schema["x-kubernetes-group-version-kind"] = [res.gvk]
    return schema


def group_version_document(resources: Sequence[ServedResource], server_version: str) -> dict[str, Any]:
    """The OpenAPI v3 document of one group version (all ``resources`` share it)."""
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for res in sorted(resources, key=lambda r: r.plural):
        paths.update(_paths(res))
        schemas[res.schema_name] = kind_schema(res)
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": server_version},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def document_hash(document: Mapping[str, Any]) -> str:
    """The ``hash`` of a document's ``serverRelativeURL`` (clients cache by it)."""
    return hashlib.sha512(json.dumps(document, sort_keys=True).encode()).hexdigest()[:128].upper()


def index(documents: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``GET /openapi/v3``: each group version's path and the URL of its document."""
    return {
        "paths": {
            key: {"serverRelativeURL": f"/openapi/v3/{key}?hash={document_hash(doc)}"}
            for key, doc in sorted(documents.items())
        }
    }


# -------------------------------------------------------------------------- fieldValidation=Strict


def unknown_fields(obj: Any, schema: Mapping[str, Any], path: str = "") -> list[str]:
    """The fields of ``obj`` its structural schema does not declare (what pruning would drop).

    As apiextensions-apiserver's strict decoding of custom resources: ``properties`` name the known
    fields, ``additionalProperties`` allows any key, ``x-kubernetes-preserve-unknown-fields`` keeps
    everything below, ``items`` applies to each list element; ``metadata`` is ObjectMeta's, not
    checked here (unknown ObjectMeta fields are rare and the server reports them elsewhere).
    """
    if schema.get("x-kubernetes-preserve-unknown-fields") is True:
        return []
    found: list[str] = []
    if isinstance(obj, Mapping):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        for key, value in obj.items():
            where = f"{path}.{key}" if path else str(key)
            if not path and key in ("apiVersion", "kind", "metadata"):
                continue
            if isinstance(properties, Mapping) and key in properties:
                found.extend(unknown_fields(value, properties[key], where))
            elif isinstance(additional, Mapping):
                found.extend(unknown_fields(value, additional, where))
            elif additional is True or (properties is None and additional is None):
                continue  # a map of anything, or an object the schema says nothing about
            else:
                found.append(where)
    elif isinstance(obj, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(obj):
            found.extend(unknown_fields(item, schema["items"], f"{path}[{i}]"))
    return found


def strict_decoding_message(fields: Sequence[str]) -> str:
    """The message of the 400 a Strict write with unknown fields gets."""
    return "strict decoding error: " + ", ".join(f'unknown field "{f}"' for f in fields)

"""Pydantic JSON schema -> Kubernetes structural OpenAPI v3 schema, and back to plain JSON Schema.

``structural_schema(Model)`` walks ``model_json_schema()``: $refs are inlined, ``anyOf [X, null]``
becomes X with ``nullable: true``, numeric exclusive bounds take the OpenAPI v3.0 boolean form,
``const`` becomes a one-value enum, titles and ``additionalProperties: false`` are dropped (the API
server prunes unknown fields instead). Anything that a structural schema cannot hold (a node without a
type, a real union) is an error here rather than a CRD the API server refuses.

``openapi_to_jsonschema`` is the inverse direction for tests and tools that validate objects with the
``jsonschema`` package.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

# JSONSchemaProps fields of apiextensions.k8s.io/v1 that the generator may emit.
_ALLOWED_KEYS = frozenset(
    {
        "description",
        "type",
        "format",
        "default",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "maxItems",
        "maxProperties",
        "minItems",
        "enum",
        "required",
        "items",
        "properties",
        "additionalProperties",
        "nullable",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-validations",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-int-or-string",
        "x-kubernetes-embedded-resource",
    }
)
_DROPPED_KEYS = frozenset({"title", "$defs", "definitions"})
PRESERVE = "x-kubernetes-preserve-unknown-fields"


class SchemaError(ValueError):
    """A pydantic schema node that has no structural OpenAPI equivalent."""


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    return _convert(raw, defs, model.__name__)


def _resolve_ref(ref: str, defs: Mapping[str, Any], where: str) -> dict[str, Any]:
    prefix = "#/$defs/"
    if not ref.startswith(prefix) or ref[len(prefix) :] not in defs:
        raise SchemaError(f"{where}: cannot resolve $ref {ref!r}")
    return dict(defs[ref[len(prefix) :]])


def _convert(node: Mapping[str, Any], defs: Mapping[str, Any], where: str) -> dict[str, Any]:
    node = dict(node)
    # $ref (and a one-element allOf) merge into the node; the node's own keys (description) win.
    if "$ref" in node:
        target = _resolve_ref(node.pop("$ref"), defs, where)
        node = {**target, **node}
    if "allOf" in node:
        parts = node.pop("allOf")
        if len(parts) != 1:
            raise SchemaError(f"{where}: allOf with {len(parts)} parts is not supported")
        node = {**_convert(parts[0], defs, where), **node}
    nullable = False
    if "anyOf" in node:
        options = node.pop("anyOf")
        non_null = [o for o in options if o != {"type": "null"}]
        if len(non_null) != 1:
            raise SchemaError(f"{where}: a union of {len(non_null)} types is not structural")
        nullable = len(non_null) < len(options)
        node = {**_convert(non_null[0], defs, where), **node}

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "default":
            if value is not None:
                out["default"] = copy.deepcopy(value)
        elif key in {"exclusiveMinimum", "exclusiveMaximum"} and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "properties":
            out[key] = {name: _convert(sub, defs, f"{where}.{name}") for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs, f"{where}[]")
        elif key == "additionalProperties":
            if isinstance(value, Mapping):
                out[key] = _convert(value, defs, f"{where}.*")
            elif value is True and not node.get(PRESERVE):
                raise SchemaError(f"{where}: free-form object needs {PRESERVE}")
            # False: structural schemas prune unknown fields instead.
        elif key == "required":
            out[key] = sorted(value)
        elif key in _ALLOWED_KEYS:
            out[key] = copy.deepcopy(value)
        else:
            raise SchemaError(f"{where}: schema keyword {key!r} has no structural equivalent")
    if nullable:
        out["nullable"] = True
    if out.get(PRESERVE):
        out.pop("additionalProperties", None)  # preserved as-is; the model validates the values
    if "type" not in out and not out.get(PRESERVE) and not out.get("x-kubernetes-int-or-string"):
        raise SchemaError(f"{where}: every structural schema node needs a type")
    if "enum" in out and "type" not in out:
        raise SchemaError(f"{where}: enum without a type")
    return out


def openapi_to_jsonschema(schema: Mapping[str, Any], *, forbid_unknown: bool = False) -> dict[str, Any]:
    """An OpenAPI v3.0 (Kubernetes) schema as JSON Schema draft 2020-12.

    ``nullable`` becomes a ``null`` type, boolean exclusive bounds become numeric ones, and the
    ``x-kubernetes-*`` extensions are dropped (CEL rules are not evaluated). With ``forbid_unknown``
    an object with declared properties rejects other fields, as ``kubectl --validate=strict`` does.
    """
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key == "properties":
            out[key] = {k: openapi_to_jsonschema(v, forbid_unknown=forbid_unknown) for k, v in value.items()}
        elif key == "items" or (key == "additionalProperties" and isinstance(value, Mapping)):
            out[key] = openapi_to_jsonschema(value, forbid_unknown=forbid_unknown)
        elif key in {"exclusiveMinimum", "exclusiveMaximum"}:
            if value is True:
                out[key] = schema["minimum" if key == "exclusiveMinimum" else "maximum"]
        else:
            out[key] = copy.deepcopy(value)
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in out:
            out.pop("minimum" if key == "exclusiveMinimum" else "maximum", None)
    if schema.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if forbid_unknown and "properties" in out and not schema.get(PRESERVE):
        out.setdefault("additionalProperties", False)
    return out


def lookup(schema: Mapping[str, Any], loc: tuple[str | int, ...]) -> Mapping[str, Any] | None:
    """The schema node at ``loc`` (field names and list indexes), or None where it has none."""
    node: Mapping[str, Any] | None = schema
    for part in loc:
        if node is None:
            return None
        if isinstance(part, int):
            node = node.get("items")
        elif part in node.get("properties", {}):
            node = node["properties"][part]
        elif isinstance(node.get("additionalProperties"), Mapping):
            node = node["additionalProperties"]
        else:
            return None
    return node

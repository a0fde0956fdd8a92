"""Validation of a ServingDeployment with errors a user can act on.

``validate_spec(raw)`` returns ``(spec, [])`` or ``(None, errors)``; each ``FieldError`` has a path
("spec.config.blockSize") and a message that names the allowed values. Pydantic's own errors are
translated: the allowed values are read from the same structural schema the CRD is generated from,
so the CRD, the messages and the models cannot disagree.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from prefixtune.api.durations import DURATION_EXAMPLES, DURATION_PATTERN
from prefixtune.api.models import (
    EXTRA_ARG_PATTERN,
    MODEL_PATTERN,
    SHELL_METACHARACTERS_TEXT,
    URL_PATTERN,
    ServingDeployment,
    ServingDeploymentSpec,
)
from prefixtune.api.rules import COLLECT_KEY, show
from prefixtune.api.schema import lookup, structural_schema
from prefixtune.api.secret_flags import SECRET_WORDS
from prefixtune.api.yaml11 import STRING_HINT, quote_hint

_MAX_SHOWN = 80
# Words of a flag name that carry a credential (vLLM and SGLang --api-key; --hf-token and the like).
_SECRET_WORDS = SECRET_WORDS
# Shorter secret values are redacted only where quoted whole (a bare "1" occurs in many messages).
_MIN_SECRET_LENGTH = 4
_PATTERN_WORDS = {
    EXTRA_ARG_PATTERN: f"without shell metacharacters ({SHELL_METACHARACTERS_TEXT})",
    MODEL_PATTERN: "without spaces, not starting with '-'",
}


@dataclass(frozen=True)
class FieldError:
    path: str  # "spec.config.blockSize", "spec.extraArgs[3]"
    message: str  # what is wrong and what is allowed

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """Raised by ``parse_spec``/``parse_resource``: every FieldError, one per line."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


def validate_spec(raw: object) -> tuple[ServingDeploymentSpec | None, list[FieldError]]:
    """Validate the ``spec`` of a ServingDeployment (the mapping under ``spec:``)."""
    if not isinstance(raw, Mapping):
        return None, [FieldError("spec", f"must be an object (a mapping), got {_type_name(raw)}")]
    spec, errors = _validate(ServingDeploymentSpec, dict(raw), ("spec",))
    assert spec is None or isinstance(spec, ServingDeploymentSpec)
    return spec, redact_errors(errors, secret_values(raw))


def validate_resource(raw: object) -> tuple[ServingDeployment | None, list[FieldError]]:
    """Validate a whole ServingDeployment object (apiVersion, kind, metadata, spec, status)."""
    if not isinstance(raw, Mapping):
        return None, [FieldError("", f"must be an object (a mapping), got {_type_name(raw)}")]
    resource, errors = _validate(ServingDeployment, dict(raw), ())
    assert resource is None or isinstance(resource, ServingDeployment)
    return resource, redact_errors(errors, secret_values(raw.get("spec")))


def secret_values(raw_spec: object) -> list[str]:
    """Values of secret-bearing flags in a raw spec's extraArgs (``--api-key K``, ``--api-key=K``):
    messages end up in Events and logs, so they must never quote these."""
    args = raw_spec.get("extraArgs", raw_spec.get("extra_args")) if isinstance(raw_spec, Mapping) else None
    if not isinstance(args, list):
        return []
    found: list[str] = []
    for i, item in enumerate(args):
        if not isinstance(item, str) or not item.startswith("-"):
            continue
        name, eq, inline = item.partition("=")
        if not set(re.split(r"[-_.]+", name.lower())) & _SECRET_WORDS:
            continue
        if eq:
            found.append(inline)
        elif i + 1 < len(args) and isinstance(args[i + 1], str):
            found.append(args[i + 1])
    return [value for value in found if value]


def redact_errors(errors: list[FieldError], secrets: Sequence[str]) -> list[FieldError]:
    """``errors`` with every secret value replaced by ``***`` (whole values, also inside reprs)."""
    if not secrets:
        return errors
    out = []
    for err in errors:
        message = err.message
        for secret in sorted(secrets, key=len, reverse=True):
            message = message.replace(repr(secret), "'***'")
            if len(secret) >= _MIN_SECRET_LENGTH:
                message = message.replace(secret, "***").replace(repr(secret)[1:-1], "***")
        out.append(FieldError(err.path, message))
    return out


def parse_spec(raw: object) -> ServingDeploymentSpec:
    spec, errors = validate_spec(raw)
    if spec is None:
        raise SpecError(errors)
    return spec


def parse_resource(raw: object) -> ServingDeployment:
    resource, errors = validate_resource(raw)
    if resource is None:
        raise SpecError(errors)
    return resource


def _validate(
    model: type[BaseModel], raw: dict[str, Any], prefix: tuple[str, ...]
) -> tuple[BaseModel | None, list[FieldError]]:
    collected: list[tuple[str, str]] = []
    errors: list[FieldError] = []
    result: BaseModel | None = None
    try:
        result = model.model_validate(raw, context={COLLECT_KEY: collected})
    except ValidationError as exc:
        errors = [_translate(err, model, prefix) for err in exc.errors(include_url=False)]
    # Rule problems are relative to spec, wherever the spec sits.
    errors += [FieldError(f"spec.{path}", message) for path, message in collected]
    errors = list(dict.fromkeys(errors))  # pydantic's order (the input's), then the rules' order
    return (None if errors else result), errors


@cache
def _schema(model: type[BaseModel]) -> Mapping[str, Any]:
    return structural_schema(model)


def _format_path(parts: Sequence[str | int]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "list"
    return type(value).__name__


def _shown(value: object) -> str:
    text = show(value) if isinstance(value, str | int | float | bool) else f"{_type_name(value)}"
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _bound(value: object) -> str:
    return show(value)


def describe(node: Mapping[str, Any] | None) -> str:
    """What a schema node allows, in words ("an integer in [1, 8]", "vllm, sglang, trtllm")."""
    if node is None:
        return "see the CRD schema (prefixtune crd)"
    if "enum" in node:
        return ", ".join(show(v) if not isinstance(v, str) else v for v in node["enum"])
    kind = node.get("type")
    if kind in {"integer", "number"}:
        word = "an integer" if kind == "integer" else "a number"
        low, high = node.get("minimum"), node.get("maximum")
        low_open, high_open = bool(node.get("exclusiveMinimum")), bool(node.get("exclusiveMaximum"))
        if low is not None and high is not None:
            left, right = ("(" if low_open else "["), (")" if high_open else "]")
            return f"{word} in {left}{_bound(low)}, {_bound(high)}{right}"
        if low is not None:
            return f"{word} {'>' if low_open else '>='} {_bound(low)}"
        if high is not None:
            return f"{word} {'<' if high_open else '<='} {_bound(high)}"
        return word
    if kind == "boolean":
        return "true or false"
    if kind == "string":
        if node.get("pattern") == DURATION_PATTERN:
            return f"a duration such as {DURATION_EXAMPLES}"
        if node.get("pattern") == URL_PATTERN:
            return "an http(s) URL, e.g. http://prometheus.monitoring:9090"
        if node.get("format") == "date-time":
            return "an RFC 3339 time with a zone, e.g. 2025-01-31T12:00:00Z"
        parts = ["a non-empty string" if node.get("minLength", 0) >= 1 else "a string"]
        if "maxLength" in node:
            parts.append(f"of at most {node['maxLength']} characters")
        if "pattern" in node:
            parts.append(_PATTERN_WORDS.get(node["pattern"], f"matching {node['pattern']}"))
        return " ".join(parts)
    if kind == "array":
        limits = []
        if node.get("minItems"):
            limits.append(f"at least {node['minItems']}")
        if "maxItems" in node:
            limits.append(f"at most {node['maxItems']}")
        size = f" ({' and '.join(limits)} items)" if limits else ""
        return f"a list{size}, each item {describe(node.get('items'))}"
    if kind == "object":
        fields = sorted(node.get("properties", {}))
        return f"an object with fields {', '.join(fields)}" if fields else "an object"
    return str(kind)


_TYPE_ERRORS = {
    "int_type",
    "int_parsing",
    "int_from_float",
    "float_type",
    "float_parsing",
    "bool_type",
    "bool_parsing",
    "string_type",
    "list_type",
    "dict_type",
    "model_type",
    "model_attributes_type",
    "datetime_type",
    "datetime_parsing",
    "datetime_from_date_parsing",
    "finite_number",
}
_BOUND_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
_LENGTH_ERRORS = {"string_too_short", "string_too_long", "too_short", "too_long"}


def _translate(err: ErrorDetails, model: type[BaseModel], prefix: tuple[str, ...]) -> FieldError:
    loc = tuple(err["loc"])
    schema = _schema(model)
    node = lookup(schema, loc)
    path = _format_path(prefix + loc) or "(object)"
    kind = err["type"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    allowed = describe(node)
    if kind == "missing":
        message = f"required field is missing; allowed: {allowed}"
    elif kind == "extra_forbidden":
        parent = lookup(schema, loc[:-1]) or {}
        fields = sorted(parent.get("properties", {}))
        name = str(loc[-1])
        close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6) or [
            f for f in fields if f.lower() == name.lower()
        ]
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        message = f"unknown field {name!r}{hint}; allowed fields: {', '.join(fields)}"
    elif kind in {"enum", "literal_error"}:
        message = f"{_shown(value)} is not allowed; allowed: {allowed}"
        quoting = _boolean_hint(loc, value, node)
        if quoting:
            message = f"{message}; {quoting}"
    elif kind == "timezone_aware":
        message = f"{_shown(value)} has no time zone; allowed: {allowed}"
    elif kind in _TYPE_ERRORS:
        # A scalar is shown ("got string 'x'"); null, lists and objects by their type alone.
        shown = f" {_shown(value)}" if isinstance(value, str | int | float) else ""
        message = f"expected {allowed}, got {_type_name(value)}{shown}"
        if isinstance(value, bool) and (node or {}).get("type") == "string":
            message = f"{message}; {STRING_HINT}"
        if kind == "finite_number":
            message = f"must be a finite number; allowed: {allowed}"
    elif kind in _BOUND_ERRORS:
        message = f"{_shown(value)} is out of range; allowed: {allowed}"
    elif kind in _LENGTH_ERRORS:
        size = ctx.get("actual_length", len(value) if isinstance(value, str | list) else "?")
        unit = "characters" if kind.startswith("string") else "items"
        message = f"has {size} {unit}; allowed: {allowed}"
    elif kind == "string_pattern_mismatch":
        message = f"{_shown(value)} does not match the required form; allowed: {allowed}"
    elif kind in {"value_error", "assertion_error"} and "error" in ctx:
        message = str(ctx["error"])
    else:
        message = f"{err['msg']}; allowed: {allowed}"
    return FieldError(path, message)


def _boolean_hint(loc: tuple[str | int, ...], value: object, node: Mapping[str, Any] | None) -> str | None:
    """A boolean where an enum allows a word YAML 1.1 reads as that boolean (``mode: off`` is
    ``mode: false``): the advice to quote it."""
    if not isinstance(value, bool) or node is None or "enum" not in node:
        return None
    field = next((str(part) for part in reversed(loc) if isinstance(part, str)), "value")
    return quote_hint(field, value, node["enum"])

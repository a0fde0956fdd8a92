"""The JSONPath subset of CRD printer columns (client-go ``util/jsonpath``, missing keys allowed).

Fields (``.a.b``), ``['key']``, ``[n]``, ``[*]`` and ``[?(@.path=="value")]``: what printer columns
use in practice (``.status.conditions[?(@.type=="Ready")].status``). Anything else is a
``JsonPathError``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class JsonPathError(ValueError):
    """A printer column's JSONPath outside the subset evaluated here."""


_STEP = re.compile(
    r"""\.(?P<field>[A-Za-z0-9_-]+)
    | \[\s*'(?P<quoted>[^']*)'\s*\]
    | \[\s*(?P<index>-?\d+)\s*\]
    | \[\s*(?P<star>\*)\s*\]
    | \[\s*\?\(\s*@(?P<fpath>(?:\.[A-Za-z0-9_-]+)+)\s*==\s*(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)')\s*\)\s*\]""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class JsonPath:
    """A parsed printer-column JSONPath (``.status.conditions[?(@.type=="Ready")].status``)."""

    steps: tuple[tuple[str, Any], ...]

    @classmethod
    def parse(cls, text: str) -> JsonPath:
        body = text.strip()
        if body.startswith("{") and body.endswith("}"):
            body = body[1:-1].strip()
        if body.startswith("$"):
            body = body[1:]
        steps: list[tuple[str, Any]] = []
        pos = 0
        while pos < len(body):
            match = _STEP.match(body, pos)
            if match is None:
                raise JsonPathError(f"unrecognized column definition {text!r} (at {body[pos:]!r})")
            if match["field"] is not None or match["quoted"] is not None:
                steps.append(("key", match["field"] if match["field"] is not None else match["quoted"]))
            elif match["index"] is not None:
                steps.append(("index", int(match["index"])))
            elif match["star"] is not None:
                steps.append(("all", None))
            else:
                wanted = match["dq"] if match["dq"] is not None else match["sq"]
                steps.append(("filter", (tuple(match["fpath"].split(".")[1:]), wanted)))
            pos = match.end()
        if not steps:
            raise JsonPathError(f"unrecognized column definition {text!r}")
        return cls(tuple(steps))

    def find(self, obj: Any) -> list[Any]:
        """Every value the path reaches (missing keys are skipped, as ``AllowMissingKeys(true)``)."""
        current = [obj]
        for kind, arg in self.steps:
            found: list[Any] = []
            for value in current:
                keyed = kind == "key" and isinstance(value, Mapping) and arg in value
                if keyed or (kind == "index" and isinstance(value, list) and -len(value) <= arg < len(value)):
                    found.append(value[arg])
                elif kind == "all" and isinstance(value, list):
                    found.extend(value)
                elif kind == "all" and isinstance(value, Mapping):
                    found.extend(value.values())
                elif kind == "filter" and isinstance(value, list):
                    path, wanted = arg
                    found.extend(item for item in value if _dig(item, path) == wanted)
            current = found
        return current


def _dig(value: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def as_text(value: Any) -> str:
    """A JSONPath result printed as kubectl's jsonpath printer does for scalars."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)

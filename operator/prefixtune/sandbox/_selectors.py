"""Label and field selectors of list and watch requests, parsed once and matched as pure functions.

Label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``, joined
by commas (an AND). As on the real server, ``!=`` and ``notin`` also match objects without the label.

Field selectors: ``path=v``, ``path==v``, ``path!=v`` joined by commas, where ``path`` is a dotted
path into the object (``metadata.name``, ``metadata.namespace``, ``status.phase``, ``spec.nodeName``).
A missing field compares as the empty string. The real server accepts only a per-resource set of
field paths and rejects the others; this one accepts any path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_KEY = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SET_REQUIREMENT = re.compile(r"^(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_EQUALITY = re.compile(r"^(?P<key>[^=!\s]+)\s*(?P<op>==|=|!=)\s*(?P<value>\S*)$")


class SelectorError(ValueError):
    """A selector string that does not parse; the message names the parameter and the clause."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # one of: =, !=, in, notin, exists, !exists
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values  # != and notin


ObjectFilter = Callable[[Mapping[str, Any]], bool]


def _split_clauses(text: str) -> list[str]:
    """Split on commas that are not inside the parentheses of an ``in``/``notin`` set."""
    clauses, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            clauses.append(current.strip())
            current = ""
        else:
            current += char
    if depth != 0:
        raise SelectorError(f"labelSelector: unbalanced parentheses in {text!r}")
    clauses.append(current.strip())
    return [clause for clause in clauses if clause]


def _check_key(key: str, clause: str) -> str:
    if not _KEY.match(key):
        raise SelectorError(f"labelSelector: invalid label key {key!r} in {clause!r}")
    return key


def _check_value(value: str, clause: str) -> str:
    if len(value) > 63 or not _VALUE.match(value):
        raise SelectorError(f"labelSelector: invalid label value {value!r} in {clause!r}")
    return value


def parse_label_selector(text: str) -> list[Requirement]:
    requirements: list[Requirement] = []
    for clause in _split_clauses(text):
        if match := _SET_REQUIREMENT.match(clause):
            values = [v.strip() for v in match["values"].split(",")]
            requirements.append(
                Requirement(
                    _check_key(match["key"], clause),
                    match["op"],
                    frozenset(_check_value(v, clause) for v in values),
                )
            )
        elif match := _EQUALITY.match(clause):
            op = "!=" if match["op"] == "!=" else "="
            value = _check_value(match["value"], clause)
            requirements.append(Requirement(_check_key(match["key"], clause), op, frozenset({value})))
        elif clause.startswith("!"):
            requirements.append(Requirement(_check_key(clause[1:].strip(), clause), "!exists", frozenset()))
        elif " " not in clause:
            requirements.append(Requirement(_check_key(clause, clause), "exists", frozenset()))
        else:
            raise SelectorError(
                f"labelSelector: cannot parse {clause!r} (allowed: k=v, k==v, k!=v, k, !k, "
                "k in (a,b), k notin (a,b))"
            )
    return requirements


def parse_field_selector(text: str) -> list[tuple[str, str, str]]:
    """Parse into (dotted path, op, value) triples, op being '=' or '!='."""
    terms: list[tuple[str, str, str]] = []
    for clause in (c.strip() for c in text.split(",")):
        if not clause:
            continue
        match = _EQUALITY.match(clause)
        if match is None:
            raise SelectorError(f"fieldSelector: cannot parse {clause!r} (allowed: f=v, f==v, f!=v)")
        terms.append((match["key"], "!=" if match["op"] == "!=" else "=", match["value"]))
    return terms


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return ""
        value = value[part]
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def build_selector(label_selector: str | None, field_selector: str | None) -> ObjectFilter:
    """One predicate over whole objects for both selectors; raises SelectorError on bad input."""
    labels = parse_label_selector(label_selector) if label_selector else []
    fields = parse_field_selector(field_selector) if field_selector else []

    def selects(obj: Mapping[str, Any]) -> bool:
        obj_labels = (obj.get("metadata") or {}).get("labels") or {}
        if not all(req.matches(obj_labels) for req in labels):
            return False
        return all((_field_value(obj, path) == value) == (op == "=") for path, op, value in fields)

    return selects

"""Drift in the live children: the fields the operator owns, compared with what it renders.

Pure. ``owned_drift(rendered, live)`` names every field of ``spec`` / ``data`` the operator
rendered that the live object does not hold with the same value (``kubectl scale`` on the engine
Deployment: ``spec.replicas``; ``kubectl set image``: ``...containers[engine].image``), plus the
fields of the engine container and pod the operator owns whole even where it renders nothing
(``env``, ``args``, ``command``, ``resources``, ``volumeMounts``; the pod's ``volumes``,
``initContainers`` and what ``spec.pod`` sets: ``affinity``, ``imagePullSecrets``,
``priorityClassName``; a key added to its ``nodeSelector``): a ``kubectl set env`` there changes
what the engine runs, a node selector or affinity where it runs.

What the API server adds is not drift: a map field the operator did not render (the defaults
``imagePullPolicy``, ``terminationMessagePath``, a probe's ``timeoutSeconds``, another tool's
label) is left alone, an empty or false value the server omits counts as equal, and resource
quantities compare by value (``0.5`` and ``500m``, ``1024Mi`` and ``1Gi``). Lists of named items
(containers, ports, env, volumes) match by name; other lists by position.

The names come from the rendering (and list counts), never from the live object: a field or
container someone else added is counted, not quoted, so an Event cannot carry their text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from prefixtune.tuning.actions import Action, EmitEvent, SetCondition

MAX_FIELDS = 8  # fields named per object in an Event or condition; the rest are counted
# The top-level fields the operator renders and owns: a Deployment's or Service's spec, a ConfigMap's
# data, the router Role's rules and its RoleBinding's subjects (roleRef cannot change in place).
OWNED_TOP = ("spec", "data", "rules", "subjects")
OWNED_CONTAINER_KEYS = ("args", "command", "env", "envFrom", "resources", "volumeMounts")
OWNED_POD_KEYS = ("affinity", "imagePullSecrets", "initContainers", "priorityClassName", "volumes")
OWNED_POD_MAPS = ("nodeSelector",)  # rendered always; a key someone added is drift too
QUANTITY_KEYS = frozenset({"limits", "requests"})
DRIFT_REASON = "LiveDrift"  # the Event's reason, and the Degraded condition's while it lasts
RESTORED_REASON = "LiveObjectsRestored"
MAX_MESSAGE = 1024

_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$"
)
_SUFFIX = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip


@dataclass(frozen=True)
class Drift:
    """Owned fields of one child that someone else changed (restored by the operator)."""

    kind: str
    name: str
    fields: tuple[str, ...]

    def message(self) -> str:
        shown = ", ".join(self.fields[:MAX_FIELDS])
        more = len(self.fields) - MAX_FIELDS
        return f"{self.kind} {self.name}: {shown}" + (f" and {more} more" if more > 0 else "")


def quantity(value: object) -> Decimal | None:
    """A Kubernetes resource quantity's value (None when it is not one)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str):
        return None
    match = _QUANTITY.match(value.strip())
    if match is None:
        return None
    number, exponent, suffix = match.groups()
    try:
        base = Decimal(number)
        return base * (Decimal(10) ** int(exponent[1:]) if exponent else _SUFFIX[suffix or ""])
    except (InvalidOperation, ValueError):
        return None


def _empty(value: object) -> bool:
    return value is None or value is False or value == "" or value == 0 or value == [] or value == {}


def _same_scalar(want: object, have: object, quantities: bool) -> bool:
    if have is None and _empty(want):
        return True  # omitted by the server (omitempty)
    if quantities:
        a, b = quantity(want), quantity(have)
        if a is not None and b is not None:
            return a == b
    return (type(want) is type(have) and want == have) or (
        isinstance(want, int | float) and isinstance(have, int | float) and not isinstance(have, bool)
        and float(want) == float(have)
    )  # fmt: skip


def _named(items: Sequence[Any]) -> list[str] | None:
    names = [i.get("name") if isinstance(i, Mapping) else None for i in items]
    if not items or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        return None
    return [str(n) for n in names]


def _diff(want: Any, have: Any, path: str, out: list[str], quantities: bool = False) -> None:
    if isinstance(want, Mapping):
        if have is None and not want:
            return
        if not isinstance(have, Mapping):
            out.append(path)
            return
        for key in want:
            _diff(want[key], have.get(key), f"{path}.{key}", out, quantities or key in QUANTITY_KEYS)
        owned = (
            OWNED_CONTAINER_KEYS
            if re.search(r"\.(?:containers|initContainers)\[[^\]]+\]$", path)
            else OWNED_POD_KEYS
            if path.endswith(".template.spec")
            else ()
        )
        for key in owned:
            if key not in want and not _empty(have.get(key)):
                out.append(f"{path}.{key}")
        if path.endswith(".template.spec"):
            for key in OWNED_POD_MAPS:
                mine, theirs = want.get(key), have.get(key)
                if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
                    added = sum(1 for k in theirs if k not in mine)
                    if added:
                        out.append(f"{path}.{key} ({added} added)")
        return
    if isinstance(want, list):
        if have is None and not want:
            return
        if not isinstance(have, list):
            out.append(path)
            return
        names = _named(want)
        if names is None:
            if len(want) != len(have):
                out.append(path)
            elif all(not isinstance(w, Mapping | list) for w in want):
                if any(not _same_scalar(w, h, quantities) for w, h in zip(want, have, strict=True)):
                    out.append(path)
            else:
                for i, (w, h) in enumerate(zip(want, have, strict=True)):
                    _diff(w, h, f"{path}[{i}]", out, quantities)
            return
        by_name = {h.get("name"): h for h in have if isinstance(h, Mapping)}
        for name, item in zip(names, want, strict=True):
            if name not in by_name:
                out.append(f"{path}[{name}]")
            else:
                _diff(item, by_name[name], f"{path}[{name}]", out, quantities)
        added = sum(1 for h in have if not (isinstance(h, Mapping) and h.get("name") in names))
        if added:
            out.append(f"{path} ({added} added)")
        return
    if not _same_scalar(want, have, quantities):
        out.append(path)


def owned_drift(rendered: Mapping[str, Any], live: Mapping[str, Any]) -> tuple[str, ...]:
    """The owned fields of ``live`` that differ from ``rendered`` (paths like ``spec.replicas``)."""
    out: list[str] = []
    for top in OWNED_TOP:
        if top in rendered:
            _diff(rendered[top], live.get(top), top, out)
    return tuple(out)


def drift_message(drift: Sequence[Drift]) -> str:
    text = "changed outside the operator, restored: " + "; ".join(d.message() for d in drift)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def drift_actions(
    drift: Sequence[Drift], conditions: Sequence[Mapping[str, Any]], settled: bool
) -> list[Action]:
    """What the status and Events say about drift: ``Degraded=True`` (``LiveDrift``, naming the
    fields) while it is found, a Warning Event when that finding is new (another controller that
    keeps changing a field gets one Event, not one a tick), and ``Degraded=False`` once nothing
    drifted and the children are ``settled`` (ready on what the operator renders). A Degraded
    condition set for another reason (a failed rollback) is left as it is."""
    degraded = next((c for c in conditions if c.get("type") == "Degraded"), None)
    held = degraded is not None and degraded.get("status") == "True"
    other = held and degraded is not None and degraded.get("reason") != DRIFT_REASON
    ours = held and not other
    if drift:
        message = drift_message(drift)
        out: list[Action] = []
        if not other:
            out.append(SetCondition("Degraded", "True", DRIFT_REASON, message))
        if not (ours and degraded is not None and degraded.get("message") == message):
            out.append(EmitEvent("Warning", DRIFT_REASON, message))
        return out
    if ours and settled:
        return [
            SetCondition(
                "Degraded", "False", RESTORED_REASON, "the live objects run what the operator renders again"
            )
        ]
    return []


__all__ = [
    "DRIFT_REASON",
    "MAX_FIELDS",
    "RESTORED_REASON",
    "Drift",
    "drift_actions",
    "drift_message",
    "owned_drift",
    "quantity",
]

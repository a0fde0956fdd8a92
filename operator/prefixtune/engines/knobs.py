"""The tuned knobs as data: one registry, from which everything knob-shaped is derived.

Each ``Knob`` states once what the rest of the code used to restate: its engine-neutral name, its
kind (a fraction, an integer, a switch, a name), its camelCase spelling in the API, its display
labels, and whether OOM risk is monotone in it. From ``KNOBS`` come ``KnobConfig``'s conversions,
the API models' knob fields (``prefixtune.api.models``), ``SpaceOverride``, the search space's
dimensions, the optimizer's feasibility axes and key, camelCase and both display formats.

What a knob is on one engine (default, allowed values, flag binding) is the adapter's ``KnobSpec``
(``prefixtune.engines.base``); this module knows no engine.

Adding a knob: a ``Knob`` line in ``KNOBS``, its typed field in ``KnobConfig`` (checked against
``KNOBS`` at import), a ``KnobSpec`` with its binding in each adapter, and its consumer in the twin.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from enum import StrEnum

from pydantic.alias_generators import to_camel

Value = float | int | bool | str


class KnobKind(StrEnum):
    """What values a knob takes; decides its API type, its search dimension and its display."""

    FRACTION = "fraction"  # a share in (0, 1]: a continuous dimension, a {min, max} range in the API
    INTEGER = "integer"  # a few allowed integers: categorical
    SWITCH = "switch"  # on / off: categorical
    NAME = "name"  # a few allowed names: categorical


@dataclass(frozen=True)
class Knob:
    """One engine-neutral knob.

    ``oom_monotone``: OOM risk grows with the knob's value (the memory fraction; a step token budget,
    whose activations must fit outside the KV pool): the optimizer's feasibility model reasons along
    every such knob as one axis of a partial order (``OOM_AXES``), and configs equal in every other
    knob share a feasibility key. One axis must be the memory fraction (``MEMORY_KNOB``); an axis with
    ``log_scale`` (a size: the token budget) enters the classifier on its logarithm, and its values
    <= 0 (the engine's default, no limit) are ordered only against themselves. An axis is this flag.
    ``label`` names the knob in Event messages (``memory 0.9``); ``short`` in tables (``mem 0.90``),
    empty when the value speaks for itself (a policy name).
    """

    name: str
    kind: KnobKind
    label: str
    short: str
    config_doc: str  # spec.config.<camel> in the CRD
    space_doc: str  # spec.tuning.space.<camel> in the CRD
    oom_monotone: bool = False
    log_scale: bool = False

    @property
    def camel(self) -> str:
        return to_camel(self.name)

    @property
    def continuous(self) -> bool:
        return self.kind is KnobKind.FRACTION

    def coerce(self, value: object) -> Value:
        """The value as the knob's plain Python type (numpy scalars and ints-for-floats included)."""
        if self.kind is KnobKind.FRACTION:
            return float(value)  # type: ignore[arg-type]
        if self.kind is KnobKind.INTEGER:
            return int(value)  # type: ignore[call-overload, no-any-return]
        if self.kind is KnobKind.SWITCH:
            return bool(value)
        return str(value)

    def text(self, value: object, short: bool = False) -> str:
        """The value for people: ``mem 0.90`` (short) or ``memory 0.9``."""
        label = self.short if short else self.label
        if self.kind is KnobKind.FRACTION:
            shown = f"{float(value):.2f}" if short else f"{float(value):.3g}"  # type: ignore[arg-type]
        elif self.kind is KnobKind.SWITCH:
            shown = "on" if value else "off"
        elif self.kind is KnobKind.INTEGER:
            shown = str(int(value) if short else value)  # type: ignore[call-overload]
        else:
            shown = str(value)
        return f"{label} {shown}" if label else shown


# Knob names, engine-neutral. The policy, the API (camelCase) and the twin all use these.
MEMORY_FRACTION = "memory_fraction"
BLOCK_SIZE = "block_size"
PREFIX_CACHING = "prefix_caching"
SCHEDULE_POLICY = "schedule_policy"

KNOBS: tuple[Knob, ...] = (
    Knob(
        MEMORY_FRACTION,
        KnobKind.FRACTION,
        label="memory",
        short="mem",
        config_doc="Memory fraction with the engine's own meaning (vLLM: of total GPU memory; SGLang: "
        "weights + KV; TensorRT-LLM: of the memory free after weights).",
        space_doc="Range to search.",
        oom_monotone=True,
    ),
    Knob(
        BLOCK_SIZE,
        KnobKind.INTEGER,
        label="block",
        short="block",
        config_doc="KV block (page) size in tokens; valid sizes depend on the engine.",
        space_doc="Block sizes to try.",
    ),
    Knob(
        PREFIX_CACHING,
        KnobKind.SWITCH,
        label="caching",
        short="cache",
        config_doc="Automatic prefix caching (vLLM), radix cache (SGLang), block reuse (TensorRT-LLM).",
        space_doc="Prefix caching values to try.",
    ),
    Knob(
        SCHEDULE_POLICY,
        KnobKind.NAME,
        label="policy",
        short="",
        config_doc="Scheduling policy; valid values depend on the engine.",
        space_doc="Scheduling policies to try.",
    ),
)
KNOB_NAMES: tuple[str, ...] = tuple(knob.name for knob in KNOBS)
BY_NAME: Mapping[str, Knob] = {knob.name: knob for knob in KNOBS}
BY_CAMEL: Mapping[str, Knob] = {knob.camel: knob for knob in KNOBS}
OOM_AXES: tuple[Knob, ...] = tuple(knob for knob in KNOBS if knob.oom_monotone)  # the feasibility axes
(MEMORY_KNOB,) = (knob for knob in OOM_AXES if knob.kind is KnobKind.FRACTION)  # the KV pool's axis


def knob(name: str) -> Knob:
    """The knob named ``name`` (snake_case); KeyError naming the known knobs otherwise."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown knob {name!r}; known knobs: {', '.join(KNOB_NAMES)}") from None


@dataclass(frozen=True)
class KnobConfig:
    """One engine-neutral configuration: the values of the tuned knobs (one field per ``KNOBS`` entry,
    in its order; checked at import).

    ``memory_fraction`` keeps each engine's own meaning (vLLM: share of total GPU memory; SGLang:
    share for weights + KV; TensorRT-LLM: share of the memory left after weights and activations).
    The twin and the adapters normalise it to KV bytes; the tuner only needs it to be monotone.
    """

    memory_fraction: float
    block_size: int
    prefix_caching: bool
    schedule_policy: str

    def with_(self, **changes: object) -> KnobConfig:
        return replace(self, **changes)  # type: ignore[arg-type]

    def get(self, name: str) -> Value:
        return getattr(self, knob(name).name)  # type: ignore[no-any-return]

    def items(self) -> Iterator[tuple[Knob, Value]]:
        """(knob, value) in registry order."""
        for k in KNOBS:
            yield k, getattr(self, k.name)

    def coerced(self) -> KnobConfig:
        """Every value as its knob's plain Python type."""
        return KnobConfig.from_dict(self.to_dict())

    def to_dict(self) -> dict[str, Value]:
        return {k.name: k.coerce(value) for k, value in self.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> KnobConfig:
        return cls(**{k.name: k.coerce(data[k.name]) for k in KNOBS})  # type: ignore[arg-type]


if tuple(f.name for f in fields(KnobConfig)) != KNOB_NAMES:  # pragma: no cover - a registry edit
    raise TypeError(f"KnobConfig's fields must be the registry's knobs in order: {', '.join(KNOB_NAMES)}")


def memory_of(config: KnobConfig) -> float:
    """The memory fraction (the KV pool's axis of the feasibility model)."""
    return float(getattr(config, MEMORY_KNOB.name))


def categorical_key(config: KnobConfig) -> tuple[Value, ...]:
    """The knobs other than the memory one: configs with the same key differ only in memory."""
    return tuple(k.coerce(value) for k, value in config.items() if k is not MEMORY_KNOB)


def to_api(config: KnobConfig) -> dict[str, Value]:
    """The config in the API's camelCase (``status.currentConfig``, ``status.trials[].config``)."""
    return {k.camel: k.coerce(value) for k, value in config.items()}


def api_text(config: Mapping[str, object] | None) -> str:
    """``mem 0.90 · block 16 · cache on · fcfs`` for a camelCase knob config (``-`` when absent)."""
    if not config:
        return "-"
    parts = [k.text(config[k.camel], short=True) for k in KNOBS if config.get(k.camel) is not None]
    return " · ".join(parts) or "-"


def config_text(config: KnobConfig) -> str:
    """``memory 0.9, block 16, caching on, policy fcfs`` (Event messages)."""
    return ", ".join(k.text(value) for k, value in config.items())

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
A knob added after resources exist gives its ``KnobConfig`` field a default equal to its ``unset``
value (the engine's own default, flag not rendered), so configs stored before it (trials in a
status, positional constructions) still read: they ran with the engine's default.

The batch limits (``max_batched_tokens``, ``max_running``) are such knobs: ``unset`` = 0 means "the
flag is not rendered; the engine resolves its own default" (vLLM by device memory and name, SGLang's
running cap from the KV pool). Where the adapter can name the engine's default for a GPU,
``default_config_for`` fills the real number in (``prefixtune.engines.base.Hardware``).

The routing knobs (``ROUTER_KNOBS``: the router's policy and its cache-aware thresholds) are knobs like
the others for the tuner, the status and the space, but no engine flag carries them: ``restarts`` says
a change restarts the router, not the engines (trial pricing and the apply path read it through
``restarts_of``). Their baseline is spec.routing, not spec.config (``ENGINE_KNOBS`` are spec.config's
fields); their ``unset`` values are the routers' own defaults (``prefixtune.routing.policy``), the
policy's is ``auto`` (spec.routing decides, ``prefixtune.routing.settings``). Every adapter carries
the same routing specs, with no binding (``prefixtune.engines._common.ROUTING_SPECS``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from enum import StrEnum

from pydantic.alias_generators import to_camel

from prefixtune.routing.policy import AUTO_POLICY, CacheAwareThresholds

Value = float | int | bool | str


class KnobKind(StrEnum):
    """What values a knob takes; decides its API type, its search dimension and its display."""

    FRACTION = "fraction"  # a share in (0, 1]: a continuous dimension, a {min, max} range in the API
    INTEGER = "integer"  # a few allowed integers: categorical
    SWITCH = "switch"  # on / off: categorical
    NAME = "name"  # a few allowed names: categorical
    NUMBER = "number"  # a real number within bounds (not a share), a few of them searched: categorical


class Restarts(StrEnum):
    """What a change of the knob restarts: the engine pods, or only the router in front of them."""

    ENGINE = "engine"
    ROUTER = "router"


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
    ``low`` / ``high``: an integer or number knob's structural bounds in the API (each engine narrows
    them).
    ``unset``: the value that means "the engine's own default, flag not rendered" (None: the knob
    always has a value); a config that predates the knob reads as it.
    ``log_scale``: the knob's values are searched on a log scale (the token budget).
    ``restarts``: what a change of the knob restarts (the engines, or only the router).
    """

    name: str
    kind: KnobKind
    label: str
    short: str
    config_doc: str  # spec.config.<camel> in the CRD
    space_doc: str  # spec.tuning.space.<camel> in the CRD
    oom_monotone: bool = False
    low: int | float | None = None
    high: int | float | None = None
    unset: Value | None = None
    log_scale: bool = False
    restarts: Restarts = Restarts.ENGINE

    @property
    def camel(self) -> str:
        return to_camel(self.name)

    @property
    def continuous(self) -> bool:
        return self.kind is KnobKind.FRACTION

    def coerce(self, value: object) -> Value:
        """The value as the knob's plain Python type (numpy scalars and ints-for-floats included)."""
        if self.kind in (KnobKind.FRACTION, KnobKind.NUMBER):
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
        elif self.unset is not None and value == self.unset and type(value) is type(self.unset):
            shown = "auto"  # the engine's own default
        elif self.kind is KnobKind.INTEGER:
            shown = str(int(value) if short else value)  # type: ignore[call-overload]
        elif self.kind is KnobKind.NUMBER:
            shown = f"{float(value):g}"  # type: ignore[arg-type]
        else:
            shown = str(value)
        return f"{label} {shown}" if label else shown


# Knob names, engine-neutral. The policy, the API (camelCase) and the twin all use these.
MEMORY_FRACTION = "memory_fraction"
BLOCK_SIZE = "block_size"
PREFIX_CACHING = "prefix_caching"
SCHEDULE_POLICY = "schedule_policy"
MAX_BATCHED_TOKENS = "max_batched_tokens"
MAX_RUNNING = "max_running"
ENGINE_DEFAULT = 0  # a batch limit's ``unset``: the engine resolves its own default
ROUTING_POLICY = "routing_policy"
CACHE_THRESHOLD = "cache_threshold"
BALANCE_ABS_THRESHOLD = "balance_abs_threshold"
BALANCE_REL_THRESHOLD = "balance_rel_threshold"
ROUTER_DEFAULTS = CacheAwareThresholds()  # the routers' own defaults: the thresholds' ``unset``

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
        low=1,
        high=4096,
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
    Knob(
        MAX_BATCHED_TOKENS,
        KnobKind.INTEGER,
        label="token budget",
        short="tokens",
        config_doc="Tokens one scheduler step may process (the prefill chunk plus the decode tokens): "
        "vLLM --max-num-batched-tokens, SGLang --chunked-prefill-size (-1: chunking off), TensorRT-LLM "
        "max_num_tokens. 0 leaves the engine's own default; omitted, the engine's default for "
        "spec.gpu.type. The tuner tries powers of two.",
        space_doc="Token budgets to try (searched on a log scale).",
        low=-1,
        high=1 << 20,
        unset=ENGINE_DEFAULT,
        log_scale=True,
        oom_monotone=True,
    ),
    Knob(
        MAX_RUNNING,
        KnobKind.INTEGER,
        label="running cap",
        short="running",
        config_doc="Requests in the running batch at most: vLLM --max-num-seqs, SGLang "
        "--max-running-requests, TensorRT-LLM max_batch_size. 0 leaves the engine's own default (SGLang "
        "derives it from the KV pool); omitted, the engine's default for spec.gpu.type.",
        space_doc="Running caps to try.",
        low=0,
        high=1 << 16,
        unset=ENGINE_DEFAULT,
    ),
    # The router's knobs (spec.routing; a change restarts only the router). Last: every adapter
    # appends the same specs after its engine's own (``prefixtune.engines._common.knob_table``).
    Knob(
        ROUTING_POLICY,
        KnobKind.NAME,
        label="routing",
        short="route",
        config_doc="The router's policy: kube-proxy (no router), a policy of the router, or auto.",
        space_doc="Routing policies to try (each must be one the router has).",
        unset=AUTO_POLICY,
        restarts=Restarts.ROUTER,
    ),
    Knob(
        CACHE_THRESHOLD,
        KnobKind.NUMBER,
        label="cache threshold",
        short="cache thr",
        config_doc="cache_aware: the least share of a request's text its longest cached prefix on a "
        "worker must exceed for the request to go there (the routers' --cache-threshold).",
        space_doc="Cache thresholds to try.",
        low=0.0,
        high=1.0,
        unset=ROUTER_DEFAULTS.cache_threshold,
        restarts=Restarts.ROUTER,
    ),
    Knob(
        BALANCE_ABS_THRESHOLD,
        KnobKind.INTEGER,
        label="balance abs",
        short="bal abs",
        config_doc="cache_aware: the load gap (requests in flight, max - min) above which the "
        "least-loaded worker takes the request when the relative threshold is also met "
        "(--balance-abs-threshold).",
        space_doc="Absolute balance thresholds to try.",
        low=0,
        high=1 << 20,
        unset=ROUTER_DEFAULTS.balance_abs_threshold,
        restarts=Restarts.ROUTER,
    ),
    Knob(
        BALANCE_REL_THRESHOLD,
        KnobKind.NUMBER,
        label="balance rel",
        short="bal rel",
        config_doc="cache_aware: the load ratio (max / min) above which the least-loaded worker "
        "takes the request when the absolute threshold is also met (--balance-rel-threshold).",
        space_doc="Relative balance thresholds to try.",
        low=1.0,
        high=1000.0,
        unset=ROUTER_DEFAULTS.balance_rel_threshold,
        restarts=Restarts.ROUTER,
    ),
)
KNOB_NAMES: tuple[str, ...] = tuple(knob.name for knob in KNOBS)
BY_NAME: Mapping[str, Knob] = {knob.name: knob for knob in KNOBS}
BY_CAMEL: Mapping[str, Knob] = {knob.camel: knob for knob in KNOBS}
ENGINE_KNOBS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.restarts is Restarts.ENGINE)  # spec.config
ROUTER_KNOBS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.restarts is Restarts.ROUTER)  # spec.routing
ENGINE_KNOB_NAMES: tuple[str, ...] = tuple(k.name for k in ENGINE_KNOBS)  # what an engine's command carries
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
    max_batched_tokens: int = ENGINE_DEFAULT
    max_running: int = ENGINE_DEFAULT
    routing_policy: str = AUTO_POLICY
    cache_threshold: float = ROUTER_DEFAULTS.cache_threshold
    balance_abs_threshold: int = ROUTER_DEFAULTS.balance_abs_threshold
    balance_rel_threshold: float = ROUTER_DEFAULTS.balance_rel_threshold

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
        """The config of ``data`` (snake_case names); a knob with an ``unset`` value may be missing
        (a config stored before the knob existed ran with the engine's default)."""
        values = {k.name: data[k.name] if k.unset is None or k.name in data else k.unset for k in KNOBS}
        return cls(**{name: BY_NAME[name].coerce(value) for name, value in values.items()})  # type: ignore[arg-type]


if tuple(f.name for f in fields(KnobConfig)) != KNOB_NAMES:  # pragma: no cover - a registry edit
    raise TypeError(f"KnobConfig's fields must be the registry's knobs in order: {', '.join(KNOB_NAMES)}")


if ENGINE_KNOBS + ROUTER_KNOBS != KNOBS:  # pragma: no cover - a registry edit
    raise TypeError("the router's knobs come after every engine knob in KNOBS")


def restarts_of(before: KnobConfig, after: KnobConfig) -> frozenset[Restarts]:
    """What moving from ``before`` to ``after`` restarts: nothing, the router, the engines, or both."""
    return frozenset(
        k.restarts for k in KNOBS if k.coerce(getattr(before, k.name)) != k.coerce(getattr(after, k.name))
    )


def memory_of(config: KnobConfig) -> float:
    """The memory fraction (the KV pool's axis of the feasibility model)."""
    return float(getattr(config, MEMORY_KNOB.name))


def categorical_key(config: KnobConfig) -> tuple[Value, ...]:
    """The knobs other than the memory one: configs with the same key differ only in memory."""
    return tuple(k.coerce(value) for k, value in config.items() if k is not MEMORY_KNOB)


def engine_dict(config: KnobConfig) -> dict[str, Value]:
    """The engine knobs of a config (snake_case): what an engine pod runs. A routing knob's change
    leaves it (and so the engine pods' config hash) as it was; for a config at the router's unset
    values it is the config's whole dict as it was before the routing knobs existed."""
    return {k.name: k.coerce(getattr(config, k.name)) for k in ENGINE_KNOBS}


def to_api(config: KnobConfig, knobs: tuple[Knob, ...] = KNOBS) -> dict[str, Value]:
    """The config in the API's camelCase (``status.currentConfig``, ``status.trials[].config``); only
    ``knobs`` (``ENGINE_KNOBS``: spec.config's fields)."""
    return {k.camel: k.coerce(getattr(config, k.name)) for k in knobs}


def api_text(config: Mapping[str, object] | None) -> str:
    """``mem 0.90 · block 16 · cache on · fcfs`` for a camelCase knob config (``-`` when absent)."""
    if not config:
        return "-"
    parts = [k.text(config[k.camel], short=True) for k in KNOBS if _shown(k, config.get(k.camel))]
    return " · ".join(parts) or "-"


def config_text(config: KnobConfig) -> str:
    """``memory 0.9, block 16, caching on, policy fcfs`` (Event messages)."""
    return ", ".join(k.text(value) for k, value in config.items() if _shown(k, value))


def _shown(knob: Knob, value: object) -> bool:
    """Whether a value is worth showing: set, and not a knob left to the engine's default."""
    return value is not None and not (knob.unset is not None and value == knob.unset)

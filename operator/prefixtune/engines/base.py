"""The protocol every engine adapter implements, and what one knob is on one engine (``KnobSpec``).

The tuning policy speaks only the engine-neutral knobs of ``prefixtune.engines.knobs`` (re-exported
here). Each adapter (vllm.py, sglang.py, trtllm.py) renders them
to the engine's real flags, parses the same flags back, lists valid values and defaults, and names
the engine's metrics. Nothing outside ``prefixtune.engines`` should know an engine flag.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar, runtime_checkable

from prefixtune.engines.knobs import (
    BLOCK_SIZE,
    BY_NAME,
    KNOB_NAMES,
    MAX_BATCHED_TOKENS,
    MAX_RUNNING,
    MEMORY_FRACTION,
    PREFIX_CACHING,
    SCHEDULE_POLICY,
    KnobConfig,
    KnobKind,
)

__all__ = [
    "BLOCK_SIZE",
    "KNOB_NAMES",
    "MAX_BATCHED_TOKENS",
    "MAX_RUNNING",
    "MEMORY_FRACTION",
    "PREFIX_CACHING",
    "SCHEDULE_POLICY",
    "Hardware",
    "KnobConfig",
]

GIB = 2**30


@dataclass(frozen=True)
class Hardware:
    """What an engine's own defaults read of the machine: the one value object through which a
    GPU-dependent default (vLLM's batch limits, SGLang's chunk and memory fraction) reaches a knob.

    ``KnobSpec.default`` is the engine's default on the reference GPU (``REFERENCE``); an adapter's
    ``default_config_for(hardware)`` is the engine's default on this one. The API fills spec.config
    from it (``api.rules.fill_defaults``) and the twin's scheduler defaults derive from it, so the
    fact lives in the adapter alone.
    """

    gpu_name: str  # the GPU as its driver names it, e.g. "H100-80GB" (vLLM keeps A100s small)
    memory_bytes: float  # one GPU's memory as CUDA reports it
    tensor_parallel: int = 1

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


# The GPU the GPU-neutral knob defaults are for: an H100-80GB as CUDA reports it (79.1 GiB; the same
# figure as the twin's GPU catalog, which a test checks).
REFERENCE = Hardware("H100-80GB", 79.1 * GIB)


T = TypeVar("T")


class EngineName(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"


def _no_tokens(value: Any) -> tuple[str, ...]:
    return ()


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Binding:
    """How one knob reaches one engine and is read back: the adapter's loops run on these.

    ``dest``: the flag dest that carries the knob on the command line ("" when none does);
    ``option``: its ``section.key`` in an options file the operator renders (TensorRT-LLM's YAML);
    ``render``: the knob's command-line tokens for a value (none when it goes to the options file);
    ``encode`` / ``decode``: the engine's value for a knob value and back (identity by default);
    ``label``: the label (or series) the engine reports the running value under ("" when it does not).
    """

    dest: str = ""
    option: str = ""
    render: Callable[[Any], tuple[str, ...]] = _no_tokens
    encode: Callable[[Any], object] = _same
    decode: Callable[[Any], object] = _same
    label: str = ""


@dataclass(frozen=True)
class KnobSpec:
    """What one knob may be on one engine.

    ``searched`` is False where the knob is not searched by default: it changes nothing the tuner
    can measure on this engine (vLLM's ``priority`` policy when requests carry no priority), or it
    matters only on some workloads (the batch limits). Such a knob stays at the base config's value
    unless ``spec.tuning.space`` lists it or the policy widens the space with it
    (``tuning/widening.py``).

    ``open_range``: an integer or number knob whose ``choices`` are only the values searched by default (a
    log-spaced ladder for the batch limits); any integer in [``low``, ``high``] is valid (a pin in
    spec.config, a listed space value, an adopted command's ``--max-num-seqs 48``).
    """

    name: str
    default: float | int | bool | str
    choices: tuple[float | int | bool | str, ...] = ()  # categorical values; empty for continuous
    low: float | None = None  # continuous bounds, inclusive
    high: float | None = None
    low_exclusive: bool = False
    searched: bool = True
    open_range: bool = False
    flag: str = ""  # the engine flag or option key the knob renders to, for messages
    doc: str = ""
    binding: Binding = field(default_factory=Binding, compare=False)

    @property
    def continuous(self) -> bool:
        return not self.choices

    def validate(self, value: object) -> str | None:
        """Return None when ``value`` is allowed, else a message naming the allowed values.

        The registry knob's ``unset`` value (0 for a batch limit: the engine's own default) is
        always allowed."""
        unset = BY_NAME[self.name].unset if self.name in BY_NAME else None
        if unset is not None and value == unset and type(value) is type(unset):
            return None
        if self.open_range:
            assert self.low is not None and self.high is not None
            if self.integer and (isinstance(value, bool) or not isinstance(value, int)):
                return f"must be an integer in {self.range_text()}; got {value!r}"
            if isinstance(value, bool) or not isinstance(value, int | float):
                return f"must be a number in {self.range_text()}; got {value!r}"
            if not self.low <= value <= self.high:
                return f"must be in {self.range_text()}, got {value}"
            return None
        if self.continuous:
            if isinstance(value, bool) or not isinstance(value, int | float):
                return f"must be a number in {self.range_text()}"
            assert self.low is not None and self.high is not None
            below = value <= self.low if self.low_exclusive else value < self.low
            if below or value > self.high:
                return f"must be in {self.range_text()}, got {value}"
            return None
        if value not in self.choices or type(value) is not type(self.choices[0]):
            allowed = ", ".join(str(c) for c in self.choices)
            return f"must be one of {allowed}; got {value!r}"
        return None

    @property
    def integer(self) -> bool:
        """Whether the knob takes integers only (its registry kind; a test adapter's knob: by choices)."""
        if self.name in BY_NAME:
            return BY_NAME[self.name].kind is KnobKind.INTEGER
        return bool(self.choices) and all(
            isinstance(c, int) and not isinstance(c, bool) for c in self.choices
        )

    def range_text(self) -> str:
        left = "(" if self.low_exclusive else "["
        whole = self.open_range and self.integer
        low, high = (int(v) if whole and v is not None else v for v in (self.low, self.high))
        return f"{left}{low}, {high}]"

    def allows(self, value: object, narrowed: Sequence[object]) -> bool:
        """Whether ``value`` is among ``narrowed`` (choices an engine narrowed by extra args): for an
        open range, whether it lies between their smallest and the range's top (an engine narrows a
        batch limit from below: vLLM's budget >= max_model_len); the knob's unset value always."""
        unset = BY_NAME[self.name].unset if self.name in BY_NAME else None
        if unset is not None and value == unset:
            return True
        if self.open_range:
            assert self.high is not None
            numbers = [float(v) for v in narrowed if isinstance(v, int | float)]
            return bool(numbers) and isinstance(value, int | float) and min(numbers) <= value <= self.high
        return value in narrowed


@dataclass(frozen=True)
class RenderedCommand:
    """What a container runs: command + args, plus files the engine reads (TensorRT-LLM's options YAML).

    ``files`` maps an absolute path inside the container to its content; the controller mounts
    them from a ConfigMap, the twin kubelet resolves them the same way.
    """

    command: tuple[str, ...]
    args: tuple[str, ...]
    files: Mapping[str, str] = field(default_factory=dict)

    @property
    def argv(self) -> tuple[str, ...]:
        return self.command + self.args


class EngineOptions(Mapping[str, object]):
    """The untuned options a command sets, by neutral key, in the order it sets them: the contract
    between the adapters and the twin. A mapping (``{**options}``, JSON, equality with a dict) with a
    typed accessor for each neutral option the twin reads; None where the command leaves it out.
    """

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, object] | None = None) -> None:
        self._values: dict[str, object] = dict(values or {})

    def __getitem__(self, key: str) -> object:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"EngineOptions({self._values!r})"

    def _typed(self, key: str, kind: type[T]) -> T | None:
        value = self._values.get(key)
        if value is None:
            return None
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ValueError(f"option {key} must be {kind.__name__}; got {value!r}")
        return value

    @property
    def tensor_parallel(self) -> int | None:
        return self._typed("tensor_parallel", int)

    @property
    def max_running(self) -> int | None:
        """Requests in one running batch (vLLM --max-num-seqs, SGLang --max-running-requests, ...)."""
        return self._typed("max_running", int)

    @property
    def max_batched_tokens(self) -> int | None:
        """Tokens per step; -1: SGLang's chunking off."""
        return self._typed("max_batched_tokens", int)

    @property
    def chunked_prefill(self) -> bool | None:
        return self._typed("chunked_prefill", bool)

    @property
    def kv_cache_dtype(self) -> str | None:
        return self._typed("kv_cache_dtype", str)

    @property
    def max_model_len(self) -> int | None:
        return self._typed("max_model_len", int)

    @property
    def host_cache_bytes(self) -> int | None:
        return self._typed("host_cache_bytes", int)

    @property
    def host_cache_backend(self) -> str | None:
        """vLLM's KV offload backend: native | lmcache."""
        return self._typed("host_cache_backend", str)

    @property
    def render_routes(self) -> bool | None:
        """The engine answers a router's render requests with the request's token ids
        (``prefixtune.routing.policy.EngineNeed.TOKEN_IDS``: vLLM's ``--enable-scale-out``)."""
        return self._typed("render_routes", bool)


@dataclass(frozen=True)
class ParsedCommand:
    """A command line read back: the model, the tuned knobs, and every other argument untouched."""

    engine: EngineName
    model: str
    config: KnobConfig
    port: int
    extra_args: tuple[str, ...] = ()
    options: EngineOptions = field(default_factory=EngineOptions)  # engine options not tuned (TRT YAML)
    tensor_parallel: int = 1  # effective TP degree (options["tensor_parallel"] only when the command sets it)

    def __post_init__(self) -> None:
        if not isinstance(self.options, EngineOptions):  # a plain mapping (tests, hand-built commands)
            object.__setattr__(self, "options", EngineOptions(self.options))


class ArgsError(ValueError):
    """A command line the engine itself would refuse (unknown value, missing model, bad number)."""


@dataclass(frozen=True)
class MetricNames:
    """The engine's Prometheus series, as scraped (counters with ``_total``), for the metrics layer.

    Fields that an engine lacks are empty strings. ``hit_*`` say in which unit the engine counts hits.
    """

    requests_running: str
    requests_waiting: str
    kv_usage: str  # gauge 0..1
    prompt_tokens: str  # counter
    generation_tokens: str  # counter
    requests_finished: str  # counter
    ttft: str  # histogram base name
    itl: str  # histogram base name: per-token gaps where the engine has them
    # histogram base name: each finished request's mean time per output token ("" if absent); the
    # SLO's ITL test of goodput is per request (a request meets it when this does)
    tpot: str
    e2e: str  # histogram base name
    preemptions: str  # counter ("" where the engine has none)
    hit_numerator: str  # counter of hit tokens (or blocks)
    hit_denominator: str  # counter of queried tokens (or blocks); "" where hits+misses is used
    hit_miss: str  # counter of missed blocks where the engine counts hits/misses (TRT-LLM)
    hit_unit: str  # "tokens" | "blocks"
    cached_prompt_tokens: str  # counter of prompt tokens served from cache ("" if absent)
    config_info: str  # gauge with the effective config as labels
    extra: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class EngineAdapter(Protocol):
    name: EngineName
    default_image: str
    metrics_port: int  # the port the engine serves HTTP (API, health and metrics) on
    metrics_path: str
    health_path: str  # liveness: the engine still works (may run a generation)
    ready_path: str  # readiness: cheap, answers "may I send requests" without running the model
    metrics: MetricNames  # every series of the newest supported version (metrics_for narrows it)
    mixed_batches: bool  # a prefill chunk shares a step with the running decodes
    chunked_prefill_default: bool  # a prompt over the token budget is split (else: refused)

    @property
    def budget_cuts_itl(self) -> bool:
        """A smaller token budget lowers the decodes' ITL spikes (mixed batches, chunked prefill)."""

    def knobs(self) -> Mapping[str, KnobSpec]:
        """Every engine-neutral knob with its valid values and default on this engine."""
        ...

    def prog(self, argv: Sequence[str]) -> str:
        """The program name the engine's own usage errors start with."""
        ...

    def display_flag(self, flag: str) -> str:
        """A flag as the engine's documentation spells it."""
        ...

    def starts(self, argv: Sequence[str]) -> bool:
        """Whether ``argv`` runs this engine."""
        ...

    def default_config(self) -> KnobConfig: ...

    def tuned_flags(self) -> frozenset[str]:
        """Flags (and their aliases) that the operator owns; extraArgs may not set them."""
        ...

    def routing_flags(self) -> frozenset[str]:
        """The owned flags (every spelling) that make the engine serve what a router in front of it
        needs; spec.routing decides them."""
        ...

    def validate(self, config: KnobConfig) -> list[tuple[str, str]]:
        """(knob, message) for every invalid value; empty when the config is valid."""
        ...

    def normalize(self, config: KnobConfig) -> KnobConfig:
        """Collapse equivalent configs (a cache-aware policy with caching off is plain fcfs)."""
        ...

    def render(
        self,
        model: str,
        config: KnobConfig,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        tensor_parallel: int = 1,
        ttft_slo_s: float | None = None,
        itl_slo_s: float | None = None,
    ) -> RenderedCommand:
        """The container command for ``config``; raises ArgsError for an invalid config or extra args."""
        ...

    def parse(self, argv: Sequence[str], files: Mapping[str, str] | None = None) -> ParsedCommand: ...

    def effective_config(self, samples: Sequence[tuple[str, Mapping[str, str], float]]) -> dict[str, object]:
        """Read the effective config back from scraped samples (name, labels, value)."""
        ...

    def version_of(self, image: str) -> str:
        """The engine release series an image runs (its tag read the engine's way); the default
        image's series for a tag it cannot read."""
        ...

    def metrics_for(self, version: str) -> MetricNames:
        """The series ``version`` exports: ``metrics`` with the fields it lacks blanked."""
        ...

    def allowed_choices(self, extra_args: Sequence[str]) -> Mapping[str, tuple[object, ...]]:
        """Knob values the engine accepts with these extra args, where the args narrow them."""
        ...

    def refused_for_version(self, version: str, extra_args: Sequence[str]) -> list[tuple[int, str]]:
        """(index, message) for extra args that parse but that ``version`` refuses at start."""
        ...

    def default_config_for(
        self, hardware: Hardware, pinned: Mapping[str, object] | None = None
    ) -> KnobConfig:
        """The engine's own defaults on ``hardware`` (where a default depends on it), for the knobs
        not in ``pinned``; a default that depends on another knob (SGLang's memory fraction on the
        chunk) follows the pinned value."""
        ...

    def cross_check(self, config: KnobConfig) -> list[tuple[str, str]]:
        """(knob, message) for every rule across knobs ``config`` breaks (vLLM: token budget >= running
        cap); empty when it breaks none. ``validate`` includes it."""
        ...

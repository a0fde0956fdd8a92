"""Behaviour shared by the three adapters: knob tables and validation, the checks around render, the
frame of parse (command head, scan, ParsedCommand), owned-flag checks, option and label extraction."""

from __future__ import annotations

import posixpath
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prefixtune.engines._argv import FlagTable, Role, Scan, owned_tokens
from prefixtune.engines.base import (
    BLOCK_SIZE,
    KNOB_NAMES,
    MEMORY_FRACTION,
    PREFIX_CACHING,
    ArgsError,
    Binding,
    EngineName,
    EngineOptions,
    Hardware,
    KnobConfig,
    KnobSpec,
    MetricNames,
    ParsedCommand,
    RenderedCommand,
)
from prefixtune.engines.knobs import (
    BALANCE_ABS_THRESHOLD,
    BALANCE_REL_THRESHOLD,
    BY_NAME,
    CACHE_THRESHOLD,
    ENGINE_DEFAULT,
    ENGINE_KNOB_NAMES,
    ROUTER_DEFAULTS,
    ROUTING_POLICY,
    KnobKind,
)
from prefixtune.engines.knobs import MAX_BATCHED_TOKENS as MAX_BATCHED_TOKENS
from prefixtune.engines.knobs import MAX_RUNNING as MAX_RUNNING
from prefixtune.routing.policy import ANY_ROUTER_NEEDS, EngineNeed, RoutingPolicy

# Neutral option keys in ParsedCommand.options (read by the digital twin). The batch limits are
# knobs: their option keys are the registry's names, set where the command sets the flag (the twin
# takes the engine's default for the GPU where it does not).
TENSOR_PARALLEL = "tensor_parallel"
CHUNKED_PREFILL = "chunked_prefill"
KV_CACHE_DTYPE = "kv_cache_dtype"
MAX_MODEL_LEN = "max_model_len"
HOST_CACHE_BYTES = "host_cache_bytes"
HOST_CACHE_BACKEND = "host_cache_backend"  # vLLM: native | lmcache
PARTIAL_REUSE = "partial_reuse"
EVICTION_POLICY = "eviction_policy"
HOST = "host"
RENDER_ROUTES = "render_routes"  # the engine answers a router's render requests (EngineNeed.TOKEN_IDS)

# The option that says a command serves a router's need (ParsedCommand.options, read by the twin).
NEED_OPTIONS: Mapping[EngineNeed, str] = {EngineNeed.TOKEN_IDS: RENDER_ROUTES}

DEFAULT_HOST = "0.0.0.0"


def knob_table(*specs: KnobSpec) -> Mapping[str, KnobSpec]:
    """An engine's knobs by name: every engine knob once, in registry order, then the routing knobs
    (``ROUTING_SPECS``, the same on every engine): every neutral knob, in KNOB_NAMES order."""
    names = tuple(spec.name for spec in specs)
    if names != ENGINE_KNOB_NAMES:
        raise ValueError(
            f"knob specs must be {', '.join(ENGINE_KNOB_NAMES)} in this order, got {', '.join(names)}"
        )
    table = {spec.name: spec for spec in (*specs, *ROUTING_SPECS)}
    assert tuple(table) == KNOB_NAMES, "ROUTING_SPECS must be the router's knobs in registry order"
    return table


# The router's knobs: no engine flag carries them (no binding: nothing rendered, nothing parsed), so
# they are the same on every engine; a change restarts only the router. Any policy of either router
# is a valid value here (the API refuses one the resource's router lacks); not searched by default.
ROUTING_SPECS: tuple[KnobSpec, ...] = (
    KnobSpec(
        name=ROUTING_POLICY,
        default=BY_NAME[ROUTING_POLICY].unset,  # type: ignore[arg-type]
        choices=tuple(policy.value for policy in RoutingPolicy),
        searched=False,
        flag="the router's --policy",
        doc="kube-proxy (no router) or a policy of the router; auto: the operator chooses.",
    ),
    KnobSpec(
        name=CACHE_THRESHOLD,
        default=ROUTER_DEFAULTS.cache_threshold,
        choices=(0.1, 0.3, 0.5, 0.7),
        low=0.0,
        high=1.0,
        open_range=True,
        searched=False,
        flag="the router's --cache-threshold",
        doc="Share of the text the longest cached prefix must exceed (cache_aware).",
    ),
    KnobSpec(
        name=BALANCE_ABS_THRESHOLD,
        default=ROUTER_DEFAULTS.balance_abs_threshold,
        choices=(8, 16, 32, 64, 128),
        low=0,
        high=BY_NAME[BALANCE_ABS_THRESHOLD].high,
        open_range=True,
        searched=False,
        flag="the router's --balance-abs-threshold",
        doc="Load gap (requests in flight) above which cache_aware balances instead.",
    ),
    KnobSpec(
        name=BALANCE_REL_THRESHOLD,
        default=ROUTER_DEFAULTS.balance_rel_threshold,
        choices=(1.1, 1.25, 1.5, 2.0, 4.0),
        low=1.0,
        high=BY_NAME[BALANCE_REL_THRESHOLD].high,
        open_range=True,
        searched=False,
        flag="the router's --balance-rel-threshold",
        doc="Load ratio (max / min) above which cache_aware balances instead.",
    ),
)


UNBOUND = Binding()  # a knob no flag carries (tests' adapters)


def router_in_front(config: KnobConfig) -> bool:
    """Whether a router may be in front of the engines running ``config``: its routing policy is
    anything but kube-proxy. ``auto`` counts: it puts a router in front with two replicas or more
    (``prefixtune.routing.settings.resolve_policy``), and a scale from one replica to two must not
    change the engines' command."""
    return str(config.get(ROUTING_POLICY)) != RoutingPolicy.KUBE_PROXY.value


def memory_fraction_knob(default: float, flag: str, doc: str, binding: Binding = UNBOUND) -> KnobSpec:
    """memory_fraction: a share of device memory in (0, 1] on every engine (what it is a share of differs)."""
    return KnobSpec(
        name=MEMORY_FRACTION,
        default=default,
        low=0.0,
        high=1.0,
        low_exclusive=True,
        flag=flag,
        doc=doc,
        binding=binding,
    )


def prefix_caching_knob(flag: str, doc: str, binding: Binding = UNBOUND) -> KnobSpec:
    """prefix_caching: an on/off switch, on by default on every engine."""
    return KnobSpec(
        name=PREFIX_CACHING, default=True, choices=(True, False), flag=flag, doc=doc, binding=binding
    )


def batch_limit_knob(
    name: str,
    choices: tuple[int, ...],
    flag: str,
    doc: str,
    binding: Binding = UNBOUND,
    low: int = 1,
) -> KnobSpec:
    """max_batched_tokens / max_running: any integer from ``low`` to the registry's bound is valid,
    ``choices`` (a log-spaced ladder) are searched; not searched by default (the policy adds them
    where they matter, a spec can list them). The default is ``ENGINE_DEFAULT``: the flag is not
    rendered and the engine resolves its own default; ``default_config_for`` names the number where
    the adapter knows it."""
    if name not in (MAX_BATCHED_TOKENS, MAX_RUNNING):
        raise ValueError(f"{name} is not a batch limit")
    return KnobSpec(
        name=name,
        default=ENGINE_DEFAULT,
        choices=choices,
        low=low,
        high=BY_NAME[name].high,
        open_range=True,
        searched=False,
        flag=flag,
        doc=doc,
        binding=binding,
    )


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    """``low``, 2 x ``low``, ... up to ``high`` (a log-spaced ladder of allowed values)."""
    if low < 1 or high < low:
        raise ValueError(f"need 1 <= low <= high, got {low}, {high}")
    values = [low]
    while values[-1] * 2 <= high:
        values.append(values[-1] * 2)
    return tuple(values)


def unless_default(flag: str) -> Callable[[Any], tuple[str, ...]]:
    """A renderer for a batch limit: ``flag VALUE``, nothing for ``ENGINE_DEFAULT``."""

    def render(value: Any) -> tuple[str, ...]:
        return () if int(value) == ENGINE_DEFAULT else (flag, str(int(value)))

    return render


def flag_value(flag: str, show: Callable[[Any], str] = str) -> Callable[[Any], tuple[str, ...]]:
    """A renderer: ``flag VALUE``."""

    def render(value: Any) -> tuple[str, ...]:
        return (flag, show(value))

    return render


def switch(on: str, off: str) -> Callable[[Any], tuple[str, ...]]:
    """A renderer for a boolean knob: the ``on`` token or the ``off`` one ("" renders nothing)."""

    def render(value: Any) -> tuple[str, ...]:
        token = on if value else off
        return (token,) if token else ()

    return render


class AdapterBase(ABC):
    """What every engine shares: knob bookkeeping, the checks around render, the frame of parse.

    A subclass states its engine's facts (command, port, flag table, knobs, metrics) and implements
    ``render_args`` (the knobs as the engine's flags), ``parse`` and ``effective_config``.
    """

    name: EngineName
    command: tuple[str, ...]  # what the operator renders
    command_aliases: tuple[tuple[str, ...], ...] = ()  # other entry points parse accepts
    default_port: int
    tp_dest: str  # the flag dest that carries the tensor-parallel degree
    table: FlagTable
    _knobs: Mapping[str, KnobSpec]

    metrics: MetricNames
    version: str  # the release series this adapter's facts are for (the default image's)
    default_image: str
    metrics_port: int
    metrics_path: str
    health_path: str
    ready_path: str = "/health"
    prog_words: int = 1  # how many leading argv words name the program in the engine's messages
    dashed_flags: bool = True  # the engine reads ``_`` in a flag name as ``-`` (argparse engines)
    # A prefill chunk shares a step with the running decodes (vLLM's chunked prefill, TensorRT-LLM's
    # in-flight batching), so the token budget bounds the decodes' step time; False where prefill
    # batches run apart from decode (SGLang without --enable-mixed-chunk).
    mixed_batches: bool = True
    # Chunked prefill on by default: a prompt longer than the token budget is split across steps.
    # False where the engine then refuses it instead: trtllm-serve leaves enable_chunked_prefill off,
    # and its LLM API refuses a prompt over max_num_tokens (tensorrt_llm/llmapi/llm.py
    # _check_arguments), so there the token budget is also the longest prompt served.
    chunked_prefill_default: bool = True
    # The owned switch (a flag dest of ``table``) that makes the engine serve each need a router may
    # have of it (``prefixtune.routing.policy.ROUTER_NEEDS``); none where the engine has no such
    # switch. Rendered on whenever a router may be in front (``routing_args``).
    need_flags: Mapping[EngineNeed, str] = {}

    @property
    def budget_cuts_itl(self) -> bool:
        """A smaller token budget lowers the decodes' ITL spikes: prefill chunks share steps with the
        decodes (``mixed_batches``) and a prompt over the budget is chunked, not refused."""
        return self.mixed_batches and self.chunked_prefill_default

    def knobs(self) -> Mapping[str, KnobSpec]:
        return self._knobs

    def prog(self, argv: Sequence[str]) -> str:
        """The program name the engine's own usage errors start with (``vllm serve: error: ...``)."""
        return " ".join(argv[: self.prog_words])

    def display_flag(self, flag: str) -> str:
        """A flag as the engine's documentation spells it."""
        return flag.replace("_", "-") if self.dashed_flags else flag

    def starts(self, argv: Sequence[str]) -> bool:
        """Whether ``argv`` runs this engine: its command or an alias, the program by its base name."""
        if not argv:
            return False
        head = (posixpath.basename(argv[0]), *argv[1:])
        return any(
            tuple(head[: len(accepted)]) == accepted for accepted in (self.command, *self.command_aliases)
        )

    def version_of(self, image: str) -> str:
        """One supported series unless the adapter knows several (TensorRT-LLM)."""
        return self.version

    def metrics_for(self, version: str) -> MetricNames:
        return self.metrics

    def allowed_choices(self, extra_args: Sequence[str]) -> Mapping[str, tuple[object, ...]]:
        return {}

    def refused_for_version(self, version: str, extra_args: Sequence[str]) -> list[tuple[int, str]]:
        return []

    def default_config_for(
        self, hardware: Hardware, pinned: Mapping[str, object] | None = None
    ) -> KnobConfig:
        """The knob defaults on ``hardware`` (``hardware_defaults``), ``pinned`` values kept."""
        pinned = dict(pinned or {})
        defaults = {**self.default_config().to_dict(), **self.hardware_defaults(hardware, pinned)}
        return KnobConfig.from_dict({**defaults, **{k: v for k, v in pinned.items() if v is not None}})

    def hardware_defaults(self, hardware: Hardware, pinned: Mapping[str, object]) -> dict[str, object]:
        """The knobs whose engine default depends on the hardware (or on a pinned knob): their values."""
        return {}

    def cross_check(self, config: KnobConfig) -> list[tuple[str, str]]:
        """Rules across knobs; none unless the engine has some (vLLM)."""
        return []

    def default_config(self) -> KnobConfig:
        return KnobConfig.from_dict({name: spec.default for name, spec in self._knobs.items()})

    def tuned_flags(self) -> frozenset[str]:
        return self.table.spellings(Role.OWNED, Role.FORBIDDEN)

    def routing_flags(self) -> frozenset[str]:
        """Every spelling of the ``need_flags`` switches (extraArgs may not set them: spec.routing does)."""
        flags = (self.table.by_dest(dest) for dest in self.need_flags.values())
        return frozenset(name for flag in flags for name in flag.spellings)

    def routing_args(self, config: KnobConfig) -> tuple[str, ...]:
        """The owned flags for a router in front (``router_in_front``): the switch of every need any
        router may have (``ANY_ROUTER_NEEDS``: the command does not know which router fronts it) that
        the engine has one for, in its canonical spelling. The same for every router policy, so a
        trial between them leaves the engines' command as it was; nothing under kube-proxy."""
        if not router_in_front(config):
            return ()
        return tuple(
            self.table.by_dest(dest).names[0]
            for need, dest in sorted(self.need_flags.items())
            if need in ANY_ROUTER_NEEDS
        )

    def owned_args(self, args: Sequence[str]) -> list[str]:
        """Tokens of ``args`` that set a flag the operator owns (``--x v`` and ``--x=v`` forms)."""
        return owned_tokens(self.table, args)

    def normalize(self, config: KnobConfig) -> KnobConfig:
        """Type coercion only; an engine where equivalent configs exist collapses them (SGLang)."""
        return config.coerced()

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
        """Check the inputs (model, config, extra args, port, TP, in this order), render, read back.

        ``ttft_slo_s``, ``itl_slo_s``: the SLO's targets, for engines whose histogram bounds the
        operator renders so that each target is a bound, counted exactly (SGLang)."""
        require_model(model)
        self.check_config(config)
        self.check_extra_args(extra_args)
        port = require_port(self.default_port if port is None else port)
        args = (*self.metric_args(ttft_slo_s, itl_slo_s), *self.routing_args(config), *extra_args)
        rendered = self.render_args(model, config, args, port, require_tensor_parallel(tensor_parallel))
        # What we render must read back: unknown extra flags and bad values fail here.
        parsed = self.parse(rendered.argv, rendered.files)
        if parsed.extra_args != tuple(extra_args):
            # An extra arg the engine would read otherwise: a stray value after an owned list flag
            # (SGLang's --bucket-time-to-first-token takes it as one more bucket).
            read = parsed.extra_args
            lost = extra_args[len(read) :] if tuple(extra_args[: len(read)]) == read else extra_args
            raise ArgsError(f"unrecognized arguments: {' '.join(lost)}")
        return rendered

    def metric_args(self, ttft_slo_s: float | None, itl_slo_s: float | None = None) -> tuple[str, ...]:
        """Owned flags that shape the engine's metrics (rendered before the extra args)."""
        return ()

    @abstractmethod
    def render_args(
        self, model: str, config: KnobConfig, extra_args: Sequence[str], port: int, tensor_parallel: int
    ) -> RenderedCommand:
        """The command for already checked inputs: the engine's flags for the knobs, then ``extra_args``."""

    def knob_args(self, config: KnobConfig) -> tuple[str, ...]:
        """Each knob's command-line tokens, in registry order (knobs bound to an options file: none)."""
        return tuple(
            token for knob, value in config.items() for token in self._knobs[knob.name].binding.render(value)
        )

    def knob_options(self, config: KnobConfig) -> dict[str, dict[str, object]]:
        """Each options-file knob's engine value, by section (``section.key`` bindings; "" is the top
        level), in order; a knob at its ``unset`` value is left out (the engine's default applies)."""
        sections: dict[str, dict[str, object]] = {}
        for knob, value in config.items():
            binding = self._knobs[knob.name].binding
            if knob.unset is not None and value == knob.unset:
                continue  # the engine's own default: not rendered
            if binding.option:
                section, _, key = binding.option.rpartition(".")
                sections.setdefault(section, {})[key] = binding.encode(value)
        return sections

    def knob_labels(self) -> tuple[tuple[str, str, Callable[[str], object]], ...]:
        """(label, knob, read) for each knob the engine reports running, for ``read_labels``."""
        return tuple(
            (spec.binding.label, name, LABEL_READERS[BY_NAME[name].kind])
            for name, spec in self._knobs.items()
            if spec.binding.label
        )

    def serving_args(self, port: int, tensor_parallel: int) -> tuple[str, ...]:
        """Where the engine listens and its TP degree (the TP flag in its first, canonical spelling)."""
        tp_flag = self.table.by_dest(self.tp_dest).names[0]
        return ("--host", DEFAULT_HOST, "--port", str(port), tp_flag, str(tensor_parallel))

    @abstractmethod
    def parse(self, argv: Sequence[str], files: Mapping[str, str] | None = None) -> ParsedCommand: ...

    @abstractmethod
    def effective_config(self, samples: Sequence[tuple[str, Mapping[str, str], float]]) -> dict[str, object]:
        """Read the effective config back from scraped samples (name, labels, value)."""

    def command_args(self, argv: Sequence[str]) -> list[str]:
        """The arguments after the command; ArgsError when ``argv`` does not start with an accepted one."""
        tokens = list(argv)
        for accepted in (self.command, *self.command_aliases):
            if tuple(tokens[: len(accepted)]) == accepted:
                return tokens[len(accepted) :]
        head = tuple(tokens[: len(self.command)])
        raise ArgsError(
            f"{self.name}: the command must start with {' '.join(self.command)!r}, got {' '.join(head)!r}"
        )

    def scan_args(self, args: Sequence[str], max_positionals: int = 0) -> Scan:
        """Scan the arguments (unknown flags and bad values fail) and refuse the forbidden flags."""
        scan = self.table.scan(args, max_positionals=max_positionals)
        self.refuse_forbidden(scan)
        return scan

    def parsed(
        self, scan: Scan, model: str, config: KnobConfig, options: Mapping[str, object]
    ) -> ParsedCommand:
        """The ParsedCommand for a scanned command: port, TP degree, the needs of a router it serves
        (``NEED_OPTIONS``, where it sets their switches) and untuned flags come from ``scan``."""
        served = {
            NEED_OPTIONS[need]: bool(scan.value(dest))
            for need, dest in self.need_flags.items()
            if scan.last(dest) is not None
        }
        return ParsedCommand(
            engine=self.name,
            model=model,
            config=config,
            port=scan.int_value("port", self.default_port),
            extra_args=self.extra_tokens(scan),
            options=EngineOptions({**options, **served}),
            tensor_parallel=scan.int_value(self.tp_dest, 1),
        )

    def validate(self, config: KnobConfig) -> list[tuple[str, str]]:
        errors = []
        for knob, value in config.items():
            message = self._knobs[knob.name].validate(plain(value))
            if message is not None:
                errors.append((knob.name, f"{self.name}: {knob.name} {message}"))
        return errors or self.cross_check(config)

    def check_config(self, config: KnobConfig) -> None:
        errors = self.validate(config)
        if errors:
            raise ArgsError("; ".join(message for _, message in errors))

    def check_extra_args(self, extra_args: Sequence[str]) -> None:
        owned = self.owned_args(extra_args)
        if owned:
            flags = ", ".join(owned)
            raise ArgsError(
                f"{self.name}: extra args may not set {flags}: the operator owns these flags "
                "(set the knob in spec.config, the router in spec.routing, or the model/port/tensor "
                "parallelism in the spec)"
            )

    def knob_value(self, knob: str, flag_name: str, value: object) -> object:
        """Check a value read from a command line against the knob's allowed values."""
        spec = self._knobs[knob]
        message = spec.validate(value)
        if message is not None:
            raise ArgsError(f"argument {flag_name}: {knob} {message} (prefixtune's {self.name} knob)")
        return value

    def config_from(
        self,
        scan: Scan,
        options: Mapping[str, Mapping[str, object]] | None = None,
        where: str = "",
    ) -> KnobConfig:
        """The knob config a command sets; engine defaults for knobs it leaves out.

        Each knob is read from its binding's flag dest on the command line, then from its
        ``section.key`` in ``options`` (an options file read at ``where``), which wins. Every value is
        decoded and checked against the knob.
        """
        chosen: dict[str, object] = {name: spec.default for name, spec in self._knobs.items()}
        for name, spec in self._knobs.items():
            dest = spec.binding.dest
            if dest and scan.last(dest) is not None:
                value = spec.binding.decode(scan.value(dest))
                chosen[name] = self.knob_value(name, flag_name(scan, dest), value)
        for name, spec in self._knobs.items():
            section, _, key = spec.binding.option.rpartition(".")
            given = (options or {}).get(section, {})
            if spec.binding.option and key in given:
                value = spec.binding.decode(given[key])
                chosen[name] = self.knob_value(name, f"{where}: {spec.binding.option}", value)
        return KnobConfig.from_dict(chosen)

    def refuse_forbidden(self, scan: Scan) -> None:
        for item in scan.items:
            if item.flag.role in (Role.FORBIDDEN, Role.REMOVED):
                raise ArgsError(f"argument {item.tokens[0].split('=', 1)[0]}: {item.flag.why}")

    @staticmethod
    def extra_tokens(scan: Scan) -> tuple[str, ...]:
        """The untuned flags, verbatim and in order (what ``render`` appends after the owned flags)."""
        return tuple(token for item in scan.items if item.flag.role is Role.OPTION for token in item.tokens)


def plain(value: object) -> object:
    """numpy scalars (what scikit-optimize hands back) as plain Python values; others unchanged."""
    item = getattr(value, "item", None)
    if type(value).__module__ == "numpy" and callable(item):
        return item()
    return value


def require_model(model: str) -> str:
    if not model or model.startswith("-"):
        raise ArgsError(f"model must be a non-empty name or path not starting with '-', got {model!r}")
    return model


def require_tensor_parallel(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgsError(f"tensor_parallel must be an integer >= 1, got {value!r}")
    return value


def require_port(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ArgsError(f"port must be an integer in [1, 65535], got {value!r}")
    return value


def label_bool(text: str) -> bool | None:
    lowered = text.strip().lower()
    if lowered in {"true", "1", "yes"}:
        return True
    if lowered in {"false", "0", "no"}:
        return False
    return None


def label_number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value else None


def label_int(text: str) -> int | None:
    number = label_number(text)
    return None if number is None else int(number)


def label_text(text: str) -> str | None:
    return text or None


# How a config-info label's text reads back, by the knob's kind.
LABEL_READERS: Mapping[KnobKind, Callable[[str], object]] = {
    KnobKind.FRACTION: label_number,
    KnobKind.INTEGER: label_int,
    KnobKind.SWITCH: label_bool,
    KnobKind.NAME: label_text,
    KnobKind.NUMBER: label_number,
}


def first_labels(
    samples: Sequence[tuple[str, Mapping[str, str], float]], series: str
) -> Mapping[str, str] | None:
    """The labels of the first sample of ``series`` (an engine's config-info gauge); None when absent."""
    return next((labels for name, labels, _ in samples if name == series), None)


def read_labels(
    labels: Mapping[str, str], wanted: Sequence[tuple[str, str, Callable[[str], object]]]
) -> dict[str, object]:
    """``{key: read(label text)}`` for each (label, key, read), in order; a label that is missing or
    unreadable (``read`` gives None) is left out."""
    found: dict[str, object] = {}
    for label, key, read in wanted:
        value = read(labels.get(label, ""))
        if value is not None:
            found[key] = value
    return found


def with_kv_tokens(found: dict[str, object]) -> dict[str, object]:
    """``found`` plus kv_tokens = kv_blocks x block_size where both are known (as ints)."""
    blocks, block = found.get("kv_blocks"), found.get(BLOCK_SIZE)
    if isinstance(blocks, int) and isinstance(block, int):
        found["kv_tokens"] = blocks * block
    return found


def options_from(scan: Scan, keys: Mapping[str, str]) -> dict[str, object]:
    """Neutral options for the scanned flags named in ``keys`` (dest -> option key); last one wins."""
    options: dict[str, object] = {}
    for item in scan.items:
        key = keys.get(item.flag.dest)
        if key is not None:
            options[key] = item.value
    return options


def flag_name(scan: Scan, dest: str) -> str:
    item = scan.last(dest)
    return "" if item is None else item.tokens[0].split("=", 1)[0]

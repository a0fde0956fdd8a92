"""Behaviour shared by the three adapters: knob validation, owned-flag checks, option extraction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prefixtune.engines._argv import FlagTable, Role, Scan, owned_tokens
from prefixtune.engines.base import (
    BLOCK_SIZE,
    KNOB_NAMES,
    MEMORY_FRACTION,
    PREFIX_CACHING,
    SCHEDULE_POLICY,
    ArgsError,
    EngineName,
    KnobConfig,
    KnobSpec,
)

# Neutral option keys in ParsedCommand.options (read by the digital twin).
TENSOR_PARALLEL = "tensor_parallel"
MAX_RUNNING = "max_running"
MAX_BATCHED_TOKENS = "max_batched_tokens"
CHUNKED_PREFILL = "chunked_prefill"
KV_CACHE_DTYPE = "kv_cache_dtype"
MAX_MODEL_LEN = "max_model_len"
HOST_CACHE_BYTES = "host_cache_bytes"
PARTIAL_REUSE = "partial_reuse"
EVICTION_POLICY = "eviction_policy"
HOST = "host"

DEFAULT_HOST = "0.0.0.0"


class AdapterBase:
    """Knob bookkeeping common to every engine; subclasses add render/parse/metrics."""

    name: EngineName
    table: FlagTable
    _knobs: Mapping[str, KnobSpec]

    def knobs(self) -> Mapping[str, KnobSpec]:
        return self._knobs

    def default_config(self) -> KnobConfig:
        return KnobConfig.from_dict({name: spec.default for name, spec in self._knobs.items()})

    def tuned_flags(self) -> frozenset[str]:
        return self.table.spellings(Role.OWNED, Role.FORBIDDEN)

    def owned_args(self, args: Sequence[str]) -> list[str]:
        """Tokens of ``args`` that set a flag the operator owns (``--x v`` and ``--x=v`` forms)."""
        return owned_tokens(self.table, args)

    def validate(self, config: KnobConfig) -> list[tuple[str, str]]:
        errors = []
        values = {
            MEMORY_FRACTION: plain(config.memory_fraction),
            BLOCK_SIZE: plain(config.block_size),
            PREFIX_CACHING: plain(config.prefix_caching),
            SCHEDULE_POLICY: plain(config.schedule_policy),
        }
        for knob in KNOB_NAMES:
            message = self._knobs[knob].validate(values[knob])
            if message is not None:
                errors.append((knob, f"{self.name}: {knob} {message}"))
        return errors

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
                "(set the knob in spec.config, or the model/port/tensor parallelism in the spec)"
            )

    def knob_value(self, knob: str, flag_name: str, value: object) -> object:
        """Check a value read from a command line against the knob's allowed values."""
        spec = self._knobs[knob]
        message = spec.validate(value)
        if message is not None:
            raise ArgsError(f"argument {flag_name}: {knob} {message} (prefixtune's {self.name} knob)")
        return value

    def config_from(
        self, scan: Scan, dests: Mapping[str, str], values: Mapping[str, tuple[str, object]] | None = None
    ) -> KnobConfig:
        """The knob config a command sets; engine defaults for knobs it leaves out.

        ``dests`` maps a knob to the flag dest that carries it; ``values`` gives knobs computed by the
        adapter (knob -> (flag name for messages, value)). Every value is checked against the knob.
        """
        chosen: dict[str, object] = {name: spec.default for name, spec in self._knobs.items()}
        for knob, dest in dests.items():
            if scan.last(dest) is not None:
                chosen[knob] = self.knob_value(knob, flag_name(scan, dest), scan.value(dest))
        for knob, (name, value) in (values or {}).items():
            chosen[knob] = self.knob_value(knob, name, value)
        return KnobConfig.from_dict(chosen)

    def refuse_forbidden(self, scan: Scan) -> None:
        for item in scan.items:
            if item.flag.role is Role.FORBIDDEN:
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

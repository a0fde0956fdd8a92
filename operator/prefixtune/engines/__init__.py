"""Engine adapters: one knob vocabulary, rendered to and parsed from each engine's real flags.

``get_adapter("vllm" | "sglang" | "trtllm")`` returns an :class:`EngineAdapter`; see base.py for the
protocol and vllm.py / sglang.py / trtllm.py for each engine's facts.
"""

from __future__ import annotations

from prefixtune.engines.base import (
    ArgsError,
    EngineAdapter,
    EngineName,
    KnobConfig,
    KnobSpec,
    MetricNames,
    ParsedCommand,
    RenderedCommand,
)
from prefixtune.engines.registry import ENGINE_NAMES, extra_args_errors, get_adapter, owned_args

__all__ = [
    "ENGINE_NAMES",
    "ArgsError",
    "EngineAdapter",
    "EngineName",
    "KnobConfig",
    "KnobSpec",
    "MetricNames",
    "ParsedCommand",
    "RenderedCommand",
    "extra_args_errors",
    "get_adapter",
    "owned_args",
]

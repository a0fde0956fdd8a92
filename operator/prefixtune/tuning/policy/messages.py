"""The text of Event messages and trial reasons."""

from __future__ import annotations

from prefixtune.engines.base import KnobConfig
from prefixtune.engines.knobs import config_text
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.objective import (
    Score,
)


def config_label(c: KnobConfig) -> str:
    return f"[{config_text(c)}]"


def score_text(s: Score) -> str:
    text = f"{s.objective} {s.value:.4g} ({s.basis}, {s.requests:g} requests)"
    if s.breaches:
        text += "; SLO breached: " + ", ".join(s.breaches)
    return text


def evidence(s: Signals) -> str:
    parts = []
    for label, value, fmt in (
        ("hit rate", s.hit_rate, "{:.1%}"),
        ("TTFT p99", s.ttft_p99_s, "{:.3g}s"),
        ("ITL p99", s.itl_p99_s, "{:.3g}s"),
        ("output", s.output_tokens_per_s, "{:.4g} tok/s"),
    ):
        if value is not None:
            parts.append(f"{label} {fmt.format(value)}")
    return ", ".join(parts) or "no signals"

"""Signals: what was measured for one set of pods over one window. The tuner scores these."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

# Every signal is optional: None means "not measured" (missing, stale or NaN), never zero.


@dataclass(frozen=True)
class Signals:
    window_s: float
    requests: float | None = None  # requests finished in the window
    hit_rate: float | None = None  # token level, as the engine counts it
    prefill_reduction: float | None = None  # prompt tokens not recomputed / prompt tokens
    running_mean: float | None = None
    running_max: float | None = None
    waiting_mean: float | None = None
    kv_usage_mean: float | None = None
    preemptions_per_s: float | None = None
    gpu_util: float | None = None  # 0..1
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    ttft_p99_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    output_tokens_per_s: float | None = None
    input_tokens_per_s: float | None = None
    requests_per_s: float | None = None
    goodput_tokens_per_s: float | None = None  # output tokens/s of requests meeting the SLOs
    slo_attainment: float | None = None  # share of requests meeting both SLOs
    # not a metric: the load multiple the twin, calibrated to this window, predicts the config carries
    # within the SLOs (twin/capacity.py); None where nothing predicted it
    capacity_multiple: float | None = None

    def missing(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self) if f.name != "window_s" and getattr(self, f.name) is None)

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if v is None else float(v)) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Signals:
        known = {f.name for f in fields(cls)} - {"window_s"}
        values = {k: (None if v is None else float(v)) for k, v in data.items() if k in known}
        return cls(float(data["window_s"]), **values)

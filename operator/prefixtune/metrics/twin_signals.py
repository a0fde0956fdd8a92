"""Signals from a twin run's ``Summary``: what the engine's metrics would have shown over the window.

A Summary has no waiting-queue gauge, so ``waiting_mean`` is None unless the caller measured it
(e.g. by sampling ``TwinEngine.gauges()``); without it the diagnosis cannot name a queueing bound.
Pure; plain Python floats only.
"""

from __future__ import annotations

from prefixtune.metrics.signals import Signals
from prefixtune.twin.summary import Summary


def signals_from_summary(
    summary: Summary, window_s: float | None = None, *, waiting_mean: float | None = None
) -> Signals:
    """``window_s`` defaults to the summary's simulated window; latencies are None when nothing finished."""
    window = float(summary.sim_seconds if window_s is None else window_s)
    if window <= 0:
        raise ValueError(f"window_s must be > 0; got {window}")
    finished = float(summary.finished)
    latency = finished > 0
    return Signals(
        window_s=window,
        requests=finished,
        hit_rate=float(summary.hit_rate),
        prefill_reduction=float(summary.prefill_tokens_saved_fraction),
        running_mean=float(summary.mean_running),
        running_max=float(summary.max_running),
        waiting_mean=None if waiting_mean is None else float(waiting_mean),
        kv_usage_mean=float(summary.kv_usage_mean),
        preemptions_per_s=float(summary.preemptions) / window,
        gpu_util=float(summary.gpu_busy_fraction),
        ttft_p50_s=float(summary.ttft_p50_s) if latency else None,
        ttft_p99_s=float(summary.ttft_p99_s) if latency else None,
        itl_p50_s=float(summary.itl_p50_s) if latency else None,
        itl_p99_s=float(summary.itl_p99_s) if latency else None,
        output_tokens_per_s=float(summary.output_tokens_per_s),
        input_tokens_per_s=float(summary.input_tokens_per_s),
        requests_per_s=float(summary.requests_per_s),
        goodput_tokens_per_s=float(summary.goodput_tokens_per_s),
    )

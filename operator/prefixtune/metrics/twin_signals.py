"""Signals from a twin run's summary: what the engine's metrics would have shown over the window.

The metrics side only says what it reads (``RunFigures``); the twin provides it (its ``Summary``
is one, and ``Summary.signals()`` calls this), so metrics does not import the twin.

``waiting_mean`` is the summary's time-averaged waiting queue over the window (what the engines'
waiting gauge, e.g. vllm:num_requests_waiting, averages to), unless the caller passes one it measured
(e.g. by sampling ``TwinEngine.gauges()``). Pure; plain Python floats only.
"""

from __future__ import annotations

from typing import Protocol

from prefixtune.metrics.signals import Signals


class RunFigures(Protocol):
    """The figures of a simulated run's measurement window that signals are made from."""

    @property
    def sim_seconds(self) -> float: ...
    @property
    def finished(self) -> int: ...
    @property
    def hit_rate(self) -> float: ...
    @property
    def prefill_tokens_saved_fraction(self) -> float: ...
    @property
    def mean_running(self) -> float: ...
    @property
    def max_running(self) -> int: ...
    @property
    def kv_usage_mean(self) -> float: ...
    @property
    def waiting_mean(self) -> float: ...
    @property
    def preemptions(self) -> int: ...
    @property
    def gpu_busy_fraction(self) -> float: ...
    @property
    def ttft_p50_s(self) -> float: ...
    @property
    def ttft_p99_s(self) -> float: ...
    @property
    def itl_p50_s(self) -> float: ...
    @property
    def itl_p99_s(self) -> float: ...
    @property
    def output_tokens_per_s(self) -> float: ...
    @property
    def input_tokens_per_s(self) -> float: ...
    @property
    def requests_per_s(self) -> float: ...
    @property
    def goodput_tokens_per_s(self) -> float: ...


def signals_from_summary(
    summary: RunFigures, window_s: float | None = None, *, waiting_mean: float | None = None
) -> Signals:
    """``window_s`` defaults to the summary's simulated window, ``waiting_mean`` to the summary's;
    latencies are None when nothing finished."""
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
        waiting_mean=float(summary.waiting_mean if waiting_mean is None else waiting_mean),
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

"""The JSON summary of a twin run: what the engine's metrics would have shown over a window.

``SummaryCollector`` is an ``EngineObserver`` that keeps per-request latencies and the inter-token
gaps (in bulk, as the engine reports them); ``Summary`` is the result, plain Python values only.

Window: ``[warmup_s, end_s]``. Throughputs count what happened inside it (tokens generated, requests
finished); TTFT percentiles cover requests that arrived at or after ``warmup_s`` and got their first
token (unfinished ones included), ITL percentiles the token gaps observed in the window. Goodput counts
the output tokens of requests that finished in the window and met both SLOs (TTFT, and their mean
inter-token latency).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from prefixtune.twin.cache.base import Match
from prefixtune.twin.observer import NullObserver
from prefixtune.twin.request import Request

if TYPE_CHECKING:
    from prefixtune.metrics.signals import Signals


@dataclass(slots=True)
class _Done:
    arrival_s: float
    end_s: float
    prompt_len: int
    output_len: int
    ttft_s: float
    tpot_s: float  # mean inter-token latency of this request


class SummaryCollector(NullObserver):
    """Collects what the summary needs; cheap enough to run inside the simulation loop."""

    def __init__(self, warmup_s: float = 0.0) -> None:
        self.warmup_s = float(warmup_s)
        self.done: list[_Done] = []
        self.gaps: list[tuple[float, int]] = []  # (gap, count) observed at or after warmup
        self.window_tokens = 0  # output tokens generated at or after warmup
        self._ttft: dict[int, float] = {}
        self.ttfts: list[float] = []  # of requests that arrived at or after warmup
        self.oom_at: float | None = None
        self.oom_reason = ""

    def first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self._ttft[req.req_id] = ttft_s
        if req.arrival_s >= self.warmup_s:
            self.ttfts.append(ttft_s)
        if now >= self.warmup_s:
            self.window_tokens += 1

    def tokens(self, gap_s: float, count: int, now: float) -> None:
        if now >= self.warmup_s:
            self.gaps.append((gap_s, count))
            self.window_tokens += count

    def admitted(self, req: Request, match: Match, now: float) -> None:
        return None

    def finished(
        self, req: Request, now: float, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        ttft = self._ttft.pop(req.req_id, e2e_s)
        tpot = decode_s / (req.output_len - 1) if req.output_len > 1 else 0.0
        self.done.append(_Done(req.arrival_s, now, req.prompt_len, req.output_len, ttft, tpot))

    def oom(self, now: float, reason: str) -> None:
        self.oom_at = now
        self.oom_reason = reason


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation; 0.0 for no values."""
    return percentiles(values, (q,))[0]


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """``percentile`` for each of ``qs``, sorting the values once."""
    if not values:
        return [0.0 for _ in qs]
    xs = sorted(values)
    return [_interpolated(xs, q) for q in qs]


def _interpolated(xs: list[float], q: float) -> float:
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def weighted_percentile(pairs: Sequence[tuple[float, int]], q: float) -> float:
    """The q-quantile of values given as (value, count) pairs; 0.0 for none."""
    return weighted_percentiles(pairs, (q,))[0]


def weighted_percentiles(pairs: Sequence[tuple[float, int]], qs: Sequence[float]) -> list[float]:
    """``weighted_percentile`` for each of ``qs``, sorting the pairs once."""
    total = sum(c for _, c in pairs)
    if total <= 0:
        return [0.0 for _ in qs]
    # by value only (cheaper than by pair): the quantile is the same whatever the order of equal values
    ordered = sorted(pairs, key=itemgetter(0))
    return [_weighted_quantile(ordered, q * total) for q in qs]


def _weighted_quantile(ordered: list[tuple[float, int]], target: float) -> float:
    """The first value whose cumulative count reaches ``target`` (the largest when none does)."""
    acc = 0
    for value, count in ordered:
        acc += count
        if acc >= target:
            return float(value)
    return float(max(v for v, _ in ordered))


@dataclass
class Summary:
    status: str  # ok | oom_startup | oom_runtime
    requests: int  # requests that arrived in the window
    finished: int  # requests finished in the window
    rejected: int
    sim_seconds: float
    wall_seconds: float
    hit_rate: float
    prefill_tokens_saved_fraction: float
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    output_tokens_per_s: float
    input_tokens_per_s: float
    requests_per_s: float
    goodput_tokens_per_s: float
    mean_running: float
    max_running: int
    kv_usage_mean: float
    kv_pool_tokens: int
    preemptions: int
    gpu_busy_fraction: float
    error: str = ""
    waiting_mean: float = 0.0  # time-averaged waiting queue over the window (the engines' gauge)
    setup: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def signals(self, window_s: float | None = None, *, waiting_mean: float | None = None) -> Signals:
        """What the engine's metrics would have shown over the window (``metrics.twin_signals``)."""
        from prefixtune.metrics.twin_signals import signals_from_summary  # the metrics package is heavy

        return signals_from_summary(self, window_s, waiting_mean=waiting_mean)

    def without_wall(self) -> dict[str, Any]:
        """Everything but ``wall_seconds``: equal for equal seeds."""
        d = self.to_dict()
        d.pop("wall_seconds")
        return d


def failed_summary(status: str, error: str, setup: Mapping[str, Any], wall_seconds: float) -> Summary:
    """The summary of an engine that did not start."""
    return Summary(
        status=status,
        requests=0,
        finished=0,
        rejected=0,
        sim_seconds=0.0,
        wall_seconds=float(wall_seconds),
        hit_rate=0.0,
        prefill_tokens_saved_fraction=0.0,
        ttft_p50_s=0.0,
        ttft_p99_s=0.0,
        itl_p50_s=0.0,
        itl_p99_s=0.0,
        output_tokens_per_s=0.0,
        input_tokens_per_s=0.0,
        requests_per_s=0.0,
        goodput_tokens_per_s=0.0,
        mean_running=0.0,
        max_running=0,
        kv_usage_mean=0.0,
        kv_pool_tokens=0,
        preemptions=0,
        gpu_busy_fraction=0.0,
        error=error,
        setup=dict(setup),
    )


@dataclass(frozen=True)
class GoodputSlo:
    """The per-request SLO goodput counts against (None: that bound not checked)."""

    ttft_s: float | None = None
    itl_s: float | None = None  # compared with the request's TPOT


@dataclass(frozen=True)
class RunWindow:
    """How a run went over its measurement window ``[start_s, end_s]`` (simulated seconds)."""

    status: str  # ok | oom_runtime
    start_s: float
    end_s: float
    arrived: int  # requests that arrived in the window
    rejected: int
    max_running: int
    kv_pool_tokens: int
    error: str = ""


@dataclass(frozen=True)
class EngineTotals:
    """The engine's counter deltas over the window (cache hits in the engine's own unit)."""

    hit_tokens: int
    query_tokens: int
    saved_prefill_tokens: int
    prompt_tokens: int
    busy_s: float
    running_integral: float
    kv_usage_integral: float
    preemptions: int
    waiting_integral: float = 0.0


def summarize(
    collector: SummaryCollector,
    window: RunWindow,
    totals: EngineTotals,
    slo: GoodputSlo,
    setup: Mapping[str, Any],
    wall_seconds: float,
) -> Summary:
    """Combine the collector with the engine's counter deltas over the window ``[start_s, end_s]``."""
    w, t = window, totals
    start_s, end_s = w.start_s, w.end_s
    slo_ttft_s, slo_itl_s = slo.ttft_s, slo.itl_s
    span = max(end_s - start_s, 1e-12)
    in_window = [d for d in collector.done if d.end_s >= start_s]
    ttft_p50, ttft_p99 = percentiles(collector.ttfts, (0.50, 0.99))
    itl_p50, itl_p99 = weighted_percentiles(collector.gaps, (0.50, 0.99))
    good = 0
    for d in in_window:
        ok_ttft = slo_ttft_s is None or d.ttft_s <= slo_ttft_s
        ok_itl = slo_itl_s is None or d.tpot_s <= slo_itl_s
        if ok_ttft and ok_itl:
            good += d.output_len
    saved = float(t.saved_prefill_tokens / t.prompt_tokens) if t.prompt_tokens else 0.0
    return Summary(
        status=w.status,
        requests=int(w.arrived),
        finished=len(in_window),
        rejected=int(w.rejected),
        sim_seconds=float(end_s - start_s),
        wall_seconds=float(wall_seconds),
        hit_rate=float(t.hit_tokens / t.query_tokens) if t.query_tokens else 0.0,
        prefill_tokens_saved_fraction=saved,
        ttft_p50_s=ttft_p50,
        ttft_p99_s=ttft_p99,
        itl_p50_s=itl_p50,
        itl_p99_s=itl_p99,
        output_tokens_per_s=float(collector.window_tokens / span),
        input_tokens_per_s=float(sum(d.prompt_len for d in in_window) / span),
        requests_per_s=float(len(in_window) / span),
        goodput_tokens_per_s=float(good / span),
        mean_running=float(t.running_integral / span),
        max_running=int(w.max_running),
        kv_usage_mean=float(t.kv_usage_integral / span),
        waiting_mean=float(t.waiting_integral / span),
        kv_pool_tokens=int(w.kv_pool_tokens),
        preemptions=int(t.preemptions),
        gpu_busy_fraction=float(min(1.0, t.busy_s / span)),
        error=w.error,
        setup=dict(setup),
    )

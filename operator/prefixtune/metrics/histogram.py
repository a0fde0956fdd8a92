"""Classic (bucketed) Prometheus histograms: quantiles and SLO shares, with Prometheus' own semantics.

``quantile`` follows ``histogram_quantile`` (promql/quantile.go ``bucketQuantile``): buckets are sorted
by upper bound, counts are forced monotone, the rank ``q * total`` is located in the first bucket whose
cumulative count reaches it, and the value is interpolated linearly inside that bucket. The lowest
bucket starts at 0 (when its upper bound is positive); a rank that falls in the +Inf bucket returns the
highest finite bound. Unlike PromQL, "no answer" is ``None`` rather than NaN, so it can never be
mistaken for a measurement.

``share_at_most`` is the share of observations <= a threshold, interpolated the same way (what
``histogram_fraction(0, x, ...)`` gives): linear inside the bucket holding the threshold; observations in
the +Inf bucket always count as above any finite threshold (the conservative reading for an SLO).

``share_within`` is the share goodput reads against an SLO target: the cumulative counts at the
positive finite bounds joined by a monotone cubic in log(bound) (PCHIP, Fritsch-Carlson, as scipy's
``PchipInterpolator``), where the linear reading puts a bucket's observations evenly between its
bounds. Latencies are right-skewed and buckets wide (vLLM's TTFT bounds jump from 1 to 2.5 s, its
TPOT bounds from 10 to 25 ms): on two twin windows whose 20 ms target lies inside a bucket the
twin counted 0.603 and 0.988 of the requests within the SLOs, the linear reading 0.547 and 0.928,
the cubic 0.601 and 0.978 (``tests/metrics/test_metrics_goodput_twin.py``). At a bound both are the
exact count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

INF = math.inf


@dataclass(frozen=True)
class Bucket:
    le: float  # upper bound (inclusive), +Inf for the last bucket
    count: float  # cumulative count of observations <= le


def parse_le(text: str) -> float:
    """The ``le`` label as a float ("+Inf", "0.5", "1.0", "1e-3" are all valid)."""
    try:
        return float(text)
    except ValueError as err:
        raise ValueError(f"histogram bucket label le={text!r} is not a number or +Inf") from err


def buckets_from(pairs: Mapping[float, float] | Iterable[tuple[float, float]]) -> tuple[Bucket, ...]:
    """Sorted buckets from (le, cumulative count) pairs; buckets with the same bound are summed."""
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    merged: dict[float, float] = {}
    for le, count in items:
        merged[float(le)] = merged.get(float(le), 0.0) + float(count)
    return tuple(Bucket(le, merged[le]) for le in sorted(merged))


def merge(*histograms: Iterable[Bucket]) -> tuple[Bucket, ...]:
    """Sum several histograms with the same bucket layout (``sum by (le)``)."""
    return buckets_from((b.le, b.count) for h in histograms for b in h)


def _monotone(buckets: tuple[Bucket, ...]) -> tuple[Bucket, ...]:
    # Prometheus forces monotonicity: scrapes of different buckets are not atomic.
    out: list[Bucket] = []
    high = 0.0
    for b in buckets:
        high = max(high, b.count)
        out.append(Bucket(b.le, high))
    return tuple(out)


def total(buckets: Iterable[Bucket]) -> float | None:
    """The number of observations (the +Inf bucket's count), or None without a +Inf bucket."""
    bs = buckets_from((b.le, b.count) for b in buckets)
    if not bs or not math.isinf(bs[-1].le):
        return None
    return bs[-1].count


def quantile(q: float, buckets: Iterable[Bucket]) -> float | None:
    """``histogram_quantile(q, ...)``; None when the histogram is empty or has no +Inf bucket."""
    if math.isnan(q):
        return None
    if q < 0:
        return -INF
    if q > 1:
        return INF
    bs = _monotone(buckets_from((b.le, b.count) for b in buckets))
    if len(bs) < 2 or not math.isinf(bs[-1].le) or any(math.isnan(b.count) for b in bs):
        return None
    observations = bs[-1].count
    if observations <= 0:
        return None
    rank = q * observations
    b = next(i for i, bucket in enumerate(bs) if bucket.count >= rank)
    if b == len(bs) - 1:
        return bs[-2].le
    if b == 0 and bs[0].le <= 0:
        return bs[0].le
    start, end, count = 0.0, bs[b].le, bs[b].count
    if b > 0:
        start = bs[b - 1].le
        count -= bs[b - 1].count
        rank -= bs[b - 1].count
    return start + (end - start) * (rank / count)


def count_at_most(threshold: float, buckets: Iterable[Bucket]) -> float | None:
    """Interpolated number of observations <= ``threshold``; None when there is no +Inf bucket."""
    bs = _monotone(buckets_from((b.le, b.count) for b in buckets))
    if not bs or not math.isinf(bs[-1].le):
        return None
    below_count, below_le = 0.0, 0.0
    for b in bs:
        if math.isinf(b.le):
            return below_count  # the +Inf bucket's observations lie above every finite threshold
        if threshold <= b.le:
            lo = min(below_le, b.le)  # a bucket with a negative bound starts at itself
            width = b.le - lo
            inside = b.count - below_count
            if width <= 0 or threshold <= lo:
                return below_count if threshold < b.le else b.count
            return below_count + inside * (threshold - lo) / width
        below_count, below_le = b.count, b.le
    return below_count


def share_at_most(threshold: float, buckets: Iterable[Bucket]) -> float | None:
    """Share of observations <= ``threshold`` (0..1); None when the histogram is empty."""
    bs = tuple(buckets)
    n = total(bs)
    below = count_at_most(threshold, bs)
    if n is None or below is None or n <= 0:
        return None
    return min(1.0, max(0.0, below / n))


def share_within(threshold: float, buckets: Iterable[Bucket]) -> float | None:
    """Share of observations <= ``threshold`` (0..1), interpolated in log(bound) by a monotone cubic
    (module docstring); ``share_at_most``'s linear reading below the first positive bound, at or above
    the last finite one, and with fewer than three positive bounds. None when the histogram is empty."""
    bs = _monotone(buckets_from((b.le, b.count) for b in buckets))
    n = total(bs)
    if n is None or n <= 0:
        return None
    knots = [(math.log(b.le), b.count / n) for b in bs if 0 < b.le < INF]
    inside = threshold > 0 and len(knots) >= 3 and knots[0][0] < math.log(threshold) < knots[-1][0]
    if not inside:
        return share_at_most(threshold, bs)
    xs, ys = [x for x, _ in knots], [y for _, y in knots]
    x = math.log(threshold)
    k = max(i for i in range(len(xs) - 1) if xs[i] <= x)
    slopes = _pchip_slopes(xs, ys)
    h = xs[k + 1] - xs[k]
    t = (x - xs[k]) / h
    value = (
        (2 * t**3 - 3 * t**2 + 1) * ys[k]
        + (t**3 - 2 * t**2 + t) * h * slopes[k]
        + (-2 * t**3 + 3 * t**2) * ys[k + 1]
        + (t**3 - t**2) * h * slopes[k + 1]
    )
    return min(1.0, max(0.0, value))


def _pchip_slopes(xs: list[float], ys: list[float]) -> list[float]:
    """The derivatives at the knots of a monotone piecewise cubic Hermite interpolant (Fritsch-Carlson,
    with scipy's end conditions: ``scipy.interpolate.PchipInterpolator``)."""
    h = [xs[i + 1] - xs[i] for i in range(len(xs) - 1)]
    delta = [(ys[i + 1] - ys[i]) / h[i] for i in range(len(h))]
    d = [0.0] * len(xs)
    for i in range(1, len(xs) - 1):
        a, b = delta[i - 1], delta[i]
        if a == 0 or b == 0 or (a > 0) != (b > 0):
            continue
        w1, w2 = 2 * h[i] + h[i - 1], h[i] + 2 * h[i - 1]
        d[i] = (w1 + w2) / (w1 / a + w2 / b)
    d[0] = _edge_slope(h[0], h[1], delta[0], delta[1])
    d[-1] = _edge_slope(h[-1], h[-2], delta[-1], delta[-2])
    return d


def _edge_slope(h0: float, h1: float, m0: float, m1: float) -> float:
    d = ((2 * h0 + h1) * m0 - h0 * m1) / (h0 + h1)
    if math.copysign(1, d) != math.copysign(1, m0) or m0 == 0:
        return 0.0
    if math.copysign(1, m0) != math.copysign(1, m1) and abs(d) > abs(3 * m0):
        return 3 * m0
    return d


@dataclass(frozen=True)
class Slo:
    """Latency objectives: TTFT and inter-token latency p99 targets, in seconds. The one Slo: goodput
    counts requests meeting both, the policy scores and aborts windows against it (its field names
    are stored in the policy state)."""

    ttft_p99_s: float = 2.0
    itl_p99_s: float = 0.150

    def __post_init__(self) -> None:
        for name, value in (("ttft_p99_s", self.ttft_p99_s), ("itl_p99_s", self.itl_p99_s)):
            if not value > 0 or math.isinf(value):
                raise ValueError(f"slo.{name} must be a positive number of seconds, got {value!r}")


def slo_attainment(ttft: Iterable[Bucket], itl: Iterable[Bucket], slo: Slo) -> float | None:
    """Approximate share of requests meeting both SLOs.

    Approximation (stated, because histograms cannot do better): share(TTFT <= slo) x share(ITL <= slo),
    the two taken as independent. ``itl`` should be the per-request histogram of each request's mean
    time per output token (vLLM's and SGLang's ``request_time_per_output_token_seconds``,
    TensorRT-LLM's ``time_per_output_token_seconds``): a request meets the ITL target when its mean
    does, as goodput defines it. Given per-token gaps instead (an engine without the per-request
    histogram), the share is of tokens, and a request whose tokens sometimes exceed the target is
    counted fractionally.
    """
    ttft_share = share_within(slo.ttft_p99_s, ttft)
    itl_share = share_within(slo.itl_p99_s, itl)
    if ttft_share is None:
        return None
    if itl_share is None:
        # No inter-token gaps at all (every request produced one token): only TTFT can fail.
        itl_total = total(tuple(itl))
        return ttft_share if itl_total == 0 else None
    return ttft_share * itl_share


def goodput(output_tokens_per_s: float | None, attainment: float | None) -> float | None:
    """Output tokens/s of requests meeting the SLOs ~= output tokens/s x SLO attainment."""
    if output_tokens_per_s is None or attainment is None:
        return None
    return output_tokens_per_s * attainment

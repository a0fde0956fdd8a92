"""histogram_quantile semantics, SLO shares and goodput from classic buckets."""

from __future__ import annotations

import bisect
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixtune.metrics import histogram as H
from prefixtune.metrics.histogram import Bucket, Slo

INF = math.inf


def bk(*pairs: tuple[float, float]) -> tuple[Bucket, ...]:
    return H.buckets_from(pairs)


BASIC = bk((0.1, 10), (0.5, 30), (1.0, 40), (INF, 40))


def test_quantile_interpolates_linearly_inside_the_bucket() -> None:
    # rank 20 lies in (0.1, 0.5] which holds 20 observations, 10 of them below the rank
    assert H.quantile(0.5, BASIC) == pytest.approx(0.3)
    assert H.quantile(1.0, BASIC) == pytest.approx(1.0)


def test_lowest_bucket_starts_at_zero() -> None:
    assert H.quantile(0.125, BASIC) == pytest.approx(0.05)  # rank 5 of 10 in (0, 0.1]


def test_rank_in_the_inf_bucket_returns_the_highest_finite_bound() -> None:
    b = bk((0.1, 1), (0.5, 2), (INF, 10))
    assert H.quantile(0.99, b) == 0.5


def test_non_positive_lowest_bound_is_returned_as_is() -> None:
    assert H.quantile(0.1, bk((-1.0, 5), (1.0, 10), (INF, 10))) == -1.0


def test_no_answer_is_none_not_nan() -> None:
    assert H.quantile(0.5, bk((0.1, 0), (INF, 0))) is None  # empty
    assert H.quantile(0.5, bk((0.1, 3), (1.0, 5))) is None  # no +Inf bucket
    assert H.quantile(0.5, bk((INF, 5))) is None  # a single bucket
    assert H.quantile(0.5, ()) is None
    assert H.quantile(math.nan, BASIC) is None
    assert H.quantile(-0.1, BASIC) == -INF
    assert H.quantile(1.1, BASIC) == INF


def test_monotonicity_is_forced_like_prometheus() -> None:
    # a non-atomic scrape can make a higher bucket read lower; Prometheus carries the max forward
    assert H.quantile(0.5, bk((0.1, 10), (0.5, 8), (1.0, 20), (INF, 20))) == pytest.approx(0.1)


def test_merge_sums_buckets_with_the_same_bound() -> None:
    merged = H.merge(BASIC, bk((0.1, 0), (0.5, 0), (1.0, 10), (INF, 20)))
    assert merged == (Bucket(0.1, 10), Bucket(0.5, 30), Bucket(1.0, 50), Bucket(INF, 60))
    assert H.total(merged) == 60


def test_parse_le_reads_prometheus_bound_texts_and_names_bad_ones() -> None:
    assert H.parse_le("+Inf") == INF
    assert H.parse_le("1.0") == 1.0
    assert H.parse_le("5e-3") == 0.005
    with pytest.raises(ValueError, match="le='x'"):
        H.parse_le("x")


def test_share_at_most_interpolates_and_treats_inf_as_above() -> None:
    assert H.share_at_most(0.3, BASIC) == pytest.approx(20 / 40)
    assert H.share_at_most(0.05, BASIC) == pytest.approx(5 / 40)
    assert H.share_at_most(1.0, BASIC) == pytest.approx(1.0)
    assert H.share_at_most(5.0, bk((1.0, 6), (INF, 10))) == pytest.approx(0.6)
    assert H.share_at_most(0.5, bk((1.0, 0), (INF, 0))) is None


def test_slo_attainment_and_goodput() -> None:
    ttft = bk((0.5, 90), (2.0, 99), (INF, 100))
    itl = bk((0.05, 800), (0.1, 900), (INF, 1000))
    slo = Slo(ttft_p99_s=2.0, itl_p99_s=0.1)
    att = H.slo_attainment(ttft, itl, slo)
    assert att == pytest.approx(0.99 * 0.9)
    assert H.goodput(1000.0, att) == pytest.approx(891.0)
    assert H.goodput(None, att) is None
    # one-token outputs: no ITL observations at all, only TTFT can miss
    assert H.slo_attainment(ttft, bk((0.1, 0), (INF, 0)), slo) == pytest.approx(0.99)


def test_slo_rejects_non_positive_targets_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"slo\.itl_p99_s"):
        Slo(ttft_p99_s=1.0, itl_p99_s=0.0)


BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def bucketize(values: list[float]) -> tuple[Bucket, ...]:
    return tuple(Bucket(le, sum(1 for v in values if v <= le)) for le in (*BOUNDS, INF))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(min_value=0.0001, max_value=2.4), min_size=1, max_size=300),
    st.sampled_from([0.5, 0.9, 0.99]),
)
def test_estimate_lies_in_the_bucket_of_the_true_quantile(values: list[float], q: float) -> None:
    est = H.quantile(q, bucketize(values))
    assert est is not None
    true = sorted(values)[max(0, math.ceil(q * len(values)) - 1)]
    # same bucket: (lower, upper] of the true value contains the estimate (closed at both ends)
    i = bisect.bisect_left(BOUNDS, true)
    lower = BOUNDS[i - 1] if i > 0 else 0.0
    assert lower <= est <= BOUNDS[i]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0.0, 100.0), min_size=3, max_size=20),
    st.floats(0.0, 10.0),
    st.floats(0.01, 0.99),
)
def test_share_within_is_scipys_monotone_cubic_in_log_bound(
    adds: list[float], above: float, where: float
) -> None:
    from numpy import array, log
    from scipy.interpolate import PchipInterpolator

    bounds = [0.001 * 1.8**i for i in range(len(adds))]
    counts = [sum(adds[: i + 1]) for i in range(len(adds))]
    n = counts[-1] + above
    if n <= 0:
        return
    buckets = bk(*zip(bounds, counts, strict=True), (INF, n))
    x = math.exp(math.log(bounds[0]) + where * (math.log(bounds[-1]) - math.log(bounds[0])))
    want = float(PchipInterpolator(log(bounds), array(counts) / n)(math.log(x)))
    assert H.share_within(x, buckets) == pytest.approx(min(1.0, max(0.0, want)), abs=1e-9)


def test_share_within_is_exact_at_a_bound_and_linear_where_the_cubic_has_no_knots() -> None:
    skewed = bk((0.01, 0), (0.025, 90), (0.05, 98), (0.1, 100), (INF, 100))
    assert H.share_within(0.025, skewed) == pytest.approx(0.9)  # a bound: the count itself
    # inside (10, 25] ms, where 90 of 100 lie: the cubic follows the steep rise below and the flat
    # above; the linear reading spreads the 90 evenly
    assert H.share_within(0.02, skewed) > H.share_at_most(0.02, skewed) == pytest.approx(0.6)
    assert H.share_within(0.005, skewed) == H.share_at_most(0.005, skewed)  # below the first bound
    assert H.share_within(1.0, skewed) == H.share_at_most(1.0, skewed) == 1.0  # past the last
    assert H.share_within(0.02, bk((0.01, 0), (0.025, 90), (INF, 100))) == pytest.approx(0.6)  # 2 knots
    assert H.share_within(0.02, bk((0.01, 0), (INF, 0))) is None

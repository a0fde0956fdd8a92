from __future__ import annotations

import pytest

from prefixtune.metrics.signals import Signals
from prefixtune.tuning.objective import (
    InsufficientData,
    Paired,
    Score,
    load_factor,
    load_normalized,
    paired,
    score,
    severe_breach,
)
from prefixtune.tuning.settings import Slo

SLO = Slo(ttft_p99_s=2.0, itl_p99_s=0.1)


def sig(**kw: float | None) -> Signals:
    base: dict[str, float | None] = {
        "requests": 500.0,
        "ttft_p99_s": 1.0,
        "itl_p99_s": 0.05,
        "output_tokens_per_s": 1000.0,
        "goodput_tokens_per_s": 900.0,
        "slo_attainment": 0.8,
    }
    base.update(kw)
    return Signals(window_s=600.0, **base)  # type: ignore[arg-type]


def test_goodput_uses_measured_goodput() -> None:
    s = score(sig(), "goodput", SLO, 300)
    assert isinstance(s, Score)
    assert s.value == 900.0 and s.basis == "goodput_tokens_per_s" and s.slo_met


def test_goodput_derived_from_attainment_when_not_measured() -> None:
    s = score(sig(goodput_tokens_per_s=None), "goodput", SLO, 300)
    assert isinstance(s, Score)
    assert s.value == pytest.approx(800.0) and s.basis == "slo_attainment*output_tokens_per_s"


def test_too_few_requests_is_insufficient_not_a_number() -> None:
    s = score(sig(requests=299.0), "goodput", SLO, 300)
    assert isinstance(s, InsufficientData) and s.too_few_requests and "minRequests is 300" in s.reason


@pytest.mark.parametrize(
    ("objective", "missing"),
    [
        ("goodput", {"goodput_tokens_per_s": None, "slo_attainment": None}),
        ("throughput", {"output_tokens_per_s": None}),
        ("ttft", {"ttft_p99_s": None}),
        ("goodput", {"requests": None}),
    ],
)
def test_missing_required_signals(objective: str, missing: dict[str, None]) -> None:
    s = score(sig(**missing), objective, SLO, 1)  # type: ignore[arg-type]
    assert isinstance(s, InsufficientData) and s.missing and not s.too_few_requests


def test_slo_breach_is_penalised() -> None:
    ok = score(sig(), "throughput", SLO, 1)
    bad = score(sig(itl_p99_s=0.2), "throughput", SLO, 1)
    assert isinstance(ok, Score) and isinstance(bad, Score)
    assert bad.value == pytest.approx(ok.value * 0.5)
    assert not bad.slo_met and bad.breaches and bad.raw == ok.raw


def test_goodput_charges_late_requests_once_not_the_window_tail_again() -> None:
    # goodput already excludes every request that missed a target; a p99 over the SLO is reported
    # but does not multiply the value again (it is the noisiest statistic of a window)
    s = score(sig(ttft_p99_s=8.0, itl_p99_s=0.4, goodput_tokens_per_s=700.0), "goodput", SLO, 1)
    assert isinstance(s, Score)
    assert s.value == 700.0 and s.raw == 700.0
    assert not s.slo_met and len(s.breaches) == 2
    # fewer requests on time is a lower score, however the tail looks
    fewer = score(sig(goodput_tokens_per_s=600.0), "goodput", SLO, 1)
    assert isinstance(fewer, Score) and fewer.slo_met and fewer.value < s.value


def test_ttft_is_negative_seconds_higher_is_better() -> None:
    fast = score(sig(ttft_p99_s=0.5), "ttft", SLO, 1)
    slow = score(sig(ttft_p99_s=1.5), "ttft", SLO, 1)
    assert isinstance(fast, Score) and isinstance(slow, Score)
    assert fast.value == -0.5 and fast.value > slow.value
    breach = score(sig(ttft_p99_s=0.5, itl_p99_s=0.2), "ttft", SLO, 1)
    assert isinstance(breach, Score) and breach.value == pytest.approx(-1.0)


def test_load_normalisation_is_bounded_and_skips_ttft() -> None:
    assert load_normalized(100.0, "goodput", offered_rps=2.0, reference_rps=1.0) == 50.0
    assert load_normalized(100.0, "goodput", offered_rps=10.0, reference_rps=1.0) == 50.0  # bounded
    assert load_normalized(100.0, "throughput", offered_rps=None, reference_rps=1.0) == 100.0
    assert load_normalized(-1.0, "ttft", offered_rps=2.0, reference_rps=1.0) == -1.0
    # the factor a trial records is the one applied (None: not rescaled)
    assert load_factor("goodput", 10.0, 1.0) == 0.5 and load_factor("goodput", 1.0, 1.25) == 1.25
    assert load_factor("ttft", 2.0, 1.0) is None and load_factor("goodput", None, 1.0) is None


def test_paired_canary_vs_baseline() -> None:
    # one canary pod against two baseline pods, each pod sent the same requests (250)
    p = paired(
        sig(requests=250.0, goodput_tokens_per_s=300.0),
        sig(goodput_tokens_per_s=500.0),
        "goodput",
        SLO,
        1,
        1,
        2,
    )
    assert isinstance(p, Paired) and p.ratio == pytest.approx(300.0 / 250.0)
    t = paired(sig(ttft_p99_s=0.5), sig(ttft_p99_s=1.0), "ttft", SLO, 1)
    assert isinstance(t, Paired) and t.ratio == pytest.approx(2.0)
    few = paired(sig(requests=5.0), sig(), "goodput", SLO, 100)
    assert isinstance(few, InsufficientData) and few.reason.startswith("canary:")


def test_paired_goodput_follows_the_requests_each_side_was_sent() -> None:
    """Goodput is the SLO-meeting tokens of the requests a side got: a canary sent more of a random
    split scores more for that alone. Equal goodput per request is a tie; the correction is bounded
    (a side finishing under half its share is not corrected further); throughput stays per pod."""

    def side(requests: float, goodput: float) -> Signals:
        return sig(requests=requests, goodput_tokens_per_s=goodput)

    lucky, unlucky = side(82.0, 82.0), side(56.0, 56.0)
    tie = paired(lucky, unlucky, "goodput", SLO, 1)
    assert isinstance(tie, Paired) and tie.ratio == pytest.approx(1.0)
    # the same per request, one canary pod against two baseline pods' requests
    pods = paired(side(60.0, 60.0), side(100.0, 100.0), "goodput", SLO, 1, 1, 2)
    assert isinstance(pods, Paired) and pods.ratio == pytest.approx(1.0)
    # a side finishing a third of the other's requests: corrected by at most 2, so it stays worse
    starved = paired(side(20.0, 20.0), side(60.0, 60.0), "goodput", SLO, 1)
    assert isinstance(starved, Paired) and starved.ratio == pytest.approx((1 / 3) * 2)
    assert (starved.split, pods.split, tie.split) == (0.5, pytest.approx(1.2), pytest.approx(82.0 / 56.0))
    better = paired(side(56.0, 73.0), lucky, "goodput", SLO, 1)
    assert isinstance(better, Paired) and better.ratio == pytest.approx(73.0 / 56.0)
    throughput = paired(lucky, unlucky, "throughput", SLO, 1)
    assert isinstance(throughput, Paired) and throughput.ratio == pytest.approx(1.0)  # output 1000 each
    assert throughput.split == 1.0  # throughput is not corrected for the split


def test_paired_goodput_behind_a_deciding_router_divides_by_the_share_it_was_given() -> None:
    """A cache-aware router sends a new canary pod whole new sessions: three times its pods' share
    is the router's decision, not chance. Equal goodput per request served is then a tie (the
    random-spread bound of 2 would have left the canary 1.5x better for its share alone)."""
    canary, baseline = (
        sig(requests=150.0, goodput_tokens_per_s=150.0),
        sig(requests=150.0, goodput_tokens_per_s=150.0),
    )
    routed = paired(canary, baseline, "goodput", SLO, 1, 1, 3, decided_split=True)
    spread = paired(canary, baseline, "goodput", SLO, 1, 1, 3)
    assert isinstance(routed, Paired) and isinstance(spread, Paired)
    assert (routed.split, routed.ratio) == (pytest.approx(3.0), pytest.approx(1.0))
    assert (spread.split, spread.ratio) == (2.0, pytest.approx(1.5))


def test_severe_breach() -> None:
    assert severe_breach(sig(ttft_p99_s=6.5), SLO, 3.0) is not None
    assert severe_breach(sig(ttft_p99_s=5.0), SLO, 3.0) is None
    assert severe_breach(sig(itl_p99_s=0.31), SLO, 3.0) is not None

from __future__ import annotations

import pytest

from prefixtune.metrics.signals import Signals
from prefixtune.tuning.objective import (
    HEADROOM_BOUNDS,
    Headroom,
    HeadroomLimit,
    InsufficientData,
    Paired,
    Score,
    decided_by,
    headroom,
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
    assert s.measured_value == 900.0 and s.basis == "goodput_tokens_per_s" and s.slo_met


def test_goodput_derived_from_attainment_when_not_measured() -> None:
    s = score(sig(goodput_tokens_per_s=None), "goodput", SLO, 300)
    assert isinstance(s, Score)
    assert s.measured_value == pytest.approx(800.0) and s.basis == "slo_attainment*output_tokens_per_s"


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
    assert bad.measured_value == pytest.approx(ok.measured_value * 0.5)
    assert not bad.slo_met and bad.breaches and bad.raw == ok.raw


def test_goodput_charges_late_requests_once_not_the_window_tail_again() -> None:
    # goodput already excludes every request that missed a target; a p99 over the SLO is reported
    # but does not multiply the value again (it is the noisiest statistic of a window)
    s = score(sig(ttft_p99_s=8.0, itl_p99_s=0.4, goodput_tokens_per_s=700.0), "goodput", SLO, 1)
    assert isinstance(s, Score)
    assert s.value == 700.0 and s.raw == 700.0
    assert not s.slo_met and len(s.breaches) == 2
    # past saturation (no headroom) fewer requests on time is a lower score
    fewer = score(sig(ttft_p99_s=8.0, itl_p99_s=0.4, goodput_tokens_per_s=600.0), "goodput", SLO, 1)
    assert isinstance(fewer, Score) and fewer.value == 600.0 < s.value


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


# Below capacity: the headroom. The signals are the twin's (vllm-rag-corpus at 30% of its load, 8B
# on an H100, one window): caching off served as much within the SLOs (it even finished a few more
# tokens), but re-prefilled every context.
CACHED = {"requests": 966.0, "goodput_tokens_per_s": 591.6, "ttft_p50_s": 0.023, "ttft_p99_s": 0.196,
          "itl_p50_s": 0.0083, "itl_p99_s": 0.020, "kv_usage_mean": 0.072, "gpu_util": 0.99}  # fmt: skip
UNCACHED = {"requests": 969.0, "goodput_tokens_per_s": 596.5, "ttft_p50_s": 0.201, "ttft_p99_s": 0.902,
            "itl_p50_s": 0.0117, "itl_p99_s": 0.200, "kv_usage_mean": 0.214, "gpu_util": 0.99}  # fmt: skip
RAG_SLO = Slo(ttft_p99_s=2.0, itl_p99_s=0.3)


def test_a_cached_config_outranks_an_uncached_one_at_light_load_by_its_headroom() -> None:
    cached = score(sig(**CACHED), "goodput", RAG_SLO, 1)
    uncached = score(sig(**UNCACHED), "goodput", RAG_SLO, 1)
    assert isinstance(cached, Score) and isinstance(uncached, Score)
    assert uncached.measured_value > cached.measured_value  # the flat objective picks caching off
    assert cached.value > 2 * uncached.value
    assert cached.headroom == Headroom(
        factor=pytest.approx(2.0 / 0.196), limit=HeadroomLimit.TTFT, share=0.098
    )
    assert uncached.headroom is not None and uncached.headroom.limit == HeadroomLimit.TTFT
    assert uncached.headroom.factor == pytest.approx(2.0 / 0.902)


def test_at_saturation_the_score_is_the_measured_goodput_and_the_more_served_wins() -> None:
    # both past capacity (the KV pool full, the tails over the SLO): no headroom, goodput decides
    more = score(sig(goodput_tokens_per_s=1300.0, ttft_p99_s=2.4, kv_usage_mean=0.98), "goodput", SLO, 1)
    less = score(sig(goodput_tokens_per_s=1100.0, ttft_p99_s=5.0, kv_usage_mean=0.99), "goodput", SLO, 1)
    assert isinstance(more, Score) and isinstance(less, Score)
    assert (more.value, less.value) == (1300.0, 1100.0)
    assert more.headroom is not None and more.headroom.saturated and more.headroom.factor == 1.0


def test_a_config_that_serves_the_load_outranks_one_that_drops_part_of_it() -> None:
    # near capacity: one config keeps its tail just inside the SLOs, the other misses on 10% of
    # requests; a saturated config never gains from headroom, so the SLO-meeting one wins
    keeps = score(sig(goodput_tokens_per_s=1000.0, ttft_p99_s=1.8, itl_p99_s=0.09), "goodput", SLO, 1)
    drops = score(sig(goodput_tokens_per_s=900.0, ttft_p99_s=3.0, itl_p99_s=0.05), "goodput", SLO, 1)
    assert isinstance(keeps, Score) and isinstance(drops, Score)
    assert drops.value == 900.0 and keeps.value > 1000.0


def test_headroom_is_bounded_by_the_largest_share_a_budget_was_used() -> None:
    kv = headroom(sig(ttft_p99_s=0.2, itl_p99_s=0.01, kv_usage_mean=0.5), SLO)
    assert kv is not None and (kv.limit, kv.factor) == (HeadroomLimit.KV, 2.0)
    itl = headroom(sig(ttft_p99_s=0.2, itl_p50_s=0.05, itl_p99_s=0.5, kv_usage_mean=0.1), SLO)
    assert itl is not None and (itl.limit, itl.factor) == (
        HeadroomLimit.ITL,
        2.0,
    )  # the p50: the p99 is a stall's
    idle = headroom(sig(ttft_p99_s=0.001, itl_p99_s=0.001, kv_usage_mean=0.0), SLO)
    assert idle is not None and idle.factor == HEADROOM_BOUNDS[1]  # an idle window ranks no further
    nothing = headroom(sig(ttft_p99_s=None, itl_p99_s=None), SLO)
    assert nothing is None


def test_a_predicted_capacity_is_a_share_like_the_others() -> None:
    # the twin calibrated to the window predicts 1.5x more load fits: tighter than the KV pool's 2x
    room = headroom(sig(ttft_p99_s=0.2, itl_p99_s=0.01, kv_usage_mean=0.5, capacity_multiple=1.5), SLO)
    assert room is not None and room.limit == HeadroomLimit.MODEL and room.factor == pytest.approx(1.5)
    # looser than a measured share: the share bounds
    loose = headroom(sig(ttft_p99_s=0.2, itl_p99_s=0.01, kv_usage_mean=0.5, capacity_multiple=4.0), SLO)
    assert loose is not None and (loose.limit, loose.factor) == (HeadroomLimit.KV, 2.0)
    # at capacity it predicts 1: the score is the measured rate
    full = score(sig(ttft_p99_s=0.2, capacity_multiple=1.0), "goodput", SLO, 1)
    assert isinstance(full, Score) and full.value == full.measured_value


def test_throughput_ranks_by_headroom_and_ttft_has_none() -> None:
    fast = score(sig(ttft_p99_s=0.5), "throughput", SLO, 1)
    slow = score(sig(ttft_p99_s=1.5), "throughput", SLO, 1)
    assert isinstance(fast, Score) and isinstance(slow, Score)
    assert fast.measured_value == slow.measured_value and fast.value > slow.value
    ttft = score(sig(ttft_p99_s=0.5), "ttft", SLO, 1)
    assert isinstance(ttft, Score) and ttft.headroom is None and ttft.value == ttft.measured_value == -0.5


def test_the_decision_names_the_term_that_differed_more() -> None:
    # the same goodput, one with 10x the room: the headroom decided
    assert decided_by("goodput", (591.6, 596.5), (10.2, 1.5), HeadroomLimit.TTFT) == "headroom (ttft)"
    # one served 30% more; its headroom is a little smaller: goodput decided
    assert decided_by("goodput", (1300.0, 1000.0), (1.0, 1.1), HeadroomLimit.KV) == "goodput"


# The running-request cap: the twin's vllm-chatbot-running-cap at 30% of its load (8B on an A100,
# 3 req/s of chat): every cap serves it the same, the batch peaking at 31 requests; at the full load
# the cap of 64 binds (a queue, TTFT past the SLO) and 256 does not.
CHAT_LIGHT = {"requests": 1800.0, "goodput_tokens_per_s": 808.0, "ttft_p50_s": 0.036, "ttft_p99_s": 0.125,
              "itl_p50_s": 0.0134, "itl_p99_s": 0.039, "kv_usage_mean": 0.031, "running_mean": 11.5,
              "running_max": 31.0}  # fmt: skip
CHAT_SLO = Slo(ttft_p99_s=2.0, itl_p99_s=0.15)


def test_the_running_cap_share_is_the_batch_peak_over_the_configs_cap() -> None:
    room = headroom(sig(**CHAT_LIGHT), CHAT_SLO, running_cap=64)
    assert room == Headroom(factor=pytest.approx(64 / 31), limit=HeadroomLimit.RUNNING, share=31 / 64)


def test_without_a_known_running_cap_the_running_share_is_not_measured() -> None:
    room = headroom(sig(**CHAT_LIGHT), CHAT_SLO)
    assert room is not None and room.limit == HeadroomLimit.ITL  # ITL p50 13.4 ms of 150 ms


def test_a_larger_running_cap_outranks_a_smaller_one_at_light_load_by_its_headroom() -> None:
    small = score(sig(**CHAT_LIGHT), "goodput", CHAT_SLO, 1, running_cap=64)
    large = score(sig(**CHAT_LIGHT), "goodput", CHAT_SLO, 1, running_cap=256)
    assert isinstance(small, Score) and isinstance(large, Score)
    assert small.measured_value == large.measured_value == 808.0
    assert large.headroom is not None and large.headroom.factor == pytest.approx(256 / 31)
    assert large.value == pytest.approx(4 * small.value)  # a cap four times as large: four times the room


def test_a_batch_at_its_running_cap_leaves_no_headroom() -> None:
    at_cap = headroom(sig(**{**CHAT_LIGHT, "running_max": 64.0}), CHAT_SLO, running_cap=64)
    assert at_cap is not None and at_cap.saturated and at_cap.limit == HeadroomLimit.RUNNING


def test_paired_scores_each_side_against_its_own_running_cap() -> None:
    pair = paired(sig(**CHAT_LIGHT), sig(**CHAT_LIGHT), "goodput", CHAT_SLO, 1, caps=(256, 64))
    assert isinstance(pair, Paired)
    assert pair.baseline.headroom is not None and pair.baseline.headroom.limit == HeadroomLimit.RUNNING
    assert pair.ratio == pytest.approx(4.0)  # the same window, a cap four times as large


def test_the_decision_names_the_running_cap_when_it_bounded_the_winner() -> None:
    term = decided_by("goodput", (808.0, 808.0), (4.1, 2.1), HeadroomLimit.RUNNING)
    assert term == "headroom (running-cap)"


def test_a_headroom_at_its_top_bound_bounds_nothing() -> None:
    idle = headroom(sig(ttft_p99_s=0.001, itl_p99_s=0.001, kv_usage_mean=0.0), SLO)
    assert idle is not None and not idle.bounded
    kv = headroom(sig(ttft_p99_s=0.2, itl_p99_s=0.01, kv_usage_mean=0.5), SLO)
    assert kv is not None and kv.bounded

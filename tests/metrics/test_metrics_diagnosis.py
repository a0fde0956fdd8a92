"""diagnose(): the bound, with its readings, and one test per field-notes pattern."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prefixtune.metrics.diagnosis import (
    DECODE,
    INSUFFICIENT,
    KV_CAPACITY,
    PREFILL,
    QUEUEING,
    UNKNOWN,
    diagnose,
    prefill_time_share,
)
from prefixtune.metrics.signals import Signals

# A healthy, lightly loaded window: 600 requests, 2 req/s, 250 output tokens each, 30 ms ITL.
BASE = Signals(
    window_s=300.0,
    requests=600.0,
    hit_rate=0.75,
    prefill_reduction=0.72,
    running_mean=24.0,
    running_max=40.0,
    waiting_mean=0.0,
    kv_usage_mean=0.55,
    preemptions_per_s=0.0,
    gpu_util=0.45,
    ttft_p50_s=0.12,
    ttft_p90_s=0.3,
    ttft_p99_s=0.45,
    itl_p50_s=0.03,
    itl_p99_s=0.06,
    output_tokens_per_s=500.0,
    input_tokens_per_s=4000.0,
    requests_per_s=2.0,
)


def test_decode_bound_when_decode_dominates_a_requests_time() -> None:
    d = diagnose(BASE)  # 0.12 s prefill vs 250 x 0.03 = 7.5 s decode
    assert d.bound == DECODE
    assert d.readings["prefill_time_share"] < 0.05
    assert "decode-bound" in d.reason


def test_prefill_bound_when_prefill_dominates_a_requests_time() -> None:
    # 1,000 computed prompt tokens/s against 100 output tokens/s: under the token-ratio rule (10 < 20),
    # so the time split decides: 0.9 s prefill vs 50 x 0.005 = 0.25 s decode.
    s = replace(
        BASE,
        ttft_p50_s=0.9,
        itl_p50_s=0.005,
        output_tokens_per_s=100.0,
        input_tokens_per_s=1000.0,
        hit_rate=0.0,
        prefill_reduction=0.0,
    )
    d = diagnose(s)
    assert d.bound == PREFILL
    share = prefill_time_share(s)
    assert share is not None and share > 0.7 and d.readings["prefill_time_share"] == share


def test_prefill_bound_by_token_mix_even_when_itl_looks_like_decode() -> None:
    # Long inputs, tiny outputs: 16,000 prompt tokens/s, 28% computed, 20 output tokens/s = 224 computed
    # prompt tokens per output token. ITL (0.3 s: decode steps carrying prefill chunks) would make the
    # time split say decode; the token mix says prefill.
    s = replace(BASE, ttft_p50_s=0.3, itl_p50_s=0.3, output_tokens_per_s=20.0, input_tokens_per_s=16000.0)
    share = prefill_time_share(s)
    assert share is not None and share < 0.5
    d = diagnose(s)
    assert d.bound == PREFILL, d.reason
    assert d.readings["computed_prefill_per_output_token"] == pytest.approx(16000 * 0.28 / 20)
    assert "224 prompt tokens are computed per output token" in d.reason


def test_token_mix_uses_computed_tokens_not_cached_ones() -> None:
    # The same mix with 99% of the prompt served from the cache: 8 computed tokens per output token,
    # under the threshold; the time split (decode here) decides.
    s = replace(BASE, output_tokens_per_s=20.0, input_tokens_per_s=16000.0, prefill_reduction=0.99)
    d = diagnose(s)
    assert "computed_prefill_per_output_token" not in d.readings
    assert d.bound == DECODE


def test_kv_capacity_bound_with_a_full_pool_and_preemptions() -> None:
    d = diagnose(replace(BASE, kv_usage_mean=0.97, preemptions_per_s=0.4, waiting_mean=3.0))
    assert d.bound == KV_CAPACITY
    assert d.readings["kv_usage_mean"] == 0.97 and d.readings["preemptions_per_s"] == 0.4
    assert "eviction-pressure" in d.codes


def test_queueing_when_requests_wait_but_kv_is_not_full() -> None:
    d = diagnose(replace(BASE, waiting_mean=30.0, running_mean=16.0, kv_usage_mean=0.6))
    assert d.bound == QUEUEING
    assert d.readings["waiting_mean"] == 30.0


def test_insufficient_data_is_explicit() -> None:
    for s in (replace(BASE, requests=5.0), replace(BASE, requests=None)):
        d = diagnose(s)
        assert d.bound == INSUFFICIENT and "insufficient data" in d.reason and d.findings == ()


def test_unknown_without_latency_signals() -> None:
    d = diagnose(replace(BASE, ttft_p50_s=None, itl_p50_s=None))
    assert d.bound == UNKNOWN


def test_pattern_high_hit_rate_flat_throughput_is_decode_bound() -> None:
    off = replace(BASE, hit_rate=0.0, prefill_reduction=0.0, ttft_p50_s=0.4, output_tokens_per_s=505.0)
    d = diagnose(replace(BASE, itl_p50_s=None), baseline=off)  # no ITL: no time split
    f = next(f for f in d.findings if f.code == "ttft-down-throughput-flat")
    assert d.bound == DECODE  # named from the comparison alone
    assert f.readings["ttft_p50_change"] < -0.15 and abs(f.readings["throughput_change"]) < 0.05
    # with throughput up, the pattern is absent
    up = diagnose(replace(BASE, output_tokens_per_s=700.0), baseline=off)
    assert "ttft-down-throughput-flat" not in up.codes


def test_pattern_p50_down_p99_stuck() -> None:
    off = replace(BASE, hit_rate=0.0, ttft_p50_s=0.4, ttft_p99_s=2.0)
    d = diagnose(replace(BASE, ttft_p50_s=0.12, ttft_p99_s=1.95), baseline=off)
    f = next(f for f in d.findings if f.code == "p99-stuck")
    assert f.readings["ttft_p99_change"] > -0.05 and "misses make the tail" in f.note
    assert "p99-stuck" not in diagnose(replace(BASE, ttft_p99_s=0.6), baseline=off).codes


def test_pattern_tail_without_baseline() -> None:
    d = diagnose(replace(BASE, ttft_p50_s=0.1, ttft_p99_s=1.5))
    assert "miss-dominated-tail" in d.codes
    assert "miss-dominated-tail" not in diagnose(BASE).codes


def test_pattern_hits_on_short_prefixes() -> None:
    d = diagnose(replace(BASE, hit_rate=0.8, prefill_reduction=0.3))
    f = next(f for f in d.findings if f.code == "short-prefix-hits")
    assert f.readings == {"hit_rate": 0.8, "prefill_reduction": 0.3}
    assert "short-prefix-hits" not in diagnose(BASE).codes


def test_pattern_eviction_pressure_from_a_falling_hit_rate() -> None:
    before = replace(BASE, hit_rate=0.8)
    d = diagnose(replace(BASE, kv_usage_mean=0.95, hit_rate=0.6), history=[before])
    f = next(f for f in d.findings if f.code == "eviction-pressure")
    assert f.readings["previous_hit_rate"] == 0.8 and "hit rate falling" in f.note
    assert "eviction-pressure" not in diagnose(replace(BASE, kv_usage_mean=0.95), history=[BASE]).codes


def test_pattern_more_hits_less_throughput() -> None:
    before = replace(BASE, hit_rate=0.6, output_tokens_per_s=600.0)
    d = diagnose(replace(BASE, hit_rate=0.8, output_tokens_per_s=480.0), history=[before])
    f = next(f for f in d.findings if f.code == "hit-rate-up-throughput-down")
    assert f.readings["throughput_change"] < -0.05 and "running_max" in f.readings


def test_pattern_caching_earns_nothing_needs_every_window_low() -> None:
    low = replace(BASE, hit_rate=0.3, prefill_reduction=0.28)
    d = diagnose(low, history=[replace(low, hit_rate=0.4), replace(low, hit_rate=0.35)])
    f = next(f for f in d.findings if f.code == "caching-earns-nothing")
    assert f.readings["windows"] == 3 and "consider turning prefix caching off" in f.note
    assert "confirm" in diagnose(low).findings[-1].note  # one window: says so
    assert "caching-earns-nothing" not in diagnose(low, history=[replace(low, hit_rate=0.7)]).codes


def test_to_dict_is_plain_json() -> None:
    import json

    d = diagnose(replace(BASE, hit_rate=0.8, prefill_reduction=0.3))
    data = json.loads(json.dumps(d.to_dict()))
    assert data["bound"] == DECODE and data["findings"][0]["code"] == "short-prefix-hits"
    assert d.notes()[0] == d.reason


def test_each_finding_is_one_rule_and_findings_come_in_rule_order() -> None:
    """A finding is one rule function in ``FINDING_RULES``; diagnose lists the findings in rule order."""
    from prefixtune.metrics import diagnosis

    quiet = BASE
    previous = replace(BASE, hit_rate=0.55, output_tokens_per_s=600.0)
    busy = replace(BASE, hit_rate=0.62, prefill_reduction=0.3, kv_usage_mean=0.95, preemptions_per_s=0.2)
    got = diagnose(busy, history=[previous])
    fired = [rule.__name__.strip("_").replace("_", "-") for rule in diagnosis.FINDING_RULES]
    assert list(got.codes) == [c for c in fired if c in got.codes]
    assert set(got.codes) == {"short-prefix-hits", "eviction-pressure", "hit-rate-up-throughput-down"}
    assert not diagnose(quiet).codes

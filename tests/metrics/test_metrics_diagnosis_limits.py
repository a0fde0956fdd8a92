"""diagnose(): when a batch limit binds (the running-request cap, the step token budget)."""

from __future__ import annotations

from dataclasses import replace

from prefixtune.metrics.diagnosis import KV_CAPACITY, BatchLimits, diagnose
from prefixtune.metrics.signals import Signals

# Short chat at high concurrency: 256 running, 12 waiting, KV 40% used.
CHAT = Signals(
    window_s=300.0,
    requests=3000.0,
    hit_rate=0.7,
    prefill_reduction=0.7,
    running_mean=250.0,
    running_max=256.0,
    waiting_mean=12.0,
    kv_usage_mean=0.4,
    preemptions_per_s=0.0,
    ttft_p50_s=0.5,
    ttft_p99_s=1.5,
    itl_p50_s=0.03,
    itl_p99_s=0.05,
    output_tokens_per_s=2500.0,
    input_tokens_per_s=10000.0,
    requests_per_s=10.0,
)
CAP_256 = BatchLimits(max_running=256, max_batched_tokens=8192)

# Long RAG prompts: 12,000 tokens each, a quarter from the cache: 9,000 computed per request.
RAG = Signals(
    window_s=300.0,
    requests=600.0,
    hit_rate=0.25,
    prefill_reduction=0.25,
    running_mean=20.0,
    running_max=32.0,
    waiting_mean=0.0,
    kv_usage_mean=0.6,
    ttft_p50_s=0.9,
    ttft_p99_s=2.0,
    itl_p50_s=0.03,
    itl_p99_s=0.21,
    output_tokens_per_s=400.0,
    input_tokens_per_s=24000.0,
    requests_per_s=2.0,
)


def test_the_running_cap_binds_when_the_batch_sits_at_it_with_kv_free_and_a_queue() -> None:
    d = diagnose(CHAT, limits=CAP_256)
    (f,) = (f for f in d.findings if f.code == "running-cap-binds")
    assert f.note.startswith(
        "running cap binds: 250 running on average against a cap of 256, KV usage 40%, queue 12.0"
    )
    assert f.readings["max_running"] == 256 and f.readings["kv_usage_mean"] == 0.4
    assert f.readings["waiting_mean"] == 12.0


def test_the_running_cap_does_not_bind_when_kv_memory_is_full() -> None:
    d = diagnose(replace(CHAT, kv_usage_mean=0.95), limits=CAP_256)
    assert d.bound == KV_CAPACITY and "running-cap-binds" not in d.codes


def test_the_running_cap_does_not_bind_without_a_queue() -> None:
    assert "running-cap-binds" not in diagnose(replace(CHAT, waiting_mean=0.0), limits=CAP_256).codes


def test_the_running_cap_does_not_bind_when_the_batch_stays_below_it() -> None:
    assert "running-cap-binds" not in diagnose(CHAT, limits=BatchLimits(max_running=1024)).codes


def test_no_batch_limit_finding_without_the_limits() -> None:
    assert not {"running-cap-binds", "token-budget-itl-spikes", "token-budget-chunks-ttft"} & {
        *diagnose(CHAT).codes,
        *diagnose(RAG).codes,
    }


def test_itl_spikes_with_prompts_that_fill_the_token_budget() -> None:
    d = diagnose(RAG, limits=BatchLimits(max_batched_tokens=8192))
    (f,) = (f for f in d.findings if f.code == "token-budget-itl-spikes")
    assert "ITL p99 210 ms is 7.0x p50" in f.note and "chunks of up to 8192 tokens" in f.note
    assert f.readings["computed_prompt_per_request"] == 9000.0


def test_a_chunk_is_the_smaller_of_the_prompt_and_the_budget() -> None:
    d = diagnose(RAG, limits=BatchLimits(max_batched_tokens=16384))
    (f,) = (f for f in d.findings if f.code == "token-budget-itl-spikes")
    assert "chunks of up to 9000 tokens" in f.note


def test_itl_spikes_are_not_blamed_on_the_budget_when_prompts_are_short_against_it() -> None:
    short = replace(RAG, input_tokens_per_s=4000.0)  # 1,500 computed tokens against 8,192
    assert "token-budget-itl-spikes" not in diagnose(short, limits=BatchLimits(max_batched_tokens=8192)).codes


def test_no_itl_spike_finding_when_itl_p99_stays_near_p50() -> None:
    calm = replace(RAG, itl_p99_s=0.05)
    assert "token-budget-itl-spikes" not in diagnose(calm, limits=BatchLimits(max_batched_tokens=8192)).codes


def test_ttft_is_chunked_prefill_when_a_small_budget_splits_prompts_into_many_steps() -> None:
    slow = replace(RAG, running_mean=256.0, ttft_p50_s=1.2, itl_p99_s=0.04)
    d = diagnose(slow, limits=BatchLimits(max_batched_tokens=512))
    (f,) = (f for f in d.findings if f.code == "token-budget-chunks-ttft")
    assert f.readings["prefill_steps"] == 9000.0 / 256.0  # 512 minus one token per running decode
    assert "take 35 steps of the 256 tokens" in f.note and "TTFT p50 1.20 s is 40 steps" in f.note


def test_ttft_is_not_blamed_on_chunking_when_the_budget_holds_a_prompt() -> None:
    slow = replace(RAG, running_mean=256.0, ttft_p50_s=1.2)
    assert (
        "token-budget-chunks-ttft" not in diagnose(slow, limits=BatchLimits(max_batched_tokens=16384)).codes
    )


def test_ttft_is_not_blamed_on_chunking_when_it_is_shorter_than_the_steps() -> None:
    quick = replace(RAG, running_mean=256.0, ttft_p50_s=0.2)  # 35 steps of 30 ms would be ~1 s
    assert "token-budget-chunks-ttft" not in diagnose(quick, limits=BatchLimits(max_batched_tokens=512)).codes

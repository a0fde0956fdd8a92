"""The diagnosis on twin runs built to show each bottleneck and each field-notes pattern.

Every case runs the real twin (``simulate``) on a workload designed for it, turns the Summary into
Signals (``signals_from_summary``) and asserts what ``diagnose`` names. Each case also replays the
same requests (same seed: the same trajectory) on a TwinEngine and samples ``gauges().waiting`` every
0.1 s of the window, as a Prometheus scrape of the engine would, and uses that queue.
Each test also checks that the case is what it claims to be (hit rate, batch, KV, queue), so a twin
change that breaks the premise fails loudly instead of passing for the wrong reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from prefixtune.engines import get_adapter
from prefixtune.metrics.diagnosis import (
    DECODE,
    KV_CAPACITY,
    PREFILL,
    QUEUEING,
    BatchLimits,
    diagnose,
    prefill_time_share,
)
from prefixtune.metrics.exposition import parse
from prefixtune.metrics.recipe import for_engine
from prefixtune.metrics.scrape_source import window_signals
from prefixtune.metrics.signals import Signals
from prefixtune.metrics.twin_signals import signals_from_summary
from prefixtune.twin.engine import TwinEngine
from prefixtune.twin.exporter import EngineExporter
from prefixtune.twin.observer import NullObserver
from prefixtune.twin.run import SimOptions, parse_command, simulate
from prefixtune.twin.summary import Summary
from prefixtune.twin.workloads import ArrivalSpec, Dist, PrefixPool, WorkloadSpec, generate

M8 = "meta-llama/Llama-3.1-8B-Instruct"
GPU = "H100"
CACHING_OFF = ["--no-enable-prefix-caching"]
SAMPLE_S = 0.1


def measure(
    workload: str | WorkloadSpec,
    rate: float,
    argv: Sequence[str],
    *,
    warmup_s: float = 10.0,
    horizon_s: float = 40.0,
    seed: int = 1,
) -> tuple[Summary, Signals]:
    reqs = generate(workload, rate=rate, duration_s=horizon_s, seed=seed)
    summary = simulate(
        "vllm", list(argv), GPU, reqs, SimOptions(model=M8, seed=seed, warmup_s=warmup_s, horizon_s=horizon_s)
    )
    assert summary.status == "ok", summary.error
    eng = TwinEngine(parse_command("vllm", list(argv), model=M8), GPU, seed, NullObserver())
    eng.submit_all(sorted(reqs, key=lambda r: (r.arrival_s, r.req_id)))
    eng.advance(warmup_s)
    samples: list[int] = []
    steps = round((horizon_s - warmup_s) / SAMPLE_S)
    for i in range(1, steps + 1):
        eng.advance(warmup_s + i * SAMPLE_S)
        samples.append(eng.gauges().waiting)
    return summary, signals_from_summary(summary, waiting_mean=sum(samples) / len(samples))


# ------------------------------------------------------------------------------------------------
# Bottlenecks

LONG_PROMPT_SHORT_OUTPUT = WorkloadSpec(name="diag-prefill", suffix=Dist(value=6000), output=Dist(value=16))


def test_prefill_bound_long_prompts_short_outputs_caching_off() -> None:
    # 6000-token unique prompts, 16-token answers, ~28k prompt tokens/s: prefill keeps the GPU busy
    # (~80%). It ran at 3.5 req/s until the kernel-fitted costs made 8B BF16 prefill ~1.5x faster,
    # which left the GPU 63% busy.
    s, sig = measure(LONG_PROMPT_SHORT_OUTPUT, 4.6, CACHING_OFF)
    assert s.hit_rate == 0.0 and s.input_tokens_per_s > 100 * s.output_tokens_per_s
    assert s.gpu_busy_fraction > 0.7
    d = diagnose(sig)
    assert d.bound == PREFILL, d.reason
    assert d.readings["computed_prefill_per_output_token"] >= 100


def test_prefill_bound_near_capacity_with_tiny_outputs() -> None:
    # With chunked prefill every decode step carries a prefill chunk, so ITL p50 is prefill time and
    # the latency split alone would call this decode-bound; the token mix names it right.
    spec = WorkloadSpec(name="diag-prefill-tiny", suffix=Dist(value=6000), output=Dist(value=4))
    s, sig = measure(spec, 6.0, CACHING_OFF)
    assert s.input_tokens_per_s > 1000 * s.output_tokens_per_s and s.gpu_busy_fraction > 0.8
    d = diagnose(sig)
    assert d.bound == PREFILL, d.reason
    share = prefill_time_share(sig)
    assert share is not None and share < 0.5  # the premise: the time split alone says decode


def test_decode_bound_short_prompts_long_outputs_full_batch() -> None:
    s, sig = measure(
        WorkloadSpec(name="diag-decode", suffix=Dist(value=100), output=Dist(value=400)),
        18.0,
        ["--max-num-seqs", "64"],
    )
    assert s.max_running >= 0.9 * 64 and s.mean_running >= 0.7 * 64  # the batch is (nearly) full
    assert sig.waiting_mean is not None and sig.waiting_mean < 1.0
    d = diagnose(sig)
    assert d.bound == DECODE, d.reason
    assert d.readings["prefill_time_share"] < 0.1


KV_HEAVY = WorkloadSpec(name="diag-kv", suffix=Dist(value=8000), output=Dist(value=200))
SMALL_POOL = ["--gpu-memory-utilization", "0.3", "--max-model-len", "16384"]


def test_kv_capacity_bound_small_pool_long_contexts() -> None:
    s, sig = measure(KV_HEAVY, 3.0, SMALL_POOL, horizon_s=60.0)
    assert s.kv_pool_tokens < 100_000 and s.preemptions > 0 and s.kv_usage_mean >= 0.9
    d = diagnose(sig)
    assert d.bound == KV_CAPACITY, d.reason
    assert "eviction-pressure" in d.codes


QUEUED = WorkloadSpec(name="diag-queue", suffix=Dist(value=2000), output=Dist(value=100))


def test_queueing_arrivals_above_capacity() -> None:
    s, sig = measure(QUEUED, 16.0, ["--max-num-seqs", "16"])
    assert s.requests_per_s < 0.8 * 16.0  # the engine finishes fewer than arrive
    assert sig.waiting_mean is not None and sig.running_mean is not None
    assert sig.waiting_mean > 2 * sig.running_mean and s.kv_usage_mean < 0.5  # a queue, not a full pool
    d = diagnose(sig)
    assert d.bound == QUEUEING, d.reason


def test_a_summary_exports_the_waiting_queue_a_scrape_of_the_gauge_would_average() -> None:
    s, sig = measure(QUEUED, 16.0, ["--max-num-seqs", "16"])
    assert sig.waiting_mean is not None and sig.waiting_mean > 10  # the premise: a long queue
    assert abs(s.waiting_mean - sig.waiting_mean) <= 0.1 * sig.waiting_mean
    assert diagnose(signals_from_summary(s)).bound == QUEUEING


# ------------------------------------------------------------------------------------------------
# Field-notes patterns


def test_high_hit_rate_flat_throughput_is_decode_bound() -> None:
    spec = WorkloadSpec(
        name="diag-shared-decode",
        prefixes=(PrefixPool(name="system", count=4, length=Dist(value=3000)),),
        suffix=Dist(value=64),
        output=Dist(value=300),
    )
    _, off = measure(spec, 4.0, CACHING_OFF)
    s, on = measure(spec, 4.0, [])
    assert s.hit_rate > 0.9
    d = diagnose(on, baseline=off)
    assert "ttft-down-throughput-flat" in d.codes
    assert d.bound == DECODE
    assert "caching-earns-nothing" not in d.codes


def test_ttft_p50_down_p99_unchanged() -> None:
    # 70 % of requests share one 8000-token document, the rest bring a document nobody else uses; regular
    # arrivals 0.5 s apart so no prefill waits for another: the tail is the misses, with or without caching.
    weights = (0.7,) + (0.3 / 999,) * 999
    spec = WorkloadSpec(
        name="diag-tail",
        prefixes=(PrefixPool(name="docs", count=1000, weights=weights, length=Dist(value=8000)),),
        suffix=Dist(value=50),
        output=Dist(value=20),
        arrival=ArrivalSpec(process="bursty", cv=0.05),
    )
    _, off = measure(spec, 2.0, CACHING_OFF)
    s, on = measure(spec, 2.0, [])
    assert s.hit_rate > 0.6
    d = diagnose(on, baseline=off)
    assert "p99-stuck" in d.codes, d.notes()
    f = next(f for f in d.findings if f.code == "p99-stuck")
    assert f.readings["ttft_p50_change"] < -0.5


def test_eviction_pressure_on_full_pool_with_preemptions() -> None:
    # A larger pool, same workload: no eviction pressure (the control for the KV case above).
    s, sig = measure(KV_HEAVY, 3.0, ["--max-model-len", "16384"], horizon_s=60.0)
    assert s.preemptions == 0
    assert "eviction-pressure" not in diagnose(sig).codes
    _, tight = measure(KV_HEAVY, 3.0, SMALL_POOL, horizon_s=60.0)
    assert "eviction-pressure" in diagnose(tight).codes


def test_caching_earns_nothing_on_qa() -> None:
    s, sig = measure("qa", 4.0, [])
    assert s.hit_rate < 0.6
    assert "caching-earns-nothing" in diagnose(sig).codes
    # Two more windows, still low: "stably below 60 %".
    later = [measure("qa", 4.0, [], seed=seed)[1] for seed in (2, 3)]
    assert "caching-earns-nothing" in diagnose(later[-1], history=[sig, later[0]]).codes
    # The control: a RAG workload's cache earns its memory.
    _, rag = measure("rag", 2.0, [])
    assert "caching-earns-nothing" not in diagnose(rag).codes
    # With caching off a zero hit rate is no finding: there is nothing to turn off.
    _, off = measure("qa", 4.0, CACHING_OFF)
    assert "caching-earns-nothing" not in diagnose(off, prefix_caching=False).codes


def trtllm_window(spec: WorkloadSpec, tokens_per_block: int, rate: float) -> Signals:
    """Signals as the metrics layer reads them from TensorRT-LLM's own series (the twin's exporter,
    two scrapes of its exposition): block-based hit rate, token-based prefill reduction."""
    adapter = get_adapter("trtllm")
    cmd = adapter.render(
        M8, replace(adapter.default_config(), block_size=tokens_per_block), tensor_parallel=1
    )
    parsed = parse_command("trtllm", list(cmd.argv), files=cmd.files)
    exporter = EngineExporter("trtllm", M8, parsed=parsed)
    eng = TwinEngine(parsed, GPU, 1, exporter)
    exporter.bind(eng.gauges, lambda: eng.cache.stats)
    reqs = generate(spec, rate=rate, duration_s=40.0, seed=1)
    eng.submit_all(sorted(reqs, key=lambda r: (r.arrival_s, r.req_id)))
    scrapes = []
    for t in (10.0, 40.0):
        eng.advance(t)
        scrapes.append(parse(exporter.render().decode(), target="pod", t=t))
    assert eng.status == "ok"
    return window_signals(for_engine("trtllm"), {"pod": scrapes}).signals


def test_short_prefix_hits_on_trtllm_block_counters() -> None:
    # Short instructions (40 tokens) shared by short prompts, 128-token blocks: TensorRT-LLM counts a
    # partially reused block as a reused block, so most blocks "hit" while few prompt tokens are saved.
    # (vLLM and SGLang count hits in tokens: there the hit rate is the prefill reduction.)
    spec = WorkloadSpec(
        name="diag-short-prefix",
        prefixes=(PrefixPool(name="instructions", count=8, length=Dist(value=40)),),
        suffix=Dist(dist="uniform", low=40, high=120),
        output=Dist(value=16),
    )
    sig = trtllm_window(spec, 128, 20.0)
    assert sig.hit_rate is not None and sig.prefill_reduction is not None
    assert sig.hit_rate > 0.6 and sig.prefill_reduction < 0.4
    d = diagnose(sig)
    assert "short-prefix-hits" in d.codes, d.notes()
    f = next(f for f in d.findings if f.code == "short-prefix-hits")
    assert f.readings["hit_rate"] - f.readings["prefill_reduction"] > 0.3
    # The control: a long shared context on the same engine and blocks: hits are long prefixes.
    rag = trtllm_window(WorkloadSpec.model_validate({"name": "diag-long-prefix", "prefixes": [
        {"name": "docs", "count": 2, "length": 4000}], "suffix": 60, "output": 16}), 128, 4.0)  # fmt: skip
    assert rag.hit_rate is not None and rag.hit_rate > 0.9
    assert "short-prefix-hits" not in diagnose(rag).codes


# ------------------------------------------------------------------------------------------------
# Batch limits that bind (the findings need the config's limits: ``diagnose(limits=...)``)


def test_running_cap_binds_a_small_cap_with_kv_free_and_a_queue() -> None:
    _, sig = measure(QUEUED, 16.0, ["--max-num-seqs", "16"])
    assert sig.running_max == 16 and sig.kv_usage_mean is not None and sig.kv_usage_mean < 0.5
    assert sig.waiting_mean is not None and sig.waiting_mean > 16  # the premise: a queue, KV free
    d = diagnose(sig, limits=BatchLimits(max_running=16))
    assert "running-cap-binds" in d.codes
    assert "running-cap-binds" not in diagnose(sig, limits=BatchLimits(max_running=256)).codes


CHUNKED = WorkloadSpec(name="diag-chunks", suffix=Dist(value=8000), output=Dist(value=300))


def _chunked(budget: int) -> Signals:
    _, sig = measure(
        CHUNKED, 1.5, ["--max-num-batched-tokens", str(budget), "--max-num-seqs", "256"], horizon_s=60.0
    )
    return sig


def test_token_budget_itl_spikes_with_prompts_as_large_as_the_budget() -> None:
    large, small = _chunked(8192), _chunked(2048)
    assert large.itl_p99_s is not None and small.itl_p99_s is not None
    assert small.itl_p99_s < 0.5 * large.itl_p99_s  # the premise: smaller chunks, lower ITL spikes
    assert "token-budget-itl-spikes" in diagnose(large, limits=BatchLimits(max_batched_tokens=8192)).codes


def test_token_budget_chunks_make_ttft_with_a_small_budget() -> None:
    small, large = _chunked(512), _chunked(8192)
    assert small.ttft_p50_s is not None and large.ttft_p50_s is not None
    assert small.ttft_p50_s > large.ttft_p50_s  # the premise: chunking lengthens TTFT
    d = diagnose(small, limits=BatchLimits(max_batched_tokens=512))
    assert "token-budget-chunks-ttft" in d.codes
    assert (
        "token-budget-chunks-ttft" not in diagnose(large, limits=BatchLimits(max_batched_tokens=8192)).codes
    )

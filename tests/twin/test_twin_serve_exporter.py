"""The engine exporter driven directly by a simulated engine (no HTTP): counters agree with the
engine's own totals, preemptions are counted, the effective config reads back."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from prefixtune.engines import get_adapter
from prefixtune.twin.engine import TwinEngine
from prefixtune.twin.exporter import EngineExporter, buckets_1_2_5
from prefixtune.twin.run import parse_command
from prefixtune.twin.workloads import WorkloadSpec, generate

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LONG_OUTPUTS = WorkloadSpec.model_validate(
    {"name": "longout", "suffix": 500, "output": {"dist": "uniform", "low": 500, "high": 3000}}
)


def run(
    engine: str, args: list[str], workload: str | WorkloadSpec, rate: float, duration_s: float = 10.0
) -> tuple[TwinEngine, str]:
    parsed = parse_command(engine, args, model=MODEL)
    exporter = EngineExporter(engine, MODEL, parsed=parsed)
    eng = TwinEngine(parsed, "H100-80GB", 1, exporter)
    exporter.bind(eng.gauges, lambda: eng.cache.stats)
    eng.submit_all(generate(workload, rate=rate, duration_s=duration_s, seed=1))
    eng.advance(float("inf"))
    return eng, exporter.render().decode()


def values(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def test_vllm_counters_match_the_engine_and_count_preemptions() -> None:
    # A small pool (0.3 of the GPU, 16k context) under RAG traffic: vLLM preempts by recompute.
    eng, text = run("vllm", ["--gpu-memory-utilization", "0.3", "--max-model-len", "16384"], "rag", 40)
    v = values(text)
    assert eng.status == "ok" and eng.counters.preemptions > 0
    assert v["vllm:num_preemptions_total"] == eng.counters.preemptions
    # vLLM's prefix counters count first admissions only; the cache model counts every admission.
    assert 0 < v["vllm:prefix_cache_hits_total"] <= eng.cache.stats.hit_tokens
    assert v["vllm:prefix_cache_queries_total"] == v["vllm:prompt_tokens_total"]
    assert v["vllm:request_success_total"] == v["vllm:e2e_request_latency_seconds_count"] > 0
    assert v["vllm:request_num_preemptions_sum"] == eng.counters.preemptions
    # Decode runs are reported in bulk: every token after a request's first is one ITL observation.
    finished = v["vllm:request_success_total"]
    assert v["vllm:time_to_first_token_seconds_count"] == finished
    assert v["vllm:inter_token_latency_seconds_count"] == v["vllm:generation_tokens_total"] - finished
    assert v["vllm:generation_tokens_total"] == v["vllm:request_generation_tokens_sum"]
    assert v["vllm:num_requests_running"] == 0 and v["vllm:kv_cache_usage_perc"] == 0
    effective = get_adapter("vllm").effective_config(
        [(s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples]
    )
    assert effective["memory_fraction"] == 0.3 and effective["block_size"] == 16
    assert effective["kv_tokens"] == eng.memory.pool_tokens


def test_sglang_counts_retractions_and_evictions() -> None:
    eng, text = run("sglang", ["--mem-fraction-static", "0.22"], LONG_OUTPUTS, 50, duration_s=4.0)
    v = values(text)
    assert eng.counters.preemptions > 0
    assert v["sglang:num_retracted_requests_total"] == eng.counters.preemptions
    assert v["sglang:max_total_num_tokens"] == eng.memory.pool_tokens
    assert v["sglang:evicted_tokens_total"] == eng.cache.stats.evicted_blocks * eng.block_size
    # Re-prefills after a retraction count again in prefill_effective_tokens (as SGLang logs them).
    assert v["sglang:prefill_effective_tokens_total"] > v["sglang:prompt_tokens_total"]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_exposition_is_stable_without_traffic(engine: str) -> None:
    exporter = EngineExporter(engine, MODEL)
    first = values(exporter.render().decode())
    assert first == values(exporter.render().decode())
    assert "process_start_time_seconds" in first


def test_unknown_engine_and_token_buckets() -> None:
    with pytest.raises(ValueError, match="unknown engine 'tgi'; known engines: vllm, sglang, trtllm"):
        EngineExporter("tgi", MODEL)
    assert buckets_1_2_5(1000) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)

"""The twin follows what issue 16 fixed in the adapters: a TensorRT-LLM 1.2-era exposition, SGLang's
rendered TTFT buckets and /ready, and the hrrn policy."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from prefixtune.engines import get_adapter
from prefixtune.metrics.recipe import for_engine
from prefixtune.twin.engine import TwinEngine
from prefixtune.twin.exporter import EngineExporter
from prefixtune.twin.run import SimOptions, parse_command, simulate
from prefixtune.twin.serve import TwinServer
from prefixtune.twin.workloads import generate

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _families(engine: str, args: list[str], version: str | None) -> set[str]:
    parsed = parse_command(engine, args, model=MODEL)
    exporter = EngineExporter(engine, MODEL, parsed=parsed, version=version)
    eng = TwinEngine(parsed, "H100-80GB", 1, exporter)
    exporter.bind(eng.gauges, lambda: eng.cache.stats)
    eng.submit_all(generate("chatbot", rate=2.0, duration_s=5.0, seed=1))
    eng.advance(float("inf"))
    return {fam.name for fam in text_string_to_metric_families(exporter.render().decode())}


def test_trtllm_1_2_twin_serves_only_the_latency_histograms_and_request_count() -> None:
    new = _families("trtllm", [], None)
    old = _families("trtllm", [], "1.2")
    recipe = for_engine("trtllm")
    assert recipe.hits[0].name.removesuffix("_total") in new
    assert "trtllm_kv_cache_reused_blocks" not in old and "trtllm_generation_tokens" not in old
    assert "trtllm_num_requests_waiting" not in old and "trtllm_kv_cache_config_info" not in old
    for kept in (
        "trtllm_time_to_first_token_seconds",
        "trtllm_time_per_output_token_seconds",
        "trtllm_e2e_request_latency_seconds",
        "trtllm_request_success",
    ):
        assert kept in old
    # The newest release is served whole, the version given or not.
    assert _families("trtllm", [], "1.3") == new


def test_sglang_twin_histograms_use_the_rendered_buckets() -> None:
    adapter = get_adapter("sglang")
    rendered = adapter.render(MODEL, adapter.default_config(), ttft_slo_s=0.05, itl_slo_s=0.15)
    parsed = adapter.parse(rendered.argv)
    exporter = EngineExporter("sglang", MODEL, parsed=parsed)
    text = exporter.render().decode()

    def bounds(name: str) -> set[float]:
        return {
            float(s.labels["le"])
            for fam in text_string_to_metric_families(text)
            if fam.name == name
            for s in fam.samples
            if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
        }

    assert 0.05 in bounds("sglang:time_to_first_token_seconds")
    assert 0.01 in bounds("sglang:time_to_first_token_seconds")
    # SGLang bounds its per-request TPOT histogram with the ITL list (--bucket-inter-token-latency)
    for name in ("sglang:inter_token_latency_seconds", "sglang:request_time_per_output_token_seconds"):
        assert 0.15 in bounds(name) and {0.002, 0.1, 0.2, 8.0} <= bounds(name), name
    # without the flag, SGLang's own lists
    plain = EngineExporter("sglang", MODEL, parsed=adapter.parse([*adapter.command, "--model-path", MODEL]))
    text = plain.render().decode()
    assert 0.15 not in bounds("sglang:request_time_per_output_token_seconds")


def test_hrrn_runs_and_is_fcfs_without_the_radix_cache() -> None:
    reqs = generate("chatbot", rate=20.0, duration_s=10.0, seed=3)
    on = simulate(
        "sglang", ["--schedule-policy", "hrrn"], "H100", reqs, SimOptions(model=MODEL, horizon_s=15)
    )
    assert on.finished > 0
    eng = TwinEngine(
        parse_command("sglang", ["--schedule-policy", "hrrn", "--disable-radix-cache"], model=MODEL),
        "H100",
        1,
    )
    assert eng.policy == "fcfs"


async def test_sglang_twin_answers_ready() -> None:
    parsed = parse_command("sglang", [], model=MODEL)
    server = TwinServer("sglang", parsed, "H100-80GB")
    url = await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            for path in ("/ready", "/health"):
                async with http.get(url + path) as resp:
                    assert resp.status == 200
    finally:
        await server.stop()

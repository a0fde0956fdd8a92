"""``twin serve`` over real HTTP, in-process: the engines' metrics, completions, health, OOMs, loadgen."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prefixtune.engines import get_adapter
from prefixtune.twin.loadgen import completion_body, run_load, summarize_records
from prefixtune.twin.openai_api import error_message
from prefixtune.twin.request import Request
from prefixtune.twin.serve import ServeOptions, make_server, serve_main, serving
from prefixtune.twin.workloads import generate

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
GPU = "H100-80GB"
SPEEDUP = 200.0  # simulated seconds per wall second: short tests
ROOT = Path(__file__).resolve().parents[2]

Sample = tuple[str, dict[str, str], float]

# name -> (type, label names) of the series each engine must export (reference/engines.md §2).
EXPECTED: dict[str, dict[str, tuple[str, set[str]]]] = {
    "vllm": {
        "vllm:num_requests_running": ("gauge", {"model_name", "engine"}),
        "vllm:num_requests_waiting": ("gauge", {"model_name", "engine"}),
        "vllm:num_requests_waiting_by_reason": ("gauge", {"model_name", "engine", "reason"}),
        "vllm:kv_cache_usage_perc": ("gauge", {"model_name", "engine"}),
        "vllm:prefix_cache_queries": ("counter", {"model_name", "engine"}),
        "vllm:prefix_cache_hits": ("counter", {"model_name", "engine"}),
        "vllm:prompt_tokens": ("counter", {"model_name", "engine"}),
        "vllm:generation_tokens": ("counter", {"model_name", "engine"}),
        "vllm:prompt_tokens_cached": ("counter", {"model_name", "engine"}),
        "vllm:prompt_tokens_by_source": ("counter", {"model_name", "engine", "source"}),
        "vllm:num_preemptions": ("counter", {"model_name", "engine"}),
        "vllm:request_success": ("counter", {"model_name", "engine", "finished_reason"}),
        "vllm:time_to_first_token_seconds": ("histogram", {"model_name", "engine"}),
        "vllm:inter_token_latency_seconds": ("histogram", {"model_name", "engine"}),
        "vllm:e2e_request_latency_seconds": ("histogram", {"model_name", "engine"}),
        "vllm:iteration_tokens_total": ("histogram", {"model_name", "engine"}),
        "vllm:cache_config_info": (
            "gauge",
            {"block_size", "gpu_memory_utilization", "enable_prefix_caching", "num_gpu_blocks", "engine"},
        ),
    },
    "sglang": {
        "sglang:num_running_reqs": (
            "gauge",
            {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"},
        ),
        "sglang:num_queue_reqs": (
            "gauge",
            {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"},
        ),
        "sglang:token_usage": ("gauge", {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}),
        "sglang:page_size": ("gauge", {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}),
        "sglang:max_total_num_tokens": (
            "gauge",
            {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"},
        ),
        "sglang:cache_hit_rate": (
            "gauge",
            {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"},
        ),
        "sglang:prefill_effective_tokens": (
            "counter",
            {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "mode"},
        ),
        "sglang:num_retracted_requests": (
            "counter",
            {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"},
        ),
        "sglang:prompt_tokens": ("counter", {"model_name", "engine_type", "is_streaming"}),
        "sglang:generation_tokens": ("counter", {"model_name", "engine_type", "is_streaming"}),
        "sglang:cached_tokens": ("counter", {"model_name", "engine_type", "cache_source"}),
        "sglang:num_requests": ("counter", {"model_name", "engine_type"}),
        "sglang:time_to_first_token_seconds": ("histogram", {"model_name", "engine_type", "is_streaming"}),
        "sglang:inter_token_latency_seconds": ("histogram", {"model_name", "engine_type"}),
        "sglang:e2e_request_latency_seconds": ("histogram", {"model_name", "engine_type", "is_streaming"}),
    },
    "trtllm": {
        "trtllm_num_requests_running": ("gauge", {"model_name", "engine_type"}),
        "trtllm_num_requests_waiting": ("gauge", {"model_name", "engine_type"}),
        "trtllm_kv_cache_utilization": ("gauge", {"model_name", "engine_type"}),
        "trtllm_kv_cache_hit_rate": ("gauge", {"model_name", "engine_type"}),
        "trtllm_kv_cache_tokens_per_block": ("gauge", {"model_name", "engine_type"}),
        "trtllm_kv_cache_reused_blocks": ("counter", {"model_name", "engine_type"}),
        "trtllm_kv_cache_missed_blocks": ("counter", {"model_name", "engine_type"}),
        "trtllm_prompt_cached_tokens": ("counter", {"model_name", "engine_type"}),
        "trtllm_prompt_tokens": ("counter", {"model_name", "engine_type"}),
        "trtllm_generation_tokens": ("counter", {"model_name", "engine_type"}),
        "trtllm_request_success": ("counter", {"model_name", "engine_type", "finished_reason"}),
        "trtllm_time_to_first_token_seconds": ("histogram", {"model_name", "engine_type"}),
        "trtllm_time_per_output_token_seconds": ("histogram", {"model_name", "engine_type"}),
        "trtllm_e2e_request_latency_seconds": ("histogram", {"model_name", "engine_type"}),
        "trtllm_kv_cache_config_info": (
            "gauge",
            {
                "model_name",
                "engine_type",
                "tokens_per_block",
                "enable_block_reuse",
                "free_gpu_memory_fraction",
            },
        ),
    },
}
# Buckets the engines use (first and last bound), to check they are the engines' own lists.
BUCKETS = {
    "vllm:time_to_first_token_seconds": (0.001, 2560.0),
    "vllm:inter_token_latency_seconds": (0.01, 80.0),
    # SGLang's own TTFT buckets start at 0.1 s; the command prefixtune renders adds sub-100 ms bounds
    # (--bucket-time-to-first-token), which the twin follows.
    "sglang:time_to_first_token_seconds": (0.005, 400.0),
    "sglang:inter_token_latency_seconds": (0.002, 8.0),
    "trtllm_request_prefill_time_seconds": (0.001, 2560.0),
}
NOT_EXPORTED = {"vllm": set(), "sglang": set(), "trtllm": {"trtllm_kv_cache_host_utilization"}}


def parse(text: str) -> tuple[dict[str, Any], list[Sample]]:
    families = {}
    samples: list[Sample] = []
    for fam in text_string_to_metric_families(text):
        families[fam.name] = fam
        samples.extend((s.name, dict(s.labels), float(s.value)) for s in fam.samples)
    return families, samples


def cumulative(samples: Iterable[Sample]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (n, frozenset(labels.items())): v
        for n, labels, v in samples
        if n.endswith(("_total", "_count", "_sum", "_bucket"))
    }


def total(samples: Iterable[Sample], name: str, **match: str) -> float:
    return sum(
        v for n, labels, v in samples if n == name and all(labels.get(k) == m for k, m in match.items())
    )


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        return resp.status, await resp.json()


# --- metrics -------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
async def test_metrics_have_the_engines_names_types_labels_and_grow(engine: str) -> None:
    adapter = get_adapter(engine)
    reqs = generate("rag", rate=4, duration_s=10, seed=3)[:12]
    async with (
        serving(engine, MODEL, GPU, (), ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
    ):
        records = await run_load(reqs[:6], [url], speedup=SPEEDUP, session=http)
        assert all(r.ok for r in records), [r.error for r in records]
        async with http.get(f"{url}{adapter.metrics_path}") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            first_text = await resp.text()
        await run_load(reqs[6:], [url], speedup=SPEEDUP, session=http)
        async with http.get(f"{url}{adapter.metrics_path}") as resp:
            second_text = await resp.text()

    families, first = parse(first_text)
    _, second = parse(second_text)
    for name, (kind, labels) in EXPECTED[engine].items():
        assert name in families, f"{engine}: {name} missing"
        assert families[name].type == kind, f"{name}: {families[name].type} != {kind}"
        for s in families[name].samples:
            assert labels <= set(s.labels), (
                f"{name}: labels {sorted(s.labels)} lack {sorted(labels - set(s.labels))}"
            )
    # Every series the metrics layer reads (the adapter's MetricNames) is exported.
    names = {n for n, _, _ in first}
    m = adapter.metrics
    wanted = [
        m.requests_running, m.requests_waiting, m.kv_usage, m.prompt_tokens, m.generation_tokens,
        m.requests_finished, m.preemptions, m.hit_numerator, m.hit_denominator, m.hit_miss,
        m.cached_prompt_tokens, m.config_info,
    ]  # fmt: skip
    wanted += [f"{h}_bucket" for h in (m.ttft, m.itl, m.e2e) if h]
    wanted += [v for v in m.extra.values() if re.fullmatch(r"(vllm|sglang):\w+|trtllm_\w+", v)]
    missing = {w for w in wanted if w and w not in names and w + "_bucket" not in names}
    assert missing <= NOT_EXPORTED[engine], f"{engine}: adapter names not exported: {sorted(missing)}"
    # Histogram buckets are the engines' own lists.
    for hist, (lo, hi) in BUCKETS.items():
        if hist in families:
            bounds = sorted(
                float(s.labels["le"]) for s in families[hist].samples if s.name.endswith("_bucket")
            )
            assert bounds[0] == lo and bounds[-2] == hi and bounds[-1] == float("inf")
    # Counters only grow; this traffic shared the RAG context, so the hit counters grew.
    before, after = cumulative(first), cumulative(second)
    assert before.keys() <= after.keys()
    assert all(after[k] >= v for k, v in before.items())
    assert any(after[k] > v for k, v in before.items())
    if engine == "vllm":
        assert total(second, "vllm:prefix_cache_hits_total") > 0.5 * total(
            second, "vllm:prefix_cache_queries_total"
        )
        assert total(second, "vllm:request_success_total") == 12
        assert total(second, "vllm:prompt_tokens_total") == sum(r.prompt_len for r in reqs)
    elif engine == "sglang":
        hit = total(second, "sglang:prefill_effective_tokens_total", mode="device_hit")
        assert hit > 0.5 * total(second, "sglang:prefill_effective_tokens_total")
        assert total(second, "sglang:num_requests_total") == 12
    else:
        reused = total(second, "trtllm_kv_cache_reused_blocks_total")
        assert reused > total(second, "trtllm_kv_cache_missed_blocks_total") > 0
        assert total(second, "trtllm_prompt_cached_tokens_total") > 0
    # The effective config reads back through the adapter, as the operator does after a rollout.
    effective = adapter.effective_config(second)
    assert effective["block_size"] == adapter.default_config().block_size
    assert int(effective["kv_tokens"]) > 100_000  # type: ignore[call-overload]


async def test_dcgm_exporter_reports_busy_gpu() -> None:
    server = make_server(
        "vllm", MODEL, GPU, (), ServeOptions(speedup=SPEEDUP, dcgm_port=0, pod="p-0", namespace="ns")
    )
    await server.start()
    try:
        reqs = generate("qa", rate=60, duration_s=2, seed=1)
        async with aiohttp.ClientSession() as http:
            # Send everything at once and scrape while the engine is busy.
            tasks = [asyncio.create_task(post(http, server.url, completion_body(r, MODEL))) for r in reqs]
            await asyncio.sleep(0.02)
            async with http.get(f"{server.dcgm_url}/metrics") as resp:
                text = await resp.text()
            await asyncio.gather(*tasks)
            async with http.get(f"{server.url}/metrics") as resp:
                engine_text = await resp.text()
    finally:
        await server.stop()
    families, _ = parse(text)
    (fam,) = families.values()
    assert fam.name == "DCGM_FI_DEV_GPU_UTIL" and fam.type == "gauge"
    (s,) = fam.samples
    assert {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "pod", "namespace"} <= set(
        s.labels
    )
    assert s.labels["pod"] == "p-0" and s.labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert 0 < s.value <= 100
    assert "DCGM" not in engine_text  # GPU utilization is not an engine metric


# --- completions ------------------------------------------------------------------------------


async def test_completions_with_token_arrays() -> None:
    shared = list(range(1000, 1000 + 2048))
    async with (
        serving("vllm", MODEL, GPU, (), ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
    ):
        async with http.get(f"{url}/health") as resp:
            assert resp.status == 200
        async with http.get(f"{url}/v1/models") as resp:
            models = await resp.json()
        assert models["data"][0]["id"] == MODEL and models["data"][0]["owned_by"] == "vllm"

        status, first = await post(http, url, {"model": MODEL, "prompt": [*shared, 1, 2, 3], "max_tokens": 5})
        assert status == 200
        assert first["usage"] == {
            "prompt_tokens": 2051,
            "completion_tokens": 5,
            "total_tokens": 2056,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        assert first["object"] == "text_completion" and first["choices"][0]["finish_reason"] == "length"
        # Same 2,048-token prefix, other suffix: vLLM hits the full 16-token blocks of it.
        status, second = await post(
            http, url, {"model": MODEL, "prompt": [*shared, 7, 8], "max_tokens": 3, "return_token_ids": True}
        )
        assert status == 200
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 2048
        assert len(second["choices"][0]["token_ids"]) == 3
        # A batch of prompts: one choice each, usage summed.
        status, batch = await post(http, url, {"prompt": [[*shared, 9], [5, 6, 7]], "max_tokens": 2})
        assert status == 200
        assert [c["index"] for c in batch["choices"]] == [0, 1]
        assert batch["usage"]["prompt_tokens"] == 2049 + 3
        assert batch["usage"]["prompt_tokens_details"]["cached_tokens"] == 2048


async def test_streaming_completion() -> None:
    async with (
        serving("sglang", MODEL, GPU, (), ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
    ):
        body = {
            "model": MODEL,
            "prompt": list(range(300)),
            "max_tokens": 20,
            "stream": True,
            "return_token_ids": True,
        }
        async with http.post(f"{url}/v1/completions", json=body) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            raw = (await resp.read()).decode()
    events = [line[len("data: ") :] for line in raw.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["token_ids"] and len(chunks[0]["choices"][0]["token_ids"]) == 1
    ids = [t for c in chunks for t in c["choices"][0].get("token_ids", [])]
    assert len(ids) == 20
    assert chunks[-1]["usage"]["completion_tokens"] == 20


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        ({"model": "other", "prompt": [1, 2], "max_tokens": 1}, 404, "The model `other` does not exist."),
        ({"prompt": [], "max_tokens": 1}, 400, "prompt must be"),
        ({"prompt": [1, "a"], "max_tokens": 1}, 400, "prompt must be"),
        ({"prompt": [1, 2], "max_tokens": 0}, 400, "max_tokens must be an integer >= 1"),
        ({"prompt": [1, 2**40], "max_tokens": 1}, 400, "out of vocabulary"),
        ({"prompt": [1] * 131_000, "max_tokens": 1000}, 400, "maximum context length is 131072"),
        ({"prompt": [1, 2], "prefixtune": {"output_token_ids": "x"}}, 400, "prefixtune.output_token_ids"),
    ],
)
async def test_bad_completion_requests(body: dict[str, Any], status: int, text: str) -> None:
    async with (
        serving("vllm", MODEL, GPU, (), ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
    ):
        got, data = await post(http, url, body)
    assert got == status
    # vLLM's error body is OpenAI's {"error": {message, type, param, code}} (openai_api.error_body).
    assert set(data) == {"error"} and text in data["error"]["message"] and data["error"]["code"] == status


async def test_output_identity_extension_makes_the_next_turn_hit() -> None:
    # A two-turn conversation: turn 2's prompt holds turn 1's prompt AND output.
    reqs = [r for r in generate("chatbot", rate=2, duration_s=600, seed=5) if r.session == 0][:2]
    assert len(reqs) == 2
    turn1, turn2 = reqs
    assert turn2.seq.common_prefix(turn1.seq) == turn1.seq.length

    async def cached_on_second(identity: bool) -> int:
        async with (
            serving("sglang", MODEL, GPU, (), ServeOptions(speedup=SPEEDUP)) as url,
            aiohttp.ClientSession() as http,
        ):
            for r in (turn1, turn2):
                status, data = await post(http, url, completion_body(r, MODEL, output_identity=identity))
                assert status == 200
            return int(data["usage"]["prompt_tokens_details"]["cached_tokens"])

    with_ids = await cached_on_second(True)
    without = await cached_on_second(False)
    # SGLang (page 1): with the extension the whole previous sequence but its last token is cached
    # (the last output token never gets KV); without it only the previous prompt is.
    assert with_ids == turn1.seq.length - 1
    assert without == turn1.prompt_len


# --- load generator -------------------------------------------------------------------------


async def test_loadgen_spreads_requests_over_targets() -> None:
    reqs = generate("agent", rate=10, duration_s=10, seed=2)  # agent steps come seconds apart
    async with (
        serving("vllm", MODEL, GPU, (), ServeOptions(speedup=SPEEDUP)) as a,
        serving("vllm", MODEL, GPU, (), ServeOptions(speedup=SPEEDUP, seed=1)) as b,
        aiohttp.ClientSession() as http,
    ):
        robin = await run_load(reqs, [a, b], speedup=SPEEDUP, balance="round-robin", session=http)
        rand = await run_load(reqs, [a, b], speedup=SPEEDUP, seed=3, session=http)
        few = await run_load(reqs, [a, b], speedup=SPEEDUP, seed=3, max_requests=40, session=http)
    assert [r.req_id for r in robin] == [
        r.req_id for r in sorted(reqs, key=lambda r: (r.arrival_s, r.req_id))
    ]
    assert all(r.ok for r in robin)
    assert [r.target for r in robin[:4]] == [a, b, a, b]
    summary = summarize_records(robin)
    assert summary["by_target"] == {a: (len(reqs) + 1) // 2, b: len(reqs) // 2}
    assert summary["prompt_tokens"] == sum(r.prompt_len for r in reqs)
    assert 0 < summary["cached_fraction"] < 1
    assert len(few) == 40 and set(summarize_records(rand)["by_target"]) == {a, b}
    # Sessions are not sticky: some session's turns went to both replicas.
    targets: dict[int | None, set[str]] = {}
    for r in rand:
        targets.setdefault(r.session, set()).add(r.target)
    assert any(len(t) == 2 for t in targets.values())
    # Sent at their arrival times (scaled by the speedup).
    assert all(r.sent_s >= r.scheduled_s - 0.01 for r in robin)


async def test_loadgen_is_bounded_in_time() -> None:
    reqs = generate("qa", rate=10, duration_s=100, seed=1)
    async with serving("vllm", MODEL, GPU, (), ServeOptions(speedup=20)) as url:
        records = await run_load(reqs, [url], speedup=20, max_duration_s=0.2)
    assert 0 < len(records) < len(reqs)
    assert max(r.scheduled_s for r in records) < 0.2


async def test_loadgen_paces_arrivals_on_the_clock_it_is_given() -> None:
    # A twin on a sandbox clock that a busy machine slows is offered its load at that clock's pace:
    # here a clock at a quarter of the wall's speed; no request goes out before it is due on it.
    reqs = generate("qa", rate=50, duration_s=1.0, seed=1)[:8]
    start = time.monotonic()

    def slow() -> float:
        return (time.monotonic() - start) / 4

    async with serving("vllm", MODEL, GPU, (), ServeOptions(speedup=20)) as url:
        records = await run_load(reqs, [url], speedup=20, clock=slow)
    assert len(records) == len(reqs)
    assert all(r.sent_s >= r.scheduled_s for r in records), [(r.scheduled_s, r.sent_s) for r in records]


# --- health and OOM --------------------------------------------------------------------------


def _burst(n: int, length: int) -> list[list[int]]:
    return [[(i * 7919 + j) % 128_000 for j in range(length)] for i in range(n)]


async def test_runtime_oom_fails_health_and_exits_nonzero() -> None:
    server = make_server(
        "vllm",
        MODEL,
        GPU,
        ["--gpu-memory-utilization", "0.99"],
        ServeOptions(speedup=SPEEDUP, exit_delay_s=0.2),
    )
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{server.url}/health") as resp:
                assert resp.status == 200
            # 300 requests at once: the running batch outgrows the activation memory left at 0.99.
            status, data = await post(http, server.url, {"prompt": _burst(300, 300), "max_tokens": 64})
            assert status == 500 and "CUDA out of memory" in error_message(data)
            async with http.get(f"{server.url}/health") as resp:
                assert resp.status == 503
            await asyncio.wait_for(server.exited.wait(), timeout=5)
        assert server.exit_code == 1
        assert server.engine.status == "oom_runtime"
    finally:
        await server.stop()


def test_startup_oom_exits_nonzero(capsys: pytest.CaptureFixture[str]) -> None:
    code = serve_main(
        [
            "--engine",
            "vllm",
            "--model",
            MODEL,
            "--gpu",
            GPU,
            "--port",
            "0",
            "--",
            "--gpu-memory-utilization",
            "0.1",
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("ValueError: out of memory at start-up:")
    assert "KV cache" in err


def test_serve_rejects_bad_engine_args(capsys: pytest.CaptureFixture[str]) -> None:
    code = serve_main(["--engine", "vllm", "--model", MODEL, "--gpu", GPU, "--", "--block-size", "7"])
    assert code == 2
    assert "block" in capsys.readouterr().err


def test_serve_process_exits_after_runtime_oom() -> None:
    """The real command: a process that serves, then dies with a non-zero code after a runtime OOM."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "prefixtune.cli", "twin", "serve", "--engine", "sglang", "--model", MODEL]
    cmd += ["--gpu", GPU, "--port", "0", "--speedup", str(SPEEDUP), "--exit-delay", "0.2"]
    cmd += ["--", "--mem-fraction-static", "0.97"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        match = re.search(r"at (http://\S+)", line)
        assert match, line
        url = match.group(1)

        async def crash() -> int:
            async with aiohttp.ClientSession() as http:
                status, _ = await post(http, url, {"prompt": _burst(300, 300), "max_tokens": 64})
                return status

        assert asyncio.run(crash()) == 500
        assert proc.wait(timeout=20) == 1
        assert "OutOfMemoryError" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_request_body_carries_prompt_and_output_identity() -> None:
    (req,) = [r for r in generate("chatbot", rate=1, duration_s=30, seed=1)][:1]
    body = completion_body(req, MODEL)
    tokens = req.seq.to_tokens()
    assert body["prompt"] == tokens[: req.prompt_len] and body["max_tokens"] == req.output_len
    assert body["prefixtune"]["output_token_ids"] == tokens[req.prompt_len :]
    assert "prefixtune" not in completion_body(req, None, output_identity=False)
    assert isinstance(req, Request)


async def test_stop_aborts_in_flight_requests_instead_of_waiting_for_them() -> None:
    # Real time (speedup 1): a 4,000-token answer would take minutes; stop() must not wait for it.
    server = make_server("vllm", MODEL, GPU, (), ServeOptions(speedup=1.0))
    await server.start()
    async with aiohttp.ClientSession() as http:
        task = asyncio.create_task(post(http, server.url, {"prompt": _burst(1, 100)[0], "max_tokens": 4000}))
        for _ in range(100):  # until the request is in flight
            if server.pending:
                break
            await asyncio.sleep(0.01)
        assert server.pending
        t0 = asyncio.get_running_loop().time()
        await asyncio.wait_for(server.stop(), timeout=10)
        assert asyncio.get_running_loop().time() - t0 < 5
        status, data = await asyncio.wait_for(task, timeout=5)
    assert status == 503 and "shutting down" in error_message(data)


async def test_a_list_of_text_prompts_gets_one_choice_each_and_shared_text_hits() -> None:
    shared = "You are a helpful assistant. " * 40  # 1,160 bytes: 290 tokens of 4 bytes
    async with (
        serving("sglang", MODEL, GPU, (), ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
    ):
        status, _ = await post(http, url, {"model": MODEL, "prompt": shared + "first", "max_tokens": 2})
        assert status == 200
        status, batch = await post(
            http, url, {"model": MODEL, "prompt": [shared + "second", shared + "third"], "max_tokens": 2}
        )
    assert status == 200
    assert [c["index"] for c in batch["choices"]] == [0, 1]
    assert batch["usage"]["prompt_tokens"] == 2 * 290 + 2 + 2  # "seco" "nd", "thir" "d"
    assert batch["usage"]["prompt_tokens_details"]["cached_tokens"] >= 2 * 290


async def test_an_empty_string_in_a_prompt_list_is_refused_naming_it() -> None:
    async with (
        serving("vllm", MODEL, GPU, (), ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
    ):
        status, data = await post(http, url, {"prompt": ["a text", ""], "max_tokens": 1})
    assert status == 400 and "empty string" in data["error"]["message"]


@pytest.mark.parametrize("path", ["/get_server_info", "/server_info", "/get_model_info", "/model_info"])
async def test_sglang_serves_the_information_routes_the_routers_probe(path: str) -> None:
    async with (
        serving("sglang", MODEL, GPU, ("--page-size", "16"), ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
        http.get(f"{url}{path}") as resp,
    ):
        assert resp.status == 200
        info = await resp.json()
    assert info["model_path"] == MODEL
    if "server" in path:
        assert info["page_size"] == 16 and info["tp_size"] == 1 and info["max_total_num_tokens"] > 0


async def test_vllm_serves_no_sglang_information_routes() -> None:
    async with (
        serving("vllm", MODEL, GPU, (), ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
        http.get(f"{url}/get_model_info") as resp,
    ):
        assert resp.status == 404

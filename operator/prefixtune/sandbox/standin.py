"""Light stand-in pods: a recorded engine /metrics exposition instead of a live twin.

``prefixtune bench scale`` runs hundreds of ServingDeployments on one small machine to measure the
operator; a live twin per pod would measure the twins. With ``KubeletConfig(stand_in=True)`` the
kubelet runs each engine container as a ``StandInPod``: it answers the engine's health and ready
paths (200, or 503 after an injected OOM) and serves on the metrics path an exposition recorded from
a twin of the same engine (``data/standin-<engine>.json``, made by ``python -m
prefixtune.sandbox.standin record``):

* counters and histograms advance at the rates recorded (the recording holds two expositions a
  known simulated interval apart), on the sandbox clock times the speed-up, from the recorded start
  values, so a measurement window sees traffic, requests and latencies as on the twin;
* gauges, the config-info series among them, are rendered once at the pod's start by the twin's own
  exporter, bound to the recorded engine state but with the block size the pod's command line names,
  so the operator reads back the knobs it rendered (its ``config_checked``) as from a twin;
* ``process_start_time_seconds`` is the pod's start: a restarted pod is a new process.

Every score is the same whatever the knobs (the recording does not depend on them): the stand-in
exercises the operator's machinery, not its judgement. There is no OpenAI API and no DCGM endpoint.

One ``StandInServer`` per kubelet serves every stand-in pod: one aiohttp low-level server (one
handler, no thread per pod) listening on each pod's loopback address and port, dispatching each
request by the local address it arrived on. It runs on an event loop of its own, in a thread of its
own, as a pod is a process of its own: on the sandbox's loop a scrape waited behind every API request
queued before it (``bench scale`` at N = 500: half of a slow reconcile's time was its scrape). The
interpreter's switch interval (5 ms) bounds how long a scrape waits for the sandbox's thread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from prefixtune.engines import get_adapter
from prefixtune.engines.base import ParsedCommand

T = TypeVar("T")
DATA = Path(__file__).resolve().parent / "data"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CUMULATIVE = ("counter", "histogram", "summary")  # families whose samples advance over time


@dataclass(frozen=True)
class Sample:
    """One sample line of a cumulative family: its text before the value, start value and rate."""

    key: str
    start: float
    per_s: float  # per simulated second
    whole: bool  # an integer count (rendered floored: a request counter never shows 2.5)

    def at(self, sim_s: float) -> float:
        value = self.start + self.per_s * max(sim_s, 0.0)
        return float(math.floor(value)) if self.whole else value


@dataclass(frozen=True)
class Family:
    header: tuple[str, ...]  # its # HELP and # TYPE lines
    samples: tuple[Sample, ...]


@dataclass(frozen=True, eq=False)
class Recording:
    """What a twin exported over ``interval_s`` simulated seconds (``record``)."""

    engine: str
    model: str
    gpu: str
    workload: str
    rate: float
    interval_s: float
    gauges: Mapping[str, Any]  # the twin engine's ``Gauges`` at the end of the interval
    start: str  # the exposition at the interval's start
    end: str  # ... and at its end

    @classmethod
    def load(cls, engine: str) -> Recording:
        return _load(get_adapter(engine).name)

    def cumulative(self) -> tuple[Family, ...]:
        """The counter and histogram families, each sample with its recorded rate (computed once)."""
        cached: tuple[Family, ...] | None = self.__dict__.get("_families")
        if cached is None:
            cached = _cumulative(self)
            object.__setattr__(self, "_families", cached)
        return cached


@cache
def _load(engine: str) -> Recording:
    path = DATA / f"standin-{engine}.json"
    raw = json.loads(path.read_text())
    return Recording(**raw)


def split_families(text: str) -> list[tuple[str, str, list[str], list[str]]]:
    """(name, type, header lines, sample lines) per family of a text exposition, in order."""
    out: list[tuple[str, str, list[str], list[str]]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("# HELP "):
            out.append((line.split(" ", 3)[2], "untyped", [line], []))
        elif line.startswith("# TYPE "):
            parts = line.split(" ")
            if not out or out[-1][0] != parts[2]:
                out.append((parts[2], "untyped", [], []))
            name, _, header, samples = out[-1]
            out[-1] = (name, parts[3] if len(parts) > 3 else "untyped", [*header, line], samples)
        elif line.startswith("#"):
            continue
        else:
            if not out:
                out.append((line.split("{", 1)[0].split(" ", 1)[0], "untyped", [], []))
            out[-1][3].append(line)
    return out


def _sample(line: str) -> tuple[str, float]:
    key, _, value = line.rpartition(" ")
    return key, float(value)


def _cumulative(rec: Recording) -> tuple[Family, ...]:
    ends = {
        key: value
        for _, kind, _, lines in split_families(rec.end)
        if kind in CUMULATIVE
        for key, value in map(_sample, lines)
    }
    families = []
    for _, kind, header, lines in split_families(rec.start):
        if kind not in CUMULATIVE:
            continue
        samples = []
        for line in lines:
            key, start = _sample(line)
            if key.split("{", 1)[0].endswith("_created"):
                continue  # a creation time, not a count: the pod's own start says when it began
            end = ends.get(key, start)
            whole = float(start).is_integer() and float(end).is_integer()
            samples.append(Sample(key, start, max(end - start, 0.0) / rec.interval_s, whole))
        families.append(Family(tuple(header), tuple(samples)))
    return tuple(families)


START_TIME_SAMPLE = "process_start_time_seconds"


def gauge_text(rec: Recording, parsed: ParsedCommand, started_at: float) -> str:
    """The gauge families (config info included) of an engine running ``parsed``, in the recorded
    state: the twin's exporter renders them, so their names and labels are the twin's. Rendered
    once per recording and command (building the exporter took ~13% of the sandbox's CPU at
    N = 500, a pod starting per trial); only the start time and the metrics' creation times
    (``_created``, the wall clock now, as the exporter writes them) differ from pod to pod."""
    from prometheus_client import utils

    as_go: Callable[[float], str] = utils.floatToGoString  # how the exporter writes a value
    zero = f"{START_TIME_SAMPLE} {as_go(0.0)}"
    created = as_go(time.time())  # the exporter stamps its metrics' creation on the wall clock
    lines = []
    for line in _gauge_text(rec, parsed).split("\n"):
        if line == zero:
            line = f"{START_TIME_SAMPLE} {as_go(started_at)}"
        elif line.split("{", 1)[0].split(" ", 1)[0].endswith("_created"):
            line = f"{line.rsplit(' ', 1)[0]} {created}"
        lines.append(line)
    return "\n".join(lines)


_AT_ZERO: dict[tuple[Recording, str], str] = {}  # (recording, repr of the command): gauges at time 0
AT_ZERO_LIMIT = 1024  # commands kept (a fleet's configs); past it the cache starts over


def _gauge_text(rec: Recording, parsed: ParsedCommand) -> str:
    """``gauge_text`` of a pod started at time 0 (a command's options are not hashable: its repr,
    which names every field, is the key)."""
    key = (rec, repr(parsed))
    if key not in _AT_ZERO:
        if len(_AT_ZERO) >= AT_ZERO_LIMIT:
            _AT_ZERO.clear()
        _AT_ZERO[key] = _render_gauges(rec, parsed, 0.0)
    return _AT_ZERO[key]


def _render_gauges(rec: Recording, parsed: ParsedCommand, started_at: float) -> str:
    from prefixtune.twin.exporter import EngineExporter
    from prefixtune.twin.observer import Gauges

    recorded = Gauges(**dict(rec.gauges))
    block = int(parsed.config.block_size)
    blocks = max(1, recorded.pool_tokens // max(block, 1))
    used = min(blocks, round(blocks * recorded.kv_usage))
    gauges = replace(
        recorded, block_size=block, pool_blocks=blocks, free_blocks=blocks - used, pool_tokens=blocks * block
    )
    exporter = EngineExporter(rec.engine, parsed.model, parsed=parsed, start_time=started_at)
    exporter.bind(lambda: gauges)
    text = exporter.render().decode()
    keep = []
    for _, kind, header, lines in split_families(text):
        if kind not in CUMULATIVE:
            keep.extend([*header, *lines])
    return "\n".join(keep) + "\n"


class StandInPod:
    """One pod's engine as a stand-in (the kubelet's handle: ``url``, ``exited``, ``on_oom``)."""

    def __init__(
        self,
        server: StandInServer,
        host: str,
        port: int,
        parsed: ParsedCommand,
        *,
        speedup: float,
        clock: Callable[[], float],
        exit_delay_s: float,
    ) -> None:
        self.server = server
        self.host, self.port = host, port
        adapter = get_adapter(parsed.engine)
        self.recording = Recording.load(adapter.name)
        self.families = self.recording.cumulative()
        self.clock = clock
        self.speedup = speedup
        self.started = clock()
        self.gauges = gauge_text(self.recording, parsed, self.started)
        self.metrics_path = adapter.metrics_path
        self.health_paths = {adapter.health_path, adapter.ready_path}
        self.exit_delay_s = exit_delay_s
        self.exited = asyncio.Event()
        self.exit_code = 0
        self.oom_reason = ""
        self.url = f"http://{host}:{port}"
        self._dying: asyncio.Task[None] | None = None
        self._last_t = 0.0

    def sim_now(self) -> float:
        return (self.clock() - self.started) * self.speedup

    def exposition(self) -> str:
        # Never behind an earlier answer: the clock is read from the stand-ins' thread while the
        # sandbox's may be between the two halves of a tick, and a counter must not go down.
        t = self._last_t = max(self._last_t, self.sim_now())
        lines = [self.gauges.rstrip("\n")]
        for family in self.families:
            lines.extend(family.header)
            lines.extend(f"{s.key} {s.at(t)!r}" for s in family.samples)
        return "\n".join(lines) + "\n"

    def answer(self, path: str) -> web.Response:
        if path == self.metrics_path:
            return web.Response(body=self.exposition().encode(), headers={"Content-Type": CONTENT_TYPE})
        if path in self.health_paths:
            if self.oom_reason:
                return web.Response(status=503, text=f"engine dead: {self.oom_reason}")
            return web.Response(status=200)
        return web.Response(status=404, text="not found")

    def on_oom(self, reason: str) -> None:
        """As the twin: /health answers 503, then the process exits 1 after the exit delay."""
        self.oom_reason = reason
        if self._dying is None:
            self._dying = asyncio.get_running_loop().create_task(self._die())

    async def _die(self) -> None:
        await asyncio.sleep(self.exit_delay_s)
        self.exit_code = 1
        self.exited.set()

    async def start(self) -> str:
        await self.server.add(self)
        return self.url

    async def stop(self) -> None:
        if self._dying is not None:
            self._dying.cancel()
        await self.server.remove(self)


class StandInServer:
    """Every stand-in pod of a kubelet on one aiohttp server, on its own loop and thread (see the
    module docstring). ``add``, ``remove`` and ``close`` are called from the sandbox's loop."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, int], StandInPod] = {}
        self._listeners: dict[tuple[str, int], asyncio.AbstractServer] = {}
        self._server: web.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the stand-ins' loop (started on first use) and wait for it here."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="stand-in pods", daemon=True)
            self._thread.start()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        sock = request.transport.get_extra_info("sockname") if request.transport is not None else None
        pod = self.pods.get((str(sock[0]), int(sock[1]))) if sock else None
        if pod is None:
            return web.Response(status=503, text="no engine listens here")
        return pod.answer(request.path)

    async def _listen(self, host: str, port: int) -> asyncio.AbstractServer:
        if self._server is None:
            self._server = web.Server(self._handle, access_log=None)
        return await asyncio.get_running_loop().create_server(self._server, host, port, reuse_address=True)

    async def _unlisten(self, key: tuple[str, int]) -> None:
        listener = self._listeners.pop(key)
        listener.close()
        if self._server is not None:  # a killed container: its open connections go too
            for proto in list(self._server.connections):
                transport = proto.transport
                if transport is not None and transport.get_extra_info("sockname")[:2] == key:
                    transport.close()

    async def add(self, pod: StandInPod) -> None:
        """Listen on the pod's address (OSError, as a bind does, when it is taken)."""
        key = (pod.host, pod.port)
        listener = await self._run(self._listen(pod.host, pod.port))
        self.pods[key], self._listeners[key] = pod, listener

    async def remove(self, pod: StandInPod) -> None:
        key = (pod.host, pod.port)
        if self.pods.get(key) is not pod:
            return
        del self.pods[key]
        await self._run(self._unlisten(key))

    async def close(self) -> None:
        for pod in list(self.pods.values()):
            await self.remove(pod)
        if self._loop is None:
            return
        if self._server is not None:
            await self._run(self._server.shutdown(0.1))
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
        if not self._loop.is_running():
            self._loop.close()
        self._loop = self._thread = self._server = None


def record(
    engine: str,
    *,
    model: str = "meta-llama/Llama-3.1-8B-Instruct",
    gpu: str = "H100-80GB",
    workload: str = "chatbot",
    rate: float = 2.0,
    warmup_s: float = 120.0,
    interval_s: float = 300.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Run a twin of ``engine`` (default config) on ``workload`` and keep its exposition at the
    end of the warm-up and ``interval_s`` simulated seconds later (the recording's JSON)."""
    from dataclasses import asdict

    from prefixtune.twin.engine import TwinEngine
    from prefixtune.twin.exporter import EngineExporter
    from prefixtune.twin.workloads import generate

    adapter = get_adapter(engine)
    rendered = adapter.render(model, adapter.default_config())
    parsed = adapter.parse(rendered.argv, rendered.files)
    exporter = EngineExporter(adapter.name, model, parsed=parsed, start_time=0.0)
    eng = TwinEngine(parsed, gpu, seed, exporter)
    exporter.bind(
        eng.gauges, lambda: eng.cache.stats, eng.model.kv_bytes_per_token(eng.limits.kv_cache_dtype)
    )
    eng.submit_all(generate(workload, rate=rate, duration_s=warmup_s + interval_s + 60.0, seed=seed))
    eng.advance(warmup_s)
    start = exporter.render().decode()
    eng.advance(warmup_s + interval_s)
    end = exporter.render().decode()
    return {
        "engine": adapter.name,
        "model": model,
        "gpu": gpu,
        "workload": workload,
        "rate": rate,
        "interval_s": interval_s,
        "gauges": asdict(eng.gauges()),
        "start": start,
        "end": end,
    }


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m prefixtune.sandbox.standin")
    sub = p.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="record the stand-ins' expositions from twins (data/)")
    rec.add_argument("--engines", default="vllm,sglang,trtllm")
    rec.add_argument("--workload", default="chatbot")
    rec.add_argument("--rate", type=float, default=2.0)
    ns = p.parse_args(list(argv))
    DATA.mkdir(exist_ok=True)
    for engine in ns.engines.split(","):
        out = record(engine.strip(), workload=ns.workload, rate=ns.rate)
        path = DATA / f"standin-{out['engine']}.json"
        path.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""The twin's cache-aware rule against the real router (sglang-router 0.3.2 from its wheel, the
sandbox extra): four stub workers that answer what the router probes and count which sessions they
served; new chat sessions sharing one system prompt, then each session's second turn.

What it pins (measured here first, 2026-12-04): with the system prompt above the cache threshold's
share of a first prompt, the real router sends every new session to one worker and keeps each
session's turns there, so the cache-aware policy trades balance for affinity; the twin's model
(``twin/router.py``) decides the same on the same stream. ``bench routing``'s chatbot result (a
cache-aware hit rate under one cache's) rests on exactly this rule.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from prefixtune.routing.policy import RoutingPolicy
from prefixtune.twin.prompt import Segment, TokenSeq, chain_key
from prefixtune.twin.request import Request
from prefixtune.twin.router import RouterModel, RoutingConfig

SESSIONS = 16
SYSTEM_WORDS, USER_WORDS, ANSWER_WORDS = 300, 150, 120  # the system prompt: ~2/3 of a first prompt
_SESSION = re.compile(r"USER(\d+):")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Workers:
    """Four stub engines on one event loop in a thread: what the router probes, and a completions
    route that records the session of each prompt it serves."""

    def __init__(self, n: int = 4) -> None:
        self.ports = [_free_port() for _ in range(n)]
        self.served: list[Counter[str]] = [Counter() for _ in range(n)]
        self._loop = asyncio.new_event_loop()
        self._runners: list[web.AppRunner] = []
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def _app(self, i: int) -> web.Application:
        async def get(request: web.Request) -> web.Response:
            if request.path.endswith("model_info"):
                return web.json_response({"model_path": "m", "tokenizer_path": "m", "is_generation": True})
            if request.path.endswith("server_info"):
                return web.json_response({"model_path": "m", "dp_size": 1})
            if request.path == "/v1/models":
                return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})
            return web.json_response({})

        async def post(request: web.Request) -> web.Response:
            body = await request.json()
            match = _SESSION.findall(str(body.get("prompt", "")))
            self.served[i][match[-1] if match else "?"] += 1
            return web.json_response(
                {
                    "id": "c",
                    "object": "text_completion",
                    "model": "m",
                    "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            )

        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", get)
        app.router.add_route("POST", "/{tail:.*}", post)
        return app

    def start(self) -> None:
        self._thread.start()

        async def up() -> None:
            for i, port in enumerate(self.ports):
                runner = web.AppRunner(self._app(i))
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", port).start()
                self._runners.append(runner)

        asyncio.run_coroutine_threadsafe(up(), self._loop).result(30)

    def stop(self) -> None:
        async def down() -> None:
            for runner in self._runners:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(down(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def worker_of(self, session: int) -> set[int]:
        return {i for i, c in enumerate(self.served) if c[str(session)]}


@pytest.fixture
def workers() -> Iterator[_Workers]:
    w = _Workers()
    w.start()
    yield w
    w.stop()


def _router_binary() -> str:
    path = Path(sys.executable).parent / "sglang-router"
    assert path.exists(), f"{path} is missing: the sandbox extra installs sglang-router==0.3.2"
    return str(path)


def _launch(workers: _Workers, *flags: str) -> tuple[subprocess.Popen[bytes], int]:
    port, metrics = _free_port(), _free_port()
    urls = [f"http://127.0.0.1:{p}" for p in workers.ports]
    argv = [_router_binary(), "launch", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics)]
    argv += ["--worker-urls", *urls, *flags]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 120  # a start-up on a loaded machine: generous, it ends at health
    while time.monotonic() < deadline:
        assert proc.poll() is None, (proc.stderr.read() if proc.stderr else b"").decode()[-2000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/workers", timeout=5) as r:
                listed = json.loads(r.read())["workers"]
            if len(listed) == len(urls) and all(w.get("is_healthy") for w in listed):
                return proc, port
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    proc.kill()
    raise AssertionError("sglang-router did not list its four workers as healthy within 120 s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(20)
    if proc.stderr:
        proc.stderr.close()


def _words(seed: int, n: int) -> str:
    return " ".join(f"w{(seed * 7919 + k * 104729) % 100003}" for k in range(n))


def _first(i: int) -> str:
    return f"SYSTEM: {_words(0, SYSTEM_WORDS)} USER{i}: {_words(1000 + i, USER_WORDS)}"


def _second(i: int) -> str:
    return f"{_first(i)} ASSISTANT: {_words(2000 + i, ANSWER_WORDS)} USER{i}: {_words(3000 + i, USER_WORDS)}"


def _send(port: int, prompt: str) -> None:
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 1}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


def _drive(port: int) -> None:
    for i in range(SESSIONS):
        _send(port, _first(i))
    for i in range(SESSIONS):
        _send(port, _second(i))


def test_round_robin_reaches_all_four_stub_workers(workers: _Workers) -> None:
    proc, port = _launch(workers, "--policy", "round_robin")
    try:
        _drive(port)
    finally:
        _stop(proc)
    assert [sum(c.values()) for c in workers.served] == [2 * SESSIONS // 4] * 4


def test_the_real_cache_aware_router_puts_sessions_sharing_a_system_prompt_on_one_worker(
    workers: _Workers,
) -> None:
    proc, port = _launch(workers, "--policy", "cache_aware")
    try:
        _drive(port)
    finally:
        _stop(proc)
    served = [sum(c.values()) for c in workers.served]
    assert sorted(served) == [0, 0, 0, 2 * SESSIONS], served
    assert all(len(workers.worker_of(i)) == 1 for i in range(SESSIONS))


def _tokens(text: str) -> TokenSeq:
    """The same stream as the twin sees it: one segment per section of the text, keyed by its
    content and what precedes it (the twin's prefix identity); a word per token."""
    segs, key = [], 0
    for part in re.split(r"(?= USER\d+: | ASSISTANT: )", text):
        key = chain_key(key, part)
        segs.append(Segment(key, len(part.split())))
    return TokenSeq(tuple(segs))


def test_the_twins_model_decides_the_same_on_the_same_stream() -> None:
    model = RouterModel(RoutingConfig(policy=RoutingPolicy.CACHE_AWARE), 4, seed=0)
    chosen: dict[int, set[int]] = {}
    texts = [(i, _first(i)) for i in range(SESSIONS)] + [(i, _second(i)) for i in range(SESSIONS)]
    for n, (i, text) in enumerate(texts):
        seq = _tokens(text)
        routed = model.route(Request(n, float(n), seq, seq.length, 1, session=i), [0, 0, 0, 0], float(n))
        chosen.setdefault(i, set()).add(routed.replica)
    assert len(set().union(*chosen.values())) == 1
    assert all(len(r) == 1 for r in chosen.values())

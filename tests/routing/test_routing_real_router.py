"""The twin's cache-aware rule against the real routers (sglang-router 0.3.2 and vllm-router 0.1.17
from their wheels, the sandbox extra): four stub workers that answer what the routers probe and count
which sessions they served; new sessions sharing one system prompt, then each session's second turn.

What it pins (measured here first: sglang-router 2026-12-04, vllm-router 2026-12-05): with the system
prompt above the cache threshold's share of a first prompt, the real cache-aware router sends every
new session to one worker and keeps each session's turns there, so the cache-aware policy trades
balance for affinity; the twin's model (``twin/router.py``) decides the same on the same stream.
``bench routing``'s chatbot result (a cache-aware hit rate under one cache's) rests on exactly this
rule.

The two routers read different things. sglang-router matches the request's TEXT, so any worker that
speaks the OpenAI API will do (trtllm-serve, which answers SGLang's info probes with 404 or without
SGLang's keys, included). vllm-router's cache_aware matches TOKEN IDS that it asks every worker for first
(``POST /v1/completions/render``, vLLM's scale-out endpoint); a worker that answers no token ids (403
from vLLM without ``--enable-scale-out``, 404 from trtllm-serve) leaves every decision
``missing_tokens`` and the requests spread by load alone, cache-blind. That is why TensorRT-LLM runs
behind sglang-router (``routing/settings.py``); vllm-router's consistent_hash needs no token ids (a
hash of the session header), so a TensorRT-LLM resource may still name it for session affinity.
vllm-router's tree budget (``--max-tree-size``) still counts the text's characters, not the token
ids it routes on, as the operator sizes it (pool tokens x 4).
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
import zlib
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import pytest
from aiohttp import web

from prefixtune.engines.base import EngineName
from prefixtune.metrics.exposition import parse
from prefixtune.routing.metrics import ROUTER_METRICS
from prefixtune.routing.policy import ROUTER_COMMAND, ROUTER_VERSION, Router, RoutingPolicy
from prefixtune.routing.settings import ENGINE_ROUTER
from prefixtune.sandbox.load import SESSION_HEADER
from prefixtune.twin.prompt import Segment, TokenSeq, chain_key
from prefixtune.twin.request import Request
from prefixtune.twin.router import RouterModel, RoutingConfig

SESSIONS = 16
SYSTEM_WORDS, USER_WORDS, ANSWER_WORDS = 300, 150, 120  # the system prompt: ~2/3 of a first prompt
EVICTION_WAIT_S = 5.0  # vllm-router evicts its trees every --eviction-interval-secs (1 s in the test)
HOLD_S = 2.0  # a held completion's seconds in flight: generous, a turn's requests overlap under load
_SESSION = re.compile(r"USER(\d+):")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Probes(Enum):
    """What a stub worker answers besides the completions: the engine it stands for."""

    SGLANG = "sglang"  # /health, /v1/models, and SGLang's /server_info and /model_info (both spellings)
    # trtllm-serve's (NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_server.py register_routes): /health
    # (200, empty), /v1/models, /version, and a /server_info without SGLang's keys; 404 to the rest
    TRTLLM = "trtllm"


class Render(Enum):
    """How a stub worker answers vllm-router's ``POST /v1/completions/render``."""

    NONE = 404  # no such route: SGLang, trtllm-serve (1.3; 1.4.0rc4 mounts one only when enabled)
    FORBIDDEN = 403  # vLLM without --enable-scale-out
    TOKENS = 200  # vLLM with it: a list of {request_id, token_ids} (vLLM's GenerateRequest shape)


def _token_ids(text: str) -> list[int]:
    """A word per token, its id from a CRC of the word: the same in every process (no salted hash),
    so shared prefixes of text are shared prefixes of ids."""
    return [zlib.crc32(word.encode()) % 50_000 + 10 for word in text.split()]


class _Workers:
    """Four stub engines on one event loop in a thread: what the routers probe, vllm-router's render
    route (``render``), and a completions route that records the session of each prompt it serves and
    holds it ``hold_s`` seconds in flight."""

    def __init__(
        self, n: int = 4, probes: Probes = Probes.SGLANG, render: Render = Render.NONE, hold_s: float = 0.0
    ) -> None:
        self.ports = [_free_port() for _ in range(n)]
        self.served: list[Counter[str]] = [Counter() for _ in range(n)]
        self.rendered = [0] * n
        self.probes, self.render, self.hold_s = probes, render, hold_s
        self._loop = asyncio.new_event_loop()
        self._runners: list[web.AppRunner] = []
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def _app(self, i: int) -> web.Application:
        async def get(request: web.Request) -> web.Response:
            if request.path == "/health":
                return web.Response(status=200)
            if request.path == "/v1/models":
                return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})
            if self.probes is Probes.TRTLLM:
                if request.path == "/version":
                    return web.json_response({"version": "1.3.0rc24"})
                if request.path == "/server_info":
                    return web.json_response({"disaggregated_params": None})
                return web.json_response({"detail": "Not Found"}, status=404)
            if request.path.endswith("model_info"):
                return web.json_response({"model_path": "m", "tokenizer_path": "m", "is_generation": True})
            if request.path.endswith("server_info"):
                return web.json_response({"model_path": "m", "dp_size": 1})
            return web.json_response({})

        async def render(request: web.Request) -> web.Response:
            body = await request.json()
            self.rendered[i] += 1
            if self.render is Render.TOKENS:
                return web.json_response([{"request_id": "r", "token_ids": _token_ids(str(body["prompt"]))}])
            if self.render is Render.FORBIDDEN:
                error = {"message": "Scale-out endpoints are disabled", "type": "PermissionDeniedError"}
                return web.json_response({"error": {**error, "code": 403}}, status=403)
            return web.json_response({"detail": "Not Found"}, status=404)

        async def complete(request: web.Request) -> web.Response:
            body = await request.json()
            match = _SESSION.findall(str(body.get("prompt", "")))
            self.served[i][match[-1] if match else "?"] += 1
            await asyncio.sleep(self.hold_s)
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
        app.router.add_route("POST", "/v1/completions/render", render)
        app.router.add_route("POST", "/v1/completions", complete)
        app.router.add_route("GET", "/{tail:.*}", get)
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

    def totals(self) -> list[int]:
        return [sum(c.values()) for c in self.served]

    def worker_of(self, session: int) -> set[int]:
        return {i for i, c in enumerate(self.served) if c[str(session)]}


@pytest.fixture
def workers(request: pytest.FixtureRequest) -> Iterator[_Workers]:
    """Stub workers; ``@pytest.mark.parametrize("workers", [dict(...)], indirect=True)`` sets their
    probes, render answer and hold."""
    w = _Workers(**getattr(request, "param", {}))
    w.start()
    yield w
    w.stop()


def _router_argv(router: Router) -> list[str]:
    """The router's command (``ROUTER_COMMAND``, as the operator renders it) with its console script
    from this environment."""
    script, *rest = ROUTER_COMMAND[router]
    path = Path(sys.executable).parent / script
    assert path.exists(), (
        f"{path} is missing: the sandbox extra installs {router.value}=={ROUTER_VERSION[router]}"
    )
    return [str(path), *rest]


@dataclass(frozen=True)
class _Running:
    proc: subprocess.Popen[bytes]
    port: int
    metrics: int  # its --prometheus-port


def _launch(router: Router, workers: _Workers, *flags: str) -> _Running:
    port, metrics = _free_port(), _free_port()
    urls = [f"http://127.0.0.1:{p}" for p in workers.ports]
    argv = [*_router_argv(router), "--host", "127.0.0.1", "--port", str(port)]
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
                return _Running(proc, port, metrics)
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"{router.value} did not list its four workers as healthy within 120 s")


def _stop(running: _Running) -> None:
    proc = running.proc
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(20)
    if proc.stderr:
        proc.stderr.close()


def _decisions(running: _Running) -> Counter[str]:
    """vllm-router's cache-aware decisions by outcome (``routing/metrics.py``'s names)."""
    names = ROUTER_METRICS[Router.VLLM]
    with urllib.request.urlopen(f"http://127.0.0.1:{running.metrics}/metrics", timeout=10) as r:
        snap = parse(r.read().decode(), target="router", t=0.0)
    out: Counter[str] = Counter()
    for labels, value in snap.series(names.decisions):
        out[dict(labels)[names.outcome_label]] += int(value)
    return out


def _words(seed: int, n: int) -> str:
    return " ".join(f"w{(seed * 7919 + k * 104729) % 100003}" for k in range(n))


def _first(i: int) -> str:
    return f"SYSTEM: {_words(0, SYSTEM_WORDS)} USER{i}: {_words(1000 + i, USER_WORDS)}"


def _second(i: int) -> str:
    return f"{_first(i)} ASSISTANT: {_words(2000 + i, ANSWER_WORDS)} USER{i}: {_words(3000 + i, USER_WORDS)}"


def _send(port: int, prompt: str, session_header: bool = True) -> None:
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json"}
    if session_header:  # the sandbox load's session key
        headers[SESSION_HEADER] = f"session-{_SESSION.findall(prompt)[-1]}"
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body, headers=headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


def _drive(port: int) -> None:
    """Every session's first turn, then every second turn, one request at a time."""
    for i in range(SESSIONS):
        _send(port, _first(i))
    for i in range(SESSIONS):
        _send(port, _second(i))


def _drive_at_once(port: int, turns: tuple[int, ...] = (1, 2)) -> None:
    """Each turn's requests of all sessions sent together (held in flight by the workers), one turn
    after the other: the router decides them under load."""
    with ThreadPoolExecutor(SESSIONS) as pool:
        for turn in turns:
            prompts = [(_first if turn == 1 else _second)(i) for i in range(SESSIONS)]
            list(pool.map(_send, [port] * SESSIONS, prompts))


def test_round_robin_reaches_all_four_stub_workers(workers: _Workers) -> None:
    running = _launch(Router.SGLANG, workers, "--policy", "round_robin")
    try:
        _drive(running.port)
    finally:
        _stop(running)
    assert workers.totals() == [2 * SESSIONS // 4] * 4


@pytest.mark.parametrize(
    ("engine", "workers"),
    [(EngineName.SGLANG, {"probes": Probes.SGLANG}), (EngineName.TRTLLM, {"probes": Probes.TRTLLM})],
    ids=["sglang", "trtllm"],
    indirect=["workers"],
)
def test_the_engines_cache_aware_router_puts_sessions_sharing_a_system_prompt_on_one_worker(
    engine: EngineName, workers: _Workers
) -> None:
    """The router the operator puts in front of the engine (``ENGINE_ROUTER``): sglang-router, which
    matches the text, so trtllm-serve's workers (no SGLang info, no render route) route the same."""
    running = _launch(ENGINE_ROUTER[engine], workers, "--policy", "cache_aware")
    try:
        _drive(running.port)
    finally:
        _stop(running)
    assert sorted(workers.totals()) == [0, 0, 0, 2 * SESSIONS], workers.totals()
    assert all(len(workers.worker_of(i)) == 1 for i in range(SESSIONS))
    assert workers.rendered == [0] * 4  # routed on the text: no worker is asked for token ids


@pytest.mark.parametrize("workers", [{"render": Render.TOKENS}], ids=["render"], indirect=True)
def test_vllm_routers_cache_aware_on_rendered_token_ids_keeps_sessions_sharing_a_prompt_on_one_worker(
    workers: _Workers,
) -> None:
    running = _launch(Router.VLLM, workers, "--policy", "cache_aware")
    try:
        _drive(running.port)
        decisions = _decisions(running)
    finally:
        _stop(running)
    assert sorted(workers.totals()) == [0, 0, 0, 2 * SESSIONS], workers.totals()
    assert all(len(workers.worker_of(i)) == 1 for i in range(SESSIONS))
    assert workers.rendered == [2 * SESSIONS] * 4  # every request's ids, asked of every worker
    # the first request finds every tree empty; every later one matches the system prompt or more
    assert decisions == Counter({"prefix_miss": 1, "prefix_hit": 2 * SESSIONS - 1}), decisions


@pytest.mark.parametrize(
    "workers",
    [
        {"render": Render.FORBIDDEN, "hold_s": HOLD_S},
        {"render": Render.NONE, "probes": Probes.TRTLLM, "hold_s": HOLD_S},
    ],
    ids=["vllm-without-scale-out", "trtllm-serve"],
    indirect=True,
)
def test_vllm_routers_cache_aware_without_token_ids_decides_every_request_by_load_alone(
    workers: _Workers,
) -> None:
    """Cache-blind: render refused (vLLM without --enable-scale-out) or absent (trtllm-serve), every
    decision is ``missing_tokens`` and the sessions spread over the workers by their load."""
    running = _launch(Router.VLLM, workers, "--policy", "cache_aware")
    try:
        _drive_at_once(running.port)
        decisions = _decisions(running)
    finally:
        _stop(running)
    assert decisions == Counter({"missing_tokens": 2 * SESSIONS}), decisions
    totals = workers.totals()
    assert sum(totals) == 2 * SESSIONS and max(totals) < 2 * SESSIONS, totals
    assert sum(1 for n in totals if n) > 1, totals


@pytest.mark.parametrize(
    "workers", [{"render": Render.TOKENS, "hold_s": HOLD_S}], ids=["render"], indirect=True
)
def test_vllm_routers_low_match_goes_to_the_least_loaded_worker_under_concurrency(
    workers: _Workers,
) -> None:
    """The system prompt is ~2/3 of a first prompt: under a 0.9 threshold every first turn is a low
    match, which vllm-router sends to the least-loaded worker (sglang-router: the smallest tree)."""
    running = _launch(Router.VLLM, workers, "--policy", "cache_aware", "--cache-threshold", "0.9")
    try:
        _drive_at_once(running.port, turns=(1,))
        decisions = _decisions(running)
    finally:
        _stop(running)
    totals = workers.totals()
    assert sum(totals) == SESSIONS and sum(1 for n in totals if n) > 1, totals
    assert max(totals) <= SESSIONS // 2, totals
    assert decisions == Counter({"prefix_miss": SESSIONS}), decisions


@pytest.mark.parametrize(
    "workers",
    [{"render": Render.NONE, "probes": Probes.TRTLLM, "hold_s": HOLD_S}],
    ids=["trtllm"],
    indirect=True,
)
def test_vllm_routers_consistent_hash_keeps_each_session_on_one_worker_without_token_ids(
    workers: _Workers,
) -> None:
    """A hash of the session header picks the worker: trtllm-serve's workers (no render route) get
    session affinity behind vllm-router."""
    running = _launch(Router.VLLM, workers, "--policy", "consistent_hash")
    try:
        _drive_at_once(running.port)
    finally:
        _stop(running)
    assert all(len(workers.worker_of(i)) == 1 for i in range(SESSIONS))
    assert sum(1 for n in workers.totals() if n) > 1, workers.totals()
    assert workers.rendered == [0] * 4


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


def _shared_prefix(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _tree_content(prompts: list[str]) -> tuple[int, int]:
    """(tokens, characters) a radix tree of ``prompts`` holds: each prompt's part beyond the longest
    prefix it shares with an earlier one (in words for the tokens: the stub renders a word a token)."""
    chars = words = 0
    for k, prompt in enumerate(prompts):
        shared = max((_shared_prefix(prompt, p) for p in prompts[:k]), default=0)
        chars += len(prompt) - shared
        words += len(prompt[shared:].split())
    return words, chars


@pytest.mark.parametrize("workers", [{"render": Render.TOKENS}], ids=["render"], indirect=True)
def test_vllm_routers_tree_budget_counts_characters_though_it_routes_on_token_ids(workers: _Workers) -> None:
    """``--max-tree-size`` is a per-worker budget of the text's characters in vllm-router 0.1.17 too,
    as its help says, though cache_aware matches on rendered token ids: the operator sizes it as the
    engines' pool tokens x 4 characters (``routing/render.py`` ``tree_size_for``). A budget of twice the
    first turns' tokens (under a third of their characters) is evicted to the last few sessions: the
    others' second turns find no prefix (``prefix_miss``); four times their characters keeps every one.
    Measured 2026-12-05: 2 of 16 second turns hit at twice the tokens, 16 at four times the characters
    (and, by the chat route, 4, 10, 15, 16 of 16 at 3k, 12k, 20k, 30k for ~18.7k characters)."""
    tokens, chars = _tree_content([_first(i) for i in range(SESSIONS)])
    assert 2 * tokens < chars // 3  # the two readings of the budget are far apart
    second_turn_hits: dict[str, int] = {}
    for label, budget in (("tokens x 2", 2 * tokens), ("characters x 4", 4 * chars)):
        running = _launch(Router.VLLM, workers, "--policy", "cache_aware", "--cache-threshold", "0.5",
                          "--eviction-interval-secs", "1", "--max-tree-size", str(budget))  # fmt: skip
        try:
            for i in range(SESSIONS):
                _send(running.port, _first(i), session_header=False)
            first = _decisions(running)
            time.sleep(EVICTION_WAIT_S)  # several eviction cycles, on a loaded machine too
            for i in range(SESSIONS):
                _send(running.port, _second(i), session_header=False)
            decisions = _decisions(running)
        finally:
            _stop(running)
        assert first == Counter({"prefix_miss": 1, "prefix_hit": SESSIONS - 1}), (label, first)
        second_turn_hits[label] = decisions["prefix_hit"] - first["prefix_hit"]
    # read as characters, twice the tokens holds the system prompt and the last few sessions (LRU);
    # read as tokens, it would hold every session twice over
    assert second_turn_hits["characters x 4"] == SESSIONS, second_turn_hits
    assert second_turn_hits["tokens x 2"] < SESSIONS // 2, second_turn_hits

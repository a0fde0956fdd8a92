"""``prefixtune twin serve``: a live twin engine behind the engine's own HTTP API.

::

    prefixtune twin serve --engine vllm --model meta-llama/Llama-3.1-8B-Instruct --gpu H100 \\
        --port 8000 --speedup 10 -- --gpu-memory-utilization 0.9 --block-size 16

Simulated time runs at ``speedup`` x wall time since start. A background task advances the engine
every few milliseconds, and every request advances it to "now" before it is queued, so requests
arrive at the right simulated time. A completion is answered when its simulated request finishes.

Endpoints (as the engines serve them):

- ``POST /v1/completions``: ``{"model", "prompt": [ids] | [[ids], ...] | "text" | ["text", ...],
  "max_tokens", "stream"?, "return_token_ids"?}``. Token arrays are the prompt identity
  (``TokenSeq.from_tokens``).
  The twin generates exactly ``max_tokens`` tokens (default 16, as vLLM). ``usage`` has
  ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` and
  ``prompt_tokens_details.cached_tokens`` (the engine's prefix-cache hit for this request).
  Text prompts (what the routers forward: they need text for their prefix trees) go through the
  twin's stand-in tokenizer, every 4 UTF-8 bytes one token (``chat.text_tokens``, deterministic and
  prefix-preserving: texts that share their first ``4k`` bytes share their first ``k`` tokens).
- ``POST /v1/chat/completions``: ``{"model", "messages", "max_completion_tokens" | "max_tokens",
  "stream"?, "stream_options"?: {"include_usage", "continuous_usage_stats"}, "ignore_eos"?}``. The
  messages go through the twin's chat template (``chat.render_chat``: each message tokenized on its
  own, so a conversation's earlier turns are the same leading tokens every turn and hit the cache).
  With ``max_tokens`` the twin generates exactly that many tokens (``finish_reason`` "length");
  without, ``CHAT_ANSWER_TOKENS`` and "stop" (a model ending its turn). The answer text re-tokenizes
  to the generated ids, so sending it back as the next turn's assistant message hits that cache too.
  Objects and error bodies as each engine shapes them (``openai_api``).
- vLLM only, with ``--enable-scale-out`` (``ParsedCommand.options.render_routes``): ``POST
  /v1/completions/render`` (the completions body; a list with one ``{"request_id", "token_ids"}`` per
  prompt) and ``POST /v1/chat/completions/render`` (the chat body; one such object), the token ids
  being exactly those the twin's completions run for the same body (``_parse``, ``_parse_chat``:
  same checks, same body limit), so the prefixes requests share stay shared. vLLM's GenerateRequest
  carries more (sampling params, ...); these two keys are what vllm-router 0.1.17 reads: it posts
  every request to every worker's render route and routes ``cache_aware`` on the ids. Without the
  flag both answer 403 with vLLM 0.33's message and error body
  (``vllm/entrypoints/scale_out/factories.py``); SGLang and TensorRT-LLM have no such route (404).
- Streaming (both routes): a chunk when the engine emits a request's first token, then a chunk per
  advance of the engine with the tokens the request produced in it. The engine produces one token
  per request per step; the server advances every ``TICK_S`` of wall time, so at ``--speedup 1``
  with steps longer than a tick a chunk is one engine step (one token), as the engines stream; a
  tick spanning several steps sends their tokens in one chunk, as vLLM's output collector merges the
  outputs of a client that has not read them yet. Nothing is sent before wall time reaches the
  simulated time it was produced at (``catch_up``). TTFT and ITL as a client measures them are the
  simulated ones divided by the speedup, plus up to one tick and the HTTP path.
- Extension for multi-turn load generators, ``"prefixtune": {"output_token_ids": [ids]}``: the tokens
  the twin "generates" (their count replaces ``max_tokens``). The next turn's prompt, which contains
  them, then hits the blocks this request cached. Without it the output ids are derived from the
  prompt deterministically and returned when ``"return_token_ids": true`` (``choices[i].token_ids``,
  as vLLM does), so a client can build the next turn from them.
- ``GET /v1/models``, ``GET /health`` (200 while up, 503 after a runtime OOM; the process then exits
  non-zero after ``--exit-delay`` seconds, as a crashed engine would), ``GET <metrics path>`` (vLLM,
  SGLang ``/metrics``; TensorRT-LLM ``/prometheus/metrics``, its ``/metrics`` being JSON iteration
  stats). With ``--dcgm-port``, a DCGM-exporter-like ``DCGM_FI_DEV_GPU_UTIL`` on its own port.
- SGLang only, as SGLang serves them: ``GET /get_server_info`` and ``/server_info``, ``GET
  /get_model_info`` and ``/model_info`` (a subset of the keys). sglang-router 0.3.2 probes
  ``/health``, then ``/server_info`` (else ``/get_server_info``) and ``/model_info`` (else
  ``/get_model_info``) when it registers a worker (``discover_metadata.rs``; a 404 is only a
  warning there), and with a ``model_path`` it tries to load that tokenizer (a failure is only a
  warning); vllm-router 0.1.17 probes ``GET /health`` only. Both seen in their logs against this
  server.

A start-up OOM prints the engine's kind of message and exits 1 before binding any port.

In-process (tests, the sandbox): ``async with serving(engine, model, gpu, engine_args, ServeOptions(...))
as url``, or ``make_server(...)`` / ``TwinServer(engine, parsed, gpu, ServeOptions(...))``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import heapq
import itertools
import json
import logging
import signal
import sys
import time
from array import array
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from prefixtune.engines import get_adapter
from prefixtune.engines.base import ArgsError, ParsedCommand
from prefixtune.twin.cache.base import Match
from prefixtune.twin.chat import VOCAB, ChatError, answer, parse_messages, render_chat, text_tokens
from prefixtune.twin.cliargs import add_target_args
from prefixtune.twin.engine import TwinEngine
from prefixtune.twin.exporter import CONTENT_TYPE, DcgmExporter, EngineExporter
from prefixtune.twin.memory import StartupOOM
from prefixtune.twin.models.base import twin_model
from prefixtune.twin.observer import FanOut, NullObserver
from prefixtune.twin.openai_api import (
    chat_chunk,
    chat_completion,
    error_body,
    stream_error_event,
    usage,
    usage_chunk,
)
from prefixtune.twin.prompt import ROOT_KEY, Segment, TokenSeq
from prefixtune.twin.request import Request
from prefixtune.twin.run import parse_command

DEFAULT_MAX_TOKENS = 16  # vLLM's default for /v1/completions
# A chat request without max_tokens: the twin's "model" stops (finish_reason "stop") after this many
# tokens; the engines would run to the model's end-of-turn token (or the context limit).
CHAT_ANSWER_TOKENS = 128
TICK_S = 0.005  # wall seconds between background advances
# vLLM 0.33's answer on a scale-out route without --enable-scale-out (403 PermissionDeniedError).
SCALE_OUT_DISABLED = (
    "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."
)
MAX_BODY_BYTES = 64 * 1024**2  # every POST route's body limit


class _Http2PrefaceFilter(logging.Filter):
    """Drops aiohttp's traceback for an HTTP/2 connection preface (``PRI * HTTP/2.0``): sglang-router
    tries gRPC first when it registers a worker, then HTTP; the engines log one line for it at most."""

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        return not (err is not None and type(err).__name__ == "BadHttpMessage" and "PRI" in str(err))


_PREFACE_FILTER = _Http2PrefaceFilter()


def oom_startup_prefix(engine: str) -> str:
    """What ``engine`` prints before a start-up out-of-memory message (the exception it raises)."""
    return twin_model(engine).oom_startup_prefix


class RequestError(ValueError):
    """A bad completion request (HTTP 400); ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


@dataclass
class _Pending:
    """A request in flight: what the handler waits for. A streamed request gets, on ``chunks``, the
    count of output tokens the engine produced since the last chunk (0 = the end): its first token
    when the engine emits it, then what each advance of the engine produced (``TwinServer.catch_up``)."""

    req: Request
    output_ids: list[int]
    done: asyncio.Future[dict[str, float]]
    stream: bool = False
    chunks: asyncio.Queue[int] = field(default_factory=asyncio.Queue)  # token counts; 0 = the end
    sent: int = 0  # output tokens already put on ``chunks``
    cached: int | None = None  # prompt tokens the engine found cached at its first admission
    engine_done: bool = False  # finished in the engine (answered when wall time reaches its finish)

    def emit(self, produced: int) -> None:
        """The request has produced ``produced`` output tokens in all: queue the new ones."""
        if self.stream and produced > self.sent:
            self.chunks.put_nowait(produced - self.sent)
            self.sent = produced


@dataclass(frozen=True)
class _Chat:
    """A parsed chat request: the rendered prompt and the answer the twin will generate."""

    model: str
    prompt: list[int]
    text: str  # the answer, 4 bytes per output token
    output_ids: list[int]
    finish_reason: str
    stream: bool
    include_usage: bool
    continuous_usage: bool


class _ServeObserver(NullObserver):
    """Resolves the handlers' futures as the simulated requests progress."""

    def __init__(self, server: TwinServer) -> None:
        self.server = server

    def admitted(self, req: Request, match: Match, now: float) -> None:
        p = self.server.pending.get(req.req_id)
        if p is not None and p.cached is None:
            p.cached = int(match.hit_tokens)

    def first_token(self, req: Request, ttft_s: float, now: float) -> None:
        if req.req_id in self.server.pending:
            self.server.due(now, req.req_id, None)

    def finished(
        self, req: Request, now: float, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        p = self.server.pending.get(req.req_id)
        if p is not None:
            p.engine_done = True
            timings = {"e2e_s": e2e_s, "queue_s": queue_s, "prefill_s": prefill_s, "decode_s": decode_s}
            self.server.due(now, req.req_id, timings)

    def oom(self, now: float, reason: str) -> None:
        self.server.on_oom(reason)


@dataclass(frozen=True)
class ServeOptions:
    """How a twin is served: where it binds, how fast simulated time runs, its seed, how long a dead
    engine takes to exit, the DCGM exporter's port and path and its pod labels, and the engine
    release whose metrics it serves (None: the adapter's), and the clock wall seconds come from."""

    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    speedup: float = 1.0  # simulated seconds per wall second
    seed: int = 0
    exit_delay_s: float = 1.0  # wall seconds between a runtime OOM and the exit
    dcgm_port: int | None = None
    dcgm_path: str = "/metrics"
    pod: str = ""
    namespace: str = ""
    engine_version: str | None = None
    # Wall seconds (the sandbox's clock stands still while its event loop is stalled)
    clock: Callable[[], float] = time.monotonic


class TwinServer:
    """A twin engine served over HTTP (see the module doc). ``start()`` boots the engine (raising
    ``StartupOOM``/``ArgsError``) and binds; ``url`` is the base URL; ``stop()`` shuts down.
    ``exited`` is set when the engine died (runtime OOM) and its exit delay passed."""

    def __init__(
        self, engine: str, parsed: ParsedCommand, gpu: str, options: ServeOptions | None = None
    ) -> None:
        o = options if options is not None else ServeOptions()
        speedup, pod, namespace, engine_version = o.speedup, o.pod, o.namespace, o.engine_version
        if not speedup > 0:
            raise ValueError(f"--speedup must be > 0; got {speedup}")
        self.options = o
        # Wall seconds; the sandbox passes its clock, which stands still while its loop is stalled
        # (``sandbox.clock``), so that simulated time follows what the machine keeps up with.
        self.clock = o.clock
        self.adapter = get_adapter(engine)
        self.engine_name = self.adapter.name
        self.twin = twin_model(self.engine_name)
        self.parsed = parsed
        self.gpu = gpu
        self.host = o.host
        self.port = o.port
        self.speedup = float(speedup)
        self.seed = seed = o.seed
        self.exit_delay_s = o.exit_delay_s
        self.dcgm_port = o.dcgm_port
        self.dcgm_path = o.dcgm_path
        self.pending: dict[int, _Pending] = {}
        self.streams: set[int] = set()  # req_ids of the pending requests that stream
        # First tokens and finishes the engine has simulated, answered when wall time reaches them:
        # (simulated time, order, req_id, None for a first token | the finished request's timings).
        self._due: list[tuple[float, int, int, dict[str, float] | None]] = []
        self._due_order = 0
        # Wall seconds from a streamed chat request's handler start to its first chunk written: the
        # server's side of a client's TTFT (benchmarks compare the two). The latest ones only.
        self.first_chunk_s: deque[float] = deque(maxlen=100_000)
        # engine_version: an older release's exposition (TensorRT-LLM 1.2 lacks most series)
        self.exporter = EngineExporter(self.engine_name, parsed.model, parsed=parsed, version=engine_version)
        self.dcgm = DcgmExporter(
            gpu_model=gpu,
            gpus=max(1, int(parsed.tensor_parallel)),
            pod=pod,
            namespace=namespace,
            window_s=max(1.0, self.speedup),
        )
        # Boots the engine: raises StartupOOM before anything is bound.
        self.engine = TwinEngine(parsed, gpu, seed, FanOut([self.exporter, self.dcgm, _ServeObserver(self)]))
        self.exporter.bind(
            self.engine.gauges,
            lambda: self.engine.cache.stats,
            self.engine.model.kv_bytes_per_token(self.engine.limits.kv_cache_dtype),
        )
        self.dcgm.clock = lambda: self.engine.now
        self.oom_reason = ""
        self.exited = asyncio.Event()
        self.exit_code = 0
        self.url = ""
        self.dcgm_url = ""
        self._t0 = 0.0
        self._next_id = 0
        self._render_ids = itertools.count()
        self._runners: list[web.AppRunner] = []
        self._ticker: asyncio.Task[None] | None = None
        self._exit_task: asyncio.Task[None] | None = None

    # --- time ------------------------------------------------------------------------------------
    def sim_now(self) -> float:
        return (self.clock() - self._t0) * self.speedup

    def catch_up(self) -> None:
        """Advance the engine to the current simulated time, and answer what is due by then.

        An advance completes the step under way, so the engine may end up to one step ahead of the
        wall clock: what it produced is sent only once wall time reaches the simulated time it was
        produced at (first tokens and finishes at their own times; the tokens of running requests
        when wall time reaches the engine's time), never early."""
        target = self.sim_now()
        self._release(target)
        if target > self.engine.now:
            self.engine.advance(target)
            self._release(target)
        if self.engine.status == "ok" and self.pending and self.engine.idle():
            # The engine dropped requests it could never admit (as the engines reject them).
            for rid in [r for r, p in self.pending.items() if not p.engine_done]:
                p = self.pending.pop(rid)
                self.streams.discard(rid)
                if not p.done.done():
                    p.done.set_exception(
                        RequestError("the engine rejected the request: it cannot fit the KV pool", status=400)
                    )
                    p.chunks.put_nowait(0)

    def due(self, t: float, rid: int, timings: dict[str, float] | None) -> None:
        heapq.heappush(self._due, (t, self._due_order, rid, timings))
        self._due_order += 1

    def _release(self, target: float) -> None:
        """Answer the first tokens and finishes simulated by ``target``; stream the running requests'
        tokens when the engine is not ahead of ``target``."""
        due, pending = self._due, self.pending
        while due and due[0][0] <= target:
            _, _, rid, timings = heapq.heappop(due)
            p = pending.get(rid)
            if p is None:
                continue
            if timings is None:
                p.emit(1)
                continue
            del pending[rid]
            if not p.done.done():
                p.done.set_result(timings)
            p.emit(p.req.output_len)
            if p.stream:
                self.streams.discard(rid)
                p.chunks.put_nowait(0)
        if self.streams and self.engine.now <= target:
            for rid, produced in self.engine.progress().items():
                p = pending.get(rid)
                if p is not None:
                    p.emit(produced)

    async def _tick(self) -> None:
        while True:
            self.catch_up()
            await asyncio.sleep(TICK_S)

    def _fail_pending(self, message: str, status: int) -> None:
        """End every in-flight request with an error (its stream included)."""
        for p in self.pending.values():
            if not p.done.done():
                p.done.set_exception(RequestError(message, status=status))
            p.chunks.put_nowait(0)
        self.pending.clear()
        self.streams.clear()
        self._due.clear()

    def on_oom(self, reason: str) -> None:
        self.oom_reason = reason
        self._fail_pending(f"engine crashed: {reason}", 500)
        print(f"torch.OutOfMemoryError: {reason}", file=sys.stderr, flush=True)
        if self._exit_task is None:
            self._exit_task = asyncio.get_running_loop().create_task(self._die())

    async def _die(self) -> None:
        await asyncio.sleep(self.exit_delay_s)
        self.exit_code = 1
        self.exited.set()

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> str:
        server_log = logging.getLogger("aiohttp.server")
        if _PREFACE_FILTER not in server_log.filters:
            server_log.addFilter(_PREFACE_FILTER)
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        if self.twin.render_routes:
            app.router.add_post("/v1/completions/render", self._completions_render)
            app.router.add_post("/v1/chat/completions/render", self._chat_render)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get(self.adapter.health_path, self._health)
        if self.adapter.ready_path != self.adapter.health_path:
            app.router.add_get(self.adapter.ready_path, self._health)
        app.router.add_get(self.adapter.metrics_path, self._metrics)
        if self.twin.iteration_stats_path is not None:
            app.router.add_get(self.twin.iteration_stats_path, self._iteration_stats)
        if self.twin.info_routes:
            for path in ("/get_server_info", "/server_info"):
                app.router.add_get(path, self._server_info)
            for path in ("/get_model_info", "/model_info"):
                app.router.add_get(path, self._model_info)
        self._t0 = self.clock()
        self.url = await self._bind(app, self.port)
        if self.dcgm_port is not None:
            dapp = web.Application()
            dapp.router.add_get(self.dcgm_path, self._dcgm_metrics)
            self.dcgm_url = await self._bind(dapp, self.dcgm_port)
        self._ticker = asyncio.get_running_loop().create_task(self._tick())
        return self.url

    async def _bind(self, app: web.Application, port: int) -> str:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, port)
        await site.start()
        self._runners.append(runner)
        addr = runner.addresses[0]
        host = f"[{addr[0]}]" if ":" in str(addr[0]) else str(addr[0])
        return f"http://{host}:{addr[1]}"

    async def stop(self) -> None:
        # As an engine on SIGTERM: in-flight requests are aborted, so that the HTTP server's graceful
        # shutdown does not wait (up to 60 s) for handlers whose engine no longer advances.
        self._fail_pending("the server is shutting down", 503)
        for task in (self._ticker, self._exit_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    # --- handlers --------------------------------------------------------------------------------
    def _served_names(self) -> list[str]:
        names = self.parsed.options.get("served_model_name")
        if isinstance(names, str) and names:
            return [names]
        if isinstance(names, list | tuple) and names:
            return [str(n) for n in names]
        return [self.parsed.model]

    async def _health(self, request: web.Request) -> web.Response:
        self.catch_up()
        if self.engine.status != "ok":
            return web.Response(status=503, text=f"engine dead: {self.oom_reason}")
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.Response:
        self.catch_up()
        return web.Response(body=self.exporter.render(), headers={"Content-Type": CONTENT_TYPE})

    async def _dcgm_metrics(self, request: web.Request) -> web.Response:
        self.catch_up()
        return web.Response(body=self.dcgm.render(), headers={"Content-Type": CONTENT_TYPE})

    async def _iteration_stats(self, request: web.Request) -> web.Response:
        self.catch_up()
        return web.json_response(self.twin.iteration_stats(self.engine.gauges()))

    async def _models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": self.twin.owned_by,
                "root": self.parsed.model,
                "parent": None,
                "max_model_len": int(self.engine.memory.max_request_tokens),
            }
            for name in self._served_names()
        ]
        return web.json_response({"object": "list", "data": data})

    async def _model_info(self, request: web.Request) -> web.Response:
        """SGLang's model information (``http_server.py`` ``get_model_info``): the fields the routers
        read when they register a worker."""
        return web.json_response(
            {
                "model_path": self.parsed.model,
                "tokenizer_path": self.parsed.model,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
            }
        )

    async def _server_info(self, request: web.Request) -> web.Response:
        """SGLang's server information (its server args and scheduler state; a subset of the keys)."""
        self.catch_up()
        return web.json_response(
            {
                "model_path": self.parsed.model,
                "tokenizer_path": self.parsed.model,
                "served_model_name": self._served_names()[0],
                "host": self.host,
                "port": self.port,
                "page_size": int(self.parsed.config.block_size),
                "tp_size": max(1, int(self.parsed.tensor_parallel)),
                "dp_size": 1,
                "context_length": int(self.engine.memory.max_request_tokens),
                "max_total_num_tokens": int(self.engine.memory.pool_tokens),
                "version": self.options.engine_version or "",
            }
        )

    async def _accepted_body(self, request: web.Request) -> Any:
        """The request's JSON body, once the engine can take requests (a RequestError otherwise):
        the prologue of both generation routes."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RequestError("the request body is not valid JSON") from None
        if self.engine.status != "ok":
            raise RequestError(f"engine crashed: {self.oom_reason}", status=500)
        return body

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._accepted_body(request)
            prompts, max_tokens, outputs, stream, want_ids = self._parse(body)
            self.catch_up()
            arrival = self.sim_now()
            entries = [
                self._submit(p, max_tokens, o, arrival, stream) for p, o in zip(prompts, outputs, strict=True)
            ]
            if stream:
                return await self._stream(request, body, entries, want_ids)
            results = await asyncio.gather(*(e.done for e in entries), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        except RequestError as err:
            return self._error(err)
        return web.json_response(self._response(body, entries, want_ids))

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        entered = time.monotonic()
        try:
            body = await self._accepted_body(request)
            chat = self._parse_chat(body)
            self.catch_up()
            entry = self._submit(
                chat.prompt, len(chat.output_ids), chat.output_ids, self.sim_now(), chat.stream
            )
            if chat.stream:
                return await self._chat_stream(request, chat, entry, entered)
            await entry.done
        except RequestError as err:
            return self._error(err)
        return web.json_response(
            chat_completion(
                f"chatcmpl-twin-{entry.req.req_id}",
                chat.model,
                chat.text,
                chat.finish_reason,
                usage(entry.req.prompt_len, entry.req.output_len, entry.cached or 0),
            )
        )

    async def _completions_render(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /v1/completions/render``: one object per prompt, its ``token_ids`` those the
        completions route runs for the same body (403 without ``--enable-scale-out``, as vLLM)."""
        if not self.parsed.options.render_routes:
            return self._error(RequestError(SCALE_OUT_DISABLED, status=403))
        try:
            prompts = self._parse(await self._accepted_body(request))[0]
        except RequestError as err:
            return self._error(err)
        base = f"cmpl-twin-render-{next(self._render_ids)}"
        ids = [base] if len(prompts) == 1 else [f"{base}-{i}" for i in range(len(prompts))]
        return web.json_response(
            [{"request_id": rid, "token_ids": prompt} for rid, prompt in zip(ids, prompts, strict=True)]
        )

    async def _chat_render(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /v1/chat/completions/render``: one object, its ``token_ids`` the prompt the
        chat route runs for the same body (403 without ``--enable-scale-out``, as vLLM)."""
        if not self.parsed.options.render_routes:
            return self._error(RequestError(SCALE_OUT_DISABLED, status=403))
        try:
            chat = self._parse_chat(await self._accepted_body(request))
        except RequestError as err:
            return self._error(err)
        rid = f"chatcmpl-twin-render-{next(self._render_ids)}"
        return web.json_response({"request_id": rid, "token_ids": chat.prompt})

    def _parse_chat(self, body: Any) -> _Chat:
        self._check_body(body)
        try:
            prompt = render_chat(parse_messages(body.get("messages")))
        except ChatError as err:
            raise RequestError(str(err), err.param) from None
        if body.get("n", 1) not in (1, None):
            raise RequestError("only n=1 is supported by the twin", "n")
        # vLLM: max_completion_tokens, else the deprecated max_tokens.
        param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        asked = body.get(param)
        if asked is not None and (not _is_int(asked) or int(asked) < 1):
            raise RequestError(f"{param} must be an integer >= 1; got {asked!r}", param)
        limit = int(self.engine.memory.max_request_tokens)
        if asked is not None:
            n_out, finish = int(asked), "length"
        elif body.get("ignore_eos"):
            n_out, finish = max(1, limit - len(prompt)), "length"
        else:
            n_out, finish = CHAT_ANSWER_TOKENS, "stop"
        self._check_length(len(prompt), n_out, "messages")
        opts = body.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise RequestError("stream_options must be an object", "stream_options")
        text, output_ids = answer(prompt, n_out)
        return _Chat(
            model=str(body.get("model") or self._served_names()[0]),
            prompt=prompt,
            text=text,
            output_ids=output_ids,
            finish_reason=finish,
            stream=bool(body.get("stream", False)),
            include_usage=bool(opts.get("include_usage", False)),
            continuous_usage=bool(opts.get("continuous_usage_stats", False)),
        )

    async def _chat_stream(
        self, request: web.Request, chat: _Chat, e: _Pending, entered: float
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        cid = f"chatcmpl-twin-{e.req.req_id}"
        n_out = len(chat.output_ids)

        def so_far(tokens: int) -> dict[str, Any] | None:
            return usage(e.req.prompt_len, tokens, e.cached or 0) if chat.continuous_usage else None

        async def send(event: dict[str, Any]) -> None:
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())

        sent = 0
        while True:
            count = await e.chunks.get()
            if count == 0:
                break
            if sent == 0:  # the engines send the role with their first output
                await send(chat_chunk(cid, chat.model, {"role": "assistant", "content": ""}, None, so_far(0)))
                self.first_chunk_s.append(time.monotonic() - entered)
            piece = chat.text[4 * sent : 4 * (sent + count)]  # 4 bytes per token (chat.answer)
            sent += count
            finish = chat.finish_reason if sent >= n_out else None
            await send(chat_chunk(cid, chat.model, {"content": piece}, finish, so_far(sent)))
        if e.done.done() and e.done.exception() is not None:
            err = e.done.exception()
            status = err.status if isinstance(err, RequestError) else 500
            await send(stream_error_event(self.engine_name, str(err), status))
        elif chat.include_usage:
            await send(usage_chunk(cid, chat.model, usage(e.req.prompt_len, n_out, e.cached or 0)))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _parse(self, body: Any) -> tuple[list[list[int]], int, list[list[int] | None], bool, bool]:
        self._check_body(body)
        prompt = body.get("prompt")
        prompts: list[list[int]]
        if isinstance(prompt, str):
            prompts = [text_tokens(prompt)]
            if not prompts[0]:
                raise RequestError("prompt must not be empty", "prompt")
        elif isinstance(prompt, list) and prompt and _token_list(prompt):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            prompts = [text_tokens(p) for p in prompt]
            if not all(prompts):
                raise RequestError("prompt must not contain an empty string", "prompt")
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(p, list) and _token_list(p) for p in prompt)
        ):
            prompts = prompt
        else:
            raise RequestError(
                "prompt must be a string, a non-empty list of strings, a non-empty list of token ids, "
                "or a list of such lists",
                "prompt",
            )
        max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
        if max_tokens is None:
            max_tokens = DEFAULT_MAX_TOKENS
        if not _is_int(max_tokens) or int(max_tokens) < 1:
            raise RequestError(f"max_tokens must be an integer >= 1; got {max_tokens!r}", "max_tokens")
        if body.get("n", 1) != 1:
            raise RequestError("only n=1 is supported by the twin", "n")
        ext = body.get("prefixtune") or {}
        if not isinstance(ext, dict):
            raise RequestError("prefixtune must be an object", "prefixtune")
        out_ids = ext.get("output_token_ids")
        outputs: list[list[int] | None] = [None] * len(prompts)
        if out_ids is not None:
            if (
                isinstance(out_ids, list)
                and out_ids
                and all(_is_int(t) for t in out_ids)
                and len(prompts) == 1
            ):
                outputs = [[int(t) for t in out_ids]]
            elif (
                isinstance(out_ids, list)
                and len(out_ids) == len(prompts)
                and all(isinstance(o, list) and o and all(_is_int(t) for t in o) for o in out_ids)
            ):
                outputs = [[int(t) for t in o] for o in out_ids]
            else:
                raise RequestError(
                    "prefixtune.output_token_ids must be a non-empty list of token ids (one list per prompt)",
                    "prefixtune.output_token_ids",
                )
        for p in prompts:
            lo, hi = min(p), max(p)
            if lo < 0 or hi >= VOCAB:
                bad = lo if lo < 0 else hi
                raise RequestError(f"Token id {bad} is out of vocabulary (0..{VOCAB - 1})", "prompt")
        for p, o in zip(prompts, outputs, strict=True):
            self._check_length(len(p), len(o) if o is not None else int(max_tokens), "prompt")
        return (
            prompts,
            int(max_tokens),
            outputs,
            bool(body.get("stream", False)),
            bool(body.get("return_token_ids")),
        )

    def _check_body(self, body: Any) -> None:
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        model = body.get("model")
        if model is not None and model not in self._served_names():
            raise RequestError(f"The model `{model}` does not exist.", "model", status=404)

    def _check_length(self, prompt_len: int, n_out: int, param: str) -> None:
        limit = int(self.engine.memory.max_request_tokens)
        if prompt_len + n_out > limit:
            raise RequestError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + n_out} tokens ({prompt_len} in the messages, {n_out} in the completion).",
                param,
            )

    def _error(self, err: RequestError) -> web.Response:
        return web.json_response(
            error_body(self.engine_name, str(err), err.status, err.param), status=err.status
        )

    def _submit(
        self,
        prompt: list[int],
        max_tokens: int,
        output: list[int] | None,
        arrival: float,
        stream: bool = False,
    ) -> _Pending:
        """Queue one prompt arriving at simulated time ``arrival``. The engine runs it from that time
        at the next advance (the ticker's, within 5 ms wall): forcing a step here would push the
        simulation ahead of the wall clock by one step per request."""
        if output is None:
            output = derived_output(prompt, max_tokens)
        full = tokens_to_seq(prompt + output)
        rid = self._next_id
        self._next_id += 1
        req = Request(
            req_id=rid,
            arrival_s=arrival,
            seq=full,
            prompt_len=len(prompt),
            output_len=len(output),
            kind="http",
        )
        entry = _Pending(
            req=req, output_ids=output, done=asyncio.get_running_loop().create_future(), stream=stream
        )
        self.pending[rid] = entry
        if stream:
            self.streams.add(rid)
        self.engine.submit(req)
        return entry

    def _response(self, body: dict[str, Any], entries: Sequence[_Pending], want_ids: bool) -> dict[str, Any]:
        choices = []
        prompt_tokens = completion_tokens = cached = 0
        for i, e in enumerate(entries):
            choice: dict[str, Any] = {
                "index": i,
                "text": " x" * e.req.output_len,
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
            if want_ids:
                choice["token_ids"] = e.output_ids
                choice["prompt_token_ids"] = None
            choices.append(choice)
            prompt_tokens += e.req.prompt_len
            completion_tokens += e.req.output_len
            cached += e.cached or 0
        return {
            "id": f"cmpl-twin-{entries[0].req.req_id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": str(body.get("model") or self._served_names()[0]),
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }

    async def _stream(
        self, request: web.Request, body: dict[str, Any], entries: Sequence[_Pending], want_ids: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        model = str(body.get("model") or self._served_names()[0])
        cid = f"cmpl-twin-{entries[0].req.req_id}"
        for i, e in enumerate(entries):
            sent = 0
            while True:
                count = await e.chunks.get()
                if count == 0:
                    break
                chunk: dict[str, Any] = {
                    "id": cid,
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [{"index": i, "text": " x" * count, "logprobs": None, "finish_reason": None}],
                }
                if want_ids:
                    chunk["choices"][0]["token_ids"] = e.output_ids[sent : sent + count]
                sent += count
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if e.done.done() and e.done.exception() is not None:
                err = e.done.exception()
                status = err.status if isinstance(err, RequestError) else 500
                event = stream_error_event(self.engine_name, str(err), status)
                await resp.write(f"data: {json.dumps(event)}\n\n".encode())
                await resp.write(b"data: [DONE]\n\n")
                return resp
        final = self._response(body, entries, want_ids=False)
        final["choices"] = [
            {"index": i, "text": "", "logprobs": None, "finish_reason": "length"} for i in range(len(entries))
        ]
        await resp.write(f"data: {json.dumps(final)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


_SEGMENTS: dict[int, Segment] = {}  # key -> its one-token Segment, shared by requests with that prefix
_SEGMENTS_CAP = 1_000_000


def tokens_to_seq(tokens: Sequence[int]) -> TokenSeq:
    """``TokenSeq.from_tokens`` with a process-local chain hash: one segment per token keyed by
    ``hash((parent_key, token))``, so equal token prefixes get equal identities, exactly as
    ``from_tokens``. Python's hash of an int tuple is deterministic and far cheaper than
    ``chain_key``'s blake2b; the keys never leave this process (its KV cache), so stability across
    processes is not needed. Segments of prefixes seen before (shared system prompts, contexts,
    history) are reused: building a Segment costs more than hashing."""
    segs: list[Segment] = []
    append = segs.append
    known = _SEGMENTS
    if len(known) > _SEGMENTS_CAP:
        known.clear()
    key = ROOT_KEY
    for tok in tokens:
        key = hash((key, tok)) & 0x7FFF_FFFF_FFFF_FFFF
        seg = known.get(key)
        if seg is None:
            seg = known[key] = Segment(key, 1)
        append(seg)
    return TokenSeq(tuple(segs))


def derived_output(prompt: Sequence[int], n: int) -> list[int]:
    """The token ids the twin "generates" after ``prompt`` when the client gives none: a deterministic
    function of the prompt, so the same prompt always gets the same answer (as greedy decoding)."""
    digest = hashlib.blake2b(array("q", prompt).tobytes(), digest_size=8).digest()
    base = int.from_bytes(digest, "little") >> 1
    return [(base * 2654435761 + (i + 1) * 40503) % VOCAB for i in range(n)]


def _token_list(values: list[Any]) -> bool:
    """A non-empty list of ints (not bools): checked with C-speed builtins, prompts are long."""
    return bool(values) and set(map(type, values)) == {int}


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@contextlib.asynccontextmanager
async def serving(
    engine: str,
    model: str | None,
    gpu: str,
    engine_args: Sequence[str] = (),
    options: ServeOptions | None = None,
    *,
    tp: int | None = None,
    files: dict[str, str] | None = None,
) -> AsyncIterator[str]:
    """Serve a twin in this event loop; yields the base URL (``options.port`` 0: a free port)."""
    server = make_server(engine, model, gpu, engine_args, options, tp=tp, files=files)
    url = await server.start()
    try:
        yield url
    finally:
        await server.stop()


def make_server(
    engine: str,
    model: str | None,
    gpu: str,
    engine_args: Sequence[str] = (),
    options: ServeOptions | None = None,
    *,
    tp: int | None = None,
    files: dict[str, str] | None = None,
) -> TwinServer:
    """Parse the engine command and boot the twin (raises ArgsError, StartupOOM, ValueError)."""
    parsed = parse_command(engine, list(engine_args), model=model, tp=tp, files=files)
    return TwinServer(engine, parsed, gpu, options)


# --- CLI -----------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prefixtune twin serve",
        description="Serve a digital twin of an LLM engine over the engine's HTTP API and metrics.",
        epilog="Engine flags go after '--' (e.g. -- --gpu-memory-utilization 0.95), or a whole command.",
    )
    add_target_args(p, model_required=False, tp_default=None)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: the engine command's port)")
    p.add_argument("--speedup", type=float, default=1.0, help="simulated seconds per wall second (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exit-delay", type=float, default=1.0, help="seconds between a runtime OOM and exit")
    p.add_argument("--dcgm-port", type=int, help="also serve a DCGM-like GPU-utilization exporter here")
    p.add_argument("--dcgm-path", default="/metrics", help="path of the DCGM exporter (default /metrics)")
    p.add_argument("--pod", default="", help="pod label for the DCGM exporter (Kubernetes mapping)")
    p.add_argument("--namespace", default="", help="namespace label for the DCGM exporter")
    p.add_argument(
        "--engine-version",
        help="serve an older release's metrics (e.g. trtllm 1.2: latency histograms and the request count)",
    )
    p.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="PATH=LOCAL",
        help="a file the engine command refers to (TensorRT-LLM options YAML): container path=local file",
    )
    return p


def serve_main(argv: Sequence[str]) -> int:
    args = list(argv)
    engine_args: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, engine_args = args[:cut], args[cut + 1 :]
    opts = _parser().parse_args(args)
    files: dict[str, str] = {}
    for item in opts.file:
        path, sep, local = item.partition("=")
        if not sep:
            print(f"twin serve: --file must be PATH=LOCAL; got {item!r}", file=sys.stderr)
            return 2
        try:
            with open(local, encoding="utf-8") as fh:
                files[path] = fh.read()
        except OSError as err:
            print(f"twin serve: --file {item}: cannot read {local}: {err.strerror}", file=sys.stderr)
            return 2
    try:
        parsed = parse_command(opts.engine, engine_args, model=opts.model, tp=opts.tp, files=files or None)
    except ArgsError as err:
        print(f"twin serve: engine arguments: {err}", file=sys.stderr)
        return 2
    port = opts.port if opts.port is not None else int(parsed.port)
    return asyncio.run(_serve(opts, parsed, port))


async def _serve(opts: argparse.Namespace, parsed: ParsedCommand, port: int) -> int:
    engine = get_adapter(opts.engine).name
    try:
        options = ServeOptions(
            host=opts.host,
            port=port,
            speedup=opts.speedup,
            seed=opts.seed,
            exit_delay_s=opts.exit_delay,
            dcgm_port=opts.dcgm_port,
            dcgm_path=opts.dcgm_path,
            pod=opts.pod,
            namespace=opts.namespace,
            engine_version=opts.engine_version,
        )
        server = TwinServer(engine, parsed, opts.gpu, options)
    except StartupOOM as err:
        print(f"{oom_startup_prefix(engine)}: out of memory at start-up: {err}", file=sys.stderr)
        return 1
    except (ValueError, KeyError) as err:
        print(f"twin serve: {err}", file=sys.stderr)
        return 2
    try:
        url = await server.start()
    except OSError as err:
        print(f"twin serve: cannot bind {opts.host}:{port}: {err.strerror or err}", file=sys.stderr)
        return 1
    print(
        f"twin serve: {engine} {parsed.model} on {opts.gpu} at {url} (speedup {opts.speedup}x, "
        f"KV pool {server.engine.memory.pool_tokens} tokens)",
        file=sys.stderr,
        flush=True,
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(server.exited.wait())]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        await server.stop()
    return server.exit_code

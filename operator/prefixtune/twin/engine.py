"""The twin's engine: a discrete-event model of one serving engine's continuous batching.

One *step* is one engine iteration: every running request in its decode phase produces one token,
and prefill work (new requests, or the next chunk of a long prompt) fills the rest of the token
budget. Step time comes from the cost model (``cost.py``: fitted to measured kernels, or the
roofline), KV blocks from the engine's cache model (``cache/``), the pool size and OOM behaviour
from ``memory.py``.

Scheduling, per engine (``reference/engines.md``):

* Running requests first: decode tokens, then the next chunk of partly prefilled prompts; a request
  that cannot get a block preempts another (vLLM and TensorRT-LLM max_utilization: the newest running
  request, recomputed later; SGLang: *retract* the decoding request with the least output, longest
  prompt first). A preempted request keeps its output; its blocks are released (full blocks stay
  cached and may hit when it is re-admitted) and it waits at the front of the queue.
* Then waiting requests in policy order while the batch (``max_running``) and the token budget
  (``max_batched_tokens``) allow: vLLM fcfs (``priority`` equals fcfs without priorities); SGLang fcfs,
  lpm (longest cached prefix first; fcfs beyond 128 waiting), dfs-weight (approximated: requests whose
  cached prefix is shared by more waiting requests first), hrrn (highest wait / uncached-prefill ratio
  first; fcfs beyond 128 waiting), lof (longest output first), random
  (seeded); cache-aware policies are fcfs when caching is off. Admission stops at the first request
  that does not fit (head-of-line blocking as in the engines). SGLang also keeps room for the running
  requests' future tokens (its ``new_token_ratio`` reservation, fixed here at 0.3); TensorRT-LLM
  guaranteed_no_evict admits only when the request's whole KV (prompt + max output) fits, and allocates
  it at once, so it never preempts.
* Chunked prefill (vLLM and SGLang on by default, TensorRT-LLM off): a prompt is split across steps
  to fit the token budget. Without it a prompt is prefilled whole, in one step, alone when it exceeds
  the budget (SGLang: the first request of a prefill batch may exceed ``--max-prefill-tokens``,
  ``schedule_policy.py`` ``PrefillAdder``); vLLM refuses such a budget at start (budget below
  ``max_model_len``, ``vllm/config/scheduler.py`` ``verify_max_model_len``) and TensorRT-LLM refuses
  such a prompt at its API (``TwinModel.rejects_over_budget``). SGLang does not mix prefill and decode
  in one batch: while prefill runs (every chunk of a prompt in a row), decoding requests wait (its
  default, ``scheduler.py`` ``get_next_batch_to_run``; ``--enable-mixed-chunk`` is not modelled).
  docs/batch-limits.md has the curves and what each rule was read from.

Speed (event-driven): when the batch only decodes and nothing can be admitted, the engine computes how
many steps remain until the next event (an admissible arrival, a request finishing, ``advance``'s
horizon), sums their times in closed form (``cost.DecodeRun``), allocates the blocks all requests
need for those steps in one go (when the pool has them; otherwise it steps exactly and preempts),
and jumps. Decoding requests are not touched per step: a request's progress is the global decode
step counter minus the counter when it started decoding.

Not modelled: speculative decoding, prompt rejection by the HTTP layer (requests longer than
``max_model_len`` or than the pool, and on TensorRT-LLM without chunked prefill prompts longer than
``max_num_tokens``, are dropped and counted in ``counters.rejected``), CPU scheduling overhead beyond
the per-step/per-sequence constants of the cost model.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from operator import attrgetter

from prefixtune.engines.base import SCHEDULE_POLICY, ParsedCommand
from prefixtune.engines.registry import get_adapter
from prefixtune.twin.cache.base import CacheStats, KVCache
from prefixtune.twin.catalog import GpuHardware, ModelSpec, check_tp, get_gpu, get_model
from prefixtune.twin.cost import StepCost, step_cost
from prefixtune.twin.memory import PRESSURE_START, MemoryPlan, StartupOOM, plan_memory
from prefixtune.twin.models.base import TWIN_POLICIES, TwinModel, twin_model
from prefixtune.twin.observer import EngineObserver, Gauges, NullObserver
from prefixtune.twin.request import Request

__all__ = ["EngineLimits", "StartupOOM", "TwinEngine", "engine_limits", "gc_paused"]

LPM_MAX_WAITING = 128  # SGLang WAITING_QUEUE_PREFIX_MATCH_MAX
LOOKAHEAD_TOKENS = 128  # decode blocks allocated ahead while a quarter of the pool is free
_INF = math.inf
_by_order = attrgetter("order")

# A cache factory: (engine, num_blocks, block_size, prefix_caching, **engine options) -> KVCache.
CacheFactory = Callable[..., KVCache]


def _policies(engine: str) -> tuple[str, ...]:
    """The policies the twin models for ``engine``: its schedule_policy choices (its adapter's)."""
    return tuple(str(p) for p in get_adapter(engine).knobs()[SCHEDULE_POLICY].choices)


@dataclass(frozen=True)
class EngineLimits:
    """The scheduler limits in effect (explicit options, else each engine's default)."""

    max_running: int
    max_batched_tokens: int
    chunked_prefill: bool
    kv_cache_dtype: str
    max_model_len: int | None
    host_cache_bytes: int
    policy: str


def engine_limits(parsed: ParsedCommand, gpu: GpuHardware, model: ModelSpec) -> EngineLimits:
    """Scheduler limits from the parsed options, with the engines' hardware-dependent defaults."""
    opts = parsed.options
    twin = twin_model(parsed.engine)
    defaults = twin.scheduler_defaults(gpu)
    chunked = defaults.chunked_prefill if opts.chunked_prefill is None else opts.chunked_prefill
    budget = defaults.max_batched_tokens if opts.max_batched_tokens is None else opts.max_batched_tokens
    max_len = opts.max_model_len
    context = model.max_model_len if max_len is None else max_len
    given = opts.max_batched_tokens is not None
    if budget < 0:  # SGLang --chunked-prefill-size -1: chunking off, --max-prefill-tokens caps a batch
        chunked, given = False, False
    budget = twin.unchunked_budget(budget, bool(chunked), given, context)
    policy = twin.normalize_policy(str(parsed.config.schedule_policy))
    allowed = _policies(twin.name)
    if policy not in allowed:
        raise ValueError(
            f"schedule_policy {parsed.config.schedule_policy!r} is not modelled for {twin.name}; "
            f"allowed: {', '.join(allowed)}"
        )
    policy = twin.twin_policy(policy)
    if policy not in TWIN_POLICIES:
        raise ValueError(f"{twin.name}: schedule_policy {policy!r} maps to no queue order the twin has")
    running = defaults.max_running if opts.max_running is None else opts.max_running
    twin.check_limits(opts.max_running, budget, bool(chunked), context)
    return EngineLimits(
        max_running=_positive_int(running, "max_running", allow_zero=True),
        max_batched_tokens=_positive_int(budget, "max_batched_tokens"),
        chunked_prefill=bool(chunked),
        kv_cache_dtype=opts.kv_cache_dtype or "auto",
        max_model_len=None if max_len is None else _positive_int(max_len, "max_model_len"),
        host_cache_bytes=_positive_int(opts.host_cache_bytes or 0, "host_cache_bytes", allow_zero=True),
        policy=policy,
    )


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (restored after; nests).

    A simulation holds many long-lived objects (requests, block hashes) and makes almost no cyclic
    garbage: the collector's repeated scans of them cost more than the simulation itself.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _positive_int(value: object, name: str, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        raise ValueError(f"option {name} must be an integer >= {0 if allow_zero else 1}; got {value!r}")
    return value


@dataclass
class EngineCounters:
    """Cumulative figures the summary and the exporter read (plain Python numbers)."""

    steps: int = 0
    busy_s: float = 0.0  # GPU time in steps
    running_integral: float = 0.0  # integral of the running count over busy time (idle = 0 running)
    kv_usage_integral: float = 0.0  # integral of kv usage over time (idle included, at its last value)
    waiting_integral: float = 0.0  # integral of the waiting count over busy time (vllm:num_requests_waiting)
    max_running: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0  # prompt tokens of admitted requests (first admission)
    computed_prefill_tokens: int = 0  # prefill tokens actually computed (recompute included)
    saved_prefill_tokens: int = 0  # prompt tokens served from cache at first admission
    generation_tokens: int = 0
    finished: int = 0
    rejected: int = 0  # longer than max_model_len or than the whole pool


class _Seq:
    """A request inside the engine."""

    __slots__ = (
        "admit_s",
        "base",
        "cap",
        "epoch",
        "finish_g",
        "first_admit_s",
        "first_token_s",
        "generated",
        "hit",
        "known",
        "last_token_s",
        "order",
        "out",
        "prefilled",
        "prompt_len",
        "req",
        "state",
    )

    def __init__(self, req: Request, order: int) -> None:
        self.req = req
        self.order = order
        self.prompt_len = req.prompt_len
        self.out = req.output_len
        self.state = "pending"  # pending | waiting | prefill | decode | done
        self.epoch = 0
        self.generated = 0  # output tokens produced so far (kept across preemption)
        self.known = req.prompt_len  # tokens to prefill: the prompt, plus the output after a preemption
        self.prefilled = 0  # tokens with KV (prefill phase)
        self.hit = 0
        self.cap = 0  # tokens the allocated blocks can hold
        self.base = 0  # decode phase: computed tokens = base + G
        self.finish_g = 0  # decode phase: G at which the last token is produced
        self.admit_s = 0.0
        self.first_admit_s = -1.0
        self.first_token_s = -1.0
        self.last_token_s = 0.0


class TwinEngine:
    """One simulated engine instance, driven in simulated time.

    ``TwinEngine(parsed, gpu, seed, observer)`` boots from a parsed command line (raises
    ``StartupOOM`` when the engine would not start). ``submit(req)`` queues a request (its
    ``arrival_s`` is when it arrives; earlier than ``now`` means at the next step). ``advance(until_s)``
    runs the simulation to ``until_s``, calling the observer for everything that happens; a step that
    starts before ``until_s`` completes, so ``now`` may end slightly past it. ``now`` is the simulated
    time; ``status`` is "ok" or "oom_runtime" (after a runtime OOM the engine is dead: ``advance``
    only moves the clock and submitted requests are dropped). ``gauges()`` is a snapshot for
    Prometheus gauges; ``next_event_s()`` is when something happens next (None when idle with nothing
    queued). ``cache.stats`` holds the engine's prefix-cache counters, ``counters`` the rest.
    """

    def __init__(
        self,
        parsed: ParsedCommand,
        gpu: str,
        seed: int = 0,
        observer: EngineObserver | None = None,
        *,
        cache_factory: CacheFactory | None = None,
    ) -> None:
        self.parsed = parsed
        self.engine = parsed.engine
        self.twin: TwinModel = twin_model(parsed.engine)
        self.model = get_model(parsed.model)
        self.gpu = get_gpu(gpu)
        self.tp = check_tp(int(parsed.tensor_parallel))
        self.seed = int(seed)
        self.limits = engine_limits(parsed, self.gpu, self.model)
        cfg = parsed.config
        self.block_size = int(cfg.block_size)
        self.prefix_caching = bool(cfg.prefix_caching)
        self.memory: MemoryPlan = plan_memory(
            self.engine,
            self.model,
            self.gpu,
            self.tp,
            float(cfg.memory_fraction),
            self.block_size,
            self.limits.kv_cache_dtype,
            self.limits.max_batched_tokens,
            self.limits.max_model_len,
        )
        pool_tokens = self.memory.pool_tokens
        max_running = self.limits.max_running
        ctx = self.limits.max_model_len or self.model.max_model_len
        max_running = self.twin.resolve_max_running(max_running, pool_tokens, ctx)
        if max_running < 1:
            raise ValueError(f"option max_running must be >= 1; got {max_running}")
        self.max_running = min(max_running, self.limits.max_batched_tokens)
        # The longest prompt the API accepts: TensorRT-LLM without chunked prefill refuses prompts
        # over max_num_tokens (``TwinModel.rejects_over_budget``).
        refuses = self.twin.rejects_over_budget and not self.limits.chunked_prefill
        self._max_prompt = self.limits.max_batched_tokens if refuses else _INF
        self.cost: StepCost = step_cost(
            self.engine,
            self.model,
            self.gpu,
            self.tp,
            self.limits.kv_cache_dtype,
            self.block_size,
            get_adapter(self.engine).default_config().block_size,
        )
        self.cache: KVCache = self._make_cache(cache_factory)
        self.observer: EngineObserver = observer if observer is not None else NullObserver()
        self.counters = EngineCounters()
        self.now = 0.0
        self.status = "ok"
        self.oom_reason = ""
        self.policy = self.limits.policy
        if not self.prefix_caching and self.policy in {"lpm", "dfs-weight", "hrrn"}:
            self.policy = "fcfs"
        # prefill and decode in one batch: the adapter's fact (SGLang: apart; --enable-mixed-chunk is
        # not modelled)
        self._mixed = get_adapter(self.twin.name).mixed_batches
        self._no_evict = self.policy == self.twin.no_evict_policy
        self._new_token_ratio = self.twin.new_token_ratio
        self._rng = random.Random(self.seed)
        self._order = 0
        # Not-yet-arrived requests, sorted by (arrival, submission order): requests come sorted, so
        # a queue beats a heap.
        self._pending: deque[tuple[float, int, _Seq]] = deque()
        self._waiting: deque[_Seq] = deque()
        self._running: dict[_Seq, None] = {}  # admission order (newest last)
        self._prefill: dict[_Seq, None] = {}  # running requests still in prefill, admission order
        self._g = 0  # decode steps done (a decoding request's progress is measured against it)
        self._n_dec = 0
        self._dec_read_base = 0  # sum over decoding requests of (base + 1): reads at G = this + n*G
        self._dec_finish_sum = 0  # sum of finish_g over decoding requests
        self._finish_heap: list[tuple[int, int, int, _Seq]] = []
        # Decoding requests by the step G at which they need another block; a request whose blocks
        # already reach its last token has no entry.
        self._need_heap: list[tuple[int, int, int, _Seq]] = []
        self._blocked = False  # the last admission attempt stopped on memory: wait for a release
        self._lookahead = max(LOOKAHEAD_TOKENS, self.block_size)
        self._spare = self.memory.num_blocks // 4
        self._last_usage = 0.0
        # SGLang's prefill-only batches: [requests, seconds] of the decoding requests that waited
        # through them (those waiting longest first); their next token's gap includes the wait.
        self._stalls: list[list[float]] = []
        self._usage_at = 0.0

    def _make_cache(self, factory: CacheFactory | None) -> KVCache:
        from prefixtune.twin.cache import make_cache

        accepted = self.twin.cache_options
        opts: dict[str, object] = {}
        for key in ("partial_reuse", "eviction_policy"):
            if key in accepted and self.parsed.options.get(key) is not None:
                opts[key] = self.parsed.options[key]
        # A host tier exists only in the TensorRT-LLM cache model (vLLM's offload connector is not modelled).
        if self.limits.host_cache_bytes > 0 and "host_cache_bytes" in accepted:
            opts["host_cache_bytes"] = self.limits.host_cache_bytes
            opts["kv_bytes_per_token"] = self.model.kv_bytes_per_token(self.limits.kv_cache_dtype)
        build = factory if factory is not None else make_cache
        return build(
            str(self.twin.name), self.memory.num_blocks, self.block_size, self.prefix_caching, **opts
        )

    @classmethod
    def from_argv(
        cls,
        engine: str,
        argv: Sequence[str],
        files: Mapping[str, str] | None = None,
        *,
        gpu: str,
        seed: int = 0,
        observer: EngineObserver | None = None,
        cache_factory: CacheFactory | None = None,
    ) -> TwinEngine:
        """Boot from a real command line, parsed by the engine's adapter (raises ArgsError/StartupOOM)."""
        from prefixtune.engines import get_adapter

        parsed = get_adapter(engine).parse(list(argv), files)
        return cls(parsed, gpu, seed, observer, cache_factory=cache_factory)

    # ---------------------------------------------------------------------------------------------
    # Public API

    def submit(self, req: Request) -> None:
        """Queue a request; it arrives at ``req.arrival_s`` (or at the next step if that has passed)."""
        if self.status != "ok":
            return
        s = _Seq(req, self._order)
        self._order += 1
        prompt_len = req.prompt_len
        if prompt_len + req.output_len > self.memory.max_request_tokens or prompt_len > self._max_prompt:
            self.counters.rejected += 1
            s.state = "done"
            return
        entry = (req.arrival_s, s.order, s)
        pend = self._pending
        if not pend or pend[-1][0] <= req.arrival_s:
            pend.append(entry)
        else:  # arrives before requests already queued
            pend.insert(bisect.bisect_right(pend, entry), entry)

    def submit_all(self, reqs: Iterable[Request]) -> None:
        with gc_paused():
            for r in reqs:
                self.submit(r)

    def idle(self) -> bool:
        return not (self._pending or self._waiting or self._running)

    def next_event_s(self) -> float | None:
        if self.status != "ok":
            return None
        if self._running or self._waiting:
            return self.now
        if self._pending:
            return max(self.now, self._pending[0][0])
        return None

    def gauges(self) -> Gauges:
        return Gauges(
            now=self.now,
            running=len(self._running),
            waiting=len(self._waiting) + sum(1 for t, _, _ in self._pending if t <= self.now),
            kv_usage=float(self.cache.usage()),
            pool_blocks=self.memory.num_blocks,
            pool_tokens=self.memory.pool_tokens,
            block_size=self.block_size,
            free_blocks=int(self.cache.free_blocks()),
            status=self.status,
        )

    def progress(self) -> dict[int, int]:
        """Output tokens each running request has produced so far (req_id -> count), for streaming:
        a decoding request's count follows the decode step counter, so jumps are reflected too."""
        g = self._g
        return {
            s.req.req_id: (s.out - (s.finish_g - g) if s.state == "decode" else s.generated)
            for s in self._running
        }

    @property
    def cache_stats(self) -> CacheStats:
        return self.cache.stats

    def advance(self, until_s: float) -> None:
        """Run until simulated time ``until_s`` (``math.inf``: until every submitted request is done)."""
        with gc_paused():
            self._advance(until_s)

    def _advance(self, until_s: float) -> None:
        # The hot loop: _arrive's and _can_jump's tests inline (the containers are never replaced,
        # except _waiting by _admit, which is read afresh each time).
        pend = self._pending
        running = self._running
        while self.now < until_s:
            if self.status != "ok":
                if until_s < _INF:
                    self._idle_to(until_s)
                return
            if pend and pend[0][0] <= self.now:
                self._arrive()
            waiting = self._waiting
            if not running and not waiting:
                nxt = pend[0][0] if pend else _INF
                target = min(nxt, until_s)
                if target == _INF:
                    return
                self._idle_to(max(target, self.now))
                continue
            if (
                not self._prefill
                and self._n_dec
                and (not waiting or self._blocked or len(running) >= self.max_running)
            ):
                self._decode_run(until_s)
            else:
                self._step()

    # ---------------------------------------------------------------------------------------------
    # Time and arrivals

    def _idle_to(self, t: float) -> None:
        if t > self.now:
            self.counters.kv_usage_integral += self._last_usage * (t - self.now)
            self.now = t

    def _arrive(self) -> None:
        pend = self._pending
        now = self.now
        if not pend or pend[0][0] > now:
            return
        waiting = self._waiting
        while pend and pend[0][0] <= now:
            s = pend.popleft()[2]
            s.state = "waiting"
            waiting.append(s)
        self._blocked = False

    # ---------------------------------------------------------------------------------------------
    # Decode-phase bookkeeping

    def _start_decode(self, s: _Seq) -> None:
        """``s`` has KV for ``s.known`` tokens and ``s.generated`` outputs: it decodes from the next step."""
        g = self._g
        s.state = "decode"
        epoch = s.epoch = s.epoch + 1
        base = s.base = s.known - g
        finish_g = s.finish_g = g + (s.out - s.generated)
        self._n_dec += 1
        self._dec_read_base += base + 1
        self._dec_finish_sum += finish_g
        heapq.heappush(self._finish_heap, (finish_g, s.order, epoch, s))
        if s.cap - base < finish_g:  # otherwise its blocks already hold its last token
            heapq.heappush(self._need_heap, (s.cap - base, s.order, epoch, s))

    def _stop_decode(self, s: _Seq) -> int:
        """Take ``s`` out of the decode set; returns its computed tokens and output count now."""
        g = self._g
        computed = s.base + g
        s.generated = s.out - (s.finish_g - g)
        self._n_dec -= 1
        self._dec_read_base -= s.base + 1
        self._dec_finish_sum -= s.finish_g
        s.epoch += 1
        return computed

    def _finish(self, s: _Seq, computed: int) -> None:
        now = self.now
        r = s.req
        cache = self.cache
        if self.prefix_caching:
            cache.commit(r.req_id, computed, now)
        cache.release(r.req_id, now)
        del self._running[s]
        s.state = "done"
        s.epoch += 1
        self._blocked = False
        self.counters.finished += 1
        self.observer.finished(
            r,
            now,
            now - r.arrival_s,
            s.first_admit_s - r.arrival_s,
            s.first_token_s - s.first_admit_s,
            now - s.first_token_s,
        )

    def _preempt(self, s: _Seq) -> None:
        now = self.now
        if s.state == "decode":
            computed = self._stop_decode(s)
        else:
            computed = s.prefilled
            del self._prefill[s]
            s.epoch += 1
        if self.prefix_caching and computed > 0:
            self.cache.commit(s.req.req_id, computed, now)
        self.cache.release(s.req.req_id, now)
        del self._running[s]
        s.state = "waiting"
        s.known = s.prompt_len + s.generated if s.generated > 0 else s.prompt_len
        s.prefilled = 0
        s.cap = 0
        s.last_token_s = now
        self._waiting.appendleft(s)
        self._blocked = False
        self.counters.preemptions += 1
        self.observer.preempted(s.req, now)

    def _victim(self) -> _Seq:
        if self.twin.retracts_decode:
            decoding = [s for s in self._running if s.state == "decode"]
            if decoding:
                g = self._g
                # retract_decode: least output first, then the longest prompt
                return min(decoding, key=lambda s: (s.out - (s.finish_g - g), -s.prompt_len, -s.order))
        return next(reversed(self._running))

    def _grow(self, s: _Seq, tokens: int) -> bool:
        """Room for ``tokens`` tokens of ``s``; preempts others (or ``s``) when blocks run out.
        Returns False when ``s`` itself was preempted."""
        if tokens <= s.cap:
            return True
        while not self.cache.grow(s.req.req_id, tokens, self.now):
            victim = self._victim()
            self._preempt(victim)
            if victim is s:
                return False
        s.cap = _round_up(tokens, self.block_size)
        return True

    # ---------------------------------------------------------------------------------------------
    # The exact step

    def _step(self) -> None:
        now = self.now
        budget = self.limits.max_batched_tokens
        g = self._g
        # 1. Decoding requests that need a block for this step's token, oldest first.
        need = self._need_heap
        if need and need[0][0] <= g:
            due: list[_Seq] = []
            while need and need[0][0] <= g:
                _, _, epoch, s = heapq.heappop(need)
                if s.epoch == epoch and s.state == "decode":
                    due.append(s)
            due.sort(key=_by_order)
            lookahead = self._lookahead
            ahead = lookahead if self.cache.free_blocks() > self._spare + len(due) * lookahead else 0
            for s in due:
                if s.state != "decode":
                    continue  # preempted while making room for an older one
                target = s.base + g + 1
                if ahead:
                    target = max(target, min(target + ahead, s.base + s.finish_g))
                if self._grow(s, target) and s.cap - s.base < s.finish_g:
                    heapq.heappush(need, (s.cap - s.base, s.order, s.epoch, s))
        # 2. Prefill chunks of running requests, then admissions. Mixed engines (vLLM, TRT-LLM) put
        # decode tokens and prefill chunks in one step; SGLang runs a prefill-only batch instead of a
        # decode batch whenever there is prefill work it can start.
        chunks: list[tuple[_Seq, int]] = []  # (request, tokens computed this step)
        host_tokens = 0
        if self._mixed or self._wants_prefill():
            if self._mixed:
                budget -= self._n_dec
            chunked = self.limits.chunked_prefill
            grow = self._grow
            chunk_tokens = 0
            for s in list(self._prefill) if self._prefill else ():
                if budget <= 0:
                    break
                if s.state != "prefill":
                    continue  # preempted to make room for an older request
                left = s.known - s.prefilled
                chunk = min(left, budget) if chunked else left
                if not chunked and chunk > budget and chunks:
                    break
                if not grow(s, s.prefilled + chunk):
                    continue
                chunks.append((s, chunk))
                chunk_tokens += chunk
                budget -= chunk
            if self._mixed:  # the budget left after the chunks (a preemption may have ended decodes)
                budget = self.limits.max_batched_tokens - self._n_dec - chunk_tokens
            if budget > 0 and not self._blocked and self._waiting:
                host_tokens = self._admit(chunks, budget)
        n_dec = self._n_dec if (self._mixed or not chunks) else 0
        if not chunks and n_dec == 0:
            self._nothing_to_run()
            return
        # 3. Step time.
        read = (self._dec_read_base + n_dec * g) if n_dec else 0
        pairs = read - n_dec / 2.0
        new = n_dec
        prefill_chunk = self.cost.prefill_chunk
        for s, chunk in chunks:
            r, p = prefill_chunk(chunk, s.prefilled)
            read += r
            pairs += p
            new += chunk
        n_seqs = n_dec + len(chunks)
        n_run = len(self._running)
        memory = self.memory
        pressure = memory.pressure(new, n_run)
        if pressure > 1.0 and not self._check_memory(new, n_run):
            return
        dt = self.cost.step_time(n_seqs, new, read, pairs)
        if pressure > PRESSURE_START:  # step_penalty is 1.0 up to there
            dt *= memory.step_penalty(pressure)
        if host_tokens:
            dt += self.cost.host_transfer_time(host_tokens)
        cache = self.cache
        usage = self._last_usage = float(cache.usage())
        prefill_tokens = new - n_dec
        c = self.counters  # the time integrals of one step
        c.steps += 1
        c.busy_s += dt
        c.running_integral += n_run * dt
        c.kv_usage_integral += usage * dt
        c.waiting_integral += len(self._waiting) * dt
        if n_run > c.max_running:
            c.max_running = n_run
        now = self.now = now + dt
        if n_dec:
            self._g += 1
        c.computed_prefill_tokens += prefill_tokens
        c.generation_tokens += n_dec
        self.observer.step(now, dt, 1, prefill_tokens, n_dec)
        if n_dec:
            if self._stalls:
                self._emit_tokens(dt, n_dec)
            else:
                self.observer.tokens(dt, n_dec, now)
        elif self._n_dec:  # a prefill-only batch (SGLang): the decoding requests wait through it
            self._stall(dt)
        # 4. Prefill progress: commit, first tokens, decode start.
        caching = self.prefix_caching
        for s, chunk in chunks:
            prefilled = s.prefilled = s.prefilled + chunk
            if caching:
                cache.commit(s.req.req_id, prefilled, now)
            if prefilled >= s.known:
                self._prefill_done(s)
        heap = self._finish_heap
        if heap and heap[0][0] <= self._g:
            self._finish_due()

    def _stall(self, dt: float) -> None:
        stalls = self._stalls
        for entry in stalls:
            entry[1] += dt
        new = self._n_dec - sum(int(c) for c, _ in stalls)
        if new > 0:
            stalls.append([new, dt])

    def _emit_tokens(self, gap: float, n: int) -> None:
        """``n`` decode tokens, each ``gap`` after the request's previous one; the requests that
        waited through prefill-only batches since their previous token waited that much longer."""
        stalls = self._stalls
        if not stalls:
            self.observer.tokens(gap, n, self.now)
            return
        left = n
        for count, waited in stalls:
            c = min(int(count), left)
            if c:
                self.observer.tokens(gap + waited, c, self.now)
                left -= c
        stalls.clear()
        if left:
            self.observer.tokens(gap, left, self.now)

    def _wants_prefill(self) -> bool:
        return bool(self._prefill) or (
            bool(self._waiting) and not self._blocked and len(self._running) < self.max_running
        )

    def _prefill_done(self, s: _Seq) -> None:
        del self._prefill[s]
        now = self.now
        s.generated += 1
        self.counters.generation_tokens += 1
        if s.first_token_s < 0:
            s.first_token_s = now
            self.observer.first_token(s.req, now - s.req.arrival_s, now)
        else:  # recomputed after a preemption: this token's gap runs from the last one before it
            self.observer.tokens(now - s.last_token_s, 1, now)
        if s.generated >= s.out:
            self._finish(s, s.known)
            return
        self._start_decode(s)

    def _finish_due(self) -> None:
        heap = self._finish_heap
        g = self._g
        pop = heapq.heappop
        while heap and heap[0][0] <= g:
            _, _, epoch, s = pop(heap)
            if s.epoch == epoch and s.state == "decode":
                self._finish(s, self._stop_decode(s))

    def _check_memory(self, step_tokens: int, running: int) -> bool:
        if self.memory.pressure(step_tokens, running) <= 1.0:
            return True
        need = self.memory.activation_need(step_tokens, running) / 1024**3
        budget = self.memory.activation_budget / 1024**3
        self.status = "oom_runtime"
        self.oom_reason = (
            f"CUDA out of memory at t={self.now:.3f}s: a step of {step_tokens} tokens with {running} running "
            f"requests needs {need:.2f} GiB of activations, {budget:.2f} GiB available"
        )
        self.observer.oom(self.now, self.oom_reason)
        return False

    def _nothing_to_run(self) -> None:
        """No step could be formed. With nothing running, a queue head that an empty engine cannot
        admit is dropped (the engine would reject it); otherwise the next loop retries."""
        if not self._running and self._waiting and self._blocked:
            s = self._waiting.popleft()
            s.state = "done"
            self.counters.rejected += 1
            self._blocked = False

    # ---------------------------------------------------------------------------------------------
    # Admission

    def _ordered_waiting(self) -> Iterable[_Seq]:
        policy = self.policy
        w = self._waiting
        if policy in {"fcfs", "priority", "guaranteed_no_evict", "max_utilization"}:
            return w
        if policy == "lpm":
            if len(w) > LPM_MAX_WAITING:
                return w
            hits = {s: self.cache.lookup(s.req.seq, s.known).hit_tokens for s in w}
            return sorted(w, key=lambda s: (-hits[s], s.order))
        if policy == "hrrn":
            # SGLang's _sort_by_hrrn: highest response ratio (wait / uncached prefill) first; a request
            # with nothing to prefill drains at once; fcfs beyond 128 waiting, like lpm. The twin ages
            # by time, which the engine's token-based aging equals at constant prefill throughput.
            if len(w) > LPM_MAX_WAITING:
                return w
            now = self.now

            def ratio(s: _Seq) -> tuple[float, int]:
                uncached = s.known - self.cache.lookup(s.req.seq, s.known).hit_tokens
                if uncached <= 0:
                    return (-_INF, s.order)
                return (-(now - s.req.arrival_s) / uncached, s.order)

            return sorted(w, key=ratio)
        if policy == "lof":
            return sorted(w, key=lambda s: (-s.out, s.order))
        if policy == "random":
            items = list(w)
            self._rng.shuffle(items)
            return items
        # dfs-weight (approximation): group by the cached prefix each request would reuse; larger
        # groups first, fcfs inside a group.
        keys: dict[_Seq, tuple[int, int]] = {}
        for s in w:
            hit = self.cache.lookup(s.req.seq, s.known).hit_tokens
            keys[s] = s.req.seq.prefix_id(hit) if hit > 0 else (0, 0)
        weight: dict[tuple[int, int], int] = {}
        for k in keys.values():
            weight[k] = weight.get(k, 0) + 1
        return sorted(w, key=lambda s: (keys[s] == (0, 0), -weight[keys[s]], s.order))

    def _admit(self, chunks: list[tuple[_Seq, int]], budget: int) -> int:
        """Admit waiting requests into the step; returns host-tier tokens to onboard."""
        host = 0
        bs = self.block_size
        chunked = self.limits.chunked_prefill
        admitted: list[_Seq] = []
        reserve = 0
        ratio = self._new_token_ratio
        if ratio:  # SGLang keeps room for the running requests' future tokens
            remaining = self._dec_finish_sum - self._n_dec * self._g
            remaining += sum(s.out - s.generated for s in self._prefill)
            reserve = math.ceil(remaining * ratio / bs)
        no_evict = self._no_evict
        cache = self.cache
        now = self.now
        running = self._running
        prefill = self._prefill
        counters = self.counters
        max_running = self.max_running
        admit = cache.admit
        observe = self.observer.admitted
        ordered = self._ordered_waiting()
        # min/max of ints below as conditionals (the same values, without the builtin calls)
        for s in ordered:
            if budget <= 0 or len(running) >= max_running:
                break
            req = s.req
            known = s.known
            if known <= budget and not reserve and not no_evict:
                # the whole prompt fits the budget whatever the hit: no need to look it up first
                hit, chunk = 0, known
            else:
                match = cache.lookup(req.seq, known)
                hit = min(match.hit_tokens, known - 1)
                left = known - hit
                if chunked:
                    chunk = min(left, budget)
                else:
                    chunk = left
                    if chunk > budget and (chunks or admitted):
                        break
            if no_evict:
                alloc = s.prompt_len + s.out - 1 if s.generated == 0 else known + (s.out - s.generated) - 1
                alloc = max(alloc, hit + chunk)
            else:
                alloc = hit + chunk
            if reserve or no_evict:
                new_blocks = -(-alloc // bs) - hit // bs
                if cache.free_blocks() < new_blocks + reserve:
                    self._blocked = True
                    break
            m = admit(req.req_id, req.seq, known, alloc, now)
            if m is None:
                self._blocked = True
                break
            hit = m.hit_tokens
            if hit > known - 1:
                hit = known - 1
            chunk = known - hit
            if chunked and budget < chunk:
                chunk = budget
            host += m.host_tokens
            s.state = "prefill"
            s.hit = hit
            s.prefilled = hit
            held = hit + chunk
            if alloc > held:
                held = alloc
            s.cap = -(-held // bs) * bs
            s.admit_s = now
            if s.first_admit_s < 0:
                s.first_admit_s = now
                prompt_len = s.prompt_len
                counters.prompt_tokens += prompt_len
                counters.saved_prefill_tokens += hit if hit < prompt_len else prompt_len
            running[s] = None
            prefill[s] = None
            admitted.append(s)
            chunks.append((s, chunk))
            budget -= chunk
            observe(req, m, now)
        if admitted:
            w = self._waiting
            if ordered is w or all(w[i] is s for i, s in enumerate(admitted)):  # from the front
                for _ in admitted:
                    w.popleft()
            else:
                ids = set(admitted)
                self._waiting = deque(s for s in w if s not in ids)
        return host

    # ---------------------------------------------------------------------------------------------
    # Skipping ahead through decode-only stretches

    def _decode_run(self, until_s: float) -> None:
        g = self._g
        n = self._n_dec
        # Next finish.
        heap = self._finish_heap
        pop = heapq.heappop
        top = heap[0]
        while top[3].epoch != top[2] or top[3].state != "decode":
            pop(heap)
            top = heap[0]
        k = top[0] - g
        # Next admissible arrival, or the horizon. While admission is blocked the next arrival ends
        # the run too: it joins the queue at its time even when it cannot be admitted (gauges).
        deadline = until_s
        pend = self._pending
        n_run = len(self._running)
        if pend and (self._blocked or n_run < self.max_running):
            arrival = pend[0][0]
            if arrival < deadline:
                deadline = arrival
        memory = self.memory
        pressure = memory.pressure(n, n_run)
        if pressure > 1.0 and not self._check_memory(n, n_run):
            return
        penalty = 1.0 if pressure <= PRESSURE_START else memory.step_penalty(pressure)
        run = self.cost.decode_run(n, self._dec_read_base + n * g)
        if deadline < _INF:
            steps = run.steps_until((deadline - self.now) / penalty)
            if steps < k:
                k = steps
        if k < 1:
            k = 1
        # Blocks for k steps: every request must hold base + g + k tokens at the end.
        need = self._need_heap
        due: list[_Seq] = []
        gk = g + k
        bs = self.block_size
        new_blocks = 0
        while need and need[0][0] < gk:
            _, _, epoch, s = pop(need)
            if s.epoch == epoch and s.state == "decode":
                due.append(s)
                new_blocks += -(-(s.base + gk) // bs) - s.cap // bs
        cache = self.cache
        free = cache.free_blocks()
        if new_blocks > free:
            for s in due:  # not enough for the whole run: step exactly (and preempt) instead
                heapq.heappush(need, (s.cap - s.base, s.order, s.epoch, s))
            self._step()
            return
        # With memory to spare, allocate a little ahead (fewer allocation events; the usage gauge
        # reads at most LOOKAHEAD_TOKENS per request high). Never near a full pool.
        ahead = self._lookahead if free - new_blocks - len(due) * self._lookahead // bs > self._spare else 0
        grow = cache.grow
        push = heapq.heappush
        now = self.now
        for s in due:
            base = s.base
            target = needed = base + gk
            if ahead:  # max(min(target + ahead, base + finish_g), needed), of ints
                target += ahead
                last = base + s.finish_g
                if last < target:
                    target = last
                if needed > target:
                    target = needed
            if not grow(s.req.req_id, target, now):  # pragma: no cover - counted above
                raise RuntimeError("KV cache refused a growth that fits its free blocks")
            cap = s.cap = -(-target // bs) * bs
            if cap - base < s.finish_g:
                push(need, (cap - base, s.order, s.epoch, s))
        dt = run.total(k) * penalty
        usage = self._last_usage = float(cache.usage())
        c = self.counters  # the time integrals of k steps
        c.steps += k
        c.busy_s += dt
        c.running_integral += n_run * dt
        c.kv_usage_integral += usage * dt
        c.waiting_integral += len(self._waiting) * dt
        if n_run > c.max_running:
            c.max_running = n_run
        now = self.now = self.now + dt
        self._g = gk
        c.generation_tokens += n * k
        observer = self.observer
        observer.step(now, dt, k, 0, n * k)
        if self._stalls:
            self._emit_tokens(dt / k, n)
            if k > 1:
                observer.tokens(dt / k, n * (k - 1), now)
        else:
            observer.tokens(dt / k, n * k, now)
        if heap and heap[0][0] <= gk:
            self._finish_due()


def _round_up(n: int, b: int) -> int:
    return -(-n // b) * b

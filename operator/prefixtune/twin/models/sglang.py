"""SGLang as the twin models it: memory plan, scheduler traits, costs, radix cache, metrics, quirks.

Sources: ``reference/engines.md`` 1.2 (flags, defaults by GPU memory, ``resolve_max_num_reqs``), 2.2
(metrics: ``srt/metrics/collector.py``), 4.2 (memory); the scheduler's retraction and new-token
reservation (``schedule_policy.py``, ``scheduler.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prefixtune.engines.base import EngineName
from prefixtune.engines.sglang import MAX_PREFILL_TOKENS
from prefixtune.twin.cache import EVICTION_POLICIES, SglangCache
from prefixtune.twin.cache.base import KVCache
from prefixtune.twin.catalog import GIB, GpuHardware
from prefixtune.twin.exporter import (
    MODEL_NAME,
    SGLANG_E2E,
    SGLANG_ITL,
    SGLANG_TTFT,
    Admitted,
    Child,
    EngineExporter,
    Finished,
    FirstToken,
    MetricState,
    Move,
    Preempted,
    Scrape,
    Series,
    Steps,
    TableMetrics,
    TimeWindow,
    Tokens,
    at_finish,
    counter,
    gauge,
    histogram,
    rendered_buckets,
    tpot,
)
from prefixtune.twin.memory import NON_TORCH_BYTES, MemoryStart, StartupOOM
from prefixtune.twin.models.base import SchedulerDefaults, TwinModel, adapter_defaults, register

UNCHUNKED_PREFILL_TOKENS = MAX_PREFILL_TOKENS  # the --max-prefill-tokens default caps an unchunked batch


SCHED = {
    "model_name": MODEL_NAME,
    "engine_type": "unified",
    "tp_rank": "0",
    "pp_rank": "0",
    "moe_ep_rank": "0",
}
TOK = {"model_name": MODEL_NAME, "engine_type": "unified"}
STREAMING = {**TOK, "is_streaming": "false"}


def _computed(e: Admitted) -> int:
    # A re-admission after a retraction also re-prefills the tokens generated so far; the
    # observer does not say how many, so only the prompt's part is counted as computed.
    return max(0, e.req.prompt_len - e.match.hit_tokens)


def _host(e: Finished) -> int:
    return e.m.x.host_cached.get(e.req.req_id, 0)


def _hit(e: Finished) -> bool:
    return e.cached > 0


def _evicted(s: Scrape) -> float | None:
    return None if s.stats is None else s.stats.evicted_blocks * s.gauges.block_size


def _itl_buckets(x: EngineExporter) -> tuple[float, ...]:
    return rendered_buckets(x.option("itl_buckets", None), SGLANG_ITL)


def _admitted(amount: Callable[[Admitted], float]) -> tuple[Move[Admitted]]:
    return (Move(Admitted, amount),)


# Prefill tokens are counted per prefill (re-prefills after a retraction count again), cached tokens
# and the token totals per finished request.
SERIES: tuple[Series, ...] = (
    gauge("sglang:num_running_reqs", "The number of running requests.", SCHED, "running"),
    gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", SCHED, "waiting"),
    gauge("sglang:token_usage", "The token usage.", SCHED, lambda m: round(m.x.snapshot.kv_usage, 2)),
    gauge("sglang:num_used_tokens", "The number of used tokens.", SCHED, "used_tokens"),
    gauge(
        "sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", SCHED,
        "pool_tokens",
    ),
    gauge("sglang:page_size", "The page size of the KV cache.", SCHED, "block_size"),
    gauge("sglang:num_pages", "The number of pages in the KV cache pool.", SCHED, "pool_blocks"),
    gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", SCHED, lambda m: m.state.batch_hit_rate),
    gauge(
        "sglang:gen_throughput", "The generation throughput (token/s).", SCHED,
        lambda m: m.state.gen_throughput(m.x.snapshot.now),
    ),
    gauge(
        "sglang:num_retracted_reqs", "The number of retracted requests.", SCHED,
        lambda m: float(m.state.last_retracted),
    ),
    gauge("sglang:num_paused_reqs", "The number of paused requests.", SCHED, lambda m: 0.0),
    counter(
        "sglang:prefill_effective_tokens_total",
        "Prefill tokens by mode: input (computed), device_hit, host_hit, storage_hit. "
        "Hit rate = sum(rate(*_hit)) / sum(rate(all modes)).",
        SCHED, by="mode",
        children=(
            Child("input", moves=_admitted(_computed)),
            Child("device_hit", moves=_admitted(lambda e: e.match.hit_tokens - e.match.host_tokens)),
            Child("host_hit", moves=_admitted(lambda e: e.match.host_tokens)),
            Child("storage_hit"),
        ),
    ),
    counter(
        "sglang:realtime_tokens_total", "Tokens processed, by mode.", SCHED, by="mode",
        children=(
            Child("prefill_compute", moves=_admitted(_computed)),
            Child("prefill_cache", moves=_admitted(lambda e: e.match.hit_tokens)),
            Child("decode", moves=(Move(Steps, lambda e: e.decode),)),
        ),
    ),
    counter(
        "sglang:num_retracted_requests_total", "Total number of retracted requests.", SCHED,
        Move(Preempted, lambda e: 1),
    ),
    counter(
        "sglang:prompt_tokens_total", "Number of prefill tokens processed.", STREAMING,
        at_finish(lambda e: e.req.prompt_len),
    ),
    counter(
        "sglang:generation_tokens_total", "Number of generation tokens processed.", STREAMING,
        at_finish(lambda e: e.req.output_len),
    ),
    counter(
        "sglang:cached_tokens_total", "Number of cached prompt tokens.", TOK, by="cache_source",
        children=(
            Child("device", moves=(Move(Finished, lambda e: e.cached - _host(e), when=_hit),)),
            Child("host", moves=(Move(Finished, _host, when=_hit),)),
            Child("storage"),
        ),
    ),
    counter("sglang:num_requests_total", "Number of requests processed.", TOK, at_finish(lambda e: 1)),
    counter("sglang:num_aborted_requests_total", "Number of requests aborted.", TOK),
    counter(
        "sglang:evicted_tokens_total", "Number of tokens evicted from the radix cache.", SCHED,
        mirror=_evicted,
    ),
    histogram(
        "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", STREAMING,
        # --bucket-time-to-first-token (the operator renders bounds that resolve the SLO)
        lambda x: rendered_buckets(x.option("ttft_buckets", None), SGLANG_TTFT),
        Move(FirstToken, lambda e: e.ttft_s),
    ),
    histogram(
        "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", TOK,
        # --bucket-inter-token-latency (the operator renders the ITL target as a bound); SGLang
        # bounds the per-request TPOT histogram below with the same list
        _itl_buckets, Move(Tokens, lambda e: e.gap_s, times=lambda e: e.n),
    ),
    histogram(
        "sglang:request_time_per_output_token_seconds",
        "Histogram of time per output token per request in seconds.", STREAMING,
        _itl_buckets, at_finish(lambda e: tpot(e.decode_s, e.req.output_len)),
    ),
    histogram(
        "sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
        STREAMING, SGLANG_E2E, at_finish(lambda e: e.e2e_s),
    ),
    histogram(
        "sglang:queue_time_seconds", "Histogram of queueing time in seconds.", TOK, SGLANG_E2E,
        at_finish(lambda e: e.queue_s),
    ),
)  # fmt: skip


class SglangState(MetricState):
    """SGLang logs some gauges per batch: the hit rate of the prefill batch just run, the
    retractions of the last decode batch (here a "batch" is the run of steps just reported); the
    generation throughput over the last 5 s."""

    def __init__(self) -> None:
        self.batch_hit_rate = 0.0
        self.batch_hit = 0
        self.batch_total = 0
        self.last_retracted = 0
        self.retracted_since_step = 0
        self.decoded = TimeWindow(5.0)

    def gen_throughput(self, now: float) -> float:
        return self.decoded.sum(now) / self.decoded.span_s

    def update(self, event: object) -> None:
        if isinstance(event, Admitted):
            self.batch_hit += event.match.hit_tokens
            self.batch_total += event.req.prompt_len
        elif isinstance(event, Preempted):
            self.retracted_since_step += 1
        elif isinstance(event, Steps):
            if self.batch_total > 0:
                self.batch_hit_rate = self.batch_hit / self.batch_total
                self.batch_hit = self.batch_total = 0
            self.last_retracted = self.retracted_since_step
            self.retracted_since_step = 0
            self.decoded.add(event.now, event.decode)


class SglangMetrics(TableMetrics):
    """SGLang's series as ``srt/metrics/collector.py`` exports them (reference/engines.md 2.2)."""

    table = SERIES
    state_type = SglangState


class SglangModel(TwinModel):
    name = EngineName.SGLANG
    step_overhead_s = 1.4e-3
    seq_overhead_s = 5e-6
    retracts_decode = True  # retract_decode: least output first, then the longest prompt
    new_token_ratio = 0.3  # its new_token_ratio reservation, fixed here
    cache_options = ("eviction_policy",)
    owned_by = "sglang"
    info_routes = True  # /get_server_info, /server_info, /get_model_info, /model_info
    metrics = SglangMetrics

    def scheduler_defaults(self, gpu: GpuHardware) -> SchedulerDefaults:
        # chunked-prefill-size by GPU memory (engines/sglang.py); max-running-requests 0: from the pool
        return adapter_defaults(self.name, gpu)

    def unchunked_budget(self, budget: int, chunked: bool, budget_given: bool, max_model_len: int) -> int:
        # without chunking, a prefill batch is capped by --max-prefill-tokens
        return UNCHUNKED_PREFILL_TOKENS if not chunked and not budget_given else budget

    def resolve_max_running(self, max_running: int, pool_tokens: int, context_len: int) -> int:
        if max_running != 0:
            return max_running
        # resolve_max_num_reqs
        return min(max(int(pool_tokens / context_len * 512), 2048), 4096, max(1, pool_tokens // 2))

    def memory_split(self, start: MemoryStart) -> tuple[float, float]:
        # pool = u*M_free_at_start - weights; activations, graphs and buffers live outside the fraction
        # (kv_cache_configurator._profile_available_bytes, engines.md 4.2). What is outside must hold
        # the CUDA graphs and a full chunk's activations, or the engine fails while it starts (graph
        # capture: "set --mem-fraction-static to a smaller value"); the failure point is inferred, not
        # reproduced. SGLang's default fraction keeps a wider margin for the same trade,
        # 512 + max(chunked_prefill_size, 2048)*1.5 MB + ... (arg_groups/memory_hook.py): that rule
        # sets the default, it is not a start-up check.
        u, gib, free_at_start = start.fraction, GIB, start.free_at_start
        pool = u * free_at_start - start.weights
        outside = (1.0 - u) * free_at_start - start.graphs - NON_TORCH_BYTES
        if pool > 0 and outside < start.profile:
            raise StartupOOM(
                f"SGLang: memory outside --mem-fraction-static ({(1 - u) * free_at_start / gib:.2f} GiB) "
                f"cannot hold CUDA graphs and a {start.max_batched_tokens}-token prefill; lower the fraction"
            )
        return pool, outside

    def make_cache(
        self, num_blocks: int, block_size: int, prefix_caching: bool, options: Mapping[str, object]
    ) -> KVCache:
        policy = str(options.get("eviction_policy", "lru"))
        if policy not in EVICTION_POLICIES:
            raise ValueError(
                f"cache option eviction_policy must be one of {', '.join(EVICTION_POLICIES)}, got {policy!r}"
            )
        return SglangCache(num_blocks, block_size, prefix_caching, eviction_policy=policy)


MODEL = register(SglangModel())

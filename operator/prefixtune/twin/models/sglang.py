"""SGLang as the twin models it: memory plan, scheduler traits, costs, radix cache, metrics, quirks.

Sources: ``reference/engines.md`` 1.2 (flags, defaults by GPU memory, ``resolve_max_num_reqs``), 2.2
(metrics: ``srt/metrics/collector.py``), 4.2 (memory); the scheduler's retraction and new-token
reservation (``schedule_policy.py``, ``scheduler.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from prometheus_client import Counter, Gauge, Histogram

from prefixtune.engines.base import EngineName
from prefixtune.twin.cache import EVICTION_POLICIES, SglangCache
from prefixtune.twin.cache.base import CacheStats, KVCache, Match
from prefixtune.twin.catalog import GIB, GpuSpec
from prefixtune.twin.exporter import (
    SGLANG_E2E,
    SGLANG_ITL,
    SGLANG_TTFT,
    EngineExporter,
    EngineMetrics,
    Window,
    inc_to,
    observe_many,
    tpot,
    ttft_buckets,
)
from prefixtune.twin.memory import NON_TORCH_BYTES, MemoryStart, StartupOOM
from prefixtune.twin.models.base import SchedulerDefaults, TwinModel, register
from prefixtune.twin.observer import Gauges
from prefixtune.twin.request import Request

UNCHUNKED_PREFILL_TOKENS = 16384  # --max-prefill-tokens default: caps a prefill batch without chunking


class SglangMetrics(EngineMetrics):
    """SGLang's series as ``srt/metrics/collector.py`` exports them (reference/engines.md 2.2)."""

    def __init__(self, exporter: EngineExporter) -> None:
        super().__init__(exporter)
        sched = {
            "model_name": exporter.model,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        tok = {"model_name": exporter.model, "engine_type": "unified"}
        r = self.registry
        g = exporter.gauge_value

        def gauge(name: str, doc: str, fn: Callable[[], float]) -> None:
            Gauge(name, doc, list(sched), registry=r).labels(**sched).set_function(fn)

        gauge("sglang:num_running_reqs", "The number of running requests.", g("running"))
        gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", g("waiting"))
        gauge("sglang:token_usage", "The token usage.", lambda: round(exporter.snapshot.kv_usage, 2))
        gauge("sglang:num_used_tokens", "The number of used tokens.", g("used_tokens"))
        gauge(
            "sglang:max_total_num_tokens",
            "Maximum total number of tokens in the KV cache pool.",
            g("pool_tokens"),
        )
        gauge("sglang:page_size", "The page size of the KV cache.", g("block_size"))
        gauge("sglang:num_pages", "The number of pages in the KV cache pool.", g("pool_blocks"))
        gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", lambda: self.batch_hit_rate)
        gauge("sglang:gen_throughput", "The generation throughput (token/s).", self._gen_throughput)
        gauge(
            "sglang:num_retracted_reqs",
            "The number of retracted requests.",
            lambda: float(self.last_retracted),
        )
        gauge("sglang:num_paused_reqs", "The number of paused requests.", lambda: 0.0)

        def counter(name: str, doc: str, labels: Mapping[str, str], extra: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, [*labels, *extra], registry=r)

        eff = counter(
            "sglang:prefill_effective_tokens_total",
            "Prefill tokens by mode: input (computed), device_hit, host_hit, storage_hit. "
            "Hit rate = sum(rate(*_hit)) / sum(rate(all modes)).",
            sched,
            ["mode"],
        )
        self.eff = {
            m: eff.labels(**sched, mode=m) for m in ("input", "device_hit", "host_hit", "storage_hit")
        }
        realtime = counter("sglang:realtime_tokens_total", "Tokens processed, by mode.", sched, ["mode"])
        self.rt = {
            m: realtime.labels(**sched, mode=m) for m in ("prefill_compute", "prefill_cache", "decode")
        }
        self.retracted = counter(
            "sglang:num_retracted_requests_total", "Total number of retracted requests.", sched
        ).labels(**sched)
        streaming = {**tok, "is_streaming": "false"}
        self.prompt_tokens = counter(
            "sglang:prompt_tokens_total", "Number of prefill tokens processed.", streaming
        ).labels(**streaming)
        self.generation_tokens = counter(
            "sglang:generation_tokens_total", "Number of generation tokens processed.", streaming
        ).labels(**streaming)
        cached = counter(
            "sglang:cached_tokens_total", "Number of cached prompt tokens.", tok, ["cache_source"]
        )
        self.cached = {s: cached.labels(**tok, cache_source=s) for s in ("device", "host", "storage")}
        self.requests = counter("sglang:num_requests_total", "Number of requests processed.", tok).labels(
            **tok
        )
        counter("sglang:num_aborted_requests_total", "Number of requests aborted.", tok).labels(**tok)
        self.evicted = counter(
            "sglang:evicted_tokens_total", "Number of tokens evicted from the radix cache.", sched
        ).labels(**sched)

        def hist(name: str, doc: str, labels: Mapping[str, str], buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, list(labels), buckets=buckets, registry=r).labels(**labels)

        self.ttft = hist(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            streaming,
            # --bucket-time-to-first-token (the operator renders bounds that resolve the SLO)
            ttft_buckets(exporter.option("ttft_buckets", SGLANG_TTFT)),
        )
        self.itl = hist(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            tok,
            SGLANG_ITL,
        )
        self.tpot = hist(
            "sglang:request_time_per_output_token_seconds",
            "Histogram of time per output token per request in seconds.",
            streaming,
            SGLANG_ITL,
        )
        self.e2e = hist(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            streaming,
            SGLANG_E2E,
        )
        self.queue = hist(
            "sglang:queue_time_seconds", "Histogram of queueing time in seconds.", tok, SGLANG_E2E
        )
        self.batch_hit_rate = 0.0
        self.batch_hit = 0
        self.batch_total = 0
        self.last_retracted = 0
        self.retracted_since_step = 0
        self.decoded = Window(5.0)

    def refresh(self, gauges: Gauges, stats: CacheStats | None) -> None:
        if stats is not None:
            inc_to(self.evicted, stats.evicted_blocks * gauges.block_size)

    def _gen_throughput(self) -> float:
        return self.decoded.sum(self.x.snapshot.now) / self.decoded.span_s

    def on_admitted(self, req: Request, match: Match, now: float, first: bool) -> None:
        device = match.hit_tokens - match.host_tokens
        # A re-admission after a retraction also re-prefills the tokens generated so far; the
        # observer does not say how many, so only the prompt's part is counted as computed.
        computed = max(0, req.prompt_len - match.hit_tokens)
        self.eff["input"].inc(computed)
        self.eff["device_hit"].inc(device)
        self.eff["host_hit"].inc(match.host_tokens)
        self.rt["prefill_compute"].inc(computed)
        self.rt["prefill_cache"].inc(match.hit_tokens)
        self.batch_hit += match.hit_tokens
        self.batch_total += req.prompt_len

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self.ttft.observe(ttft_s)

    def on_tokens(self, gap_s: float, count: int, now: float) -> None:
        observe_many(self.itl, gap_s, count)

    def on_finished(
        self, req: Request, cached: int, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        self.prompt_tokens.inc(req.prompt_len)
        self.generation_tokens.inc(req.output_len)
        host = self.x.host_cached.pop(req.req_id, 0)
        if cached > 0:
            self.cached["device"].inc(cached - host)
            self.cached["host"].inc(host)
        self.requests.inc()
        self.e2e.observe(e2e_s)
        self.queue.observe(queue_s)
        self.tpot.observe(tpot(decode_s, req.output_len))

    def on_preempted(self, req: Request, now: float) -> None:
        self.retracted.inc()
        self.retracted_since_step += 1

    def on_step(self, now: float, duration_s: float, steps: int, prefill: int, decode: int) -> None:
        # SGLang logs its gauges per batch: the hit rate of the prefill batch just run, the
        # retractions of the last decode batch. Here a "batch" is the run of steps just reported.
        if self.batch_total > 0:
            self.batch_hit_rate = self.batch_hit / self.batch_total
            self.batch_hit = self.batch_total = 0
        self.last_retracted = self.retracted_since_step
        self.retracted_since_step = 0
        self.rt["decode"].inc(decode)
        self.decoded.add(now, decode)


class SglangModel(TwinModel):
    name = EngineName.SGLANG
    step_overhead_s = 1.4e-3
    seq_overhead_s = 5e-6
    mixed_batches = False  # prefill batches do not decode (--enable-mixed-chunk is not modelled)
    retracts_decode = True  # retract_decode: least output first, then the longest prompt
    new_token_ratio = 0.3  # its new_token_ratio reservation, fixed here
    cache_options = ("eviction_policy",)
    owned_by = "sglang"
    metrics = SglangMetrics

    def scheduler_defaults(self, gpu: GpuSpec) -> SchedulerDefaults:
        # engines.md 1.2: chunked-prefill-size by GPU memory; max-running-requests from the pool later
        gib = gpu.memory_bytes / 1024**3
        budget = 16384 if gib >= 160 else 8192 if gib >= 35 else 4096
        return SchedulerDefaults(0, budget, True)

    def unchunked_budget(self, budget: int, chunked: bool, budget_given: bool) -> int:
        # without chunking, a prefill batch is capped by --max-prefill-tokens
        return UNCHUNKED_PREFILL_TOKENS if not chunked and not budget_given else budget

    def resolve_max_running(self, max_running: int, pool_tokens: int, context_len: int) -> int:
        if max_running != 0:
            return max_running
        # resolve_max_num_reqs
        return min(max(int(pool_tokens / context_len * 512), 2048), 4096, max(1, pool_tokens // 2))

    def memory_split(self, start: MemoryStart) -> tuple[float, float]:
        # pool = u*M_free_at_start - weights; activations, graphs and buffers live outside the fraction
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

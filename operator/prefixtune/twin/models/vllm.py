"""vLLM as the twin models it: memory plan, scheduler defaults, costs, cache, metrics, serving quirks.

Sources: ``reference/engines.md`` 1.1 (flags and API-server defaults), 2.1 (metrics), 4.1 (memory);
the series and their buckets follow ``vllm/v1/metrics/loggers.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from prometheus_client import Counter, Gauge, Histogram

from prefixtune.engines.base import EngineName
from prefixtune.twin.cache import NativeVllmCache, VllmCache, use_native_pool
from prefixtune.twin.cache.base import CacheStats, KVCache, Match
from prefixtune.twin.catalog import GIB, GpuSpec
from prefixtune.twin.exporter import (
    VLLM_ITERATION_TOKENS,
    VLLM_ITL,
    VLLM_LATENCY,
    VLLM_TTFT,
    EngineExporter,
    EngineMetrics,
    buckets_1_2_5,
    observe_many,
    tpot,
)
from prefixtune.twin.memory import NON_TORCH_BYTES, MemoryStart, StartupOOM
from prefixtune.twin.models.base import SchedulerDefaults, TwinModel, register
from prefixtune.twin.observer import Gauges
from prefixtune.twin.request import Request


class VllmMetrics(EngineMetrics):
    """vLLM's series as ``vllm/v1/metrics/loggers.py`` exports them (reference/engines.md 2.1)."""

    def __init__(self, exporter: EngineExporter) -> None:
        super().__init__(exporter)
        lab = {"model_name": exporter.model, "engine": "0"}
        names = list(lab)
        r = self.registry
        g = exporter.gauge_value

        def gauge(name: str, doc: str, fn: Callable[[], float]) -> None:
            Gauge(name, doc, names, registry=r).labels(**lab).set_function(fn)

        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", g("running"))
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", g("waiting"))
        waiting_by = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of requests waiting, by reason.",
            [*names, "reason"],
            registry=r,
        )
        waiting_by.labels(**lab, reason="capacity").set_function(g("waiting"))
        waiting_by.labels(**lab, reason="deferred").set(0)
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", g("kv_usage"))

        def counter(name: str, doc: str, extra: Mapping[str, str] | None = None) -> Counter:
            labels = {**lab, **(extra or {})}
            return Counter(name, doc, list(labels), registry=r).labels(**labels)

        self.queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        counter(
            "vllm:external_prefix_cache_queries", "External prefix cache queries (KV connector), in tokens."
        )
        counter("vllm:external_prefix_cache_hits", "External prefix cache hits (KV connector), in tokens.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.cached_tokens = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        by_source = Counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            [*names, "source"],
            registry=r,
        )
        self.compute_tokens = by_source.labels(**lab, source="local_compute")
        self.local_hit_tokens = by_source.labels(**lab, source="local_cache_hit")
        by_source.labels(**lab, source="external_kv_transfer")
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=r,
        )
        # The twin generates exactly the requested max_tokens: every request ends by length.
        self.success = success.labels(**lab, finished_reason="length")
        success.labels(**lab, finished_reason="stop")
        success.labels(**lab, finished_reason="abort")

        def hist(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=r).labels(**lab)

        tok = buckets_1_2_5(exporter.max_model_len)
        self.req_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok)
        self.req_gen = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", tok)
        self.req_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Prefill tokens computed (not from cache), per request.",
            tok,
        )
        self.req_preemptions = hist(
            "vllm:request_num_preemptions", "Number of preemptions per request.", (0, 1, 2, 5, 10, 20)
        )
        self.iteration = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            VLLM_ITERATION_TOKENS,
        )
        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", VLLM_TTFT
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", VLLM_ITL
        )
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            VLLM_ITL,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", VLLM_LATENCY
        )
        self.queue = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            VLLM_LATENCY,
        )
        self.inference = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            VLLM_LATENCY,
        )
        self.prefill = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            VLLM_LATENCY,
        )
        self.decode = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            VLLM_LATENCY,
        )
        self.config_info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            [
                "block_size",
                "cache_dtype",
                "enable_prefix_caching",
                "engine",
                "gpu_memory_utilization",
                "num_cpu_blocks",
                "num_gpu_blocks",
            ],
            registry=r,
        )
        self.computed: dict[int, int] = {}

    def refresh(self, gauges: Gauges, stats: CacheStats | None) -> None:
        cfg = self.x.parsed.config if self.x.parsed is not None else None
        self.config_info.clear()
        self.config_info.labels(
            block_size=str(gauges.block_size),
            cache_dtype=str(self.x.option("kv_cache_dtype", "auto")),
            enable_prefix_caching=str(bool(cfg.prefix_caching) if cfg else True),
            engine="0",
            gpu_memory_utilization=str(float(cfg.memory_fraction) if cfg else 0.92),
            num_cpu_blocks="None",
            num_gpu_blocks=str(gauges.pool_blocks),
        ).set(1)

    def on_admitted(self, req: Request, match: Match, now: float, first: bool) -> None:
        if first:  # scheduler stats; re-admissions after preemption go to unexported counters
            self.queries.inc(req.prompt_len)
            self.hits.inc(match.hit_tokens)
        recomputed = max(0, req.prompt_len - match.hit_tokens)  # generated tokens not counted: unknown
        self.computed[req.req_id] = self.computed.get(req.req_id, 0) + recomputed

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        # Iteration stats: the prompt's tokens (and where they came from) when its prefill ends.
        cached = self.x.cached_of.get(req.req_id, 0)
        self.ttft.observe(ttft_s)
        self.prompt_tokens.inc(req.prompt_len)
        self.cached_tokens.inc(cached)
        self.local_hit_tokens.inc(cached)
        self.compute_tokens.inc(max(0, req.prompt_len - cached))
        self.generation_tokens.inc(1)

    def on_tokens(self, gap_s: float, count: int, now: float) -> None:
        observe_many(self.itl, gap_s, count)
        self.generation_tokens.inc(count)

    def on_finished(
        self, req: Request, cached: int, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        self.success.inc()
        self.e2e.observe(e2e_s)
        self.queue.observe(queue_s)
        self.prefill.observe(prefill_s)
        self.decode.observe(decode_s)
        self.inference.observe(prefill_s + decode_s)
        self.tpot.observe(tpot(decode_s, req.output_len))
        self.req_prompt.observe(req.prompt_len)
        self.req_gen.observe(req.output_len)
        self.req_computed.observe(self.computed.pop(req.req_id, req.prompt_len))
        self.req_preemptions.observe(self.x.preemptions_of.get(req.req_id, 0))

    def on_preempted(self, req: Request, now: float) -> None:
        self.preemptions.inc()

    def on_step(self, now: float, duration_s: float, steps: int, prefill: int, decode: int) -> None:
        if steps > 0:  # a skipped-ahead run of steps: its mean tokens per step, ``steps`` times
            observe_many(self.iteration, (prefill + decode) / steps, steps)


class VllmModel(TwinModel):
    name = EngineName.VLLM
    step_overhead_s = 1.5e-3  # a little more per-step work in Python than the others (ours)
    seq_overhead_s = 6e-6
    owned_by = "vllm"
    oom_startup_prefix = "ValueError"
    error_envelope = True
    metrics = VllmMetrics

    def scheduler_defaults(self, gpu: GpuSpec) -> SchedulerDefaults:
        # engines.md 1.1b (API-server defaults): larger limits on >= 70 GiB GPUs other than A100
        big = gpu.memory_bytes >= 70 * 1024**3 and not gpu.name.startswith("A100")
        running, budget, chunked = (1024, 8192, True) if big else (256, 2048, True)
        return SchedulerDefaults(running, budget, chunked)

    def memory_split(self, start: MemoryStart) -> tuple[float, float]:
        # pool = u*M - weights - non-torch - activation peak - cudagraphs; refuses u*M above free memory
        u, m, gib = start.fraction, start.gpu_bytes, GIB
        free_at_start = start.free_at_start
        requested = u * m
        if requested > free_at_start:
            raise StartupOOM(
                f"vLLM: free memory on device ({free_at_start / gib:.2f} GiB) is less than desired GPU "
                f"memory utilization ({u}, {requested / gib:.2f} GiB)"
            )
        pool = requested - start.weights - NON_TORCH_BYTES - start.profile - start.graphs
        budget = start.profile + (free_at_start - requested)
        return pool, budget

    def check_pool(self, pool_tokens: int, max_len: int, kv_bytes_per_token: float) -> None:
        if pool_tokens < max_len:
            kappa, gib = kv_bytes_per_token, GIB
            raise StartupOOM(
                f"vLLM: to serve at least one request with max seq len ({max_len}), "
                f"{max_len * kappa / gib:.2f} GiB KV cache is needed, larger than the available KV cache "
                f"memory ({pool_tokens * kappa / gib:.2f} GiB); increase gpu memory utilization or decrease "
                f"max_model_len"
            )

    def make_cache(
        self, num_blocks: int, block_size: int, prefix_caching: bool, options: Mapping[str, object]
    ) -> KVCache:
        # The block pool in C when it is built, else the Python one: the same answers either way.
        if use_native_pool():
            return NativeVllmCache(num_blocks, block_size, prefix_caching)
        return VllmCache(num_blocks, block_size, prefix_caching)


MODEL = register(VllmModel())

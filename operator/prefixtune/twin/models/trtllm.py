"""TensorRT-LLM as the twin models it: memory plan, scheduler traits, costs, block cache with host
tier, metrics, serving quirks.

Sources: ``reference/engines.md`` 1.3 (trtllm-serve defaults), 2.3 (metrics:
``tensorrt_llm/metrics/collector.py``), 4.3 (memory: the dry run, then ``free_gpu_memory_fraction``
of what is left).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from prefixtune.engines.base import EngineName
from prefixtune.twin.cache import TrtllmCache, bool_option, int_option
from prefixtune.twin.cache.base import CacheStats, KVCache, Match
from prefixtune.twin.catalog import GIB, GpuSpec
from prefixtune.twin.exporter import (
    TRT_PREFILL,
    VLLM_ITL,
    VLLM_LATENCY,
    VLLM_TTFT,
    EngineExporter,
    EngineMetrics,
    inc_to,
    tpot,
)
from prefixtune.twin.memory import NON_TORCH_BYTES, MemoryStart, StartupOOM
from prefixtune.twin.models.base import SchedulerDefaults, TwinModel, register
from prefixtune.twin.observer import Gauges
from prefixtune.twin.request import Request


class TrtllmMetrics(EngineMetrics):
    """TensorRT-LLM's series as ``tensorrt_llm/metrics/collector.py`` exports them (engines.md 2.3)."""

    def __init__(self, exporter: EngineExporter) -> None:
        super().__init__(exporter)
        lab = {"model_name": exporter.model, "engine_type": "trtllm"}
        names = list(lab)
        r = self.registry
        g = exporter.gauge_value

        def gauge(name: str, doc: str, fn: Callable[[], float]) -> None:
            Gauge(name, doc, names, registry=r).labels(**lab).set_function(fn)

        gauge("trtllm_num_requests_running", "Number of active requests", g("running"))
        gauge("trtllm_num_requests_waiting", "Number of queued requests", g("waiting"))
        gauge("trtllm_kv_cache_utilization", "KV cache utilization", g("kv_usage"))
        gauge("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks", g("pool_blocks"))
        gauge("trtllm_kv_cache_free_blocks", "Free KV cache blocks", g("free_blocks"))
        gauge("trtllm_kv_cache_used_blocks", "Used KV cache blocks", g("used_blocks"))
        gauge("trtllm_kv_cache_tokens_per_block", "Tokens per KV cache block", g("block_size"))
        gauge("trtllm_num_paused_requests", "Number of paused requests", lambda: float(exporter.paused))
        gauge("trtllm_kv_cache_hit_rate", "KV cache hit rate", self._hit_rate)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=r).labels(**lab)

        self.reused = counter(
            "trtllm_kv_cache_reused_blocks", "Cumulative number of KV cache blocks reused (cache hits)"
        )
        self.missed = counter(
            "trtllm_kv_cache_missed_blocks", "Cumulative number of KV cache blocks missed (cache misses)"
        )
        self.cached_tokens = counter(
            "trtllm_prompt_cached_tokens_total", "Prompt tokens served from the KV cache."
        )
        self.prompt_tokens = counter(
            "trtllm_prompt_tokens_total", "Cumulative number of prompt (input) tokens processed."
        )
        self.generation_tokens = counter(
            "trtllm_generation_tokens_total", "Cumulative number of generation (output) tokens produced."
        )
        self.completed = counter(
            "trtllm_num_requests_completed_total", "Total number of completed requests across iterations"
        )
        self.onboard = counter(
            "trtllm_kv_cache_onboard_bytes_total", "Total bytes transferred from host to GPU (onboard)"
        )
        self.offload = counter(
            "trtllm_kv_cache_offload_bytes_total", "Total bytes transferred from GPU to host (offload)"
        )
        success = Counter(
            "trtllm_request_success_total",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=r,
        )
        self.success = success.labels(**lab, finished_reason="length")
        success.labels(**lab, finished_reason="stop")

        def hist(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=r).labels(**lab)

        self.e2e = hist(
            "trtllm_e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            VLLM_LATENCY,
        )
        self.ttft = hist(
            "trtllm_time_to_first_token_seconds", "Histogram of time to first token in seconds.", VLLM_TTFT
        )
        self.tpot = hist(
            "trtllm_time_per_output_token_seconds", "Histogram of time per output token in seconds.", VLLM_ITL
        )
        self.queue = hist(
            "trtllm_request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            VLLM_LATENCY,
        )
        self.prefill = hist(
            "trtllm_request_prefill_time_seconds",
            "Histogram of prefill (context) phase duration in seconds.",
            TRT_PREFILL,
        )
        self.decode = hist(
            "trtllm_request_decode_time_seconds",
            "Histogram of decode (generation) phase duration in seconds.",
            VLLM_LATENCY,
        )
        self.inference = hist(
            "trtllm_request_inference_time_seconds",
            "Histogram of total inference duration in seconds.",
            VLLM_LATENCY,
        )
        self.config_info = Gauge(
            "trtllm_kv_cache_config_info",
            "KV cache configuration",
            [
                *names,
                "tokens_per_block",
                "enable_block_reuse",
                "enable_partial_reuse",
                "free_gpu_memory_fraction",
                "host_cache_size",
                "max_blocks",
            ],
            registry=r,
        )
        self.reused_total = 0
        self.missed_total = 0

    def _hit_rate(self) -> float:
        total = self.reused_total + self.missed_total
        return self.reused_total / total if total else 0.0

    def refresh(self, gauges: Gauges, stats: CacheStats | None) -> None:
        if stats is not None and self.x.kv_bytes_per_token > 0:
            per_block = gauges.block_size * self.x.kv_bytes_per_token
            inc_to(self.onboard, stats.onboarded_blocks * per_block)
            inc_to(self.offload, stats.offloaded_blocks * per_block)
        cfg = self.x.parsed.config if self.x.parsed is not None else None
        self.config_info.clear()
        self.config_info.labels(
            model_name=self.x.model,
            engine_type="trtllm",
            tokens_per_block=str(gauges.block_size),
            enable_block_reuse=str(bool(cfg.prefix_caching) if cfg else True),
            enable_partial_reuse=str(bool(self.x.option("partial_reuse", True))),
            free_gpu_memory_fraction=str(float(cfg.memory_fraction) if cfg else 0.9),
            host_cache_size=str(int(self.x.option("host_cache_bytes", 0))),  # type: ignore[call-overload]
            max_blocks=str(gauges.pool_blocks),
        ).set(1)

    def on_admitted(self, req: Request, match: Match, now: float, first: bool) -> None:
        self.reused.inc(match.hit_blocks)
        self.missed.inc(match.miss_blocks)
        self.reused_total += match.hit_blocks
        self.missed_total += match.miss_blocks

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self.ttft.observe(ttft_s)

    def on_finished(
        self, req: Request, cached: int, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        # Per-request metrics in TensorRT-LLM: recorded when the request completes.
        self.prompt_tokens.inc(req.prompt_len)
        self.cached_tokens.inc(cached)
        self.generation_tokens.inc(req.output_len)
        self.success.inc()
        self.completed.inc()
        self.e2e.observe(e2e_s)
        self.queue.observe(queue_s)
        self.prefill.observe(prefill_s)
        self.decode.observe(decode_s)
        self.inference.observe(prefill_s + decode_s)
        self.tpot.observe(tpot(decode_s, req.output_len))


class TrtllmModel(TwinModel):
    name = EngineName.TRTLLM
    step_overhead_s = 1.3e-3  # the least per-step host work of the three (ours)
    seq_overhead_s = 5e-6
    no_evict_policy = "guaranteed_no_evict"  # admits a request only when its whole KV fits, allocated at once
    cache_options = (
        "partial_reuse",
        "copy_on_partial_reuse",
        "host_cache_bytes",
        "kv_bytes_per_token",
        "host_cache_tokens",
    )
    owned_by = "tensorrt_llm"
    iteration_stats_path = "/metrics"
    metrics = TrtllmMetrics

    def scheduler_defaults(self, gpu: GpuSpec) -> SchedulerDefaults:
        return SchedulerDefaults(2048, 8192, False)  # engines.md 1.3: trtllm-serve

    def iteration_stats(self, gauges: Gauges) -> list[dict[str, Any]]:
        g = gauges
        stats = {
            "iter": int(g.now * 1000),
            "numActiveRequests": g.running,
            "numQueuedRequests": g.waiting,
            "kvCacheStats": {
                "maxNumBlocks": g.pool_blocks,
                "freeNumBlocks": g.free_blocks,
                "usedNumBlocks": g.pool_blocks - g.free_blocks,
                "tokensPerBlock": g.block_size,
            },
        }
        return [stats]

    def normalize_policy(self, policy: str) -> str:
        return super().normalize_policy(policy).replace("-", "_")

    def memory_split(self, start: MemoryStart) -> tuple[float, float]:
        # a dry run measures the peak; pool = u*(M - peak)
        u, gib, free_at_start = start.fraction, GIB, start.free_at_start
        peak = start.weights + NON_TORCH_BYTES + start.profile + start.graphs
        left = free_at_start - peak
        if left <= 0:
            raise StartupOOM(
                f"TensorRT-LLM: weights and activations ({peak / gib:.1f} GiB) leave no memory for KV "
                f"on {start.gpu_name} ({free_at_start / gib:.1f} GiB free)"
            )
        return u * left, start.profile + (1.0 - u) * left

    def make_cache(
        self, num_blocks: int, block_size: int, prefix_caching: bool, options: Mapping[str, object]
    ) -> KVCache:
        host_tokens = _host_tokens(options)
        return TrtllmCache(
            num_blocks,
            block_size,
            prefix_caching,
            partial_reuse=bool_option("partial_reuse", options.get("partial_reuse", True)),
            copy_on_partial_reuse=bool_option(
                "copy_on_partial_reuse", options.get("copy_on_partial_reuse", True)
            ),
            host_blocks=host_tokens // block_size,
        )


def _host_tokens(opts: Mapping[str, object]) -> int:
    if "host_cache_tokens" in opts:
        if "host_cache_bytes" in opts:
            raise ValueError("give either cache option host_cache_tokens or host_cache_bytes, not both")
        return int_option("host_cache_tokens", opts["host_cache_tokens"], 0)
    host_bytes = int_option("host_cache_bytes", opts.get("host_cache_bytes", 0), 0)
    if host_bytes == 0:
        return 0
    if "kv_bytes_per_token" not in opts:
        raise ValueError("cache option host_cache_bytes needs kv_bytes_per_token (bytes of KV per token)")
    per_token = int_option("kv_bytes_per_token", opts["kv_bytes_per_token"], 1)
    return host_bytes // per_token


MODEL = register(TrtllmModel())

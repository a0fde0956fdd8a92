"""TensorRT-LLM as the twin models it: memory plan, scheduler traits, costs, block cache with host
tier, metrics, serving quirks.

Sources: ``reference/engines.md`` 1.3 (trtllm-serve defaults), 2.3 (metrics:
``tensorrt_llm/metrics/collector.py``), 4.3 (memory: the dry run, then ``free_gpu_memory_fraction``
of what is left).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from prefixtune.engines.base import EngineName
from prefixtune.twin.cache import TrtllmCache, bool_option, int_option
from prefixtune.twin.cache.base import CacheStats, KVCache
from prefixtune.twin.catalog import GIB, GpuHardware
from prefixtune.twin.exporter import (
    MODEL_NAME,
    TRT_PREFILL,
    VLLM_ITL,
    VLLM_LATENCY,
    VLLM_TTFT,
    Admitted,
    Child,
    FirstToken,
    MetricState,
    Move,
    Scrape,
    Series,
    TableMetrics,
    at_finish,
    config_label,
    counter,
    gauge,
    histogram,
    info,
    tpot,
)
from prefixtune.twin.memory import NON_TORCH_BYTES, MemoryStart, StartupOOM
from prefixtune.twin.models.base import SchedulerDefaults, TwinModel, adapter_defaults, register
from prefixtune.twin.observer import Gauges

LABELS = {"model_name": MODEL_NAME, "engine_type": "trtllm"}
LAT = VLLM_LATENCY


def _transferred(blocks: Callable[[CacheStats], int]) -> Callable[[Scrape], float | None]:
    """Bytes moved between GPU and host, from the cache model's block totals (needs KV bytes)."""

    def total(s: Scrape) -> float | None:
        if s.stats is None or s.m.x.kv_bytes_per_token <= 0:
            return None
        return blocks(s.stats) * (s.gauges.block_size * s.m.x.kv_bytes_per_token)

    return total


# Reused/missed blocks per context phase (iteration stats); prompt, cached and generated tokens
# per finished request (per-request metrics are recorded when the request completes).
SERIES: tuple[Series, ...] = (
    gauge("trtllm_num_requests_running", "Number of active requests", LABELS, "running"),
    gauge("trtllm_num_requests_waiting", "Number of queued requests", LABELS, "waiting"),
    gauge("trtllm_kv_cache_utilization", "KV cache utilization", LABELS, "kv_usage"),
    gauge("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks", LABELS, "pool_blocks"),
    gauge("trtllm_kv_cache_free_blocks", "Free KV cache blocks", LABELS, "free_blocks"),
    gauge("trtllm_kv_cache_used_blocks", "Used KV cache blocks", LABELS, "used_blocks"),
    gauge("trtllm_kv_cache_tokens_per_block", "Tokens per KV cache block", LABELS, "block_size"),
    gauge("trtllm_num_paused_requests", "Number of paused requests", LABELS, lambda m: float(m.x.paused)),
    gauge("trtllm_kv_cache_hit_rate", "KV cache hit rate", LABELS, lambda m: m.state.hit_rate()),
    counter(
        "trtllm_kv_cache_reused_blocks", "Cumulative number of KV cache blocks reused (cache hits)", LABELS,
        Move(Admitted, lambda e: e.match.hit_blocks),
    ),
    counter(
        "trtllm_kv_cache_missed_blocks", "Cumulative number of KV cache blocks missed (cache misses)",
        LABELS, Move(Admitted, lambda e: e.match.miss_blocks),
    ),
    counter(
        "trtllm_prompt_cached_tokens_total", "Prompt tokens served from the KV cache.", LABELS,
        at_finish(lambda e: e.cached),
    ),
    counter(
        "trtllm_prompt_tokens_total", "Cumulative number of prompt (input) tokens processed.", LABELS,
        at_finish(lambda e: e.req.prompt_len),
    ),
    counter(
        "trtllm_generation_tokens_total", "Cumulative number of generation (output) tokens produced.",
        LABELS, at_finish(lambda e: e.req.output_len),
    ),
    counter(
        "trtllm_num_requests_completed_total", "Total number of completed requests across iterations",
        LABELS, at_finish(lambda e: 1),
    ),
    counter(
        "trtllm_kv_cache_onboard_bytes_total", "Total bytes transferred from host to GPU (onboard)", LABELS,
        mirror=_transferred(lambda stats: stats.onboarded_blocks),
    ),
    counter(
        "trtllm_kv_cache_offload_bytes_total", "Total bytes transferred from GPU to host (offload)", LABELS,
        mirror=_transferred(lambda stats: stats.offloaded_blocks),
    ),
    counter(
        "trtllm_request_success_total", "Count of successfully processed requests.", LABELS,
        by="finished_reason", children=(Child("length", moves=(at_finish(lambda e: 1),)), Child("stop")),
    ),
    histogram(
        "trtllm_e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
        LABELS, LAT, at_finish(lambda e: e.e2e_s),
    ),
    histogram(
        "trtllm_time_to_first_token_seconds", "Histogram of time to first token in seconds.", LABELS,
        VLLM_TTFT, Move(FirstToken, lambda e: e.ttft_s),
    ),
    histogram(
        "trtllm_time_per_output_token_seconds", "Histogram of time per output token in seconds.", LABELS,
        VLLM_ITL, at_finish(lambda e: tpot(e.decode_s, e.req.output_len)),
    ),
    histogram(
        "trtllm_request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
        LABELS, LAT, at_finish(lambda e: e.queue_s),
    ),
    histogram(
        "trtllm_request_prefill_time_seconds", "Histogram of prefill (context) phase duration in seconds.",
        LABELS, TRT_PREFILL, at_finish(lambda e: e.prefill_s),
    ),
    histogram(
        "trtllm_request_decode_time_seconds", "Histogram of decode (generation) phase duration in seconds.",
        LABELS, LAT, at_finish(lambda e: e.decode_s),
    ),
    histogram(
        "trtllm_request_inference_time_seconds", "Histogram of total inference duration in seconds.",
        LABELS, LAT, at_finish(lambda e: e.prefill_s + e.decode_s),
    ),
    info(
        "trtllm_kv_cache_config_info", "KV cache configuration", LABELS,
        ("tokens_per_block", lambda s: str(s.gauges.block_size)),
        ("enable_block_reuse", config_label("prefix_caching", True)),
        ("enable_partial_reuse", lambda s: str(bool(s.m.x.option("partial_reuse", True)))),
        ("free_gpu_memory_fraction", config_label("memory_fraction", 0.9)),
        ("host_cache_size", lambda s: str(int(s.m.x.option("host_cache_bytes", 0)))),  # type: ignore[call-overload]
        ("max_blocks", lambda s: str(s.gauges.pool_blocks)),
    ),
)  # fmt: skip


class TrtllmState(MetricState):
    """The block totals behind the hit-rate gauge."""

    def __init__(self) -> None:
        self.reused_total = 0
        self.missed_total = 0

    def hit_rate(self) -> float:
        total = self.reused_total + self.missed_total
        return self.reused_total / total if total else 0.0

    def update(self, event: object) -> None:
        if isinstance(event, Admitted):
            self.reused_total += event.match.hit_blocks
            self.missed_total += event.match.miss_blocks


class TrtllmMetrics(TableMetrics):
    """TensorRT-LLM's series as ``tensorrt_llm/metrics/collector.py`` exports them (engines.md 2.3)."""

    table = SERIES
    state_type = TrtllmState


class TrtllmModel(TwinModel):
    name = EngineName.TRTLLM
    step_overhead_s = 1.3e-3  # the least per-step host work of the three (ours)
    seq_overhead_s = 5e-6
    no_evict_policy = "guaranteed_no_evict"  # admits a request only when its whole KV fits, allocated at once
    # PyTorch backend, chunked prefill off: ``tensorrt_llm/llmapi/llm.py`` ``_check_arguments`` raises
    # RequestError "The sum of prompt length (...), query length (...) should not exceed
    # max_num_tokens (...)" (pinned by tests/unittest/llmapi/test_llm.py test_max_num_token_check)
    rejects_over_budget = True
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

    def scheduler_defaults(self, gpu: GpuHardware) -> SchedulerDefaults:
        return adapter_defaults(self.name, gpu)  # trtllm-serve: chunking off

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
        # a dry run with max_num_tokens measures the peak; pool = u*(M - peak)
        # (_torch/pyexecutor/_util.py _cal_max_memory, engines.md 4.3): the budget shrinks the pool
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

"""vLLM as the twin models it: memory plan, scheduler defaults, costs, cache, metrics, serving quirks.

Sources: ``reference/engines.md`` 1.1 (flags and API-server defaults), 2.1 (metrics), 4.1 (memory);
the series and their buckets follow ``vllm/v1/metrics/loggers.py``.
"""

from __future__ import annotations

from collections.abc import Mapping

from prefixtune.engines.base import ArgsError, EngineName
from prefixtune.twin.cache import NativeVllmCache, VllmCache, use_native_pool
from prefixtune.twin.cache.base import KVCache
from prefixtune.twin.catalog import GIB, GpuHardware
from prefixtune.twin.exporter import (
    MODEL_NAME,
    VLLM_ITERATION_TOKENS,
    VLLM_ITL,
    VLLM_LATENCY,
    VLLM_TTFT,
    Admitted,
    Child,
    EngineExporter,
    Finished,
    FirstToken,
    MetricState,
    Move,
    Preempted,
    Series,
    Steps,
    TableMetrics,
    Tokens,
    at_finish,
    buckets_1_2_5,
    config_label,
    counter,
    gauge,
    histogram,
    info,
    tpot,
)
from prefixtune.twin.memory import NON_TORCH_BYTES, MemoryStart, StartupOOM
from prefixtune.twin.models.base import SchedulerDefaults, TwinModel, adapter_defaults, register

LABELS = {"model_name": MODEL_NAME, "engine": "0"}
LAT = VLLM_LATENCY


def _tokens(x: EngineExporter) -> tuple[float, ...]:
    return buckets_1_2_5(x.max_model_len)


def _cached(e: FirstToken) -> int:
    return e.m.x.cached_of.get(e.req.req_id, 0)


def _computed(e: FirstToken) -> int:
    return max(0, e.req.prompt_len - _cached(e))


# Prefix-cache queries/hits: scheduler stats, once per request at admission (re-admissions after a
# preemption go to counters vLLM does not export). Prompt tokens (total, cached, by source):
# iteration stats, when the prefill ends (first token). The twin generates exactly the requested
# max_tokens: every request ends by length.
SERIES: tuple[Series, ...] = (
    gauge("vllm:num_requests_running", "Number of requests in model execution batches.", LABELS, "running"),
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", LABELS, "waiting"),
    gauge(
        "vllm:num_requests_waiting_by_reason", "Number of requests waiting, by reason.", LABELS,
        by="reason", children=(Child("capacity", "waiting"), Child("deferred")),
    ),
    gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", LABELS, "kv_usage"),
    counter(
        "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", LABELS,
        Move(Admitted, lambda e: e.req.prompt_len, when=lambda e: e.first),
    ),
    counter(
        "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", LABELS,
        Move(Admitted, lambda e: e.match.hit_tokens, when=lambda e: e.first),
    ),
    counter(
        "vllm:external_prefix_cache_queries", "External prefix cache queries (KV connector), in tokens.",
        LABELS,
    ),
    counter(
        "vllm:external_prefix_cache_hits", "External prefix cache hits (KV connector), in tokens.", LABELS
    ),
    counter(
        "vllm:num_preemptions", "Cumulative number of preemption from the engine.", LABELS,
        Move(Preempted, lambda e: 1),
    ),
    counter(
        "vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS,
        Move(FirstToken, lambda e: e.req.prompt_len),
    ),
    counter(
        "vllm:generation_tokens", "Number of generation tokens processed.", LABELS,
        Move(FirstToken, lambda e: 1), Move(Tokens, lambda e: e.n),
    ),
    counter(
        "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", LABELS,
        Move(FirstToken, _cached),
    ),
    counter(
        "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", LABELS, by="source",
        children=(
            Child("local_compute", moves=(Move(FirstToken, _computed),)),
            Child("local_cache_hit", moves=(Move(FirstToken, _cached),)),
            Child("external_kv_transfer"),
        ),
    ),
    counter(
        "vllm:request_success", "Count of successfully processed requests.", LABELS, by="finished_reason",
        children=(Child("length", moves=(at_finish(lambda e: 1),)), Child("stop"), Child("abort")),
    ),
    histogram(
        "vllm:request_prompt_tokens", "Number of prefill tokens processed.", LABELS, _tokens,
        at_finish(lambda e: e.req.prompt_len),
    ),
    histogram(
        "vllm:request_generation_tokens", "Number of generation tokens processed.", LABELS, _tokens,
        at_finish(lambda e: e.req.output_len),
    ),
    histogram(
        "vllm:request_prefill_kv_computed_tokens", "Prefill tokens computed (not from cache), per request.",
        LABELS, _tokens, at_finish(lambda e: e.m.state.computed.get(e.req.req_id, e.req.prompt_len)),
    ),
    histogram(
        "vllm:request_num_preemptions", "Number of preemptions per request.", LABELS, (0, 1, 2, 5, 10, 20),
        at_finish(lambda e: e.m.x.preemptions_of.get(e.req.req_id, 0)),
    ),
    histogram(
        "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", LABELS,
        VLLM_ITERATION_TOKENS,
        # a skipped-ahead run of steps: its mean tokens per step, ``steps`` times
        Move(Steps, lambda e: (e.prefill + e.decode) / e.steps, lambda e: e.steps, lambda e: e.steps > 0),
    ),
    histogram(
        "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", LABELS,
        VLLM_TTFT, Move(FirstToken, lambda e: e.ttft_s),
    ),
    histogram(
        "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", LABELS,
        VLLM_ITL, Move(Tokens, lambda e: e.gap_s, times=lambda e: e.n),
    ),
    histogram(
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.", LABELS,
        VLLM_ITL, at_finish(lambda e: tpot(e.decode_s, e.req.output_len)),
    ),
    histogram(
        "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LABELS, LAT,
        at_finish(lambda e: e.e2e_s),
    ),
    histogram(
        "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", LABELS,
        LAT, at_finish(lambda e: e.queue_s),
    ),
    histogram(
        "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
        LABELS, LAT, at_finish(lambda e: e.prefill_s + e.decode_s),
    ),
    histogram(
        "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
        LABELS, LAT, at_finish(lambda e: e.prefill_s),
    ),
    histogram(
        "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
        LABELS, LAT, at_finish(lambda e: e.decode_s),
    ),
    info(
        "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", {},
        ("block_size", lambda s: str(s.gauges.block_size)),
        ("cache_dtype", lambda s: str(s.m.x.option("kv_cache_dtype", "auto"))),
        ("enable_prefix_caching", config_label("prefix_caching", True)),
        ("engine", lambda s: "0"),
        ("gpu_memory_utilization", config_label("memory_fraction", 0.92)),
        ("num_cpu_blocks", lambda s: "None"),
        ("num_gpu_blocks", lambda s: str(s.gauges.pool_blocks)),
    ),
)  # fmt: skip


class VllmState(MetricState):
    """Per request: prefill tokens computed so far (re-admissions after a preemption recompute;
    generated tokens are not counted: the observer does not say how many)."""

    def __init__(self) -> None:
        self.computed: dict[int, int] = {}

    def update(self, event: object) -> None:
        if isinstance(event, Admitted):
            recomputed = max(0, event.req.prompt_len - event.match.hit_tokens)
            self.computed[event.req.req_id] = self.computed.get(event.req.req_id, 0) + recomputed
        elif isinstance(event, Finished):
            self.computed.pop(event.req.req_id, None)


class VllmMetrics(TableMetrics):
    """vLLM's series as ``vllm/v1/metrics/loggers.py`` exports them (reference/engines.md 2.1)."""

    table = SERIES
    state_type = VllmState


class VllmModel(TwinModel):
    name = EngineName.VLLM
    step_overhead_s = 1.5e-3  # a little more per-step work in Python than the others (ours)
    seq_overhead_s = 6e-6
    owned_by = "vllm"
    oom_startup_prefix = "ValueError"
    error_envelope = True
    render_routes = True  # POST /v1/completions/render, /v1/chat/completions/render
    metrics = VllmMetrics

    def scheduler_defaults(self, gpu: GpuHardware) -> SchedulerDefaults:
        # the API server's limits by device memory and name (engines/vllm.py batch_defaults); chunked on
        return adapter_defaults(self.name, gpu)

    def unchunked_budget(self, budget: int, chunked: bool, budget_given: bool, max_model_len: int) -> int:
        # vllm/engine/arg_utils.py (the default batch limits): without chunked prefill the default
        # budget is max_model_len, so that any prompt fits one step
        return max_model_len if not chunked and not budget_given else budget

    def check_limits(self, max_running: int | None, budget: int, chunked: bool, max_model_len: int) -> None:
        # vllm/config/scheduler.py SchedulerConfig.verify_max_model_len (ValueError at start); an
        # unset max_num_seqs defaults to min(default, max_num_batched_tokens) (arg_utils.py)
        if budget < max_model_len and not chunked:
            raise ArgsError(
                f"max_num_batched_tokens ({budget}) is smaller than max_model_len ({max_model_len}). "
                "This effectively limits the maximum sequence length to max_num_batched_tokens and "
                "makes vLLM reject longer sequences. Please increase max_num_batched_tokens or "
                "decrease max_model_len."
            )
        if max_running is not None and budget < max_running:
            raise ArgsError(
                f"max_num_batched_tokens ({budget}) must be greater than or equal to max_num_seqs "
                f"({max_running})."
            )

    def memory_split(self, start: MemoryStart) -> tuple[float, float]:
        # pool = u*M - weights - non-torch - activation peak - cudagraphs; refuses u*M above free memory.
        # The peak is the profile run's: a dummy forward of max_num_batched_tokens before the pool is
        # sized (v1/worker/gpu_worker.py determine_available_memory, gpu_model_runner.py profile_run;
        # engines.md 4.1), so a larger budget shrinks the pool.
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

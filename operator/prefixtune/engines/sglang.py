"""SGLang 0.5.23 (``sglang serve --model-path MODEL ...``): knobs, command line, metrics.

``sglang serve`` is the entry point 0.5.23 recommends (``python -m sglang.launch_server`` warns
"still supported, but 'sglang serve' is the recommended entrypoint", sglang/launch_server.py); both
run ``prepare_server_args`` on the same flags, and parse accepts both.

Facts from shared/reference/engines.md §1.2, §2.2, §3.2, §4.2. Booleans are store_true switches:
there is no ``--no-x`` form, so prefix caching off is ``--disable-radix-cache`` and on is its absence.
``/metrics`` exists only with ``--enable-metrics``, which the operator always renders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prefixtune.engines._argv import (
    Flag,
    FlagTable,
    Kind,
    Role,
    format_float,
    to_choice,
    to_float,
    to_int,
    to_text,
)
from prefixtune.engines._common import (
    CHUNKED_PREFILL,
    EVICTION_POLICY,
    HOST,
    HOST_CACHE_BYTES,
    KV_CACHE_DTYPE,
    MAX_MODEL_LEN,
    TENSOR_PARALLEL,
    AdapterBase,
    batch_limit_knob,
    flag_value,
    knob_table,
    label_number,
    memory_fraction_knob,
    options_from,
    powers_of_two,
    prefix_caching_knob,
    switch,
    unless_default,
)
from prefixtune.engines.base import (
    BLOCK_SIZE,
    MAX_BATCHED_TOKENS,
    MAX_RUNNING,
    MEMORY_FRACTION,
    REFERENCE,
    SCHEDULE_POLICY,
    ArgsError,
    Binding,
    EngineName,
    Hardware,
    KnobConfig,
    KnobSpec,
    MetricNames,
    ParsedCommand,
    RenderedCommand,
)

COMMAND = ("sglang", "serve")
LAUNCH_SERVER = ("python3", "-m", "sglang.launch_server")
DEFAULT_PORT = 30000

# Policies that read the radix tree (CacheAwarePolicy in sglang/srt/managers/schedule_policy.py).
# With the radix cache disabled SGLang runs them as fcfs (_validate_and_adjust_policy). lpm and hrrn
# also fall back to fcfs past WAITING_QUEUE_PREFIX_MATCH_MAX = 128 waiting requests.
CACHE_AWARE_POLICIES = frozenset({"lpm", "dfs-weight", "hrrn"})
# --enable-priority-scheduling asserts schedule_policy in ["fcfs", "lof"]
# (sglang/srt/arg_groups/validation_hook.py): the tuner must not search the others then.
PRIORITY_POLICIES = ("fcfs", "lof")
# SGLang's default TTFT buckets start at 0.1 s (sglang/srt/observability/metrics_collector.py), so a
# sub-100 ms SLO cannot be resolved: the operator renders --bucket-time-to-first-token with these
# below 0.1 s, the SLO itself as a bound, and SGLang's defaults above.
SGLANG_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
FINE_TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.075)


# SGLang's default ITL buckets, which also bound its per-request TPOT histogram (the one goodput's
# ITL test reads: sglang/srt/observability/metrics_collector.py, 0.5.23). A target between two of them
# is interpolated within its bucket (the spec's default 150 ms lies in 100-200 ms), so the operator
# renders --bucket-inter-token-latency with these and the target.
SGLANG_ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
    0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip


def _with_target(bounds: Sequence[float], slo_s: float | None) -> tuple[float, ...]:
    out = {float(b) for b in bounds}
    if slo_s is not None and slo_s > 0:
        out.add(float(slo_s))
    return tuple(sorted(out))


def ttft_buckets(slo_s: float | None = None) -> tuple[float, ...]:
    """The TTFT histogram bounds rendered: sub-100 ms steps, the SLO, SGLang's own defaults."""
    return _with_target((*FINE_TTFT_BUCKETS, *SGLANG_TTFT_BUCKETS), slo_s)


def itl_buckets(slo_s: float | None = None) -> tuple[float, ...]:
    """The ITL (and per-request TPOT) histogram bounds rendered: SGLang's own defaults and the SLO."""
    return _with_target(SGLANG_ITL_BUCKETS, slo_s)


MIB = 2**20
GIB = 2**30


def _prefill_graph_sizes(max_bs: int) -> int:
    """How many prefill CUDA-graph token sizes SGLang captures up to ``max_bs``
    (generate_prefill_cuda_graph_batch_sizes, sglang/srt/arg_groups/cuda_graph_hook.py)."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1025, 64),
        *range(1280, 4097, 256),
        *range(4608, max_bs + 1, 512),
    ]
    return sum(1 for size in sizes if size <= max_bs)


# GPU tiers of handle_gpu_memory_settings (sglang/srt/arg_groups/memory_hook.py): (below this many
# GiB, chunked prefill size, decode CUDA-graph max_bs for tp < 4, for tp >= 4); 16384 and 512 above.
_GPU_TIERS = (
    (20, 2048, 8, 8),
    (35, 4096, 48, 160),
    (60, 4096, 32, 160),
    (90, 8192, 256, 512),
    (160, 8192, 256, 512),
)


def _tier(gpu_memory_bytes: float, tensor_parallel: int) -> tuple[int, int]:
    """(default chunked prefill size, decode CUDA-graph max_bs) for a GPU of this size."""
    gpu = gpu_memory_bytes / MIB
    for below, chunk, small_tp, large_tp in _GPU_TIERS:
        if gpu < below * 1024:
            return chunk, (small_tp if tensor_parallel < 4 else large_tp)
    return 16384, 512


def default_chunked_prefill_size(gpu_memory_bytes: float) -> int:
    """SGLang 0.5.23's default ``--chunked-prefill-size`` for a GPU of this size: 2048 below 20 GiB,
    4096 below 60, 8192 below 160, 16384 above (handle_gpu_memory_settings)."""
    return _tier(gpu_memory_bytes, 1)[0]


def default_mem_fraction_static(
    gpu_memory_bytes: float, tensor_parallel: int = 1, chunked_prefill_size: int | None = None
) -> float:
    """SGLang 0.5.23's own default ``mem_fraction_static`` (handle_gpu_memory_settings,
    sglang/srt/arg_groups/memory_hook.py), for a text model with CUDA graphs on, no DP attention, PP 1.

    The GPU's size picks the chunked prefill size (unless given) and the decode CUDA-graph batch;
    then reserved MiB = 512 + 1.5 x activation tokens + TP x PP / 8 x 1024 + decode graphs (2 x max_bs)
    + prefill graphs (8 per captured size), at least 10 GiB on GPUs over 60 GiB; fraction =
    round((gpu - reserved) / gpu, 3). Activation tokens: max(chunk, 2048), or max(max_prefill_tokens
    = 16384, 2048) with chunking off (-1). About 0.83 on an H100-80GB and 0.90 on an H200 at TP 1.
    """
    gpu = gpu_memory_bytes / MIB
    tp = int(tensor_parallel)
    chunk, max_bs = _tier(gpu_memory_bytes, tp)
    if chunked_prefill_size is not None and chunked_prefill_size != 0:
        chunk = chunked_prefill_size
    activation = max(chunk, 2048) if chunk > 0 else max(MAX_PREFILL_TOKENS, 2048)
    reserved = 512 + activation * 1.5 + tp / 8 * 1024
    reserved += max_bs * 2 + (_prefill_graph_sizes(chunk) if chunk > 0 else 0) * 8
    if gpu > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu - reserved) / gpu, 3)


# The knob's GPU-neutral default: the rule on the reference GPU (base.REFERENCE, an H100-80GB).
# Deployments get the rule for their own GPU.
REFERENCE_GPU_BYTES = REFERENCE.memory_bytes
# --max-prefill-tokens' default (fields/schedule.py): the new tokens of one prefill batch at most, next
# to the chunk (PrefillAdder's rem_input_tokens beside rem_chunk_tokens); the real bound is the larger
# of it and the model's context length. It stays an untuned option.
MAX_PREFILL_TOKENS = 16384

KNOBS = knob_table(
    memory_fraction_knob(
        default=default_mem_fraction_static(REFERENCE_GPU_BYTES),
        flag="--mem-fraction-static",
        doc=(
            "share of GPU memory for weights + KV pool (activations are outside it). The default is "
            "SGLang's own rule round((gpu_mem - reserved)/gpu_mem, 3), per GPU and TP "
            "(about 0.83 on H100-80GB, 0.90 on H200)"
        ),
        binding=Binding(dest="mem_fraction_static", render=flag_value("--mem-fraction-static", format_float)),
    ),
    KnobSpec(
        name=BLOCK_SIZE,
        default=1,
        choices=(1, 16, 32, 64, 128),
        flag="--page-size",
        doc="KV page size in tokens (1 on CUDA by default); only full pages are shared",
        # SGLang reports the page size as its own gauge, not as a label.
        binding=Binding(
            dest="page_size",
            render=flag_value("--page-size", lambda v: str(int(v))),
            label="sglang:page_size",
        ),
    ),
    prefix_caching_knob(
        flag="--disable-radix-cache",
        doc="the radix (prefix) cache; off renders --disable-radix-cache",
        # A store_true switch: on is the flag's absence, its presence reads back as off.
        binding=Binding(
            dest="disable_radix_cache", render=switch("", "--disable-radix-cache"), decode=lambda v: not v
        ),
    ),
    KnobSpec(
        name=SCHEDULE_POLICY,
        default="fcfs",
        choices=("fcfs", "lpm", "dfs-weight", "hrrn", "lof", "random"),
        flag="--schedule-policy",
        doc=(
            "lpm/dfs-weight/hrrn are cache-aware (lpm and hrrn fall back to fcfs past 128 waiting "
            "requests); with --enable-priority-scheduling only fcfs and lof start; "
            "'priority' is not offered: argparse accepts it but the scheduler raises at init"
        ),
        binding=Binding(dest="schedule_policy", render=flag_value("--schedule-policy")),
    ),
    batch_limit_knob(
        MAX_BATCHED_TOKENS,
        choices=(-1, *powers_of_two(512, 16384)),
        flag="--chunked-prefill-size",
        doc=(
            "the largest prefill chunk (tokens) of one prefill batch; -1 disables chunking. SGLang runs "
            "prefill and decode in separate batches, so the chunk bounds a prefill batch, and "
            "--max-prefill-tokens (16384, untuned) caps its new tokens too (the larger of it and the "
            "context length). Default by GPU memory: 2048 (< 20 GiB), 4096 (< 60), 8192 (< 160), "
            "16384. SGLang's default mem_fraction_static reserves 1.5 MiB per chunk token outside the "
            "pool, so a larger chunk needs a lower fraction"
        ),
        binding=Binding(dest="chunked_prefill_size", render=unless_default("--chunked-prefill-size")),
        low=-1,
    ),
    batch_limit_knob(
        MAX_RUNNING,
        choices=powers_of_two(32, 4096),
        flag="--max-running-requests",
        doc=(
            "requests in the running batch per DP worker; by default SGLang derives it from the KV "
            "pool: min(clamp(int(pool tokens / context length x 512), 2048, 4096), pool tokens // 2) "
            "(resolve_max_num_reqs), so the knob's default is 0 (not rendered)"
        ),
        binding=Binding(dest="max_running_requests", render=unless_default("--max-running-requests")),
    ),
)

# Every value SGLang's argparse accepts; the knob then narrows it to the supported ones.
_ENGINE_POLICIES = (
    "lpm",
    "random",
    "fcfs",
    "dfs-weight",
    "lof",
    "priority",
    "routing-key",
    "hrrn",
    "shortest-prefill-first",
)
_KV_DTYPES = {"auto": "auto", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
_QUANTIZATION = (
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "fp8",
    "bitsandbytes",
    "compressed-tensors",
    "modelopt",
    "modelopt_fp4",
    "mxfp4",
    "gguf",
)


def _chunk_size(raw: str) -> object:
    value = to_int()(raw)
    assert isinstance(value, int)
    if value != -1 and value < 1:
        raise ValueError("must be -1 (disables chunked prefill) or >= 1")
    return value


FLAGS = FlagTable(
    [
        # owned: rendered by the operator
        Flag("model_path", ("--model-path", "--model"), role=Role.OWNED, convert=to_text),
        Flag("host", ("--host",), role=Role.OWNED, convert=to_text),
        Flag("port", ("--port",), role=Role.OWNED, convert=to_int(1)),
        Flag("tp_size", ("--tp-size", "--tensor-parallel-size"), role=Role.OWNED, convert=to_int(1)),
        Flag("mem_fraction_static", ("--mem-fraction-static",), role=Role.OWNED, convert=to_float()),
        Flag("page_size", ("--page-size",), role=Role.OWNED, convert=to_int()),
        Flag("disable_radix_cache", ("--disable-radix-cache",), Kind.SWITCH, Role.OWNED),
        Flag("schedule_policy", ("--schedule-policy",), role=Role.OWNED, convert=to_choice(_ENGINE_POLICIES)),
        Flag("enable_metrics", ("--enable-metrics",), Kind.SWITCH, Role.OWNED),
        Flag("max_running_requests", ("--max-running-requests",), role=Role.OWNED, convert=to_int(1)),
        Flag("chunked_prefill_size", ("--chunked-prefill-size",), role=Role.OWNED, convert=_chunk_size),
        # forbidden: would override a tuned knob
        Flag(
            "max_total_tokens",
            ("--max-total-tokens",),
            role=Role.FORBIDDEN,
            why="caps the KV pool that the tuned memory_fraction decides",
        ),
        # options: recognised, untuned, passed through verbatim
        Flag("max_prefill_tokens", ("--max-prefill-tokens",), convert=to_int(1)),
        Flag("kv_cache_dtype", ("--kv-cache-dtype",), convert=to_choice(tuple(_KV_DTYPES), _KV_DTYPES)),
        Flag("context_length", ("--context-length",), convert=to_int(1)),
        Flag("trust_remote_code", ("--trust-remote-code",), Kind.SWITCH),
        Flag("served_model_name", ("--served-model-name",), convert=to_text),
        Flag("random_seed", ("--random-seed",), convert=to_int()),
        Flag("dtype", ("--dtype",), convert=to_choice(_DTYPES)),
        Flag("quantization", ("--quantization",), convert=to_choice(_QUANTIZATION)),
        Flag(
            "radix_eviction_policy",
            ("--radix-eviction-policy",),
            convert=to_choice(("lru", "lfu", "slru", "priority", "tlru")),
        ),
        Flag(
            "enable_hierarchical_cache",
            ("--enable-hierarchical-cache", "--enable-hicache"),
            Kind.SWITCH,
        ),
        Flag("hicache_ratio", ("--hicache-ratio",), convert=to_float(0.0)),
        Flag("hicache_size", ("--hicache-size",), convert=to_int(0)),
        Flag(
            "hicache_write_policy",
            ("--hicache-write-policy",),
            convert=to_choice(("write_back", "write_through", "write_through_selective")),
        ),
        Flag("enable_priority_scheduling", ("--enable-priority-scheduling",), Kind.SWITCH),
        Flag("dp_size", ("--dp-size", "--data-parallel-size"), convert=to_int(1)),
        Flag("log_requests", ("--log-requests",), Kind.SWITCH),
        Flag(
            "log_level",
            ("--log-level",),
            convert=to_choice(("debug", "info", "warning", "error", "critical")),
        ),
        Flag("disable_cuda_graph", ("--disable-cuda-graph",), Kind.SWITCH),
        Flag(
            "cuda_graph_max_bs",
            ("--cuda-graph-max-bs",),
            role=Role.REMOVED,
            why=(
                "not accepted by SGLang 0.5.23 (the pod would crash-loop); use --cuda-graph-max-bs-decode "
                "and/or --cuda-graph-max-bs-prefill"
            ),
        ),
        Flag("cuda_graph_max_bs_decode", ("--cuda-graph-max-bs-decode",), convert=to_int(1)),
        Flag("cuda_graph_max_bs_prefill", ("--cuda-graph-max-bs-prefill",), convert=to_int(1)),
        Flag(
            "bucket_time_to_first_token",
            ("--bucket-time-to-first-token",),
            Kind.LIST,
            role=Role.OWNED,
            convert=to_float(0.0),
        ),
        Flag(
            "bucket_inter_token_latency",
            ("--bucket-inter-token-latency",),
            Kind.LIST,
            role=Role.OWNED,
            convert=to_float(0.0),
        ),
        Flag("tokenizer_path", ("--tokenizer-path",), convert=to_text),
        Flag("revision", ("--revision",), convert=to_text),
        Flag("download_dir", ("--download-dir",), convert=to_text),
        Flag("api_key", ("--api-key",), convert=to_text),
        Flag("skip_server_warmup", ("--skip-server-warmup",), Kind.SWITCH),
        Flag("enable_metrics_for_all_schedulers", ("--enable-metrics-for-all-schedulers",), Kind.SWITCH),
    ]
)

_OPTION_KEYS = {
    "max_running_requests": MAX_RUNNING,
    "kv_cache_dtype": KV_CACHE_DTYPE,
    "context_length": MAX_MODEL_LEN,
    "radix_eviction_policy": EVICTION_POLICY,
    "max_prefill_tokens": "max_prefill_tokens",
    "dp_size": "data_parallel",
    "tp_size": TENSOR_PARALLEL,
    "host": HOST,
    "enable_metrics": "metrics",
    "enable_hierarchical_cache": "host_cache",
    "hicache_ratio": "host_cache_ratio",
}

METRICS = MetricNames(
    requests_running="sglang:num_running_reqs",
    requests_waiting="sglang:num_queue_reqs",
    kv_usage="sglang:token_usage",
    prompt_tokens="sglang:prompt_tokens_total",
    generation_tokens="sglang:generation_tokens_total",
    requests_finished="sglang:num_requests_total",
    ttft="sglang:time_to_first_token_seconds",
    itl="sglang:inter_token_latency_seconds",
    tpot="sglang:request_time_per_output_token_seconds",
    e2e="sglang:e2e_request_latency_seconds",
    preemptions="sglang:num_retracted_requests_total",
    # Hit rate = sum over modes matching hit_label_regex / sum over all modes, of the same counter:
    # sum(rate(sglang:prefill_effective_tokens_total{mode=~".*_hit"}[w])) / sum(rate(...[w])).
    hit_numerator="sglang:prefill_effective_tokens_total",
    hit_denominator="sglang:prefill_effective_tokens_total",
    hit_miss="",
    hit_unit="tokens",
    cached_prompt_tokens="sglang:cached_tokens_total",
    config_info="",
    extra={
        "hit_label": "mode",
        "hit_label_regex": ".*_hit",  # device_hit | host_hit | storage_hit; 'input' is the miss
        "cached_tokens_label": "cache_source",  # device | host | storage (or total: do not double count)
        "page_size": "sglang:page_size",
        "max_total_num_tokens": "sglang:max_total_num_tokens",
        "num_pages": "sglang:num_pages",
        "cache_hit_rate_gauge": "sglang:cache_hit_rate",  # last prefill batch only: noisy, do not average
        "queue_time": "sglang:queue_time_seconds",
        "evicted_tokens": "sglang:evicted_tokens_total",
    },
)


class SglangAdapter(AdapterBase):
    name = EngineName.SGLANG
    command = COMMAND
    command_aliases = (LAUNCH_SERVER, ("python", "-m", "sglang.launch_server"))
    default_port = DEFAULT_PORT
    tp_dest = "tp_size"
    default_image = "lmsysorg/sglang:v0.5.23"
    version = "0.5.23"
    metrics_port = DEFAULT_PORT
    metrics_path = "/metrics"
    # A new prefill batch (the next chunk of a chunked request included) runs before the decode batch,
    # not inside it (scheduler.py get_next_batch_to_run; docs/batch-limits.md): a smaller chunk spreads
    # a prompt over more steps but lets no decode step in between. --enable-mixed-chunk would mix them.
    mixed_batches = False
    # /health runs a one-token generation (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION defaults to true)
    # and waits up to SGLANG_HEALTH_CHECK_TIMEOUT = 20 s; /ready only reads the tokenizer manager's
    # state (200 when started and not paused), sglang/srt/entrypoints/http_server.py.
    health_path = "/health"
    ready_path = "/ready"
    metrics = METRICS
    table = FLAGS
    _knobs = KNOBS

    def hardware_defaults(self, hardware: Hardware, pinned: Mapping[str, object]) -> dict[str, object]:
        """The chunk by GPU memory; the memory fraction by SGLang's own rule for that chunk (or the
        pinned one); the running cap stays 0 (SGLang derives it from the pool at start)."""
        chunk = pinned.get(MAX_BATCHED_TOKENS)
        chunk = chunk if isinstance(chunk, int) and chunk != 0 else None
        return {
            MEMORY_FRACTION: default_mem_fraction_static(
                hardware.memory_bytes, hardware.tensor_parallel, chunk
            ),
            MAX_BATCHED_TOKENS: default_chunked_prefill_size(hardware.memory_bytes),
        }

    def allowed_choices(self, extra_args: Sequence[str]) -> Mapping[str, tuple[object, ...]]:
        """With --enable-priority-scheduling SGLang starts only with fcfs or lof."""
        flags = (self.table.flag_of(arg) for arg in extra_args)
        if any(flag is not None and flag.dest == "enable_priority_scheduling" for flag in flags):
            return {SCHEDULE_POLICY: PRIORITY_POLICIES}
        return {}

    def metric_args(self, ttft_slo_s: float | None, itl_slo_s: float | None = None) -> tuple[str, ...]:
        return (
            "--bucket-time-to-first-token",
            *(format_float(b) for b in ttft_buckets(ttft_slo_s)),
            "--bucket-inter-token-latency",
            *(format_float(b) for b in itl_buckets(itl_slo_s)),
        )

    def normalize(self, config: KnobConfig) -> KnobConfig:
        """With the radix cache off, a cache-aware policy (lpm, dfs-weight) runs as fcfs in SGLang.

        lof and random do not read the cache and stay; the page size stays (it is still the KV page).
        """
        policy = str(config.schedule_policy)
        if not config.prefix_caching and policy in CACHE_AWARE_POLICIES:
            policy = "fcfs"
        return config.coerced().with_(schedule_policy=policy)

    def render_args(
        self, model: str, config: KnobConfig, extra_args: Sequence[str], port: int, tensor_parallel: int
    ) -> RenderedCommand:
        args = (
            "--model-path",
            model,
            *self.serving_args(port, tensor_parallel),
            *self.knob_args(config),
            "--enable-metrics",
            *extra_args,
        )
        return RenderedCommand(COMMAND, args)

    def parse(self, argv: Sequence[str], files: Mapping[str, str] | None = None) -> ParsedCommand:
        scan = self.scan_args(self.command_args(argv))
        model = scan.str_value("model_path", "")
        if not model:
            raise ArgsError("sglang: the following arguments are required: --model-path")
        config = self.config_from(scan)
        if (
            scan.last("enable_priority_scheduling") is not None
            and config.schedule_policy not in PRIORITY_POLICIES
        ):
            raise ArgsError(
                f"--enable-priority-scheduling: schedule_policy must be 'fcfs' or 'lof' to use priority "
                f"scheduling; '{config.schedule_policy}' is not supported (SGLang asserts this at start)"
            )
        options = options_from(scan, _OPTION_KEYS)
        for dest, key in (
            ("bucket_time_to_first_token", "ttft_buckets"),
            ("bucket_inter_token_latency", "itl_buckets"),
        ):
            buckets = scan.value(dest)
            if isinstance(buckets, tuple):
                options[key] = tuple(float(b) for b in buckets)
        chunk = scan.last("chunked_prefill_size")
        if chunk is not None:
            options[CHUNKED_PREFILL] = chunk.value != -1
            if chunk.value != -1:
                options[MAX_BATCHED_TOKENS] = chunk.value
        size = scan.value("hicache_size")
        if options.get("host_cache") and isinstance(size, int) and size > 0:
            options[HOST_CACHE_BYTES] = size * 10**9  # --hicache-size is in GB and overrides the ratio
        return self.parsed(scan, model, config, options)

    def effective_config(self, samples: Sequence[tuple[str, Mapping[str, str], float]]) -> dict[str, object]:
        """From ``sglang:page_size`` (block_size), ``sglang:max_total_num_tokens`` (kv_tokens) and
        ``sglang:num_pages`` (kv_blocks); first sample of each. SGLang exports neither the memory
        fraction, the radix-cache switch nor the policy, so those keys are never present."""
        wanted = {
            **{label: knob for label, knob, _ in self.knob_labels()},
            "sglang:max_total_num_tokens": "kv_tokens",
            "sglang:num_pages": "kv_blocks",
        }
        found: dict[str, object] = {}
        for name, _, value in samples:
            key = wanted.get(name)
            if key is not None and key not in found:
                number = label_number(str(value))
                if number is not None:
                    found[key] = int(number)
        return found


ADAPTER = SglangAdapter()

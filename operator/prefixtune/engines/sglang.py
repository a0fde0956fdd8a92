"""SGLang 0.5.23 (``python3 -m sglang.launch_server --model-path MODEL ...``): knobs, command line, metrics.

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
    MAX_BATCHED_TOKENS,
    MAX_MODEL_LEN,
    MAX_RUNNING,
    TENSOR_PARALLEL,
    AdapterBase,
    flag_name,
    knob_table,
    label_number,
    memory_fraction_knob,
    options_from,
    prefix_caching_knob,
)
from prefixtune.engines.base import (
    BLOCK_SIZE,
    MEMORY_FRACTION,
    PREFIX_CACHING,
    SCHEDULE_POLICY,
    ArgsError,
    EngineName,
    KnobConfig,
    KnobSpec,
    MetricNames,
    ParsedCommand,
    RenderedCommand,
)

COMMAND = ("python3", "-m", "sglang.launch_server")
DEFAULT_PORT = 30000

# Policies that read the radix tree. With the radix cache disabled SGLang runs them as fcfs
# (reference §3.2: "All cache-aware policies become fcfs when the radix cache is disabled").
CACHE_AWARE_POLICIES = frozenset({"lpm", "dfs-weight"})

KNOBS = knob_table(
    memory_fraction_knob(
        default=0.88,
        flag="--mem-fraction-static",
        doc=(
            "share of GPU memory for weights + KV pool (activations are outside it). 0.88 is prefixtune's "
            "neutral default: the engine's own default is a heuristic round((gpu_mem - reserved)/gpu_mem, 3) "
            "that depends on the GPU, chunked prefill size and TP"
        ),
    ),
    KnobSpec(
        name=BLOCK_SIZE,
        default=1,
        choices=(1, 16, 32, 64, 128),
        flag="--page-size",
        doc="KV page size in tokens (1 on CUDA by default); only full pages are shared",
    ),
    prefix_caching_knob(
        flag="--disable-radix-cache",
        doc="the radix (prefix) cache; off renders --disable-radix-cache",
    ),
    KnobSpec(
        name=SCHEDULE_POLICY,
        default="fcfs",
        choices=("fcfs", "lpm", "dfs-weight", "lof", "random"),
        flag="--schedule-policy",
        doc=(
            "lpm/dfs-weight are cache-aware (lpm falls back to fcfs past 128 waiting requests); "
            "'priority' is not offered: argparse accepts it but the scheduler raises at init"
        ),
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
        # forbidden: would override a tuned knob
        Flag(
            "max_total_tokens",
            ("--max-total-tokens",),
            role=Role.FORBIDDEN,
            why="caps the KV pool that the tuned memory_fraction decides",
        ),
        # options: recognised, untuned, passed through verbatim
        Flag("max_running_requests", ("--max-running-requests",), convert=to_int(1)),
        Flag("chunked_prefill_size", ("--chunked-prefill-size",), convert=_chunk_size),
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
        Flag("cuda_graph_max_bs", ("--cuda-graph-max-bs",), convert=to_int(1)),
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
        "tpot": "sglang:request_time_per_output_token_seconds",
        "evicted_tokens": "sglang:evicted_tokens_total",
    },
)


class SglangAdapter(AdapterBase):
    name = EngineName.SGLANG
    command = COMMAND
    command_aliases = (("python", "-m", "sglang.launch_server"),)
    default_port = DEFAULT_PORT
    tp_dest = "tp_size"
    default_image = "lmsysorg/sglang:v0.5.23"
    metrics_port = DEFAULT_PORT
    metrics_path = "/metrics"
    health_path = "/health"
    metrics = METRICS
    table = FLAGS
    _knobs = KNOBS

    def normalize(self, config: KnobConfig) -> KnobConfig:
        """With the radix cache off, a cache-aware policy (lpm, dfs-weight) runs as fcfs in SGLang.

        lof and random do not read the cache and stay; the page size stays (it is still the KV page).
        """
        policy = str(config.schedule_policy)
        if not config.prefix_caching and policy in CACHE_AWARE_POLICIES:
            policy = "fcfs"
        return KnobConfig(
            float(config.memory_fraction), int(config.block_size), bool(config.prefix_caching), policy
        )

    def render_args(
        self, model: str, config: KnobConfig, extra_args: Sequence[str], port: int, tensor_parallel: int
    ) -> RenderedCommand:
        args = [
            "--model-path",
            model,
            *self.serving_args(port, tensor_parallel),
            "--mem-fraction-static",
            format_float(config.memory_fraction),
            "--page-size",
            str(int(config.block_size)),
        ]
        if not config.prefix_caching:
            args.append("--disable-radix-cache")
        args += ["--schedule-policy", str(config.schedule_policy), "--enable-metrics", *extra_args]
        return RenderedCommand(COMMAND, tuple(args))

    def parse(self, argv: Sequence[str], files: Mapping[str, str] | None = None) -> ParsedCommand:
        scan = self.scan_args(self.command_args(argv))
        model = scan.str_value("model_path", "")
        if not model:
            raise ArgsError("sglang: the following arguments are required: --model-path")
        computed: dict[str, tuple[str, object]] = {}
        if scan.last("disable_radix_cache") is not None:
            computed[PREFIX_CACHING] = (flag_name(scan, "disable_radix_cache"), False)
        config = self.config_from(
            scan,
            {
                MEMORY_FRACTION: "mem_fraction_static",
                BLOCK_SIZE: "page_size",
                SCHEDULE_POLICY: "schedule_policy",
            },
            computed,
        )
        options = options_from(scan, _OPTION_KEYS)
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
            "sglang:page_size": BLOCK_SIZE,
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

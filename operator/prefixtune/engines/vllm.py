"""vLLM 0.33 (``vllm serve MODEL ...``): knobs, command line, metrics.

Facts from shared/reference/engines.md §1.1, §2.1, §4.1. vLLM's FlexibleArgumentParser turns
underscores into dashes in flag names (``--block_size`` is ``--block-size``;
vllm/utils/argparse_utils.py), so parsing and the owned-flag check do the same. Flag abbreviations
are not accepted (stricter than argparse's default).
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
    HOST,
    HOST_CACHE_BACKEND,
    HOST_CACHE_BYTES,
    KV_CACHE_DTYPE,
    MAX_MODEL_LEN,
    TENSOR_PARALLEL,
    AdapterBase,
    batch_limit_knob,
    first_labels,
    flag_value,
    knob_table,
    label_int,
    memory_fraction_knob,
    options_from,
    powers_of_two,
    prefix_caching_knob,
    read_labels,
    switch,
    unless_default,
    with_kv_tokens,
)
from prefixtune.engines.base import (
    BLOCK_SIZE,
    GIB,
    MAX_BATCHED_TOKENS,
    MAX_RUNNING,
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
from prefixtune.routing.policy import EngineNeed

COMMAND = ("vllm", "serve")
DEFAULT_PORT = 8000

# Each knob's binding: the flag dest, its rendering, and its label in vllm:cache_config_info.
KNOBS = knob_table(
    memory_fraction_knob(
        default=0.92,
        flag="--gpu-memory-utilization",
        doc="share of TOTAL device memory for this instance (weights + activations + KV); (0, 1]",
        binding=Binding(
            dest="gpu_memory_utilization",
            render=flag_value("--gpu-memory-utilization", format_float),
            label="gpu_memory_utilization",
        ),
    ),
    KnobSpec(
        name=BLOCK_SIZE,
        default=16,
        choices=(16, 32, 64, 128),
        flag="--block-size",
        doc="KV block size in tokens; multiples of 16 that FLASH_ATTN supports; only full blocks hit",
        binding=Binding(
            dest="block_size", render=flag_value("--block-size", lambda v: str(int(v))), label="block_size"
        ),
    ),
    prefix_caching_knob(
        flag="--enable-prefix-caching/--disable-prefix-caching",
        doc="automatic prefix caching (on by default for generative decoders)",
        binding=Binding(
            dest="enable_prefix_caching",
            render=switch("--enable-prefix-caching", "--disable-prefix-caching"),
            label="enable_prefix_caching",
        ),
    ),
    KnobSpec(
        name=SCHEDULE_POLICY,
        default="fcfs",
        choices=("fcfs", "priority"),
        searched=False,
        flag="--scheduling-policy",
        doc="priority only reorders requests that carry a priority; without them it equals fcfs",
        binding=Binding(dest="scheduling_policy", render=flag_value("--scheduling-policy")),
    ),
    batch_limit_knob(
        MAX_BATCHED_TOKENS,
        choices=powers_of_two(512, 65536),
        flag="--max-num-batched-tokens",
        doc=(
            "tokens per scheduler step (SchedulerConfig, ge=1); with chunked prefill (on by default) a "
            "long prompt is split into chunks of what is left of it after the running decodes. Must be "
            ">= max_num_seqs, and >= max_model_len with chunked prefill off. Default by device: 16384 "
            "(>= 160 GiB), 8192 (>= 70 GiB, not A100), else 2048 (API server; get_batch_defaults)"
        ),
        binding=Binding(dest="max_num_batched_tokens", render=unless_default("--max-num-batched-tokens")),
    ),
    batch_limit_knob(
        MAX_RUNNING,
        choices=powers_of_two(32, 2048),
        flag="--max-num-seqs",
        doc="running requests per DP rank (ge=1); default 1024 on >= 70 GiB (not A100), else 256",
        binding=Binding(dest="max_num_seqs", render=unless_default("--max-num-seqs")),
    ),
)


def batch_defaults(hardware: Hardware) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM 0.33 picks for the OpenAI API server on this GPU
    (EngineArgs.get_batch_defaults, vllm/engine/arg_utils.py): by device memory, with A100s and GB10
    kept on the small tier ("Setting large max_num_batched_tokens for A100 reduces throughput")."""
    name = hardware.gpu_name.lower()
    if hardware.memory_bytes >= 160 * GIB:
        return 16384, 1024
    if hardware.memory_bytes >= 70 * GIB and "a100" not in name and "gb10" not in name:
        return 8192, 1024
    return 2048, 256


def _vllm_name(name: str) -> str:
    """FlexibleArgumentParser: underscores become dashes in the name, up to the first '.'."""
    if not name.startswith("--"):
        return name
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def _bool_pair(dest: str, name: str, role: Role = Role.OPTION) -> Flag:
    """A boolean flag. vLLM 0.33 registers every BooleanOptionalAction as its EnableDisableAction
    (vllm/utils/argparse_utils.py): ``--enable-x`` pairs with ``--disable-x`` (canonical), and
    ``--no-enable-x`` / ``--no-disable-x`` stay accepted; other booleans are ``--x`` / ``--no-x``."""
    if name.startswith("enable-"):
        rest = name.removeprefix("enable-")
        return Flag(
            dest,
            (f"--{name}", f"--no-disable-{rest}"),
            Kind.NEGATABLE,
            role,
            negations=(f"--disable-{rest}", f"--no-{name}"),
        )
    return Flag(dest, (f"--{name}",), Kind.NEGATABLE, role, negations=(f"--no-{name}",))


_KV_DTYPES = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
# vLLM 0.33's QuantizationMethods (vllm/model_executor/layers/quantization/__init__.py), without the
# deprecated fbgemm_fp8 and fp_quant (they need --allow-deprecated-quantization). bitsandbytes and gguf
# are gone: ModelConfig refuses them at start.
_QUANTIZATION = (
    "awq",
    "auto_awq",
    "fp8",
    "modelopt",
    "modelopt_fp4",
    "modelopt_mxfp8",
    "modelopt_mixed",
    "auto_gptq",
    "gptq",
    "gptq_marlin",
    "awq_marlin",
    "humming",
    "compressed-tensors",
    "experts_int8",
    "quark",
    "moe_wna16",
    "torchao",
    "inc",
    "mxfp4",
    "gpt_oss_mxfp4",
    "deepseek_v4_fp8",
    "online",
    "fp8_per_tensor",
    "fp8_per_block",
    "fp8_per_channel",
    "int8_per_channel_weight_only",
    "nvfp4_per_token",
    "mxfp8",
)

FLAGS = FlagTable(
    [
        # owned: rendered by the operator
        Flag("model", ("--model",), role=Role.OWNED, convert=to_text),
        Flag("host", ("--host",), role=Role.OWNED, convert=to_text),
        Flag("port", ("--port",), role=Role.OWNED, convert=to_int(1)),
        Flag("tensor_parallel_size", ("--tensor-parallel-size", "-tp"), role=Role.OWNED, convert=to_int(1)),
        Flag(
            "gpu_memory_utilization",
            ("--gpu-memory-utilization", "--device-memory-utilization"),
            role=Role.OWNED,
            convert=to_float(),
        ),
        Flag("block_size", ("--block-size",), role=Role.OWNED, convert=to_int()),
        Flag("max_num_seqs", ("--max-num-seqs",), role=Role.OWNED, convert=to_int(1)),
        Flag("max_num_batched_tokens", ("--max-num-batched-tokens",), role=Role.OWNED, convert=to_int(1)),
        _bool_pair("enable_prefix_caching", "enable-prefix-caching", Role.OWNED),
        Flag(
            "scheduling_policy",
            ("--scheduling-policy",),
            role=Role.OWNED,
            convert=to_choice(("fcfs", "priority")),
        ),
        # The scale-out endpoints (vllm/entrypoints/scale_out/factories.py): the render routes a
        # router asks for the request's token ids, /derender, /inference/v1/generate and
        # /inference/v1/abort_requests. Off by default (FrontendArgs.enable_scale_out,
        # vllm/entrypoints/common/cli_args.py): the routes then answer 403. Rendered for a router.
        _bool_pair("enable_scale_out", "enable-scale-out", Role.OWNED),
        # forbidden: real flags that would override a tuned knob or blind the tuner
        Flag(
            "kv_cache_memory_bytes",
            ("--kv-cache-memory-bytes",),
            role=Role.FORBIDDEN,
            why="sets the KV pool in bytes and makes vLLM ignore the tuned memory_fraction",
        ),
        Flag(
            "num_gpu_blocks_override",
            ("--num-gpu-blocks-override",),
            role=Role.FORBIDDEN,
            why="overrides the KV pool size that the tuned memory_fraction decides",
        ),
        Flag(
            "prefix_match_unit",
            ("--prefix-match-unit",),
            role=Role.FORBIDDEN,
            why="changes the prefix-hit granularity that the tuned block_size decides",
        ),
        Flag(
            "disable_log_stats",
            ("--disable-log-stats",),
            Kind.SWITCH,
            role=Role.FORBIDDEN,
            why="removes the Prometheus metrics the tuner reads",
        ),
        # options: recognised, untuned, passed through verbatim
        _bool_pair("enable_chunked_prefill", "enable-chunked-prefill"),
        Flag("long_prefill_token_threshold", ("--long-prefill-token-threshold",), convert=to_int(0)),
        Flag("kv_cache_dtype", ("--kv-cache-dtype",), convert=to_choice(tuple(_KV_DTYPES), _KV_DTYPES)),
        Flag("max_model_len", ("--max-model-len",), convert=to_int(1)),
        _bool_pair("trust_remote_code", "trust-remote-code"),
        Flag("served_model_name", ("--served-model-name",), Kind.LIST, convert=to_text),
        Flag("seed", ("--seed",), convert=to_int()),
        Flag("dtype", ("--dtype",), convert=to_choice(_DTYPES)),
        Flag("quantization", ("--quantization", "-q"), convert=to_choice(_QUANTIZATION)),
        _bool_pair("enforce_eager", "enforce-eager"),
        _bool_pair("enable_log_requests", "enable-log-requests"),
        Flag(
            "prefix_caching_hash_algo",
            ("--prefix-caching-hash-algo",),
            convert=to_choice(("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")),
        ),
        Flag("kv_offloading_size", ("--kv-offloading-size",), convert=to_float(0.0)),
        Flag("kv_offloading_backend", ("--kv-offloading-backend",), convert=to_choice(("native", "lmcache"))),
        _bool_pair("kv_cache_metrics", "kv-cache-metrics"),
        Flag("kv_cache_metrics_sample", ("--kv-cache-metrics-sample",), convert=to_float(0.0)),
        Flag("pipeline_parallel_size", ("--pipeline-parallel-size", "-pp"), convert=to_int(1)),
        Flag("data_parallel_size", ("--data-parallel-size", "-dp"), convert=to_int(1)),
        Flag("tokenizer", ("--tokenizer",), convert=to_text),
        Flag("revision", ("--revision",), convert=to_text),
        Flag("download_dir", ("--download-dir",), convert=to_text),
        Flag("api_key", ("--api-key",), Kind.LIST, convert=to_text),  # list[str] in 0.33: --api-key a b
        Flag("max_logprobs", ("--max-logprobs",), convert=to_int()),
        Flag(
            "uvicorn_log_level",
            ("--uvicorn-log-level",),
            convert=to_choice(("critical", "error", "warning", "info", "debug", "trace")),
        ),
    ],
    normalize_name=_vllm_name,
)

_OPTION_KEYS = {
    "max_num_seqs": MAX_RUNNING,
    "max_num_batched_tokens": MAX_BATCHED_TOKENS,
    "enable_chunked_prefill": CHUNKED_PREFILL,
    "kv_cache_dtype": KV_CACHE_DTYPE,
    "max_model_len": MAX_MODEL_LEN,
    "pipeline_parallel_size": "pipeline_parallel",
    "data_parallel_size": "data_parallel",
    "tensor_parallel_size": TENSOR_PARALLEL,
    "host": HOST,
    "kv_offloading_backend": HOST_CACHE_BACKEND,
}

METRICS = MetricNames(
    requests_running="vllm:num_requests_running",
    requests_waiting="vllm:num_requests_waiting",
    kv_usage="vllm:kv_cache_usage_perc",
    prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total",
    requests_finished="vllm:request_success_total",
    ttft="vllm:time_to_first_token_seconds",
    itl="vllm:inter_token_latency_seconds",
    tpot="vllm:request_time_per_output_token_seconds",
    e2e="vllm:e2e_request_latency_seconds",
    preemptions="vllm:num_preemptions_total",
    hit_numerator="vllm:prefix_cache_hits_total",
    hit_denominator="vllm:prefix_cache_queries_total",
    hit_miss="",
    hit_unit="tokens",
    cached_prompt_tokens="vllm:prompt_tokens_cached_total",
    config_info="vllm:cache_config_info",
    extra={
        "queue_time": "vllm:request_queue_time_seconds",
        "prefill_time": "vllm:request_prefill_time_seconds",
        "external_hits": "vllm:external_prefix_cache_hits_total",
        "external_queries": "vllm:external_prefix_cache_queries_total",
        "waiting_by_reason": "vllm:num_requests_waiting_by_reason",
    },
)


class VllmAdapter(AdapterBase):
    """``normalize`` is type coercion only: every vLLM knob changes behaviour on its own. Block size
    still matters with prefix caching off (it is the KV page), and ``priority`` is kept as is (it is
    not searched; with priorities on the requests it does differ from fcfs)."""

    name = EngineName.VLLM
    command = COMMAND
    default_port = DEFAULT_PORT
    tp_dest = "tensor_parallel_size"
    default_image = "vllm/vllm-openai:v0.33.0"
    version = "0.33"
    metrics_port = DEFAULT_PORT
    metrics_path = "/metrics"
    health_path = "/health"
    metrics = METRICS
    table = FLAGS
    _knobs = KNOBS
    prog_words = 2  # "vllm serve: error: ..."
    # vllm-router routes on the render routes, which --enable-scale-out opens
    need_flags: Mapping[EngineNeed, str] = {EngineNeed.TOKEN_IDS: "enable_scale_out"}

    def hardware_defaults(self, hardware: Hardware, pinned: Mapping[str, object]) -> dict[str, object]:
        """The API server's limits for the device (``batch_defaults``); an unset max_num_seqs is at
        most a pinned max_num_batched_tokens (vllm/engine/arg_utils.py 0.33.0,
        ``_set_default_max_num_seqs_and_batched_tokens_args``: ``min(max_num_seqs,
        max_num_batched_tokens)``), so a small pinned budget alone is a config vLLM starts with."""
        tokens, seqs = batch_defaults(hardware)
        budget = pinned.get(MAX_BATCHED_TOKENS)
        if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
            seqs = min(seqs, budget)
        return {MAX_BATCHED_TOKENS: tokens, MAX_RUNNING: seqs}

    def cross_check(self, config: KnobConfig) -> list[tuple[str, str]]:
        """SchedulerConfig.verify_max_model_len: max_num_batched_tokens >= max_num_seqs (where both
        are set; an engine default is checked once filled in for the GPU)."""
        tokens, seqs = int(config.max_batched_tokens), int(config.max_running)
        if tokens and seqs and tokens < seqs:
            return [
                (
                    MAX_BATCHED_TOKENS,
                    f"vllm: max_batched_tokens ({tokens}) must be >= max_running ({seqs}): vLLM refuses "
                    "max_num_batched_tokens below max_num_seqs at start",
                )
            ]
        return []

    def allowed_choices(self, extra_args: Sequence[str]) -> Mapping[str, tuple[object, ...]]:
        """With chunked prefill off vLLM refuses a token budget below max_model_len: only budgets >=
        --max-model-len are allowed, none without it (the engine's default then applies: it raises
        the budget to max(max_model_len, default) itself)."""
        try:
            scan = self.table.scan(list(extra_args))
        except ArgsError:
            return {}
        if scan.value("enable_chunked_prefill") is not False:
            return {}
        length = scan.value("max_model_len")
        budgets = self._knobs[MAX_BATCHED_TOKENS].choices
        if not isinstance(length, int):
            return {MAX_BATCHED_TOKENS: ()}
        return {MAX_BATCHED_TOKENS: tuple(sorted({length, *(int(b) for b in budgets if int(b) > length)}))}

    def tuned_flags(self) -> frozenset[str]:
        # vLLM also accepts the underscore spelling of every long flag.
        base = super().tuned_flags()
        return base | {"--" + name[2:].replace("-", "_") for name in base if name.startswith("--")}

    def render_args(
        self, model: str, config: KnobConfig, extra_args: Sequence[str], port: int, tensor_parallel: int
    ) -> RenderedCommand:
        args = (model, *self.serving_args(port, tensor_parallel), *self.knob_args(config), *extra_args)
        return RenderedCommand(COMMAND, args)

    def parse(self, argv: Sequence[str], files: Mapping[str, str] | None = None) -> ParsedCommand:
        scan = self.scan_args(self.command_args(argv), max_positionals=1)
        # ``vllm serve MODEL`` puts the positional into --model; the positional wins when both are given.
        model = scan.positionals[0] if scan.positionals else scan.str_value("model", "")
        if not model:
            raise ArgsError("vllm serve: the model is required (positional MODEL or --model)")
        config = self.config_from(scan)
        options = options_from(scan, _OPTION_KEYS)
        offload = scan.value("kv_offloading_size")
        if isinstance(offload, float) and offload > 0:
            options[HOST_CACHE_BYTES] = int(offload * 2**30)  # GiB, total across TP ranks
        return self.parsed(scan, model, config, options)

    def effective_config(self, samples: Sequence[tuple[str, Mapping[str, str], float]]) -> dict[str, object]:
        """From ``vllm:cache_config_info`` labels (the first sample): knob values and the KV pool size.

        Keys: block_size, memory_fraction, prefix_caching (knob names), kv_blocks and kv_tokens.
        Labels that are missing or unparseable ("None") are left out.
        """
        labels = first_labels(samples, METRICS.config_info)
        if labels is None:
            return {}
        found = read_labels(labels, (*self.knob_labels(), ("num_gpu_blocks", "kv_blocks", label_int)))
        return with_kv_tokens(found)


ADAPTER = VllmAdapter()

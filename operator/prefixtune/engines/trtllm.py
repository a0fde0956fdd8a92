"""TensorRT-LLM (``trtllm-serve MODEL ...``, PyTorch backend): knobs, command line, options YAML, metrics.

Facts from shared/reference/engines.md §1.3, §2.3, §3.3, §4.3. ``trtllm-serve`` has no prefix-cache
flag: block size, block reuse and the capacity scheduler live in the LLM API options YAML passed with
``--extra_llm_api_options`` (``--config`` in newer builds). The operator renders that file into
``RenderedCommand.files``. Prometheus metrics are served at ``/prometheus/metrics`` only with
``return_perf_metrics: true``; iteration gauges also need ``enable_iter_perf_stats: true``: both are
always rendered.

A setting given both on the command line and in the YAML is refused: which one wins is not
documented in the reference, and the operator never renders both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

import yaml

from prefixtune.engines._argv import (
    Flag,
    FlagTable,
    Kind,
    Role,
    Scan,
    to_choice,
    to_float,
    to_int,
    to_text,
)
from prefixtune.engines._common import (
    CHUNKED_PREFILL,
    HOST,
    HOST_CACHE_BYTES,
    KV_CACHE_DTYPE,
    MAX_MODEL_LEN,
    PARTIAL_REUSE,
    TENSOR_PARALLEL,
    AdapterBase,
    batch_limit_knob,
    first_labels,
    flag_name,
    knob_table,
    label_bool,
    label_int,
    memory_fraction_knob,
    options_from,
    powers_of_two,
    prefix_caching_knob,
    read_labels,
    with_kv_tokens,
)
from prefixtune.engines.base import (
    BLOCK_SIZE,
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

COMMAND = ("trtllm-serve",)
DEFAULT_PORT = 8000
OPTIONS_PATH = "/etc/prefixtune/llm_api_options.yaml"
_HEADER = "# LLM API options rendered by prefixtune (the operator owns this file)\n"

KNOBS = knob_table(
    memory_fraction_knob(
        default=0.9,
        flag="--free_gpu_memory_fraction",
        doc="share of the memory FREE after weights and the activation peak that goes to the KV pool",
        # Rendered in the YAML, never on the command line: TensorRT-LLM versions whose
        # update_llm_args_with_extra_dict merges shallowly replace the CLI's whole KvCacheConfig with
        # the YAML's kv_cache_config, so a CLI fraction would silently run at 0.9. Both parse.
        binding=Binding(
            dest="free_gpu_memory_fraction",
            option="kv_cache_config.free_gpu_memory_fraction",
            encode=float,
            label="free_gpu_memory_fraction",
        ),
    ),
    KnobSpec(
        name=BLOCK_SIZE,
        default=32,
        choices=(8, 16, 32, 64, 128),
        flag="kv_cache_config.tokens_per_block",
        doc="tokens per KV block (a power of two); partial block reuse is on",
        binding=Binding(option="kv_cache_config.tokens_per_block", encode=int, label="tokens_per_block"),
    ),
    prefix_caching_knob(
        flag="kv_cache_config.enable_block_reuse",
        doc="cross-request KV block reuse",
        binding=Binding(option="kv_cache_config.enable_block_reuse", encode=bool, label="enable_block_reuse"),
    ),
    KnobSpec(
        name=SCHEDULE_POLICY,
        default="guaranteed_no_evict",
        choices=("guaranteed_no_evict", "max_utilization"),
        flag="scheduler_config.capacity_scheduler_policy",
        doc="capacity scheduler: reserve KV for whole requests, or pack the batch and pause on shortage",
        # The engine spells the policies in capitals (CapacitySchedulerPolicy), the knob in lower case.
        binding=Binding(
            option="scheduler_config.capacity_scheduler_policy",
            encode=lambda v: str(v).upper(),
            decode=lambda v: str(v).lower(),
        ),
    ),
    # The batch limits go to the options YAML's top level, like the other knobs (a CLI value parses too).
    batch_limit_knob(
        MAX_BATCHED_TOKENS,
        choices=powers_of_two(512, 32768),
        flag="max_num_tokens",
        doc=(
            "tokens one in-flight-batching iteration may schedule (context + generation); without "
            "chunked prefill (off by default in trtllm-serve) a prompt must fit in one iteration. "
            "trtllm-serve default 8192"
        ),
        binding=Binding(dest="max_num_tokens", option="max_num_tokens", encode=int),
    ),
    batch_limit_knob(
        MAX_RUNNING,
        choices=powers_of_two(32, 2048),
        flag="max_batch_size",
        doc="requests in the in-flight batch at most; trtllm-serve default 2048",
        binding=Binding(dest="max_batch_size", option="max_batch_size", encode=int),
    ),
)
# trtllm-serve's own defaults (click options of tensorrt_llm/commands/serve.py; engines.md 1.3), the
# same on every GPU.
SERVE_MAX_NUM_TOKENS = 8192
SERVE_MAX_BATCH_SIZE = 2048

_ENGINE_POLICIES = ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION", "STATIC_BATCH")
REASONING_PARSERS = ("deepseek-r1", "qwen3", "nano-v3")

# Release series. The Prometheus series the recipe reads (KV reuse/miss counters, token counters,
# running/waiting gauges, KV utilization, kv_cache_config_info) came with PRs #11243 (2026-02-03),
# #12132, #12413, #12545 and #12636 (2026-03/04), after the 1.2 branch: 1.2 images export only the
# request-latency histograms and the request counter. 1.3.0rc images carry them (1.3.0rc24 is the
# newest tag seen in use, 2026-08); no 1.3.0 GA tag was found, so the default image is that rc.
RELEASE_1_2 = "1.2"
RELEASE_1_3 = "1.3"
DEFAULT_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24"
_TAG_VERSION = re.compile(r"^v?(\d+)\.(\d+)")

FLAGS = FlagTable(
    [
        # owned: rendered by the operator
        Flag("host", ("--host",), role=Role.OWNED, convert=to_text),
        Flag("port", ("--port",), role=Role.OWNED, convert=to_int(1)),
        Flag("tp_size", ("--tp_size",), role=Role.OWNED, convert=to_int(1)),
        Flag(
            "free_gpu_memory_fraction",
            ("--free_gpu_memory_fraction", "--kv_cache_free_gpu_memory_fraction"),
            role=Role.OWNED,
            convert=to_float(),
        ),
        Flag(
            "extra_llm_api_options", ("--extra_llm_api_options", "--config"), role=Role.OWNED, convert=to_text
        ),
        Flag("max_batch_size", ("--max_batch_size",), role=Role.OWNED, convert=to_int(1)),
        Flag("max_num_tokens", ("--max_num_tokens",), role=Role.OWNED, convert=to_int(1)),
        # options: recognised, untuned, passed through verbatim
        Flag("enable_chunked_prefill", ("--enable_chunked_prefill",), Kind.SWITCH),
        # nvfp4 exists in the engine but has no neutral value for the twin yet.
        Flag("kv_cache_dtype", ("--kv_cache_dtype",), convert=to_choice(("auto", "fp8"))),  # 1.3 only
        Flag("max_seq_len", ("--max_seq_len",), convert=to_int(1)),
        Flag("trust_remote_code", ("--trust_remote_code",), Kind.SWITCH),
        Flag("backend", ("--backend",), convert=to_choice(("pytorch", "_autodeploy"))),
        Flag("tokenizer", ("--tokenizer",), convert=to_text),
        Flag(
            "log_level",
            ("--log_level",),
            convert=to_choice(("internal_error", "error", "warning", "info", "verbose", "debug")),
        ),
        Flag("max_beam_width", ("--max_beam_width",), convert=to_int(1)),
        Flag("pp_size", ("--pp_size",), convert=to_int(1)),
        Flag("ep_size", ("--ep_size",), convert=to_int(1)),
        Flag("num_postprocess_workers", ("--num_postprocess_workers",), convert=to_int(0)),
        # click.Choice(REASONING_PARSER_CHOICES) in trtllm-serve (tensorrt_llm/commands/serve.py)
        Flag("reasoning_parser", ("--reasoning_parser",), convert=to_choice(REASONING_PARSERS)),
    ]
)

_OPTION_KEYS = {
    "max_batch_size": MAX_RUNNING,
    "max_num_tokens": MAX_BATCHED_TOKENS,
    "enable_chunked_prefill": CHUNKED_PREFILL,
    "kv_cache_dtype": KV_CACHE_DTYPE,
    "max_seq_len": MAX_MODEL_LEN,
    "pp_size": "pipeline_parallel",
    "tp_size": TENSOR_PARALLEL,
    "host": HOST,
}

# The YAML keys prefixtune understands: key -> (type, neutral option key or "" when it is not one).
# LLM API models refuse unknown keys, so an unknown key here is an error too.
_YAML_TOP: dict[str, tuple[type, str]] = {
    "return_perf_metrics": (bool, ""),
    "enable_iter_perf_stats": (bool, ""),
    "perf_metrics_max_requests": (int, ""),
    "max_batch_size": (int, MAX_RUNNING),
    "max_num_tokens": (int, MAX_BATCHED_TOKENS),
    "max_seq_len": (int, MAX_MODEL_LEN),
    "enable_chunked_prefill": (bool, CHUNKED_PREFILL),
    "print_iter_log": (bool, ""),
}
_YAML_KV: dict[str, tuple[type, str]] = {
    "free_gpu_memory_fraction": (float, ""),
    "tokens_per_block": (int, ""),
    "enable_block_reuse": (bool, ""),
    "enable_partial_reuse": (bool, PARTIAL_REUSE),
    "copy_on_partial_reuse": (bool, ""),
    "host_cache_size": (int, HOST_CACHE_BYTES),
    "onboard_blocks": (bool, ""),
    "secondary_offload_min_priority": (int, ""),
    "event_buffer_max_size": (int, ""),
    "dtype": (str, KV_CACHE_DTYPE),
}
_YAML_KV_FORBIDDEN = {
    "max_tokens": "caps the KV pool that the tuned memory_fraction decides",
    "max_gpu_total_bytes": "caps the KV pool that the tuned memory_fraction decides",
}
_YAML_SCHEDULER: dict[str, tuple[type, str]] = {
    "capacity_scheduler_policy": (str, ""),
    "context_chunking_policy": (str, ""),
}
# The same setting on the command line and in the YAML: refused (precedence is not documented).
_CLI_TWINS = {
    "max_batch_size": "max_batch_size",
    "max_num_tokens": "max_num_tokens",
    "max_seq_len": "max_seq_len",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "kv_cache_config.dtype": "kv_cache_dtype",
    "kv_cache_config.free_gpu_memory_fraction": "free_gpu_memory_fraction",
}

METRICS = MetricNames(
    requests_running="trtllm_num_requests_running",
    requests_waiting="trtllm_num_requests_waiting",
    kv_usage="trtllm_kv_cache_utilization",
    prompt_tokens="trtllm_prompt_tokens_total",
    generation_tokens="trtllm_generation_tokens_total",
    requests_finished="trtllm_request_success_total",
    ttft="trtllm_time_to_first_token_seconds",
    # TRT-LLM exports no per-token gaps: its one latency-per-token histogram is observed once per
    # request, (last token - first token) / (output tokens - 1) (tensorrt_llm/executor/result.py,
    # metrics/collector.py), so the ITL quantiles are per request there
    itl="trtllm_time_per_output_token_seconds",
    tpot="trtllm_time_per_output_token_seconds",
    e2e="trtllm_e2e_request_latency_seconds",
    preemptions="",  # no preemption counter; see extra["paused_requests"]
    hit_numerator="trtllm_kv_cache_reused_blocks_total",
    hit_denominator="",  # hit rate = reused / (reused + missed), in blocks
    hit_miss="trtllm_kv_cache_missed_blocks_total",
    hit_unit="blocks",
    cached_prompt_tokens="trtllm_prompt_cached_tokens_total",
    config_info="trtllm_kv_cache_config_info",
    extra={
        "paused_requests": "trtllm_num_paused_requests",
        "tokens_per_block": "trtllm_kv_cache_tokens_per_block",
        "max_blocks": "trtllm_kv_cache_max_blocks",
        "hit_rate_gauge": "trtllm_kv_cache_hit_rate",
        "queue_time": "trtllm_request_queue_time_seconds",
        "host_kv_usage": "trtllm_kv_cache_host_utilization",
    },
)

# What a 1.2 image exports: the request-latency histograms and the request counter only.
METRICS_1_2 = replace(
    METRICS,
    requests_running="",
    requests_waiting="",
    kv_usage="",
    prompt_tokens="",
    generation_tokens="",
    hit_numerator="",
    hit_miss="",
    cached_prompt_tokens="",
    config_info="",
    extra={"queue_time": METRICS.extra["queue_time"]},
)
_NOT_IN_1_2 = frozenset({"kv_cache_dtype"})


def options_yaml(config: KnobConfig) -> str:
    """The LLM API options file for ``config`` (deterministic text)."""
    knobs = ADAPTER.knob_options(config)  # the knobs' sections, from their bindings
    document = {
        **knobs.get("", {}),
        "kv_cache_config": {**knobs["kv_cache_config"], "enable_partial_reuse": True},
        "scheduler_config": knobs["scheduler_config"],
        "return_perf_metrics": True,
        "enable_iter_perf_stats": True,
    }
    return _HEADER + yaml.safe_dump(document, sort_keys=False)


def _typed(where: str, value: object, expected: type) -> object:
    ok = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        raise ArgsError(f"{where}: expected {expected.__name__}, got {value!r}")
    return value


def _section(
    path: str, name: str, data: object, known: Mapping[str, tuple[type, str]], forbidden: Mapping[str, str]
) -> dict[str, object]:
    if not isinstance(data, dict):
        raise ArgsError(f"{path}: {name} must be a mapping, got {data!r}")
    out: dict[str, object] = {}
    for key, value in data.items():
        where = f"{path}: {name}.{key}"
        if key in forbidden:
            raise ArgsError(f"{where}: {forbidden[key]}")
        if key not in known:
            raise ArgsError(f"{where}: unknown key; known: {', '.join(sorted(known))}")
        out[str(key)] = _typed(where, value, known[key][0])
    return out


def _read_options(path: str, text: str) -> tuple[dict[str, object], dict[str, object], dict[str, object]]:
    """(top-level, kv_cache_config, scheduler_config) of an options YAML, checked key by key."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ArgsError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ArgsError(f"{path}: the options file must be a mapping")
    top = dict(data)
    kv = _section(path, "kv_cache_config", top.pop("kv_cache_config", {}), _YAML_KV, _YAML_KV_FORBIDDEN)
    scheduler = _section(path, "scheduler_config", top.pop("scheduler_config", {}), _YAML_SCHEDULER, {})
    rest = _section(path, "options", top, _YAML_TOP, {})
    return rest, kv, scheduler


class TrtllmAdapter(AdapterBase):
    """``normalize`` is type coercion only: with block reuse off the block size is still the KV page
    and the capacity policy still decides admission, so every combination behaves differently."""

    name = EngineName.TRTLLM
    command = COMMAND
    default_port = DEFAULT_PORT
    tp_dest = "tp_size"
    default_image = DEFAULT_IMAGE
    version = RELEASE_1_3
    metrics_port = DEFAULT_PORT
    metrics_path = "/prometheus/metrics"
    health_path = "/health"
    metrics = METRICS
    chunked_prefill_default = False  # trtllm-serve: enable_chunked_prefill off (engines.md 1.3)
    table = FLAGS
    _knobs = KNOBS
    dashed_flags = False  # click options: --tp_size is spelled with underscores

    def hardware_defaults(self, hardware: Hardware, pinned: Mapping[str, object]) -> dict[str, object]:
        return {MAX_BATCHED_TOKENS: SERVE_MAX_NUM_TOKENS, MAX_RUNNING: SERVE_MAX_BATCH_SIZE}

    def version_of(self, image: str) -> str:
        """``release:1.2.x`` (and older) is the 1.2 series, ``1.3.x``/``1.3.0rcN`` and newer 1.3; an image
        whose tag is not a version (a custom build) is taken as the default image's series."""
        tag = image.split("@", 1)[0].rpartition("/")[2].rpartition(":")[2] if ":" in image else ""
        match = _TAG_VERSION.match(tag)
        if match is None:
            return self.version
        return RELEASE_1_2 if (int(match.group(1)), int(match.group(2))) <= (1, 2) else RELEASE_1_3

    def metrics_for(self, version: str) -> MetricNames:
        if version != RELEASE_1_2:
            return METRICS
        return METRICS_1_2

    def refused_for_version(self, version: str, extra_args: Sequence[str]) -> list[tuple[int, str]]:
        if version != RELEASE_1_2:
            return []
        return [
            (
                i,
                f"{arg.split('=', 1)[0]} is not a flag of trtllm-serve {version} (added in 1.3); remove it "
                f"or use a 1.3 image such as {DEFAULT_IMAGE}",
            )
            for i, arg in enumerate(extra_args)
            if (flag := self.table.flag_of(arg)) is not None and flag.dest in _NOT_IN_1_2
        ]

    def render_args(
        self, model: str, config: KnobConfig, extra_args: Sequence[str], port: int, tensor_parallel: int
    ) -> RenderedCommand:
        args = (
            model,
            *self.serving_args(port, tensor_parallel),
            "--extra_llm_api_options",
            OPTIONS_PATH,
            *extra_args,
        )
        return RenderedCommand(COMMAND, args, {OPTIONS_PATH: options_yaml(config)})

    def parse(self, argv: Sequence[str], files: Mapping[str, str] | None = None) -> ParsedCommand:
        rest = self.command_args(argv)
        if rest[:1] == ["serve"]:  # ``trtllm-serve serve MODEL`` is the same command
            rest = rest[1:]
        scan = self.scan_args(rest, max_positionals=1)
        if not scan.positionals:
            raise ArgsError("trtllm-serve: missing argument 'MODEL'")
        top: dict[str, object] = {}
        kv: dict[str, object] = {}
        scheduler: dict[str, object] = {}
        path = scan.str_value("extra_llm_api_options", "")
        if path:
            if files is None or path not in files:
                raise ArgsError(f"{flag_name(scan, 'extra_llm_api_options')}: file {path} was not provided")
            top, kv, scheduler = _read_options(path, files[path])
            self._refuse_twins(scan, path, top, kv)
        config = self._config(scan, path, top, kv, scheduler)
        options = options_from(scan, _OPTION_KEYS)
        for section, known in ((top, _YAML_TOP), (kv, _YAML_KV)):
            for key, value in section.items():
                if known[key][1]:
                    options[known[key][1]] = value
        if options.get(KV_CACHE_DTYPE) not in (None, "auto", "fp8"):
            raise ArgsError(f"{path}: kv_cache_config.dtype must be one of auto, fp8")
        if "return_perf_metrics" in top:
            options["metrics"] = bool(top["return_perf_metrics"]) and bool(top.get("enable_iter_perf_stats"))
        return self.parsed(scan, scan.positionals[0], config, options)

    def _config(
        self,
        scan: Scan,
        path: str,
        top: Mapping[str, object],
        kv: Mapping[str, object],
        scheduler: Mapping[str, object],
    ) -> KnobConfig:
        if "capacity_scheduler_policy" in scheduler:
            where = f"{path}: scheduler_config.capacity_scheduler_policy"
            policy = scheduler["capacity_scheduler_policy"]
            if policy not in _ENGINE_POLICIES:
                raise ArgsError(
                    f"{where}: invalid value {policy!r}; choose from {', '.join(_ENGINE_POLICIES)}"
                )
        return self.config_from(scan, {"": top, "kv_cache_config": kv, "scheduler_config": scheduler}, path)

    @staticmethod
    def _refuse_twins(scan: Scan, path: str, top: Mapping[str, object], kv: Mapping[str, object]) -> None:
        for key, dest in _CLI_TWINS.items():
            section, _, field = key.rpartition(".")
            in_yaml = field in (kv if section else top)
            if in_yaml and scan.last(dest) is not None:
                raise ArgsError(
                    f"{flag_name(scan, dest)} is also set as {key} in {path}; set it in one place only"
                )

    def effective_config(self, samples: Sequence[tuple[str, Mapping[str, str], float]]) -> dict[str, object]:
        """From ``trtllm_kv_cache_config_info`` labels (tokens_per_block, enable_block_reuse,
        free_gpu_memory_fraction, enable_partial_reuse, host_cache_size: label names unverified in the
        reference), then the gauges ``trtllm_kv_cache_tokens_per_block`` and ``trtllm_kv_cache_max_blocks``.
        Keys: block_size, prefix_caching, memory_fraction, partial_reuse, host_cache_bytes, kv_blocks,
        kv_tokens.
        """
        labels = first_labels(samples, METRICS.config_info)
        found = read_labels(
            labels or {},
            (
                *self.knob_labels(),
                ("enable_partial_reuse", PARTIAL_REUSE, label_bool),
                ("host_cache_size", HOST_CACHE_BYTES, label_int),
            ),
        )
        for name, _, value in samples:
            if name == METRICS.extra["tokens_per_block"] and BLOCK_SIZE not in found:
                found[BLOCK_SIZE] = int(value)
            elif name == METRICS.extra["max_blocks"] and "kv_blocks" not in found:
                found["kv_blocks"] = int(value)
        return with_kv_tokens(found)


ADAPTER = TrtllmAdapter()

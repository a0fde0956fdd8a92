"""Parsing hand-written engine command lines, and refusing what the engines would refuse."""

from __future__ import annotations

import shlex

import pytest

from prefixtune.engines import ArgsError, KnobConfig, get_adapter
from prefixtune.engines.trtllm import OPTIONS_PATH

VLLM = get_adapter("vllm")
SGLANG = get_adapter("sglang")
TRTLLM = get_adapter("trtllm")


# --- vLLM ---------------------------------------------------------------------------------------


def test_vllm_real_command_both_forms_and_aliases() -> None:
    argv = shlex.split(
        "vllm serve meta-llama/Llama-3.1-8B-Instruct --device-memory-utilization=0.85 --block-size 32 "
        "--no-enable-prefix-caching --scheduling-policy=priority -tp 4 --port 9000 --max-num-seqs=256 "
        "--max-num-batched-tokens 8192 --enable-chunked-prefill --kv-cache-dtype fp8 --max-model-len 16384 "
        "--served-model-name llama --dtype bfloat16"
    )
    parsed = VLLM.parse(argv)
    assert parsed.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert parsed.config == KnobConfig(0.85, 32, False, "priority", 8192, 256)
    assert parsed.port == 9000
    assert parsed.tensor_parallel == 4
    assert parsed.options == {
        "tensor_parallel": 4,
        "max_running": 256,
        "max_batched_tokens": 8192,
        "chunked_prefill": True,
        "kv_cache_dtype": "fp8",
        "max_model_len": 16384,
    }
    assert parsed.extra_args == (
        "--enable-chunked-prefill",
        "--kv-cache-dtype",
        "fp8",
        "--max-model-len",
        "16384",
        "--served-model-name",
        "llama",
        "--dtype",
        "bfloat16",
    )


def test_vllm_defaults_when_flags_absent_and_model_flag() -> None:
    parsed = VLLM.parse(["vllm", "serve", "--model", "Qwen/Qwen2.5-7B"])
    assert parsed.model == "Qwen/Qwen2.5-7B"
    assert parsed.config == VLLM.default_config() == KnobConfig(0.92, 16, True, "fcfs")
    assert parsed.port == 8000
    assert parsed.tensor_parallel == 1
    assert parsed.options == {}  # nothing set, nothing reported


def test_vllm_underscore_spelling_is_the_same_flag() -> None:
    parsed = VLLM.parse(["vllm", "serve", "m", "--gpu_memory_utilization", "0.5", "--block_size=64"])
    assert parsed.config.memory_fraction == 0.5
    assert parsed.config.block_size == 64
    owned = VLLM.owned_args(["--block_size=64", "--max_num_seqs", "3", "--max-model-len", "9"])  # type: ignore[attr-defined]
    assert owned == ["--block_size=64", "--max_num_seqs"]


def test_vllm_last_occurrence_wins() -> None:
    parsed = VLLM.parse(
        shlex.split(
            "vllm serve m --block-size 16 --block-size 128 --enable-prefix-caching --no-enable-prefix-caching"
        )
    )
    assert parsed.config.block_size == 128
    assert parsed.config.prefix_caching is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("vllm serve m --frobnicate 3", "unrecognized arguments: --frobnicate 3"),
        ("vllm serve m --block 32", "unrecognized arguments: --block 32"),  # no abbreviations
        ("vllm serve m extra", "unrecognized arguments: extra"),
        ("vllm serve --block-size 16", "model is required"),
        ("vllm serve m --block-size 24", "block_size must be one of 16, 32, 64, 128"),
        ("vllm serve m --block-size abc", "argument --block-size: invalid value 'abc': expected an integer"),
        ("vllm serve m --gpu-memory-utilization 1.5", "memory_fraction must be in (0.0, 1.0], got 1.5"),
        ("vllm serve m --gpu-memory-utilization 0", "memory_fraction must be in (0.0, 1.0]"),
        ("vllm serve m --scheduling-policy lifo", "choose from fcfs, priority"),
        ("vllm serve m --kv-cache-dtype int4", "choose from auto, fp8, fp8_e4m3, fp8_e5m2"),
        ("vllm serve m --enable-prefix-caching=false", "ignored explicit argument 'false'"),
        ("vllm serve m --max-num-seqs", "argument --max-num-seqs: expected one argument"),
        ("vllm serve m --max-num-seqs 0", "must be >= 1"),
        ("vllm serve m --kv-cache-memory-bytes 1000", "ignore the tuned memory_fraction"),
        ("vllm serve m --disable-log-stats", "removes the Prometheus metrics"),
        ("vllm run m", "must start with 'vllm serve'"),
    ],
)
def test_vllm_rejects(argv: str, message: str) -> None:
    with pytest.raises(ArgsError) as err:
        VLLM.parse(argv.split())
    assert message in str(err.value)


# --- SGLang -------------------------------------------------------------------------------------


def test_sglang_real_command_both_forms_and_aliases() -> None:
    argv = shlex.split(
        "python -m sglang.launch_server --model Qwen/Qwen2.5-7B-Instruct --mem-fraction-static=0.8 "
        "--page-size 16 --disable-radix-cache --schedule-policy lof --tensor-parallel-size=2 "
        "--max-running-requests 128 --chunked-prefill-size -1 --context-length=8192 "
        "--radix-eviction-policy slru --enable-metrics --kv-cache-dtype fp8_e4m3"
    )
    parsed = SGLANG.parse(argv)
    assert parsed.model == "Qwen/Qwen2.5-7B-Instruct"
    assert parsed.config == KnobConfig(0.8, 16, False, "lof", -1, 128)
    assert parsed.port == 30000
    assert parsed.tensor_parallel == 2
    assert parsed.options == {
        "tensor_parallel": 2,
        "max_running": 128,
        "chunked_prefill": False,
        "max_model_len": 8192,
        "eviction_policy": "slru",
        "metrics": True,
        "kv_cache_dtype": "fp8",
    }
    assert "--chunked-prefill-size" not in parsed.extra_args  # owned: the token budget knob
    assert "--disable-radix-cache" not in parsed.extra_args


def test_sglang_defaults() -> None:
    parsed = SGLANG.parse(["python3", "-m", "sglang.launch_server", "--model-path", "m"])
    assert parsed.config == KnobConfig(0.828, 1, True, "fcfs")
    assert parsed.options == {}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("--model-path m --schedule-policy priority", "schedule_policy must be one of fcfs, lpm, dfs-weight"),
        ("--model-path m --schedule-policy nope", "choose from lpm, random, fcfs"),
        ("--model-path m --page-size 8", "block_size must be one of 1, 16, 32, 64, 128"),
        ("--model-path m --no-disable-radix-cache", "unrecognized arguments: --no-disable-radix-cache"),
        ("--model-path m --disable-radix-cache=true", "ignored explicit argument 'true'"),
        ("--page-size 16", "required: --model-path"),
        ("--model-path m --chunked-prefill-size 0", "must be -1 (disables chunked prefill) or >= 1"),
        ("--model-path m --max-total-tokens 1000", "caps the KV pool"),
        ("--model-path m positional", "unrecognized arguments: positional"),
    ],
)
def test_sglang_rejects(argv: str, message: str) -> None:
    with pytest.raises(ArgsError) as err:
        SGLANG.parse(["python3", "-m", "sglang.launch_server", *argv.split()])
    assert message in str(err.value)


# --- TensorRT-LLM -------------------------------------------------------------------------------

OPTIONS = """
kv_cache_config:
  tokens_per_block: 64
  enable_block_reuse: false
  enable_partial_reuse: false
  host_cache_size: 4000000000
scheduler_config:
  capacity_scheduler_policy: MAX_UTILIZATION
return_perf_metrics: true
enable_iter_perf_stats: true
max_num_tokens: 4096
"""


def test_trtllm_real_command_with_options_file() -> None:
    argv = shlex.split(
        "trtllm-serve serve meta-llama/Llama-3.1-8B-Instruct --kv_cache_free_gpu_memory_fraction=0.75 "
        "--tp_size 2 --max_batch_size 64 --config /cfg/options.yaml --backend pytorch"
    )
    parsed = TRTLLM.parse(argv, {"/cfg/options.yaml": OPTIONS})
    assert parsed.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert parsed.config == KnobConfig(0.75, 64, False, "max_utilization", 4096, 64)
    assert parsed.tensor_parallel == 2
    assert parsed.options == {
        "tensor_parallel": 2,
        "max_running": 64,
        "max_batched_tokens": 4096,
        "partial_reuse": False,
        "host_cache_bytes": 4_000_000_000,
        "metrics": True,
    }
    assert parsed.extra_args == ("--backend", "pytorch")  # --max_batch_size: the running cap knob


def test_trtllm_without_options_file_uses_defaults() -> None:
    parsed = TRTLLM.parse(["trtllm-serve", "m"])
    assert parsed.config == KnobConfig(0.9, 32, True, "guaranteed_no_evict")
    assert parsed.options == {}


def test_trtllm_fraction_from_yaml() -> None:
    text = "kv_cache_config:\n  free_gpu_memory_fraction: 0.5\n"
    parsed = TRTLLM.parse(["trtllm-serve", "m", "--extra_llm_api_options", "/o.yaml"], {"/o.yaml": text})
    assert parsed.config.memory_fraction == 0.5


@pytest.mark.parametrize(
    ("extra", "yaml_text", "message"),
    [
        ([], "kv_cache_config:\n  tokens_per_block: 4\n", "block_size must be one of 8, 16, 32, 64, 128"),
        ([], "kv_cache_config:\n  tokens_per_blok: 32\n", "kv_cache_config.tokens_per_blok: unknown key"),
        ([], "kv_cache_config:\n  enable_block_reuse: 'yes'\n", "expected bool"),
        ([], "kv_cache_config:\n  max_tokens: 100\n", "caps the KV pool"),
        (
            [],
            "scheduler_config:\n  capacity_scheduler_policy: STATIC_BATCH\n",
            "schedule_policy must be one of",
        ),
        ([], "scheduler_config:\n  capacity_scheduler_policy: greedy\n", "choose from GUARANTEED_NO_EVICT"),
        ([], "frobnicate: 1\n", "options.frobnicate: unknown key"),
        ([], "- a\n- b\n", "must be a mapping"),
        ([], "a: [\n", "not valid YAML"),
        (["--max_batch_size", "8"], "max_batch_size: 16\n", "--max_batch_size is also set as max_batch_size"),
        (
            ["--free_gpu_memory_fraction", "0.5"],
            "kv_cache_config:\n  free_gpu_memory_fraction: 0.6\n",
            "set it in one place",
        ),
        (["--kv_cache_dtype", "nvfp4"], "{}\n", "choose from auto, fp8"),
        (["--enable_chunked_prefill=1"], "{}\n", "ignored explicit argument '1'"),
        (["--unknown_flag"], "{}\n", "unrecognized arguments: --unknown_flag"),
    ],
)
def test_trtllm_rejects(extra: list[str], yaml_text: str, message: str) -> None:
    argv = ["trtllm-serve", "m", "--extra_llm_api_options", "/o.yaml", *extra]
    with pytest.raises(ArgsError) as err:
        TRTLLM.parse(argv, {"/o.yaml": yaml_text})
    assert message in str(err.value)


def test_trtllm_missing_file_and_model() -> None:
    with pytest.raises(ArgsError, match=r"file /o\.yaml was not provided"):
        TRTLLM.parse(["trtllm-serve", "m", "--extra_llm_api_options", "/o.yaml"])
    with pytest.raises(ArgsError, match="missing argument 'MODEL'"):
        TRTLLM.parse(["trtllm-serve", "--port", "8000"])


def test_rendered_trtllm_options_file() -> None:
    rendered = TRTLLM.render("m", KnobConfig(0.8, 16, True, "max_utilization"))
    assert set(rendered.files) == {OPTIONS_PATH}
    import yaml

    document = yaml.safe_load(rendered.files[OPTIONS_PATH])
    assert document == {
        "kv_cache_config": {
            "free_gpu_memory_fraction": 0.8,
            "tokens_per_block": 16,
            "enable_block_reuse": True,
            "enable_partial_reuse": True,
        },
        "scheduler_config": {"capacity_scheduler_policy": "MAX_UTILIZATION"},
        "return_perf_metrics": True,
        "enable_iter_perf_stats": True,
    }
    assert rendered.argv[rendered.argv.index("--extra_llm_api_options") + 1] == OPTIONS_PATH

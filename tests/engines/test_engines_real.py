"""Facts checked against the real engines (issue 16): what a real vLLM 0.33 / SGLang 0.5.23 /
TensorRT-LLM pod accepts, refuses and defaults to. `make contract` runs the engines' own parsers."""

from __future__ import annotations

import pytest
import yaml

from prefixtune.api import validate_spec
from prefixtune.engines import get_adapter
from prefixtune.engines.base import ArgsError, KnobConfig
from prefixtune.engines.sglang import (
    SGLANG_ITL_BUCKETS,
    default_mem_fraction_static,
    itl_buckets,
    ttft_buckets,
)
from prefixtune.engines.trtllm import OPTIONS_PATH
from prefixtune.twin.catalog import get_gpu

M = "meta-llama/Llama-3.1-8B-Instruct"
VLLM, SGLANG, TRTLLM = (get_adapter(e) for e in ("vllm", "sglang", "trtllm"))


def _errors(**spec: object) -> list[str]:
    _, errors = validate_spec({"model": M, **spec})
    return [str(e) for e in errors]


# --- 3. TensorRT-LLM's memory fraction lives in the YAML ------------------------------------------


def test_trtllm_fraction_is_in_the_options_yaml_not_on_the_command_line() -> None:
    rendered = TRTLLM.render(M, KnobConfig(0.42, 64, True, "max_utilization"))
    assert not any("free_gpu_memory_fraction" in a for a in rendered.argv)
    kv = yaml.safe_load(rendered.files[OPTIONS_PATH])["kv_cache_config"]
    assert kv["free_gpu_memory_fraction"] == 0.42
    # A shallow merge replaces the CLI's whole KvCacheConfig with this section: the fraction survives.
    assert TRTLLM.parse(rendered.argv, rendered.files).config.memory_fraction == 0.42


# --- 7. configs the engine refuses at start -------------------------------------------------------


def test_sglang_priority_scheduling_allows_only_fcfs_and_lof() -> None:
    args = ["--enable-priority-scheduling"]
    assert SGLANG.allowed_choices(args) == {"schedule_policy": ("fcfs", "lof")}
    SGLANG.render(M, SGLANG.default_config().with_(schedule_policy="lof"), args)
    with pytest.raises(ArgsError, match="must be 'fcfs' or 'lof'"):
        SGLANG.render(M, SGLANG.default_config().with_(schedule_policy="lpm"), args)
    errors = _errors(engine="sglang", extraArgs=args, config={"schedulePolicy": "lpm"})
    assert any("config.schedulePolicy" in e and "allowed: fcfs, lof" in e for e in errors)
    errors = _errors(
        engine="sglang", extraArgs=args, tuning={"space": {"schedulePolicy": ["fcfs", "random"]}}
    )
    assert any("tuning.space.schedulePolicy[1]" in e for e in errors)


def test_sglang_priority_scheduling_narrows_the_search_space() -> None:
    from prefixtune.api import parse_spec
    from prefixtune.controller.settings import tuning_settings
    from prefixtune.tuning.space import build_space

    spec = parse_spec({"engine": "sglang", "model": M, "extraArgs": ["--enable-priority-scheduling"]})
    settings = tuning_settings(spec, "ns", "n")
    assert settings.space.schedule_policy == ("fcfs", "lof")
    space = build_space(SGLANG.knobs(), spec.knob_config(), SGLANG.normalize, settings.space)
    dimension = space.dimension("schedule_policy")
    assert dimension is not None and set(dimension.choices) == {"fcfs", "lof"}
    plain = parse_spec({"engine": "sglang", "model": M})
    assert tuning_settings(plain, "ns", "n").space.schedule_policy is None


@pytest.mark.parametrize(
    ("engine", "args", "needle"),
    [
        ("vllm", ["--quantization", "bitsandbytes"], "choose from"),
        ("vllm", ["--quantization=gguf"], "choose from"),
        ("sglang", ["--cuda-graph-max-bs", "64"], "--cuda-graph-max-bs-decode"),
        ("trtllm", ["--reasoning_parser", "deepseek_r1"], "deepseek-r1, qwen3, nano-v3"),
    ],
)
def test_extra_args_the_engine_refuses_at_start_are_refused_at_validation(
    engine: str, args: list[str], needle: str
) -> None:
    errors = _errors(engine=engine, extraArgs=args)
    assert any("extraArgs[0]" in e and needle in e for e in errors), errors


def test_trtllm_kv_cache_dtype_is_refused_on_a_1_2_image_only() -> None:
    old = _errors(
        engine="trtllm",
        image="nvcr.io/nvidia/tensorrt-llm/release:1.2.0",
        extraArgs=["--kv_cache_dtype", "fp8"],
    )
    assert any("extraArgs[0]" in e and "not a flag of trtllm-serve 1.2" in e for e in old), old
    assert _errors(engine="trtllm", extraArgs=["--kv_cache_dtype", "fp8"]) == []


@pytest.mark.parametrize(
    ("engine", "args"),
    [
        ("vllm", ["--disable-chunked-prefill"]),
        ("vllm", ["--quantization", "fp8"]),
        ("sglang", ["--cuda-graph-max-bs-decode", "64", "--cuda-graph-max-bs-prefill", "8192"]),
        ("trtllm", ["--reasoning_parser", "qwen3"]),
    ],
)
def test_spellings_the_engines_accept_are_accepted(engine: str, args: list[str]) -> None:
    assert _errors(engine=engine, extraArgs=args) == []


def test_vllm_api_key_with_several_values_parses_and_is_refused_only_as_a_secret() -> None:
    """vLLM takes ``--api-key a b`` (nargs="+"): the spelling parses (no complaint about ``b``), and
    the one refusal is the secrets rule's (issue #17: keys come from spec.apiKeySecret)."""
    errors = _errors(engine="vllm", extraArgs=["--api-key", "a", "b"])
    assert len(errors) == 1 and "spec.apiKeySecret" in errors[0], errors
    assert "'a'" not in errors[0] and "'b'" not in errors[0], errors  # the value is never quoted


def test_vllm_canonical_disable_prefix_caching_is_rendered_and_every_spelling_is_owned() -> None:
    rendered = VLLM.render(M, VLLM.default_config().with_(prefix_caching=False))
    assert "--disable-prefix-caching" in rendered.args
    assert "--no-enable-prefix-caching" not in rendered.args
    for spelling in ("--disable-prefix-caching", "--no-enable-prefix-caching", "--no-disable-prefix-caching"):
        assert spelling in VLLM.tuned_flags()
    on = VLLM.parse(["vllm", "serve", M, "--no-disable-prefix-caching"]).config.prefix_caching
    assert on is True


# --- 8. defaults and resolution --------------------------------------------------------------------


def test_sglang_default_memory_fraction_follows_its_own_rule_per_gpu() -> None:
    h100 = get_gpu("H100-80GB").memory_bytes
    h200 = get_gpu("H200").memory_bytes
    assert default_mem_fraction_static(h100) == pytest.approx(0.83, abs=0.005)
    assert default_mem_fraction_static(h200) == pytest.approx(0.90, abs=0.01)
    assert default_mem_fraction_static(h100, 4) < default_mem_fraction_static(h100, 1)
    from prefixtune.api import parse_spec
    from prefixtune.engines.sglang import REFERENCE_GPU_BYTES

    assert h100 == REFERENCE_GPU_BYTES  # the knob default is the rule on an H100, one fact
    on_h200 = parse_spec({"engine": "sglang", "model": M, "gpu": {"type": "H200"}})
    assert on_h200.knob_config().memory_fraction == default_mem_fraction_static(h200)
    given = parse_spec({"engine": "sglang", "model": M, "config": {"memoryFraction": 0.7}})
    assert given.knob_config().memory_fraction == 0.7


def test_sglang_ttft_buckets_resolve_sub_100ms_slos() -> None:
    rendered = SGLANG.render(M, SGLANG.default_config(), ttft_slo_s=0.05)
    args = list(rendered.args)
    i = args.index("--bucket-time-to-first-token")
    bounds = [
        float(a)
        for a in args[i + 1 : args.index("--", i) if "--" in args[i:] else None]
        if not a.startswith("-")
    ]
    assert 0.05 in bounds and min(bounds) < 0.05 and 0.1 in bounds and 400.0 in bounds
    assert SGLANG.parse(rendered.argv).options["ttft_buckets"] == ttft_buckets(0.05)
    assert "--bucket-time-to-first-token" in SGLANG.tuned_flags()  # the operator owns it


def test_sglang_itl_buckets_keep_sglangs_own_and_add_the_itl_target() -> None:
    rendered = SGLANG.render(M, SGLANG.default_config(), itl_slo_s=0.15)
    args = list(rendered.args)
    i = args.index("--bucket-inter-token-latency")
    bounds = []
    for a in args[i + 1 :]:
        if a.startswith("-"):
            break
        bounds.append(float(a))
    assert 0.15 in bounds and set(SGLANG_ITL_BUCKETS) <= set(bounds) and bounds == sorted(bounds)
    assert SGLANG.parse(rendered.argv).options["itl_buckets"] == itl_buckets(0.15)
    assert "--bucket-inter-token-latency" in SGLANG.tuned_flags()  # the operator owns it
    # a target already on a bound adds none
    assert itl_buckets(0.1) == tuple(float(b) for b in SGLANG_ITL_BUCKETS)


def test_sglang_hrrn_is_offered_and_falls_back_like_lpm() -> None:
    assert "hrrn" in SGLANG.knobs()["schedule_policy"].choices
    off = SGLANG.normalize(KnobConfig(0.8, 1, False, "hrrn"))
    assert off.schedule_policy == "fcfs"


def test_sglang_renders_sglang_serve_and_still_reads_launch_server() -> None:
    rendered = SGLANG.render(M, SGLANG.default_config())
    assert rendered.command == ("sglang", "serve")
    old = ["python3", "-m", "sglang.launch_server", "--model-path", M, "--page-size", "16"]
    assert SGLANG.parse(old).config.block_size == 16


# --- 1. TensorRT-LLM release series ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("nvcr.io/nvidia/tensorrt-llm/release:1.2.0", "1.2"),
        ("nvcr.io/nvidia/tensorrt-llm/release:1.2.1", "1.2"),
        ("nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24", "1.3"),
        ("registry.local:5000/trt:custom", "1.3"),
    ],
)
def test_trtllm_version_of_image(image: str, version: str) -> None:
    assert TRTLLM.version_of(image) == version


def test_trtllm_default_image_is_a_release_whose_metrics_the_recipe_reads() -> None:
    version = TRTLLM.version_of(TRTLLM.default_image)
    names = TRTLLM.metrics_for(version)
    assert names.hit_numerator and names.hit_miss and names.generation_tokens and names.config_info
    old = TRTLLM.metrics_for("1.2")
    assert old.ttft and old.itl and old.e2e and old.requests_finished
    assert not (old.hit_numerator or old.generation_tokens or old.requests_waiting or old.config_info)

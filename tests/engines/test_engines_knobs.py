"""Knob specs, defaults, validation, normalize(), tuned flags and the registry."""

from __future__ import annotations

import pytest

from prefixtune.engines import (
    ArgsError,
    EngineAdapter,
    EngineName,
    KnobConfig,
    extra_args_errors,
    get_adapter,
    owned_args,
)
from prefixtune.engines._argv import looks_like_flag
from prefixtune.engines.base import KNOB_NAMES

ENGINES = ("vllm", "sglang", "trtllm")


def test_get_adapter_by_name_and_enum() -> None:
    for engine in ENGINES:
        adapter = get_adapter(engine)
        assert isinstance(adapter, EngineAdapter)
        assert adapter.name == EngineName(engine)
        assert get_adapter(EngineName(engine)) is adapter
    assert get_adapter(" VLLM ") is get_adapter("vllm")


def test_get_adapter_unknown_lists_known_engines() -> None:
    with pytest.raises(ValueError, match=r"unknown engine 'tgi'; known engines: vllm, sglang, trtllm"):
        get_adapter("tgi")


@pytest.mark.parametrize(
    ("engine", "default", "blocks", "policies", "port", "path"),
    [
        (
            "vllm",
            KnobConfig(0.92, 16, True, "fcfs"),
            (16, 32, 64, 128),
            ("fcfs", "priority"),
            8000,
            "/metrics",
        ),
        (
            "sglang",
            KnobConfig(0.828, 1, True, "fcfs"),  # SGLang's own rule on an H100-80GB, TP 1
            (1, 16, 32, 64, 128),
            ("fcfs", "lpm", "dfs-weight", "hrrn", "lof", "random"),
            30000,
            "/metrics",
        ),
        (
            "trtllm",
            KnobConfig(0.9, 32, True, "guaranteed_no_evict"),
            (8, 16, 32, 64, 128),
            ("guaranteed_no_evict", "max_utilization"),
            8000,
            "/prometheus/metrics",
        ),
    ],
)
def test_knobs_and_defaults(
    engine: str, default: KnobConfig, blocks: tuple[int, ...], policies: tuple[str, ...], port: int, path: str
) -> None:
    adapter = get_adapter(engine)
    knobs = adapter.knobs()
    assert tuple(knobs) == KNOB_NAMES
    assert adapter.default_config() == default
    assert knobs["block_size"].choices == blocks
    assert knobs["schedule_policy"].choices == policies
    assert knobs["prefix_caching"].choices == (True, False)
    fraction = knobs["memory_fraction"]
    assert (fraction.low, fraction.high, fraction.low_exclusive) == (0.0, 1.0, True)
    assert adapter.validate(default) == []
    assert adapter.metrics_port == port
    assert adapter.metrics_path == path
    assert adapter.health_path == "/health"
    assert adapter.default_image


def test_vllm_priority_is_not_searched_and_sglang_never_offers_priority() -> None:
    assert get_adapter("vllm").knobs()["schedule_policy"].searched is False
    assert "priority" not in get_adapter("sglang").knobs()["schedule_policy"].choices


def test_validate_names_each_bad_knob() -> None:
    adapter = get_adapter("sglang")
    errors = adapter.validate(KnobConfig(1.2, 8, True, "priority"))
    assert [knob for knob, _ in errors] == ["memory_fraction", "block_size", "schedule_policy"]
    messages = dict(errors)
    assert "must be in (0.0, 1.0], got 1.2" in messages["memory_fraction"]
    assert "must be one of 1, 16, 32, 64, 128; got 8" in messages["block_size"]
    assert "must be one of fcfs, lpm, dfs-weight, hrrn, lof, random" in messages["schedule_policy"]


def test_render_refuses_an_invalid_config() -> None:
    with pytest.raises(ArgsError, match="block_size must be one of 16, 32, 64, 128; got 24"):
        get_adapter("vllm").render("m", KnobConfig(0.9, 24, True, "fcfs"))
    with pytest.raises(ArgsError, match="model must be a non-empty name"):
        get_adapter("vllm").render("", get_adapter("vllm").default_config())
    with pytest.raises(ArgsError, match="tensor_parallel must be an integer >= 1"):
        get_adapter("sglang").render("m", get_adapter("sglang").default_config(), tensor_parallel=0)


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight"])
def test_sglang_normalize_cache_aware_policy_without_cache_is_fcfs(policy: str) -> None:
    adapter = get_adapter("sglang")
    assert adapter.normalize(KnobConfig(0.8, 16, False, policy)) == KnobConfig(0.8, 16, False, "fcfs")
    # with the cache on, the policy matters
    assert adapter.normalize(KnobConfig(0.8, 16, True, policy)) == KnobConfig(0.8, 16, True, policy)


@pytest.mark.parametrize("policy", ["lof", "random", "fcfs"])
def test_sglang_normalize_keeps_policies_that_ignore_the_cache(policy: str) -> None:
    config = KnobConfig(0.8, 64, False, policy)
    assert get_adapter("sglang").normalize(config) == config


def test_normalize_keeps_block_size_and_other_engines_unchanged() -> None:
    vllm = get_adapter("vllm")
    trt = get_adapter("trtllm")
    for config in (KnobConfig(0.9, 128, False, "priority"), KnobConfig(0.5, 32, True, "fcfs")):
        assert vllm.normalize(config) == config
    config = KnobConfig(0.7, 8, False, "max_utilization")
    assert trt.normalize(config) == config


def test_normalize_is_idempotent_and_valid_over_the_categorical_space() -> None:
    for engine in ENGINES:
        adapter = get_adapter(engine)
        knobs = adapter.knobs()
        for block in knobs["block_size"].choices:
            for caching in knobs["prefix_caching"].choices:
                for policy in knobs["schedule_policy"].choices:
                    config = KnobConfig.from_dict(
                        {
                            "memory_fraction": 0.8,
                            "block_size": block,
                            "prefix_caching": caching,
                            "schedule_policy": policy,
                        }
                    )
                    once = adapter.normalize(config)
                    assert adapter.normalize(once) == once
                    assert adapter.validate(once) == []


def test_normalize_returns_plain_python_types() -> None:
    import numpy as np

    adapter = get_adapter("vllm")
    config = KnobConfig(np.float64(0.8), np.int64(32), np.bool_(True), np.str_("fcfs"))  # type: ignore[arg-type]
    normal = adapter.normalize(config)
    assert type(normal.memory_fraction) is float
    assert type(normal.block_size) is int
    assert type(normal.prefix_caching) is bool
    assert type(normal.schedule_policy) is str
    assert adapter.validate(config) == []  # numpy scalars from the optimizer are valid values
    assert adapter.parse(adapter.render("m", config).argv).config == normal


EXPECTED_OWNED = {
    "vllm": {
        "--gpu-memory-utilization",
        "--device-memory-utilization",
        "--block-size",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--scheduling-policy",
        "--tensor-parallel-size",
        "-tp",
        "--port",
        "--host",
        "--model",
        "--gpu_memory_utilization",
        "--block_size",
    },
    "sglang": {
        "--mem-fraction-static",
        "--page-size",
        "--disable-radix-cache",
        "--schedule-policy",
        "--enable-metrics",
        "--tp-size",
        "--tensor-parallel-size",
        "--port",
        "--host",
        "--model-path",
        "--model",
        "--max-total-tokens",
    },
    "trtllm": {
        "--free_gpu_memory_fraction",
        "--kv_cache_free_gpu_memory_fraction",
        "--extra_llm_api_options",
        "--config",
        "--tp_size",
        "--port",
        "--host",
    },
}


@pytest.mark.parametrize("engine", ENGINES)
def test_tuned_flags_cover_every_flag_the_operator_renders(engine: str) -> None:
    adapter = get_adapter(engine)
    owned = adapter.tuned_flags()
    assert EXPECTED_OWNED[engine] <= owned
    rendered = adapter.render("m", adapter.default_config(), tensor_parallel=2)
    for token in rendered.args:
        if looks_like_flag(token):
            assert token in owned, token
    # the prefix-caching-off spelling too
    config = adapter.default_config().with_(prefix_caching=False)
    for token in adapter.render("m", config).args:
        if looks_like_flag(token):
            assert token in owned, token


@pytest.mark.parametrize("engine", ENGINES)
def test_extra_args_may_not_set_any_owned_flag_in_either_form(engine: str) -> None:
    adapter = get_adapter(engine)
    for flag in sorted(adapter.tuned_flags()):
        for args in ([flag, "1"], [f"{flag}=1"], [flag]):
            assert owned_args(engine, args) == [args[0]], args
            errors = extra_args_errors(engine, args)
            assert errors and "may not set" in errors[0], args
            with pytest.raises(ArgsError, match="may not set"):
                adapter.render("m", adapter.default_config(), args)


def test_extra_args_errors_for_unknown_flags_and_bad_values() -> None:
    assert extra_args_errors("vllm", ["--max-model-len", "4096", "--enforce-eager"]) == []
    assert extra_args_errors("vllm", ["--bogus"]) == ["vllm: extraArgs: unrecognized arguments: --bogus"]
    assert "invalid value 'x'" in extra_args_errors("sglang", ["--context-length", "x"])[0]
    assert "unrecognized arguments: stray" in extra_args_errors("trtllm", ["stray"])[0]
    assert extra_args_errors("trtllm", ["--max_seq_len=32"]) == []

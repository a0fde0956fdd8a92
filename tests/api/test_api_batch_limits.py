"""spec.config / spec.tuning.space for the batch limits (maxBatchedTokens, maxRunning): validation,
defaults for the resource's GPU, owned flags, and configs recorded before the knobs existed."""

from __future__ import annotations

from typing import Any

import pytest

from prefixtune.api.models import KnobValues
from prefixtune.api.validation import FieldError, validate_spec
from prefixtune.engines.base import MAX_BATCHED_TOKENS, MAX_RUNNING

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _validate(engine: str, **fields: Any) -> tuple[Any, list[FieldError]]:
    return validate_spec({"engine": engine, "model": MODEL, **fields})


def _paths(errors: list[FieldError]) -> list[str]:
    return [e.path for e in errors]


@pytest.mark.parametrize(
    ("gpu", "engine", "tokens", "running"),
    [
        ("H100-80GB", "vllm", 8192, 1024),
        ("A100-80GB", "vllm", 2048, 256),
        ("H200", "sglang", 8192, 0),
        ("H100-80GB", "trtllm", 8192, 2048),
    ],
)
def test_omitted_batch_limits_take_the_engines_default_for_the_gpu(
    gpu: str, engine: str, tokens: int, running: int
) -> None:
    spec, errors = _validate(engine, gpu={"type": gpu})
    assert errors == [] and spec is not None
    assert (spec.config.max_batched_tokens, spec.config.max_running) == (tokens, running)


def test_on_a_gpu_the_twin_does_not_model_the_batch_limits_stay_with_the_engine() -> None:
    spec, errors = _validate("vllm", gpu={"type": "MI300X"})
    assert errors == [] and spec is not None
    assert (spec.config.max_batched_tokens, spec.config.max_running) == (0, 0)


def test_a_token_budget_below_the_running_cap_is_refused_on_vllm() -> None:
    _, errors = _validate("vllm", config={"maxBatchedTokens": 512, "maxRunning": 1024})
    assert _paths(errors) == ["spec.config.maxBatchedTokens"]
    assert "max_batched_tokens (512) must be >= max_running (1024)" in errors[0].message
    spec, errors = _validate("vllm", config={"maxBatchedTokens": 512, "maxRunning": 256})
    assert errors == [] and spec is not None


def test_a_small_vllm_budget_alone_takes_a_running_cap_vllm_would_start_with() -> None:
    # the H100 default cap is 1024; vLLM lowers an unset max_num_seqs to the budget (arg_utils.py)
    spec, errors = _validate("vllm", config={"maxBatchedTokens": 512})
    assert errors == [] and spec is not None


def test_the_same_pair_starts_on_sglang() -> None:
    spec, errors = _validate("sglang", config={"maxBatchedTokens": 512, "maxRunning": 1024})
    assert errors == [] and spec is not None


def test_a_space_that_could_try_a_budget_below_the_cap_is_refused() -> None:
    _, errors = _validate("vllm", tuning={"space": {"maxBatchedTokens": [512, 4096], "maxRunning": [256]}})
    assert errors == []  # 512 >= 256: every combination starts
    _, errors = _validate("vllm", tuning={"space": {"maxBatchedTokens": [512, 4096], "maxRunning": [1024]}})
    assert _paths(errors) == ["spec.tuning.space.maxBatchedTokens"]
    assert (
        "maxBatchedTokens 512, maxRunning 1024" in errors[0].message
        and "narrow the space" in errors[0].message
    )


@pytest.mark.parametrize(
    ("engine", "config", "path", "fragment"),
    [
        ("vllm", {"maxRunning": -3}, "spec.config.maxRunning", "allowed: an integer in [0, 65536]"),
        ("vllm", {"maxBatchedTokens": -1}, "spec.config.maxBatchedTokens", "an integer in [1, 1048576]"),
        ("trtllm", {"maxBatchedTokens": 2**21}, "spec.config.maxBatchedTokens", "[-1, 1048576]"),
    ],
)
def test_a_batch_limit_out_of_range_is_refused_with_the_range(
    engine: str, config: dict[str, int], path: str, fragment: str
) -> None:
    _, errors = _validate(engine, config=config)
    assert _paths(errors) == [path]
    assert fragment in errors[0].message


def test_sglang_accepts_chunking_off_as_a_token_budget() -> None:
    spec, errors = _validate("sglang", config={"maxBatchedTokens": -1})
    assert errors == [] and spec is not None
    assert spec.knob_config().max_batched_tokens == -1


def test_the_sglang_memory_fraction_default_follows_a_pinned_chunk() -> None:
    default, _ = _validate("sglang")
    larger, _ = _validate("sglang", config={"maxBatchedTokens": 16384})
    assert larger.config.memory_fraction < default.config.memory_fraction


@pytest.mark.parametrize(
    ("engine", "flag", "field"),
    [
        ("vllm", "--max-num-batched-tokens", "maxBatchedTokens"),
        ("vllm", "--max_num_seqs", "maxRunning"),
        ("sglang", "--chunked-prefill-size", "maxBatchedTokens"),
        ("sglang", "--max-running-requests", "maxRunning"),
        ("trtllm", "--max_num_tokens", "maxBatchedTokens"),
        ("trtllm", "--max_batch_size", "maxRunning"),
    ],
)
def test_extra_args_that_set_a_batch_limit_are_refused_like_any_tuned_flag(
    engine: str, flag: str, field: str
) -> None:
    _, errors = _validate(engine, extraArgs=[flag, "64"])
    assert _paths(errors) == ["spec.extraArgs[0]"]
    assert "a flag the operator owns" in errors[0].message
    assert f"use spec.config.{field} (and spec.tuning.space.{field}) instead" in errors[0].message


def test_vllm_with_chunked_prefill_off_leaves_the_budget_to_the_engine() -> None:
    unchunked = ["--no-enable-chunked-prefill", "--max-model-len", "32768"]
    spec, errors = _validate("vllm", extraArgs=unchunked)
    assert errors == [] and spec is not None
    assert spec.config.max_batched_tokens == 0  # vLLM raises it to max_model_len itself
    _, errors = _validate("vllm", extraArgs=unchunked, config={"maxBatchedTokens": 8192})
    assert _paths(errors) == ["spec.config.maxBatchedTokens"]
    assert "allowed: 32768 to 1048576, or 0" in errors[0].message
    spec, errors = _validate("vllm", extraArgs=unchunked, config={"maxBatchedTokens": 32768})
    assert errors == [] and spec is not None


def test_listed_batch_limits_are_searched() -> None:
    spec, errors = _validate(
        "sglang", tuning={"space": {"maxBatchedTokens": [2048, 8192], "maxRunning": [64]}}
    )
    assert errors == [] and spec is not None
    space = spec.search_space()
    assert space[MAX_BATCHED_TOKENS].searched and space[MAX_BATCHED_TOKENS].choices == (2048, 8192)
    assert space[MAX_RUNNING].searched and space[MAX_RUNNING].choices == (64,)
    spec, _ = _validate("sglang")
    assert not spec.search_space()[MAX_BATCHED_TOKENS].searched


def test_a_trial_recorded_before_the_batch_limits_reads_with_the_engine_defaults() -> None:
    old = {"memoryFraction": 0.9, "blockSize": 16, "prefixCaching": True, "schedulePolicy": "fcfs"}
    config = KnobValues.model_validate(old).to_knob_config()
    assert (config.max_batched_tokens, config.max_running) == (0, 0)

"""validate_spec: every bad input gets a path and a message that names what is allowed.

Each case also says whether the CRD's structural schema (without CEL) must reject it too: where it
must, the generated CRD and the models are checked to agree.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema
import pytest

from prefixtune.api.crd import build_crd
from prefixtune.api.schema import openapi_to_jsonschema
from prefixtune.api.validation import FieldError, SpecError, parse_spec, validate_resource, validate_spec

BASE: dict[str, dict[str, Any]] = {
    "vllm": {"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct"},
    "sglang": {"engine": "sglang", "model": "meta-llama/Llama-3.1-8B-Instruct"},
    "trtllm": {"engine": "trtllm", "model": "meta-llama/Llama-3.3-70B-Instruct"},
}


def _with(base: str, /, **fields: Any) -> dict[str, Any]:
    return {**BASE[base], **fields}


def _without(key: str) -> dict[str, Any]:
    return {k: v for k, v in BASE["vllm"].items() if k != key}


# (id, raw spec, expected error path, fragments the message must contain, structural schema rejects)
CASES: list[tuple[str, dict[str, Any], str, tuple[str, ...], bool]] = [
    ("unknown-engine", _with("vllm", engine="tgi"), "spec.engine", ("'tgi'", "vllm, sglang, trtllm"), True),
    ("missing-engine", _without("engine"), "spec.engine", ("required", "vllm, sglang, trtllm"), True),
    ("missing-model", _without("model"), "spec.model", ("required",), True),
    ("empty-model", _with("vllm", model=""), "spec.model", ("non-empty",), True),
    ("flag-as-model", _with("vllm", model="--help"), "spec.model", ("may not start with '-'",), True),
    (
        "fraction-zero",
        _with("vllm", config={"memoryFraction": 0}),
        "spec.config.memoryFraction",
        ("(0, 1]",),
        True,
    ),
    (
        "fraction-high",
        _with("vllm", config={"memoryFraction": 1.2}),
        "spec.config.memoryFraction",
        ("(0, 1]",),
        True,
    ),
    (
        "vllm-block-17",
        _with("vllm", config={"blockSize": 17}),
        "spec.config.blockSize",
        ("17 is not supported by vllm", "allowed: 16, 32, 64, 128"),
        False,
    ),
    (
        "sglang-block-8",
        _with("sglang", config={"blockSize": 8}),
        "spec.config.blockSize",
        ("sglang", "allowed: 1, 16, 32, 64, 128"),
        False,
    ),
    (
        "sglang-priority",
        _with("sglang", config={"schedulePolicy": "priority"}),
        "spec.config.schedulePolicy",
        ("'priority' is not supported by sglang", "fcfs, lpm, dfs-weight, hrrn, lof, random"),
        False,
    ),
    (
        "vllm-lpm",
        _with("vllm", config={"schedulePolicy": "lpm"}),
        "spec.config.schedulePolicy",
        ("vllm", "allowed: fcfs, priority"),
        False,
    ),
    (
        "trtllm-policy",
        _with("trtllm", config={"schedulePolicy": "fcfs"}),
        "spec.config.schedulePolicy",
        ("trtllm", "guaranteed_no_evict, max_utilization"),
        False,
    ),
    (
        "typo-blocksize",
        _with("vllm", config={"blocksize": 16}),
        "spec.config.blocksize",
        ("unknown field 'blocksize'", "did you mean 'blockSize'", "memoryFraction"),
        True,
    ),
    ("typo-top-level", _with("vllm", replica=2), "spec.replica", ("did you mean 'replicas'",), True),
    (
        "typo-slo",
        _with("vllm", tuning={"slo": {"ttftp99": "2s"}}),
        "spec.tuning.slo.ttftp99",
        ("did you mean 'ttftP99'", "itlP99"),
        True,
    ),
    (
        "caching-not-bool",
        _with("vllm", config={"prefixCaching": "yes"}),
        "spec.config.prefixCaching",
        ("true or false", "'yes'"),
        True,
    ),
    (
        "space-min-ge-max",
        _with("vllm", tuning={"space": {"memoryFraction": {"min": 0.9, "max": 0.8}}}),
        "spec.tuning.space.memoryFraction",
        ("min (0.9) must be less than max (0.8)", "(0.0, 1.0]"),
        False,
    ),
    (
        "space-max-out-of-range",
        _with("vllm", tuning={"space": {"memoryFraction": {"min": 0.5, "max": 1.5}}}),
        "spec.tuning.space.memoryFraction.max",
        ("(0, 1]",),
        True,
    ),
    (
        "space-missing-max",
        _with("vllm", tuning={"space": {"memoryFraction": {"min": 0.5}}}),
        "spec.tuning.space.memoryFraction.max",
        ("required",),
        True,
    ),
    (
        "space-block-not-supported",
        _with("trtllm", tuning={"space": {"blockSize": [16, 24]}}),
        "spec.tuning.space.blockSize[1]",
        ("24 is not supported by trtllm", "8, 16, 32, 64, 128"),
        False,
    ),
    (
        "space-block-duplicate",
        _with("vllm", tuning={"space": {"blockSize": [16, 16]}}),
        "spec.tuning.space.blockSize[1]",
        ("duplicate value 16",),
        False,
    ),
    (
        "space-empty-list",
        _with("vllm", tuning={"space": {"blockSize": []}}),
        "spec.tuning.space.blockSize",
        ("at least 1",),
        True,
    ),
    (
        "space-policy-not-supported",
        _with("sglang", tuning={"space": {"schedulePolicy": ["fcfs", "priority"]}}),
        "spec.tuning.space.schedulePolicy[1]",
        ("sglang", "fcfs, lpm, dfs-weight, hrrn, lof, random"),
        False,
    ),
    (
        "vllm-tuned-flag",
        _with("vllm", extraArgs=["--max-model-len", "8192", "--block-size=32"]),
        "spec.extraArgs[2]",
        ("--block-size", "spec.config.blockSize"),
        False,
    ),
    (
        "vllm-tuned-flag-alias",
        _with("vllm", extraArgs=["--device-memory-utilization", "0.5"]),
        "spec.extraArgs[0]",
        ("--device-memory-utilization", "spec.config.memoryFraction"),
        False,
    ),
    (
        "vllm-underscore-spelling",
        _with("vllm", extraArgs=["--enable_prefix_caching"]),
        "spec.extraArgs[0]",
        ("--enable_prefix_caching", "spec.config.prefixCaching"),
        False,
    ),
    (
        "sglang-tuned-flag",
        _with("sglang", extraArgs=["--page-size", "16"]),
        "spec.extraArgs[0]",
        ("--page-size", "spec.config.blockSize"),
        False,
    ),
    (
        "sglang-abbreviation",
        _with("sglang", extraArgs=["--mem-frac", "0.8"]),
        "spec.extraArgs[0]",
        ("abbreviates --mem-fraction-static", "spec.config.memoryFraction"),
        False,
    ),
    (
        "trtllm-tuned-flag",
        _with("trtllm", extraArgs=["--free_gpu_memory_fraction=0.5"]),
        "spec.extraArgs[0]",
        ("--free_gpu_memory_fraction", "spec.config.memoryFraction"),
        False,
    ),
    (
        "tensor-parallel-flag",
        _with("trtllm", extraArgs=["--tp_size", "2"]),
        "spec.extraArgs[0]",
        ("--tp_size", "spec.gpu.count"),
        False,
    ),
    (
        "shell-semicolon",
        _with("vllm", extraArgs=["--seed", "1; rm -rf /"]),
        "spec.extraArgs[1]",
        ("';'", "; | & ` $ ( ) < > newline"),
        True,
    ),
    ("shell-subst", _with("vllm", extraArgs=["$(id)"]), "spec.extraArgs[0]", ("'$'", "'('"), True),
    ("shell-newline", _with("vllm", extraArgs=["a\nb"]), "spec.extraArgs[0]", ("newline",), True),
    (
        "too-many-args",
        _with("vllm", extraArgs=["--seed"] * 65),
        "spec.extraArgs",
        ("65 items", "at most 64"),
        True,
    ),
    ("arg-too-long", _with("vllm", extraArgs=["x" * 1025]), "spec.extraArgs[0]", ("1025", "1024"), True),
    (
        "bad-duration",
        _with("vllm", tuning={"slo": {"ttftP99": "2 seconds"}}),
        "spec.tuning.slo.ttftP99",
        ('"150ms", "2s", "1m30s"',),
        True,
    ),
    (
        "number-duration",
        _with("vllm", tuning={"trial": {"warmup": 180}}),
        "spec.tuning.trial.warmup",
        ('"150ms", "2s", "1m30s"',),
        True,
    ),
    (
        "zero-slo",
        _with("vllm", tuning={"slo": {"itlP99": "0ms"}}),
        "spec.tuning.slo.itlP99",
        ("positive duration", '"150ms"'),
        False,
    ),
    ("replicas-zero", _with("vllm", replicas=0), "spec.replicas", ("an integer in [1, 1000]",), True),
    ("replicas-string", _with("vllm", replicas="2"), "spec.replicas", ("an integer", "'2'"), True),
    ("gpu-count-high", _with("vllm", gpu={"count": 9}), "spec.gpu.count", ("an integer in [1, 8]",), True),
    ("gpu-count-zero", _with("vllm", gpu={"count": 0}), "spec.gpu.count", ("an integer in [1, 8]",), True),
    (
        "gpu-type",
        _with("vllm", gpu={"type": "H100 80GB"}),
        "spec.gpu.type",
        ("'H100 80GB' does not match the required form",),
        True,
    ),
    (
        "canary-one-replica",
        _with("vllm", replicas=1, tuning={"rollout": {"strategy": "canary"}}),
        "spec.tuning.rollout.strategy",
        ("replicas >= 2", "rolling"),
        False,
    ),
    (
        "url-with-query",
        _with("vllm", tuning={"metrics": {"source": "prometheus", "url": "http://10.0.0.1/admin?x="}}),
        "spec.tuning.metrics.url",
        ("?query", "http://"),
        False,
    ),
    (
        "url-not-http",
        _with("vllm", tuning={"metrics": {"source": "prometheus", "url": "ftp://prom"}}),
        "spec.tuning.metrics.url",
        ("http(s)",),
        True,
    ),
    ("bad-mode", _with("vllm", tuning={"mode": "manual"}), "spec.tuning.mode", ("off, observe, auto",), True),
    (
        "bad-objective",
        _with("vllm", tuning={"objective": "latency"}),
        "spec.tuning.objective",
        ("goodput, throughput, ttft",),
        True,
    ),
    (
        "budget-high",
        _with("vllm", tuning={"budget": {"maxTrials": 500}}),
        "spec.tuning.budget.maxTrials",
        ("[1, 200]",),
        True,
    ),
    (
        "drift-zero",
        _with("vllm", tuning={"drift": {"threshold": 0}}),
        "spec.tuning.drift.threshold",
        ("(0, 1]",),
        True,
    ),
    (
        "min-gain-negative",
        _with("vllm", tuning={"minGain": -0.05}),
        "spec.tuning.minGain",
        ("[0, 1]",),
        True,
    ),
    (
        "confidence-below-half",
        _with("vllm", tuning={"confidence": 0.3}),
        "spec.tuning.confidence",
        ("[0.5, 1)",),
        True,
    ),
    (
        "confidence-certain",
        _with("vllm", tuning={"confidence": 1.0}),
        "spec.tuning.confidence",
        ("[0.5, 1)",),
        True,
    ),
    (
        "bad-strategy",
        _with("vllm", tuning={"rollout": {"strategy": "blue-green"}}),
        "spec.tuning.rollout.strategy",
        ("canary, rolling",),
        True,
    ),
]


@pytest.mark.parametrize(("raw", "path", "fragments"), [c[1:4] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_spec_is_reported(raw: dict[str, Any], path: str, fragments: tuple[str, ...]) -> None:
    spec, errors = validate_spec(raw)
    assert spec is None
    by_path = {e.path: e.message for e in errors}
    assert path in by_path, f"expected an error at {path}, got {errors}"
    for fragment in fragments:
        assert fragment in by_path[path], f"{fragment!r} not in {by_path[path]!r}"
    for error in errors:
        # Pydantic's own wording never leaks through.
        assert "Input should" not in error.message and "pydantic" not in error.message.lower()


def test_at_least_twenty_cases() -> None:
    assert len(CASES) >= 20


@cache
def _spec_jsonschema() -> dict[str, Any]:
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema = openapi_to_jsonschema(root["properties"]["spec"], forbid_unknown=True)
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


@pytest.mark.parametrize("raw", [c[1] for c in CASES if c[4]], ids=[c[0] for c in CASES if c[4]])
def test_crd_schema_rejects_structural_problems_too(raw: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(_spec_jsonschema())
    assert list(validator.iter_errors(raw)), "the CRD schema accepts what the models reject"


@pytest.mark.parametrize("engine", sorted(BASE))
def test_crd_schema_accepts_minimal_spec(engine: str) -> None:
    jsonschema.Draft202012Validator(_spec_jsonschema()).validate(BASE[engine])


def test_all_errors_are_reported_at_once() -> None:
    _, errors = validate_spec(
        _with("vllm", replicas=0, gpu={"type": "T4/x", "count": 20}, tuning={"mode": "x"})
    )
    assert {e.path for e in errors} == {
        "spec.replicas",
        "spec.gpu.type",
        "spec.gpu.count",
        "spec.tuning.mode",
    }


def test_rule_problems_are_all_reported_at_once() -> None:
    raw = _with(
        "vllm",
        config={"blockSize": 17},
        extraArgs=["--block-size", "32"],
        tuning={"space": {"blockSize": [24]}, "metrics": {"url": "http://a:b@prom:9090"}},
    )
    _, errors = validate_spec(raw)
    assert [e.path for e in errors] == [
        "spec.config.blockSize",
        "spec.tuning.space.blockSize[0]",
        "spec.extraArgs[0]",
        "spec.tuning.metrics.url",
    ]


def test_values_after_a_flag_are_not_flags() -> None:
    # "-1" is the value of a flag (a seed here); nothing here is owned.
    spec, errors = validate_spec(
        _with("sglang", extraArgs=["--random-seed", "-1", "--cuda-graph-max-bs-decode", "8"])
    )
    assert errors == [] and spec is not None


def test_not_a_mapping() -> None:
    assert validate_spec(["engine", "vllm"]) == (
        None,
        [FieldError("spec", "must be an object (a mapping), got list")],
    )


def test_parse_spec_raises_all_errors() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(_with("vllm", replicas=0, config={"blockSize": 17}))
    assert str(info.value).splitlines() == [str(e) for e in info.value.errors]
    assert [e.path for e in info.value.errors] == ["spec.replicas"]


def test_resource_paths_and_kind() -> None:
    raw = {
        "apiVersion": "prefixtune.io/v1",
        "kind": "ServingDeployment",
        "spec": _with("vllm", config={"blockSize": 17}),
    }
    _, errors = validate_resource(raw)
    assert [e.path for e in errors] == ["apiVersion", "spec.config.blockSize"]
    assert "prefixtune.io/v1alpha1" in errors[0].message
    raw["apiVersion"] = "prefixtune.io/v1alpha1"
    _, errors = validate_resource(raw)
    assert [str(e) for e in errors] == [
        "spec.config.blockSize: 17 is not supported by vllm; allowed: 16, 32, 64, 128"
    ]

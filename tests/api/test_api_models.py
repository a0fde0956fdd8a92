"""The ServingDeployment models: defaults, aliases, round trips, KnobConfig helpers, status."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from prefixtune.api.models import (
    API_GROUP,
    API_VERSION,
    GROUP_VERSION,
    ConfigSpec,
    KnobValues,
    Phase,
    RolloutStrategy,
    ServingDeployment,
    ServingDeploymentSpec,
    ServingDeploymentStatus,
)
from prefixtune.api.validation import validate_resource, validate_spec
from prefixtune.engines import get_adapter
from prefixtune.engines.base import EngineName, KnobConfig


def _spec(**fields: Any) -> ServingDeploymentSpec:
    spec, errors = validate_spec({"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", **fields})
    assert errors == [], errors
    assert spec is not None
    return spec


def test_group_version_constants_agree() -> None:
    assert f"{API_GROUP}/{API_VERSION}" == GROUP_VERSION


# The engines' own batch limits on the default GPU (an H100-80GB): (token budget, running cap); SGLang
# derives its running cap from the KV pool at start (0: not rendered).
H100_BATCH_LIMITS = {
    EngineName.VLLM: (8192, 1024),
    EngineName.SGLANG: (8192, 0),
    EngineName.TRTLLM: (8192, 2048),
}


@pytest.mark.parametrize("engine", list(EngineName))
def test_defaults_filled_in_from_the_adapter(engine: EngineName) -> None:
    adapter = get_adapter(engine)
    spec, errors = validate_spec({"engine": engine.value, "model": "m"})
    assert errors == [] and spec is not None
    assert spec.image == adapter.default_image
    tokens, running = H100_BATCH_LIMITS[engine]
    filled = adapter.default_config().with_(max_batched_tokens=tokens, max_running=running)
    assert spec.knob_config() == filled
    assert spec.replicas == 1
    assert (spec.gpu.count, spec.gpu.type) == (1, "H100-80GB")
    assert spec.extra_args == []
    tuning = spec.tuning
    assert (tuning.mode.value, tuning.objective.value) == ("auto", "goodput")
    assert (tuning.slo.ttft_p99, tuning.slo.itl_p99) == (2.0, 0.15)
    assert (tuning.trial.warmup, tuning.trial.measure, tuning.trial.min_requests) == (180.0, 600.0, 300)
    assert tuning.budget.max_trials == 20
    assert tuning.rollout.strategy is RolloutStrategy.ROLLING  # one replica
    assert tuning.rollout.min_interval == 900.0
    assert tuning.drift.threshold == 0.25
    assert (tuning.metrics.source.value, tuning.metrics.url) == ("scrape", None)
    # Serialised form: camelCase and duration strings.
    data = spec.to_dict()
    assert data["tuning"]["slo"] == {"ttftP99": "2s", "itlP99": "150ms"}
    assert data["tuning"]["trial"] == {"warmup": "3m", "measure": "10m", "minRequests": 300}
    assert data["config"] == {
        "memoryFraction": adapter.default_config().memory_fraction,
        "blockSize": adapter.default_config().block_size,
        "prefixCaching": adapter.default_config().prefix_caching,
        "schedulePolicy": adapter.default_config().schedule_policy,
        "maxBatchedTokens": tokens,
        "maxRunning": running,
    }


def test_rollout_defaults_to_canary_with_two_replicas() -> None:
    assert _spec(replicas=2).tuning.rollout.strategy is RolloutStrategy.CANARY
    assert (
        _spec(replicas=2, tuning={"rollout": {"strategy": "rolling"}}).effective_rollout()
        is RolloutStrategy.ROLLING
    )


def test_partial_config_keeps_given_values() -> None:
    spec = _spec(config={"blockSize": 64, "maxRunning": 256})
    default = get_adapter("vllm").default_config()
    assert spec.knob_config() == default.with_(block_size=64, max_batched_tokens=8192, max_running=256)


def test_snake_case_input_is_accepted_and_output_is_camel_case() -> None:
    spec = _spec(
        extra_args=["--max-model-len", "4096"],
        config={"memory_fraction": 0.8, "max_running": 64},
        tuning={"slo": {"ttft_p99": "1s"}},
    )
    data = spec.to_dict()
    assert data["extraArgs"] == ["--max-model-len", "4096"]
    assert data["config"]["memoryFraction"] == 0.8
    assert data["config"]["maxRunning"] == 64
    assert data["tuning"]["slo"]["ttftP99"] == "1s"


def test_round_trip_model_dict_model() -> None:
    spec = _spec(
        replicas=3,
        gpu={"count": 2, "type": "H200"},
        extraArgs=["--max-model-len", "8192"],
        config={"memoryFraction": 0.85, "blockSize": 32, "prefixCaching": False, "schedulePolicy": "fcfs"},
        tuning={
            "mode": "observe",
            "objective": "ttft",
            "slo": {"ttftP99": "1m30s", "itlP99": "75ms"},
            "space": {
                "memoryFraction": {"min": 0.7, "max": 0.95},
                "blockSize": [16, 32],
                "prefixCaching": [True],
            },
            "trial": {"warmup": "90s", "measure": "5m", "minRequests": 50},
            "budget": {"maxTrials": 7},
            "rollout": {"strategy": "canary", "minInterval": "1h"},
            "drift": {"threshold": 0.5},
            "metrics": {"source": "prometheus", "url": "https://prom.example:9090/"},
        },
    )
    data = spec.to_dict()
    again = ServingDeploymentSpec.model_validate(data)
    assert again == spec
    assert again.to_dict() == data
    assert data["tuning"]["trial"]["warmup"] == "1m30s"  # canonical form of "90s"


def test_knob_config_helpers() -> None:
    config = KnobConfig(memory_fraction=0.8, block_size=32, prefix_caching=False, schedule_policy="fcfs")
    assert ConfigSpec.from_knob_config(config).to_knob_config() == config
    assert KnobValues.from_knob_config(config).to_knob_config() == config
    assert ConfigSpec.from_knob_config(config).to_dict() == {
        "memoryFraction": 0.8,
        "blockSize": 32,
        "prefixCaching": False,
        "schedulePolicy": "fcfs",
        "maxBatchedTokens": 0,
        "maxRunning": 0,
    }
    with pytest.raises(ValueError, match="not filled in"):
        ConfigSpec(block_size=16).to_knob_config()


def test_search_space_narrows_the_adapter_knobs() -> None:
    spec = _spec(tuning={"space": {"memoryFraction": {"min": 0.7, "max": 0.9}, "blockSize": [32, 64]}})
    space = spec.search_space()
    adapter = get_adapter("vllm").knobs()
    assert (space["memory_fraction"].low, space["memory_fraction"].high) == (0.7, 0.9)
    assert space["block_size"].choices == (32, 64) and space["block_size"].searched
    assert space["prefix_caching"] == adapter["prefix_caching"]
    assert space["schedule_policy"] == adapter["schedule_policy"]
    assert not space["schedule_policy"].searched  # vLLM's priority policy is not searched by default
    listed = _spec(tuning={"space": {"schedulePolicy": ["fcfs", "priority"]}}).search_space()
    assert listed["schedule_policy"].searched and listed["schedule_policy"].choices == ("fcfs", "priority")


@pytest.mark.parametrize(
    ("field", "value"),
    [("replicas", True), ("replicas", 1.0), ("replicas", "1"), ("config", {"prefixCaching": 1})],
)
def test_numbers_and_booleans_are_strict(field: str, value: object) -> None:
    spec, errors = validate_spec({"engine": "vllm", "model": "m", field: value})
    assert spec is None and errors


def test_integer_memory_fraction_is_a_number() -> None:
    assert _spec(config={"memoryFraction": 1}).config.memory_fraction == 1.0


def test_plain_model_validate_raises_rule_problems_with_paths() -> None:
    with pytest.raises(ValidationError, match=r"spec\.config\.blockSize: 17 is not supported by vllm"):
        ServingDeploymentSpec.model_validate({"engine": "vllm", "model": "m", "config": {"blockSize": 17}})


def _status() -> dict[str, Any]:
    t0 = "2025-03-01T12:00:00Z"
    config = {"memoryFraction": 0.9, "blockSize": 16, "prefixCaching": True, "schedulePolicy": "fcfs"}
    return {
        "phase": "Exploring",
        "observedGeneration": 3,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "PodsReady",
                "message": "2/2 replicas ready",
                "lastTransitionTime": t0,
                "observedGeneration": 3,
            },
            {"type": "MetricsUnavailable", "status": "False", "reason": "Scraped", "lastTransitionTime": t0},
        ],
        "currentConfig": config,
        "bestConfig": {"config": config, "score": 1234.5, "confidence": 0.8},
        "trials": [
            {
                "index": 0,
                "config": config,
                "outcome": "ok",
                "reason": "baseline",
                "startedAt": t0,
                "finishedAt": "2025-03-01T12:13:00Z",
                "signals": {"window_s": 600.0, "hit_rate": 0.71, "ttft_p99_s": None},
                "score": 1234.5,
            },
            {
                "index": 1,
                "config": {**config, "memoryFraction": 0.97},
                "outcome": "infeasible",
                "reason": "OOM",
            },
        ],
        "diagnosis": {
            "bound": "kv-capacity",
            "hitRate": 0.71,
            "prefillReduction": 0.64,
            "notes": ["evictions"],
        },
        "recommendation": {
            "config": {**config, "blockSize": 32},
            "reason": "twin: +8% goodput",
            "score": 1333.0,
        },
        "policy": {"state": "exploring", "nested": {"anything": [1, "two", None]}},
    }


def test_status_round_trip() -> None:
    raw = {
        "apiVersion": "prefixtune.io/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "x", "namespace": "default", "generation": 3},
        "spec": {"engine": "vllm", "model": "m", "replicas": 2},
        "status": _status(),
    }
    resource, errors = validate_resource(raw)
    assert errors == [] and resource is not None
    status = resource.status
    assert status is not None and status.phase is Phase.EXPLORING
    assert status.trials[0].signals["ttft_p99_s"] is None
    assert status.trials[0].started_at == datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    assert status.best_config is not None and status.best_config.config.to_knob_config().block_size == 16
    data = resource.to_dict()
    assert data["status"]["conditions"][0]["lastTransitionTime"] == "2025-03-01T12:00:00Z"
    assert data["status"]["policy"] == raw["status"]["policy"]
    assert ServingDeployment.model_validate(data) == resource


def test_empty_status_defaults() -> None:
    status = ServingDeploymentStatus()
    assert status.phase is Phase.PENDING
    assert status.to_dict() == {"phase": "Pending", "conditions": [], "trials": [], "policy": {}}


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"phase": "Running"}, "status.phase"),
        (
            {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "Yes",
                        "reason": "R",
                        "lastTransitionTime": "2025-03-01T12:00:00Z",
                    }
                ]
            },
            "status.conditions[0].status",
        ),
        (
            {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "R",
                        "lastTransitionTime": "2025-03-01T12:00:00",
                    }
                ]
            },
            "status.conditions[0].lastTransitionTime",
        ),
        ({"diagnosis": {"bound": "memory"}}, "status.diagnosis.bound"),
        ({"diagnosis": {"hitRate": 1.5}}, "status.diagnosis.hitRate"),
        (
            {
                "trials": [
                    {
                        "index": 0,
                        "config": {
                            "memoryFraction": 0.9,
                            "blockSize": 16,
                            "prefixCaching": True,
                            "schedulePolicy": "fcfs",
                        },
                        "outcome": "done",
                    }
                ]
            },
            "status.trials[0].outcome",
        ),
        (
            {
                "trials": [
                    {
                        "index": 0,
                        "config": {
                            "memoryFraction": 0.9,
                            "blockSize": 16,
                            "prefixCaching": True,
                            "schedulePolicy": "fcfs",
                        },
                        "outcome": "ok",
                        "signals": {"hit_rate": "high"},
                    }
                ]
            },
            "status.trials[0].signals.hit_rate",
        ),
    ],
)
def test_bad_status_is_reported_with_its_path(patch: dict[str, Any], path: str) -> None:
    raw = {
        "apiVersion": GROUP_VERSION,
        "kind": "ServingDeployment",
        "spec": {"engine": "vllm", "model": "m"},
        "status": patch,
    }
    resource, errors = validate_resource(raw)
    assert resource is None
    assert path in [e.path for e in errors], errors

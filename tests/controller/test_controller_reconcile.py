"""The deployment key: what, besides knobs and tuning settings, starts a new tuning generation; the
spec key: whether a spec change is one of the replicas alone (``kubectl scale``, an HPA)."""

from __future__ import annotations

from typing import Any

import pytest

from prefixtune.api import parse_spec
from prefixtune.controller.reconcile import deployment_key, spec_key

BASE: dict[str, Any] = {
    "engine": "vllm",
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "replicas": 2,
    "gpu": {"count": 1, "type": "H100-80GB"},
    "extraArgs": ["--max-model-len", "8192"],
}


def _key(**changes: Any) -> str:
    return deployment_key(parse_spec({**BASE, **changes}))


def test_deployment_key_is_stable() -> None:
    assert _key() == _key() and len(_key()) == 16
    assert _key(extraArgs=["--max-model-len", "8192"]) == _key()


@pytest.mark.parametrize(
    "changes",
    [
        {"model": "Qwen/Qwen2.5-7B-Instruct"},
        {"image": "vllm/vllm-openai:v0.9.0"},
        {"gpu": {"count": 2, "type": "H100-80GB"}},
        {"gpu": {"count": 1, "type": "H200"}},
        {"extraArgs": ["--max-model-len", "16384"]},
        {"engine": "sglang", "extraArgs": []},
    ],
)
def test_deployment_changes_change_the_key(changes: dict[str, Any]) -> None:
    assert _key(**changes) != _key()


def test_knobs_and_tuning_settings_do_not_change_the_key() -> None:
    assert _key(config={"blockSize": 32}) == _key()
    assert _key(tuning={"mode": "observe", "budget": {"maxTrials": 5}}) == _key()


def test_replicas_do_not_change_the_key() -> None:
    """An autoscaler changes spec.replicas: more pods of the same kind, not a new deployment."""
    assert _key(replicas=3) == _key() == _key(replicas=7)


def _spec_key(**changes: Any) -> str:
    return spec_key(parse_spec({**BASE, **changes}))


def test_the_spec_key_ignores_only_the_replicas() -> None:
    assert _spec_key() == _spec_key() == _spec_key(replicas=5)
    for changes in (
        {"model": "Qwen/Qwen2.5-7B-Instruct"},
        {"config": {"blockSize": 32}},
        {"tuning": {"budget": {"maxTrials": 5}}},
        {"tuning": {"trial": {"warmup": "1m"}}},
        {"startupTimeout": "20m"},
        {"resources": {"cpu": "8"}},
    ):
        assert _spec_key(**changes) != _spec_key(), changes


def test_crossing_the_default_strategy_boundary_changes_the_spec_key() -> None:
    """Unset, the rollout strategy follows the replicas (canary from 2): scaling 2 -> 1 changes how
    trials run, so it is not a change of the replicas alone; with the strategy set it is."""
    assert _spec_key(replicas=1) != _spec_key(replicas=2)
    rolling = {"tuning": {"rollout": {"strategy": "rolling"}}}
    assert _spec_key(replicas=1, **rolling) == _spec_key(replicas=2, **rolling)

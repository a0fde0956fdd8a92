"""The deployment key: what, besides knobs and tuning settings, starts a new tuning generation."""

from __future__ import annotations

from typing import Any

import pytest

from prefixtune.api import parse_spec
from prefixtune.controller.reconcile import deployment_key

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
        {"replicas": 3},
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

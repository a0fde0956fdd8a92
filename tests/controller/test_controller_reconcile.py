"""The deployment key: what, besides knobs and tuning settings, starts a new tuning generation; the
spec key: whether a spec change is one of the replicas alone (``kubectl scale``, an HPA)."""

from __future__ import annotations

from typing import Any

import pytest

from prefixtune.api import parse_spec
from prefixtune.controller.reconcile import approval_of, deployment_key, spec_key, unchanged_spec
from prefixtune.controller.settings import tuning_settings
from prefixtune.tuning.policy import initial_state
from prefixtune.tuning.policy.spec_change import replicas_only
from prefixtune.tuning.state import SpecChanged

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
        {"pod": {"env": [{"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"}]}},
    ],
)
def test_deployment_changes_change_the_key(changes: dict[str, Any]) -> None:
    assert _key(**changes) != _key()


def test_knobs_and_tuning_settings_do_not_change_the_key() -> None:
    assert _key(config={"blockSize": 32}) == _key()
    assert _key(tuning={"mode": "observe", "budget": {"maxTrials": 5}}) == _key()


def test_where_the_pods_run_and_what_they_mount_do_not_change_the_key() -> None:
    """Scheduling and volumes of spec.pod are not what a config scores on: no new tuning run."""
    pod = {
        "nodeSelector": {"pool": "b"},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "models"}}],
        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
        "labels": {"team": "ml"},
    }
    assert _key(pod=pod) == _key() == _key(pod={})


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


def test_a_state_an_older_operator_wrote_gets_the_keys_of_the_spec_it_was_written_for() -> None:
    """Same generation: the spec is the one the state knows, so today's keys describe it; its next
    change of replicas alone is then a scale, not a new deployment (the old key hashed replicas)."""
    spec = parse_spec(BASE)
    settings = tuning_settings(spec, "ns", "a")
    old = initial_state("vllm", settings, spec.knob_config(), 3, "key-with-replicas")
    assert old.spec_key == "" and old.replicas == 0
    state = unchanged_spec(old, spec, settings)
    assert (state.spec_key, state.replicas, state.deployment_key) == (spec_key(spec), 2, deployment_key(spec))
    assert unchanged_spec(state, spec, settings) is state  # nothing to record twice
    scaled = parse_spec({**BASE, "replicas": 4})
    obs = SpecChanged(
        settings=tuning_settings(scaled, "ns", "a"), config=scaled.knob_config(), generation=4,
        deployment_key=deployment_key(scaled), spec_key=spec_key(scaled), replicas=4,
    )  # fmt: skip
    assert replicas_only(state, obs) and not replicas_only(old, obs)


def test_settings_from_outside_the_spec_follow_without_a_spec_change() -> None:
    spec = parse_spec(BASE)
    settings = tuning_settings(spec, "ns", "a")
    state = unchanged_spec(initial_state("vllm", settings, spec.knob_config(), 1, "k"), spec, settings)
    longer = tuning_settings(spec, "ns", "a", ready_timeout=5000.0)
    assert unchanged_spec(state, spec, longer).settings == longer


def test_the_approval_is_read_from_its_annotation_bounded() -> None:
    def body(annotations: object) -> dict[str, Any]:
        return {"metadata": {"name": "a", "annotations": annotations}}

    assert approval_of(body({"prefixtune.io/approve": " 0123456789ab "})) == "0123456789ab"
    assert approval_of(body({"other": "x"})) == approval_of({"metadata": {}}) == ""
    assert approval_of(body({"prefixtune.io/approve": 7})) == approval_of(body("junk")) == ""
    assert len(approval_of(body({"prefixtune.io/approve": "x" * 10_000}))) == 64

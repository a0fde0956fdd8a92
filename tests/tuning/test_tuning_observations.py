"""Observations: one small frozen model per kind, told apart by ``kind`` (a discriminated union)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prefixtune.engines import get_adapter
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.settings import TuningSettings
from prefixtune.tuning.state import (
    ConfigChecked,
    MetricsUnavailable,
    Observation,
    RolloutApplied,
    RolloutFailed,
    RolloutNoCapacity,
    RolloutReady,
    SpecChanged,
    Tick,
    TrialInvalidated,
    WhatIf,
    WindowMeasured,
    parse_observation,
)

CONFIG = get_adapter("vllm").default_config()
SIGNALS = Signals(window_s=300.0, requests=100.0, hit_rate=0.5, ttft_p99_s=0.4)

EXAMPLES: list[Observation] = [
    Tick(),
    RolloutApplied(config=CONFIG),
    RolloutReady(config=CONFIG),
    RolloutFailed(config=CONFIG, failure="oom_startup", reason="exit 137"),
    RolloutNoCapacity(config=CONFIG, reason="pod p: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu."),
    WindowMeasured(
        signals=SIGNALS,
        baseline_signals=SIGNALS,
        canary_pods=1,
        baseline_pods=2,
        partial=True,
        offered_rps=2.5,
        what_if=(WhatIf(config=CONFIG.with_(prefix_caching=False), signals=SIGNALS),),
    ),
    SpecChanged(settings=TuningSettings(max_trials=5), config=CONFIG, generation=3, deployment_key="k"),
    MetricsUnavailable(reason="no pod answered"),
    TrialInvalidated(reason="pods restarted"),
    ConfigChecked(
        config=CONFIG, mismatches=("memory_fraction: intended 0.5, running 0.9 (pod p)",), kv_tokens=8
    ),
]


@pytest.mark.parametrize("obs", EXAMPLES, ids=lambda o: o.kind)
def test_each_kind_round_trips_through_json_to_its_own_model(obs: Observation) -> None:
    back = parse_observation(obs.model_dump_json())
    assert type(back) is type(obs) and back == obs


def test_every_kind_has_one_model() -> None:
    kinds = [o.kind for o in EXAMPLES]
    assert len(set(kinds)) == len(kinds) == 10


def test_a_kind_carries_only_its_own_fields() -> None:
    with pytest.raises(ValidationError):
        Tick(signals=SIGNALS)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        MetricsUnavailable(config=CONFIG)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="signals"):
        parse_observation('{"kind": "rollout_ready", "signals": null}')
    with pytest.raises(ValidationError, match="does not match any of the expected tags"):
        parse_observation('{"kind": "nonsense"}')


def test_observations_are_frozen() -> None:
    obs = RolloutFailed(config=CONFIG, failure="crash")
    with pytest.raises(ValidationError):
        obs.failure = "oom"  # type: ignore[misc]
    assert obs.failure == "crash"

"""An invalid spec edit mid-trial: the abort decision (pure policy)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from prefixtune.controller.observe import desired
from prefixtune.engines import get_adapter
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.actions import Action, EmitEvent, RecordTrial, RollBack, RollOut
from prefixtune.tuning.optimizer import Suggestion, TrialResult
from prefixtune.tuning.phases import Phase, Step
from prefixtune.tuning.policy import initial_state, step
from prefixtune.tuning.policy._core import SPEC_INVALID, Core
from prefixtune.tuning.settings import Slo, TuningSettings
from prefixtune.tuning.space import SearchSpace
from prefixtune.tuning.state import (
    Observation,
    PolicyState,
    RolloutReady,
    SpecChanged,
    SpecInvalid,
    Tick,
    WindowMeasured,
)

ENGINE = "vllm"
DEFAULT = get_adapter(ENGINE).default_config()
C1 = DEFAULT.with_(memory_fraction=0.8)
C2 = DEFAULT.with_(memory_fraction=0.7, block_size=32)
SETTINGS = TuningSettings(
    warmup_s=60, measure_s=300, min_requests=100, max_trials=3, min_interval_s=0, seed_key="ns/a",
    slo=Slo(2.0, 0.15), strategy="canary",
)  # fmt: skip


def _signals(goodput: float = 1000.0) -> Signals:
    return Signals(
        window_s=300.0, requests=500.0, hit_rate=0.6, ttft_p50_s=0.1, ttft_p99_s=0.5, itl_p50_s=0.02,
        itl_p99_s=0.05, output_tokens_per_s=goodput * 1.05, input_tokens_per_s=2000.0, requests_per_s=1.0,
        goodput_tokens_per_s=goodput, slo_attainment=0.95,
    )  # fmt: skip


def _suggester(space: SearchSpace, history: list[TrialResult], seed: int, s: TuningSettings) -> Suggestion:
    configs = [C1, C2]
    tried = len(history) - 1
    if tried < len(configs):
        return Suggestion(configs[tried], f"scripted #{tried}")
    return Suggestion(None, "done")


class Run:
    def __init__(self, settings: TuningSettings = SETTINGS) -> None:
        self.state = initial_state(ENGINE, settings, DEFAULT, generation=1)
        self.history: list[list[TrialResult]] = []
        self.actions: list[Action] = []

    def suggester(
        self, space: SearchSpace, history: list[TrialResult], seed: int, s: TuningSettings
    ) -> Suggestion:
        self.history.append(list(history))
        return _suggester(space, history, seed, s)

    def __call__(self, obs: Observation, now: float) -> list[Action]:
        self.state, actions = step(self.state, obs, now, self.suggester)
        self.actions.extend(actions)
        return actions

    def to_canary_measuring(self) -> float:
        """Baseline measured, trial C1 on a canary, in its measurement window; returns the time."""
        self(RolloutReady(config=DEFAULT), 0.0)
        self(Tick(), 60.0)
        self(WindowMeasured(signals=_signals(), offered_rps=1.0), 360.0)
        assert self.state.step == Step.ROLLING_OUT and self.state.target == C1
        self(RolloutReady(config=C1), 400.0)
        self(Tick(), 460.0)
        assert self.state.step == Step.MEASURING and desired(self.state).canary == C1
        return 500.0


def test_an_invalid_spec_mid_canary_aborts_the_trial_and_restores_the_stable_config() -> None:
    r = Run()
    now = r.to_canary_measuring()
    acts = r(SpecInvalid(reason="spec.config.blockSize: must be one of 8, 16, 32"), now)
    (record,) = [a for a in acts if isinstance(a, RecordTrial)]
    assert record.trial.config == C1 and record.trial.outcome == "aborted"
    assert record.trial.failure == SPEC_INVALID and "spec.config.blockSize" in record.trial.reason
    (back,) = [a for a in acts if isinstance(a, RollBack)]
    assert back.to_config == DEFAULT
    # The children follow the state: no canary, the stable config on the baseline Deployment.
    assert desired(r.state) == desired(r.state).__class__(baseline=DEFAULT, canary=None)
    assert r.state.active is None and r.state.step == Step.ROLLING_BACK and r.state.phase == Phase.EXPLORING
    (event,) = [a for a in acts if isinstance(a, EmitEvent) and a.reason == "TrialAborted"]
    assert event.type == "Warning" and "spec.config.blockSize" in event.message
    # Said once: a second invalid reconcile changes nothing.
    again = r(SpecInvalid(reason="spec.config.blockSize: must be one of 8, 16, 32"), now + 1)
    assert again == []


def test_the_fixed_spec_resumes_from_the_kept_state_and_nothing_is_learned_from_the_abort() -> None:
    r = Run()
    now = r.to_canary_measuring()
    r(SpecInvalid(reason="spec.config.blockSize: bad"), now)
    r(RolloutReady(config=DEFAULT), now + 10)  # the rollback to the safe config completed
    assert r.state.step == Step.IDLE
    trials_before = [t.model_copy() for t in r.state.trials]
    # Fixed back to the last valid values: a spec change that re-opens nothing.
    r(SpecChanged(settings=SETTINGS, config=DEFAULT, generation=3), now + 20)
    assert r.state.epoch == 0 and r.state.trials == trials_before
    assert Core(r.state, now, r.suggester).explored() == 0  # the abort is not counted against the budget
    acts = r(Tick(), now + 30)
    (rollout,) = [a for a in acts if isinstance(a, RollOut)]
    assert rollout.config == C1  # the aborted config is tried again: its abort said nothing about it
    assert all(h.config != C1 for h in r.history[-1])  # the abort is not in the optimizer's history


def test_a_rolling_trial_is_rolled_back_to_the_best_measured_config() -> None:
    r = Run(replace(SETTINGS, strategy="rolling"))
    r(RolloutReady(config=DEFAULT), 0.0)
    r(Tick(), 60.0)
    r(WindowMeasured(signals=_signals(), offered_rps=1.0), 360.0)
    r(RolloutReady(config=C1), 400.0)
    assert r.state.current == C1  # rolling: every pod runs the trial now
    acts = r(SpecInvalid(reason="spec.replicas: must be >= 1"), 420.0)
    (back,) = [a for a in acts if isinstance(a, RollBack)]
    assert back.to_config == DEFAULT and desired(r.state).baseline == DEFAULT


def _state_at(r: Run, **update: Any) -> PolicyState:
    return r.state.model_copy(update=update)


def test_nothing_is_aborted_without_a_trial_of_a_config_in_flight() -> None:
    r = Run()
    r(RolloutReady(config=DEFAULT), 0.0)
    r(Tick(), 60.0)  # the baseline's window: the stable pods run the spec's own config
    watching = _state_at(r, phase=Phase.CONVERGED, step=Step.WATCHING)
    for state in (r.state, _state_at(r, phase=Phase.PAUSED), watching):
        new, acts = step(state, SpecInvalid(reason="x"), 100.0, r.suggester)
        assert acts == [] and new == state

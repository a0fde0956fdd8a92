"""The tuning policy: a pure state machine ``step(state, observation, now) -> (state', actions)``.

One module per part of the machine (the names are in ``tuning/phases.py``): ``_core`` (the context:
state, clock, emitted actions, and the trials queries), ``rollout``, ``measurement``, ``exploration``,
``observe`` (observe mode), ``spec_change``, ``drift_watch`` and ``messages`` (the text of Events and
trial reasons). This module dispatches an observation to them.

No I/O. The controller (or the benchmark) gathers observations, calls ``step``, executes the
actions and stores the state. Phases:

  Pending -> Baseline (measure the running config) -> Exploring (per trial: RollingOut ->
  WaitingReady -> WarmingUp -> Measuring -> Scoring) -> Converged (apply the best, keep watching)
  -> drift -> Baseline of a new epoch (history kept: warm start; the seed changes with the epoch).
  Observing (mode observe: measure, diagnose, recommend; never roll out; an approval rolls the
  recommendation out once: ``control``), Paused (mode off, or spec.tuning.paused: ``control``),
  Failed (a rollback itself failed: a human must look).

Safety rules enforced here:
- Rollouts are rate-limited: no two closer than ``min_interval_s`` (the policy waits instead).
  Rollbacks are never delayed, but they count as rollouts for the next trial's wait.
- A trial whose partial window breaks the SLO by ``abort_factor`` is aborted and rolled back.
- A failed rollout (crash, OOM, not ready in time) is infeasible: recorded, rolled back to the best
  known config, and learned by the optimizer's feasibility model.
- A rollout whose pod cannot be scheduled (no free GPU) is no capacity, never infeasible: the trial
  ends invalidated (``no_capacity``: not scored, not learned, not counted in the budget), is rolled
  back, and the same config is tried again after a backoff (``rollout.NO_CAPACITY_BACKOFF_S``,
  doubling up to ``NO_CAPACITY_BACKOFF_MAX_S``) with a NoCapacity condition and Event meanwhile.
- Missing data never leads to a rollout: the policy holds with a MetricsUnavailable condition.
- A pod deleted mid-measurement invalidates the window: the trial is re-measured, not scored.
- A trial invalidated for too little traffic counts toward the budget, and the same config starved
  ``MAX_STARVED_REPEATS`` times in an epoch ends the search: exploring always terminates.
- An invalid spec mid-trial aborts the trial (recorded ``aborted``/``spec_invalid``, not learned) and
  rolls back to the safe config; the rest of the state waits for the spec to be fixed.
- A change of what is deployed (model, image, GPUs, ...: ``deployment_key``) starts a new epoch.
  A change of the replicas alone (``spec_key`` unchanged: ``kubectl scale``, an HPA) is a serving
  parameter: same epoch, same trial (a canary keeps its canary); a window in flight is re-measured.
- Trial ids are assigned once and RecordTrial is emitted once per finished trial.
- The history is bounded (``history.py``): the current epoch and the latest earlier trials in full,
  older epochs as a prior of bounded size, so neither the state nor a decision grows with age.
- The best is the config with the best mean over its windows. A best seen in one window only is
  measured again before the policy converges on it (near a capacity limit one lucky arrival sequence
  can make a config look best); with a budget larger than the initial design the budget's last trial
  is kept for that.
"""

from __future__ import annotations

from typing import assert_never

from prefixtune.engines.base import KnobConfig
from prefixtune.tuning.actions import Action
from prefixtune.tuning.optimizer import Suggestion, TrialResult, suggest
from prefixtune.tuning.phases import HALTED_PHASES, ROLLOUT_STEPS, Phase, Step
from prefixtune.tuning.policy import (
    control,
    exploration,
    measurement,
    observe,
    rollout,
    spec_change,
)
from prefixtune.tuning.policy._core import Core, Suggester, space_of
from prefixtune.tuning.policy.drift_watch import drift
from prefixtune.tuning.policy.history import bound as bound_history
from prefixtune.tuning.settings import TuningSettings
from prefixtune.tuning.space import SearchSpace
from prefixtune.tuning.state import (
    Approved,
    ConfigChecked,
    MetricsUnavailable,
    Observation,
    PolicyState,
    RolloutApplied,
    RolloutFailed,
    RolloutNoCapacity,
    RolloutReady,
    SpecChanged,
    SpecInvalid,
    Tick,
    TrialInvalidated,
    WindowMeasured,
)

__all__ = ["Suggester", "drift", "initial_state", "space_of", "step"]


def initial_state(
    engine: str,
    settings: TuningSettings,
    config: KnobConfig,
    generation: int = 0,
    deployment_key: str = "",
    *,
    spec_key: str = "",
    replicas: int = 0,
) -> PolicyState:
    """The state of a new resource: Pending, running ``config`` (its spec.config)."""
    return PolicyState(
        engine=engine, settings=settings, spec_config=config, current=config, spec_generation=generation,
        deployment_key=deployment_key, spec_key=spec_key, replicas=replicas,
    )  # fmt: skip


def _default_suggester(
    space: SearchSpace, history: list[TrialResult], seed: int, settings: TuningSettings
) -> Suggestion:
    return suggest(
        space,
        history,
        seed,
        method=settings.method,
        n_initial=settings.n_initial,
        convergence_ei=settings.convergence_ei,
    )


def step(
    state: PolicyState, obs: Observation, now: float, suggester: Suggester | None = None
) -> tuple[PolicyState, list[Action]]:
    """One transition. ``state`` is not modified; the new state is returned with the actions."""
    ctx = _Ctx(state.model_copy(deep=True), now, suggester or _default_suggester)
    ctx.handle(obs)
    return bound_history(ctx.s), ctx.actions


class _Ctx(Core):
    def handle(self, obs: Observation) -> None:
        if isinstance(obs, SpecChanged):
            spec_change.on_spec_changed(self, obs)
            return
        if isinstance(obs, MetricsUnavailable):
            measurement.on_metrics_unavailable(self, obs)
            return
        if isinstance(obs, SpecInvalid):
            spec_change.on_spec_invalid(self, obs)
            return
        if isinstance(obs, Approved):
            control.on_approved(self, obs)
            return
        phase = self.s.phase
        if phase in HALTED_PHASES:
            if phase == Phase.PAUSED and isinstance(obs, RolloutReady) and self.s.step == Step.ROLLING_BACK:
                rollout.on_ready(self, obs)  # turned off: the spec's config now runs (``current``)
            return
        if phase == Phase.PENDING:
            self.start()
            if not isinstance(obs, WindowMeasured) or self.s.phase in HALTED_PHASES:
                return
            phase = self.s.phase
        if phase == Phase.OBSERVING:
            if self.s.step in ROLLOUT_STEPS:
                control.on_observing_rollout(self, obs)
            else:
                observe.on_observing(self, obs)
            return
        if isinstance(obs, Tick):
            self.on_tick()
        elif isinstance(obs, RolloutApplied):
            if self.s.step == Step.ROLLING_OUT:
                self.goto(step=Step.WAITING_READY)
        elif isinstance(obs, RolloutReady):
            rollout.on_ready(self, obs)
        elif isinstance(obs, RolloutFailed):
            rollout.on_failed(self, obs.failure or "crash", obs.reason)
        elif isinstance(obs, RolloutNoCapacity):
            rollout.on_no_capacity(self, obs)
        elif isinstance(obs, WindowMeasured):
            measurement.on_window(self, obs)
        elif isinstance(obs, TrialInvalidated):
            measurement.on_invalidated(self, obs)
        elif isinstance(obs, ConfigChecked):
            rollout.on_config_checked(self, obs)
        else:
            assert_never(obs)

    def start(self) -> None:
        mode = self.s.settings.mode
        self.signals_condition()
        if self.s.settings.paused and mode != "off":
            control.pause(self, config_changed=False, changed=False)
            return
        if mode == "auto" and self.s.settings.refusal:
            # The objective cannot be scored from what this release exports: never tune blind.
            self.goto(Phase.OBSERVING, Step.MEASURING)
            self.s.measure_from = self.now
            return
        if mode == "off":
            self.goto(Phase.PAUSED, Step.IDLE)
        elif mode == "observe":
            self.goto(Phase.OBSERVING, Step.MEASURING)
            self.s.measure_from = self.now
        else:
            measurement.begin_baseline(self, warm=True)

    def on_tick(self) -> None:
        st = self.s.step
        if st in ROLLOUT_STEPS:
            timeout = self.ready_timeout_s()
            if self.now - self.s.step_since > timeout:
                rollout.on_failed(self, "timeout", f"not ready within {timeout:g}s")
        elif st == Step.WARMING_UP:
            if self.s.warm_until is not None and self.now >= self.s.warm_until:
                measurement.begin_measuring(self)
        elif st == Step.IDLE:
            if self.s.phase == Phase.EXPLORING:
                exploration.decide(self)
            elif self.s.phase == Phase.CONVERGED:
                rollout.apply_best(self)

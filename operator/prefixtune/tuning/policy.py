"""The tuning policy: a pure state machine ``step(state, observation, now) -> (state', actions)``.

No I/O. The controller (or the benchmark) gathers observations, calls ``step``, executes the
actions and stores the state. Phases:

  Pending -> Baseline (measure the running config) -> Exploring (per trial: RollingOut ->
  WaitingReady -> WarmingUp -> Measuring -> Scoring) -> Converged (apply the best, keep watching)
  -> drift -> Baseline of a new epoch (history kept: warm start; the seed changes with the epoch).
  Observing (mode observe: measure, diagnose, recommend; never roll out), Paused (mode off),
  Failed (a rollback itself failed: a human must look).

Safety rules enforced here:
- Rollouts are rate-limited: no two closer than ``min_interval_s`` (the policy waits instead).
  Rollbacks are never delayed, but they count as rollouts for the next trial's wait.
- A trial whose partial window breaks the SLO by ``abort_factor`` is aborted and rolled back.
- A failed rollout (crash, OOM, not ready in time) is infeasible: recorded, rolled back to the best
  known config, and learned by the optimizer's feasibility model.
- Missing data never leads to a rollout: the policy holds with a MetricsUnavailable condition.
- A pod deleted mid-measurement invalidates the window: the trial is re-measured, not scored.
- A trial invalidated for too little traffic counts toward the budget, and the same config starved
  ``MAX_STARVED_REPEATS`` times in an epoch ends the search: exploring always terminates.
- A change of what is deployed (model, image, replicas, ...: ``deployment_key``) starts a new epoch.
- Trial ids are assigned once and RecordTrial is emitted once per finished trial.
- The best is the config with the best mean over its windows. A best seen in one window only is
  measured again before the policy converges on it (near a capacity limit one lucky arrival sequence
  can make a config look best); with a budget larger than the initial design the budget's last trial
  is kept for that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

from prefixtune.engines.base import KnobConfig
from prefixtune.engines.knobs import config_text
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.actions import (
    Action,
    EmitEvent,
    Recommend,
    RecordTrial,
    RollBack,
    RollOut,
    SetCondition,
)
from prefixtune.tuning.objective import (
    InsufficientData,
    Score,
    goal,
    load_normalized,
    paired,
    score,
    severe_breach,
)
from prefixtune.tuning.optimizer import Suggestion, TrialResult, seed_from, suggest
from prefixtune.tuning.phases import HALTED_PHASES, ROLLOUT_STEPS, TRIAL_STEPS, WINDOW_STEPS, Phase, Step
from prefixtune.tuning.settings import SpaceOverride, TuningSettings
from prefixtune.tuning.space import SearchSpace, build_space
from prefixtune.tuning.state import Observation, PolicyState, Trial

Suggester = Callable[[SearchSpace, list[TrialResult], int, TuningSettings], Suggestion]
RECOMMEND_MARGIN = 1.02  # observe mode: recommend a what-if config only when it beats the current by 2%
LOW_HIT_RATE = 0.05  # field notes: hit rate stably this low -> the cache holds memory for nothing
TOO_LITTLE_TRAFFIC = "too_little_traffic"  # Trial.failure of a trial invalidated for too few requests
MAX_STARVED_REPEATS = 2  # invalidations of one config for too little traffic before the search stops


def initial_state(
    engine: str, settings: TuningSettings, config: KnobConfig, generation: int = 0, deployment_key: str = ""
) -> PolicyState:
    """The state of a new resource: Pending, running ``config`` (its spec.config)."""
    return PolicyState(
        engine=engine, settings=settings, spec_config=config, current=config, spec_generation=generation,
        deployment_key=deployment_key,
    )  # fmt: skip


@lru_cache(maxsize=64)
def _space(engine: str, override: SpaceOverride, base: KnobConfig) -> SearchSpace:
    from prefixtune.engines import get_adapter

    adapter = get_adapter(engine)
    return build_space(adapter.knobs(), base, adapter.normalize, override)


def space_of(state: PolicyState) -> SearchSpace:
    return _space(state.engine, state.settings.space, state.spec_config)


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
    return ctx.s, ctx.actions


class _Ctx:
    def __init__(self, s: PolicyState, now: float, suggester: Suggester) -> None:
        self.s = s
        self.now = now
        self.suggester = suggester
        self.actions: list[Action] = []

    # -- small helpers ---------------------------------------------------------------------------
    def event(self, type_: str, reason: str, message: str) -> None:
        self.actions.append(EmitEvent("Warning" if type_ == "Warning" else "Normal", reason, message))

    def condition(self, type_: str, status: bool, reason: str, message: str) -> None:
        self.actions.append(SetCondition(type_, "True" if status else "False", reason, message))

    def goto(self, phase: Phase | None = None, step: Step | None = None) -> None:
        if phase is not None:
            self.s.phase = phase
        if step is not None:
            self.s.step = step
        self.s.step_since = self.now

    def active(self) -> Trial | None:
        return None if self.s.active is None else self.s.trial(self.s.active)

    def best_trial(self) -> Trial | None:
        return None if self.s.best is None else self.s.trial(self.s.best)

    def measurements(self, config: KnobConfig) -> list[Trial]:
        """This epoch's scored trials of ``config``, oldest first."""
        return [
            t for t in self.epoch_trials() if t.outcome == "ok" and t.value is not None and t.config == config
        ]

    def best_by_mean(self) -> Trial | None:
        """The latest trial of the config with the best mean value over its windows this epoch (a
        config measured again to confirm it counts once, by its mean); the earliest config wins ties."""
        ok = [t for t in self.epoch_trials() if t.outcome == "ok" and t.value is not None]
        by_config: dict[KnobConfig, list[Trial]] = {}
        for t in ok:
            by_config.setdefault(t.config, []).append(t)
        if not by_config:
            return None
        ranked = max(
            by_config.values(),
            key=lambda ts: (sum(t.value or 0.0 for t in ts) / len(ts), -ts[0].id),
        )
        return ranked[-1]

    def best_config(self) -> KnobConfig:
        best = self.best_trial()
        return best.config if best is not None else self.s.current

    def epoch_trials(self) -> list[Trial]:
        return [t for t in self.s.trials if t.epoch == self.s.epoch]

    def explored(self) -> int:
        """Trials spent from the budget: all finished ones but those invalidated by a pod restart or a
        spec change (re-run at no cost); a trial starved of traffic counts, so a light workload
        cannot keep the search going forever."""
        return sum(
            1
            for t in self.epoch_trials()
            if t.role == "trial" and (t.outcome != "invalidated" or t.failure == TOO_LITTLE_TRAFFIC)
        )

    def rate_limited_until(self) -> float | None:
        last = self.s.last_rollout_at
        if last is None:
            return None
        ready = last + self.s.settings.min_interval_s
        return ready if self.now < ready else None

    # -- dispatch --------------------------------------------------------------------------------
    def handle(self, obs: Observation) -> None:
        if obs.kind == "spec_changed":
            self.on_spec_changed(obs)
            return
        if obs.kind == "metrics_unavailable":
            self.on_metrics_unavailable(obs)
            return
        phase = self.s.phase
        if phase in HALTED_PHASES:
            return
        if phase == Phase.PENDING:
            self.start()
            if obs.kind != "window":
                return
            phase = self.s.phase
        if phase == Phase.OBSERVING:
            self.on_observing(obs)
            return
        if obs.kind == "tick":
            self.on_tick()
        elif obs.kind == "rollout_applied":
            if self.s.step == Step.ROLLING_OUT:
                self.goto(step=Step.WAITING_READY)
        elif obs.kind == "rollout_ready":
            self.on_ready(obs)
        elif obs.kind == "rollout_failed":
            self.on_failed(obs.failure or "crash", obs.reason)
        elif obs.kind == "window":
            self.on_window(obs)
        elif obs.kind == "trial_invalidated":
            self.on_invalidated(obs)
        elif obs.kind == "config_checked":
            self.on_config_checked(obs)

    # -- phases ----------------------------------------------------------------------------------
    def signals_condition(self) -> None:
        """SignalsMissing: which signals the engine release lacks (condition + Event), or cleared."""
        missing = self.s.settings.missing_signals
        if not missing:
            self.condition(
                "SignalsMissing", False, "AllSignals", "the engine exports every signal the tuner reads"
            )
            return
        message = f"this engine release does not export: {', '.join(missing)}" + (
            f"; {self.s.settings.refusal}: not tuning (observing instead)"
            if self.s.settings.refusal
            else "; tuning with what it does export"
        )
        self.condition("SignalsMissing", True, "EngineRelease", message)
        self.event("Warning", "SignalsMissing", message)

    def start(self) -> None:
        mode = self.s.settings.mode
        self.signals_condition()
        if mode == "auto" and self.s.settings.refusal:
            # The objective cannot be scored from what this release exports: never tune blind.
            self.goto(Phase.OBSERVING, Step.MEASURING)
            self.s.measure_from = self.now
            self.condition("Tuning", False, "SignalsMissing", self.s.settings.refusal)
            return
        if mode == "off":
            self.goto(Phase.PAUSED, Step.IDLE)
            self.condition("Tuning", False, "TuningOff", "tuning.mode is off: the spec config is kept")
        elif mode == "observe":
            self.goto(Phase.OBSERVING, Step.MEASURING)
            self.s.measure_from = self.now
            self.condition("Tuning", False, "Observing", "tuning.mode is observe: measuring and recommending")
        else:
            self.begin_baseline(warm=True)

    def begin_baseline(self, warm: bool) -> None:
        """Measure the running config (after a warm-up when its pods may be cold)."""
        t = Trial(
            id=self.s.next_trial_id, epoch=self.s.epoch, role="baseline", config=self.s.current,
            started_at=self.now, reason="measure the running config",
        )  # fmt: skip
        self.s.next_trial_id += 1
        self.s.trials.append(t)
        self.s.active = t.id
        self.s.best = None
        self.s.extensions = 0
        self.goto(Phase.BASELINE)
        if warm and self.s.settings.warmup_s > 0:
            self.goto(step=Step.WARMING_UP)
            self.s.warm_until = self.now + self.s.settings.warmup_s
        else:
            self.begin_measuring()
        self.condition("Tuning", True, "Baseline", f"measuring the running config (epoch {self.s.epoch})")

    def begin_measuring(self) -> None:
        self.goto(step=Step.MEASURING)
        self.s.measure_from = self.now
        self.s.measure_until = self.now + self.s.settings.measure_s

    def on_tick(self) -> None:
        st = self.s.step
        if st in ROLLOUT_STEPS:
            if self.now - self.s.step_since > self.s.settings.ready_timeout_s:
                self.on_failed("timeout", f"not ready within {self.s.settings.ready_timeout_s:g}s")
        elif st == Step.WARMING_UP:
            if self.s.warm_until is not None and self.now >= self.s.warm_until:
                self.begin_measuring()
        elif st == Step.IDLE:
            if self.s.phase == Phase.EXPLORING:
                self.decide()
            elif self.s.phase == Phase.CONVERGED:
                self.apply_best()

    def on_ready(self, obs: Observation) -> None:
        st = self.s.step
        if obs.config is not None and self.s.target is not None and obs.config != self.s.target:
            return  # a stale report about an earlier rollout
        if st in (Step.ROLLING_OUT, Step.WAITING_READY):
            if self.s.phase == Phase.CONVERGED:
                self.s.current = self.s.target or self.s.current
                self.s.target = None
                self.goto(step=Step.WATCHING)
                self.s.measure_from = self.now
                return
            trial = self.active()
            if trial is not None and self.s.settings.strategy == "rolling":
                self.s.current = trial.config
            self.s.target = None
            self.goto(step=Step.WARMING_UP)
            self.s.warm_until = self.now + self.s.settings.warmup_s
            if self.s.settings.warmup_s <= 0:
                self.begin_measuring()
        elif st == Step.ROLLING_BACK:
            self.s.current = self.s.target or self.s.current
            self.s.target = None
            self.goto(step=Step.IDLE if self.s.phase != Phase.CONVERGED else Step.WATCHING)
            if self.s.phase == Phase.CONVERGED:
                self.s.measure_from = self.now

    def on_failed(self, failure: str, detail: str) -> None:
        st = self.s.step
        if st == Step.ROLLING_BACK:
            self.goto(Phase.FAILED, Step.IDLE)
            self.s.note = f"rollback to {self.s.target} failed ({failure}): manual action needed"
            self.event("Warning", "RollbackFailed", self.s.note)
            self.condition("Degraded", True, "RollbackFailed", self.s.note)
            self.condition("Tuning", False, "Failed", self.s.note)
            return
        trial = self.active()
        if trial is not None and trial.role == "baseline" and st in WINDOW_STEPS:
            # The running (spec) config itself fails: record it and search for one that works.
            self.finish_trial(
                trial, "infeasible", reason=f"{failure}: {detail}".rstrip(": "), failure=failure
            )
            self.event(
                "Warning",
                "BaselineInfeasible",
                f"the running config {_cfg(trial.config)} failed: {failure} {detail}".rstrip()
                + "; recorded as infeasible, exploring for a config that works",
            )
            self.goto(Phase.EXPLORING, Step.IDLE)
            self.decide()
            return
        if trial is None or trial.role != "trial" or st not in (
            Step.ROLLING_OUT, Step.WAITING_READY, Step.WARMING_UP, Step.MEASURING
        ):  # fmt: skip
            if self.s.phase == Phase.CONVERGED and st in (
                Step.ROLLING_OUT,
                Step.WAITING_READY,
                Step.WATCHING,
            ):
                self.rollback(self.s.current, f"applying the best config failed ({failure})")
            return
        self.finish_trial(trial, "infeasible", reason=f"{failure}: {detail}".rstrip(": "), failure=failure)
        self.event(
            "Warning",
            "TrialInfeasible",
            f"trial {trial.id} {_cfg(trial.config)} failed: {failure} {detail}".rstrip()
            + "; recorded as infeasible, the optimizer will avoid it; rolling back",
        )
        self.rollback(self.best_config(), f"trial {trial.id} infeasible ({failure})")

    def rollback(self, to: KnobConfig, reason: str) -> None:
        self.actions.append(RollBack(to, reason))
        self.s.target = to
        self.s.last_rollout_at = self.now
        self.goto(step=Step.ROLLING_BACK)

    def on_config_checked(self, obs: Observation) -> None:
        """The engine's effective config after the rollout: matched (or not readable on this engine),
        the trial goes on; another value than rendered ends it not_applied, never scored."""
        trial = self.active()
        if trial is None or self.s.step not in WINDOW_STEPS or trial.verified:
            return
        if obs.config is not None and obs.config != trial.config:
            return  # a report about another rollout
        trial.verified = True
        trial.kv_tokens = obs.kv_tokens
        if not obs.mismatches:
            if obs.reason:
                why = f"trial {trial.id} {_cfg(trial.config)}: {obs.reason}; scored without that check"
                self.event("Warning", "KnobsUnverified", why)
            return
        detail = "; ".join(obs.mismatches)
        self.finish_trial(
            trial, "not_applied", reason=f"the engine does not run it: {detail}", failure="not_applied"
        )
        self.event(
            "Warning",
            "KnobNotApplied",
            f"trial {trial.id} {_cfg(trial.config)}: the engine ignored or overrode {detail}; "
            "not scored (the optimizer will avoid it)",
        )
        if trial.role == "baseline":
            self.goto(Phase.EXPLORING, Step.IDLE)
            self.decide()
            return
        self.rollback(self.best_config(), f"trial {trial.id} not applied by the engine")

    def on_invalidated(self, obs: Observation) -> None:
        trial = self.active()
        if trial is None or self.s.step not in WINDOW_STEPS:
            return
        trial.invalidations += 1
        self.s.extensions = 0
        self.goto(step=Step.WAITING_READY)
        self.s.measure_from = self.s.measure_until = None
        self.event(
            "Normal",
            "TrialRemeasured",
            f"trial {trial.id}: {obs.reason or 'pods restarted'} during the measurement; the window is "
            "discarded and the trial re-measured after the pods are ready and warm",
        )

    def on_metrics_unavailable(self, obs: Observation) -> None:
        if not self.s.metrics_held:
            self.condition("MetricsUnavailable", True, "MetricsUnavailable", obs.reason or "no metrics")
            self.event(
                "Warning",
                "MetricsUnavailable",
                f"{obs.reason or 'metrics are unavailable'}; holding: no rollout until they return",
            )
        self.s.metrics_held = True

    def release_hold(self) -> bool:
        """Metrics are back: clear the condition; a window that spanned the gap is re-measured."""
        if not self.s.metrics_held:
            return False
        self.s.metrics_held = False
        self.condition("MetricsUnavailable", False, "MetricsAvailable", "metrics are available again")
        if self.s.step in (Step.MEASURING, Step.WATCHING):
            self.s.measure_from = self.now
            if self.s.step == Step.MEASURING:
                self.s.measure_until = self.now + self.s.settings.measure_s
            return True
        return False

    # -- measurement windows ---------------------------------------------------------------------
    def on_window(self, obs: Observation) -> None:
        signals = obs.signals
        if signals is None or _all_missing(signals):
            self.on_metrics_unavailable(
                Observation(kind="metrics_unavailable", reason="window has no signals")
            )
            return
        if self.release_hold():
            return
        if self.s.phase == Phase.CONVERGED:
            if self.s.step == Step.WATCHING and not obs.partial:
                self.check_drift(obs)
            return
        if self.s.step != Step.MEASURING:
            return
        trial = self.active()
        if trial is None:
            return
        settings = self.s.settings
        if obs.partial:
            breach = severe_breach(signals, settings.slo, settings.abort_factor)
            enough = (signals.requests or 0) >= max(1.0, settings.min_requests / 4)
            if breach and enough and trial.role == "trial":
                self.abort(trial, signals, breach)
            return
        if self.s.measure_until is not None and self.now < self.s.measure_until - 1e-9:
            return  # a full window reported early: keep measuring
        if self.s.settings.verify_applied and not trial.verified:
            # What the engine runs was not read back yet: a window of an unverified config is not
            # scored (it may not be the trial's config at all). Measure again once it is checked.
            self.begin_measuring()
            return
        self.goto(step=Step.SCORING)
        self.score_trial(trial, obs)

    def score_trial(self, trial: Trial, obs: Observation) -> None:
        settings = self.s.settings
        assert obs.signals is not None
        canary = settings.strategy == "canary" and trial.role == "trial" and obs.baseline_signals is not None
        result: Score | InsufficientData
        value: float | None = None
        if canary:
            assert obs.baseline_signals is not None
            pair = paired(
                obs.signals, obs.baseline_signals, settings.objective, settings.slo, settings.min_requests,
                obs.canary_pods, obs.baseline_pods,
            )  # fmt: skip
            if isinstance(pair, InsufficientData):
                result = pair
            else:
                result = pair.canary
                value = self.paired_value(pair.ratio, pair.canary.value)
        else:
            result = score(obs.signals, settings.objective, settings.slo, settings.min_requests)
            if isinstance(result, Score):
                value = load_normalized(
                    result.value, settings.objective, obs.offered_rps, self.s.reference_rps
                )
        if isinstance(result, InsufficientData):
            self.insufficient(trial, result)
            return
        assert value is not None
        trial.signals = obs.signals
        trial.score = result.value
        trial.basis = result.basis
        self.finish_trial(trial, "ok", value=value, reason=_score_text(result))
        before = self.s.best
        best_now = self.best_by_mean()
        self.s.best = None if best_now is None else best_now.id
        is_best = best_now is not None and best_now.id == trial.id
        if is_best:
            self.s.reference = obs.signals
            if trial.role == "baseline" or self.s.reference_rps is None:
                self.s.reference_rps = obs.offered_rps
        elif best_now is not None and best_now.id != before and best_now.signals is not None:
            self.s.reference = best_now.signals  # a confirmation demoted the old best
        self.event(
            "Normal",
            "BaselineMeasured" if trial.role == "baseline" else "TrialScored",
            f"trial {trial.id} {_cfg(trial.config)}: {_score_text(result)}; value {value:.4g}"
            + (f" ({'new best' if is_best else f'best is trial {best_now.id}'})" if best_now else "")
            + f"; {_evidence(obs.signals)}",
        )
        if trial.role == "baseline":
            self.goto(Phase.EXPLORING, Step.IDLE)
        else:
            self.goto(step=Step.IDLE)
        self.decide()

    def stable_trial(self) -> Trial | None:
        """The latest ok trial of this epoch measured on the config the stable (baseline) pods run."""
        for t in reversed(self.s.trials):
            if t.epoch == self.s.epoch and t.outcome == "ok" and t.config == self.s.current:
                return t
        return None

    def paired_value(self, ratio: float, own: float) -> float:
        """A canary's value: the stable config's value moved by the same-window ratio.

        The anchor is what the baseline pods run now (``current``), not the best trial: the ratio
        compares the canary with those pods. Without a usable anchor (none measured, a zero score,
        an infinite ratio) the canary's own score is used.
        """
        stable = self.stable_trial()
        anchor = stable.value if stable is not None else None
        if anchor is None or not math.isfinite(ratio) or ratio <= 0 or not math.isfinite(anchor):
            return own
        scaled = goal(self.s.settings.objective).scaled(anchor, ratio)
        return own if scaled is None else scaled

    def insufficient(self, trial: Trial, why: InsufficientData) -> None:
        settings = self.s.settings
        if why.missing:
            # Required signals missing: hold, and measure again once they return.
            self.on_metrics_unavailable(Observation(kind="metrics_unavailable", reason=why.reason))
            self.begin_measuring()
            return
        if self.s.extensions < settings.max_extensions:
            self.s.extensions += 1
            self.goto(step=Step.MEASURING)
            self.s.measure_until = self.now + settings.measure_s
            self.event("Normal", "WindowExtended", f"trial {trial.id}: {why.reason}; measuring longer")
            return
        self.finish_trial(trial, "invalidated", reason=why.reason, failure=TOO_LITTLE_TRAFFIC)
        self.event(
            "Warning", "TrialInvalidated", f"trial {trial.id}: {why.reason} after extensions; not scored"
        )
        if trial.role == "baseline":
            # No usable baseline: the workload is too light to tune against; watch and retry later.
            self.goto(Phase.CONVERGED, Step.WATCHING)
            self.s.note = "too little traffic to measure a baseline"
            self.s.measure_from = self.now
            self.condition("Tuning", False, "InsufficientTraffic", self.s.note)
            return
        self.goto(step=Step.IDLE)
        starved = [
            t for t in self.epoch_trials()
            if t.role == "trial" and t.failure == TOO_LITTLE_TRAFFIC and t.config == trial.config
        ]  # fmt: skip
        if len(starved) >= MAX_STARVED_REPEATS:
            # The optimizer learns nothing from an unscored trial and would suggest it again.
            self.converge(
                f"too little traffic: {_cfg(trial.config)} invalidated {len(starved)} times this epoch "
                f"({why.reason}); keeping the best measured config and watching",
                condition_reason="InsufficientTraffic",
            )
            return
        self.decide()

    def abort(self, trial: Trial, signals: Signals, breach: str) -> None:
        partial = score(signals, self.s.settings.objective, self.s.settings.slo, 1)
        trial.signals = signals
        value = partial.value if isinstance(partial, Score) else None
        trial.score = value
        self.finish_trial(trial, "aborted", value=value, reason=f"severe SLO breach: {breach}", failure="")
        self.event(
            "Warning",
            "TrialAborted",
            f"trial {trial.id} {_cfg(trial.config)} aborted early: {breach} on a partial window of "
            f"{signals.requests or 0:g} requests; rolling back to {_cfg(self.best_config())}",
        )
        self.rollback(self.best_config(), f"trial {trial.id} aborted: {breach}")

    def finish_trial(
        self, trial: Trial, outcome: str, *, value: float | None = None, reason: str = "", failure: str = ""
    ) -> None:
        trial.outcome = outcome  # type: ignore[assignment]
        trial.value = value
        trial.reason = reason
        trial.failure = failure
        trial.finished_at = self.now
        self.s.active = None
        self.s.extensions = 0
        self.s.measure_from = self.s.measure_until = self.s.warm_until = None
        self.actions.append(RecordTrial(trial.model_copy(deep=True)))
        if self.s.metrics_held and outcome != "ok":
            # The hold was for this trial's window, which is gone unscored (a crash, an abort, a spec
            # change). Kept, it would block every decision while nothing measures that could clear
            # it; the next window checks the metrics again (and holds again if they are still out).
            self.s.metrics_held = False
            self.condition(
                "MetricsUnavailable", False, "WindowEnded",
                f"the window held for missing metrics ended: trial {trial.id} {outcome}, not scored",
            )  # fmt: skip

    # -- decisions -------------------------------------------------------------------------------
    def history(self) -> list[TrialResult]:
        """Finished trials for the optimizer: this epoch as measured, earlier epochs rescaled."""
        out: list[TrialResult] = []
        base = next((t for t in self.epoch_trials() if t.role == "baseline" and t.value is not None), None)
        for t in self.s.trials:
            if t.outcome in ("infeasible", "not_applied"):
                out.append(TrialResult(t.config, None, t.failure))
            elif t.outcome == "aborted":
                out.append(TrialResult(t.config, t.value, "aborted"))
            elif t.outcome == "ok" and t.value is not None:
                if t.epoch == self.s.epoch:
                    out.append(TrialResult(t.config, t.value))
                elif base is not None and base.value is not None:
                    # Warm start: the new baseline re-measured the old best, which rescales old values.
                    old = self.epoch_best(t.epoch)
                    if old is not None and old.value:
                        out.append(TrialResult(t.config, t.value * base.value / old.value))
        return out

    def epoch_best(self, epoch: int) -> Trial | None:
        ok = [t for t in self.s.trials if t.epoch == epoch and t.outcome == "ok" and t.value is not None]
        return max(ok, key=lambda t: (t.value or 0.0, -t.id)) if ok else None

    def decide(self) -> None:
        """Exploring, nothing in flight: start the next trial, or converge."""
        settings = self.s.settings
        if self.s.metrics_held:
            return
        if self.explored() >= settings.max_trials:
            self.converge(f"budget spent: {self.explored()} trials (maxTrials {settings.max_trials})")
            return
        if self.rate_limited_until() is not None:
            return  # wait; the next tick decides again
        unconfirmed = self.unconfirmed_best()
        if unconfirmed is not None and settings.n_initial < self.explored() == settings.max_trials - 1:
            # The last trial of the budget confirms the best rather than exploring once more (not in
            # budgets within the initial design: there every trial is needed to explore).
            self.start_trial(unconfirmed.config, self.confirm_reason(unconfirmed, "the budget's last trial"))
            return
        space = space_of(self.s)
        seed = seed_from(settings.seed_key or self.s.engine, self.s.epoch)
        suggestion = self.suggester(space, self.history(), seed, settings)
        if suggestion.config is None or suggestion.converged:
            if unconfirmed is not None:
                self.start_trial(unconfirmed.config, self.confirm_reason(unconfirmed, suggestion.reason))
                return
            self.converge(suggestion.reason)
            return
        self.start_trial(space.normalize(suggestion.config), suggestion.reason)

    def unconfirmed_best(self) -> Trial | None:
        """The best trial when its config was measured in one window only (and not the baseline's):
        near a capacity limit one lucky arrival sequence can make a config look best, so the policy
        measures it once more before it converges on it (the best is then ranked by its mean)."""
        best = self.best_trial()
        if best is None or best.role == "baseline" or len(self.measurements(best.config)) > 1:
            return None
        return best

    def confirm_reason(self, best: Trial, why: str) -> str:
        return f"confirm the best (trial {best.id}, one window {best.value:.4g}) before converging: {why}"

    def start_trial(self, config: KnobConfig, reason: str) -> None:
        settings = self.s.settings
        t = Trial(
            id=self.s.next_trial_id, epoch=self.s.epoch, role="trial", config=config, started_at=self.now,
            reason=reason,
        )  # fmt: skip
        self.s.next_trial_id += 1
        self.s.trials.append(t)
        self.s.active = t.id
        self.s.target = config
        self.s.last_rollout_at = self.now
        self.goto(step=Step.ROLLING_OUT)
        self.actions.append(RollOut(config, settings.strategy, reason, trial=t.id))
        best = self.best_trial()
        self.event(
            "Normal",
            "TrialStarted",
            f"trial {t.id} ({self.explored()}/{settings.max_trials}): {_cfg(config)} "
            f"via {settings.strategy}; {reason}"
            + (f"; best so far trial {best.id} {_cfg(best.config)} value {best.value:.4g}" if best else ""),
        )

    def converge(self, reason: str, condition_reason: str = "Converged") -> None:
        self.goto(Phase.CONVERGED, Step.IDLE)
        self.s.note = reason
        best = self.best_trial()
        msg = f"{reason}; best {_cfg(self.best_config())}" + (f" value {best.value:.4g}" if best else "")
        self.event("Normal", "Converged", msg)
        self.condition("Tuning", False, condition_reason, msg)
        self.apply_best()

    def apply_best(self) -> None:
        best = self.best_config()
        if best == self.s.current and self.s.settings.strategy == "rolling":
            self.goto(step=Step.WATCHING)
            self.s.measure_from = self.now
            return
        if self.rate_limited_until() is not None or self.s.metrics_held:
            return  # Converged/Idle: the next tick applies it
        self.actions.append(RollOut(best, "rolling", f"apply the best config: {self.s.note}"))
        self.s.target = best
        self.s.last_rollout_at = self.now
        self.goto(step=Step.ROLLING_OUT)

    def check_drift(self, obs: Observation) -> None:
        ref = self.s.reference
        assert obs.signals is not None
        if ref is None:
            # No usable baseline yet (too little traffic): start tuning once a window can be scored.
            settings = self.s.settings
            if isinstance(score(obs.signals, settings.objective, settings.slo, settings.min_requests), Score):
                self.event("Normal", "TrafficSufficient", "enough traffic to measure: starting the baseline")
                self.s.epoch += 1
                self.begin_baseline(warm=False)
            return
        moved = drift(
            ref, obs.signals, self.s.settings.drift_threshold, self.s.reference_rps, obs.offered_rps
        )
        if not moved:
            return
        self.event(
            "Normal",
            "DriftDetected",
            "workload moved since the best config was measured: "
            + "; ".join(moved)
            + f"; re-tuning (epoch {self.s.epoch + 1}) with the {len(self.s.trials)} earlier trials "
            "as warm start",
        )
        self.s.epoch += 1
        self.s.reference = None
        self.s.reference_rps = None
        self.begin_baseline(warm=False)

    # -- observe mode ----------------------------------------------------------------------------
    def on_observing(self, obs: Observation) -> None:
        if obs.kind != "window" or obs.partial or obs.signals is None:
            return
        if _all_missing(obs.signals):
            self.on_metrics_unavailable(
                Observation(kind="metrics_unavailable", reason="window has no signals")
            )
            return
        self.release_hold()
        settings = self.s.settings
        current = score(obs.signals, settings.objective, settings.slo, settings.min_requests)
        if isinstance(current, InsufficientData):
            return
        self.s.reference = obs.signals
        pick: tuple[KnobConfig, str] | None = None
        space = space_of(self.s)
        estimates: list[tuple[float, KnobConfig, Score]] = []
        for w in obs.what_if:
            est = score(w.signals, settings.objective, settings.slo, 1)
            cfg = space.normalize(w.config)
            if isinstance(est, Score) and cfg != space.normalize(self.s.current):
                estimates.append((est.value, cfg, est))
        if estimates:
            value, cfg, est = max(estimates, key=lambda e: (e[0], -estimates.index(e)))
            if _better(settings.objective, value, current.value, RECOMMEND_MARGIN):
                pick = (
                    cfg,
                    f"twin what-if: {est.basis} {value:.4g} vs measured {current.value:.4g} for the running "
                    f"config over {obs.signals.window_s:g}s ({_evidence(obs.signals)})",
                )
        if pick is None:
            hit = obs.signals.hit_rate
            if self.s.current.prefix_caching and hit is not None and hit < LOW_HIT_RATE:
                cfg = space.normalize(self.s.current.with_(prefix_caching=False))
                pick = (
                    cfg,
                    f"hit rate {hit:.1%} < {LOW_HIT_RATE:.0%}: the prefix cache holds memory for nothing",
                )
        if pick is not None and pick[0] != self.s.recommendation:
            self.s.recommendation = pick[0]
            self.actions.append(Recommend(pick[0], pick[1]))
            self.event("Normal", "Recommendation", f"recommend {_cfg(pick[0])}: {pick[1]} (observe mode)")

    # -- spec changes ----------------------------------------------------------------------------
    def on_spec_changed(self, obs: Observation) -> None:
        old = self.s.settings
        new = obs.settings or old
        if obs.generation is not None:
            self.s.spec_generation = obs.generation
        config_changed = obs.config is not None and obs.config != self.s.spec_config
        # First sight of the key (a state from before keys existed): store it, restart nothing.
        deployment_changed = (
            bool(self.s.deployment_key)
            and bool(obs.deployment_key)
            and (obs.deployment_key != self.s.deployment_key)
        )
        if obs.deployment_key:
            self.s.deployment_key = obs.deployment_key
        if (new.missing_signals, new.refusal) != (old.missing_signals, old.refusal):
            self.s.settings = new
            self.signals_condition()
        search_changed = (new.objective, new.slo, new.space, new.method, new.refusal) != (
            old.objective, old.slo, old.space, old.method, old.refusal
        )  # fmt: skip
        self.s.settings = new
        in_flight = self.s.step in TRIAL_STEPS
        trial = self.active()
        if config_changed:
            assert obs.config is not None
            self.s.spec_config = obs.config
            self.s.current = obs.config  # the controller rolls the user's config out itself
        if trial is not None:
            self.finish_trial(trial, "invalidated", reason="spec changed during the trial")
        if new.mode == "off":
            if in_flight and trial is not None and trial.role == "trial" and not config_changed:
                self.rollback(self.best_config(), "tuning turned off during a trial")
            self.goto(Phase.PAUSED, Step.IDLE if self.s.step != Step.ROLLING_BACK else Step.ROLLING_BACK)
            self.condition("Tuning", False, "TuningOff", "tuning.mode is off")
            return
        if new.mode == "observe":
            if in_flight and trial is not None and trial.role == "trial" and not config_changed:
                self.rollback(self.best_config(), "observe mode: the trial is rolled back")
            self.s.phase = Phase.OBSERVING
            if self.s.step != Step.ROLLING_BACK:
                self.goto(Phase.OBSERVING, Step.MEASURING)
            self.condition("Tuning", False, "Observing", "tuning.mode is observe: measuring and recommending")
            return
        # auto
        if new.refusal:
            if in_flight and trial is not None and trial.role == "trial" and not config_changed:
                self.rollback(self.best_config(), "the objective cannot be scored on this engine release")
            if self.s.step != Step.ROLLING_BACK:
                self.goto(Phase.OBSERVING, Step.MEASURING)
                self.s.measure_from = self.now
            self.s.phase = Phase.OBSERVING
            self.condition("Tuning", False, "SignalsMissing", new.refusal)
            return
        restart = old.mode != "auto" or config_changed or search_changed or deployment_changed
        if restart or self.s.phase in (Phase.PENDING, Phase.FAILED):
            if self.s.trials:
                self.s.epoch += 1
            self.s.reference = None
            self.s.reference_rps = None
            self.s.note = ""
            if deployment_changed:
                self.event(
                    "Normal",
                    "DeploymentChanged",
                    (
                        obs.reason
                        or "the deployment changed (engine, model, image, replicas, GPUs or extra args)"
                    )
                    + f": earlier measurements do not describe it; re-tuning (epoch {self.s.epoch}) from a "
                    f"fresh baseline with the {len(self.s.trials)} earlier trials as warm start",
                )
            self.begin_baseline(warm=config_changed or deployment_changed or self.s.phase in (Phase.PENDING,))
            return
        if in_flight and trial is not None:
            # Only timing/budget/rollout settings changed: re-run what was in flight.
            if trial.role == "baseline":
                self.begin_baseline(warm=False)
                return
            self.goto(step=Step.IDLE)
            self.decide()


def drift(
    ref: Signals, now: Signals, threshold: float, ref_rps: float | None = None, now_rps: float | None = None
) -> list[str]:
    """What moved beyond ``threshold`` between two windows: hit rate (absolute), mean prompt and
    output lengths and the arrival rate (relative). Empty when nothing did."""
    moved: list[str] = []
    if ref.hit_rate is not None and now.hit_rate is not None and abs(now.hit_rate - ref.hit_rate) > threshold:
        moved.append(f"hit rate {ref.hit_rate:.1%} -> {now.hit_rate:.1%}")
    pairs = [
        ("mean prompt tokens", _per_request(ref, "input"), _per_request(now, "input")),
        ("mean output tokens", _per_request(ref, "output"), _per_request(now, "output")),
        ("arrival rate", ref_rps or ref.requests_per_s, now_rps or now.requests_per_s),
    ]  # fmt: skip
    for name, a, b in pairs:
        if a and b and abs(b - a) / a > threshold:
            moved.append(f"{name} {a:.4g} -> {b:.4g}")
    return moved


def _per_request(s: Signals, which: str) -> float | None:
    tokens_per_s = s.input_tokens_per_s if which == "input" else s.output_tokens_per_s
    if tokens_per_s is None or not s.requests_per_s:
        return None
    return tokens_per_s / s.requests_per_s


def _better(objective: str, a: float, b: float, margin: float) -> bool:
    return goal(objective).beats(a, b, margin)


def _all_missing(s: Signals) -> bool:
    return len(s.missing()) == len(s.to_dict()) - 1


def _cfg(c: KnobConfig) -> str:
    return f"[{config_text(c)}]"


def _score_text(s: Score) -> str:
    text = f"{s.objective} {s.value:.4g} ({s.basis}, {s.requests:g} requests)"
    if s.breaches:
        text += "; SLO breached: " + ", ".join(s.breaches)
    return text


def _evidence(s: Signals) -> str:
    parts = []
    for label, value, fmt in (
        ("hit rate", s.hit_rate, "{:.1%}"),
        ("TTFT p99", s.ttft_p99_s, "{:.3g}s"),
        ("ITL p99", s.itl_p99_s, "{:.3g}s"),
        ("output", s.output_tokens_per_s, "{:.4g} tok/s"),
    ):
        if value is not None:
            parts.append(f"{label} {fmt.format(value)}")
    return ", ".join(parts) or "no signals"

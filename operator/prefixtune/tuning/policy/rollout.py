"""Rollouts: starting a trial, the pods becoming ready or failing, rollbacks, the read-back check."""

from __future__ import annotations

from prefixtune.engines.base import KnobConfig
from prefixtune.engines.knobs import Restarts
from prefixtune.tuning import routed
from prefixtune.tuning.actions import (
    RollBack,
    RollOut,
)
from prefixtune.tuning.phases import WINDOW_STEPS, Phase, Step
from prefixtune.tuning.policy import (
    exploration,
    measurement,
    rollout,
)
from prefixtune.tuning.policy._core import Core, space_of
from prefixtune.tuning.policy.messages import config_label
from prefixtune.tuning.state import CapacityWait, ConfigChecked, RolloutNoCapacity, RolloutReady, Trial

# A trial that found no capacity is tried again after this, doubling per attempt up to the max: a
# GPU freed by another workload is seen within minutes, and a full cluster is not polled every tick.
NO_CAPACITY_BACKOFF_S = 60.0
NO_CAPACITY_BACKOFF_MAX_S = 900.0
NO_CAPACITY = "no_capacity"
ROUTER_NOT_READY = "router_not_ready"  # Trial.failure of a router-only trial whose router never came up


def no_capacity_backoff_s(attempts: int) -> float:
    """Seconds to wait after the ``attempts``-th trial in a row that found no capacity."""
    return float(min(NO_CAPACITY_BACKOFF_S * 2 ** max(attempts - 1, 0), NO_CAPACITY_BACKOFF_MAX_S))


def on_ready(self: Core, obs: RolloutReady) -> None:
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
        if trial is not None and self.strategy_of(trial) == "rolling":
            self.s.current = trial.config
        wait = self.s.capacity_wait
        if trial is not None and wait is not None and wait.config == trial.config:
            self.s.capacity_wait = None  # capacity returned: the Tuning condition says Exploring again
        self.s.target = None
        self.goto(step=Step.WARMING_UP)
        self.s.warm_until = self.now + self.s.settings.warmup_s
        if self.s.settings.warmup_s <= 0:
            measurement.begin_measuring(self)
    elif st == Step.ROLLING_BACK:
        self.s.current = self.s.target or self.s.current
        self.s.target = None
        self.goto(step=Step.IDLE if self.s.phase != Phase.CONVERGED else Step.WATCHING)
        if self.s.phase == Phase.CONVERGED:
            self.s.measure_from = self.now


def on_failed(self: Core, failure: str, detail: str) -> None:
    st = self.s.step
    if st == Step.ROLLING_BACK:
        self.goto(Phase.FAILED, Step.IDLE)
        self.s.note = f"rollback to {self.s.target} failed ({failure}): manual action needed"
        self.s.note_reason = None
        self.event("Warning", "RollbackFailed", self.s.note)
        self.condition("Degraded", True, "RollbackFailed", self.s.note)
        return
    trial = self.active()
    if trial is not None and trial.role == "baseline" and st in WINDOW_STEPS:
        # The running (spec) config itself fails: record it and search for one that works.
        measurement.finish_trial(
            self, trial, "infeasible", reason=f"{failure}: {detail}".rstrip(": "), failure=failure
        )
        self.event(
            "Warning",
            "BaselineInfeasible",
            f"the running config {config_label(trial.config)} failed: {failure} {detail}".rstrip()
            + "; recorded as infeasible, exploring for a config that works",
        )
        self.goto(Phase.EXPLORING, Step.IDLE)
        exploration.decide(self)
        return
    if trial is None or trial.role != "trial" or st not in (
        Step.ROLLING_OUT, Step.WAITING_READY, Step.WARMING_UP, Step.MEASURING
    ):  # fmt: skip
        if self.s.phase == Phase.CONVERGED and st in (
            Step.ROLLING_OUT,
            Step.WAITING_READY,
            Step.WATCHING,
        ):
            rollout.rollback(self, self.s.current, f"applying the best config failed ({failure})")
        return
    measurement.finish_trial(
        self, trial, "infeasible", reason=f"{failure}: {detail}".rstrip(": "), failure=failure
    )
    self.event(
        "Warning",
        "TrialInfeasible",
        f"trial {trial.id} {config_label(trial.config)} failed: {failure} {detail}".rstrip()
        + "; recorded as infeasible, the optimizer will avoid it; rolling back",
    )
    rollout.rollback(self, self.best_config(), f"trial {trial.id} infeasible ({failure})")


def on_router_not_ready(self: Core, trial: Trial, timeout: float) -> None:
    """A trial of router knobs alone whose router is not available in time: the engines were ready at
    once, so the config's engine part is not in question (not infeasible); the trial is aborted and
    rolled back to the previous routing (the best config's)."""
    why = f"the router was not available within {timeout:g}s"
    measurement.finish_trial(self, trial, "aborted", reason=why, failure=ROUTER_NOT_READY)
    self.event(
        "Warning",
        "RouterNotReady",
        f"trial {trial.id} {config_label(trial.config)}: {why}; aborted (the engines' config is not "
        "recorded infeasible), rolling back to the previous routing",
    )
    rollback(self, self.best_config(), f"trial {trial.id}: {why}")


def on_no_capacity(self: Core, obs: RolloutNoCapacity) -> None:
    """A pod of the rollout is Pending for lack of capacity: end the trial unscored (the config is
    not infeasible), roll back so nothing is left half-done, retry the same config after a backoff."""
    st = self.s.step
    if st not in (Step.ROLLING_OUT, Step.WAITING_READY):
        return  # a rollback waits for its pods (its timeout applies); nothing else is rolling out
    if obs.config is not None and self.s.target is not None and obs.config != self.s.target:
        return  # a stale report about an earlier rollout
    trial = self.active()
    if trial is None or trial.role != "trial":
        # Converged, applying the best: back to what runs; apply_best tries again after minInterval.
        self.event(
            "Warning", "NoCapacity", f"applying the best config: {obs.reason}; rolling back, retrying later"
        )
        rollback(self, self.s.current, f"no capacity to apply the best config ({obs.reason})")
        return
    before = self.s.capacity_wait
    attempts = before.attempts + 1 if before is not None and before.config == trial.config else 1
    delay = no_capacity_backoff_s(attempts)
    self.s.capacity_wait = CapacityWait(
        config=trial.config,
        epoch=trial.epoch,
        attempts=attempts,
        retry_at=self.now + delay,
        reason=obs.reason,
    )
    measurement.finish_trial(
        self, trial, "invalidated", reason=f"no capacity: {obs.reason}", failure=NO_CAPACITY
    )
    message = (
        f"trial {trial.id} {config_label(trial.config)} paused: {obs.reason}; not a property of the "
        f"config (not recorded infeasible), rolled back; trying it again in {delay:g}s (attempt {attempts})"
    )
    self.event("Warning", "NoCapacity", message)
    rollback(self, self.s.current, f"trial {trial.id}: no capacity")


def retry_after_no_capacity(self: Core) -> bool:
    """Exploring and idle with a trial waiting for capacity: True while it waits (nothing else may
    start), or after starting it again once the backoff is over."""
    wait = self.s.capacity_wait
    if wait is not None and wait.epoch != self.s.epoch:
        self.s.capacity_wait = wait = None
    if wait is None:
        return False
    if self.now >= wait.retry_at:
        start_trial(
            self, wait.config, f"retry after no capacity (attempt {wait.attempts + 1}): {wait.reason}"
        )
    return True


def rollback(self: Core, to: KnobConfig, reason: str) -> None:
    self.actions.append(RollBack(to, reason))
    self.s.target = to
    self.s.last_rollout_at = self.now
    self.goto(step=Step.ROLLING_BACK)


def on_config_checked(self: Core, obs: ConfigChecked) -> None:
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
            why = f"trial {trial.id} {config_label(trial.config)}: {obs.reason}; scored without that check"
            self.event("Warning", "KnobsUnverified", why)
        return
    detail = "; ".join(obs.mismatches)
    measurement.finish_trial(
        self, trial, "not_applied", reason=f"the engine does not run it: {detail}", failure="not_applied"
    )
    self.event(
        "Warning",
        "KnobNotApplied",
        f"trial {trial.id} {config_label(trial.config)}: the engine ignored or overrode {detail}; "
        "not scored (the optimizer will avoid it)",
    )
    if trial.role == "baseline":
        self.goto(Phase.EXPLORING, Step.IDLE)
        exploration.decide(self)
        return
    rollout.rollback(self, self.best_config(), f"trial {trial.id} not applied by the engine")


def start_trial(self: Core, config: KnobConfig, reason: str, *, gate_window: bool = False) -> None:
    settings = self.s.settings
    running = space_of(self.s).normalize(self.s.current)  # ``auto`` resolved: the policy it runs
    strategy = routed.trial_strategy(settings.strategy, running, config)
    cost = routed.price(running, config, settings.ready_timeout_s)
    t = Trial(
        id=self.s.next_trial_id, epoch=self.s.epoch, role="trial", config=config, started_at=self.now,
        reason=reason, strategy=strategy, router_only=not cost.engines_restart and bool(cost.restarts),
        gate_window=gate_window,
    )  # fmt: skip
    self.s.next_trial_id += 1
    self.s.trials.append(t)
    self.s.active = t.id
    self.s.target = config
    self.s.last_rollout_at = self.now
    self.goto(step=Step.ROLLING_OUT)
    self.actions.append(RollOut(config, strategy, reason, trial=t.id))
    best = self.best_trial()
    routing = "" if strategy == settings.strategy else " (a routing change serves every pod)"
    routing += f" ({cost.text()})" if Restarts.ROUTER in cost.restarts else ""
    self.event(
        "Normal",
        "TrialStarted",
        f"trial {t.id} ({self.explored()}/{settings.max_trials}): {config_label(config)} "
        f"via {strategy}{routing}; {reason}"
        + (
            f"; best so far trial {best.id} {config_label(best.config)} value {best.value:.4g}"
            if best
            else ""
        ),
    )


def apply_best(self: Core) -> None:
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

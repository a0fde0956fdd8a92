"""A spec change: new settings, a new baseline config, a new deployment (a new epoch), or only
new replicas (a serving parameter: nothing about the tuning changes)."""

from __future__ import annotations

import dataclasses

from prefixtune.engines.base import KnobConfig
from prefixtune.tuning.phases import HALTED_PHASES, TRIAL_STEPS, WINDOW_STEPS, Phase, Step
from prefixtune.tuning.policy import (
    control,
    exploration,
    measurement,
    rollout,
)
from prefixtune.tuning.policy._core import SPEC_INVALID, Core
from prefixtune.tuning.policy.messages import config_label
from prefixtune.tuning.state import PolicyState, SpecChanged, SpecInvalid


def on_spec_invalid(self: Core, obs: SpecInvalid) -> None:
    """An invalid spec mid-trial: abort the trial and roll back to the safe config (what the stable
    pods ran before it), so no canary keeps half the traffic and no replica stays on an untested
    config while nobody can fix the resource but its owner. The trial is recorded aborted
    (``spec_invalid``: not learned, not counted); the rest of the state is kept, and the policy
    resumes from it when the spec is fixed (a spec change like any other)."""
    trial = self.active()
    if (
        self.s.phase in HALTED_PHASES
        or trial is None
        or trial.role != "trial"
        or self.s.step not in TRIAL_STEPS
    ):
        return
    # Rolling: ``current`` is the trial's config once its pods were ready; the best measured one
    # is the safe config then (as after an abort for an SLO breach).
    safe = self.s.current if self.s.current != trial.config else self.best_config()
    why = (obs.reason or "the spec does not validate")[:300]
    reason = f"the spec became invalid during the trial: {why}"
    measurement.finish_trial(self, trial, "aborted", reason=reason, failure=SPEC_INVALID)
    self.event(
        "Warning",
        "TrialAborted",
        f"trial {trial.id} {config_label(trial.config)} aborted: the spec became invalid ({why}); "
        f"restoring {config_label(safe)} with the last valid spec's replicas; tuning resumes when "
        "the spec is fixed",
    )
    rollout.rollback(self, safe, f"trial {trial.id} aborted: invalid spec")


def replicas_only(state: PolicyState, obs: SpecChanged) -> bool:
    """Whether a spec change leaves everything the tuning depends on as it was: the rest of the
    spec hashes the same (``spec_key``; the rollout strategy's default follows the replicas and
    is part of it), so do the knobs and the pods' deployment key, and the settings differ at most
    in the ready timeout (sized from the replicas). So: a change of ``spec.replicas`` alone
    (``kubectl scale``, an HPA through the scale subresource), or an edit that changed nothing.
    A key that is not known (a caller without it, a state an older operator wrote) never counts."""
    if not obs.spec_key or obs.spec_key != state.spec_key:
        return False
    if obs.deployment_key and obs.deployment_key != state.deployment_key:
        return False
    if obs.config is not None and obs.config != state.spec_config:
        return False
    new = obs.settings or state.settings
    return dataclasses.replace(new, ready_timeout_s=state.settings.ready_timeout_s) == state.settings


def on_replicas_changed(self: Core, obs: SpecChanged) -> None:
    """The replicas alone changed: the pods are the same config, more or fewer of them. The epoch,
    the trial in flight (its id, config and canary) and the history stay; only the ready timeout
    follows the new count. A trial's window in flight is discarded and measured again after a new
    warm-up (``measurement.rewarm``): it spans two pod counts, and the pods' share of the traffic
    moved (canary scores compare per pod measured, rolling ones are normalized by the offered load,
    so windows measured at other replica counts stay comparable). A rollout in flight goes on
    (ready means at the new count)."""
    before = self.s.replicas
    if obs.replicas is not None:
        self.s.replicas = obs.replicas
    if obs.settings is not None:
        self.s.settings = obs.settings
    if obs.replicas is None or obs.replicas == before:
        return
    trial = self.active()
    kept = f"; trial {trial.id} {config_label(trial.config)} keeps running" if trial is not None else ""
    self.event(
        "Normal", "Scaled", f"replicas {before} -> {obs.replicas}: the same epoch ({self.s.epoch}){kept}"
    )
    if trial is not None and self.s.step in WINDOW_STEPS:
        measurement.rewarm(self, trial, f"scaled from {before} to {obs.replicas} replicas")


def on_spec_changed(self: Core, obs: SpecChanged) -> None:
    # A scale is not an edit by someone who looked: a Failed resource stays Failed (its Deployments
    # follow the new count), and only an edit of something else starts it again.
    if self.s.phase != Phase.PENDING and replicas_only(self.s, obs):
        if obs.generation is not None:
            self.s.spec_generation = obs.generation
        on_replicas_changed(self, obs)
        return
    if obs.spec_key:
        self.s.spec_key = obs.spec_key
    if obs.replicas is not None:
        self.s.replicas = obs.replicas
    old = self.s.settings
    new = obs.settings or old
    if obs.generation is not None:
        self.s.spec_generation = obs.generation
    config_changed = obs.config is not None and obs.config != self.s.spec_config
    # An observation without a key (the caller does not know it) changes nothing.
    deployment_changed = bool(obs.deployment_key) and obs.deployment_key != self.s.deployment_key
    if obs.deployment_key:
        self.s.deployment_key = obs.deployment_key
    if (new.missing_signals, new.refusal) != (old.missing_signals, old.refusal):
        self.s.settings = new
        self.signals_condition()
    # (the router decides which routing policies the space holds: another router, another search)
    search_changed = (new.objective, new.slo, new.space, new.method, new.refusal, new.router) != (
        old.objective, old.slo, old.space, old.method, old.refusal, old.router
    )  # fmt: skip
    self.s.settings = new
    in_flight = self.s.step in TRIAL_STEPS
    trial = self.active()
    if config_changed:
        assert obs.config is not None
        self.s.spec_config = obs.config
        self.s.current = obs.config  # the controller rolls the user's config out itself
    changed = config_changed or search_changed or deployment_changed or new.mode != old.mode
    resumed = False  # resumed from a pause after a change: restart as after any such edit
    if new.paused and new.mode != "off":
        control.pause(self, config_changed=config_changed, changed=changed)
        return
    if self.s.paused_from is not None:  # spec.tuning.paused turned false (or mode off took over)
        if new.mode == "off":
            self.s.paused_from, self.s.resume_fresh = None, False
        elif control.resume(self, changed=changed):
            return
        else:
            resumed = True
    if trial is not None:
        measurement.finish_trial(self, trial, "invalidated", reason="spec changed during the trial")
    if new.mode == "off":
        # Off runs the spec's config, what the user wrote: not a tuned one, and no trial's. (A new
        # spec config is already ``current``: the controller rolls it out itself.)
        on_trial = in_flight and trial is not None and trial.role == "trial"
        before = self.s.current
        if not config_changed and (on_trial or self.s.current != self.s.spec_config):
            rollout.rollback(self, self.s.spec_config, "tuning turned off: back to the spec's config")
        if old.mode != "off" or config_changed:
            turned_off(self, config_changed, before)
        self.goto(Phase.PAUSED, Step.IDLE if self.s.step != Step.ROLLING_BACK else Step.ROLLING_BACK)
        return
    if new.mode == "observe":
        if in_flight and trial is not None and trial.role == "trial" and not config_changed:
            rollout.rollback(self, self.best_config(), "observe mode: the trial is rolled back")
        self.s.phase = Phase.OBSERVING
        if self.s.step != Step.ROLLING_BACK:
            self.goto(Phase.OBSERVING, Step.MEASURING)
        return
    # auto
    if new.refusal:
        if in_flight and trial is not None and trial.role == "trial" and not config_changed:
            rollout.rollback(
                self, self.best_config(), "the objective cannot be scored on this engine release"
            )
        if self.s.step != Step.ROLLING_BACK:
            self.goto(Phase.OBSERVING, Step.MEASURING)
            self.s.measure_from = self.now
        self.s.phase = Phase.OBSERVING
        return
    restart = old.mode != "auto" or config_changed or search_changed or deployment_changed or resumed
    if restart or self.s.phase in (Phase.PENDING, Phase.FAILED):
        if self.s.trials:
            self.s.epoch += 1
        self.s.reference = None
        self.s.reference_rps = None
        self.s.note = ""
        self.s.note_reason = None
        if deployment_changed:
            self.event(
                "Normal",
                "DeploymentChanged",
                (obs.reason or "the deployment changed (engine, model, image, GPUs or extra args)")
                + f": earlier measurements do not describe it; re-tuning (epoch {self.s.epoch}) from a "
                f"fresh baseline with the {self.kept_trials()} earlier trials as warm start",
            )
        measurement.begin_baseline(
            self, warm=config_changed or deployment_changed or self.s.phase in (Phase.PENDING,)
        )
        return
    if in_flight and trial is not None:
        # Only timing/budget/rollout settings changed: re-run what was in flight.
        if trial.role == "baseline":
            measurement.begin_baseline(self, warm=False)
            return
        self.goto(step=Step.IDLE)
        exploration.decide(self)


def turned_off(self: Core, config_changed: bool, before: KnobConfig) -> None:
    """The Event of tuning turned off (``prefixtune rollback``: back to the spec's config) or of a
    config pinned (``prefixtune pin``: spec.config set to a measured trial's config, tuning off)."""
    spec = self.s.spec_config
    pinned = (
        next((t for t in reversed(self.s.trials) if t.config == spec and t.outcome == "ok"), None)
        if config_changed
        else None
    )
    if pinned is not None:
        value = f" (value {pinned.value:.4g}, epoch {pinned.epoch})" if pinned.value is not None else ""
        self.event(
            "Normal",
            "Pinned",
            f"tuning off with spec.config set to trial {pinned.id}'s config {config_label(spec)}{value}: "
            "it runs until tuning is turned on again",
        )
        return
    moved = f" (was {config_label(before)})" if before != spec else ""
    self.event("Normal", "TuningOff", f"tuning off: running the spec's config {config_label(spec)}{moved}")

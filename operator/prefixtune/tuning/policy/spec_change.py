"""A spec change: new settings, a new baseline config or a new deployment (a new epoch)."""

from __future__ import annotations

from prefixtune.tuning.phases import HALTED_PHASES, TRIAL_STEPS, Phase, Step
from prefixtune.tuning.policy import (
    exploration,
    measurement,
    rollout,
)
from prefixtune.tuning.policy._core import SPEC_INVALID, Core
from prefixtune.tuning.policy.messages import config_label
from prefixtune.tuning.state import SpecChanged, SpecInvalid


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


def on_spec_changed(self: Core, obs: SpecChanged) -> None:
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
        measurement.finish_trial(self, trial, "invalidated", reason="spec changed during the trial")
    if new.mode == "off":
        if in_flight and trial is not None and trial.role == "trial" and not config_changed:
            rollout.rollback(self, self.best_config(), "tuning turned off during a trial")
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
    restart = old.mode != "auto" or config_changed or search_changed or deployment_changed
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
                (obs.reason or "the deployment changed (engine, model, image, replicas, GPUs or extra args)")
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

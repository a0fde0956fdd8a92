"""A person's control of a tuning run: pause and resume (``spec.tuning.paused``), and the approval
of observe mode's recommendation (``Approved``: the annotation ``prefixtune.io/approve``).

Pinning a config and rolling back to the spec's are spec edits (``spec.config`` and ``tuning.mode:
off``, written by ``prefixtune pin``/``rollback``): ``spec_change`` handles them, and says which it
was in its Event.
"""

from __future__ import annotations

from prefixtune.tuning.actions import RollOut
from prefixtune.tuning.phases import ROLLOUT_STEPS, TRIAL_STEPS, Phase, Step
from prefixtune.tuning.policy import exploration, measurement, rollout
from prefixtune.tuning.policy._core import Core
from prefixtune.tuning.policy.messages import config_label
from prefixtune.tuning.state import (
    Approved,
    Observation,
    RolloutApplied,
    RolloutFailed,
    RolloutReady,
    Tick,
    recommendation_id,
)

PAUSED = "paused"  # Trial.failure of a trial stopped by a pause: not scored, not learned, not counted
# Where a pause can resume without a fresh baseline; from any other phase (Failed) resuming restarts.
RESUMABLE = frozenset({Phase.PENDING, Phase.BASELINE, Phase.EXPLORING, Phase.CONVERGED, Phase.OBSERVING})
RESUME_HINT = "set spec.tuning.paused to false (prefixtune resume NAME) to resume"


def paused_text(self: Core) -> str:
    return f"running {config_label(self.s.current)}; the epoch ({self.s.epoch}) and its trials are kept"


def pause(self: Core, *, config_changed: bool, changed: bool) -> None:
    """``spec.tuning.paused`` turned (or stays) true. The trial in flight ends invalidated
    (``paused``: not scored, not learned, not counted in the budget) and is rolled back to the stable
    config, so no canary or untested config runs while nobody watches; a baseline in flight ends the
    same way (its pods run the stable config already); applying the best is undone. A rollback in
    flight completes. ``changed``: the same edit changed what the tuning depends on (config, search,
    deployment, mode): resuming then starts a fresh baseline."""
    if self.s.paused_from is not None:  # already paused: remember an edit that makes resuming restart
        self.s.resume_fresh = self.s.resume_fresh or changed
        return
    origin = self.s.phase
    trial = self.active()
    stopped = ""
    if trial is not None and self.s.step in TRIAL_STEPS:
        measurement.finish_trial(self, trial, "invalidated", reason="tuning paused", failure=PAUSED)
        stopped = f"; {'the baseline' if trial.role == 'baseline' else 'trial'} {trial.id} stopped"
        if trial.role == "trial" and not config_changed:
            # Rolling: ``current`` is the trial's config once its pods were ready.
            safe = self.s.current if self.s.current != trial.config else self.best_config()
            rollout.rollback(self, safe, f"trial {trial.id} stopped: tuning paused")
            stopped += f" and rolled back to {config_label(safe)}"
    elif self.s.step in (Step.ROLLING_OUT, Step.WAITING_READY) and self.s.target is not None:
        # Applying the best (Converged) or an approved recommendation (Observing): undone.
        what = "the best config" if origin == Phase.CONVERGED else config_label(self.s.target)
        rollout.rollback(self, self.s.current, f"tuning paused while applying {what}")
        stopped = f"; applying {what} stopped, back to {config_label(self.s.current)}"
    self.s.paused_from = origin
    self.s.resume_fresh = changed or origin not in RESUMABLE
    self.goto(Phase.PAUSED, Step.ROLLING_BACK if self.s.step == Step.ROLLING_BACK else Step.IDLE)
    self.event(
        "Normal",
        "Paused",
        f"tuning paused by spec.tuning.paused{stopped}; {paused_text(self)}; nothing new runs: "
        + RESUME_HINT,
    )


def resume(self: Core, *, changed: bool) -> bool:
    """``spec.tuning.paused`` turned false: continue where the pause stopped, in the same epoch (the
    trial it stopped is not re-run: the search decides again). True when it did; False when the
    spec changed meanwhile (or the pause was from a phase that cannot resume): the caller then
    restarts as for any spec change, and this Event says so."""
    origin, fresh = self.s.paused_from, self.s.resume_fresh or changed
    self.s.paused_from, self.s.resume_fresh = None, False
    if origin is None or fresh:
        self.event("Normal", "Resumed", "tuning resumed: the spec changed while paused, so it restarts")
        return False
    self.event("Normal", "Resumed", f"tuning resumed in epoch {self.s.epoch} ({origin})")
    rolling_back = self.s.step == Step.ROLLING_BACK
    if origin == Phase.PENDING:
        self.goto(Phase.PENDING, Step.IDLE)
        return True  # the next observation starts it (``_Ctx.start``)
    if origin == Phase.BASELINE:
        self.goto(Phase.BASELINE)
        measurement.begin_baseline(self, warm=False)
    elif origin == Phase.OBSERVING:
        self.goto(Phase.OBSERVING, Step.ROLLING_BACK if rolling_back else Step.MEASURING)
        self.s.measure_from = self.now
    elif origin == Phase.CONVERGED:
        self.goto(Phase.CONVERGED, Step.ROLLING_BACK if rolling_back else Step.IDLE)
        if not rolling_back:
            rollout.apply_best(self)
    else:
        self.goto(Phase.EXPLORING, Step.ROLLING_BACK if rolling_back else Step.IDLE)
        if not rolling_back:
            exploration.decide(self)
    return True


def on_approved(self: Core, obs: Approved) -> None:
    """An approval not handled yet: acted on once (``approval``). It rolls observe mode's current
    recommendation out, directly and to every pod (the person approved that config, not a trial
    of it; observe mode then measures it as the running config, and a rollout that fails goes back
    to the config before). One that names another recommendation (stale: the recommendation changed
    since) or arrives with none to approve (paused, a rollout in flight, another mode) does nothing
    but say so in a Warning Event; an empty ``id`` (the annotation removed) forgets the last one."""
    self.s.approval = obs.id
    if not obs.id:
        return  # the annotation was removed: the same id approves again once set again
    rec = self.s.recommendation
    current = None if rec is None else recommendation_id(rec)
    if self.s.phase != Phase.OBSERVING or self.s.step in ROLLOUT_STEPS or rec is None:
        if self.s.phase != Phase.OBSERVING:
            why = f"phase {self.s.phase}"
        elif rec is None:
            why = "observe mode recommends nothing now"
        else:
            why = "a rollout is in flight"
        why = f"approval {obs.id!r} ignored: no recommendation to roll out ({why})"
        self.event("Warning", "ApprovalIgnored", why)
        return
    if obs.id != current:
        self.event(
            "Warning",
            "ApprovalIgnored",
            f"approval {obs.id!r} ignored: it does not match the current recommendation {current} "
            f"{config_label(rec)} (stale); nothing rolled out; approve again to roll that one out",
        )
        return
    self.s.recommendation = None
    self.s.target = rec
    self.s.last_rollout_at = self.now
    self.goto(step=Step.ROLLING_OUT)
    self.actions.append(RollOut(rec, "rolling", f"approved recommendation {current}"))
    self.event(
        "Normal",
        "Approved",
        f"recommendation {current} {config_label(rec)} approved: rolling it out to every pod (replacing "
        f"{config_label(self.s.current)}); observe mode goes on measuring it",
    )


def on_observing_rollout(self: Core, obs: Observation) -> None:
    """Observe mode with a rollout in flight (an approved recommendation, or the rollback of a trial
    stopped by the switch to observe): followed to its end, then measuring resumes on the pods'
    config. Windows that span it are not the running config's and are dropped."""
    st = self.s.step
    if isinstance(obs, RolloutApplied):
        if st == Step.ROLLING_OUT:
            self.goto(step=Step.WAITING_READY)
    elif isinstance(obs, RolloutReady):
        if obs.config is not None and self.s.target is not None and obs.config != self.s.target:
            return  # a stale report about an earlier rollout
        self.s.current = self.s.target or self.s.current
        self.s.target = None
        self.goto(step=Step.MEASURING)
        self.s.measure_from = self.now
    elif isinstance(obs, RolloutFailed):
        failed(self, obs.failure or "crash", obs.reason)
    elif isinstance(obs, Tick) and self.now - self.s.step_since > self.s.settings.ready_timeout_s:
        failed(self, "timeout", f"not ready within {self.s.settings.ready_timeout_s:g}s")


def failed(self: Core, failure: str, detail: str) -> None:
    if self.s.step == Step.ROLLING_BACK:
        rollout.on_failed(self, failure, detail)  # a failed rollback: Failed, a human must look
        return
    target = self.s.target
    self.event(
        "Warning",
        "ApprovedConfigFailed",
        f"the approved config {config_label(target or self.s.current)} failed: {failure} {detail}".rstrip()
        + f"; rolling back to {config_label(self.s.current)}",
    )
    rollout.rollback(self, self.s.current, f"the approved config failed ({failure})")

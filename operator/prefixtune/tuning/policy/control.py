"""A person's control of a tuning run: pause and resume (``spec.tuning.paused``).

Pinning a config and rolling back to the spec's are spec edits (``spec.config`` and ``tuning.mode:
off``, written by ``prefixtune pin``/``rollback``): ``spec_change`` handles them, and says which it
was in its Event.
"""

from __future__ import annotations

from prefixtune.tuning.phases import TRIAL_STEPS, Phase, Step
from prefixtune.tuning.policy import exploration, measurement, rollout
from prefixtune.tuning.policy._core import Core
from prefixtune.tuning.policy.messages import config_label

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
    elif origin == Phase.CONVERGED and self.s.step in (Step.ROLLING_OUT, Step.WAITING_READY):
        rollout.rollback(self, self.s.current, "tuning paused while applying the best config")
        stopped = f"; applying the best config stopped, back to {config_label(self.s.current)}"
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

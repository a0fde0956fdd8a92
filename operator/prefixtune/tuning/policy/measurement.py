"""Measurement: the baseline, warm-up and windows, scoring, aborts, invalidation, held metrics."""

from __future__ import annotations

import math

from prefixtune.metrics.signals import Signals
from prefixtune.tuning import routed
from prefixtune.tuning.actions import (
    RecordTrial,
)
from prefixtune.tuning.objective import (
    InsufficientData,
    Paired,
    Score,
    ScoreBasis,
    goal,
    load_factor,
    load_normalized,
    paired,
    score,
    severe_breach,
)
from prefixtune.tuning.phases import WINDOW_STEPS, Phase, Step, TuningReason
from prefixtune.tuning.policy import (
    drift_watch,
    exploration,
    measurement,
    rollout,
)
from prefixtune.tuning.policy._core import MAX_STARVED_REPEATS, TOO_LITTLE_TRAFFIC, Core, all_missing
from prefixtune.tuning.policy.messages import (
    config_label,
    decided_text,
    evidence,
    score_text,
    terms_text,
)
from prefixtune.tuning.state import (
    MetricsUnavailable,
    Trial,
    TrialInvalidated,
    ValueTerms,
    WindowMeasured,
    clip,
)
from prefixtune.tuning.widening import running_cap


def begin_baseline(self: Core, warm: bool) -> None:
    """Measure the running config (after a warm-up when its pods may be cold)."""
    t = Trial(
        id=self.s.next_trial_id, epoch=self.s.epoch, role="baseline", config=self.s.current,
        started_at=self.now, reason="measure the running config",
    )  # fmt: skip
    self.s.next_trial_id += 1
    self.s.trials.append(t)
    self.s.active = t.id
    self.s.best = None
    self.s.gate = None
    self.s.extensions = 0
    self.s.widened = {}  # the baseline's window decides the epoch's batch-limit knobs afresh
    self.goto(Phase.BASELINE)
    if warm and self.s.settings.warmup_s > 0:
        self.goto(step=Step.WARMING_UP)
        self.s.warm_until = self.now + self.s.settings.warmup_s
    else:
        measurement.begin_measuring(self)


def begin_measuring(self: Core) -> None:
    self.goto(step=Step.MEASURING)
    self.s.measure_from = self.now
    self.s.measure_until = self.now + self.s.settings.measure_s


def on_invalidated(self: Core, obs: TrialInvalidated) -> None:
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


def rewarm(self: Core, trial: Trial, why: str) -> None:
    """Discard the window in flight and measure again after a new warm-up, with no rollout to wait
    for: the pods already run the trial's config (a scale changed how many of them serve). Pods
    added meanwhile are not waited for: a window measures the pods that serve when it begins (one
    no node can place yet must not hold the trial, nor time it out as infeasible)."""
    trial.invalidations += 1
    self.s.extensions = 0
    self.s.measure_from = self.s.measure_until = None
    self.event(
        "Normal",
        "TrialRemeasured",
        f"trial {trial.id}: {why} during its window; the window is discarded and the trial "
        "re-measured after a new warm-up",
    )
    if self.s.settings.warmup_s > 0:
        self.goto(step=Step.WARMING_UP)
        self.s.warm_until = self.now + self.s.settings.warmup_s
    else:
        measurement.begin_measuring(self)


def on_metrics_unavailable(self: Core, obs: MetricsUnavailable) -> None:
    if not self.s.metrics_held:
        self.condition("MetricsUnavailable", True, "MetricsUnavailable", obs.reason or "no metrics")
        self.event(
            "Warning",
            "MetricsUnavailable",
            f"{obs.reason or 'metrics are unavailable'}; holding: no rollout until they return",
        )
    self.s.metrics_held = True


def release_hold(self: Core) -> bool:
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


def on_window(self: Core, obs: WindowMeasured) -> None:
    signals = obs.signals
    if signals is None or all_missing(signals):
        measurement.on_metrics_unavailable(self, MetricsUnavailable(reason="window has no signals"))
        return
    if measurement.release_hold(self):
        return
    if self.s.phase == Phase.CONVERGED:
        if self.s.step == Step.WATCHING and not obs.partial:
            drift_watch.check_drift(self, obs)
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
            measurement.abort(self, trial, signals, breach)
        return
    if self.s.measure_until is not None and self.now < self.s.measure_until - 1e-9:
        return  # a full window reported early: keep measuring
    if self.s.settings.verify_applied and not trial.verified:
        # What the engine runs was not read back yet: a window of an unverified config is not
        # scored (it may not be the trial's config at all). Measure again once it is checked.
        measurement.begin_measuring(self)
        return
    self.goto(step=Step.SCORING)
    measurement.score_trial(self, trial, obs)


def score_trial(self: Core, trial: Trial, obs: WindowMeasured) -> None:
    settings = self.s.settings
    assert obs.signals is not None
    canary = (
        self.strategy_of(trial) == "canary" and trial.role == "trial" and obs.baseline_signals is not None
    )
    result: Score | InsufficientData
    value: float | None = None
    terms: ValueTerms | None = None
    if canary:
        assert obs.baseline_signals is not None
        # behind a cache-aware (or session-hash) router the canary's share is the router's decision
        decided = routed.decided_split(settings.router, self.s.current, self.s.replicas)
        pair = paired(
            obs.signals, obs.baseline_signals, settings.objective, settings.slo, settings.min_requests,
            obs.canary_pods, obs.baseline_pods, decided_split=decided,
            caps=(running_cap(trial.config), running_cap(self.s.current)),
        )  # fmt: skip
        if isinstance(pair, InsufficientData):
            result = pair
        else:
            result = pair.canary
            value, terms = measurement.paired_value(self, pair)
    else:
        result = score(
            obs.signals, settings.objective, settings.slo, settings.min_requests, running_cap(trial.config)
        )
        if isinstance(result, Score):
            value, terms = measurement.normalized_value(self, result.value, obs.offered_rps)
    if isinstance(result, InsufficientData):
        measurement.insufficient(self, trial, result)
        return
    assert value is not None and terms is not None
    terms = with_headroom(terms, result)
    trial.signals = obs.signals
    trial.score = result.value
    trial.basis = result.basis
    trial.terms = terms
    measurement.finish_trial(self, trial, "ok", value=value, reason=score_text(result))
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
    previous = next((t for t in self.s.trials if t.id == before), None) if is_best else None
    decided_by_term = "" if previous is None else decided_text(trial, previous, settings.objective)
    self.event(
        "Normal",
        "BaselineMeasured" if trial.role == "baseline" else "TrialScored",
        f"trial {trial.id} {config_label(trial.config)}: {score_text(result)}; value {value:.4g} "
        f"({terms_text(terms, settings.objective)})"
        + (
            f" ({'new best' if is_best else f'best is trial {best_now.id}'}{decided_by_term})"
            if best_now
            else ""
        )
        + f"; {evidence(obs.signals)}",
    )
    if trial.role == "baseline":
        exploration.widen_space(self, obs.signals, trial.config)
        self.goto(Phase.EXPLORING, Step.IDLE)
    else:
        self.goto(step=Step.IDLE)
    exploration.decide(self)


def with_headroom(terms: ValueTerms, result: Score) -> ValueTerms:
    """``terms`` with the window score's own terms: what was measured and the headroom it was
    multiplied by (rate objectives; ``objective.Headroom``)."""
    room = result.headroom
    return terms.model_copy(
        update={
            "measured": result.measured_value,
            "headroom": None if room is None else room.factor,
            "headroom_limit": None if room is None else room.limit,
        }
    )


def paired_value(self: Core, pair: Paired) -> tuple[float, ValueTerms]:
    """A canary's value: the stable config's value moved by the same-window ratio, with its terms.

    The anchor is what the baseline pods run now (``current``), not the best trial: the ratio
    compares the canary with those pods. Without a usable anchor (none measured, a zero score,
    an infinite ratio) the canary's own score is used (basis ``measured``).
    """
    own = pair.canary.value
    stable = self.stable_trial()
    anchor = stable.value if stable is not None else None
    ratio = pair.ratio
    if (
        stable is None
        or anchor is None
        or not math.isfinite(ratio)
        or ratio <= 0
        or not math.isfinite(anchor)
    ):
        return own, ValueTerms(basis=ScoreBasis.MEASURED)
    scaled = goal(self.s.settings.objective).scaled(anchor, ratio)
    if scaled is None:
        return own, ValueTerms(basis=ScoreBasis.MEASURED)
    return scaled, ValueTerms(
        basis=ScoreBasis.PAIRED, anchor_trial=stable.id, anchor=anchor, ratio=ratio,
        baseline_window=pair.baseline.value, canary_pods=pair.canary_pods,
        baseline_pods=pair.baseline_pods, split=pair.split,
    )  # fmt: skip


def normalized_value(self: Core, own: float, offered_rps: float | None) -> tuple[float, ValueTerms]:
    """A window's value scored on all the pods it measured (rolling, or a baseline): rescaled to
    the reference arrival rate where ``load_factor`` applies, else its own score."""
    reference = self.s.reference_rps
    factor = load_factor(self.s.settings.objective, offered_rps, reference)
    if factor is None:
        return own, ValueTerms(basis=ScoreBasis.MEASURED)
    return load_normalized(own, self.s.settings.objective, offered_rps, reference), ValueTerms(
        basis=ScoreBasis.LOAD_NORMALIZED, load_factor=factor, offered_rps=offered_rps, reference_rps=reference
    )


def insufficient(self: Core, trial: Trial, why: InsufficientData) -> None:
    settings = self.s.settings
    if why.missing:
        # Required signals missing: hold, and measure again once they return.
        measurement.on_metrics_unavailable(self, MetricsUnavailable(reason=why.reason))
        measurement.begin_measuring(self)
        return
    if self.s.extensions < settings.max_extensions:
        self.s.extensions += 1
        self.goto(step=Step.MEASURING)
        self.s.measure_until = self.now + settings.measure_s
        self.event("Normal", "WindowExtended", f"trial {trial.id}: {why.reason}; measuring longer")
        return
    measurement.finish_trial(self, trial, "invalidated", reason=why.reason, failure=TOO_LITTLE_TRAFFIC)
    self.event("Warning", "TrialInvalidated", f"trial {trial.id}: {why.reason} after extensions; not scored")
    if trial.role == "baseline":
        # No usable baseline: the workload is too light to tune against; watch and retry later.
        self.goto(Phase.CONVERGED, Step.WATCHING)
        self.s.note = "too little traffic to measure a baseline"
        self.s.note_reason = TuningReason.INSUFFICIENT_TRAFFIC
        self.s.measure_from = self.now
        return
    self.goto(step=Step.IDLE)
    starved = [
        t for t in self.epoch_trials()
        if t.role == "trial" and t.failure == TOO_LITTLE_TRAFFIC and t.config == trial.config
    ]  # fmt: skip
    if len(starved) >= MAX_STARVED_REPEATS:
        # The optimizer learns nothing from an unscored trial and would suggest it again.
        exploration.converge(
            self,
            f"too little traffic: {config_label(trial.config)} invalidated {len(starved)} times this epoch "
            f"({why.reason}); keeping the best measured config and watching",
            condition_reason=TuningReason.INSUFFICIENT_TRAFFIC,
        )
        return
    exploration.decide(self)


def abort(self: Core, trial: Trial, signals: Signals, breach: str) -> None:
    partial = score(signals, self.s.settings.objective, self.s.settings.slo, 1, running_cap(trial.config))
    trial.signals = signals
    value = partial.value if isinstance(partial, Score) else None
    trial.score = value
    trial.terms = None if value is None else ValueTerms(basis=ScoreBasis.MEASURED)
    measurement.finish_trial(
        self, trial, "aborted", value=value, reason=f"severe SLO breach: {breach}", failure=""
    )
    self.event(
        "Warning",
        "TrialAborted",
        f"trial {trial.id} {config_label(trial.config)} aborted early: {breach} on a partial window of "
        f"{signals.requests or 0:g} requests; rolling back to {config_label(self.best_config())}",
    )
    rollout.rollback(self, self.best_config(), f"trial {trial.id} aborted: {breach}")


def finish_trial(
    self: Core, trial: Trial, outcome: str, *, value: float | None = None, reason: str = "", failure: str = ""
) -> None:
    trial.outcome = outcome  # type: ignore[assignment]
    trial.value = value
    trial.reason = clip(reason)
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

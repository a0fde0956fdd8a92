"""The text of Event messages, trial reasons and the Tuning condition."""

from __future__ import annotations

from prefixtune.engines.base import KnobConfig
from prefixtune.engines.knobs import config_text
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.objective import (
    Score,
    ScoreBasis,
    decided_by,
    goal,
)
from prefixtune.tuning.phases import Phase, Step, TuningReason
from prefixtune.tuning.policy._core import trials_spent
from prefixtune.tuning.state import PolicyState, Trial, ValueTerms


def config_label(c: KnobConfig) -> str:
    return f"[{config_text(c)}]"


def score_text(s: Score) -> str:
    """``goodput 572.2 × headroom 8.38 (ttft) = 4794 (goodput_tokens_per_s, 962 requests)``: the
    window's score and, for a rate objective, what was measured and the headroom it was multiplied by."""
    room = s.headroom
    shown = (
        f"{s.value:.4g}"
        if room is None
        else f"{s.measured_value:.4g} × headroom {room.factor:.3g} ({room.limit}) = {s.value:.4g}"
    )
    text = f"{s.objective} {shown} ({s.basis}, {s.requests:g} requests)"
    if s.breaches:
        text += "; SLO breached: " + ", ".join(s.breaches)
    return text


def terms_text(terms: ValueTerms, objective: str) -> str:
    """How a trial's value was made, in an Event: ``paired-with-baseline: trial 0's 321.9 x
    same-window ratio 1.4`` (the status's scoreTerms hold every term)."""
    if terms.basis == ScoreBasis.PAIRED:
        op = "/" if goal(objective).negative else "×"
        return (
            f"{terms.basis}: trial {terms.anchor_trial}'s {terms.anchor or 0.0:.4g} {op} same-window ratio "
            f"{terms.ratio or 0.0:.4g}"
        )
    if terms.basis == ScoreBasis.LOAD_NORMALIZED:
        return (
            f"{terms.basis}: × load factor {terms.load_factor or 0.0:.4g} (reference "
            f"{terms.reference_rps or 0.0:.3g} / offered {terms.offered_rps or 0.0:.3g} req/s)"
        )
    return str(terms.basis)


def decided_text(new: Trial, old: Trial, objective: str) -> str:
    """`` over trial 3, by headroom (ttft)``: which term of the score made ``new`` the best over the
    previous best ``old`` (``objective.decided_by``); "" when either has no terms to compare."""
    if new.id == old.id or new.terms is None or old.terms is None:
        return ""
    a, b = new.terms, old.terms
    if new.value is None or old.value is None or not a.headroom or not b.headroom:
        return ""
    # the value without its headroom: the measured rate as compared (load-normalized, paired)
    rates = (new.value / a.headroom, old.value / b.headroom)
    term = decided_by(objective, rates, (a.headroom, b.headroom), a.headroom_limit)
    return f" over trial {old.id}, by {term}"


def evidence(s: Signals) -> str:
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


STEP_TEXT: dict[Step, str] = {
    Step.IDLE: "choosing the next trial",
    Step.ROLLING_OUT: "rolling out",
    Step.WAITING_READY: "waiting for its pods to be ready",
    Step.WARMING_UP: "warming the cache up",
    Step.MEASURING: "measuring a window",
    Step.SCORING: "scoring",
    Step.ROLLING_BACK: "rolling back",
    Step.WATCHING: "watching for drift",
}


def tuning_condition(s: PolicyState) -> tuple[bool, TuningReason, str]:
    """The Tuning condition (status, reason, message) of a state: made from the phase, the step and
    the trials alone, so it follows every transition and never outlives the state it describes (the
    status builder writes it on every reconcile). The text changes only when the state does."""
    if s.phase == Phase.PENDING:
        return False, TuningReason.PENDING, "waiting for the engine pods to be ready (see Ready)"
    if s.phase == Phase.PAUSED and s.paused_from is not None:
        rolling = f"rolling back to {config_label(s.target)}; " if s.target is not None else ""
        return (
            False,
            TuningReason.PAUSED,
            f"paused by spec.tuning.paused in epoch {s.epoch}: {rolling}running {config_label(s.current)}; "
            "nothing new runs until it is false again",
        )
    if s.phase == Phase.PAUSED:
        return False, TuningReason.TUNING_OFF, "tuning.mode is off: the spec config is kept"
    if s.phase == Phase.OBSERVING:
        if s.settings.mode == "auto" and s.settings.refusal:
            return False, TuningReason.SIGNALS_MISSING, s.settings.refusal
        return False, TuningReason.OBSERVING, "tuning.mode is observe: measuring and recommending"
    if s.phase == Phase.FAILED:
        return False, s.note_reason or TuningReason.FAILED, s.note or "failed: manual action needed"
    if s.phase == Phase.CONVERGED:
        best = None if s.best is None else s.trial(s.best)
        text = s.note or "converged"
        text += f"; best {config_label(best.config if best else s.current)}"
        text += f" value {best.value:.4g}" if best is not None and best.value is not None else ""
        applying = s.step in (Step.IDLE, Step.ROLLING_OUT, Step.WAITING_READY)  # idle: the rate limit
        after = "applying it" if applying else STEP_TEXT[s.step]
        return False, s.note_reason or TuningReason.CONVERGED, f"{text}; {after}"
    spent = f"{trials_spent(s)} of {s.settings.max_trials} trials spent"
    active = None if s.active is None else s.trial(s.active)
    wait = s.capacity_wait
    if wait is not None and wait.epoch == s.epoch and (active is None or active.config != wait.config):
        why = (
            f"paused: no capacity for {config_label(wait.config)} ({wait.reason}); trying it again "
            f"(attempt {wait.attempts + 1}); {spent}"
        )
        return False, TuningReason.NO_CAPACITY, why
    if active is not None:
        what = "the baseline, the running config" if active.role == "baseline" else f"trial {active.id}"
        text = f"epoch {s.epoch}: {what} {config_label(active.config)}: {STEP_TEXT[s.step]}; {spent}"
        if wait is not None and wait.config == active.config:
            text += f"; a retry after no capacity (attempt {wait.attempts + 1})"
    elif s.step == Step.ROLLING_BACK and s.target is not None:
        text = f"epoch {s.epoch}: rolling back to {config_label(s.target)}; {spent}"
    else:
        text = f"epoch {s.epoch}: {STEP_TEXT[s.step]}; {spent}"
    latest = next((t for t in reversed(s.trials) if t.epoch == s.epoch and t.outcome != "running"), None)
    if latest is not None and latest.outcome != "ok":
        text += f"; trial {latest.id} {latest.outcome}: {latest.reason}"
    reason = TuningReason.BASELINE if s.phase == Phase.BASELINE else TuningReason.EXPLORING
    return True, reason, text

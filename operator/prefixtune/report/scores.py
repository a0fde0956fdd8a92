"""A trial's score as every view shows it: the number, its basis and the terms it was made from.

``status.trials[].score`` is what the tuner compares; how it was made from the window is in
``scoreBasis`` and ``scoreTerms`` (``api/models.py``; the README says how to recompute it). The
report's table and plots, ``prefixtune status`` and the demo summary all read a score through
``score_rows``/``derivation``, so they show the same number with the same label. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefixtune.tuning.objective import GOALS, ScoreBasis


def number(value: Any) -> float | None:
    """A JSON number as a float (None: absent, a bool, or not a number)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def score_label(objective: str) -> str:
    """The label of the score axis and column: ``score (goodput)``."""
    return f"score ({objective})"


def basis_of(trial: Mapping[str, Any]) -> ScoreBasis | None:
    """The record's scoreBasis (None: not scored, or a record written before the basis was kept)."""
    try:
        return ScoreBasis(str(trial.get("scoreBasis")))
    except ValueError:
        return None


def _g(value: float | None) -> str:
    return "?" if value is None else f"{value:.4g}"


def derivation(trial: Mapping[str, Any], objective: str) -> str:
    """How the record's score was made, with every term printed (``""``: the trial was not scored).

    ``paired-with-baseline: trial 0's 321.9 × ratio 1.062; ratio = (143.1 / 1 pod) / (270 / 2 pods) /
    request split 1.1``; the ttft objective divides by the ratio, a ratio of the latencies.
    """
    if number(trial.get("score")) is None:
        return ""
    basis = basis_of(trial)
    terms = trial.get("scoreTerms")
    t: Mapping[str, Any] = terms if isinstance(terms, Mapping) else {}
    window = _g(number(trial.get("windowScore")))
    if basis is None:
        return "basis not recorded"
    if basis == ScoreBasis.MEASURED:
        return f"measured: the window's own score {window}"
    if basis == ScoreBasis.LOAD_NORMALIZED:
        return (
            f"load-normalized: window {window} × load factor {_g(number(t.get('loadFactor')))}; load factor "
            f"= reference {_g(number(t.get('referenceRps')))} / offered {_g(number(t.get('offeredRps')))} "
            "req/s, within [0.5, 2]"
        )
    negative = objective in GOALS and GOALS[objective].negative
    anchor = f"trial {t.get('baselineTrial', '?')}'s {_g(number(t.get('baselineScore')))}"
    ratio = _g(number(t.get("ratio")))
    base_window = _g(number(t.get("baselineWindowScore")))
    if negative:
        return (
            f"paired-with-baseline: {anchor} / ratio {ratio}; ratio = stable pods {base_window} / "
            f"canary {window} over the same window"
        )
    canary_pods, baseline_pods = t.get("canaryPods", "?"), t.get("baselinePods", "?")
    split = number(t.get("requestSplit"))
    return (
        f"paired-with-baseline: {anchor} × ratio {ratio}; ratio = (canary {window} / {canary_pods} "
        f"pod(s)) / (stable {base_window} / {baseline_pods} pod(s))"
        + ("" if split is None else f" / request split {_g(split)}")
        + " over the same window"
    )


@dataclass(frozen=True)
class ScoreRow:
    """One trial's score as the report's table and plots show it."""

    index: int
    outcome: str
    score: float | None  # status.trials[].score: what the tuner compares
    basis: ScoreBasis | None
    how: str  # derivation()
    window_score: float | None  # the pods under test's own score (raw)


def score_rows(trials: Sequence[Mapping[str, Any]], objective: str) -> list[ScoreRow]:
    """Every trial's score row, in the records' order."""
    return [
        ScoreRow(
            index=int(t.get("index", 0)),
            outcome=str(t.get("outcome", "?")),
            score=number(t.get("score")),
            basis=basis_of(t),
            how=derivation(t, objective),
            window_score=number(t.get("windowScore")),
        )
        for t in trials
    ]


def best_record(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The status record of the best trial: the one ``bestConfig.trial`` names (None when it does not
    name one, or the record is no longer kept)."""
    best = status.get("bestConfig")
    index = best.get("trial") if isinstance(best, Mapping) else None
    if not isinstance(index, int) or isinstance(index, bool):
        return None
    trials = status.get("trials") or []
    return next((t for t in trials if isinstance(t, Mapping) and t.get("index") == index), None)


def baseline_record(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The record of the current tuning run's baseline: the latest with role ``baseline``."""
    trials = [t for t in status.get("trials") or [] if isinstance(t, Mapping)]
    return next((t for t in reversed(trials) if t.get("role") == "baseline"), None)

"""Drift: a converged deployment's workload moved; a new epoch re-tunes."""

from __future__ import annotations

from prefixtune.metrics.signals import Signals
from prefixtune.tuning.objective import (
    Score,
    score,
)
from prefixtune.tuning.policy import (
    measurement,
)
from prefixtune.tuning.policy._core import Core, per_request
from prefixtune.tuning.state import WindowMeasured


def check_drift(self: Core, obs: WindowMeasured) -> None:
    ref = self.s.reference
    assert obs.signals is not None
    if ref is None:
        # No usable baseline yet (too little traffic): start tuning once a window can be scored.
        settings = self.s.settings
        if isinstance(score(obs.signals, settings.objective, settings.slo, settings.min_requests), Score):
            self.event("Normal", "TrafficSufficient", "enough traffic to measure: starting the baseline")
            self.s.epoch += 1
            measurement.begin_baseline(self, warm=False)
        return
    moved = drift(ref, obs.signals, self.s.settings.drift_threshold, self.s.reference_rps, obs.offered_rps)
    if not moved:
        return
    self.event(
        "Normal",
        "DriftDetected",
        "workload moved since the best config was measured: "
        + "; ".join(moved)
        + f"; re-tuning (epoch {self.s.epoch + 1}) with the {self.kept_trials()} earlier trials "
        "as warm start",
    )
    self.s.epoch += 1
    self.s.reference = None
    self.s.reference_rps = None
    measurement.begin_baseline(self, warm=False)


def drift(
    ref: Signals, now: Signals, threshold: float, ref_rps: float | None = None, now_rps: float | None = None
) -> list[str]:
    """What moved beyond ``threshold`` between two windows: hit rate (absolute), mean prompt and
    output lengths and the arrival rate (relative). Empty when nothing did."""
    moved: list[str] = []
    if ref.hit_rate is not None and now.hit_rate is not None and abs(now.hit_rate - ref.hit_rate) > threshold:
        moved.append(f"hit rate {ref.hit_rate:.1%} -> {now.hit_rate:.1%}")
    pairs = [
        ("mean prompt tokens", per_request(ref, "input"), per_request(now, "input")),
        ("mean output tokens", per_request(ref, "output"), per_request(now, "output")),
        ("arrival rate", ref_rps or ref.requests_per_s, now_rps or now.requests_per_s),
    ]  # fmt: skip
    for name, a, b in pairs:
        if a and b and abs(b - a) / a > threshold:
            moved.append(f"{name} {a:.4g} -> {b:.4g}")
    return moved

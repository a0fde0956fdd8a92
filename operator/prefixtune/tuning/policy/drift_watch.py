"""Drift: a converged deployment's workload moved; a new epoch re-tunes.

Drift means the workload changed: its prefix-cache hit rate, its mean prompt or output length. The
load level is not drift: the objective ranks configs at any load (a rate score is the measured rate
times the config's headroom, ``tuning/objective.py``), so a diurnal curve that moves the arrival
rate 2-4x in a day does not call for a new search, and each search it re-opened compared windows
measured at different loads (``bench day``: 7-12 epochs a day, and a change that served nothing
more passed the gate on windows at different loads).

A move must show in ``DRIFT_WINDOWS`` consecutive watch windows: a burst (ten minutes of twice the
load) can shift one window's hit rate or lengths, and a baseline measured in or just after it is
not the deployed config's value.
"""

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

DRIFT_WINDOWS = 2  # consecutive watch windows a move must show in before it re-opens tuning


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
    moved = drift(ref, obs.signals, self.s.settings.drift_threshold)
    if not moved:
        self.s.drift_windows = 0
        return
    self.s.drift_windows += 1
    if self.s.drift_windows < DRIFT_WINDOWS:
        return  # the next window confirms it (a burst moves one window)
    self.s.drift_windows = 0
    self.event(
        "Normal",
        "DriftDetected",
        f"workload moved since the best config was measured ({DRIFT_WINDOWS} windows in a row): "
        + "; ".join(moved)
        + f"; re-tuning (epoch {self.s.epoch + 1}) with the {self.kept_trials()} earlier trials "
        "as warm start",
    )
    self.s.epoch += 1
    self.s.reference = None
    self.s.reference_rps = None
    measurement.begin_baseline(self, warm=False)


def drift(ref: Signals, now: Signals, threshold: float) -> list[str]:
    """What of the workload moved beyond ``threshold`` between two windows: hit rate (absolute),
    mean prompt and output lengths (relative). Empty when nothing did. The arrival rate is not
    compared (module docstring)."""
    moved: list[str] = []
    if ref.hit_rate is not None and now.hit_rate is not None and abs(now.hit_rate - ref.hit_rate) > threshold:
        moved.append(f"hit rate {ref.hit_rate:.1%} -> {now.hit_rate:.1%}")
    pairs = [
        ("mean prompt tokens", per_request(ref, "input"), per_request(now, "input")),
        ("mean output tokens", per_request(ref, "output"), per_request(now, "output")),
    ]  # fmt: skip
    for name, a, b in pairs:
        if a and b and abs(b - a) / a > threshold:
            moved.append(f"{name} {a:.4g} -> {b:.4g}")
    return moved

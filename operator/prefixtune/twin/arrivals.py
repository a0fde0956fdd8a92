"""Arrival processes: when requests (or sessions) arrive, deterministic given a seed.

Three processes, each with a mean rate ``rate`` (arrivals per second):

- ``poisson``: exponential gaps (CV 1).
- ``bursty``: a gamma renewal process with a chosen coefficient of variation of the gaps
  (shape ``1/cv**2``; cv > 1 gives bursts and long lulls, as production traces show: the Mooncake
  conversation trace has an inter-arrival CV of about 3).
- ``diurnal``: a Poisson process whose rate follows a sinusoid,
  ``rate * (1 + amplitude * sin(2*pi*(t + phase_s)/period_s))``, drawn by thinning. Its mean over
  whole periods is ``rate``.

Pure functions of (spec, rate, duration, rng): no global state.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

ArrivalProcess = Literal["poisson", "bursty", "diurnal"]
PROCESSES: tuple[str, ...] = ("poisson", "bursty", "diurnal")


@dataclass(frozen=True)
class Arrivals:
    """An arrival process without its rate (the rate is given when times are drawn)."""

    process: ArrivalProcess = "poisson"
    cv: float = 1.0  # bursty: coefficient of variation of the inter-arrival gaps
    period_s: float = 86_400.0  # diurnal: one day by default
    amplitude: float = 0.5  # diurnal: relative swing of the rate, in [0, 1)
    phase_s: float = 0.0  # diurnal: shift of the sinusoid

    def __post_init__(self) -> None:
        if self.process not in PROCESSES:
            raise ValueError(f"arrival.process must be one of {', '.join(PROCESSES)}; got {self.process!r}")
        if not self.cv > 0:
            raise ValueError(f"arrival.cv must be > 0; got {self.cv}")
        if not self.period_s > 0:
            raise ValueError(f"arrival.period_s must be > 0; got {self.period_s}")
        if not 0 <= self.amplitude < 1:
            raise ValueError(f"arrival.amplitude must be in [0, 1); got {self.amplitude}")

    def rate_at(self, rate: float, t: float) -> float:
        """The instantaneous rate at time ``t`` (constant except for ``diurnal``)."""
        if self.process != "diurnal":
            return rate
        return rate * (1.0 + self.amplitude * math.sin(2 * math.pi * (t + self.phase_s) / self.period_s))

    def times(self, rate: float, duration_s: float, rng: np.random.Generator) -> list[float]:
        """Arrival times in ``[0, duration_s)``, increasing, as plain floats."""
        if not rate > 0:
            raise ValueError(f"rate must be > 0 arrivals per second; got {rate}")
        if not duration_s > 0:
            raise ValueError(f"duration_s must be > 0; got {duration_s}")
        if self.process == "poisson":
            return _renewal(lambda n: rng.exponential(1.0 / rate, n), rate, duration_s)
        if self.process == "bursty":
            shape = 1.0 / (self.cv * self.cv)
            scale = 1.0 / (rate * shape)
            # Start in the stationary regime: the first gap is a forward-recurrence time, which for a
            # gamma renewal is approximated well enough by a uniform fraction of a gap.
            return _renewal(lambda n: rng.gamma(shape, scale, n), rate, duration_s, rng=rng)
        return self._thinned(rate, duration_s, rng)

    def _thinned(self, rate: float, duration_s: float, rng: np.random.Generator) -> list[float]:
        peak = rate * (1.0 + self.amplitude)
        candidates = _renewal(lambda n: rng.exponential(1.0 / peak, n), peak, duration_s)
        if not candidates:
            return []
        keep = rng.random(len(candidates))
        out: list[float] = []
        for t, u in zip(candidates, keep, strict=True):
            if u * peak < self.rate_at(rate, t):
                out.append(t)
        return out


def _renewal(
    draw: Callable[[int], npt.ArrayLike],
    rate: float,
    duration_s: float,
    rng: np.random.Generator | None = None,
) -> list[float]:
    """Cumulative sums of gaps drawn in chunks until ``duration_s`` is passed."""
    expected = rate * duration_s
    chunk = max(16, int(expected * 1.2 + 10 * math.sqrt(expected + 1)))
    gaps = np.asarray(draw(chunk), dtype=float)
    if rng is not None and len(gaps):
        gaps[0] *= rng.random()
    t = np.cumsum(gaps)
    while t[-1] < duration_s:
        more = np.cumsum(np.asarray(draw(chunk), dtype=float)) + t[-1]
        t = np.concatenate([t, more])
    return [float(x) for x in t[t < duration_s]]


def gaps_cv(times: list[float]) -> float:
    """The coefficient of variation of the gaps between consecutive times (for checks and reports)."""
    if len(times) < 3:
        raise ValueError("need at least three arrivals to estimate a CV")
    gaps = np.diff(np.asarray(times, dtype=float))
    mean = float(gaps.mean())
    return float(gaps.std()) / mean if mean > 0 else 0.0

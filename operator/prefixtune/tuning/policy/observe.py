"""Observe mode: measure, diagnose and recommend; never roll out."""

from __future__ import annotations

from prefixtune.engines.base import KnobConfig
from prefixtune.tuning.actions import (
    Recommend,
)
from prefixtune.tuning.objective import (
    InsufficientData,
    Score,
    score,
)
from prefixtune.tuning.policy import (
    measurement,
)
from prefixtune.tuning.policy._core import LOW_HIT_RATE, Core, all_missing, better, space_of
from prefixtune.tuning.policy.messages import config_label, evidence
from prefixtune.tuning.state import MetricsUnavailable, Observation, WindowMeasured
from prefixtune.tuning.widening import running_cap


def on_observing(self: Core, obs: Observation) -> None:
    if not isinstance(obs, WindowMeasured) or obs.partial or obs.signals is None:
        return
    if all_missing(obs.signals):
        measurement.on_metrics_unavailable(self, MetricsUnavailable(reason="window has no signals"))
        return
    measurement.release_hold(self)
    settings = self.s.settings
    current = score(
        obs.signals, settings.objective, settings.slo, settings.min_requests, running_cap(self.s.current)
    )
    if isinstance(current, InsufficientData):
        return
    self.s.reference = obs.signals
    pick: tuple[KnobConfig, str] | None = None
    space = space_of(self.s)
    estimates: list[tuple[float, KnobConfig, Score]] = []
    for w in obs.what_if:
        est = score(w.signals, settings.objective, settings.slo, 1, running_cap(w.config))
        cfg = space.normalize(w.config)
        if isinstance(est, Score) and cfg != space.normalize(self.s.current):
            estimates.append((est.value, cfg, est))
    if estimates:
        value, cfg, est = max(estimates, key=lambda e: (e[0], -estimates.index(e)))
        # A what-if is the twin's estimate, not a window: no noise model to gate it on, so the
        # user's margin alone (spec.tuning.minGain, as a rollout needs) decides.
        if better(settings.objective, value, current.value, 1.0 + settings.min_gain):
            pick = (
                cfg,
                f"twin what-if: {est.basis} {value:.4g} vs measured {current.value:.4g} for the running "
                f"config over {obs.signals.window_s:g}s ({evidence(obs.signals)})",
            )
    if pick is None:
        hit = obs.signals.hit_rate
        if self.s.current.prefix_caching and hit is not None and hit < LOW_HIT_RATE:
            cfg = space.normalize(self.s.current.with_(prefix_caching=False))
            pick = (
                cfg,
                f"hit rate {hit:.1%} < {LOW_HIT_RATE:.0%}: the prefix cache holds memory for nothing",
            )
    if pick is not None and pick[0] != self.s.recommendation:
        self.s.recommendation = pick[0]
        self.actions.append(Recommend(pick[0], pick[1]))
        self.event("Normal", "Recommendation", f"recommend {config_label(pick[0])}: {pick[1]} (observe mode)")

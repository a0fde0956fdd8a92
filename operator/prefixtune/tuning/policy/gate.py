"""The significance gate in the policy: a converging search leaves the deployed config only for a
significant gain (``tuning/significance.py`` has the noise model and the verdict).

The deployed config is the one the epoch's baseline measured (what ran when the search began; after
drift, the previous epoch's best). The candidate is the best config by mean; its gain is judged on
its windows after the first (the first made it a contender: the best of many noisy windows is
biased up, the winner's curse), each side's noise from its own repeated windows and the pooled
estimate (``significance.config_noise``). Unless the deployed config breached the SLOs in every
window of the epoch (``breached``): the gate keeps a config that serves against noise, and one that
fails its users in every window has no benefit of the doubt to keep, so there every window of the
candidate counts (at full load on the twin, `sglang-long-prompts-chunk` sits at every config's KV
cliff: the deployed config's windows breach, the best config's confirming window collapses in about
one window in three and the gain never cleared). At convergence:

- the candidate is the deployed config: nothing to decide;
- the candidate has only the window that selected it: one more window of it (as below);
- the verdict is significant (gain >= ``min_gain`` with confidence >= ``confidence``): converge on it;
- the measured gain clears the margin but the noise hides it: one more window of the side whose mean
  is the less certain (``Trial.gate_window``: not counted in the budget; at most
  ``MAX_GATE_WINDOWS`` an epoch, and only when the gain held for ``payback_s`` pays for the window's
  restart and cold cache), then decide again;
- otherwise: keep the deployed config and say so (the Tuning condition's reason
  ``NoSignificantGain``, the Converged Event's message "no significant gain: ...").

Every decision is recorded in ``PolicyState.gate`` (the status shows gain, margin and confidence).
"""

from __future__ import annotations

import math

from prefixtune.engines.base import KnobConfig
from prefixtune.tuning.objective import Score, ScoreBasis, goal, score
from prefixtune.tuning.phases import TuningReason
from prefixtune.tuning.policy import rollout
from prefixtune.tuning.policy._core import Core
from prefixtune.tuning.policy.messages import config_label
from prefixtune.tuning.significance import (
    Noise,
    Side,
    Verdict,
    Window,
    config_noise,
    counting_requests,
    pays,
    pooled_noise,
    trial_price,
    verdict,
)
from prefixtune.tuning.state import GateRecord, PolicyState, Trial
from prefixtune.tuning.widening import running_cap

MAX_GATE_WINDOWS = 4  # windows the gate may ask for in an epoch before it decides on what it has


def measured(s: PolicyState, config: KnobConfig) -> list[Trial]:
    """This epoch's scored trials of ``config``, oldest first."""
    return [
        t
        for t in s.trials
        if t.epoch == s.epoch and t.outcome == "ok" and t.value is not None and t.config == config
    ]


def deployed_trial(s: PolicyState) -> Trial | None:
    """The epoch's baseline when it was scored: the deployed config, measured."""
    return next(
        (
            t
            for t in s.trials
            if t.epoch == s.epoch and t.role == "baseline" and t.outcome == "ok" and t.value is not None
        ),
        None,
    )


def window_of(t: Trial) -> Window:
    requests = 0.0 if t.signals is None else float(t.signals.requests or 0.0)
    terms = t.terms
    if terms is not None and terms.basis == ScoreBasis.PAIRED:
        pods = (terms.canary_pods or 1, terms.baseline_pods or 1)
        return Window(float(t.value or 0.0), counting_requests(requests, *pods), paired=True)
    return Window(float(t.value or 0.0), requests)


def noise_of(s: PolicyState, config: KnobConfig | None = None) -> Noise:
    """Pooled over the repeated windows of every config, per epoch, in the trials kept in full;
    with ``config``, that config's own repeats weighed with the pooled estimate (``config_noise``)."""
    groups: dict[tuple[int, KnobConfig], list[float]] = {}
    for t in s.trials:
        if t.outcome == "ok" and t.value is not None:
            groups.setdefault((t.epoch, t.config), []).append(float(t.value))
    pooled = pooled_noise(list(groups.values()))
    if config is None:
        return pooled
    return config_noise(pooled_noise([v for (_, c), v in groups.items() if c == config]), pooled)


def breached(s: PolicyState, t: Trial) -> bool:
    """Whether ``t``'s window breached the SLOs (a p99 over its target, ``Score.slo_met``); a window
    without the signals to tell counts as not breached."""
    if t.signals is None:
        return False
    result = score(t.signals, s.settings.objective, s.settings.slo, 1, running_cap(t.config))
    return isinstance(result, Score) and not result.slo_met


def judge(s: PolicyState) -> tuple[Verdict, Trial, Trial] | None:
    """The verdict on the best config (by mean) against the deployed one, with the latest trial of
    each; None when there is nothing to decide (no scored baseline, no best, or the same config)."""
    base = deployed_trial(s)
    best = None if s.best is None else s.trial(s.best)
    if base is None or best is None or best.config == base.config:
        return None
    cand, dep = measured(s, best.config), measured(s, base.config)
    if not cand or not dep:
        return None
    # The candidate's first window of the epoch is the one that made it a contender (the best of
    # many windows, biased up: the winner's curse); its later windows are confirmations. With the
    # gate off (margin 0, confidence 0.5) the best mean wins, as before the gate: every window counts.
    # A deployed config that breached the SLOs in every window of the epoch has no benefit of the
    # doubt to keep: staying on it is the risk the gate guards against, so there the candidate's
    # every window counts (the gain must still be significant).
    settings = s.settings
    gate_off = settings.min_gain == 0 and settings.confidence <= 0.5
    every_window = gate_off or all(breached(s, t) for t in dep)
    confirmed = every_window or len(cand) > 1
    latest = cand[-1]
    if not every_window and confirmed:
        cand = cand[1:]
    mean_c = sum(t.value or 0.0 for t in cand) / len(cand)
    mean_d = sum(t.value or 0.0 for t in dep) / len(dep)
    try:
        ratio = goal(s.settings.objective).ratio(mean_c, mean_d)
    except ValueError:
        return None  # scores of the wrong sign for the objective: nothing comparable
    v = verdict(
        [window_of(t) for t in cand], [window_of(t) for t in dep], ratio, noise_of(s, best.config),
        settings.min_gain, settings.confidence, confirmed, noise_of(s, base.config),
    )  # fmt: skip
    return v, latest, dep[-1]


def share(self: Core) -> float:
    """The share of the pods a trial moves: every pod when rolling, one when a canary."""
    return 1.0 if self.s.settings.strategy == "rolling" else 1.0 / max(self.s.replicas, 2)


def gate_windows(self: Core) -> int:
    return sum(1 for t in self.epoch_trials() if t.gate_window)


def decide(self: Core, reason: str, why: TuningReason) -> tuple[str, TuningReason] | None:
    """At convergence: the reason and condition reason to converge with (the deployed config made
    the best when the gain is not significant), or None when a gate window was started (or waits
    for the rate limit) and the search decides again after it."""
    judged = judge(self.s)
    if judged is None:
        return reason, why
    v, cand, dep = judged
    settings = self.s.settings
    if not v.significant and v.more is not None and why == TuningReason.CONVERGED:
        price = trial_price(settings.restart_cost_s, settings.warmup_s, settings.measure_s, 1.0, share(self))
        if gate_windows(self) < MAX_GATE_WINDOWS and pays(v.gain, price, settings.payback_s):
            if self.rate_limited_until() is not None or self.s.metrics_held:
                return None  # the next tick decides again
            config = cand.config if v.more == Side.CANDIDATE else dep.config
            rollout.start_trial(
                self,
                config,
                f"significance gate: one more window of the {v.more} config before deciding ({v.text()}; "
                f"the window costs {price.text()})",
                gate_window=True,
            )
            return None
    self.s.gate = GateRecord(
        epoch=self.s.epoch, candidate=cand.id, deployed=dep.id, min_gain=v.margin,
        gain=v.gain if math.isfinite(v.gain) else None,  # JSON has no infinity: the state must load
        confidence=v.confidence, required=v.required, noise=v.noise, significant=v.significant,
    )  # fmt: skip
    if v.significant:
        return f"{reason}; significant gain over the deployed {config_label(dep.config)}: {v.text()}", why
    self.s.best = dep.id
    if dep.signals is not None:
        self.s.reference = dep.signals
    return (
        f"no significant gain: the best by mean {config_label(cand.config)} over the deployed "
        f"{config_label(dep.config)}: {v.text()}; keeping the deployed config ({reason})",
        TuningReason.NO_SIGNIFICANT_GAIN if why == TuningReason.CONVERGED else why,
    )

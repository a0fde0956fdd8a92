"""Is a gain real, and is a trial worth its price? The noise model, the significance gate, pricing.

Pure functions of plain numbers; ``policy/gate.py`` feeds them the state's windows.

**The noise model.** A window's value ``v`` (the number the optimizer is told: load-normalized or
paired with the baseline) is the config's true value times ``(1 + e)``; ``e`` has the relative
variance

    sigma_i^2 = (K0 * (1 / N_i + TAU0^2) + d * s^2) / (K0 + d)

- ``1 / N_i``: the counting noise of a window of ``N_i`` requests (a paired canary window counts
  both sides: ``1 / N_canary + 1 / N_stable``, the stable side's count estimated from its pods). A
  score is a sum over requests, so its relative variance falls as ``1 / N``; the output lengths'
  spread adds to it and the load normalization removes the arrival count's part, so ``1 / N`` is
  a round figure, not an exact one: the data below correct it.
- ``TAU0``: a prior on the window-to-window drift the counting noise misses (load and mix move
  during a window; the issue's field evidence is that this part is the larger one).
- ``s^2``: the pooled relative variance of repeated windows of one config (the baseline measured
  again, a best confirmed, a gate window; grouped by epoch and config), ``d`` its degrees of
  freedom (windows minus groups). It is the measured window-to-window variance, counting noise and
  drift together.
- ``K0``: how many degrees of freedom the prior weighs (the conjugate scaled-inverse-chi^2 update
  of a normal variance): with one window per config the prior decides; with a few repeats the
  data take over.
- Per config (``config_noise``): ``s^2`` and ``d`` are the config's own repeats plus the pooled
  estimate over every config as ``POOLED_DOF`` degree. Near capacity the noise is not one figure:
  on the twin, at `vllm-rag-corpus`'s full load, the deployed config's windows swing by 45% (some
  breach the SLOs) and a config inside them by a few percent; pooled alone, the worst config's
  swing made every gain there look like noise.

**The gate.** The gain of a candidate over the deployed config is ``r - 1``, ``r`` the ratio of
their mean values (``Goal.ratio``: higher is better for every objective). On the log scale the
mean of ``n`` windows has variance ``sum(sigma_i^2) / n^2``; the two means add their variances,
except that a candidate whose every window was paired with the stable pods in the same window
carries the comparison in its own ratio (the stable side's noise is in its ``1 / N``), so its
variance alone counts. The confidence that the gain is at least the margin ``m`` is
``T_nu((ln r - ln(1 + m)) / se)``, ``T_nu`` the Student-t distribution of ``nu = K0 + d`` degrees
of freedom (the fewer of the two sides'): the variance is estimated from a few windows, and the
normal tail trusted that estimate as if it were exact (the controls, where every config is within
1%, left the deployed config on +12-22% "gains" in 1 or 2 seeds of 20). The deployed config is
left only when that reaches the required confidence, and only on the candidate's windows after
the one that made it a contender (``confirmed``; every window counts over a deployed config that
breached the SLOs in each of its windows, ``policy/gate.py``). When the measured gain clears the
margin but the confidence does not (or the candidate has only its selecting window), one more
window of the side with the larger variance (the candidate when paired or unconfirmed) can decide
(bounded by the policy). A margin of 0 and a confidence of 0.5 pass every candidate whose mean is
not below the deployed config's: the behaviour before the gate (``policy/gate.py`` then counts
every window).

**The price of a trial** (seconds of the whole deployment's service lost, ``TrialPrice``): the
restart of the pods it moves (``restart_cost_s`` each time, times the share of the pods), their
cold cache (``warmup_s`` at ``COLD_CACHE_LOSS``), and its SLO risk (a config the feasibility model
doubts may crash or breach through its window: ``(1 - P(feasible))`` of ``warmup_s + measure_s``).
A trial pays when its expected improvement (the optimizer's EI x P(feasible), a share of the best
score) held for ``payback_s`` earns more than that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

K0 = 2.0  # degrees of freedom the prior weighs against the repeated windows
TAU0 = 0.02  # prior relative sd of window-to-window drift beyond counting noise
POOLED_DOF = 1.0  # degrees of freedom the pooled estimate of every config weighs in one config's noise
COLD_CACHE_LOSS = 0.5  # share of service a cold prefix cache loses over the warm-up (a round figure)


@dataclass(frozen=True)
class Window:
    """One scored window of a config: its value, and the requests the value rests on (the counting
    noise ``1 / requests``; a paired window's ``requests`` already combines both sides)."""

    value: float
    requests: float
    paired: bool = False  # measured against the stable pods in the same window


def counting_requests(canary: float, canary_pods: int, stable_pods: int) -> float:
    """The effective request count of a paired window: ``1 / N`` is the counting variance of the
    canary's requests plus the stable side's (estimated from its pods' share)."""
    if canary <= 0:
        return 0.0
    stable = canary * max(stable_pods, 1) / max(canary_pods, 1)
    return 1.0 / (1.0 / canary + 1.0 / stable)


@dataclass(frozen=True)
class Noise:
    """The pooled window-to-window variance of repeated windows: ``s2`` over ``dof`` degrees."""

    s2: float = 0.0
    dof: float = 0.0

    def variance(self, requests: float) -> float:
        """The relative variance of one window of ``requests`` requests (see the module docstring)."""
        counting = 1.0 / requests if requests > 0 else 1.0
        return (K0 * (counting + TAU0**2) + self.dof * self.s2) / (K0 + self.dof)


def config_noise(own: Noise, pooled: Noise) -> Noise:
    """One config's noise: its own repeated windows (``own``) at full weight, the pooled estimate
    over every config (``pooled``) as at most ``POOLED_DOF`` degree of freedom. Near capacity the
    windows of a config at its cliff swing by half (one breaches the SLOs, the next does not) while
    a config well inside them barely moves: one pooled variance makes every config as noisy as the
    worst; a config's own windows say how noisy it is."""
    weight = min(float(pooled.dof), POOLED_DOF)
    dof = own.dof + weight
    if dof == 0:
        return Noise()
    return Noise((own.dof * own.s2 + weight * pooled.s2) / dof, dof)


def pooled_noise(groups: Sequence[Sequence[float]]) -> Noise:
    """The pooled relative variance of groups of repeated values (each group: one config's windows
    in one epoch); groups of one window, or with a zero mean, tell nothing."""
    total, dof = 0.0, 0
    for values in groups:
        if len(values) < 2:
            continue
        mean = sum(values) / len(values)
        if mean == 0 or not math.isfinite(mean):
            continue
        total += sum((v / mean - 1.0) ** 2 for v in values)
        dof += len(values) - 1
    return Noise(total / dof, dof) if dof else Noise()


class Side(StrEnum):
    """Which config the gate wants one more window of."""

    CANDIDATE = "candidate"
    DEPLOYED = "deployed"


@dataclass(frozen=True)
class Verdict:
    gain: float  # r - 1: the candidate's mean over the deployed config's, minus 1
    margin: float  # the least gain that counts (spec.tuning.minGain)
    confidence: float  # P(true gain >= margin), 0..1
    required: float  # the confidence needed (spec.tuning.confidence)
    se: float  # standard error of ln r
    noise: float  # the relative sd of one typical window under the model
    candidate_windows: int
    deployed_windows: int
    more: Side | None = None  # one more window of this side could decide (only when not significant)
    confirmed: bool = True  # the candidate's windows exclude the one that selected it

    @property
    def significant(self) -> bool:
        return self.confirmed and self.confidence >= self.required

    def text(self) -> str:
        windows = f"{self.candidate_windows} + {self.deployed_windows} windows"
        if not self.confirmed:
            windows += ", the candidate's only window the one that selected it"
        return (
            f"gain {self.gain:+.1%} (margin {self.margin:.1%}), confidence {self.confidence:.2f} "
            f"{'>=' if self.significant else '<'} {self.required:.2f}; window noise {self.noise:.1%} "
            f"(over {windows})"
        )


def student_t_cdf(x: float, dof: float) -> float:
    """P(T <= x) for a Student-t of ``dof`` degrees of freedom."""
    from scipy.special import stdtr  # scipy is the optimizer's dependency already

    return float(stdtr(dof, x))


def _mean_variance(windows: Sequence[Window], noise: Noise) -> float:
    return sum(noise.variance(w.requests) for w in windows) / len(windows) ** 2


def verdict(
    candidate: Sequence[Window],
    deployed: Sequence[Window],
    ratio: float,
    noise: Noise,
    margin: float,
    required: float,
    confirmed: bool = True,
    deployed_noise: Noise | None = None,
) -> Verdict:
    """The gate's verdict on a candidate against the deployed config. ``ratio``: how much better
    the candidate's mean is (``Goal.ratio`` of the means, > 1: better); both sides non-empty.
    ``confirmed``: the candidate's windows are not the one that made it the best (unconfirmed, the
    verdict is never significant: a window picked as the best of many is biased up, the winner's
    curse; one more window of the candidate can decide). ``noise`` is the candidate's noise model,
    ``deployed_noise`` the deployed config's (default: the same)."""
    if not candidate or not deployed:
        raise ValueError("the gate compares windows of both configs")
    paired = all(w.paired for w in candidate)
    var_c = _mean_variance(candidate, noise)
    dep_noise = noise if deployed_noise is None else deployed_noise
    var_d = 0.0 if paired else _mean_variance(deployed, dep_noise)
    se = math.sqrt(var_c + var_d)
    excess = (math.log(ratio) if ratio > 0 else -math.inf) - math.log1p(margin)
    if se == 0 or not math.isfinite(excess):
        confidence = 1.0 if excess >= 0 else 0.0
    else:
        # The variance is estimated (the prior's K0 degrees and the windows'): the standardized
        # gain is Student-t with that many degrees of freedom, the fewer of the two sides'.
        dof = K0 + (noise.dof if paired else min(noise.dof, dep_noise.dof))
        confidence = student_t_cdf(excess / se, dof)
    typical = [noise.variance(w.requests) for w in candidate]
    typical += [dep_noise.variance(w.requests) for w in deployed]
    sd = math.sqrt(sum(typical) / len(typical))
    more: Side | None = None
    if (confidence < required or not confirmed) and excess >= 0:
        # The measured gain clears the margin, the noise (or the selection) hides it: one more
        # window can decide.
        more = Side.CANDIDATE if paired or var_c >= var_d or not confirmed else Side.DEPLOYED
    return Verdict(
        gain=ratio - 1.0, margin=margin, confidence=confidence, required=required, se=se, noise=sd,
        candidate_windows=len(candidate), deployed_windows=len(deployed), more=more, confirmed=confirmed,
    )  # fmt: skip


@dataclass(frozen=True)
class TrialPrice:
    """What a trial costs, in seconds of the whole deployment's service."""

    restart_s: float
    cold_cache_s: float
    slo_risk_s: float

    @property
    def total_s(self) -> float:
        return self.restart_s + self.cold_cache_s + self.slo_risk_s

    def text(self) -> str:
        return (
            f"{self.total_s:.0f}s of service (restart {self.restart_s:.0f}s, cold cache "
            f"{self.cold_cache_s:.0f}s, SLO risk {self.slo_risk_s:.0f}s)"
        )


def trial_price(
    restart_cost_s: float, warmup_s: float, measure_s: float, p_feasible: float, share: float
) -> TrialPrice:
    """The price of one trial that moves ``share`` (0..1] of the pods onto an untested config."""
    return TrialPrice(
        restart_s=restart_cost_s * share,
        cold_cache_s=warmup_s * COLD_CACHE_LOSS * share,
        slo_risk_s=(1.0 - min(max(p_feasible, 0.0), 1.0)) * (warmup_s + measure_s) * share,
    )


def pays(expected_gain: float, price: TrialPrice, payback_s: float) -> bool:
    """Whether an expected relative improvement held for ``payback_s`` earns back ``price``."""
    return expected_gain * payback_s >= price.total_s

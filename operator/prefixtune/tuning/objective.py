"""Scoring a measurement window: Signals -> Score, or InsufficientData (never a made-up number).

Objectives (every score is "higher is better"):

- ``goodput`` (default): output tokens/s of requests that met both SLO targets (their TTFT, and
  their time per output token against the ITL target; from histograms, per token). Taken
  from ``Signals.goodput_tokens_per_s`` when the source measured it per request (basis
  ``goodput_tokens_per_s``); otherwise derived as ``slo_attainment * output_tokens_per_s`` (basis
  ``slo_attainment*output_tokens_per_s``), which assumes met and missed requests have similar output
  lengths. The basis is recorded in the Score.
- ``throughput``: output tokens/s.
- ``ttft``: minus the TTFT p99 in seconds (so higher is better; -0.5 beats -0.8).

SLO breaches are penalised, once:

- ``goodput`` enforces the SLOs per request: a request that misses either target earns nothing. The
  window's p99 is NOT applied again on top. A p99 over a window rests on its slowest ~1% of
  requests, so one queueing burst moves it 10x: on the twin, six 180 s windows of one config near
  capacity gave goodput 1,317-1,512 tokens/s but p99-penalised scores 63-1,353, which left a tuner
  nothing to learn from. The breaches are still reported (``slo_met``, ``breaches``) and a severe one
  still aborts a trial (``severe_breach``).
- ``throughput`` counts every token, so the tail is charged: the value is multiplied by
  ``min(1, slo/p99)`` for each SLO whose window p99 exceeds it, so a config that serves many tokens
  while blowing the tail never outscores one that keeps the SLO.
- ``ttft``: the TTFT itself is the objective; a breached ITL SLO divides it by ``min(1, slo/p99)``.

Below capacity the rate objectives rank by headroom. When every config meets the SLOs, goodput
(and throughput) equals the offered load whatever the config, so a window alone cannot rank them:
caching on and off score the same and the tuner ends on whichever window counted a few more
requests. A rate score is therefore the measured rate times the window's ``Headroom``: how much more
load the config would carry within the SLOs, ``1 / max(share used)`` of four budgets, bounded to
``HEADROOM_BOUNDS``:

- ``ttft``: TTFT p99 / the TTFT SLO (prefill work and queueing: what prefix caching moves);
- ``itl``: ITL p50 / the ITL SLO (the decode batch's step time; the p99 is not used: it is a prefill
  stall's, at the SLO on a 70B model at 30% load whatever the config, while the per-request time per
  output token that goodput checks is far inside it);
- ``kv-pool``: the KV cache usage (the share of the pool the running requests hold);
- ``running-cap``: the running batch's peak over the window / the config's running-request cap
  (vLLM ``--max-num-seqs``, SGLang ``--max-running-requests``, TensorRT-LLM ``max_batch_size``;
  ``widening.running_cap``), where the config sets one: a request queues for a batch slot when the
  batch reaches the cap, whatever the KV pool and the latencies leave. The peak, not the mean, as the
  TTFT's p99 and not its p50: the batch grows faster than the load (each request stays longer in a
  larger batch), and on the twin the peak at 30% of a load predicts where the cap binds (the cap of
  64 in ``vllm-chatbot-running-cap``: a peak of 25-31 at 3 req/s, 54-61 at 6 req/s, at the cap with
  a queue at 10 req/s) where the mean (12, 30, 63) says five times the load would fit. Without the
  cap (the engine's own default, not known to the policy) the term is not measured.
- ``capacity-model``, only where a window carries one (``Signals.capacity_multiple``: the bench's
  ``--capacity-model`` experiment, never the operator): 1 / the load multiple the twin, calibrated
  to the windows, predicts the config carries within the SLOs (``twin/capacity.py``; measured and not
  adopted: docs/objective.md, "The twin calibrated to the window").

At or past saturation a share is >= 1 and the factor is 1: the score IS the measured goodput, and a
config that serves more within the SLOs wins by that. Below it, the config whose tail is furthest
inside the SLOs and whose pool is least used wins: on the twin, the ranking at 30% of a scenario's
load predicts the ranking at its full load (docs/objective.md has the evidence and the candidates that
lost). The measured rate is kept in ``Score.measured`` (what the benchmark's oracle compares, and
what the objective was before ``v3``), the factor and the term that bounded it in ``Score.headroom``.

``SCORING`` names the definition of the measured value; anything that stores scores (the tuner
benchmark's true-score cache, which holds ``Score.measured_value``) keys on it. The headroom is not
part of a measured value: a change of its terms keeps the stored scores valid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from prefixtune.metrics.signals import Signals
from prefixtune.tuning.settings import Objective, Slo

SCORING = "v3: rates times their SLO/KV headroom below saturation; tail penalty for throughput, ttft"
LOAD_FACTOR_BOUNDS = (0.5, 2.0)  # load-aware normalisation is a first-order correction: keep it bounded
# A rate score's headroom factor: 1 at saturation; at most 20 (a window under ~5% of a config's
# capacity ranks it no further: its shares are too small to tell configs apart from noise)
HEADROOM_BOUNDS = (1.0, 20.0)


class ScoreBasis(StrEnum):
    """How a trial's value (the number the optimizer compares, ``status.trials[].score``) was made
    from its window: the terms of each are in ``ValueTerms`` (``tuning/state.py``)."""

    MEASURED = "measured"  # the window's own score, as measured on the pods under test
    # canary: the stable config's value times the canary/baseline ratio over the same window
    PAIRED = "paired-with-baseline"
    # rolling (all pods): the window's score times the bounded reference/offered arrival-rate factor
    LOAD_NORMALIZED = "load-normalized"


@dataclass(frozen=True)
class Goal:
    """One objective and its sign convention; nothing else asks which objective it is.

    Every score is "higher is better". Rates (goodput, throughput) are >= 0, split by pod and scale
    with the offered load; ``ttft`` scores are negative seconds (``-TTFT p99``), per request, and
    compare as the inverse ratio of the latencies.
    """

    name: str
    negative: bool = False  # scores are negative seconds (-0.5 beats -0.8)
    # Paired canary/baseline scores of this rate compare per request each side served (see paired).
    per_request: bool = False

    @property
    def per_pod(self) -> bool:
        """A rate that traffic split by pod divides (paired canary/baseline scores)."""
        return not self.negative

    @property
    def ranks_headroom(self) -> bool:
        """A rate that equals the offered load below saturation: scored times its ``Headroom``."""
        return not self.negative

    @property
    def load_scaled(self) -> bool:
        """A rate that scales with the offered load below saturation (rolling windows)."""
        return not self.negative

    def ratio(self, a: float, b: float) -> float:
        """How much better ``a`` is than ``b`` (> 1: ``a`` is better): a/b, or b/a = tb/ta for ttft."""
        if self.negative:
            if a >= 0 or b >= 0:
                raise ValueError("ttft scores are negative seconds")
            return b / a
        if b <= 0:
            return float("inf") if a > 0 else 1.0
        return a / b

    def beats(self, a: float, b: float, margin: float) -> bool:
        """``b`` is better than ``a`` by at least ``margin`` (a ratio, e.g. 1.02)."""
        if self.negative:
            return a < 0 and b < 0 and (-b) >= margin * (-a)
        return a >= margin * b

    def scaled(self, anchor: float, ratio: float) -> float | None:
        """The score a canary ``ratio`` (> 1: better) implies against ``anchor``; None when the
        anchor has the wrong sign to anchor anything."""
        if self.negative:
            return anchor / ratio if anchor < 0 else None
        return anchor * ratio if anchor > 0 else None

    def penalized(self, raw: float, factor: float) -> float:
        """``raw`` charged by an SLO ``factor`` in (0, 1]: it shrinks a rate, lengthens a latency."""
        return raw / factor if self.negative else raw * factor

    def slo_score(self, ttft_slo_s: float) -> float | None:
        """Where the TTFT SLO lies on the score axis, for objectives whose score is the TTFT."""
        return -ttft_slo_s if self.negative else None


GOALS: dict[str, Goal] = {
    "goodput": Goal("goodput", per_request=True),
    "throughput": Goal("throughput"),
    "ttft": Goal("ttft", negative=True),
}


def goal(objective: str) -> Goal:
    try:
        return GOALS[objective]
    except KeyError:
        raise ValueError(f"unknown objective {objective!r}; allowed: {', '.join(GOALS)}") from None


class HeadroomLimit(StrEnum):
    """A budget the window's load used a share of: the largest share bounds the ``Headroom``."""

    TTFT = "ttft"  # TTFT p99 / TTFT SLO
    ITL = "itl"  # ITL p50 / ITL SLO
    KV = "kv-pool"  # KV cache usage
    RUNNING = "running-cap"  # running batch peak / the config's running-request cap
    MODEL = "capacity-model"  # 1 / the capacity multiple the twin calibrated to the window predicts


@dataclass(frozen=True)
class Headroom:
    """How much more load a config would carry within the SLOs, from one window: ``factor`` =
    ``1 / share`` within ``HEADROOM_BOUNDS``, ``share`` being the largest share the window's load
    used of a budget (``limit``). 1 at saturation (a share >= 1)."""

    factor: float
    limit: HeadroomLimit
    share: float

    @property
    def saturated(self) -> bool:
        return self.factor <= HEADROOM_BOUNDS[0]

    @property
    def bounded(self) -> bool:
        """``limit`` bounds the factor (below ``HEADROOM_BOUNDS``' top): more room in that budget
        would rank the config higher."""
        return self.factor < HEADROOM_BOUNDS[1]


def headroom(
    signals: Signals, slo: Slo, running_cap: int | None = None, *, engine_budgets_only: bool = False
) -> Headroom | None:
    """The window's headroom (module docstring); None when no budget's share was measured.
    ``running_cap``: the running-request cap of the config the window measured (None: not known).
    ``engine_budgets_only``: only the engine's own budgets, without a capacity the twin predicted
    (which of them more load reaches first: the widening's question)."""
    running = None
    if running_cap is not None and running_cap > 0 and signals.running_max is not None:
        running = signals.running_max / running_cap
    multiple = None if engine_budgets_only else signals.capacity_multiple
    shares: list[tuple[HeadroomLimit, float]] = []
    for limit, used in (
        (HeadroomLimit.TTFT, None if signals.ttft_p99_s is None else signals.ttft_p99_s / slo.ttft_p99_s),
        (HeadroomLimit.ITL, None if signals.itl_p50_s is None else signals.itl_p50_s / slo.itl_p99_s),
        (HeadroomLimit.KV, signals.kv_usage_mean),
        (HeadroomLimit.RUNNING, running),
        (HeadroomLimit.MODEL, None if not multiple else 1.0 / multiple),
    ):
        if used is not None and math.isfinite(used) and used >= 0:
            shares.append((limit, float(used)))
    if not shares:
        return None
    limit, share = max(shares, key=lambda ls: ls[1])  # the first listed on a tie
    low, high = HEADROOM_BOUNDS
    factor = high if share <= 1 / high else min(max(1 / share, low), high)
    return Headroom(factor=float(factor), limit=limit, share=share)


def decided_by(
    objective: str, measured: tuple[float, float], factors: tuple[float, float], limit: HeadroomLimit | None
) -> str:
    """Which term decided between two rate scores ``measured[i] * factors[i]`` (0: the winner): the
    objective itself (``"goodput"``: one served more within the SLOs) when the measured values differ
    more, as a ratio, than the headroom factors; else the headroom and the winner's ``limit``
    (``"headroom (ttft)"``: both served the load, one with more room to spare)."""
    if measured[0] <= 0 or measured[1] <= 0 or factors[0] <= 0 or factors[1] <= 0:
        return objective
    by_rate = abs(math.log(measured[0] / measured[1]))
    by_room = abs(math.log(factors[0] / factors[1]))
    if by_rate >= by_room:
        return objective
    return f"headroom ({limit})" if limit is not None else "headroom"


@dataclass(frozen=True)
class Score:
    value: float  # ``measured`` times the headroom factor (1 without one)
    objective: str
    basis: str  # which signals the value came from
    raw: float  # the measured value before the SLO penalty
    slo_met: bool
    breaches: tuple[str, ...] = ()  # e.g. ("ttft_p99 2.9s > 2.0s",)
    requests: float = 0.0
    measured: float | None = None  # the objective as measured, SLO penalty applied (None: = value)
    headroom: Headroom | None = None  # rate objectives below saturation (module docstring)

    @property
    def measured_value(self) -> float:
        """The objective as measured over the window, without the headroom: what a long run at a
        fixed load scores (the tuner benchmark's truth)."""
        return self.value if self.measured is None else self.measured

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "value": float(self.value),
            "objective": self.objective,
            "basis": self.basis,
            "raw": float(self.raw),
            "measured": float(self.measured_value),
            "sloMet": bool(self.slo_met),
            "breaches": list(self.breaches),
            "requests": float(self.requests),
        }
        if self.headroom is not None:
            out["headroom"] = float(self.headroom.factor)
            out["headroomLimit"] = str(self.headroom.limit)
        return out


@dataclass(frozen=True)
class InsufficientData:
    reason: str
    missing: tuple[str, ...] = ()
    requests: float | None = None

    @property
    def too_few_requests(self) -> bool:
        return not self.missing


def higher_is_better_ratio(objective: str, a: float, b: float) -> float:
    """How much better ``a`` is than ``b`` as a ratio (> 1: ``a`` is better), for any objective.

    goodput/throughput scores are >= 0 (a/b); ttft scores are negative seconds (b/a = tb/ta).
    """
    return goal(objective).ratio(a, b)


def score(
    signals: Signals, objective: Objective, slo: Slo, min_requests: int = 1, running_cap: int | None = None
) -> Score | InsufficientData:
    """The window's score; ``running_cap``: the measured config's running-request cap, for the
    headroom's ``running-cap`` share (None: not known, the share is not measured)."""
    requests = signals.requests
    if requests is None:
        return InsufficientData("no request count in the window", missing=("requests",))
    if requests < min_requests:
        return InsufficientData(
            f"{requests:g} requests finished in the window, minRequests is {min_requests}", requests=requests
        )
    needed = ["ttft_p99_s", "itl_p99_s"]
    if objective == "throughput":
        needed.append("output_tokens_per_s")
    missing = tuple(n for n in needed if getattr(signals, n) is None)
    basis = ""
    raw = 0.0
    if objective == "goodput":
        if signals.goodput_tokens_per_s is not None:
            basis, raw = "goodput_tokens_per_s", float(signals.goodput_tokens_per_s)
        elif signals.slo_attainment is not None and signals.output_tokens_per_s is not None:
            basis = "slo_attainment*output_tokens_per_s"
            raw = float(signals.slo_attainment) * float(signals.output_tokens_per_s)
        else:
            missing += ("goodput_tokens_per_s or slo_attainment+output_tokens_per_s",)
    if missing:
        return InsufficientData("required signals missing: " + ", ".join(missing), missing=missing)
    ttft, itl = float(signals.ttft_p99_s or 0.0), float(signals.itl_p99_s or 0.0)
    if objective == "throughput":
        basis, raw = "output_tokens_per_s", float(signals.output_tokens_per_s or 0.0)
    elif goal(objective).negative:
        basis, raw = "-ttft_p99_s", -ttft
    breaches: list[str] = []
    factor = 1.0
    for name, observed, target in (("ttft_p99", ttft, slo.ttft_p99_s), ("itl_p99", itl, slo.itl_p99_s)):
        if observed > target:
            breaches.append(f"{name} {observed:.3g}s > {target:.3g}s")
            # goodput has charged each late request already; ttft's own tail is the objective
            if objective == "throughput" or (objective == "ttft" and name == "itl_p99"):
                factor *= target / observed
    measured = goal(objective).penalized(raw, factor)
    room = headroom(signals, slo, running_cap) if goal(objective).ranks_headroom else None
    return Score(
        value=float(measured * (1.0 if room is None else room.factor)),
        objective=objective,
        basis=basis,
        raw=float(raw),
        slo_met=not breaches,
        breaches=tuple(breaches),
        requests=float(requests),
        measured=float(measured),
        headroom=room,
    )


def load_normalized(
    value: float, objective: str, offered_rps: float | None, reference_rps: float | None
) -> float:
    """A rolling-strategy score made comparable across windows with different offered load.

    Below saturation the tokens served scale with the requests offered, so a goodput/throughput
    value is rescaled to the reference arrival rate: ``value * reference / offered``, bounded to
    [0.5, 2] (a first-order correction of the measured rate, not of the headroom factor's own
    change with the load; a window whose load moved more than 2x is not comparable, and the drift
    detector does not re-tune on the load level: ``policy/drift_watch.py``). TTFT scores are not
    rescaled. Without both rates the value is returned unchanged. ``offered_rps`` must be the ARRIVAL
    rate, not the completion rate (which depends on the config under test).
    """
    factor = load_factor(objective, offered_rps, reference_rps)
    return value if factor is None else value * factor


def load_factor(objective: str, offered_rps: float | None, reference_rps: float | None) -> float | None:
    """The factor ``load_normalized`` multiplies by: ``reference / offered`` within
    ``LOAD_FACTOR_BOUNDS``; None when it does not rescale (a TTFT score, or a rate not known)."""
    if not goal(objective).load_scaled or not offered_rps or not reference_rps:
        return None
    return min(max(reference_rps / offered_rps, LOAD_FACTOR_BOUNDS[0]), LOAD_FACTOR_BOUNDS[1])


@dataclass(frozen=True)
class Paired:
    """Canary vs baseline over the same window: ``ratio`` > 1 means the canary is better."""

    ratio: float
    canary: Score
    baseline: Score
    canary_pods: int = 1
    baseline_pods: int = 1
    # goodput: the sides' requests-per-pod ratio (bounded) the per-pod ratio was divided by; 1.0
    # where no such correction applies
    split: float = 1.0


def paired(
    canary: Signals,
    baseline: Signals,
    objective: Objective,
    slo: Slo,
    min_requests: int,
    canary_pods: int = 1,
    baseline_pods: int = 1,
    decided_split: bool = False,
    caps: tuple[int | None, int | None] = (None, None),
) -> Paired | InsufficientData:
    """Score canary and baseline pods measured over the same window and compare per pod.

    Throughput-like scores are divided by the pod count of each side (traffic is split by pod);
    the TTFT score is per request already. Each side must have at least ``min_requests``.

    Goodput compares per request served: a Service splits requests between the pods at random
    (kube-proxy), so one side is sent more or less than its pods' share by chance (a canary pod got
    56 requests in one 20 s window and 82 in the next, at the same load), and goodput, the
    SLO-meeting tokens of the requests a side got, follows the split rather than the config. The
    per-pod ratio is divided by the sides' requests-per-pod ratio, the same first-order correction
    as ``load_normalized`` and within the same bounds (a side that finished under half its share is
    not corrected further: a saturated config's requests queue, and their TTFT fails the SLO, so its
    goodput shows it). Throughput keeps the per-pod ratio: at saturation the requests a pod finishes
    are its config's.

    ``decided_split``: a router in front of the pods decides each side's share (a cache-aware or
    session-hash policy, ``routing.policy.DECIDED_SPLIT``): a canary pod the router gives whole new
    sessions, or that its load balance spares, is sent two or three times its pods' share, or a
    third of it, by design. The requests each side served (the engines' own request counters) are
    then its actual share, and goodput is compared per request served without the bounds (they
    guard against chance in a random spread, not against a router's decision); a router that
    routes a slow side's requests away has already shown it in that side's per-request goodput
    (its requests queued and missed the SLO before the balance moved them).

    ``caps``: the canary's and the baseline's running-request caps (``score``'s ``running_cap``).
    """
    if canary_pods < 1 or baseline_pods < 1:
        raise ValueError("canary_pods and baseline_pods must be >= 1")
    c = score(canary, objective, slo, min_requests, caps[0])
    if isinstance(c, InsufficientData):
        return InsufficientData("canary: " + c.reason, c.missing, c.requests)
    b = score(baseline, objective, slo, min_requests, caps[1])
    if isinstance(b, InsufficientData):
        return InsufficientData("baseline: " + b.reason, b.missing, b.requests)
    g = goal(objective)
    split = 1.0
    if g.per_pod:
        ratio = g.ratio(c.value / canary_pods, b.value / baseline_pods)
        if g.per_request and math.isfinite(ratio) and c.requests > 0 and b.requests > 0:
            shares = (c.requests / canary_pods) / (b.requests / baseline_pods)
            low, high = LOAD_FACTOR_BOUNDS
            split = shares if decided_split else min(max(shares, low), high)
            ratio /= split
    else:
        ratio = g.ratio(c.value, b.value)
    return Paired(
        ratio=float(ratio), canary=c, baseline=b, canary_pods=canary_pods, baseline_pods=baseline_pods,
        split=float(split),
    )  # fmt: skip


def severe_breach(signals: Signals, slo: Slo, factor: float) -> str | None:
    """A partial window so far over the SLO that the trial should be aborted; None when not."""
    if signals.ttft_p99_s is not None and signals.ttft_p99_s > factor * slo.ttft_p99_s:
        return f"TTFT p99 {signals.ttft_p99_s:.3g}s > {factor:g}x SLO {slo.ttft_p99_s:.3g}s"
    if signals.itl_p99_s is not None and signals.itl_p99_s > factor * slo.itl_p99_s:
        return f"ITL p99 {signals.itl_p99_s:.3g}s > {factor:g}x SLO {slo.itl_p99_s:.3g}s"
    return None

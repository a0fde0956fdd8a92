"""How much more load a config would carry within the SLOs, predicted by the twin calibrated to a window.

A measurement window below capacity says little about where a config's capacity lies: every config
serves the load. The twin can say it, given what the window showed of the workload. ``WindowStats``
holds what an engine's metrics give of one window (the arrival rate and how bursty it is, the prompt
and output lengths' medians and 90th percentiles from their histograms, the share of prompt tokens
the cache saved); ``synthetic_workload`` turns it into a workload of the twin (lognormal lengths
through those quantiles, one shared prefix as long as the saved share of a prompt, gamma-renewal
arrivals with the window's dispersion); ``predict_capacity`` raises that workload's rate on the
config's twin until too few requests meet the SLOs and returns the largest multiple of the window's
rate that still met them (in steps from the window's own rate, then bisections, on fixed arrival
seeds: the same stats give the same answer).

What it cannot see: the workload's prefix structure (how many distinct prefixes, their popularity),
so a cache's hit rate does not fall with load as a corpus larger than the pool's spare room makes it
fall; and anything the twin does not model. Pure and deterministic; the twin is the only dependency.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from prefixtune.twin.request import Request
from prefixtune.twin.run import SimOptions, simulate
from prefixtune.twin.summary import GoodputSlo, percentiles
from prefixtune.twin.workloads import ArrivalSpec, Dist, PrefixPool, WorkloadSpec, generate

Z90 = 1.2815515655446004  # the standard normal's 90th percentile: a lognormal's p90 = p50 * exp(Z90 * sigma)
MAX_SIGMA = 2.0
# Gaps' CV within this of 1 is a Poisson process (the dispersion estimate's own noise is ~20%).
POISSON_CV_BAND = 0.1


class CapacityError(ValueError):
    pass


@dataclass(frozen=True)
class WindowStats:
    """What a window's metrics say of its workload (the engine's histograms and counters)."""

    rate_rps: float  # requests arriving per second
    prompt_p50: float  # prompt tokens, median and 90th percentile
    prompt_p90: float
    output_p50: float  # output tokens
    output_p90: float
    prefill_reduction: float  # prompt tokens the cache saved / prompt tokens, 0..1
    arrival_cv: float = 1.0  # the gaps' coefficient of variation (1: Poisson)

    def __post_init__(self) -> None:
        for name in ("rate_rps", "prompt_p50", "output_p50"):
            if not getattr(self, name) > 0:
                raise CapacityError(f"{name} must be > 0; got {getattr(self, name)}")
        if self.prompt_p90 < self.prompt_p50 or self.output_p90 < self.output_p50:
            raise CapacityError("a 90th percentile below its median")
        if not 0.0 <= self.prefill_reduction < 1.0:
            raise CapacityError(f"prefill_reduction must be in [0, 1); got {self.prefill_reduction}")
        if not self.arrival_cv > 0:
            raise CapacityError(f"arrival_cv must be > 0; got {self.arrival_cv}")


def _sigma(p50: float, p90: float) -> float:
    return min(max(math.log(p90 / p50) / Z90, 0.0), MAX_SIGMA)


def _lognormal(median: float, sigma: float) -> Dist:
    median = max(median, 1.0)
    if sigma <= 0.0:
        return Dist(value=round(median))
    return Dist(
        dist="lognormal", median=median, sigma=sigma, min=1, max=max(2, round(median * math.exp(4 * sigma)))
    )


def synthetic_workload(stats: WindowStats) -> WorkloadSpec:
    """The twin's workload matching ``stats`` (module docstring)."""
    prompt_sigma = _sigma(stats.prompt_p50, stats.prompt_p90)
    prompt_mean = stats.prompt_p50 * math.exp(prompt_sigma**2 / 2)
    shared = round(stats.prefill_reduction * prompt_mean)
    prefixes = (PrefixPool(name="shared", length=Dist(value=shared)),) if shared > 0 else ()
    # the unique part keeps the prompt's spread: its quantiles are the prompt's less the prefix
    rest50 = max(stats.prompt_p50 - shared, 1.0)
    rest90 = max(stats.prompt_p90 - shared, rest50)
    cv = stats.arrival_cv
    arrival = ArrivalSpec() if abs(cv - 1.0) <= POISSON_CV_BAND else ArrivalSpec(process="bursty", cv=cv)
    return WorkloadSpec(
        name="window",
        prefixes=prefixes,
        suffix=_lognormal(rest50, _sigma(rest50, rest90)),
        output=_lognormal(stats.output_p50, _sigma(stats.output_p50, stats.output_p90)),
        arrival=arrival,
    )


@dataclass(frozen=True)
class CapacityModel:
    """How a prediction is run: each load is tried on ``seeds`` (warm-up + window, simulated seconds)
    and passes when every seed has at least ``attainment`` of its output tokens within the SLOs. The
    load rises by ``step`` from the window's own until one fails (a run far past capacity is the
    slowest to simulate, so the search comes from below), then ``refine`` bisections narrow it."""

    seeds: tuple[int, ...] = (7, 8)
    warmup_s: float = 60.0
    window_s: float = 240.0
    attainment: float = 0.95
    top: float = 20.0  # the largest multiple tried (the headroom's own bound)
    step: float = 1.25
    refine: int = 3  # the multiple to within step ** (1 / 2**refine): ~2.8% for 1.25 and 3
    dispersion: bool = True  # arrivals as bursty as the window's (else Poisson)


def _meets(
    engine: str, argv: Sequence[str], files: Mapping[str, str], gpu: str, slo: GoodputSlo,
    workload: WorkloadSpec, rate: float, model: CapacityModel,
) -> bool:  # fmt: skip
    horizon = model.warmup_s + model.window_s
    for seed in model.seeds:
        requests: list[Request] = generate(workload, rate=rate, duration_s=horizon, seed=seed)
        options = SimOptions(seed=seed, slo=slo, warmup_s=model.warmup_s, horizon_s=horizon, files=files)
        summary = simulate(engine, argv, gpu, requests, options)
        if (
            summary.status != "ok"
            or summary.goodput_tokens_per_s < model.attainment * summary.output_tokens_per_s
        ):
            return False
    return True


def predict_capacity(
    engine: str,
    argv: Sequence[str],
    gpu: str,
    slo: GoodputSlo,
    stats: WindowStats,
    *,
    files: Mapping[str, str] | None = None,
    model: CapacityModel | None = None,
) -> float:
    """The largest multiple of ``stats.rate_rps`` (within [1, top]) at which the config booted from
    ``argv`` meets the SLOs on the window's synthetic workload; 1.0 when it does not at the window's
    own rate (at or past capacity)."""
    m = model or CapacityModel()
    workload = synthetic_workload(stats if m.dispersion else replace(stats, arrival_cv=1.0))
    files = dict(files or {})

    def meets(multiple: float) -> bool:
        return _meets(engine, argv, files, gpu, slo, workload, stats.rate_rps * multiple, m)

    if not meets(1.0):
        return 1.0
    lo = 1.0
    while lo < m.top:
        hi = min(lo * m.step, m.top)
        if not meets(hi):
            break
        lo = hi
    else:
        return m.top
    for _ in range(m.refine):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return lo


# What an engine's metrics give of a window, estimated here from the twin's own requests: the request
# counter sampled every ``bin_s`` (a scrape interval) gives the arrivals' dispersion, the length
# histograms their quantiles. The workload's statistics are the workload's, not a config's: pooled
# over every window of one workload (``WorkloadSample``), they stop differing from one trial to the
# next by the windows' own noise; only the share of prompt tokens the cache saved is the config's.
SCRAPE_S = 15.0
MIN_CV, MAX_CV = 0.2, 3.0


def bin_counts(times: Sequence[float], start: float, end: float, bin_s: float = SCRAPE_S) -> list[int]:
    """Arrivals per whole ``bin_s`` interval of ``[start, end)`` (a counter's increase per scrape)."""
    counts = [0] * int((end - start) // bin_s)
    for t in times:
        k = int((t - start) // bin_s)
        if 0 <= k < len(counts):
            counts[k] += 1
    return counts


def arrival_cv(counts: Sequence[int]) -> float:
    """The gaps' CV from counts per interval (a renewal process's counts have variance/mean -> CV^2);
    1.0 with fewer than 4 intervals or no arrivals."""
    n = len(counts)
    if n < 4:
        return 1.0
    mean = sum(counts) / n
    if mean <= 0:
        return 1.0
    var = sum((c - mean) ** 2 for c in counts) / (n - 1)
    return min(max(math.sqrt(var / mean), MIN_CV), MAX_CV)


@dataclass
class WorkloadSample:
    """The workload's observations, pooled over the windows ``add``ed (one workload's epoch)."""

    seconds: float = 0.0
    prompts: list[float] = field(default_factory=list)
    outputs: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)  # arrivals per scrape interval

    def add(self, requests: Sequence[Request], start: float, end: float) -> None:
        """The requests arriving in ``[start, end)`` of one window."""
        arrived = [r for r in requests if start <= r.arrival_s < end]
        self.seconds += end - start
        self.prompts += [float(r.prompt_len) for r in arrived]
        self.outputs += [float(r.output_len) for r in arrived]
        self.counts += bin_counts([r.arrival_s for r in arrived], start, end)

    def stats(self, prefill_reduction: float) -> WindowStats:
        """``WindowStats`` of the pooled windows with the config's ``prefill_reduction``. Raises
        CapacityError when no request arrived."""
        if not self.prompts:
            raise CapacityError("no request arrived in the windows")
        prompt_p50, prompt_p90 = percentiles(self.prompts, (0.5, 0.9))
        output_p50, output_p90 = percentiles(self.outputs, (0.5, 0.9))
        return WindowStats(
            rate_rps=len(self.prompts) / self.seconds,
            prompt_p50=prompt_p50,
            prompt_p90=prompt_p90,
            output_p50=output_p50,
            output_p90=output_p90,
            prefill_reduction=min(max(prefill_reduction, 0.0), 0.999),
            arrival_cv=arrival_cv(self.counts),
        )

"""``prefixtune bench day``: the REAL policy tunes one engine through 24 simulated hours of traffic.

Production timings (the spec defaults: warm-up, 10-minute windows, minInterval) and production-like
traffic: a diurnal load between about 20% and 90% of the best config's capacity, a workload change
at hour 14 (new system prompts, contexts twice as long) and a few 2x bursts of ten minutes. Four
methods see the same arrivals:

- ``tuned``: the operator's policy (``tuning.policy.step``) driven in virtual time all day, exactly
  as the controller drives it (rollouts, warm-up, windows with early-abort checks, watching for
  drift after it converges);
- ``never-tuned``: the deployed config all day;
- ``oracle-static``: the best single config of a grid, chosen in hindsight over the whole day;
- ``one-shot``: a vLLM-auto_tune-style offline tuner run on the hour-0 workload (the highest memory
  fraction that boots, then a sweep of the other knobs there, each measured at capacity), rolled
  out at hour 0 and frozen.

The approximation (docs/day.md): the day is 144 ten-minute segments, each at one load level (a
multiple of ``level_step`` of the phase's capacity) and workload phase. A twin sample per (config,
rate, phase, seed) boots the engine empty, runs ``cold_s`` seconds (the cold cache after a restart;
equal to the spec's warm-up), then ``sample_s`` seconds measured warm, then drains. Every interval of
the day a config serves is charged at that sample's per-second rates (cold for the ``cold_s``
after the config became ready, warm after), and every window the policy measures is the warm
part's signals, scaled to the window's length. Samples are cached on disk, shared by the methods
and by the oracle's grid.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from operator import attrgetter
from pathlib import Path
from typing import Any, Protocol, cast, get_args

from bench.tuner import Scenario, parse_scenario, suite
from prefixtune.engines import get_adapter
from prefixtune.engines.base import KnobConfig
from prefixtune.engines.knobs import KNOB_NAMES, Value
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.actions import Action, EmitEvent
from prefixtune.tuning.drive import (
    DriveResult,
    DriveRules,
    Rollout,
    RolloutKind,
    RunStatus,
    TrialRun,
    never,
    run_policy,
    when_watching,
)
from prefixtune.tuning.phases import SEARCH_PHASES, watching
from prefixtune.tuning.policy import Suggester
from prefixtune.tuning.settings import SpaceOverride, TuningSettings
from prefixtune.tuning.state import (
    Observation,
    PolicyState,
    Trial,
)
from prefixtune.twin.workloads import Dist, WorkloadSpec, parse_workload, preset

DAY_S = 86_400.0
SEGMENT_S = 600.0
PARTIAL_EVERY = 4  # early-abort checks per window (controller/measure.py's PARTIAL_EVERY)
CAPACITY_ATTAINMENT = 0.99  # capacity: the highest rate at which this share of requests meets the SLOs
ARRIVAL_SEED = 7_000  # sample seeds are ARRIVAL_SEED + the segment's seed index
HOUR = 3600.0


class WorkloadPhase(StrEnum):
    BEFORE = "before"  # the scenario's workload
    AFTER = "after"  # from the change on: new system prompts, contexts twice as long


class Method(StrEnum):
    TUNED = "tuned"
    NEVER_TUNED = "never-tuned"
    ORACLE_STATIC = "oracle-static"
    ONE_SHOT = "one-shot"


# ------------------------------------------------------------------------------------------------
# The day's traffic: 144 segments of one load level and workload phase each


@dataclass(frozen=True)
class Segment:
    index: int
    start_s: float
    end_s: float
    level: float  # offered load as a fraction of the phase's capacity
    phase: WorkloadPhase
    burst: bool
    seed: int  # which arrival sequence (of ``n_seeds``) this segment draws


@dataclass(frozen=True)
class Traffic:
    """A diurnal load ``low``..``high`` (fractions of capacity; lowest at ``trough_h``, highest 12 h
    later), quantized to ``level_step``; the workload changes at ``change_h``; each burst multiplies
    one segment's load by ``burst_factor``."""

    low: float = 0.2
    high: float = 0.9
    trough_h: float = 4.0
    change_h: float = 14.0
    bursts_h: tuple[float, ...] = (10.5, 17.0, 20.5)
    burst_factor: float = 2.0
    level_step: float = 0.1
    n_seeds: int = 2

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.high:
            raise ValueError(f"traffic: need 0 < low <= high; got low={self.low} high={self.high}")
        if self.level_step <= 0 or self.n_seeds < 1 or self.burst_factor <= 0:
            raise ValueError("traffic: level_step and burst_factor must be > 0, n_seeds >= 1")
        for name, h in [("change_h", self.change_h), *(("bursts_h", b) for b in self.bursts_h)]:
            if not 0 <= h < 24 or abs(h * HOUR / SEGMENT_S - round(h * HOUR / SEGMENT_S)) > 1e-9:
                raise ValueError(f"traffic: {name} {h} must be in [0, 24) on a 10-minute boundary")

    def diurnal(self, hour: float) -> float:
        """The unquantized diurnal level at ``hour``."""
        shape = (1.0 - math.cos(2.0 * math.pi * (hour - self.trough_h) / 24.0)) / 2.0
        return self.low + (self.high - self.low) * shape

    def quantize(self, level: float) -> float:
        return round(round(level / self.level_step) * self.level_step, 6)

    def segments(self) -> list[Segment]:
        out: list[Segment] = []
        bursts = {round(b * HOUR / SEGMENT_S) for b in self.bursts_h}
        for k in range(round(DAY_S / SEGMENT_S)):
            start = k * SEGMENT_S
            base = self.quantize(self.diurnal((start + SEGMENT_S / 2) / HOUR))
            burst = k in bursts
            level = self.quantize(base * self.burst_factor) if burst else base
            phase = WorkloadPhase.AFTER if start >= self.change_h * HOUR - 1e-9 else WorkloadPhase.BEFORE
            out.append(Segment(k, start, start + SEGMENT_S, level, phase, burst, k % self.n_seeds))
        return out


def segment_at(segments: Sequence[Segment], t: float) -> Segment:
    k = min(max(int(t // SEGMENT_S), 0), len(segments) - 1)
    return segments[k]


# ------------------------------------------------------------------------------------------------
# Samples: what a config serves per second at one rate, cold (after a restart) and warm


@dataclass(frozen=True)
class Counts:
    """Requests that arrived in a part of a sample, those served within both SLOs, their tokens."""

    seconds: float
    arrived: int = 0
    good: int = 0
    good_tokens: int = 0

    def per_request(self) -> tuple[float, float]:
        """(share of requests served within the SLOs, goodput tokens per arrived request)."""
        if self.arrived <= 0:
            return 1.0, 0.0
        return self.good / self.arrived, self.good_tokens / self.arrived

    def goodput_per_s(self) -> float:
        return self.good_tokens / max(self.seconds, 1e-9)


@dataclass(frozen=True)
class Sample:
    status: str  # ok | oom_startup | oom_runtime
    cold: Counts
    warm: Counts
    signals: Signals | None = None  # the warm part, as the engine's metrics show it

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "cold": self.cold.__dict__,
            "warm": self.warm.__dict__,
            "signals": None if self.signals is None else self.signals.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        sig = d.get("signals")
        return cls(
            str(d["status"]),
            Counts(**d["cold"]),
            Counts(**d["warm"]),
            None if sig is None else Signals.from_dict(sig),
        )


class SampleSource(Protocol):
    """What the day needs from the twin (a fake in the tests)."""

    def sample(self, config: KnobConfig, rate: float, phase: WorkloadPhase, seed: int) -> Sample: ...

    def capacity(self, phase: WorkloadPhase) -> float: ...


@dataclass(frozen=True)
class SampleTiming:
    cold_s: float = 180.0  # the cold part; equal to the spec's default warm-up
    sample_s: float = 120.0  # the warm part each segment's rates and each window's signals come from
    drain_s: float = 30.0  # arrivals go on past the sample so its last requests finish under load


@dataclass(frozen=True)
class Change:
    """The workload change: every shared prefix new (new keys: nothing cached before hits after), the
    contexts ``context_scale`` times as long (every prefix pool but the system prompt and preamble,
    and the sessions' own context), each context pool ``corpus_scale`` times as large, and the
    outputs and per-turn suffixes (user messages, tool results) ``output_scale`` and
    ``suffix_scale`` times as long."""

    context_scale: float = 2.0
    corpus_scale: int = 1
    output_scale: float = 1.0
    suffix_scale: float = 1.0

    def __post_init__(self) -> None:
        scales = {k: v for k, v in self.__dict__.items() if k != "corpus_scale"}
        bad = [f"{k}={v!r}" for k, v in scales.items() if not isinstance(v, int | float) or not v > 0]
        if (
            not isinstance(self.corpus_scale, int)
            or isinstance(self.corpus_scale, bool)
            or self.corpus_scale < 1
        ):
            bad.append(f"corpus_scale={self.corpus_scale!r}")
        if bad:
            raise ValueError(
                f"workload change: scales must be > 0 and corpus_scale an integer >= 1; got {', '.join(bad)}"
            )

    def key(self) -> dict[str, float]:
        """What identifies the change in the sample cache: the scales that move something (the
        output and suffix scales only when they do, so that caches of earlier changes stay valid)."""
        out = {"context_scale": self.context_scale, "corpus_scale": self.corpus_scale}
        for name in ("output_scale", "suffix_scale"):
            if getattr(self, name) != 1.0:
                out[name] = getattr(self, name)
        return out

    def apply(self, spec: WorkloadSpec) -> WorkloadSpec:
        def scaled(dist: Dist, by: float) -> Dist:
            keys = ("value", "low", "high", "mean", "std", "median", "min", "max")
            update = {k: getattr(dist, k) * by for k in keys if getattr(dist, k) is not None}
            return dist.model_copy(update=update)

        pools = tuple(
            p
            if p.name in SYSTEM_POOLS
            else p.model_copy(
                update={"length": scaled(p.length, self.context_scale), "count": p.count * self.corpus_scale}
            )
            for p in spec.prefixes
        )
        context = scaled(spec.session.context, self.context_scale)
        return spec.model_copy(
            update={
                "name": f"{spec.name}-v2", "prefixes": pools,
                "session": spec.session.model_copy(update={"context": context}),
                "output": scaled(spec.output, self.output_scale),
                "suffix": scaled(spec.suffix, self.suffix_scale),
            }
        )  # fmt: skip


SYSTEM_POOLS = ("system", "preamble")


def changed_workload(spec: WorkloadSpec, change: Change | None = None) -> WorkloadSpec:
    return (change or Change()).apply(spec)


def workload_of(scenario: Scenario, phase: WorkloadPhase, change: Change | None = None) -> WorkloadSpec:
    w = scenario.workload
    spec = preset(w) if isinstance(w, str) else parse_workload(w)
    return spec if phase == WorkloadPhase.BEFORE else changed_workload(spec, change)


def twin_sample(
    day: DayScenario, config: KnobConfig, rate: float, phase: WorkloadPhase, seed: int, timing: SampleTiming
) -> Sample:
    """Boot the twin empty, serve ``rate`` for ``cold_s + sample_s`` (+ a drain), count each part."""
    from prefixtune.metrics.twin_signals import signals_from_summary
    from prefixtune.twin.engine import TwinEngine, gc_paused
    from prefixtune.twin.memory import StartupOOM
    from prefixtune.twin.run import parse_command, snapshot, totals_between
    from prefixtune.twin.summary import GoodputSlo, RunWindow, SummaryCollector, summarize
    from prefixtune.twin.workloads import generate

    scenario = day.scenario
    cold, warm = timing.cold_s, timing.sample_s
    horizon = cold + warm
    adapter = get_adapter(scenario.engine)
    cmd = adapter.render(scenario.model, config)
    requests = generate(
        workload_of(scenario, phase, day.change),
        rate=rate,
        duration_s=horizon + timing.drain_s,
        seed=ARRIVAL_SEED + seed,
    )
    slo = GoodputSlo(ttft_s=scenario.slo.ttft_p99_s, itl_s=scenario.slo.itl_p99_s)
    collector = SummaryCollector(cold)
    with gc_paused():
        try:
            eng = TwinEngine(parse_command(scenario.engine, cmd.argv, files=cmd.files), scenario.gpu,
                             seed, collector)  # fmt: skip
        except StartupOOM:
            return Sample("oom_startup", Counts(cold), Counts(warm))
        eng.submit_all(sorted(requests, key=attrgetter("arrival_s", "req_id")))
        eng.advance(cold)
        c0 = snapshot(eng)
        eng.advance(horizon)
        c1 = snapshot(eng)
        end = max(eng.now, horizon)
        window = RunWindow(
            status=eng.status, start_s=cold, end_s=end,
            arrived=sum(1 for r in requests if cold <= r.arrival_s < horizon),
            rejected=int(eng.counters.rejected),
            max_running=int(eng.counters.max_running), kv_pool_tokens=int(eng.memory.pool_tokens),
            error=eng.oom_reason,
        )  # fmt: skip
        summary = summarize(collector, window, totals_between(c0, c1), slo, {}, 0.0)
        eng.advance(horizon + timing.drain_s)
        status = eng.status
    parts = {"cold": [0, 0, 0], "warm": [0, 0, 0]}
    for r in requests:
        if r.arrival_s < horizon:
            parts["cold" if r.arrival_s < cold else "warm"][0] += 1
    for d in collector.done:
        if d.arrival_s >= horizon:
            continue
        if d.ttft_s <= scenario.slo.ttft_p99_s and d.tpot_s <= scenario.slo.itl_p99_s:
            part = parts["cold" if d.arrival_s < cold else "warm"]
            part[1] += 1
            part[2] += d.output_len
    signals = signals_from_summary(summary, warm) if summary.status == "ok" else None
    return Sample(
        status,
        Counts(cold, *parts["cold"]),
        Counts(warm, *parts["warm"]),
        signals,
    )


class TwinSamples:
    """Samples of one day scenario from the twin, cached on disk (one JSON file per scenario and
    setup: the methods, the oracle's grid and reruns share them)."""

    def __init__(self, day: DayScenario, timing: SampleTiming, cache_dir: Path | None) -> None:
        self.day = day
        self.timing = timing
        text = json.dumps({"scenario": day.digest(), "timing": timing.__dict__, "v": 1}, sort_keys=True)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        self.path = None if cache_dir is None else cache_dir / f"{day.name}-{digest}.json"
        self.values: dict[str, Any] = {}
        if self.path is not None and self.path.exists():
            self.values = json.loads(self.path.read_text())
        self.runs = 0
        self.sim_seconds = 0.0
        self.wall_seconds = 0.0
        self._unsaved = 0

    def save(self) -> None:
        if self.path is not None and self._unsaved:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.values, sort_keys=True))
            self._unsaved = 0

    def _key(self, config: KnobConfig, rate: float, phase: WorkloadPhase, seed: int) -> str:
        return f"{json.dumps(config.to_dict(), sort_keys=True)}|{rate:.6g}|{phase}|{seed}"

    def sample(self, config: KnobConfig, rate: float, phase: WorkloadPhase, seed: int) -> Sample:
        key = self._key(config, rate, phase, seed)
        if key not in self.values:
            t0 = time.perf_counter()
            s = twin_sample(self.day, config, rate, phase, seed, self.timing)
            self.wall_seconds += time.perf_counter() - t0
            self.runs += 1
            self.sim_seconds += self.timing.cold_s + self.timing.sample_s + self.timing.drain_s
            self.values[key] = s.to_dict()
            self._unsaved += 1
            if self._unsaved >= 25:
                self.save()
        return Sample.from_dict(self.values[key])

    def full_segment(self, config: KnobConfig, rate: float, phase: WorkloadPhase, seed: int) -> Sample:
        """A sample whose warm part is a whole segment (the scaling check), cached like the others."""
        key = "full|" + self._key(config, rate, phase, seed)
        if key not in self.values:
            full = replace(self.timing, sample_s=SEGMENT_S)
            self.values[key] = twin_sample(self.day, config, rate, phase, seed, full).to_dict()
            self._unsaved += 1
        return Sample.from_dict(self.values[key])

    def capacity(self, phase: WorkloadPhase) -> float:
        """The highest rate at which the reference config serves ``CAPACITY_ATTAINMENT`` of the
        requests within the SLOs (warm; bisection in log space over ``CAPACITY_STEPS`` samples)."""
        key = f"capacity|{phase}"
        if key not in self.values:
            ref = self.day.reference_config()

            def sustains(rate: float) -> bool:
                s = self.sample(ref, rate, phase, 0)
                return s.status == "ok" and s.warm.good >= CAPACITY_ATTAINMENT * max(s.warm.arrived, 1)

            lo, hi = self.day.scenario.rate / 8, self.day.scenario.rate * 2
            floor = lo / 16
            while not sustains(lo):
                lo /= 2
                if lo < floor:
                    raise RuntimeError(
                        f"{self.day.name}: the reference config sustains almost no load in phase {phase}"
                        f" (under {floor:.3g} req/s): the day's load cannot be sized from it"
                    )
            while sustains(hi):
                lo, hi = hi, hi * 2
            for _ in range(CAPACITY_STEPS):
                mid = math.sqrt(lo * hi)
                lo, hi = (mid, hi) if sustains(mid) else (lo, mid)
            self.values[key] = round(lo, 4)
            self._unsaved += 1
            self.save()
        return float(self.values[key])


CAPACITY_STEPS = 7


def scaling_check(day_sc: DayScenario, samples: TwinSamples) -> list[dict[str, Any]]:
    """The approximation against full length: for a few (config, level, phase), a sample's warm part
    (``sample_s``) against a whole segment (``SEGMENT_S`` measured after the same ``cold_s``) of the
    same arrival process and seed: the share of requests within the SLOs and the goodput per
    request, whose product with the segment's arrivals is what a segment is charged."""
    capacity = {p: samples.capacity(p) for p in WorkloadPhase}
    ref, deployed = day_sc.reference_config(), day_sc.scenario.start_config()
    out: list[dict[str, Any]] = []
    for phase in WorkloadPhase:
        for config, level, role in (
            (ref, 0.9, "reference"),
            (deployed, 0.6, "deployed"),
            (ref, 0.3, "reference"),
        ):
            rate = round(level * capacity[phase], 6)
            short = samples.sample(config, rate, phase, 0)
            long = samples.full_segment(config, rate, phase, 0)
            (s_share, s_tok), (l_share, l_tok) = short.warm.per_request(), long.warm.per_request()
            out.append({
                "config": role, "level": level, "phase": str(phase),
                "within_slo_share": {"sample": round(s_share, 4), "full": round(l_share, 4)},
                "goodput_per_request": {"sample": round(s_tok, 2), "full": round(l_tok, 2)},
                "goodput_error": round(s_tok / l_tok - 1.0, 4) if l_tok > 0 else None,
            })  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------------
# The scenarios: one per engine


@dataclass(frozen=True)
class DayScenario:
    name: str
    scenario: Scenario
    reference: dict[str, Any]  # over the deployed config: the config whose capacity sizes the load
    oracle_fractions: int = 3
    note: str = ""
    change: Change = field(default_factory=Change)

    def reference_config(self) -> KnobConfig:
        adapter = get_adapter(self.scenario.engine)
        return adapter.normalize(self.scenario.start_config().with_(**self.reference))

    def digest(self) -> str:
        """Identifies the sample cache: what a sample depends on besides its key (the twin's code is
        not in it: clear the cache after changing the twin). Not the objective, the space or the
        policy: a change of the tuner reuses every sample."""
        sc = self.scenario
        fields = {
            "engine": sc.engine, "model": sc.model, "gpu": sc.gpu, "workload": sc.workload,
            "rate": sc.rate, "slo": [sc.slo.ttft_p99_s, sc.slo.itl_p99_s], "reference": self.reference,
            "change": self.change.key(),
        }  # fmt: skip
        text = json.dumps(fields, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


SGLANG_AGENT = {
    "name": "sglang-agent-70b",
    "description": "SGLang, Llama-3.3-70B FP8 on H200, tool-using agent (preset agent), deployed with "
    "--disable-radix-cache (a flag carried over from a workload without reuse); SLO TTFT p99 2 s / "
    "ITL p99 100 ms.",
    "engine": "sglang",
    "model": "llama-3.3-70b-fp8",
    "gpu": "H200",
    "workload": "agent",
    "rate": 4.0,
    "config": {"prefix_caching": False},
    "slo": {"ttft_p99_s": 2.0, "itl_p99_s": 0.1},
    "space": {"memory_fraction": [0.8, 0.95], "block_size": [1, 16], "schedule_policy": ["fcfs", "lpm"]},
}


def day_scenarios() -> dict[str, DayScenario]:
    named = suite()
    agent = parse_scenario(SGLANG_AGENT, "bench/day.py SGLANG_AGENT")
    out = [
        DayScenario(
            "vllm-chatbot", named["vllm-chatbot-70b"], {"prefix_caching": True, "memory_fraction": 0.95},
            note="bench/scenarios/vllm-chatbot-70b.yaml: deployed with prefix caching off",
        ),
        DayScenario(
            "sglang-agent", agent, {"prefix_caching": True},
            note="bench/day.py SGLANG_AGENT: deployed with the radix cache off",
        ),
        DayScenario(
            "trtllm-rag", named["trtllm-rag-corpus"], {},
            note="bench/scenarios/trtllm-rag-corpus.yaml: the engine defaults, near the best; the change "
            "brings a new corpus twice as large (contexts of the same length: TensorRT-LLM without "
            "chunked prefill refuses prompts over max_num_tokens, 8192, so 12k-token contexts would "
            "be refused by every config of the space)",
            change=Change(context_scale=1.0, corpus_scale=2),
        ),
    ]  # fmt: skip
    return {d.name: d for d in out}


# ------------------------------------------------------------------------------------------------
# A day's timeline and its accounting


@dataclass(frozen=True)
class Serving:
    """``config`` serves from ``start_s`` (the moment it was ready: its cache is cold for ``cold_s``
    from ``ready_s``; -inf: it ran before the day, warm) until the next Serving's start."""

    start_s: float
    config: KnobConfig
    ready_s: float


@dataclass
class Totals:
    arrived: float = 0.0
    violating: float = 0.0
    goodput_tokens: float = 0.0

    def add(self, other: Totals) -> None:
        self.arrived += other.arrived
        self.violating += other.violating
        self.goodput_tokens += other.goodput_tokens


class Day:
    """The day's segments and rates; charges intervals of serving against the samples."""

    def __init__(self, traffic: Traffic, samples: SampleSource, cold_s: float) -> None:
        self.traffic = traffic
        self.samples = samples
        self.cold_s = cold_s
        self.segments = traffic.segments()
        self.capacity = {p: samples.capacity(p) for p in WorkloadPhase}

    def rate(self, seg: Segment) -> float:
        return round(seg.level * self.capacity[seg.phase], 6)

    def sample(self, config: KnobConfig, seg: Segment) -> Sample:
        return self.samples.sample(config, self.rate(seg), seg.phase, seg.seed)

    def charge(
        self, config: KnobConfig, ready_s: float, start: float, end: float
    ) -> list[tuple[int, Totals]]:
        """What ``config`` (ready at ``ready_s``) does in ``[start, end)``, per segment touched."""
        out: list[tuple[int, Totals]] = []
        for seg in self.segments:
            a, b = max(start, seg.start_s), min(end, seg.end_s)
            if b <= a:
                continue
            s = self.sample(config, seg)
            rate = self.rate(seg)
            tot = Totals()
            cold_end = ready_s + self.cold_s
            for lo, hi, part in ((a, min(b, cold_end), s.cold), (max(a, cold_end), b, s.warm)):
                if hi > lo:
                    # The segment's arrivals (the same for every method), served as the sample served
                    # its own: its share within the SLOs and goodput tokens per request.
                    share, tokens = (0.0, 0.0) if s.status == "oom_startup" else part.per_request()
                    arrived = rate * (hi - lo)
                    tot.add(Totals(arrived, arrived * (1.0 - share), arrived * tokens))
            out.append((seg.index, tot))
        return out

    def account(self, timeline: Sequence[Serving]) -> tuple[Totals, list[Totals]]:
        """Day totals and per-segment totals of a timeline (sorted by start)."""
        per = [Totals() for _ in self.segments]
        total = Totals()
        for i, run in enumerate(timeline):
            end = timeline[i + 1].start_s if i + 1 < len(timeline) else DAY_S
            for k, t in self.charge(run.config, run.ready_s, run.start_s, end):
                per[k].add(t)
                total.add(t)
        return total, per

    def median_ttft(self, config: KnobConfig, start: float, end: float) -> float | None:
        """The median over the segments in ``[start, end)`` of the warm samples' TTFT p50 (what a
        change gains below capacity, where goodput is the offered load whatever the config; the
        median, as a burst's queue makes a mean of its own)."""
        values = sorted(
            s.ttft_p50_s
            for seg in self.segments
            if min(end, seg.end_s) > max(start, seg.start_s)
            and (s := self.sample(config, seg).signals) is not None
            and s.ttft_p50_s is not None
        )
        if not values:
            return None
        mid = len(values) // 2
        return round(values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2, 4)

    def window(self, config: KnobConfig, start: float, end: float) -> tuple[Sample, float]:
        """The sample a window ``[start, end)`` of ``config`` (warm) measures, and its true mean
        arrival rate: the sample of the segment at the window's middle."""
        seg = segment_at(self.segments, (start + end) / 2)
        arrived = 0.0
        for s in self.segments:
            overlap = min(end, s.end_s) - max(start, s.start_s)
            if overlap > 0:
                arrived += self.rate(s) * overlap
        return self.sample(config, seg), arrived / max(end - start, 1e-9)


def scaled_signals(sample: Sample, window_s: float) -> Signals | None:
    """The sample's warm signals as a window of ``window_s`` shows them (rates as measured; the
    request count scaled to the window)."""
    s = sample.signals
    if s is None:
        return None
    requests = None if s.requests is None else s.requests * window_s / s.window_s
    return replace(s, window_s=window_s, requests=requests)


# ------------------------------------------------------------------------------------------------
# Driving the real policy through the day


@dataclass
class DayRun:
    timeline: list[Serving]
    trials: list[Trial] = field(default_factory=list)
    # (time, config, kind)
    rollouts: list[tuple[float, KnobConfig, RolloutKind]] = field(default_factory=list)
    boot_failures: int = 0
    settled: list[tuple[float, float, KnobConfig]] = field(default_factory=list)  # watching intervals
    epochs: list[tuple[float, int]] = field(default_factory=list)  # (time, epoch) when each began
    events: list[tuple[float, str, str]] = field(default_factory=list)  # (time, reason, message)
    final_state: PolicyState | None = None


class _DayCluster:
    """The day as the driver's cluster: a config starts unless the sample of the segment it would be
    ready in ran out of memory at start-up; a window measures the warm signals of the sample at its
    middle (``Day.window``), scaled to the seconds it reports."""

    def __init__(self, day: Day) -> None:
        self.day = day

    def starts(self, config: KnobConfig, ready_at: float) -> bool:
        day = self.day
        return day.sample(config, segment_at(day.segments, min(ready_at, DAY_S - 1))).status != "oom_startup"

    def window(self, config: KnobConfig, start: float, end: float, seconds: float) -> TrialRun:
        sample, offered = self.day.window(config, start, end)
        return TrialRun(_run_status(sample.status), scaled_signals(sample, seconds), offered)


def _run_status(status: str) -> RunStatus:
    if status not in get_args(RunStatus):
        raise ValueError(f"a sample's status is one of {get_args(RunStatus)}, not {status!r}")
    return cast(RunStatus, status)


class _DayRecorder:
    """Builds a ``DayRun`` from the driver's hooks: the timeline of what served when, the rollouts,
    the epochs, the events and the intervals spent watching."""

    def __init__(self, config: KnobConfig) -> None:
        self.run = DayRun(timeline=[Serving(0.0, config, -math.inf)])
        self.epoch = -1
        self.settled_from: float | None = None

    def on_rollout(self, rollout: Rollout) -> None:
        run = self.run
        run.rollouts.append((rollout.at, rollout.config, rollout.kind))
        if not rollout.started:
            run.boot_failures += 1
        elif rollout.ready_at < DAY_S:
            run.timeline.append(Serving(rollout.ready_at, rollout.config, rollout.ready_at))

    def on_step(self, state: PolicyState, obs: Observation, now: float, actions: list[Action]) -> None:
        run = self.run
        if state.epoch != self.epoch:
            self.epoch = state.epoch
            run.epochs.append((now, state.epoch))
        run.events.extend((now, a.reason, a.message) for a in actions if isinstance(a, EmitEvent))
        is_watching = watching(state.phase, state.step)
        if is_watching and self.settled_from is None:
            self.settled_from = now
        elif not is_watching and self.settled_from is not None:
            run.settled.append((self.settled_from, now, run.timeline[-1].config))
            self.settled_from = None

    def finish(self, result: DriveResult) -> DayRun:
        run = self.run
        if self.settled_from is not None:
            run.settled.append((self.settled_from, DAY_S, run.timeline[-1].config))
        run.trials = result.trials
        run.final_state = result.state
        return run


def drive_day(
    engine: str,
    settings: TuningSettings,
    config: KnobConfig,
    day: Day,
    *,
    rollout_s: float = 60.0,
    tick_s: float = 60.0,
    freeze_when_settled: bool = False,
    suggester: Suggester | None = None,
) -> DayRun:
    """The controller's loop in virtual time over the day (``tuning.drive.run_policy``): execute the
    policy's actions, report the rollouts ready (or failed at boot) ``rollout_s`` later (a rollout
    of the running config restarts nothing), the warm-ups' ends, each window's partial checks and
    end, and, converged, a window every ``measure_s`` for drift."""
    rules = DriveRules(
        rollout_s=rollout_s,
        tick_s=tick_s,
        until_s=DAY_S,
        stop=when_watching if freeze_when_settled else never,
        checks_per_window=PARTIAL_EVERY,
        measured_phases=SEARCH_PHASES,
        drift_windows=True,
        confirm_running=True,
    )
    recorder = _DayRecorder(config)
    result = run_policy(
        engine, settings, config, _DayCluster(day), rules,
        suggester=suggester, on_step=recorder.on_step, on_rollout=recorder.on_rollout,
    )  # fmt: skip
    return recorder.finish(result)


# ------------------------------------------------------------------------------------------------
# The methods and the report


def production_settings(scenario: Scenario, method: str = "bo") -> TuningSettings:
    """The spec's defaults (warm-up, window, minInterval, budget, drift threshold...) with the
    scenario's objective, SLOs and space."""
    return TuningSettings(
        mode="auto",
        objective=scenario.objective,  # type: ignore[arg-type]
        slo=scenario.slo,
        space=scenario.space,
        method=method,  # type: ignore[arg-type]
        seed_key=f"day/{scenario.name}",
    )


def grid_of(day_sc: DayScenario) -> list[KnobConfig]:
    sc = day_sc.scenario
    adapter = get_adapter(sc.engine)
    return [c for c in sc.oracle_space().grid(day_sc.oracle_fractions) if not adapter.validate(c)]


def one_shot_pick(day_sc: DayScenario, day: Day) -> tuple[KnobConfig, list[dict[str, Any]]]:
    """vLLM auto_tune style, offline on the hour-0 workload: the highest memory fraction of the grid
    that boots, then every other knob's combination there, each measured at capacity (level 1.0);
    the best goodput wins (the earliest on ties)."""
    grid = grid_of(day_sc)
    seg0 = day.segments[0]
    rate = round(1.0 * day.capacity[seg0.phase], 6)
    tried: list[dict[str, Any]] = []
    for f in sorted({c.memory_fraction for c in grid}, reverse=True):
        at_f = [c for c in grid if c.memory_fraction == f]
        boots = [c for c in at_f if day.samples.sample(c, rate, seg0.phase, 0).status != "oom_startup"]
        if not boots:
            tried.append({"memory_fraction": f, "boots": False})
            continue
        best: tuple[float, KnobConfig] | None = None
        for c in boots:
            s = day.samples.sample(c, rate, seg0.phase, 0)
            good = s.warm.goodput_per_s() if s.status == "ok" else -1.0
            tried.append({"config": c.to_dict(), "goodput_tokens_per_s": round(good, 2)})
            if best is None or good > best[0]:
                best = (good, c)
        assert best is not None
        return best[1], tried
    raise RuntimeError(f"{day_sc.name}: no memory fraction of the grid boots")


def screen_change(day_sc: DayScenario, samples: SampleSource, levels: Sequence[float]) -> dict[str, Any]:
    """Does the scenario's workload change move the best config? Every grid config on the changed
    workload at ``levels`` of the reference config's capacity after the change (both arrival seeds
    of the day): its goodput tokens over the best config's, its requests outside the SLOs, and
    where the one-shot tuner's pick (the hour-0 best at capacity) stands. A cheap look before a
    whole day is simulated (docs/day.md)."""
    day = Day(Traffic(), samples, SampleTiming().cold_s)
    after = WorkloadPhase.AFTER
    pick, _ = one_shot_pick(day_sc, day)
    rows: list[tuple[float, int, KnobConfig, set[str]]] = []
    for c in grid_of(day_sc):
        tokens, violating, status = 0.0, 0, set()
        for level in levels:
            for seed in range(Traffic().n_seeds):
                s = samples.sample(c, round(level * day.capacity[after], 6), after, seed)
                status.add(s.status)
                good = (0, 0) if s.status == "oom_startup" else (s.warm.good, s.warm.good_tokens)
                tokens += good[1]
                violating += s.warm.arrived - good[0]
        rows.append((tokens, violating, c, status))
    rows.sort(key=lambda r: -r[0])
    best = rows[0][0] or 1.0
    ranked = [
        {"config": c.to_dict(), "goodput_vs_best": round(t / best, 4), "slo_violating": v,
         "status": sorted(st)}
        for t, v, c, st in rows
    ]  # fmt: skip
    pick_row = next(r for r in ranked if r["config"] == pick.to_dict())
    return {
        "change": day_sc.change.key(),
        "levels": list(levels),
        "capacity_rps": {str(p): v for p, v in day.capacity.items()},
        "one_shot_pick": pick.to_dict(),
        "one_shot_vs_best": pick_row["goodput_vs_best"],
        "best": ranked[0]["config"],
        "grid": ranked,
    }


def static_totals(day: Day, config: KnobConfig) -> Totals:
    return day.account([Serving(0.0, config, -math.inf)])[0]


def oracle_static(
    day_sc: DayScenario, day: Day, extra: Iterable[KnobConfig], top_k: int
) -> tuple[KnobConfig, Totals, dict[str, Any]]:
    """The best config of the grid over the whole day, in hindsight. Every grid config is screened at
    the peak level of each phase; the ``top_k`` best there (and ``extra``: the configs the other
    methods ran) are charged over the whole day; the best total wins."""
    grid = grid_of(day_sc)
    peak = {p: max(s.level for s in day.segments if s.phase == p and not s.burst) for p in WorkloadPhase}
    screen: list[tuple[float, KnobConfig]] = []
    for c in grid:
        total = 0.0
        for p, level in peak.items():
            s = day.samples.sample(c, round(level * day.capacity[p], 6), p, 0)
            total += s.warm.goodput_per_s() if s.status == "ok" else -1.0
        screen.append((total, c))
    screen.sort(key=lambda e: -e[0])
    candidates = list(dict.fromkeys([c for _, c in screen[:top_k]] + list(extra)))
    scored = [(static_totals(day, c), c) for c in candidates]
    best_tot, best_cfg = max(scored, key=lambda e: e[0].goodput_tokens)
    info = {
        "grid_size": len(grid),
        "screened_at_levels": {str(p): v for p, v in peak.items()},
        "charged_over_the_day": len(candidates),
        "candidates": [
            {"config": c.to_dict(), "goodput_tokens": round(t.goodput_tokens)}
            for t, c in sorted(scored, key=lambda e: -e[0].goodput_tokens)
        ],
    }
    return best_cfg, best_tot, info


def changes_that_did_not_pay(day: Day, run: DayRun, deployed: KnobConfig) -> list[dict[str, Any]]:
    """Each change of the settled config (the one watched after converging) against the previous
    settled one, over the time until the next change (a search that ends on the same config does
    not end it): the new config's goodput against what the previous one would have served then
    (both warm, the same arrivals)."""
    changes: list[tuple[float, KnobConfig, KnobConfig]] = []
    previous = deployed
    for start, _, cfg in run.settled:
        if cfg != previous:
            changes.append((start, previous, cfg))
            previous = cfg
    out: list[dict[str, Any]] = []
    for i, (start, old_cfg, cfg) in enumerate(changes):
        end = changes[i + 1][0] if i + 1 < len(changes) else DAY_S
        new = sum(t.goodput_tokens for _, t in day.charge(cfg, -math.inf, start, end))
        old = sum(t.goodput_tokens for _, t in day.charge(old_cfg, -math.inf, start, end))
        ttft = {"from": day.median_ttft(old_cfg, start, end), "to": day.median_ttft(cfg, start, end)}
        out.append({
            "at_h": round(start / HOUR, 2), "until_h": round(end / HOUR, 2), "from": old_cfg.to_dict(),
            "to": cfg.to_dict(), "gain": round(new / old - 1.0, 4) if old > 0 else None,
            "paid_off": new > old, "ttft_p50_s": ttft,
            "faster_at_equal_goodput": faster_at_equal_goodput(new, old, ttft["to"], ttft["from"]),
        })  # fmt: skip
    return out


GOODPUT_TIE = 1e-3  # two configs' goodput within 0.1%: both served the same requests within the SLOs
TTFT_GAIN = 0.02  # a TTFT p50 at least 2% lower (the significance gate's default margin)


def faster_at_equal_goodput(new: float, old: float, ttft_new: float | None, ttft_old: float | None) -> bool:
    """Below capacity every config serves the load within the SLOs and goodput ties: what a change
    gains there is latency (what the objective's headroom ranks by). True when the goodput is within
    ``GOODPUT_TIE`` and the TTFT p50 fell by ``TTFT_GAIN`` or more."""
    if old <= 0 or abs(new / old - 1.0) > GOODPUT_TIE or not ttft_new or not ttft_old:
        return False
    return ttft_new <= (1.0 - TTFT_GAIN) * ttft_old


def trial_windows(run: DayRun) -> list[tuple[float, float]]:
    """Intervals in which a trial's config served: from its rollout until the trial ended (the
    configs of the rollout's first ``rollout_s`` are charged as they ran: the previous one)."""
    out: list[tuple[float, float]] = []
    for t in run.trials:
        if t.role == "trial":
            out.append((t.started_at, t.finished_at if t.finished_at is not None else DAY_S))
    return out


def within(per: Sequence[Totals], day: Day, spans: Sequence[tuple[float, float]], run: DayRun) -> float:
    """Violating requests of a tuned run that fell in ``spans``."""
    total = 0.0
    for a, b in spans:
        for i, serving in enumerate(run.timeline):
            end = run.timeline[i + 1].start_s if i + 1 < len(run.timeline) else DAY_S
            lo, hi = max(a, serving.start_s), min(b, end)
            if hi > lo:
                total += sum(t.violating for _, t in day.charge(serving.config, serving.ready_s, lo, hi))
    return total


def reconverge(day: Day, run: DayRun, change_s: float, best: KnobConfig) -> dict[str, Any]:
    """After the workload change: the first time the operator was settled (watching) on a config
    that serves, while it stays settled, at least ``RECONVERGED`` of what the best static config
    serves over the same time (both warm). Whether a search began after the change is reported."""
    began = next((t for t, e in run.epochs if t >= change_s and e > 0), None)
    out: dict[str, Any] = {"search_began_h": None if began is None else round(began / HOUR, 2)}
    for start, end, cfg in run.settled:
        if end <= change_s:
            continue
        lo = max(start, change_s)
        got = sum(t.goodput_tokens for _, t in day.charge(cfg, -math.inf, lo, end))
        ref = sum(t.goodput_tokens for _, t in day.charge(best, -math.inf, lo, end))
        ratio = got / ref if ref > 0 else 1.0
        if ratio >= RECONVERGED:
            return {**out, "hours": round((lo - change_s) / HOUR, 2), "config": cfg.to_dict(),
                    "vs_best_static": round(ratio, 4)}  # fmt: skip
    return {**out, "hours": None, "config": None, "vs_best_static": None}


RECONVERGED = 0.97


def summarize_method(
    day: Day,
    timeline: Sequence[Serving],
    restarts: int,
    run: DayRun | None,
    deployed: KnobConfig,
    best: KnobConfig | None = None,
) -> tuple[dict[str, Any], list[Totals]]:
    total, per = day.account(timeline)
    out: dict[str, Any] = {
        "goodput_tokens": round(total.goodput_tokens),
        "requests": round(total.arrived),
        "slo_violating_requests": round(total.violating),
        "restarts": restarts,
    }
    if run is not None:
        out["slo_violating_in_trial_windows"] = round(within(per, day, trial_windows(run), run))
        out["trials"] = sum(1 for t in run.trials if t.role == "trial")
        out["baselines"] = sum(1 for t in run.trials if t.role == "baseline")
        out["epochs"] = len(run.epochs)
        out["boot_failures"] = run.boot_failures
        out["outcomes"] = _count(t.outcome for t in run.trials)
        changes = changes_that_did_not_pay(day, run, deployed)
        out["config_changes"] = changes
        out["config_changes_not_paid_off"] = sum(1 for c in changes if not c["paid_off"])
        out["config_changes_without_gain"] = sum(
            1 for c in changes if not c["paid_off"] and not c["faster_at_equal_goodput"]
        )
        out["reconverge"] = reconverge(day, run, day.traffic.change_h * HOUR, best or deployed)
        out["final_config"] = run.timeline[-1].config.to_dict()
        if run.final_state is not None:
            out["final_phase"] = str(run.final_state.phase)
            out["final_note"] = run.final_state.note
    else:
        out["slo_violating_in_trial_windows"] = 0
    return out, per


def _count(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def run_day(day_sc: DayScenario, traffic: Traffic, samples: SampleSource, timing: SampleTiming,
            top_k: int, log: Any, policy_seeds: int = 1) -> dict[str, Any]:  # fmt: skip
    t0 = time.perf_counter()
    sc = day_sc.scenario
    day = Day(traffic, samples, timing.cold_s)
    print(f"[{day_sc.name}] capacity {day.capacity} req/s ({time.perf_counter() - t0:.0f}s)", file=log)
    deployed = sc.start_config()
    settings = production_settings(sc)
    methods: dict[str, dict[str, Any]] = {}
    per_segment: dict[str, list[Totals]] = {}
    timelines: dict[str, list[Serving]] = {}

    tuned = drive_day(sc.engine, settings, deployed, day)
    print(f"[{day_sc.name}] tuned: {len(tuned.trials)} trials ({time.perf_counter() - t0:.0f}s)", file=log)
    pick, tried = one_shot_pick(day_sc, day)
    one = [Serving(0.0, deployed, -math.inf)]
    if pick != deployed:
        one.append(Serving(60.0, pick, 60.0))
    extra = [deployed, pick, tuned.timeline[-1].config]
    best, _, info = oracle_static(day_sc, day, extra, top_k)
    print(f"[{day_sc.name}] oracle and one-shot ({time.perf_counter() - t0:.0f}s)", file=log)

    timelines[Method.TUNED] = tuned.timeline
    timelines[Method.NEVER_TUNED] = [Serving(0.0, deployed, -math.inf)]
    timelines[Method.ONE_SHOT] = one
    timelines[Method.ORACLE_STATIC] = [Serving(0.0, best, -math.inf)]
    restarts: dict[str, int] = {Method.TUNED: len(tuned.rollouts), Method.ONE_SHOT: len(one) - 1}
    for name, tl in timelines.items():
        run = tuned if name == Method.TUNED else None
        methods[name], per_segment[name] = summarize_method(
            day, tl, restarts.get(name, 0), run, deployed, best
        )
    methods[Method.NEVER_TUNED]["config"] = deployed.to_dict()
    methods[Method.ONE_SHOT]["config"] = pick.to_dict()
    methods[Method.ONE_SHOT]["sweep"] = tried
    methods[Method.ORACLE_STATIC]["config"] = best.to_dict()
    methods[Method.ORACLE_STATIC]["search"] = info
    oracle_goodput = methods[Method.ORACLE_STATIC]["goodput_tokens"]
    for m in methods.values():
        m["goodput_vs_oracle"] = round(m["goodput_tokens"] / oracle_goodput, 4) if oracle_goodput else None
    seeds = [_seed_summary(methods[Method.TUNED], 0)]
    for i in range(1, policy_seeds):
        # The same day, another optimizer seed (the resource's seed key): how much the tuned run's
        # figures owe to one seed's trial sequence.
        other = drive_day(sc.engine, replace(settings, seed_key=f"{settings.seed_key}#{i}"), deployed, day)
        summary, _ = summarize_method(day, other.timeline, len(other.rollouts), other, deployed, best)
        summary["goodput_vs_oracle"] = round(summary["goodput_tokens"] / oracle_goodput, 4)
        seeds.append(_seed_summary(summary, i))
        print(f"[{day_sc.name}] tuned, policy seed {i} ({time.perf_counter() - t0:.0f}s)", file=log)
    wall = time.perf_counter() - t0
    print(f"[{day_sc.name}] done ({wall:.0f}s)", file=log)
    return {
        "engine": sc.engine,
        "model": sc.model,
        "gpu": sc.gpu,
        "source": day_sc.note,
        "objective": sc.objective,
        "slo": {"ttft_p99_s": sc.slo.ttft_p99_s, "itl_p99_s": sc.slo.itl_p99_s},
        "deployed": deployed.to_dict(),
        "reference": day_sc.reference_config().to_dict(),
        "capacity_rps": {str(p): v for p, v in day.capacity.items()},
        "methods": methods,
        "checks": checks(methods),
        "tuned_policy_seeds": seeds,
        "series": _series(day, per_segment, timelines, tuned),
        "wall_seconds": round(wall, 1),
        "setup_change_h": traffic.change_h,
    }


def _seed_summary(tuned: dict[str, Any], seed: int) -> dict[str, Any]:
    keys = ("goodput_vs_oracle", "slo_violating_requests", "slo_violating_in_trial_windows", "restarts",
            "trials", "epochs", "config_changes_not_paid_off", "config_changes_without_gain")  # fmt: skip
    return {"policy_seed": seed, **{k: tuned[k] for k in keys}, "reconverge_h": tuned["reconverge"]["hours"]}


def checks(methods: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's must-show for the day, per scenario."""
    tuned, never = methods[Method.TUNED], methods[Method.NEVER_TUNED]
    one, oracle = methods[Method.ONE_SHOT], methods[Method.ORACLE_STATIC]
    deployed_best = never["goodput_tokens"] >= oracle["goodput_tokens"] * 0.999
    extra = tuned["slo_violating_requests"] - never["slo_violating_requests"]
    hours = tuned["reconverge"]["hours"]
    retuned = tuned["reconverge"]["search_began_h"] is not None
    ratio = tuned["goodput_vs_oracle"]
    return {
        "tuned_vs_oracle_ge_0.97": ratio is not None and ratio >= 0.97,
        "deployed_is_best": deployed_best,
        "tuned_beats_never_tuned": tuned["goodput_tokens"] > never["goodput_tokens"],
        "tuned_beats_one_shot": tuned["goodput_tokens"] > one["goodput_tokens"],
        "extra_violating_share": round(extra / max(tuned["requests"], 1), 5),
        "extra_violating_le_1pct": extra <= 0.01 * tuned["requests"],
        "changes_not_paid_off": tuned["config_changes_not_paid_off"],
        "changes_without_gain": tuned["config_changes_without_gain"],
        "reconverged_within_2h": hours is not None and hours <= 2.0,
        "searched_after_change": retuned,
    }  # fmt: skip


def _series(
    day: Day, per: dict[str, list[Totals]], timelines: dict[str, list[Serving]], tuned: DayRun
) -> dict[str, Any]:
    return {
        "segment_s": SEGMENT_S,
        "level": [s.level for s in day.segments],
        "rate_rps": [day.rate(s) for s in day.segments],
        "phase": [str(s.phase) for s in day.segments],
        "goodput_tokens_per_s": {
            m: [round(t.goodput_tokens / SEGMENT_S, 2) for t in v] for m, v in per.items()
        },
        "violating": {m: [round(t.violating, 1) for t in v] for m, v in per.items()},
        "timeline": {
            m: [{"at_h": round(s.start_s / HOUR, 3), "config": s.config.to_dict()} for s in v]
            for m, v in timelines.items()
        },
        "trials": [
            {
                "at_h": round(t.started_at / HOUR, 3),
                "role": t.role,
                "epoch": t.epoch,
                "outcome": t.outcome,
                "value": t.value,
                "config": t.config.to_dict(),
            }
            for t in tuned.trials
        ],
        "events": [
            {"at_h": round(t / HOUR, 3), "reason": r, "message": m[:300]}
            for t, r, m in tuned.events
            if r in ("Converged", "DriftDetected", "TrialAborted", "TrialInfeasible", "BaselineMeasured")
        ],
    }


# ------------------------------------------------------------------------------------------------
# The figure


def plot(name: str, result: dict[str, Any], path: Path) -> Path:
    """Load, goodput per segment (each method) with the policy's trial values, and the config the
    tuned operator runs, over the day."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series = result["series"]
    hours = [(k + 0.5) * SEGMENT_S / HOUR for k in range(len(series["level"]))]
    fig = Figure(figsize=(11.0, 8.0))
    FigureCanvasAgg(fig)
    ax1, ax2, ax3 = fig.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [1.0, 1.6, 1.2]})
    ax1.step(hours, series["rate_rps"], where="mid", color="tab:gray")
    ax1.set_ylabel("offered load (req/s)")
    ax1.set_title(f"{name}: {result['engine']} {result['model']} on {result['gpu']}")
    styles = {
        Method.ORACLE_STATIC: ("black", "--"),
        Method.NEVER_TUNED: ("tab:red", ":"),
        Method.ONE_SHOT: ("tab:orange", "-."),
        Method.TUNED: ("tab:blue", "-"),
    }
    for m, (color, ls) in styles.items():
        g = series["goodput_tokens_per_s"].get(str(m))
        if g is not None:
            ratio = result["methods"][str(m)]["goodput_vs_oracle"]
            ax2.plot(hours, _smooth(g), color=color, linestyle=ls, linewidth=1.2,
                     label=f"{m} ({ratio:.3f} of oracle)")  # fmt: skip
    ax2.set_ylabel("goodput (tokens/s, 30-min mean)")
    legend_on = ax2
    ok = [t for t in series["trials"] if t["value"] is not None]
    if ok:
        # The policy's own score of each window it measured (the objective's units: not goodput).
        legend_on = ax2.twinx()
        legend_on.scatter([t["at_h"] for t in ok], [t["value"] for t in ok], s=8, color="tab:green",
                          alpha=0.6, label="tuned: each window's value (right axis)")  # fmt: skip
        legend_on.set_ylabel("the policy's score of each window\n(objective units)", fontsize=8)
    lines, labels = ax2.get_legend_handles_labels()
    if legend_on is not ax2:
        more = legend_on.get_legend_handles_labels()
        lines, labels = lines + more[0], labels + more[1]
    legend_on.legend(lines, labels, fontsize=7, loc="lower center", framealpha=0.9, ncol=2)
    timeline = series["timeline"][str(Method.TUNED)]
    xs = [e["at_h"] for e in timeline] + [24.0]
    fractions = [e["config"]["memory_fraction"] for e in timeline]
    ax3.step(xs, fractions + fractions[-1:], where="post", color="tab:blue", label="memory fraction")
    for e, end in zip(timeline, xs[1:], strict=True):
        colour = "tab:green" if e["config"]["prefix_caching"] else "tab:red"
        ax3.hlines(min(fractions) - 0.02, e["at_h"], end, colors=colour, linewidth=6)
        if end - e["at_h"] > 0.6:
            ax3.text(e["at_h"], e["config"]["memory_fraction"] + 0.003, f"bs {e['config']['block_size']}",
                     fontsize=6)  # fmt: skip
    ax3.set_ylabel("tuned: memory fraction\n(band: caching on/off)")
    ax3.set_xlabel("hour of the day (violet: the workload change)")
    for ax in (ax1, ax2, ax3):
        ax.axvline(float(result["setup_change_h"]), color="tab:purple", linewidth=0.8)
        ax.set_xlim(0, 24)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(path), dpi=100, format="png")
    return path


def _smooth(values: Sequence[float], width: int = 3) -> list[float]:
    """A centred moving mean over ``width`` segments (the samples' two arrival seeds alternate)."""
    half = width // 2
    return [
        sum(values[max(0, i - half) : i + half + 1]) / len(values[max(0, i - half) : i + half + 1])
        for i in range(len(values))
    ]


# ------------------------------------------------------------------------------------------------


Job = tuple[DayScenario, Traffic, SampleTiming, int, Path | None, bool, int]


def _run_one(job: Job) -> tuple[str, dict[str, Any]]:
    day_sc, traffic, timing, top_k, cache_dir, check, policy_seeds = job
    samples = TwinSamples(day_sc, timing, cache_dir)
    try:
        out = run_day(day_sc, traffic, samples, timing, top_k, sys.stderr, policy_seeds)
        if check:
            t0 = time.perf_counter()
            out["scaling_check"] = scaling_check(day_sc, samples)
            print(f"[{day_sc.name}] scaling check ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)
    finally:
        samples.save()
    out["twin"] = {
        "samples_run": samples.runs,
        "samples_cached": len(samples.values),
        "sim_seconds": round(samples.sim_seconds),
        "wall_seconds": round(samples.wall_seconds, 1),
    }
    return day_sc.name, out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="prefixtune bench day", description=__doc__.split("\n")[0])
    p.add_argument("--scenario", action="append", help="a day scenario by name (repeatable; default all)")
    p.add_argument(
        "--quick", action="store_true", help="a smoke run: vllm-chatbot, short samples, small grid"
    )
    p.add_argument("--sample-s", type=float, default=None, help="warm sample length (default 120; quick 60)")
    p.add_argument("--top-k", type=int, default=3, help="grid configs the oracle charges over the whole day")
    p.add_argument("--cache-dir", type=Path, default=Path(".cache/prefixtune-bench/day"))
    p.add_argument("--no-cache", action="store_true", help="run every sample afresh and keep none")
    p.add_argument("--output", type=Path, help="write the JSON result to this file")
    p.add_argument("--plot-dir", type=Path, help="write one PNG per scenario here")
    p.add_argument("--jobs", type=int, default=1, help="scenarios in parallel processes")
    p.add_argument(
        "--policy-seeds",
        type=int,
        default=1,
        help="tuned runs with other optimizer seeds (the figures: seed 0)",
    )
    p.add_argument("--json", action="store_true", help="print the JSON result (else a short table)")
    p.add_argument(
        "--no-scaling-check", action="store_true", help="skip the samples-against-full-segments check"
    )
    p.add_argument(
        "--screen-change",
        type=json.loads,
        metavar="JSON",
        help="instead of the day: screen the grid on this workload change (Change's fields, e.g. "
        '\'{"context_scale": 1, "suffix_scale": 0.25}\') at --screen-levels of capacity',
    )
    p.add_argument("--screen-levels", default="0.9,1.4", help="levels of capacity --screen-change screens at")
    p.add_argument(
        "--screen-space",
        type=json.loads,
        metavar="JSON",
        default={},
        help="with --screen-change: these knobs' values in the screened grid (and the one-shot's sweep) "
        "beside the scenario's space, e.g. '{\"max_batched_tokens\": [2048, 8192]}'",
    )
    args = p.parse_args(argv)
    all_ = day_scenarios()
    names = args.scenario or (["vllm-chatbot"] if args.quick else list(all_))
    bad = [n for n in names if n not in all_]
    if bad:
        print(f"--scenario: unknown {', '.join(bad)}; known: {', '.join(all_)}", file=sys.stderr)
        return 2
    if args.top_k < 1 or args.jobs < 1 or args.policy_seeds < 1:
        print("--top-k, --jobs and --policy-seeds must be >= 1", file=sys.stderr)
        return 2
    sample_s = args.sample_s if args.sample_s is not None else (60.0 if args.quick else 120.0)
    if sample_s <= 0:
        print("--sample-s must be > 0", file=sys.stderr)
        return 2
    timing = SampleTiming(sample_s=sample_s)
    if args.screen_change is not None:
        return _screen(args, [all_[n] for n in names], timing)
    traffic = Traffic()
    scenarios = [all_[n] for n in names]
    if args.quick:
        scenarios = [replace(d, oracle_fractions=2) for d in scenarios]
    cache_dir = None if args.no_cache else args.cache_dir
    top_k = min(args.top_k, 2) if args.quick else args.top_k
    t0 = time.perf_counter()
    check = not (args.quick or args.no_scaling_check)
    jobs: list[Job] = [(d, traffic, timing, top_k, cache_dir, check, args.policy_seeds) for d in scenarios]
    if args.jobs <= 1 or len(jobs) <= 1:
        results = [_run_one(j) for j in jobs]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=min(args.jobs, len(jobs)), mp_context=ctx) as pool:
            results = list(pool.map(_run_one, jobs))
    result: dict[str, Any] = {
        "setup": {
            "day_s": DAY_S,
            "segment_s": SEGMENT_S,
            "traffic": {**traffic.__dict__, "bursts_h": list(traffic.bursts_h)},
            "timing": timing.__dict__,
            "capacity": f"highest rate at which the reference config serves {CAPACITY_ATTAINMENT:.0%} of "
            f"requests within the SLOs (warm, bisection over {CAPACITY_STEPS} samples)",
            "settings": "TuningSettings defaults (the spec's): "
            + json.dumps({k: v for k, v in TuningSettings().__dict__.items() if isinstance(v, int | float)}),
            "rollout_s": 60.0,
            "oracle_top_k": top_k,
            "quick": args.quick,
            "policy_seeds": args.policy_seeds,
            "python": sys.version.split()[0],
        },
        "scenarios": dict(results),
    }
    result["setup"]["wall_seconds"] = round(time.perf_counter() - t0, 1)
    if args.plot_dir is not None:
        for name, res in result["scenarios"].items():
            plot(name, res, args.plot_dir / f"day-{name}.png")
    text = json.dumps(result, indent=1)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
    if args.json:
        print(text)
    else:
        for name, res in result["scenarios"].items():
            row = ", ".join(
                f"{m} {v['goodput_vs_oracle']:.3f}/{v['slo_violating_requests']}/{v['restarts']}"
                for m, v in res["methods"].items()
            )
            print(f"{name}: {row}  (goodput vs oracle / violating requests / restarts)")
            print(f"  checks: {json.dumps(res['checks'])}")
    return 0


def _screen(args: argparse.Namespace, scenarios: list[DayScenario], timing: SampleTiming) -> int:
    try:
        change = Change(**args.screen_change)
        levels = [float(x) for x in str(args.screen_levels).split(",")]
        if not isinstance(args.screen_space, dict):
            raise ValueError("--screen-space must be a JSON object of knob names to lists of values")
        extra = SpaceOverride.from_mapping(args.screen_space)
        for d in scenarios:
            valid_values(widened(d, extra), extra)
    except (TypeError, ValueError) as e:
        print(f"--screen-change / --screen-levels / --screen-space: {e}", file=sys.stderr)
        return 2
    out: dict[str, Any] = {}
    for d in scenarios:
        changed = replace(widened(d, extra), change=change)
        samples = TwinSamples(changed, timing, None if args.no_cache else args.cache_dir)
        try:
            out[d.name] = screen_change(changed, samples, levels)
        finally:
            samples.save()
        r = out[d.name]
        print(f"{d.name} {r['change']}: one-shot's pick {r['one_shot_vs_best']:.4f} of the best "
              f"{_label(r['best'])}", file=sys.stderr)  # fmt: skip
    setup = {"timing": timing.__dict__, "levels": levels, "space": args.screen_space}
    text = json.dumps({"setup": setup, "scenarios": out}, indent=1)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
    if args.json:
        print(text)
    return 0


def widened(day_sc: DayScenario, extra: SpaceOverride) -> DayScenario:
    """``day_sc`` with ``extra``'s listed knobs set in its scenario's space (the others as they were)."""
    sc = day_sc.scenario
    space = SpaceOverride(**{name: _either(extra.get(name), sc.space.get(name)) for name in KNOB_NAMES})
    return replace(day_sc, scenario=replace(sc, space=space))


def _either(first: tuple[Value, ...] | None, second: tuple[Value, ...] | None) -> tuple[Value, ...] | None:
    return first if first is not None else second


def valid_values(day_sc: DayScenario, extra: SpaceOverride) -> None:
    """Raise ValueError when a value ``extra`` lists is in no config of ``day_sc``'s grid that its
    engine accepts (the grid keeps only configs the adapter validates)."""
    grid = grid_of(day_sc)
    for name in KNOB_NAMES:
        for v in extra.get(name) or ():
            if not any(c.get(name) == v for c in grid):
                raise ValueError(f"{day_sc.name}: {name} {v!r} is valid in no config of the grid")


def _label(config: dict[str, Any]) -> str:
    keys = ("memory_fraction", "block_size", "prefix_caching", "schedule_policy")
    return "/".join(str(config[k]) for k in keys)

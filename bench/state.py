"""``prefixtune bench state``: status size and decision time of a resource that has tuned for ages.

The REAL policy (``tuning.policy.step``) is driven in virtual time through N finished trials against
a fast analytic environment (goodput peaks near memory fraction 0.85 with caching on; fractions at
or above ``OOM_AT`` run out of memory, so infeasible trials happen too). When the policy converges
and watches, the workload drifts (the hit rate moves by 0.4, past the 25% threshold): a new epoch
re-tunes with the earlier trials as warm start, which is how a long-lived resource accumulates
history (diurnal load, spec changes). At each checkpoint the REAL status rendering
(``controller.status.build_status``) gives the status JSON size; every decision (the optimizer's
fit and ask, timed around the suggester call) is timed, and each checkpoint reports the decisions
made just before it (median, p90) and how many points the optimizer was told.

    prefixtune bench state [--trials 50,500,1000,3000] [--method bo|random] [--json]

``--driver fast`` drives the policy with a stand-in for the optimizer (it cycles through a grid of
the space: no Gaussian process between checkpoints), so thousands of trials run in minutes on a
busy machine; either way, at each checkpoint the REAL optimizer (``suggest``, bo) is timed
``--probes`` times on the history the policy gives it then (``probe_*``: wall and CPU seconds,
median; CPU is the figure to read on a shared machine). ``--method random`` makes the live
decisions random (no GP) with ``--driver bo``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from prefixtune.controller.status import build_status
from prefixtune.engines import get_adapter
from prefixtune.engines.base import KnobConfig
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.actions import RecordTrial, RollBack, RollOut
from prefixtune.tuning.optimizer import Suggestion, TrialResult, seed_from, suggest
from prefixtune.tuning.phases import ROLLOUT_STEPS, Phase, Step, settled
from prefixtune.tuning.policy import Suggester, initial_state, space_of, step
from prefixtune.tuning.policy._core import Core
from prefixtune.tuning.settings import Slo, TuningSettings
from prefixtune.tuning.space import SearchSpace
from prefixtune.tuning.state import (
    Observation,
    PolicyState,
    RolloutFailed,
    RolloutReady,
    Tick,
    WindowMeasured,
)

ENGINE = "vllm"
OOM_AT = 0.93
STATUS_LIMIT = 256 * 1024  # the must-show: the status stays under 256 KiB
DECISIONS_PER_CHECKPOINT = 20  # the decisions timed for a checkpoint: the last ones before it
ROLLOUT_S = 60.0
TICK_S = 60.0
SETTINGS = TuningSettings(seed_key="bench/state", slo=Slo(2.0, 0.15), min_requests=100)


def signals(config: KnobConfig, level: int, rng: random.Random, window_s: float) -> Signals:
    """A window of ``config`` under load level 0 (hit rate 0.6) or 1 (hit rate 0.2)."""
    v = 1000.0 * (1.0 - 4.0 * (config.memory_fraction - 0.85) ** 2)
    v *= 1.3 if config.prefix_caching else 1.0
    v *= 1.08 if config.schedule_policy == "lpm" and config.prefix_caching else 1.0
    v /= 1.0 + config.block_size / 512.0
    v *= (1.0 if level == 0 else 0.8) * (1.0 + rng.gauss(0.0, 0.02))
    return Signals(
        window_s=window_s, requests=500.0, hit_rate=0.6 if level == 0 else 0.2, ttft_p50_s=0.2,
        ttft_p99_s=0.5, itl_p50_s=0.02, itl_p99_s=0.05, output_tokens_per_s=v * 1.05,
        input_tokens_per_s=2000.0, requests_per_s=1.0, goodput_tokens_per_s=v, slo_attainment=0.95,
    )  # fmt: skip


@dataclass
class Decision:
    trials: int  # finished trials when the decision was made
    seconds: float
    points: int  # trials the optimizer was told


@dataclass
class Checkpoint:
    trials: int
    epoch: int
    status_bytes: int
    policy_state_bytes: int
    trials_kept: int  # full trial records in the policy state
    decisions: list[Decision] = field(default_factory=list)
    probe_wall_s: list[float] = field(default_factory=list)
    probe_cpu_s: list[float] = field(default_factory=list)
    probe_points: int = 0

    def to_dict(self) -> dict[str, Any]:
        secs = sorted(d.seconds for d in self.decisions)

        def median(xs: list[float]) -> float | None:
            return round(statistics.median(xs), 4) if xs else None

        return {
            "trials": self.trials,
            "epoch": self.epoch,
            "status_bytes": self.status_bytes,
            "status_under_limit": self.status_bytes < STATUS_LIMIT,
            "policy_state_bytes": self.policy_state_bytes,
            "trials_kept": self.trials_kept,
            "decisions_timed": len(secs),
            "decision_median_s": round(statistics.median(secs), 4) if secs else None,
            "decision_p90_s": round(secs[int(0.9 * (len(secs) - 1))], 4) if secs else None,
            "optimizer_points_max": max((d.points for d in self.decisions), default=None),
            "probe_points": self.probe_points,
            "probe_wall_median_s": median(self.probe_wall_s),
            "probe_cpu_median_s": median(self.probe_cpu_s),
        }


@dataclass
class StateRun:
    state: PolicyState
    checkpoints: list[Checkpoint]
    decisions: list[Decision]
    max_status_bytes: int
    record_ids: list[int]


def timed(suggester: Suggester, decisions: list[Decision], finished: Callable[[], int]) -> Suggester:
    def wrapped(space: SearchSpace, history: list[TrialResult], seed: int, s: TuningSettings) -> Suggestion:
        started = time.perf_counter()
        out = suggester(space, history, seed, s)
        decisions.append(Decision(finished(), time.perf_counter() - started, len(history)))
        return out

    return wrapped


def default_suggester(
    space: SearchSpace, history: list[TrialResult], seed: int, s: TuningSettings
) -> Suggestion:
    return suggest(
        space, history, seed, method=s.method, n_initial=s.n_initial, convergence_ei=s.convergence_ei
    )


def fast_suggester(
    space: SearchSpace, history: list[TrialResult], seed: int, s: TuningSettings
) -> Suggestion:
    """A stand-in for the optimizer: the next config of a grid over the space, never converging (the
    budget ends each epoch). Deterministic; no Gaussian process."""
    grid = space.grid(5)
    return Suggestion(grid[(seed + len(history)) % len(grid)], "stand-in: the next grid config")


def probe(state: PolicyState, now: float, times: int) -> tuple[int, list[float], list[float]]:
    """Time the real optimizer ``times`` times on the history the policy would give it now."""
    history = Core(state, now, default_suggester).history()
    space = space_of(state)
    seed = seed_from(state.settings.seed_key or state.engine, state.epoch)
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(times):
        wall, cpu = time.perf_counter(), time.process_time()
        suggest(space, history, seed, n_initial=state.settings.n_initial)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return len(history), walls, cpus


def status_of(state: PolicyState, now: float, previous: dict[str, Any] | None) -> dict[str, Any]:
    return build_status(state, [], previous, now=now, generation=1, ready=(True, "Ready", "serving"))


def run(
    checkpoints: Sequence[int],
    *,
    settings: TuningSettings = SETTINGS,
    suggester: Suggester = default_suggester,
    seed: int = 0,
    size_every: int = 1,
    probes: int = 0,
) -> StateRun:
    """Drive the policy until ``max(checkpoints)`` trials finished; the status size is taken after
    every ``size_every`` finished trials (and at each checkpoint)."""
    target = max(checkpoints)
    config = get_adapter(ENGINE).default_config()
    state = initial_state(ENGINE, settings, config)
    rng = random.Random(seed)
    decisions: list[Decision] = []
    ids: list[int] = []
    sugg = timed(suggester, decisions, lambda: len(ids))
    marks: list[Checkpoint] = []
    now, running, pending, pending_at = 0.0, config, None, 0.0
    obs: Observation = RolloutReady(config=config)
    previous: dict[str, Any] | None = None
    max_bytes = 0
    used = 0  # decisions already given to a checkpoint
    while len(ids) < target:
        state, actions = step(state, obs, now, sugg)
        for action in actions:
            if isinstance(action, RecordTrial):
                ids.append(action.trial.id)
                n = len(ids)
                if n in checkpoints or n % size_every == 0:
                    previous = status_of(state, now, previous)
                    size = len(json.dumps(previous, separators=(",", ":")))
                    max_bytes = max(max_bytes, size)
                    if n in checkpoints:
                        mine = decisions[used:][-DECISIONS_PER_CHECKPOINT:]
                        used = len(decisions)
                        policy = len(json.dumps(previous["policy"], separators=(",", ":")))
                        mark = Checkpoint(n, state.epoch, size, policy, len(state.trials), mine)
                        if probes:
                            mark.probe_points, mark.probe_wall_s, mark.probe_cpu_s = probe(state, now, probes)
                        marks.append(mark)
                        print(f"bench state: {json.dumps(mark.to_dict())}", file=sys.stderr, flush=True)
            elif isinstance(action, RollOut | RollBack):
                running = action.config if isinstance(action, RollOut) else action.to_config
                pending, pending_at = RolloutReady(config=running), now + ROLLOUT_S
        if state.phase in (Phase.FAILED, Phase.PAUSED):
            raise RuntimeError(f"the policy halted in {state.phase}: {state.note}")
        level = state.epoch % 2
        if settled(state.phase, state.step):
            # Converged and watching: the workload drifts, a new epoch re-tunes.
            now += TICK_S
            obs = WindowMeasured(
                signals=signals(running, 1 - level, rng, settings.measure_s), offered_rps=1.0
            )
        elif state.step in ROLLOUT_STEPS and pending is not None:
            now, obs, pending = max(now, pending_at), pending, None
        elif state.step == Step.WARMING_UP and state.warm_until is not None:
            now, obs = state.warm_until, Tick()
        elif state.step == Step.MEASURING and state.measure_until is not None:
            now = state.measure_until
            if running.memory_fraction >= OOM_AT:
                obs = RolloutFailed(config=running, failure="oom_runtime")
            else:
                window = signals(running, level, rng, settings.measure_s)
                obs = WindowMeasured(signals=window, offered_rps=1.0)
        else:
            wait = (
                state.last_rollout_at + settings.min_interval_s if state.last_rollout_at is not None else now
            )
            now, obs = max(now + TICK_S, wait), Tick()
    return StateRun(state, marks, decisions, max_bytes, ids)


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="prefixtune bench state", description=__doc__.splitlines()[0])
    p.add_argument("--trials", default="50,500,1000,3000", help="checkpoints: finished trials (comma list)")
    p.add_argument(
        "--method", default="bo", choices=("bo", "random"), help="the live decisions (--driver bo)"
    )
    p.add_argument("--driver", default="bo", choices=("bo", "fast"), help="fast: a stand-in optimizer")
    p.add_argument("--probes", type=int, default=5, help="real bo decisions timed per checkpoint")
    p.add_argument("--max-trials", type=int, default=SETTINGS.max_trials, help="trials per epoch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    ns = p.parse_args(list(argv))
    try:
        points = sorted({int(x) for x in ns.trials.split(",") if x.strip()})
    except ValueError:
        print(f"--trials: a comma list of positive integers, got {ns.trials!r}", file=sys.stderr)
        return 2
    if not points or points[0] < 1:
        print(f"--trials: a comma list of positive integers, got {ns.trials!r}", file=sys.stderr)
        return 2
    try:
        settings = replace(SETTINGS, method=ns.method, max_trials=ns.max_trials)
    except ValueError as exc:
        print(f"bench state: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    driver = fast_suggester if ns.driver == "fast" else default_suggester
    result = run(points, settings=settings, suggester=driver, seed=ns.seed, probes=max(0, ns.probes))
    marks = [c.to_dict() for c in result.checkpoints]

    def ratio(key: str) -> float | None:
        first, last = marks[0][key], marks[-1][key]
        return round(last / first, 3) if first and last else None

    report: dict[str, Any] = {
        "setup": {
            "engine": ENGINE,
            "method": ns.method,
            "driver": ns.driver,
            "probes": ns.probes,
            "max_trials_per_epoch": settings.max_trials,
            "n_initial": settings.n_initial,
            "seed": ns.seed,
            "environment": f"analytic goodput, OOM at memory fraction >= {OOM_AT}, drift every epoch",
            "status_limit_bytes": STATUS_LIMIT,
            "decisions_per_checkpoint": DECISIONS_PER_CHECKPOINT,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg": list(os.getloadavg()),
        },
        "checkpoints": marks,
        "max_status_bytes": result.max_status_bytes,
        "status_under_limit": result.max_status_bytes < STATUS_LIMIT,
        "decision_ratio_last_to_first": ratio("decision_median_s") if ns.driver == "bo" else None,
        "probe_cpu_ratio_last_to_first": ratio("probe_cpu_median_s"),
        "probe_wall_ratio_last_to_first": ratio("probe_wall_median_s"),
        "trial_ids_unique": len(set(result.record_ids)) == len(result.record_ids),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    if ns.json:
        print(json.dumps(report, indent=2))
    else:
        for m in marks:
            print(
                f"{m['trials']:>6} trials  epoch {m['epoch']:>4}  status {m['status_bytes']:>9} B  "
                f"kept {m['trials_kept']:>4}  decision median {m['decision_median_s']} s  "
                f"probe cpu {m['probe_cpu_median_s']} s over {m['probe_points']} points"
            )
        print(
            f"max status {result.max_status_bytes} B; "
            f"probe cpu ratio {report['probe_cpu_ratio_last_to_first']}"
        )
    return 0

"""Drive the real policy in virtual time against a cluster (the twin, a day of samples, a test function).

This is the benchmarks' shell: what the controller does in the cluster (roll out, wait for ready,
warm up, measure a window, report), done against something that can start a config and say what a
window of it measured. It only executes the policy's actions; every decision is the policy's.

One loop, ``run_policy``, executes them for every benchmark. What differs between them is data: a
``Cluster`` (whether a config starts, what a window measures) and ``DriveRules`` (how long a rollout
takes, until when to run, when to stop, early-abort checks per window, which phases' windows are
measured, drift windows while watching, whether the running config's rollout restarts anything).
``drive`` is the tuner benchmark's front: an ``Environment`` that runs warm-up + window, until the
policy settles.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, Protocol

from prefixtune.engines.base import KnobConfig
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.actions import Action, RecordTrial, RollBack, RollOut
from prefixtune.tuning.phases import ROLLOUT_STEPS, Phase, Step, back_to_back, settled, watching
from prefixtune.tuning.policy import Suggester, initial_state, step
from prefixtune.tuning.settings import TuningSettings
from prefixtune.tuning.state import (
    Observation,
    PolicyState,
    RolloutFailed,
    RolloutReady,
    Tick,
    Trial,
    WindowMeasured,
)

MAX_IDLE_STEPS = 1000  # a driver bug guard: that many steps without time, state or actions moving
SEED_STRIDE = 1000003  # drive's window seeds: seed * SEED_STRIDE + the window's number

RunStatus = Literal["ok", "oom_startup", "oom_runtime"]


@dataclass(frozen=True)
class TrialRun:
    """What running a config for warm-up + one measurement window gave."""

    status: RunStatus
    signals: Signals | None = None
    offered_rps: float | None = None


class Cluster(Protocol):
    """What the driver acts on: the pods it rolls configs out to and measures windows of."""

    def starts(self, config: KnobConfig, ready_at: float) -> bool:
        """Whether ``config``, rolled out now and ready at ``ready_at``, starts (False: start-up OOM)."""
        ...

    def window(self, config: KnobConfig, start: float, end: float, seconds: float) -> TrialRun:
        """What the window ``[start, end)`` of ``config`` measures, as a window of ``seconds`` shows
        it (less than ``end - start``: an early-abort check part way through)."""
        ...


def never(state: PolicyState) -> bool:
    """Run until the horizon."""
    return False


def when_settled(state: PolicyState) -> bool:
    """Stop once the tuning run is over for now (halted, or converged and watching)."""
    return settled(state.phase, state.step)


def when_watching(state: PolicyState) -> bool:
    """Stop once converged and watching for drift (a config frozen where the search ended)."""
    return watching(state.phase, state.step)


@dataclass(frozen=True)
class DriveRules:
    """How the driver executes the policy's actions: what differs between the benchmarks."""

    rollout_s: float = 60.0  # a rollout reports ready (or failed at start-up) this long after it began
    tick_s: float = 60.0  # idle: the next Tick this long after the last step (or minInterval's end)
    until_s: float = math.inf  # the driver steps while the virtual clock is below this
    stop: Callable[[PolicyState], bool] = when_settled  # asked after each step's actions: stop now?
    checks_per_window: int = 1  # a window reported in this many parts: early-abort checks, then the end
    measured_phases: frozenset[Phase] = frozenset(Phase)  # phases whose Measuring step gets windows
    drift_windows: bool = False  # watching: a window every measure_s (the drift watch's input)
    # A rollout of the config that already runs, none in flight, is a confirmation: the rendered
    # template is unchanged, so nothing restarts and the pods are ready at once.
    confirm_running: bool = False

    def __post_init__(self) -> None:
        if self.rollout_s < 0 or self.tick_s <= 0 or self.checks_per_window < 1:
            raise ValueError(
                f"DriveRules: rollout_s >= 0, tick_s > 0 and checks_per_window >= 1 "
                f"(got {self.rollout_s}, {self.tick_s}, {self.checks_per_window})"
            )


class RolloutKind(StrEnum):
    TRIAL = "trial"  # a trial's config
    APPLY = "apply"  # the search's result (or the spec's config) applied
    ROLLBACK = "rollback"


@dataclass(frozen=True)
class Rollout:
    """A rollout the driver executed (a confirmation of the running config is none)."""

    at: float
    config: KnobConfig
    kind: RolloutKind
    ready_at: float  # when it reports ready, or failed
    started: bool  # False: the config did not start (OOM at start-up); the old one serves on


@dataclass
class DriveResult:
    state: PolicyState
    trials: list[Trial] = field(default_factory=list)  # RecordTrial actions, in order
    actions: list[Action] = field(default_factory=list)
    rollouts: list[Rollout] = field(default_factory=list)
    now: float = 0.0

    @property
    def final_config(self) -> KnobConfig:
        """The config the policy ends on: the best known (what Converged applies)."""
        s = self.state
        if s.best is not None:
            return s.trial(s.best).config
        return s.current


StepHook = Callable[[PolicyState, Observation, float, list[Action]], None]
RolloutHook = Callable[[Rollout], None]


def run_policy(
    engine: str,
    settings: TuningSettings,
    config: KnobConfig,
    cluster: Cluster,
    rules: DriveRules,
    *,
    suggester: Suggester | None = None,
    on_step: StepHook | None = None,
    on_rollout: RolloutHook | None = None,
) -> DriveResult:
    """The controller's loop in virtual time: step the policy from ``config`` serving, execute its
    actions against ``cluster`` and report what followed: rollouts ready (or failed at start-up)
    ``rules.rollout_s`` later, warm-ups' ends, windows (with early-abort checks), drift windows
    while watching, observe windows while observing, Ticks. ``on_step`` sees each step once its
    actions are executed (state, observation, time, actions); ``on_rollout`` each rollout as it
    begins."""
    state = initial_state(engine, settings, config)
    result = DriveResult(state=state)
    now = 0.0
    obs: Observation = RolloutReady(config=config)
    running = config
    pending: tuple[float, Observation] | None = None  # what the rollout in flight reports, and when
    checks_sent = 0
    checks_of: tuple[int | None, float | None] = (None, None)  # the window they were sent for
    watch_from: float | None = None  # in back-to-back windows since, or the last one's end
    stuck = 0
    last: tuple[object, ...] | None = None  # where the previous step left the clock and the state
    measured = rules.measured_phases
    while now < rules.until_s:
        state, actions = step(state, obs, now, suggester)
        here = (now, state.step, state.phase, state.next_trial_id)
        stuck = stuck + 1 if here == last and not actions else 0
        last = here
        if stuck > MAX_IDLE_STEPS:
            raise RuntimeError(f"policy made no progress at t={now} in {state.phase}/{state.step}")
        result.actions.extend(actions)
        for action in actions:
            if isinstance(action, RecordTrial):
                result.trials.append(action.trial)
            elif isinstance(action, RollOut | RollBack):
                target = action.config if isinstance(action, RollOut) else action.to_config
                if rules.confirm_running and target == running and pending is None:
                    pending = (now, RolloutReady(config=target))  # the pods run it: ready at once
                    continue
                ready = now + rules.rollout_s
                rollout = Rollout(now, target, _kind(action), ready, cluster.starts(target, ready))
                result.rollouts.append(rollout)
                if rollout.started:
                    pending = (ready, RolloutReady(config=target))
                    running = target
                else:
                    pending = (ready, RolloutFailed(config=target, failure="oom_startup"))
                if on_rollout is not None:
                    on_rollout(rollout)
        if on_step is not None:
            on_step(state, obs, now, actions)
        if not back_to_back(state.phase, state.step):
            watch_from = None
        elif watch_from is None:
            watch_from = now
        if rules.stop(state):
            break
        # the next observation follows from where the policy is
        st = state.step
        if st in ROLLOUT_STEPS and pending is not None:
            now, obs = max(now, pending[0]), pending[1]
            pending = None
        elif st == Step.WARMING_UP and state.warm_until is not None:
            now, obs = max(now, state.warm_until), Tick()
        elif st == Step.MEASURING and (end := state.measure_until) is not None and state.phase in measured:
            start = state.measure_from if state.measure_from is not None else now
            length = end - start
            if checks_of != (state.active, state.measure_from):
                checks_of, checks_sent = (state.active, state.measure_from), 0
            if checks_sent < rules.checks_per_window - 1:
                # an early-abort check part way through (a config that failed has nothing to check)
                at = start + length * (checks_sent + 1) / rules.checks_per_window
                part = cluster.window(running, start, end, at - start)
                if part.status == "ok":
                    checks_sent += 1
                    now = max(now, at)
                    obs = WindowMeasured(signals=part.signals, partial=True, offered_rps=part.offered_rps)
                    continue
            checks_sent = 0
            now = max(now, end)
            obs = _reported(cluster.window(running, start, end, length), running)
        elif watch_from is not None and (rules.drift_windows or state.phase == Phase.OBSERVING):
            # observing: windows are all observe mode does (the controller measures them as drift
            # windows: controller/measure.py); watching: only when the rules ask for drift windows
            end = watch_from + settings.measure_s
            run = cluster.window(running, watch_from, end, settings.measure_s)
            now, watch_from = max(now, end), end
            obs = _reported(run, running)
        else:
            wait = (
                state.last_rollout_at + settings.min_interval_s if state.last_rollout_at is not None else now
            )
            now, obs = max(now + rules.tick_s, wait), Tick()
    result.state = state
    result.now = now
    return result


def _kind(action: RollOut | RollBack) -> RolloutKind:
    if isinstance(action, RollBack):
        return RolloutKind.ROLLBACK
    return RolloutKind.TRIAL if action.trial is not None else RolloutKind.APPLY


def _reported(run: TrialRun, config: KnobConfig) -> Observation:
    """A whole window as the policy hears it: measured, or the config failed in it."""
    if run.status != "ok" or run.signals is None:
        return RolloutFailed(config=config, failure=run.status)
    return WindowMeasured(signals=run.signals, offered_rps=run.offered_rps)


# ------------------------------------------------------------------------------------------------
# The tuner benchmark's front: an environment that runs warm-up + one window per trial


class Environment(Protocol):
    def run(self, config: KnobConfig, warmup_s: float, measure_s: float, seed: int) -> TrialRun: ...


class _EnvironmentCluster:
    """An ``Environment`` as a cluster: each window one ``env.run`` (warm-up + window) with its own
    seed; start-up OOM is the window's result, unless the environment ``probes_boot``."""

    def __init__(self, env: Environment, warmup_s: float, seed: int) -> None:
        self.env = env
        self.warmup_s = warmup_s
        self.seed = seed
        self.runs = 0
        self.probes_boot = bool(getattr(env, "probes_boot", False))

    def starts(self, config: KnobConfig, ready_at: float) -> bool:
        if not self.probes_boot:
            return True
        boot = self.env.run(config, 0.0, 0.0, seed=self.seed * SEED_STRIDE + self.runs)
        return boot.status != "oom_startup"

    def window(self, config: KnobConfig, start: float, end: float, seconds: float) -> TrialRun:
        self.runs += 1
        return self.env.run(config, self.warmup_s, seconds, seed=self.seed * SEED_STRIDE + self.runs)


def drive(
    engine: str,
    settings: TuningSettings,
    config: KnobConfig,
    env: Environment,
    *,
    seed: int = 0,
    rollout_s: float = 60.0,
    tick_s: float = 60.0,
    horizon_s: float = 1e9,
    suggester: Suggester | None = None,
    on_step: StepHook | None = None,
) -> DriveResult:
    """Run the policy until it settles (or past the horizon), executing its actions against ``env``.

    Rollouts take ``rollout_s``; a config that fails to start reports rollout_failed then (or at
    the end of its first window, where the environment cannot tell without one). Each trial's
    measurement is one ``env.run`` (warm-up + window) with its own seed; a runtime OOM reports
    rollout_failed(oom_runtime) at the end of the window.
    """
    rules = DriveRules(
        rollout_s=rollout_s,
        tick_s=tick_s,
        until_s=math.nextafter(horizon_s, math.inf),  # the horizon itself is still stepped
        stop=when_settled,
    )
    cluster = _EnvironmentCluster(env, settings.warmup_s, seed)
    return run_policy(engine, settings, config, cluster, rules, suggester=suggester, on_step=on_step)

"""Drive the real policy in virtual time against an environment (the twin, or a test function).

This is the benchmark's shell: what the controller does in the cluster (roll out, wait for ready,
warm up, measure a window, report), done against something that can run a config for a while and
say what it measured. It only executes the policy's actions; every decision is the policy's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from prefixtune.engines.base import KnobConfig
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.actions import Action, RecordTrial, RollBack, RollOut
from prefixtune.tuning.phases import ROLLOUT_STEPS, Step, settled
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


@dataclass(frozen=True)
class TrialRun:
    """What running a config for warm-up + one measurement window gave."""

    status: Literal["ok", "oom_startup", "oom_runtime"]
    signals: Signals | None = None
    offered_rps: float | None = None


class Environment(Protocol):
    def run(self, config: KnobConfig, warmup_s: float, measure_s: float, seed: int) -> TrialRun: ...


@dataclass
class DriveResult:
    state: PolicyState
    trials: list[Trial] = field(default_factory=list)  # RecordTrial actions, in order
    actions: list[Action] = field(default_factory=list)
    rollouts: list[tuple[float, KnobConfig]] = field(default_factory=list)  # (time, config)
    now: float = 0.0

    @property
    def final_config(self) -> KnobConfig:
        """The config the policy ends on: the best known (what Converged applies)."""
        s = self.state
        if s.best is not None:
            return s.trial(s.best).config
        return s.current


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
    on_step: Callable[[PolicyState, Observation, float, list[Action]], None] | None = None,
) -> DriveResult:
    """Run the policy until it converges (or the horizon), executing its actions against ``env``.

    Rollouts take ``rollout_s``; a config that fails to start reports rollout_failed then. Each
    trial's measurement is one ``env.run`` (warm-up + window) with its own seed; a runtime OOM
    reports rollout_failed(oom_runtime) at the end of the window.
    """
    state = initial_state(engine, settings, config)
    result = DriveResult(state=state)
    now = 0.0
    obs: Observation = RolloutReady(config=config)
    running = config
    pending: Observation | None = None  # what the in-flight rollout will report
    pending_at = 0.0
    runs = 0
    stuck = 0
    while now <= horizon_s:
        before = (now, state.step, state.phase, state.next_trial_id)
        state, actions = step(state, obs, now, suggester)
        stuck = (
            stuck + 1 if (now, state.step, state.phase, state.next_trial_id) == before and not actions else 0
        )
        if stuck > MAX_IDLE_STEPS:
            raise RuntimeError(f"policy made no progress at t={now} in {state.phase}/{state.step}")
        if on_step is not None:
            on_step(state, obs, now, actions)
        result.actions.extend(actions)
        for action in actions:
            if isinstance(action, RecordTrial):
                result.trials.append(action.trial)
            elif isinstance(action, RollOut | RollBack):
                target = action.config if isinstance(action, RollOut) else action.to_config
                result.rollouts.append((now, target))
                running = target
                boot = env.run(target, 0.0, 0.0, seed=seed * 1000003 + runs) if _probe_boot(env) else None
                if boot is not None and boot.status == "oom_startup":
                    pending = RolloutFailed(config=target, failure="oom_startup")
                else:
                    pending = RolloutReady(config=target)
                pending_at = now + rollout_s
        if settled(state.phase, state.step):
            break
        # the next observation follows from where the policy is
        st = state.step
        if st in ROLLOUT_STEPS and pending is not None:
            now, obs, pending = max(now, pending_at), pending, None
        elif st == Step.WARMING_UP and state.warm_until is not None:
            now, obs = state.warm_until, Tick()
        elif st == Step.MEASURING and state.measure_until is not None:
            started = state.measure_from if state.measure_from is not None else now
            runs += 1
            run = env.run(
                running, settings.warmup_s, state.measure_until - started, seed=seed * 1000003 + runs
            )
            now = state.measure_until
            if run.status != "ok" or run.signals is None:
                obs = RolloutFailed(config=running, failure=run.status)
            else:
                obs = WindowMeasured(signals=run.signals, offered_rps=run.offered_rps)
        else:
            wait = (
                state.last_rollout_at + settings.min_interval_s if state.last_rollout_at is not None else now
            )
            now, obs = max(now + tick_s, wait), Tick()
    result.state = state
    result.now = now
    return result


def _probe_boot(env: Environment) -> bool:
    """Environments that can tell start-up OOM without a window say so with ``probes_boot``."""
    return bool(getattr(env, "probes_boot", False))

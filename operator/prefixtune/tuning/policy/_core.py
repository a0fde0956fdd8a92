"""The policy's context: the state, the clock, the actions emitted, and the trials queries."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from prefixtune.engines.base import KnobConfig
from prefixtune.engines.knobs import Value
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.actions import (
    Action,
    EmitEvent,
    SetCondition,
)
from prefixtune.tuning.objective import (
    goal,
)
from prefixtune.tuning.optimizer import Suggestion, TrialResult
from prefixtune.tuning.phases import Phase, Step
from prefixtune.tuning.routed import ROUTER_READY_TIMEOUT_S, Routing
from prefixtune.tuning.settings import SpaceOverride, Strategy, TuningSettings
from prefixtune.tuning.space import SearchSpace, build_space
from prefixtune.tuning.state import PolicyState, PriorPoint, Trial

Suggester = Callable[[SearchSpace, list[TrialResult], int, TuningSettings], Suggestion]
RECOMMEND_MARGIN = 1.02  # observe mode: recommend a what-if config only when it beats the current by 2%
LOW_HIT_RATE = 0.05  # field notes: hit rate stably this low -> the cache holds memory for nothing
TOO_LITTLE_TRAFFIC = "too_little_traffic"  # Trial.failure of a trial invalidated for too few requests
SPEC_INVALID = "spec_invalid"  # Trial.failure of a trial aborted because the spec turned invalid
MAX_STARVED_REPEATS = 2  # invalidations of one config for too little traffic before the search stops


@lru_cache(maxsize=64)
def _space(
    engine: str,
    override: SpaceOverride,
    base: KnobConfig,
    widened: tuple[tuple[str, tuple[Value, ...]], ...],
    routing: Routing | None = None,
) -> SearchSpace:
    from prefixtune.engines import get_adapter

    adapter = get_adapter(engine)
    return build_space(adapter.knobs(), base, adapter.normalize, override, dict(widened), routing)


def space_of(state: PolicyState) -> SearchSpace:
    """The epoch's search space: the spec's, with the knobs the baseline widened it by, and the
    router's knobs where the replicas allow (``tuning/routed.py``)."""
    widened = tuple((name, tuple(values)) for name, values in sorted(state.widened.items()))
    router = state.settings.router
    routing = None if router is None else Routing(router, state.replicas)
    return _space(state.engine, state.settings.space, state.spec_config, widened, routing)


class Core:
    def __init__(self, s: PolicyState, now: float, suggester: Suggester) -> None:
        self.s = s
        self.now = now
        self.suggester = suggester
        self.actions: list[Action] = []

    def event(self, type_: str, reason: str, message: str) -> None:
        self.actions.append(EmitEvent("Warning" if type_ == "Warning" else "Normal", reason, message))

    def condition(self, type_: str, status: bool, reason: str, message: str) -> None:
        self.actions.append(SetCondition(type_, "True" if status else "False", reason, message))

    def goto(self, phase: Phase | None = None, step: Step | None = None) -> None:
        if phase is not None:
            self.s.phase = phase
        if step is not None:
            self.s.step = step
        self.s.step_since = self.now

    def active(self) -> Trial | None:
        return None if self.s.active is None else self.s.trial(self.s.active)

    def strategy_of(self, trial: Trial) -> Strategy:
        """How ``trial`` rolled out: its own (a routing change rolls), else the settings'."""
        return self.s.strategy_of(trial)

    def ready_timeout_s(self) -> float:
        """How long the rollout in flight may take to be ready: the router's start for a trial that
        restarts only the router (``tuning/routed.py``), else the engines' budget."""
        trial = self.active()
        engines = self.s.settings.ready_timeout_s
        if trial is not None and trial.router_only and self.s.step in (Step.ROLLING_OUT, Step.WAITING_READY):
            return min(ROUTER_READY_TIMEOUT_S, engines)
        return engines

    def best_trial(self) -> Trial | None:
        return None if self.s.best is None else self.s.trial(self.s.best)

    def measurements(self, config: KnobConfig) -> list[Trial]:
        """This epoch's scored trials of ``config``, oldest first."""
        return [
            t for t in self.epoch_trials() if t.outcome == "ok" and t.value is not None and t.config == config
        ]

    def best_by_mean(self) -> Trial | None:
        """The latest trial of the config with the best mean value over its windows this epoch (a
        config measured again to confirm it counts once, by its mean); the earliest config wins ties."""
        ok = [t for t in self.epoch_trials() if t.outcome == "ok" and t.value is not None]
        by_config: dict[KnobConfig, list[Trial]] = {}
        for t in ok:
            by_config.setdefault(t.config, []).append(t)
        if not by_config:
            return None
        ranked = max(
            by_config.values(),
            key=lambda ts: (sum(t.value or 0.0 for t in ts) / len(ts), -ts[0].id),
        )
        return ranked[-1]

    def best_config(self) -> KnobConfig:
        best = self.best_trial()
        return best.config if best is not None else self.s.current

    def epoch_trials(self) -> list[Trial]:
        return [t for t in self.s.trials if t.epoch == self.s.epoch]

    def explored(self) -> int:
        """Trials spent from the budget (``trials_spent``)."""
        return trials_spent(self.s)

    def rate_limited_until(self) -> float | None:
        last = self.s.last_rollout_at
        if last is None:
            return None
        ready = last + self.s.settings.min_interval_s
        return ready if self.now < ready else None

    def signals_condition(self) -> None:
        """SignalsMissing: which signals the engine release lacks (condition + Event), or cleared."""
        missing = self.s.settings.missing_signals
        if not missing:
            self.condition(
                "SignalsMissing", False, "AllSignals", "the engine exports every signal the tuner reads"
            )
            return
        message = f"this engine release does not export: {', '.join(missing)}" + (
            f"; {self.s.settings.refusal}: not tuning (observing instead)"
            if self.s.settings.refusal
            else "; tuning with what it does export"
        )
        self.condition("SignalsMissing", True, "EngineRelease", message)
        self.event("Warning", "SignalsMissing", message)

    def stable_trial(self) -> Trial | None:
        """The latest ok trial of this epoch measured on the config the stable (baseline) pods run."""
        for t in reversed(self.s.trials):
            if t.epoch == self.s.epoch and t.outcome == "ok" and t.config == self.s.current:
                return t
        return None

    def history(self) -> list[TrialResult]:
        """Finished trials for the optimizer: this epoch as measured, earlier epochs rescaled; the
        bounded prior of older epochs (``history.py``) first."""
        out: list[TrialResult] = []
        base = next((t for t in self.epoch_trials() if t.role == "baseline" and t.value is not None), None)
        for t in self.all_kept():
            if t.outcome in ("infeasible", "not_applied"):
                out.append(TrialResult(t.config, None, t.failure))
            elif t.outcome == "aborted" and t.failure == SPEC_INVALID:
                continue  # stopped by the spec, not by the config: nothing to learn
            elif t.outcome == "aborted":
                out.append(TrialResult(t.config, t.value, "aborted"))
            elif t.outcome == "ok" and t.value is not None:
                if t.epoch == self.s.epoch:
                    out.append(TrialResult(t.config, t.value))
                elif base is not None and base.value is not None:
                    # Warm start: the new baseline re-measured the old best, which rescales old values.
                    old = self.epoch_best_value(t.epoch)
                    if old:
                        out.append(TrialResult(t.config, t.value * base.value / old))
        return out

    def all_kept(self) -> list[Trial | PriorPoint]:
        """The prior (older epochs, summarized) then the trials kept in full, oldest first."""
        return [*self.s.prior, *self.s.trials]

    def kept_trials(self) -> int:
        """Earlier trials the warm start has: those kept in full and the prior's (``history.py``)."""
        return len(self.s.trials) + len(self.s.prior)

    def epoch_best_value(self, epoch: int) -> float | None:
        """The best scored value of an epoch, over its trials kept in full and in the prior."""
        values = [
            t.value for t in self.all_kept() if t.epoch == epoch and t.outcome == "ok" and t.value is not None
        ]
        return max(values) if values else None

    def unconfirmed_best(self) -> Trial | None:
        """The best trial when its config was measured in one window only (and not the baseline's):
        near a capacity limit one lucky arrival sequence can make a config look best, so the policy
        measures it once more before it converges on it (the best is then ranked by its mean)."""
        best = self.best_trial()
        if best is None or best.role == "baseline" or len(self.measurements(best.config)) > 1:
            return None
        return best


def trials_spent(s: PolicyState) -> int:
    """Trials of the current epoch spent from the budget (``maxTrials``): every trial started (the
    one in flight too) but the baseline and those invalidated by a pod restart, a spec change or a
    lack of capacity or aborted by an invalid spec (re-run at no cost), and the windows the
    significance gate asked for (bounded apart: ``gate.MAX_GATE_WINDOWS``); a trial starved of
    traffic counts, so a light workload cannot keep the search going forever."""
    return sum(
        1
        for t in s.trials
        if t.epoch == s.epoch
        and t.role == "trial"
        and not t.gate_window
        and (t.outcome != "invalidated" or t.failure == TOO_LITTLE_TRAFFIC)
        and t.failure != SPEC_INVALID
    )


def per_request(s: Signals, which: str) -> float | None:
    tokens_per_s = s.input_tokens_per_s if which == "input" else s.output_tokens_per_s
    if tokens_per_s is None or not s.requests_per_s:
        return None
    return tokens_per_s / s.requests_per_s


def better(objective: str, a: float, b: float, margin: float) -> bool:
    return goal(objective).beats(a, b, margin)


def all_missing(s: Signals) -> bool:
    return len(s.missing()) == len(s.to_dict()) - 1

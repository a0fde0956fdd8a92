"""Exploration: the next trial from the optimizer, re-measuring an unconfirmed best, convergence."""

from __future__ import annotations

from dataclasses import replace

from prefixtune.engines.base import KnobConfig
from prefixtune.metrics.signals import Signals
from prefixtune.tuning import routed, widening
from prefixtune.tuning.optimizer import seed_from
from prefixtune.tuning.phases import Phase, Step, TuningReason
from prefixtune.tuning.policy import (
    exploration,
    gate,
    rollout,
)
from prefixtune.tuning.policy._core import Core, space_of
from prefixtune.tuning.policy.messages import config_label
from prefixtune.tuning.significance import pays, trial_price
from prefixtune.tuning.state import Trial, clip


def decide(self: Core) -> None:
    """Exploring, nothing in flight: start the next trial, or converge."""
    settings = self.s.settings
    if self.s.metrics_held:
        return
    if self.explored() >= settings.max_trials:
        exploration.converge(
            self, f"budget spent: {self.explored()} trials (maxTrials {settings.max_trials})"
        )
        return
    if self.rate_limited_until() is not None:
        return  # wait; the next tick decides again
    if rollout.retry_after_no_capacity(self):
        return
    unconfirmed = self.unconfirmed_best()
    if unconfirmed is not None and settings.n_initial < self.explored() == settings.max_trials - 1:
        # The last trial of the budget confirms the best rather than exploring once more (not in
        # budgets within the initial design: there every trial is needed to explore).
        rollout.start_trial(
            self, unconfirmed.config, exploration.confirm_reason(self, unconfirmed, "the budget's last trial")
        )
        return
    space = space_of(self.s)
    seed = seed_from(settings.seed_key or self.s.engine, self.s.epoch)
    history = self.history()
    suggestion = self.suggester(space, history, seed, settings)
    stop = suggestion.reason
    if (
        suggestion.config is not None
        and not suggestion.converged
        and suggestion.acquisition is not None
        and sum(1 for h in history if h.value is not None) > settings.n_initial
    ):
        # Priced: the next trial must earn back its restart, cold cache and SLO risk (once the
        # surrogate has seen enough feasible points for its EI to mean something, as convergence).
        price = trial_price(
            settings.restart_cost_s, settings.warmup_s, settings.measure_s, suggestion.p_feasible,
            gate.share(self),
        )  # fmt: skip
        if not pays(suggestion.acquisition, price, settings.payback_s):
            stop = (
                f"the next trial does not pay: expected improvement {suggestion.acquisition:.3%} of the best "
                f"for {settings.payback_s:g}s < its price, {price.text()} ({suggestion.reason})"
            )
            suggestion = replace(suggestion, converged=True)
    if suggestion.config is None or suggestion.converged:
        if unconfirmed is not None:
            rollout.start_trial(self, unconfirmed.config, exploration.confirm_reason(self, unconfirmed, stop))
            return
        exploration.converge(self, stop)
        return
    suggested = space.normalize(suggestion.config)
    running = space.normalize(self.s.current)
    config = space.normalize(routed.one_device(settings.strategy, running, suggested))
    reason = suggestion.reason
    if config != suggested:
        reason += f"; its routing first (the engine knobs {config_label(suggested)} would roll every pod)"
    rollout.start_trial(self, config, reason)


def widen_space(self: Core, signals: Signals, config: KnobConfig) -> None:
    """After the baseline: put the batch-limit knobs its window shows binding into the epoch's space
    (``tuning/widening.py``), recorded in the state so the space stays the same for the epoch."""
    from prefixtune.engines import get_adapter

    settings = self.s.settings
    adapter = get_adapter(self.s.engine)
    found = widening.widen(
        signals, widening.limits_of(config), settings.slo, adapter.knobs(), settings.space,
        smaller_budget=adapter.budget_cuts_itl,
        refused=lambda changes: bool(adapter.cross_check(config.with_(**changes))),
    )  # fmt: skip
    kept = widening.keep_deployed(found.values, config, self.s.spec_config, adapter.knobs())
    self.s.widened = {name: list(values) for name, values in kept.items()}
    if not found.empty:
        searched = ", ".join(f"{name} {'/'.join(map(str, v))}" for name, v in found.values.items())
        self.event("Normal", "SpaceWidened", clip(f"searching {searched}: {'; '.join(found.reasons)}"))


def confirm_reason(self: Core, best: Trial, why: str) -> str:
    return f"confirm the best (trial {best.id}, one window {best.value:.4g}) before converging: {why}"


def converge(self: Core, reason: str, condition_reason: TuningReason = TuningReason.CONVERGED) -> None:
    """Converge on the best, through the significance gate (``gate.py``): the deployed config is
    kept without a significant gain, and the gate may first ask for one more window."""
    decided = gate.decide(self, reason, condition_reason)
    if decided is None:
        return  # a gate window runs (or waits for the rate limit); the search decides after it
    reason, condition_reason = decided
    self.goto(Phase.CONVERGED, Step.IDLE)
    self.s.note = reason
    self.s.note_reason = condition_reason
    best = self.best_trial()
    msg = f"{reason}; best {config_label(self.best_config())}" + (f" value {best.value:.4g}" if best else "")
    self.event("Normal", "Converged", msg)
    rollout.apply_best(self)

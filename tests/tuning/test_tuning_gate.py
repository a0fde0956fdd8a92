"""The significance gate, its noise model and the price of a trial (tuning/significance.py,
tuning/policy/gate.py): rollouts only on significant gains."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from scipy.special import stdtr

from prefixtune.engines import get_adapter
from prefixtune.engines.base import KnobConfig
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.actions import Action, EmitEvent, RollOut
from prefixtune.tuning.optimizer import Suggestion, TrialResult
from prefixtune.tuning.phases import Phase, TuningReason
from prefixtune.tuning.policy import initial_state, step
from prefixtune.tuning.policy.drift_watch import DRIFT_WINDOWS
from prefixtune.tuning.policy.gate import MAX_GATE_WINDOWS
from prefixtune.tuning.policy.messages import tuning_condition
from prefixtune.tuning.settings import Slo, TuningSettings
from prefixtune.tuning.significance import (
    K0,
    POOLED_DOF,
    TAU0,
    Noise,
    Side,
    Window,
    config_noise,
    pays,
    pooled_noise,
    trial_price,
    verdict,
)
from prefixtune.tuning.space import SearchSpace
from prefixtune.tuning.state import Observation, RolloutReady, Tick, WindowMeasured

ENGINE = "vllm"
DEFAULT = get_adapter(ENGINE).default_config()
C1 = DEFAULT.with_(memory_fraction=0.8)
C2 = DEFAULT.with_(memory_fraction=0.7, block_size=32)
# The spec's defaults for the gate (minGain 2%, confidence 0.95); no rate limit, a one-trial design.
SETTINGS = TuningSettings(
    warmup_s=60, measure_s=300, min_requests=100, max_trials=4, min_interval_s=0, n_initial=1,
    seed_key="ns/gate", slo=Slo(2.0, 0.15),
)  # fmt: skip
TODAY = replace(SETTINGS, min_gain=0.0, confidence=0.5)


def signals(goodput: float, requests: float = 2000.0, ttft_p99_s: float = 0.5) -> Signals:
    return Signals(
        window_s=300.0, requests=requests, hit_rate=0.6, ttft_p99_s=ttft_p99_s, itl_p99_s=0.05,
        output_tokens_per_s=goodput * 1.05, input_tokens_per_s=2000.0, requests_per_s=1.0,
        goodput_tokens_per_s=goodput, slo_attainment=0.95,
    )  # fmt: skip


def scripted(configs: Sequence[KnobConfig], acquisition: float | None = None) -> Any:
    """Suggests ``configs`` in order (then converges), each with ``acquisition`` as its EI."""

    def suggester(space: SearchSpace, history: list[TrialResult], seed: int, s: TuningSettings) -> Suggestion:
        tried = {h.config for h in history}
        for c in configs:
            if c not in tried:
                return Suggestion(c, "scripted", acquisition=acquisition)
        return Suggestion(None, "scripted: done", converged=True)

    return suggester


class Run:
    """The policy driven by hand: each rollout becomes ready, warms up and measures the next value
    of its config from ``values`` (a config's list is consumed in order)."""

    def __init__(
        self,
        settings: TuningSettings,
        values: dict[KnobConfig, list[float]],
        suggester: Any,
        ttft_p99_s: dict[KnobConfig, float] | None = None,
    ) -> None:
        self.state = initial_state(ENGINE, settings, DEFAULT)
        self.values = {c: list(v) for c, v in values.items()}
        self.ttft_p99_s = ttft_p99_s or {}  # a config's windows' TTFT p99 (default: within the SLO)
        self.suggester = suggester
        self.actions: list[Action] = []
        self.measured: list[KnobConfig] = []
        self.now = 0.0

    def __call__(self, obs: Observation) -> None:
        self.state, actions = step(self.state, obs, self.now, self.suggester)
        self.actions.extend(actions)

    def run(self, limit: int = 40) -> None:
        self(RolloutReady(config=DEFAULT))
        for _ in range(limit):
            s = self.state
            if s.phase == Phase.CONVERGED and s.step in ("Watching",):
                return
            if s.step in ("RollingOut", "WaitingReady", "RollingBack"):
                self.now += 30
                self(RolloutReady(config=s.target))
            elif s.step == "WarmingUp":
                self.now = s.warm_until or self.now
                self(Tick())
            elif s.step == "Measuring":
                config = s.target or (s.trial(s.active).config if s.active is not None else s.current)
                self.measured.append(config)
                self.now = s.measure_until or self.now
                window = signals(self.values[config].pop(0), ttft_p99_s=self.ttft_p99_s.get(config, 0.5))
                self(WindowMeasured(signals=window, offered_rps=1.0))
            else:
                self.now += 60
                self(Tick())
        raise AssertionError(f"not settled: {self.state.phase}/{self.state.step}")

    def events(self, reason: str) -> list[str]:
        return [a.message for a in self.actions if isinstance(a, EmitEvent) and a.reason == reason]

    def final(self) -> KnobConfig:
        return self.state.current


def test_a_2_percent_gain_with_4_percent_window_noise_keeps_the_deployed_config() -> None:
    # C1 measures +8% (the window that selects it), then +4%: above the margin, not clear of the
    # noise; the gate asks for one more window of each side (the baseline 1000, C1 1000, 1000):
    # +1.3% over C1's windows after the first, below the margin.
    values = {DEFAULT: [1000.0, 1000.0], C1: [1080.0, 1040.0, 1000.0, 1000.0]}
    run = Run(SETTINGS, values, scripted([C1]))
    run.run()
    assert run.final() == DEFAULT
    assert run.state.gate is not None and not run.state.gate.significant
    assert run.measured == [DEFAULT, C1, C1, DEFAULT, C1, C1]
    assert abs(run.state.gate.gain - 0.0133) < 0.001 and run.state.gate.confidence < 0.5
    assert run.state.best is not None and run.state.trial(run.state.best).config == DEFAULT


def test_the_window_that_selected_the_candidate_is_left_out_of_its_gain() -> None:
    # +15% in the window that made C1 the best, +0% in its confirmation: no gain (the mean of both,
    # +7.5%, is the winner's curse), kept out without more windows.
    run = Run(SETTINGS, {DEFAULT: [1000.0], C1: [1150.0, 1000.0]}, scripted([C1]))
    run.run()
    assert run.final() == DEFAULT and run.measured == [DEFAULT, C1, C1]
    assert run.state.gate is not None and run.state.gate.gain == pytest.approx(0.0)


def test_a_deployed_config_breaching_the_slos_in_every_window_counts_the_selecting_window() -> None:
    # The deployed config's TTFT p99 is over the SLO in its window: no benefit of the doubt to keep,
    # so C1's gain is on both its windows; with the deployed config within the SLOs, on the window
    # after the selecting one.
    values = {DEFAULT: [1000.0], C1: [2000.0, 1800.0]}
    breaching = Run(SETTINGS, values, scripted([C1]), ttft_p99_s={DEFAULT: 3.0})
    breaching.run()
    within = Run(SETTINGS, values, scripted([C1]))
    within.run()
    assert breaching.measured == within.measured == [DEFAULT, C1, C1]
    for run, windows in ((breaching, slice(0, 2)), (within, slice(1, 2))):
        dep, *cand = [t.value or 0.0 for t in run.state.trials]
        assert run.state.gate is not None and run.state.gate.significant
        assert run.state.gate.gain == pytest.approx(statistics.fmean(cand[windows]) / dep - 1)


def test_a_candidate_with_only_its_selecting_window_is_never_significant() -> None:
    tight = Noise(0.0001, 100)
    v = verdict([Window(2000.0, 1e9)], [Window(1000.0, 1e9)], 2.0, tight, 0.02, 0.95, confirmed=False)
    assert v.confidence > 0.99 and not v.significant and v.more == Side.CANDIDATE
    assert "the candidate's only window the one that selected it" in v.text()


def test_a_15_percent_gain_with_tight_windows_converges_on_it() -> None:
    run = Run(SETTINGS, {DEFAULT: [1000.0], C1: [1150.0, 1152.0]}, scripted([C1]))
    run.run()
    assert run.final() == C1
    assert run.state.gate is not None and run.state.gate.significant
    assert run.state.gate.confidence >= 0.95
    assert tuning_condition(run.state)[1] == TuningReason.CONVERGED


def test_a_margin_of_0_and_confidence_of_one_half_converges_on_the_best_mean_as_before_the_gate() -> None:
    run = Run(TODAY, {DEFAULT: [1000.0], C1: [1060.0, 980.0]}, scripted([C1]))
    run.run()
    assert run.final() == C1
    assert run.measured == [DEFAULT, C1, C1]  # the confirmation only: no gate window
    assert not any(t.gate_window for t in run.state.trials)


def test_the_converged_event_and_the_tuning_condition_name_no_significant_gain() -> None:
    run = Run(SETTINGS, {DEFAULT: [1000.0, 995.0], C1: [1060.0, 980.0, 1000.0]}, scripted([C1]))
    run.run()
    (converged,) = run.events("Converged")
    assert converged.startswith("no significant gain: the best by mean")
    assert (
        "margin 2.0%" in converged
        and "confidence" in converged
        and "keeping the deployed config" in converged
    )
    _, reason, message = tuning_condition(run.state)
    assert reason == TuningReason.NO_SIGNIFICANT_GAIN and message.startswith("no significant gain")


def test_the_gate_asks_for_at_most_four_windows_outside_the_budget() -> None:
    # C1's windows after the first alternate +7% and +3% against a baseline alternating 1000 and
    # 1010: the gain stays above the margin, never clear of the noise; after four windows the gate
    # decides on what it has.
    values = {DEFAULT: [1000.0, 1010.0, 1000.0], C1: [1100.0, 1070.0, 1030.0, 1070.0, 1030.0]}
    run = Run(SETTINGS, values, scripted([C1]))
    run.run()
    windows = [t for t in run.state.trials if t.gate_window]
    assert len(windows) == MAX_GATE_WINDOWS == 4
    # the side whose mean is the less certain each time: the baseline's one window first
    assert [t.config for t in windows] == [DEFAULT, C1, C1, DEFAULT]
    started = [m for m in run.events("TrialStarted") if "significance gate" in m]
    assert len(started) == 4 and "of the deployed config" in started[0] and "of the candidate" in started[1]
    assert run.state.gate is not None and run.state.gate.gain > 0.02 and not run.state.gate.significant
    spent = [t for t in run.state.trials if t.role == "trial" and not t.gate_window]
    assert len(spent) == 2  # C1 and its confirmation: the gate's windows cost no budget


def test_a_gain_below_the_margin_is_kept_out_without_asking_for_more_windows() -> None:
    run = Run(SETTINGS, {DEFAULT: [1000.0], C1: [1012.0, 1008.0]}, scripted([C1]))
    run.run()
    assert run.final() == DEFAULT and run.measured == [DEFAULT, C1, C1]


def test_exploration_stops_when_the_expected_improvement_does_not_pay_for_a_trial() -> None:
    # After C1 (two feasible points: the surrogate's EI counts), the next trial's 0.1% of the best
    # held for a day is ~86 s of service; a restart and a cold cache cost 90 s. C1 is confirmed.
    run = Run(TODAY, {DEFAULT: [1000.0], C1: [1100.0, 1100.0]}, scripted([C1, C2], acquisition=0.001))
    run.run()
    assert run.measured == [DEFAULT, C1, C1]
    (converged,) = run.events("Converged")
    assert "the next trial does not pay" in converged and "restart 60s, cold cache 30s" in converged


def test_a_trial_whose_expected_improvement_pays_is_started() -> None:
    values = {DEFAULT: [1000.0], C1: [1100.0, 1100.0], C2: [1050.0]}
    run = Run(TODAY, values, scripted([C1, C2], acquisition=0.01))
    run.run()
    assert run.measured[:3] == [DEFAULT, C1, C2]


def test_the_initial_design_is_not_priced() -> None:
    # One feasible point (the baseline): an EI from the surrogate means nothing yet.
    run = Run(TODAY, {DEFAULT: [1000.0], C1: [1100.0, 1100.0]}, scripted([C1], acquisition=0.0))
    run.run()
    assert run.measured[:2] == [DEFAULT, C1]


def test_a_retune_after_drift_warm_starts_from_history_and_passes_the_same_gate() -> None:
    seen: list[int] = []
    first = scripted([C1])
    second = scripted([C2])

    def suggester(space: SearchSpace, history: list[TrialResult], seed: int, s: TuningSettings) -> Suggestion:
        if run.state.epoch == 0:
            return first(space, history, seed, s)  # type: ignore[no-any-return]
        seen.append(len(history))
        return second(space, history, seed, s)  # type: ignore[no-any-return]

    run = Run(
        SETTINGS, {DEFAULT: [1000.0], C1: [1150.0, 1152.0, 1150.0, 1150.0], C2: [1160.0, 1161.0]}, suggester
    )
    run.run()
    assert run.final() == C1
    for _ in range(DRIFT_WINDOWS):  # drift re-tunes once it shows in consecutive windows
        run.now += 600
        run(WindowMeasured(signals=replace(signals(1150.0), hit_rate=0.1), offered_rps=1.0))
    assert run.state.epoch == 1 and run.state.phase == Phase.BASELINE
    run.run()
    assert seen and seen[0] > 1  # the new baseline plus the earlier epoch's trials
    assert run.final() == C1  # +0.9% over the deployed C1: no significant gain
    assert run.state.gate is not None and run.state.gate.epoch == 1 and not run.state.gate.significant


def test_one_window_per_config_leaves_the_prior_noise() -> None:
    assert pooled_noise([[1000.0], [1200.0]]) == Noise()
    assert Noise().variance(400.0) == pytest.approx(1 / 400 + TAU0**2)


def test_repeated_windows_take_over_from_the_prior() -> None:
    tight = pooled_noise([[1000.0, 1001.0, 999.0, 1000.0]] * 5)
    wide = pooled_noise([[900.0, 1100.0]] * 5)
    assert tight.dof == 15 and wide.dof == 5
    prior = Noise().variance(2000.0)
    assert tight.variance(2000.0) < prior / 3 < prior < wide.variance(2000.0)
    assert wide.variance(2000.0) == pytest.approx((K0 * prior + 5 * 0.02) / (K0 + 5))


def test_a_configs_own_repeats_weigh_over_the_pooled_estimate_of_every_config() -> None:
    pooled = Noise(0.30**2, 10)  # a config at its cliff swings by 30% and dominates the pool
    steady = config_noise(Noise(0.02**2, 3), pooled)
    assert steady.dof == 3 + POOLED_DOF
    assert steady.s2 == pytest.approx((3 * 0.02**2 + POOLED_DOF * 0.30**2) / (3 + POOLED_DOF))
    assert config_noise(Noise(), pooled) == Noise(0.30**2, POOLED_DOF)  # no repeats: the pool
    assert config_noise(Noise(), Noise()) == Noise()  # nothing repeated anywhere: the prior


def test_a_paired_candidate_carries_the_comparison_in_its_own_windows() -> None:
    noise = Noise(0.0004, 4)
    cand = [Window(1100.0, 2000.0, paired=True)] * 2
    rolling = [Window(1100.0, 2000.0)] * 2
    deployed = [Window(1000.0, 2000.0)]
    paired = verdict(cand, deployed, 1.1, noise, 0.02, 0.95)
    alone = verdict(rolling, deployed, 1.1, noise, 0.02, 0.95)
    assert paired.se < alone.se and paired.confidence > alone.confidence


def test_the_confidence_is_the_student_t_tail_of_the_gain_over_the_margin() -> None:
    noise = Noise(0.04**2, 3)  # ~4% per window, over 3 degrees of freedom and the prior's K0
    v = verdict([Window(1020.0, 1e9)], [Window(1000.0, 1e9)], 1.02, noise, 0.0, 0.95)
    se = math.sqrt(2 * noise.variance(1e9))
    assert v.confidence == pytest.approx(float(stdtr(K0 + 3, math.log(1.02) / se)))
    assert v.confidence < 0.5 * math.erfc(-math.log(1.02) / se / math.sqrt(2))  # heavier tails
    assert not v.significant and v.more == Side.CANDIDATE  # equal windows: the candidate first
    below = verdict([Window(1010.0, 1e9)], [Window(1000.0, 1e9)], 1.01, noise, 0.02, 0.95)
    assert below.confidence < 0.5 and below.more is None


def test_a_trial_price_counts_the_restart_the_cold_cache_and_the_slo_risk_of_the_pods_it_moves() -> None:
    price = trial_price(60.0, 180.0, 600.0, 0.9, 0.5)
    assert (price.restart_s, price.cold_cache_s, price.slo_risk_s) == pytest.approx((30.0, 45.0, 39.0))
    assert pays(0.002, price, 86400.0) and not pays(0.002, price, 86400.0 / 2)


@pytest.mark.parametrize(
    ("field", "value"), [("min_gain", -0.01), ("min_gain", 1.5), ("confidence", 0.4), ("confidence", 1.0)]
)
def test_gate_settings_out_of_range_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"tuning.{field}"):
        replace(SETTINGS, **{field: value})


def test_gate_windows_are_rolled_out_as_trials() -> None:
    values = {DEFAULT: [1000.0, 1000.0], C1: [1080.0, 1040.0, 1000.0, 1000.0]}
    run = Run(SETTINGS, values, scripted([C1]))
    run.run()
    rollouts = [a for a in run.actions if isinstance(a, RollOut) and a.trial is not None]
    assert [r.config for r in rollouts] == [C1, C1, DEFAULT, C1, C1]
    assert [r.config for r in run.actions if isinstance(r, RollOut) and r.trial is None] == [DEFAULT]


def test_a_gain_over_a_deployed_config_that_served_nothing_keeps_the_state_loadable() -> None:
    # the deployed config scores 0 (it served nothing within the SLOs): the gain is unbounded, and
    # the state the operator writes to the status must read back (JSON has no infinity)
    run = Run(SETTINGS, {DEFAULT: [0.0], C1: [1000.0, 1000.0]}, scripted([C1]))
    run.run()
    assert run.final() == C1 and run.state.gate is not None and run.state.gate.gain is None
    again = type(run.state).model_validate_json(run.state.model_dump_json())
    assert again.gate == run.state.gate

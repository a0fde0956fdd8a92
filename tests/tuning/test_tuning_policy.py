from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from prefixtune.engines import get_adapter
from prefixtune.engines.base import KnobConfig
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.actions import (
    Action,
    EmitEvent,
    Recommend,
    RecordTrial,
    RollBack,
    RollOut,
    SetCondition,
)
from prefixtune.tuning.drive import TrialRun, drive
from prefixtune.tuning.objective import HeadroomLimit, ScoreBasis
from prefixtune.tuning.optimizer import Suggestion, TrialResult
from prefixtune.tuning.phases import Phase, Step
from prefixtune.tuning.policy import drift, initial_state, step
from prefixtune.tuning.policy.messages import tuning_condition
from prefixtune.tuning.policy.spec_change import replicas_only
from prefixtune.tuning.settings import Slo, TuningSettings
from prefixtune.tuning.space import SearchSpace
from prefixtune.tuning.state import (
    MetricsUnavailable,
    Observation,
    PolicyState,
    RolloutApplied,
    RolloutFailed,
    RolloutReady,
    SpecChanged,
    Tick,
    TrialInvalidated,
    WhatIf,
    WindowMeasured,
    parse_observation,
)


def window(
    goodput: float = 1000.0,
    *,
    requests: float = 500.0,
    ttft: float = 2.0,  # at SETTINGS' TTFT SLO: no headroom, the score is the goodput (objective.py)
    itl: float = 0.05,
    hit: float = 0.6,
    window_s: float = 600.0,
    rps: float = 1.0,
    prompt: float = 2000.0,
    output: float = 200.0,
) -> Signals:
    return Signals(
        window_s=window_s,
        requests=requests,
        hit_rate=hit,
        ttft_p50_s=ttft / 3,
        ttft_p99_s=ttft,
        itl_p50_s=itl / 2,
        itl_p99_s=itl,
        output_tokens_per_s=goodput * 1.05,
        input_tokens_per_s=rps * prompt,
        requests_per_s=rps,
        goodput_tokens_per_s=goodput,
        slo_attainment=0.95,
    )


class SyntheticEnv:
    """Goodput peaks at memory 0.85 with caching on, block 16 (or the smallest), policy lpm;
    memory >= ``oom_at`` runs out of memory under load. Noise is multiplicative, seeded."""

    def __init__(self, oom_at: float = 0.93, noise: float = 0.02) -> None:
        self.oom_at = oom_at
        self.noise = noise
        self.calls = 0

    def true_value(self, c: KnobConfig) -> float:
        v = 1000.0 * (1.0 - 4.0 * (c.memory_fraction - 0.85) ** 2)
        v *= 1.3 if c.prefix_caching else 1.0
        v *= 1.08 if c.schedule_policy == "lpm" and c.prefix_caching else 1.0
        v /= 1.0 + c.block_size / 512.0
        return v

    def run(self, config: KnobConfig, warmup_s: float, measure_s: float, seed: int) -> TrialRun:
        self.calls += 1
        if config.memory_fraction >= self.oom_at:
            return TrialRun("oom_runtime")
        rng = random.Random(seed)
        v = self.true_value(config) * (1.0 + rng.gauss(0.0, self.noise))
        return TrialRun("ok", window(v, window_s=measure_s or 600.0), offered_rps=1.0)


ENGINE = "vllm"
DEFAULT = get_adapter(ENGINE).default_config()
# The significance gate off (margin 0, confidence 0.5: the best by mean wins, as before the gate):
# these tests pin the search around it; tests/tuning/test_tuning_gate.py pins the gate.
SETTINGS = TuningSettings(
    warmup_s=60, measure_s=300, min_requests=100, max_trials=3, min_interval_s=600, seed_key="ns/a",
    slo=Slo(2.0, 0.15), min_gain=0.0, confidence=0.5,
)  # fmt: skip


def scripted(configs: Sequence[KnobConfig]) -> Any:
    """A suggester that proposes ``configs`` in order, then converges (fast, no GP)."""

    def suggester(space: SearchSpace, history: list[TrialResult], seed: int, s: TuningSettings) -> Suggestion:
        tried = len([h for h in history]) - 1
        if tried < len(configs):
            return Suggestion(configs[tried], f"scripted #{tried}")
        return Suggestion(None, "scripted: done", converged=True)

    return suggester


C1 = DEFAULT.with_(memory_fraction=0.8)
C2 = DEFAULT.with_(memory_fraction=0.7, block_size=32)
C3 = DEFAULT.with_(prefix_caching=False)
SUGGEST = scripted([C1, C2, C3])


class Run:
    def __init__(self, settings: TuningSettings = SETTINGS, suggester: Any = SUGGEST) -> None:
        self.state = initial_state(ENGINE, settings, DEFAULT)
        self.suggester = suggester
        self.actions: list[Action] = []

    def __call__(self, obs: Observation, now: float) -> list[Action]:
        self.state, actions = step(self.state, obs, now, self.suggester)
        self.actions.extend(actions)
        return actions

    def tick(self, now: float) -> list[Action]:
        return self(Tick(), now)

    def win(self, now: float, partial: bool = False, **kw: Any) -> list[Action]:
        return self(WindowMeasured(signals=window(**kw), partial=partial, offered_rps=1.0), now)

    def baseline(self, value: float = 1000.0) -> float:
        """Pending -> Baseline (warm-up, window) -> Exploring; returns the time after."""
        self(RolloutReady(config=DEFAULT), 0.0)
        assert (self.state.phase, self.state.step) == ("Baseline", "WarmingUp")
        self.tick(60.0)
        assert self.state.step == "Measuring"
        self.win(360.0, goodput=value)
        return 360.0


def of(actions: Sequence[Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def test_phase_transitions_through_a_trial_to_converged() -> None:
    r = Run()
    now = r.baseline()
    assert r.state.phase == "Exploring"
    first = of(r.actions, RollOut)
    assert len(first) == 1 and first[0].config == C1 and first[0].trial == 1
    assert r.state.step == "RollingOut"
    r(RolloutApplied(), now + 5)
    assert r.state.step == "WaitingReady"
    r(RolloutReady(config=C1), now + 30)
    assert r.state.step == "WarmingUp" and r.state.current == C1
    r.tick(now + 90)
    assert r.state.step == "Measuring"
    r.win(now + 200)  # a full window before the measurement period ends: keep measuring
    assert r.state.step == "Measuring"
    acts = r.win(now + 390, goodput=1200.0)
    recorded = of(acts, RecordTrial)
    assert [t.trial.outcome for t in recorded] == ["ok"] and recorded[0].trial.value == 1200.0
    assert r.state.best == 1
    # next trial waits for the rate limit (600 s after the rollout at 360)
    assert r.state.step == "Idle" and not of(acts, RollOut)
    assert not of(r.tick(900.0), RollOut)
    acts = r.tick(960.0)
    assert of(acts, RollOut)[0].config == C2
    # C2 and C3, then the budget (3) is spent
    t = 960.0
    for cfg in (C2, C3):
        if cfg != C2:
            t += 600
            r.tick(t)
        r(RolloutReady(config=cfg), t + 30)
        r.tick(t + 90)
        r.win(t + 390, goodput=900.0)
    assert r.state.phase == "Converged" and "budget spent" in r.state.note
    t += 600
    acts = r.tick(t + 390)
    apply = of(acts, RollOut)
    assert apply and apply[0].config == C1 and apply[0].trial is None
    r(RolloutReady(config=C1), t + 420)
    assert (r.state.phase, r.state.step) == ("Converged", "Watching") and r.state.current == C1
    ids = [a.trial.id for a in of(r.actions, RecordTrial)]
    assert ids == sorted(set(ids)) == [0, 1, 2, 3]


def test_a_lucky_window_is_demoted_by_its_confirmation() -> None:
    # C1 looks best in one window (1200), C2 measures 1000; the confirmation of C1 measures 700: its
    # mean (950) falls under C2's, so the policy converges on C2 and rolls it out.
    r = Run(settings=replace(SETTINGS, min_interval_s=0, n_initial=1))
    t = r.baseline(800.0)  # decides at once (no rate limit): C1 is rolled out
    for cfg, goodput in ((C1, 1200.0), (C2, 1000.0), (C1, 700.0)):
        assert of(r.actions, RollOut)[-1].config == cfg
        r(RolloutReady(config=cfg), t + 30)
        r.tick(t + 90)
        r.win(t + 390, goodput=goodput)
        t += 400
    rollouts = of(r.actions, RollOut)
    assert "confirm the best (trial 1" in rollouts[2].reason
    assert r.state.phase == "Converged" and r.state.best is not None
    assert r.state.trial(r.state.best).config == C2
    assert rollouts[-1].config == C2 and rollouts[-1].trial is None  # apply the best
    scored = [a for a in of(r.actions, EmitEvent) if a.reason == "TrialScored"]
    assert "best is trial 2" in scored[-1].message


def test_rollouts_are_rate_limited() -> None:
    settings = replace(SETTINGS, max_trials=10, min_interval_s=1000)
    r = Run(settings, scripted([C1, C2, C3]))
    r.baseline()
    times = [360.0]
    r(RolloutReady(config=C1), 400)
    r.tick(460)
    r.win(760)
    for t in range(790, 1400, 30):
        if of(r.tick(float(t)), RollOut):
            times.append(float(t))
    assert times[1] >= times[0] + 1000


def test_early_abort_rolls_back_to_best() -> None:
    r = Run()
    now = r.baseline()
    r(RolloutReady(config=C1), now + 30)
    r.tick(now + 90)
    few = r.win(now + 120, partial=True, ttft=7.0, requests=10)  # too few requests to judge
    assert not of(few, RollBack)
    acts = r.win(now + 150, partial=True, ttft=7.0, requests=60)
    back = of(acts, RollBack)
    assert back and back[0].to_config == DEFAULT
    assert [t.trial.outcome for t in of(acts, RecordTrial)] == ["aborted"]
    assert any(e.type == "Warning" and e.reason == "TrialAborted" for e in of(acts, EmitEvent))
    assert r.state.step == "RollingBack"
    r(RolloutReady(config=DEFAULT), now + 200)
    assert r.state.step == "Idle" and r.state.current == DEFAULT


def test_infeasible_rollout_is_recorded_and_rolled_back() -> None:
    r = Run()
    now = r.baseline()
    acts = r(RolloutFailed(config=C1, failure="oom_startup"), now + 60)
    rec = of(acts, RecordTrial)
    assert rec[0].trial.outcome == "infeasible" and rec[0].trial.failure == "oom_startup"
    assert of(acts, RollBack)[0].to_config == DEFAULT
    # a runtime OOM during measurement is infeasible too
    r(RolloutReady(config=DEFAULT), now + 90)
    r.tick(now + 1000)
    r(RolloutReady(config=C2), now + 1030)
    r.tick(now + 1090)
    acts = r(RolloutFailed(config=C2, failure="oom_runtime"), now + 1200)
    assert of(acts, RecordTrial)[0].trial.outcome == "infeasible"


def test_ready_timeout_is_infeasible_and_failed_rollback_is_failed() -> None:
    r = Run()
    now = r.baseline()
    acts = r.tick(now + SETTINGS.ready_timeout_s + 1)
    assert of(acts, RecordTrial)[0].trial.failure == "timeout"
    acts = r(RolloutFailed(config=DEFAULT, failure="crash"), now + 700)
    assert r.state.phase == "Failed"
    assert any(c.type == "Degraded" and c.status == "True" for c in of(acts, SetCondition))
    assert r.tick(now + 5000) == []


def test_metrics_unavailable_holds_rollouts() -> None:
    r = Run()
    r(RolloutReady(config=DEFAULT), 0.0)
    r.tick(60)
    acts = r(MetricsUnavailable(reason="prometheus unreachable"), 100)
    assert any(c.type == "MetricsUnavailable" and c.status == "True" for c in of(acts, SetCondition))
    for t in (200.0, 400.0, 2000.0):
        assert not of(r.tick(t), RollOut)
    # metrics return: the condition clears and the measurement restarts (not scored on a gap)
    acts = r.win(2100)
    assert any(c.type == "MetricsUnavailable" and c.status == "False" for c in of(acts, SetCondition))
    assert not of(acts, RecordTrial) and r.state.step == "Measuring"
    acts = r.win(2100 + 300)
    assert of(acts, RecordTrial) and of(acts, RollOut)


def test_window_missing_signals_is_never_scored() -> None:
    r = Run()
    r(RolloutReady(config=DEFAULT), 0.0)
    r.tick(60)
    sig = replace(window(), goodput_tokens_per_s=None, slo_attainment=None)
    acts = r(WindowMeasured(signals=sig), 360)
    assert not of(acts, RecordTrial) and not of(acts, RollOut)
    assert r.state.metrics_held


def test_too_few_requests_extends_then_invalidates() -> None:
    r = Run()
    now = r.baseline()
    r(RolloutReady(config=C1), now + 30)
    r.tick(now + 90)
    t = now + 390
    for _ in range(SETTINGS.max_extensions):
        acts = r.win(t, requests=10)
        assert any(e.reason == "WindowExtended" for e in of(acts, EmitEvent))
        t += 300
    acts = r.win(t, requests=10)
    assert of(acts, RecordTrial)[0].trial.outcome == "invalidated"


def test_pod_deleted_mid_measurement_remeasures() -> None:
    r = Run()
    now = r.baseline()
    r(RolloutReady(config=C1), now + 30)
    r.tick(now + 90)
    acts = r(TrialInvalidated(reason="pod deleted"), now + 150)
    assert not of(acts, RecordTrial) and r.state.step == "WaitingReady"
    r(RolloutReady(config=C1), now + 200)
    r.tick(now + 260)
    acts = r.win(now + 560, goodput=1100.0)
    rec = of(acts, RecordTrial)
    assert len(rec) == 1 and rec[0].trial.id == 1 and rec[0].trial.invalidations == 1


def test_observe_mode_recommends_and_never_rolls_out() -> None:
    r = Run(replace(SETTINGS, mode="observe"))
    r.tick(0.0)
    assert r.state.phase == "Observing"
    better = WhatIf(config=C1, signals=window(goodput=1500.0))
    worse = WhatIf(config=C2, signals=window(goodput=500.0))
    acts = r(WindowMeasured(signals=window(goodput=1000.0), what_if=[worse, better]), 600)
    rec = of(acts, Recommend)
    assert rec and rec[0].config == C1 and "what-if" in rec[0].reason
    # the same recommendation is not repeated; a cache holding memory for nothing is flagged
    assert not of(r(WindowMeasured(signals=window(), what_if=[better]), 1200), Recommend)
    r2 = Run(replace(SETTINGS, mode="observe"))
    acts = r2(WindowMeasured(signals=window(hit=0.01)), 600)
    assert of(acts, Recommend)[0].config.prefix_caching is False
    for t in range(1800, 20000, 600):
        r.tick(float(t))
        r.win(float(t))
    assert not of(r.actions, RollOut) and not of(r.actions, RollBack)


def test_observe_mode_recommends_only_a_what_if_that_beats_the_running_config_by_min_gain() -> None:
    slight = WhatIf(config=C1, signals=window(goodput=1040.0))  # 4% better
    for min_gain, recommended in ((0.02, True), (0.05, False)):
        r = Run(replace(SETTINGS, mode="observe", min_gain=min_gain))
        acts = r(WindowMeasured(signals=window(goodput=1000.0), what_if=[slight]), 600)
        assert bool(of(acts, Recommend)) is recommended, min_gain


def test_mode_off_pauses_and_spec_change_resumes() -> None:
    r = Run()
    now = r.baseline()
    r(RolloutReady(config=C1), now + 30)
    acts = r(SpecChanged(settings=replace(SETTINGS, mode="off"), generation=2), now + 40)
    assert r.state.phase == "Paused" and [a.to_config for a in of(acts, RollBack)] == [DEFAULT]
    assert of(acts, RecordTrial)[0].trial.outcome == "invalidated"
    assert not of(r.tick(now + 5000), RollOut)
    r(SpecChanged(settings=SETTINGS, generation=3), now + 6000)
    assert r.state.phase == "Baseline" and r.state.epoch == 1


def test_mode_off_runs_the_spec_config_not_the_tuned_one() -> None:
    """Issue 18: a converged resource turned off kept its tuned config while the spec said another."""
    r = Run(replace(SETTINGS, max_trials=1))
    now = r.baseline()
    r(RolloutApplied(), now + 5)
    r(RolloutReady(config=C1), now + 30)
    r.tick(now + 90)
    r.win(now + 390, goodput=1200.0)  # C1 beats the spec's config: the budget is spent on it
    assert r.state.phase == "Converged" and r.state.current == C1 and r.state.spec_config == DEFAULT
    acts = r(SpecChanged(settings=replace(SETTINGS, max_trials=1, mode="off"), generation=2), now + 500)
    assert r.state.phase == "Paused" and [a.to_config for a in of(acts, RollBack)] == [DEFAULT]
    r(RolloutReady(config=DEFAULT), now + 560)
    assert (r.state.phase, r.state.current) == ("Paused", DEFAULT)
    assert not of(r.tick(now + 5000), RollOut) and not of(r.tick(now + 5001), RollBack)


def test_drift_retunes_with_warm_start() -> None:
    env = SyntheticEnv()
    settings = replace(SETTINGS, max_trials=4, min_interval_s=0, measure_s=120, warmup_s=30)
    result = drive(ENGINE, settings, DEFAULT, env, suggester=scripted([C1, C2]))
    s = result.state
    assert (s.phase, s.step) == ("Converged", "Watching") and s.reference is not None
    seen: list[list[TrialResult]] = []

    def spy(space: SearchSpace, history: list[TrialResult], seed: int, st: TuningSettings) -> Suggestion:
        seen.append(history)
        return Suggestion(None, "stop", converged=True)

    same = replace(s.reference, window_s=120.0)
    s2, acts = step(s, WindowMeasured(signals=same), result.now + 600, spy)
    assert s2.epoch == 0 and not of(acts, EmitEvent)
    moved = replace(s.reference, hit_rate=(s.reference.hit_rate or 0) - 0.4)
    s3, acts = step(s, WindowMeasured(signals=moved), result.now + 600, spy)
    assert s3.epoch == 0 and not of(acts, EmitEvent)  # one window: a burst may move it
    s3, acts = step(s3, WindowMeasured(signals=moved), result.now + 1200, spy)
    assert any(e.reason == "DriftDetected" for e in of(acts, EmitEvent))
    assert (s3.phase, s3.step, s3.epoch) == ("Baseline", "Measuring", 1)
    step(s3, WindowMeasured(signals=moved), result.now + 1200 + 120, spy)
    assert seen, "the optimizer was consulted after the new baseline"
    old_ok = [t for t in s.trials if t.outcome == "ok"]
    assert len(seen[-1]) == len(old_ok) + 1  # every earlier trial is kept as warm start


def test_drift_detector() -> None:
    ref = window(hit=0.6, rps=1.0, prompt=2000)
    assert drift(ref, window(hit=0.65, rps=1.1, prompt=2100), 0.25) == []
    moved = drift(ref, window(hit=0.6, rps=1.0, prompt=3000), 0.25)
    assert moved and "mean prompt tokens" in moved[0]
    assert drift(ref, window(hit=0.2), 0.25)[0].startswith("hit rate")


def test_a_load_level_that_moved_alone_is_not_drift() -> None:
    ref = window(goodput=1000.0, requests=600.0, rps=1.0)
    assert drift(ref, window(goodput=3000.0, requests=1800.0, rps=3.0), 0.25) == []


def test_a_drifted_window_between_steady_ones_does_not_retune() -> None:
    env = SyntheticEnv()
    settings = replace(SETTINGS, max_trials=4, min_interval_s=0, measure_s=120, warmup_s=30)
    s = drive(ENGINE, settings, DEFAULT, env, suggester=scripted([C1, C2])).state
    assert s.reference is not None
    now = s.step_since + 600
    moved = replace(s.reference, hit_rate=(s.reference.hit_rate or 0) - 0.4)
    for signals in (moved, replace(s.reference, window_s=120.0), moved):
        s, acts = step(s, WindowMeasured(signals=signals), now)
        now += 120
        assert s.epoch == 0 and not any(e.reason == "DriftDetected" for e in of(acts, EmitEvent))


def _json_round_trip_run(
    settings: TuningSettings,
) -> tuple[list[list[dict[str, Any]]], list[tuple[Observation, float]]]:
    env = SyntheticEnv(oom_at=0.9)
    record: list[tuple[PolicyState, Observation, float, list[Action]]] = []
    drive(ENGINE, settings, DEFAULT, env, on_step=lambda s, o, n, a: record.append((s, o, n, a)))
    return [[a.to_dict() for a in acts] for _, _, _, acts in record], [(o, n) for _, o, n, _ in record]


def test_restart_mid_trial_resumes_identically() -> None:
    settings = replace(SETTINGS, max_trials=4, n_initial=2, min_interval_s=0, measure_s=120, warmup_s=30)
    expected, script = _json_round_trip_run(settings)
    assert len(script) > 10
    state = initial_state(ENGINE, settings, DEFAULT)
    for (obs, now), want in zip(script, expected, strict=True):
        state = PolicyState.from_json(state.to_json())  # the operator restarted before this event
        obs = parse_observation(obs.model_dump_json())
        state, actions = step(state, obs, now)
        assert [a.to_dict() for a in actions] == want
    ids = [a["trial"]["index"] for acts in expected for a in acts if a["kind"] == "RecordTrial"]
    assert ids == sorted(set(ids)) and len(ids) >= 4


def test_infeasible_trials_are_learned_through_the_policy() -> None:
    env = SyntheticEnv(oom_at=0.85)
    settings = replace(SETTINGS, max_trials=8, n_initial=3, min_interval_s=0, measure_s=120, warmup_s=30)
    result = drive(ENGINE, settings, DEFAULT.with_(memory_fraction=0.8), env)
    bad = [t for t in result.trials if t.outcome == "infeasible"]
    assert all(t.failure == "oom_runtime" for t in bad)
    floor = min(t.config.memory_fraction for t in bad) if bad else 1.0
    same_knobs_above = [
        (b.id, t.id)
        for b in bad
        for t in result.trials
        if t.id > b.id
        and (t.config.block_size, t.config.prefix_caching) == (b.config.block_size, b.config.prefix_caching)
        and t.config.memory_fraction >= b.config.memory_fraction
    ]
    assert not same_knobs_above and floor >= 0.85


def test_too_little_traffic_for_a_baseline_waits_then_tunes() -> None:
    r = Run()
    r(RolloutReady(config=DEFAULT), 0.0)
    r.tick(60)
    t = 360.0
    for _ in range(SETTINGS.max_extensions + 1):
        r.win(t, requests=5)
        t += 300
    assert (r.state.phase, r.state.step) == ("Converged", "Watching") and not of(r.actions, RollOut)
    r.win(t + 300, requests=5)
    assert r.state.phase == "Converged"
    r.win(t + 600)
    assert (r.state.phase, r.state.step) == ("Baseline", "Measuring")


def test_canary_trial_is_scored_against_the_stable_pods() -> None:
    r = Run(replace(SETTINGS, strategy="canary"))
    now = r.baseline(value=1000.0)
    assert of(r.actions, RollOut)[0].strategy == "canary"
    r(RolloutReady(config=C1), now + 30)
    assert r.state.current == DEFAULT  # the stable pods keep the baseline config
    r.tick(now + 90)
    obs = WindowMeasured(
        signals=window(goodput=600.0, requests=250.0),  # one canary pod, its share of the requests
        baseline_signals=window(goodput=1000.0),  # two stable pods, same window (load moved)
        canary_pods=1,
        baseline_pods=2,
    )
    acts = r(obs, now + 390)
    trial = of(acts, RecordTrial)[0].trial
    assert trial.value == 1000.0 * (600.0 / 500.0)  # paired ratio x the stable config's value
    assert r.state.best == trial.id


def test_canary_value_is_anchored_to_the_config_the_stable_pods_run() -> None:
    r = Run(replace(SETTINGS, strategy="canary"))
    now = r.baseline(value=1000.0)
    for config, canary_goodput, at in ((C1, 600.0, now), (C2, 450.0, now + 1000)):
        r.tick(at)  # past the rollout rate limit: the next trial is rolled out
        assert of(r.actions, RollOut)[-1].config == config
        r(RolloutReady(config=config), at + 30)
        r.tick(at + 90)
        obs = WindowMeasured(
            signals=window(goodput=canary_goodput, requests=250.0),  # a pod's share of the requests
            baseline_signals=window(goodput=1000.0),
            canary_pods=1,
            baseline_pods=2,
        )
        acts = r(obs, at + 390)
        trial = of(acts, RecordTrial)[0].trial
        current = r.state.current
        stable = [t for t in r.state.trials if t.outcome == "ok" and t.config == current and t.id != trial.id]
        anchor = stable[-1].value
        assert anchor is not None
        # the ratio compares the canary with the stable pods, so it scales *their* config's value
        assert trial.value == anchor * (canary_goodput / 500.0)


def test_a_canary_trial_records_the_baseline_it_was_paired_with_and_the_ratio() -> None:
    r = Run(replace(SETTINGS, strategy="canary"))
    now = r.baseline(value=1000.0)
    baseline = r.state.trial(0)
    assert baseline.terms is not None and baseline.terms.basis == ScoreBasis.MEASURED  # no reference yet
    assert baseline.value == baseline.score == 1000.0
    r(RolloutReady(config=C1), now + 30)
    r.tick(now + 90)
    obs = WindowMeasured(
        signals=window(goodput=720.0, requests=300.0),  # sent 300 requests: more than its share
        baseline_signals=window(goodput=900.0, requests=500.0),  # two stable pods, same window
        canary_pods=1,
        baseline_pods=2,
    )
    acts = r(obs, now + 390)
    trial = of(acts, RecordTrial)[0].trial
    terms = trial.terms
    assert terms is not None and terms.basis == ScoreBasis.PAIRED
    (scored,) = [e for e in of(acts, EmitEvent) if e.reason == "TrialScored"]
    assert "value 1333 (paired-with-baseline: trial 0's 1000 × same-window ratio 1.333)" in scored.message
    assert (terms.anchor_trial, terms.anchor, terms.baseline_window) == (0, 1000.0, 900.0)
    assert (terms.canary_pods, terms.baseline_pods) == (1, 2)
    assert terms.split == pytest.approx(300.0 / 250.0)
    assert trial.score == 720.0  # the canary pod's own window
    # everything a reader needs to recompute the value from the terms
    assert terms.ratio == pytest.approx((720.0 / 1) / (900.0 / 2) / (300.0 / 250.0))
    assert trial.value == pytest.approx(terms.anchor * terms.ratio)
    assert trial.to_status()["terms"]["basis"] == "paired-with-baseline"


def test_a_rolling_trial_records_its_load_factor() -> None:
    r = Run()  # rolling: every pod runs the trial, scored against the baseline's arrival rate
    now = r.baseline(value=1000.0)
    assert r.state.reference_rps == 1.0
    r(RolloutReady(config=C1), now + 30)
    r.tick(now + 90)
    obs = WindowMeasured(signals=window(goodput=1250.0), offered_rps=1.25)  # 25% more load
    acts = r(obs, now + 390)
    trial = of(acts, RecordTrial)[0].trial
    terms = trial.terms
    assert terms is not None and terms.basis == ScoreBasis.LOAD_NORMALIZED
    (scored,) = [e for e in of(acts, EmitEvent) if e.reason == "TrialScored"]
    assert (
        "value 1000 (load-normalized: × load factor 0.8 (reference 1 / offered 1.25 req/s))" in scored.message
    )
    assert (terms.offered_rps, terms.reference_rps, terms.load_factor) == (1.25, 1.0, 0.8)
    assert trial.score == 1250.0 and trial.value == pytest.approx(1250.0 * 0.8)
    assert terms.anchor is None and terms.ratio is None


def test_a_single_pod_window_without_an_arrival_rate_is_scored_as_measured() -> None:
    r = Run()
    now = r.baseline(value=1000.0)
    r(RolloutReady(config=C1), now + 30)
    r.tick(now + 90)
    trial = of(r(WindowMeasured(signals=window(goodput=1100.0)), now + 390), RecordTrial)[0].trial
    assert trial.terms is not None and trial.terms.basis == ScoreBasis.MEASURED
    assert trial.value == trial.score == 1100.0
    assert trial.terms.model_dump(exclude_none=True) == {
        "basis": ScoreBasis.MEASURED,
        "measured": 1100.0,
        "headroom": 1.0,
        "headroom_limit": HeadroomLimit.TTFT,
    }


def test_below_capacity_the_headroom_decides_and_the_event_says_so() -> None:
    # the same goodput (the offered load) in both windows; the trial's TTFT p99 is a fifth of the
    # baseline's: it would carry more load within the SLOs, and is the new best by its headroom
    r = Run()
    r(RolloutReady(config=DEFAULT), 0.0)
    r.tick(60.0)
    r.win(360.0, goodput=500.0, ttft=1.0, itl=0.01)
    r(RolloutReady(config=C1), 390.0)
    r.tick(450.0)
    acts = r.win(750.0, goodput=500.0, ttft=0.2, itl=0.01)
    trial = of(acts, RecordTrial)[0].trial
    assert trial.terms is not None and trial.terms.headroom == pytest.approx(2.0 / 0.2)
    assert trial.terms.headroom_limit == HeadroomLimit.TTFT and trial.terms.measured == 500.0
    assert r.state.best == trial.id and trial.value == pytest.approx(5000.0)
    (scored,) = [e for e in of(acts, EmitEvent) if e.reason == "TrialScored"]
    assert "new best over trial 0, by headroom (ttft)" in scored.message
    assert "goodput 500 × headroom 10 (ttft) = 5000 (goodput_tokens_per_s" in scored.message


def test_a_canary_without_a_measured_stable_config_keeps_its_own_score() -> None:
    r = Run(replace(SETTINGS, strategy="canary"))
    now = r.baseline(value=1000.0)
    r(RolloutReady(config=C1), now + 30)
    r.tick(now + 90)
    r.state.trials[0].value = None  # the stable config has no value to anchor to
    obs = WindowMeasured(signals=window(goodput=600.0, requests=250.0), baseline_signals=window())
    trial = of(r(obs, now + 390), RecordTrial)[0].trial
    assert trial.terms is not None and trial.terms.basis == ScoreBasis.MEASURED
    assert trial.value == trial.score == 600.0


def _spec_change(r: Run, now: float, key: str, generation: int) -> list[Action]:
    obs = SpecChanged(settings=SETTINGS, config=DEFAULT, generation=generation, deployment_key=key)
    return r(obs, now)


def test_deployment_change_starts_a_new_epoch_with_a_fresh_baseline() -> None:
    r = Run()
    r.state = initial_state(ENGINE, SETTINGS, DEFAULT, deployment_key="gpus=1")
    now = r.baseline()
    r(RolloutReady(config=C1), now + 30)
    r.tick(now + 90)
    assert (r.state.phase, r.state.step, r.state.epoch) == ("Exploring", "Measuring", 0)
    # same key (e.g. only a tuning timing setting moved): no new epoch, no baseline (the trial in
    # flight is re-run, as for any spec change)
    acts = _spec_change(r, now + 100, "gpus=1", 2)
    assert (r.state.phase, r.state.epoch) == ("Exploring", 0)
    assert not [e for e in of(acts, EmitEvent) if e.reason == "DeploymentChanged"]
    assert [t.role for t in r.state.trials] == ["baseline", "trial"]
    assert of(r.tick(now + 700), RollOut)[0].config == C1  # after the rate limit
    r(RolloutReady(config=C1), now + 730)
    assert r.state.step == "WarmingUp"
    # the GPUs (or the model) changed: the trial in flight is dropped and a new epoch measures a baseline
    acts = _spec_change(r, now + 750, "gpus=2", 3)
    assert (r.state.phase, r.state.epoch, r.state.deployment_key) == ("Baseline", 1, "gpus=2")
    assert r.state.step == "WarmingUp"  # the pods are new: warm them before measuring
    assert [t.trial.outcome for t in of(acts, RecordTrial)] == ["invalidated"]
    why = [e for e in of(acts, EmitEvent) if e.reason == "DeploymentChanged"]
    assert len(why) == 1 and "epoch 1" in why[0].message and "fresh baseline" in why[0].message
    baseline = r.state.trial(r.state.active) if r.state.active is not None else None
    assert baseline is not None and baseline.role == "baseline" and baseline.epoch == 1
    assert tuning_condition(r.state)[:2] == (True, "Baseline")
    # a later model change restarts again, from wherever the search is
    r.tick(now + 810)
    r.win(now + 1110)
    assert r.state.phase == "Exploring" and r.state.epoch == 1
    acts = _spec_change(r, now + 1120, "model=other", 4)
    assert (r.state.phase, r.state.epoch) == ("Baseline", 2) and of(acts, EmitEvent)


def test_a_spec_change_without_a_deployment_key_keeps_the_stored_one() -> None:
    r = Run()
    r.state = initial_state(ENGINE, SETTINGS, DEFAULT, deployment_key="k1")
    now = r.baseline()
    assert r.state.deployment_key == "k1" and r.state.phase == "Exploring"
    # an observation without a key (caller does not know it) keeps the stored one
    acts = _spec_change(r, now + 20, "", 3)
    assert not [e for e in of(acts, EmitEvent) if e.reason == "DeploymentChanged"]
    assert r.state.deployment_key == "k1" and r.state.epoch == 0
    back = PolicyState.from_json(r.state.to_json())
    assert back.deployment_key == "k1" and back == r.state
    obs = SpecChanged(deployment_key="k2")
    assert parse_observation(obs.model_dump_json()).deployment_key == "k2"


def test_trials_starved_of_traffic_end_the_search() -> None:
    """Every trial window has too few requests: the same config is not re-measured forever."""
    settings = replace(SETTINGS, max_trials=5, min_interval_s=0)
    r = Run(settings)  # the scripted suggester keeps proposing C1: invalidated trials teach it nothing
    t = r.baseline()
    decisions = 0
    while r.state.phase == "Exploring" and decisions < 50:
        decisions += 1
        assert r.state.step == "RollingOut"
        target = r.state.target
        r(RolloutReady(config=target), t + 30)
        r.tick(t + 90)
        t += 390
        for _ in range(settings.max_extensions + 1):
            r.win(t, requests=5)
            t += 300
    assert r.state.phase == "Converged" and "too little traffic" in r.state.note
    assert decisions == 2  # MAX_STARVED_REPEATS invalidations of C1, well within maxTrials
    trials = [a.trial for a in of(r.actions, RecordTrial) if a.trial.role == "trial"]
    assert [tr.outcome for tr in trials] == ["invalidated", "invalidated"]
    assert all(tr.failure == "too_little_traffic" for tr in trials)
    assert tuning_condition(r.state)[:2] == (False, "InsufficientTraffic")
    # the best measured config (the baseline) is put back, then the policy watches
    apply = of(r.actions, RollOut)[-1]
    assert apply.config == DEFAULT and apply.trial is None


def test_starved_trials_count_toward_the_budget() -> None:
    """A suggester that proposes a new config every time: the budget still ends the search."""
    configs = [DEFAULT.with_(memory_fraction=0.5 + 0.05 * i) for i in range(20)]
    calls: list[int] = []

    def fresh(space: SearchSpace, history: list[TrialResult], seed: int, s: TuningSettings) -> Suggestion:
        calls.append(1)
        return Suggestion(configs[len(calls) - 1], "fresh")

    settings = replace(SETTINGS, max_trials=4, min_interval_s=0)
    r = Run(settings, fresh)
    t = r.baseline()
    decisions = 0
    while r.state.phase == "Exploring" and decisions < 50:
        decisions += 1
        r(RolloutReady(config=r.state.target), t + 30)
        r.tick(t + 90)
        t += 390
        for _ in range(settings.max_extensions + 1):
            r.win(t, requests=5)
            t += 300
    assert r.state.phase == "Converged" and "budget spent" in r.state.note
    assert decisions == settings.max_trials and len(calls) == settings.max_trials


def test_no_capacity_is_never_infeasible_and_the_same_config_is_retried() -> None:
    from prefixtune.tuning.policy.rollout import NO_CAPACITY_BACKOFF_S, no_capacity_backoff_s
    from prefixtune.tuning.state import RolloutNoCapacity

    r = Run(settings=replace(SETTINGS, min_interval_s=0))
    now = r.baseline()
    assert of(r.actions, RollOut)[-1].config == C1
    why = "pod a-canary-x: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    acts = r(RolloutNoCapacity(config=C1, reason=why), now + 5)
    rec = of(acts, RecordTrial)
    assert [(t.trial.outcome, t.trial.failure) for t in rec] == [("invalidated", "no_capacity")]
    assert of(acts, RollBack)[0].to_config == DEFAULT  # nothing left half-done
    assert any(e.type == "Warning" and e.reason == "NoCapacity" for e in of(acts, EmitEvent))
    assert tuning_condition(r.state)[:2] == (False, "NoCapacity")
    wait = r.state.capacity_wait
    assert wait is not None and wait.config == C1 and wait.retry_at == now + 5 + NO_CAPACITY_BACKOFF_S
    r(RolloutReady(config=DEFAULT), now + 10)
    assert r.state.step == "Idle"
    # Neither learned (not in the optimizer's history) nor counted in the budget.
    from prefixtune.tuning.policy import _core

    core = _core.Core(r.state, now + 10, SUGGEST)
    assert core.explored() == 0 and all(h.config != C1 for h in core.history())
    # Backoff: nothing starts before retry_at, not even another config.
    assert not of(r.tick(now + 20), RollOut)
    # Still no capacity on the retry: the backoff doubles.
    acts = r.tick(now + 5 + NO_CAPACITY_BACKOFF_S)
    assert of(acts, RollOut)[0].config == C1
    t = now + 5 + NO_CAPACITY_BACKOFF_S
    r(RolloutNoCapacity(config=C1, reason=why), t + 1)
    wait = r.state.capacity_wait
    assert wait is not None and wait.attempts == 2 and wait.retry_at == t + 1 + no_capacity_backoff_s(2)
    assert no_capacity_backoff_s(2) == 2 * NO_CAPACITY_BACKOFF_S
    r(RolloutReady(config=DEFAULT), t + 2)
    # Capacity returns: the same config is tried again and runs, scored as any trial.
    t = wait.retry_at
    assert of(r.tick(t), RollOut)[0].config == C1
    acts = r(RolloutReady(config=C1), t + 30)
    assert r.state.capacity_wait is None and r.state.step == "WarmingUp"
    assert tuning_condition(r.state)[:2] == (True, "Exploring")
    r.tick(t + 90)
    acts = r.win(t + 390, goodput=1200.0)
    assert [x.trial.outcome for x in of(acts, RecordTrial)] == ["ok"]
    assert not [x for x in of(r.actions, RecordTrial) if x.trial.outcome == "infeasible"]


def test_no_capacity_backoff_is_capped() -> None:
    from prefixtune.tuning.policy.rollout import NO_CAPACITY_BACKOFF_MAX_S, no_capacity_backoff_s

    assert no_capacity_backoff_s(1) < no_capacity_backoff_s(2) < no_capacity_backoff_s(3)
    assert no_capacity_backoff_s(50) == NO_CAPACITY_BACKOFF_MAX_S


# --- the replicas are a serving parameter ----------------------------------------------------------
# A change of spec.replicas alone (``kubectl scale``, an HPA through the scale subresource) keeps the
# epoch, the trial in flight and the history; any other spec change keeps its behaviour.

CANARY = replace(SETTINGS, strategy="canary", ready_timeout_s=600.0)
KEYS = {"deployment_key": "pods-1", "spec_key": "spec-1"}


def _run(settings: TuningSettings = CANARY, replicas: int = 2) -> Run:
    r = Run(settings)
    r.state = initial_state(
        ENGINE, settings, DEFAULT, 1, KEYS["deployment_key"], spec_key="spec-1", replicas=replicas
    )
    return r


def _scaled(
    replicas: int, generation: int, settings: TuningSettings | None = None, **keys: str
) -> SpecChanged:
    """spec.replicas changed (with the ready timeout sized from them), the rest as ``KEYS`` say."""
    chosen = settings if settings is not None else replace(CANARY, ready_timeout_s=300.0 * replicas)
    return SpecChanged(
        settings=chosen, config=DEFAULT, generation=generation, replicas=replicas, **{**KEYS, **keys}
    )


def _state(**changes: object) -> PolicyState:
    state = initial_state(ENGINE, CANARY, DEFAULT, 1, "pods-1", spec_key="spec-1", replicas=2)
    return state.model_copy(update=changes)


def test_only_a_change_of_the_replicas_alone_counts() -> None:
    state = _state()
    assert replicas_only(state, _scaled(5, 2))  # the ready timeout follows the replicas: allowed
    assert replicas_only(state, _scaled(2, 2))  # an edit that changed nothing
    assert not replicas_only(state, _scaled(5, 2, spec_key="spec-2"))  # something else changed too
    assert not replicas_only(state, _scaled(5, 2, deployment_key="pods-2"))
    assert not replicas_only(state, _scaled(5, 2, settings=replace(CANARY, strategy="rolling")))
    assert not replicas_only(state, _scaled(5, 2, settings=replace(CANARY, warmup_s=1.0)))
    other_config = SpecChanged(settings=CANARY, config=C1, generation=2, replicas=5, **KEYS)
    assert not replicas_only(state, other_config)
    # a key nobody knows (a caller without it, a state an older operator wrote) never counts
    assert not replicas_only(state, _scaled(5, 2, spec_key=""))
    assert not replicas_only(_state(spec_key=""), _scaled(5, 2, spec_key=""))
    assert not replicas_only(_state(spec_key=""), _scaled(5, 2))


def _canary_measuring(r: Run) -> float:
    now = r.baseline(value=1000.0)
    assert of(r.actions, RollOut)[-1].config == C1 and r.state.settings.strategy == "canary"
    r(RolloutReady(config=C1), now + 30)
    r.tick(now + 90)
    assert (r.state.phase, r.state.step) == (Phase.EXPLORING, Step.MEASURING)
    return now


def test_a_canary_trial_keeps_its_canary_through_a_scale_and_is_remeasured_then_scored() -> None:
    r = _run()
    now = _canary_measuring(r)
    trial_id, epoch, trials = r.state.active, r.state.epoch, len(r.state.trials)
    acts = r(_scaled(4, 2), now + 150)
    assert not of(acts, RecordTrial) and not of(acts, RollOut)
    assert (r.state.epoch, r.state.active, len(r.state.trials)) == (epoch, trial_id, trials)
    assert trial_id is not None and r.state.trial(trial_id).config == C1
    assert r.state.settings.strategy == "canary" and r.state.current == DEFAULT  # canary kept
    assert (r.state.replicas, r.state.spec_generation, r.state.settings.ready_timeout_s) == (4, 2, 1200.0)
    # the window spanned two pod counts: discarded, measured again after a new warm-up (no
    # rollout to wait for: pods that cannot be placed yet must not hold the trial)
    assert (r.state.step, r.state.warm_until, r.state.measure_from) == (Step.WARMING_UP, now + 210, None)
    assert r.state.trial(trial_id).invalidations == 1
    reasons = {e.reason: e.message for e in of(acts, EmitEvent)}
    assert set(reasons) == {"Scaled", "TrialRemeasured"}
    assert "replicas 2 -> 4" in reasons["Scaled"] and f"trial {trial_id}" in reasons["Scaled"]
    r.tick(now + 200)
    assert r.state.step == Step.WARMING_UP
    r(_scaled(5, 3), now + 205)  # another scale while warming up: the warm-up starts again
    assert (r.state.step, r.state.warm_until, r.state.replicas) == (Step.WARMING_UP, now + 265, 5)
    r.tick(now + 265)
    assert (r.state.step, r.state.measure_from) == (Step.MEASURING, now + 265)
    obs = WindowMeasured(
        signals=window(goodput=600.0, requests=250.0),
        baseline_signals=window(goodput=1500.0, requests=750.0),
        canary_pods=1,
        baseline_pods=3,
    )
    recorded = of(r(obs, now + 565), RecordTrial)
    assert [(t.trial.id, t.trial.outcome, t.trial.epoch) for t in recorded] == [(trial_id, "ok", epoch)]
    assert recorded[0].trial.invalidations == 2
    assert recorded[0].trial.value == 1000.0 * (600.0 / 500.0)  # per pod: 600 vs 1500 / 3


def test_a_scale_during_a_rollout_lets_the_rollout_finish() -> None:
    r = _run()
    now = r.baseline()
    assert r.state.step == Step.ROLLING_OUT
    acts = r(_scaled(3, 2), now + 10)
    assert r.state.step == Step.ROLLING_OUT and not of(acts, RecordTrial)
    assert [e.reason for e in of(acts, EmitEvent)] == ["Scaled"]
    r(RolloutReady(config=C1), now + 30)
    assert r.state.step == Step.WARMING_UP


def test_a_converged_resource_scaled_stays_converged_with_its_best() -> None:
    r = _run(replace(CANARY, max_trials=1))
    now = _canary_measuring(r)
    obs = WindowMeasured(
        signals=window(goodput=400.0, requests=250.0), baseline_signals=window(goodput=1000.0)
    )
    r(obs, now + 390)
    for at in range(400, 3000, 60):  # the canary goes, the stable pods stay on the best
        if r.state.step in (Step.ROLLING_OUT, Step.WAITING_READY, Step.ROLLING_BACK):
            r(RolloutReady(config=r.state.target or r.state.current), now + at)
        r.tick(now + at)
    assert (r.state.phase, r.state.step) == (Phase.CONVERGED, Step.WATCHING)
    before = r.state.model_copy(deep=True)
    acts = r(_scaled(6, 2, settings=replace(CANARY, max_trials=1, ready_timeout_s=1800.0)), now + 4000)
    assert [e.reason for e in of(acts, EmitEvent)] == ["Scaled"]
    assert (r.state.phase, r.state.step, r.state.best, r.state.epoch) == (
        before.phase, before.step, before.best, before.epoch,
    )  # fmt: skip
    assert r.state.trials == before.trials


def test_a_change_of_more_than_the_replicas_keeps_its_behaviour() -> None:
    """The trial in flight is invalidated and re-run, as for any spec change (same epoch: the pods
    are the same kind)."""
    r = _run()
    now = _canary_measuring(r)
    acts = r(_scaled(4, 2, spec_key="spec-2", settings=replace(CANARY, warmup_s=30.0)), now + 150)
    assert [t.trial.outcome for t in of(acts, RecordTrial)] == ["invalidated"]
    assert not [e for e in of(acts, EmitEvent) if e.reason == "Scaled"]
    assert (r.state.epoch, r.state.spec_key, r.state.replicas) == (0, "spec-2", 4)


def test_a_scale_survives_a_restart_of_the_operator() -> None:
    r = _run()
    now = _canary_measuring(r)
    r(_scaled(3, 2), now + 150)
    back = PolicyState.from_json(r.state.to_json())
    assert back == r.state and (back.replicas, back.spec_key) == (3, "spec-1")


def test_a_failed_resource_scaled_stays_failed_until_someone_edits_it() -> None:
    """Failed means a rollback itself failed and a human must look: an autoscaler's write is not
    that look. The Deployments follow the count; another edit starts tuning again, as before."""
    r = _run()
    r.state = r.state.model_copy(update={"phase": Phase.FAILED, "step": Step.IDLE, "note": "rollback failed"})
    acts = r(_scaled(4, 2), 100.0)
    assert (r.state.phase, r.state.replicas, r.state.spec_generation) == (Phase.FAILED, 4, 2)
    assert [e.reason for e in of(acts, EmitEvent)] == ["Scaled"] and not of(acts, RollOut)
    r(_scaled(4, 3, spec_key="spec-2"), 200.0)
    assert r.state.phase == Phase.BASELINE


def test_a_rolling_trial_keeps_its_config_on_every_pod_through_a_scale() -> None:
    """Rolling: the one Deployment runs the trial's config, so the pods added run it too; nothing
    is rolled out or back, and the window is measured again after a new warm-up."""
    rolling = replace(CANARY, strategy="rolling")
    r = _run(rolling, replicas=1)
    now = r.baseline()
    assert of(r.actions, RollOut)[-1].strategy == "rolling"
    r(RolloutReady(config=C1), now + 30)
    r.tick(now + 90)
    assert (r.state.step, r.state.current) == (Step.MEASURING, C1)
    trial_id = r.state.active
    acts = r(_scaled(3, 2, settings=replace(rolling, ready_timeout_s=900.0)), now + 120)
    assert not of(acts, RollOut) and not of(acts, RollBack) and not of(acts, RecordTrial)
    assert (r.state.current, r.state.active, r.state.step) == (C1, trial_id, Step.WARMING_UP)
    r.tick(now + 180)
    recorded = of(r.win(now + 480, goodput=1200.0), RecordTrial)
    assert [(t.trial.id, t.trial.outcome) for t in recorded] == [(trial_id, "ok")]


def test_a_window_is_scored_against_the_running_cap_its_config_sets() -> None:
    # below capacity, the batch peaking at 40 requests under the deployed cap of 64: the cap is the
    # budget the window used most of (TTFT 10%, ITL p50 3%), and the score's terms say so
    deployed = DEFAULT.with_(max_running=64)
    r = Run()
    r.state = initial_state(ENGINE, SETTINGS, deployed)
    r(RolloutReady(config=deployed), 0.0)
    r.tick(60.0)
    signals = replace(window(goodput=500.0, ttft=0.2, itl=0.01), running_max=40.0)
    trial = of(r(WindowMeasured(signals=signals, offered_rps=1.0), 360.0), RecordTrial)[0].trial
    assert trial.terms is not None and trial.terms.headroom_limit == HeadroomLimit.RUNNING
    assert trial.terms.headroom == pytest.approx(64 / 40) and trial.value == pytest.approx(500.0 * 64 / 40)

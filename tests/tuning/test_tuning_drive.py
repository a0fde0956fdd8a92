"""The policy's driver (tuning/drive.py ``run_policy``): what it reports, when, per ``DriveRules``.

A scripted search (the baseline, then C1) against a fake cluster: windows of 120 s after 30 s of
warm-up, rollouts of 60 s, so the baseline's window is [30, 150) and C1's rollout begins at 150.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.tuning.test_tuning_policy import C1, DEFAULT, ENGINE, SETTINGS, scripted, window

from prefixtune.engines.base import KnobConfig
from prefixtune.tuning.actions import Action
from prefixtune.tuning.drive import DriveResult, DriveRules, RolloutKind, TrialRun, never, run_policy
from prefixtune.tuning.phases import Phase
from prefixtune.tuning.state import Observation, PolicyState, RolloutFailed, RolloutReady, WindowMeasured

SETTINGS_FAST = replace(SETTINGS, max_trials=2, min_interval_s=0, measure_s=120, warmup_s=30)


class FakeCluster:
    """C1 serves 20% more goodput; configs in ``fails`` do not start; ``oom`` ones fail in a window."""

    def __init__(self, fails: tuple[KnobConfig, ...] = (), oom: tuple[KnobConfig, ...] = ()) -> None:
        self.fails = fails
        self.oom = oom
        self.windows: list[tuple[KnobConfig, float, float, float]] = []  # (config, start, end, seconds)

    def starts(self, config: KnobConfig, ready_at: float) -> bool:
        return config not in self.fails

    def window(self, config: KnobConfig, start: float, end: float, seconds: float) -> TrialRun:
        self.windows.append((config, start, end, seconds))
        if config in self.oom:
            return TrialRun("oom_runtime")
        return TrialRun("ok", window(1200.0 if config == C1 else 1000.0, window_s=seconds), offered_rps=1.0)


def _run(cluster: FakeCluster, rules: DriveRules) -> tuple[DriveResult, list[tuple[float, Observation]]]:
    seen: list[tuple[float, Observation]] = []

    def on_step(state: PolicyState, obs: Observation, now: float, actions: list[Action]) -> None:
        seen.append((now, obs))

    result = run_policy(
        ENGINE, SETTINGS_FAST, DEFAULT, cluster, rules, suggester=scripted([C1]), on_step=on_step
    )
    return result, seen


def test_a_config_that_does_not_start_reports_rollout_failed_when_it_would_be_ready() -> None:
    result, seen = _run(FakeCluster(fails=(C1,)), DriveRules())
    first = result.rollouts[0]
    assert (first.at, first.config, first.kind, first.started) == (150.0, C1, RolloutKind.TRIAL, False)
    failed = [(now, o) for now, o in seen if isinstance(o, RolloutFailed)]
    assert [(now, o.config, o.failure) for now, o in failed] == [(210.0, C1, "oom_startup")]


def test_after_a_failed_start_the_rollback_to_the_old_config_restarts_nothing() -> None:
    # the old config serves on, so with confirmations the rollback to it is one
    result, seen = _run(FakeCluster(fails=(C1,)), DriveRules(confirm_running=True))
    assert [(r.config, r.kind) for r in result.rollouts] == [(C1, RolloutKind.TRIAL)]
    ready = [now for now, o in seen if isinstance(o, RolloutReady)]
    assert ready == [0.0, 210.0]  # the deployed config at the start; the rollback's at once


def test_without_confirmations_a_rollback_to_the_running_config_is_a_rollout() -> None:
    result, seen = _run(FakeCluster(fails=(C1,)), DriveRules())
    assert [(r.at, r.config, r.kind) for r in result.rollouts][1:] == [(210.0, DEFAULT, RolloutKind.ROLLBACK)]
    assert [now for now, o in seen if isinstance(o, RolloutReady)] == [0.0, 270.0]


def test_a_window_is_reported_in_early_abort_checks_then_at_its_end() -> None:
    cluster = FakeCluster()
    _, seen = _run(cluster, DriveRules(checks_per_window=4))
    baseline = [(now, o.partial) for now, o in seen if isinstance(o, WindowMeasured) and now <= 150.0]
    assert baseline == [(60.0, True), (90.0, True), (120.0, True), (150.0, False)]
    assert [w for w in cluster.windows if w[1] == 30.0] == [
        (DEFAULT, 30.0, 150.0, s) for s in (30, 60, 90, 120)
    ]


def test_a_window_that_fails_goes_to_its_end_without_checks() -> None:
    _, seen = _run(FakeCluster(oom=(C1,)), DriveRules(checks_per_window=4))
    after = [(now, o.kind) for now, o in seen if now > 210.0 and not isinstance(o, RolloutReady)]
    assert after[:2] == [(240.0, "tick"), (360.0, "rollout_failed")]


def test_watching_measures_a_drift_window_every_measure_s() -> None:
    cluster = FakeCluster()
    result, _ = _run(cluster, DriveRules(stop=never, until_s=1000.0, drift_windows=True))
    assert result.state.phase == Phase.CONVERGED
    watched = [(start, end) for _, start, end, _ in cluster.windows if start >= 570.0]
    assert watched == [(570.0, 690.0), (690.0, 810.0), (810.0, 930.0), (930.0, 1050.0)]


def test_without_drift_windows_watching_measures_nothing() -> None:
    cluster = FakeCluster()
    result, _ = _run(cluster, DriveRules(stop=never, until_s=1000.0))
    assert result.state.phase == Phase.CONVERGED and result.now >= 1000.0
    assert max(end for _, _, end, _ in cluster.windows) == 570.0


def test_an_idle_policy_is_driven_to_the_horizon_however_far() -> None:
    # converged, no drift windows: a Tick a minute, the state unchanged, for 3,000+ steps
    result, _ = _run(FakeCluster(), DriveRules(stop=never, until_s=200_000.0))
    assert result.state.phase == Phase.CONVERGED and result.now >= 200_000.0


def test_observe_mode_measures_a_window_every_measure_s() -> None:
    cluster = FakeCluster()
    observe = replace(SETTINGS_FAST, mode="observe")
    result = run_policy(ENGINE, observe, DEFAULT, cluster, DriveRules(stop=never, until_s=400.0))
    assert result.state.phase == Phase.OBSERVING and result.rollouts == []
    assert [(c, start, end) for c, start, end, _ in cluster.windows] == [
        (DEFAULT, 0.0, 120.0), (DEFAULT, 120.0, 240.0), (DEFAULT, 240.0, 360.0), (DEFAULT, 360.0, 480.0),
    ]  # fmt: skip


def test_measuring_steps_of_phases_not_listed_get_no_window() -> None:
    cluster = FakeCluster()
    _run(cluster, DriveRules(stop=never, until_s=600.0, measured_phases=frozenset({Phase.EXPLORING})))
    assert cluster.windows == []


def test_by_default_the_driver_stops_once_the_policy_settles() -> None:
    result, seen = _run(FakeCluster(), DriveRules())
    assert (result.state.phase, seen[-1][0]) == (Phase.CONVERGED, 570.0)


def test_drive_rules_refuse_a_window_without_its_end() -> None:
    with pytest.raises(ValueError, match="checks_per_window >= 1"):
        DriveRules(checks_per_window=0)

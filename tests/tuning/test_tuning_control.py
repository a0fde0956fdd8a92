"""A person's control of the tuning: pause/resume (spec.tuning.paused), pin and roll back (spec
edits with tuning.mode off), approve observe mode's recommendation (issue 18 item 4)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tests.tuning.test_tuning_policy import C1, C2, DEFAULT, SETTINGS, Run, of, window

from prefixtune.tuning.actions import Action, EmitEvent, RecordTrial, RollBack, RollOut
from prefixtune.tuning.phases import TuningReason
from prefixtune.tuning.policy._core import trials_spent
from prefixtune.tuning.policy.messages import tuning_condition
from prefixtune.tuning.state import (
    Approved,
    PolicyState,
    RolloutApplied,
    RolloutFailed,
    RolloutReady,
    SpecChanged,
    WhatIf,
    WindowMeasured,
    recommendation_id,
)

CANARY = replace(SETTINGS, strategy="canary")
PAUSED = replace(CANARY, paused=True)


def reasons(actions: Sequence[Action]) -> list[str]:
    return [a.reason for a in actions if isinstance(a, EmitEvent)]


def canary_trial_warming() -> tuple[Run, float]:
    """A canary trial of C1 past its rollout, warming up (the stable pods run DEFAULT)."""
    r = Run(CANARY)
    now = r.baseline()
    assert [a.config for a in of(r.actions, RollOut)] == [C1]
    r(RolloutApplied(), now + 5)
    r(RolloutReady(config=C1), now + 30)
    assert (r.state.phase, r.state.step, r.state.current) == ("Exploring", "WarmingUp", DEFAULT)
    return r, now + 30


def test_pause_stops_the_canary_trial_and_keeps_the_stable_config() -> None:
    r, now = canary_trial_warming()
    acts = r(SpecChanged(settings=PAUSED, generation=2), now + 10)
    assert r.state.phase == "Paused"
    [record] = of(acts, RecordTrial)
    assert (record.trial.id, record.trial.outcome, record.trial.failure) == (1, "invalidated", "paused")
    assert [a.to_config for a in of(acts, RollBack)] == [DEFAULT]
    assert "Paused" in reasons(acts)
    r(RolloutReady(config=DEFAULT), now + 60)  # the canary is gone: the rollback completed
    assert (r.state.phase, r.state.step, r.state.current, r.state.target) == ("Paused", "Idle", DEFAULT, None)
    status, reason, message = tuning_condition(r.state)
    assert (status, reason) == (False, TuningReason.PAUSED) and "spec.tuning.paused" in message
    for t in range(1, 20):  # nothing new runs, however long it stays paused
        assert not of(r.tick(now + 1000.0 * t), RollOut)
    assert trials_spent(r.state) == 0  # the stopped trial is not charged to the budget


def test_resume_continues_the_epoch_without_a_new_baseline() -> None:
    r, now = canary_trial_warming()
    r(SpecChanged(settings=PAUSED, generation=2), now + 10)
    r(RolloutReady(config=DEFAULT), now + 60)
    trials = [t.id for t in r.state.trials]
    acts = r(SpecChanged(settings=CANARY, generation=3), now + 5000)
    assert "Resumed" in reasons(acts)
    assert (r.state.phase, r.state.epoch) == ("Exploring", 0)
    assert [t.id for t in r.state.trials][: len(trials)] == trials  # the history is kept
    assert not any(t.role == "baseline" and t.id > 1 for t in r.state.trials)  # no fresh baseline
    [started] = of(acts, RollOut)  # the search decides again (past the rate limit)
    assert started.trial == 2 and trials_spent(r.state) == 1


def test_an_edit_while_paused_makes_the_resume_start_afresh() -> None:
    r, now = canary_trial_warming()
    r(SpecChanged(settings=PAUSED, generation=2), now + 10)
    r(RolloutReady(config=DEFAULT), now + 60)
    r(SpecChanged(settings=PAUSED, config=C2, generation=3), now + 100)  # a new baseline config
    assert (r.state.phase, r.state.current) == ("Paused", C2)
    acts = r(SpecChanged(settings=CANARY, generation=4), now + 5000)
    assert "Resumed" in reasons(acts)
    assert (r.state.phase, r.state.epoch) == ("Baseline", 1)


def test_a_resource_created_paused_starts_only_when_resumed() -> None:
    r = Run(PAUSED)
    r(RolloutReady(config=DEFAULT), 0.0)
    assert r.state.phase == "Paused" and r.state.paused_from == "Pending"
    r(WindowMeasured(signals=window(), offered_rps=1.0), 700.0)
    assert r.state.phase == "Paused" and not r.state.trials
    r(SpecChanged(settings=CANARY, generation=2), 1000.0)
    assert r.state.phase == "Pending"
    r.tick(1010.0)
    assert (r.state.phase, r.state.epoch) == ("Baseline", 0)


def test_a_converged_resource_resumes_watching() -> None:
    r = Run(replace(SETTINGS, max_trials=1))
    now = r.baseline()
    r(RolloutApplied(), now + 5)
    r(RolloutReady(config=C1), now + 30)
    r.tick(now + 90)
    r.win(now + 390, goodput=1200.0)
    assert (r.state.phase, r.state.step) == ("Converged", "Watching")
    r(SpecChanged(settings=replace(SETTINGS, max_trials=1, paused=True), generation=2), now + 400)
    assert r.state.phase == "Paused" and not of(r.actions[-3:], RollBack)
    r(SpecChanged(settings=replace(SETTINGS, max_trials=1), generation=3), now + 500)
    assert (r.state.phase, r.state.step, r.state.current) == ("Converged", "Watching", C1)


def observing_with_recommendation() -> Run:
    r = Run(replace(SETTINGS, mode="observe"))
    r.tick(0.0)
    better = WhatIf(config=C1, signals=window(goodput=1500.0))
    acts = r(WindowMeasured(signals=window(goodput=1000.0), what_if=(better,)), 600)
    assert r.state.recommendation == C1 and "Recommendation" in reasons(acts)
    return r


def test_approve_rolls_the_current_recommendation_out_once() -> None:
    r = observing_with_recommendation()
    acts = r(Approved(id=recommendation_id(C1)), 700)
    [out] = of(acts, RollOut)
    assert (out.config, out.strategy) == (C1, "rolling") and "Approved" in reasons(acts)
    assert (r.state.step, r.state.recommendation, r.state.approval) == (
        "RollingOut",
        None,
        recommendation_id(C1),
    )
    r(RolloutApplied(), 705)
    r(RolloutReady(config=C1), 760)
    assert (r.state.phase, r.state.step, r.state.current) == ("Observing", "Measuring", C1)
    assert r.state.measure_from == 760  # the window starts on the approved config's pods
    # nothing is recommended now: the same approval again rolls nothing out
    again = r(Approved(id=recommendation_id(C1)), 800)
    assert not of(again, RollOut) and "ApprovalIgnored" in reasons(again)


def test_a_stale_approval_does_nothing_and_says_so() -> None:
    r = observing_with_recommendation()
    acts = r(Approved(id=recommendation_id(C2)), 700)
    assert not of(acts, RollOut) and r.state.step == "Measuring" and r.state.recommendation == C1
    [warning] = [a for a in of(acts, EmitEvent) if a.reason == "ApprovalIgnored"]
    assert (
        warning.type == "Warning" and "stale" in warning.message and recommendation_id(C1) in warning.message
    )
    no_rec = Run(replace(SETTINGS, mode="observe"))
    no_rec.tick(0.0)
    acts = no_rec(Approved(id=recommendation_id(C1)), 100)
    assert not of(acts, RollOut) and "ApprovalIgnored" in reasons(acts)


def test_an_approved_config_that_fails_goes_back_to_the_config_before() -> None:
    r = observing_with_recommendation()
    r(Approved(id=recommendation_id(C1)), 700)
    acts = r(RolloutFailed(config=C1, failure="oom_startup"), 750)
    assert [a.to_config for a in of(acts, RollBack)] == [DEFAULT] and "ApprovedConfigFailed" in reasons(acts)
    r(RolloutReady(config=DEFAULT), 800)
    assert (r.state.phase, r.state.step, r.state.current) == ("Observing", "Measuring", DEFAULT)


def test_switching_to_observe_mid_trial_completes_the_rollback() -> None:
    r, now = canary_trial_warming()
    acts = r(SpecChanged(settings=replace(CANARY, mode="observe"), generation=2), now + 10)
    assert [a.to_config for a in of(acts, RollBack)] == [DEFAULT]
    r(RolloutReady(config=DEFAULT), now + 60)
    assert (r.state.phase, r.state.step, r.state.target) == ("Observing", "Measuring", None)


def converged_on_c1() -> tuple[Run, float]:
    r = Run(replace(SETTINGS, max_trials=1))
    now = r.baseline()
    r(RolloutApplied(), now + 5)
    r(RolloutReady(config=C1), now + 30)
    r.tick(now + 90)
    r.win(now + 390, goodput=1200.0)
    assert r.state.phase == "Converged" and r.state.current == C1
    return r, now + 390


def test_pinning_a_trial_says_which_trial_it_runs() -> None:
    r, now = converged_on_c1()
    off = replace(SETTINGS, max_trials=1, mode="off")
    acts = r(SpecChanged(settings=off, config=C1, generation=2), now + 10)
    [pinned] = [a for a in of(acts, EmitEvent) if a.reason == "Pinned"]
    assert "trial 1" in pinned.message and not of(acts, RollBack)
    assert (r.state.phase, r.state.current, r.state.spec_config) == ("Paused", C1, C1)


def test_rolling_back_to_the_spec_config_says_so() -> None:
    r, now = converged_on_c1()
    acts = r(SpecChanged(settings=replace(SETTINGS, max_trials=1, mode="off"), generation=2), now + 10)
    assert [a.to_config for a in of(acts, RollBack)] == [DEFAULT]
    [off] = [a for a in of(acts, EmitEvent) if a.reason == "TuningOff"]
    assert "spec's config" in off.message


def test_the_control_fields_round_trip() -> None:
    r = observing_with_recommendation()
    r(Approved(id="abc"), 700)
    r(SpecChanged(settings=replace(SETTINGS, mode="observe", paused=True), generation=2), 800)
    back = PolicyState.from_json(r.state.to_json())
    assert (back.paused_from, back.approval) == ("Observing", "abc") and back == r.state


def test_the_pause_round_trips() -> None:
    r, now = canary_trial_warming()
    r(SpecChanged(settings=PAUSED, config=C2, generation=2), now + 10)
    back = PolicyState.from_json(r.state.to_json())
    assert (back.paused_from, back.resume_fresh) == ("Exploring", True) and back == r.state


def test_a_pause_undoes_an_approved_rollout_in_flight() -> None:
    r = observing_with_recommendation()
    r(Approved(id=recommendation_id(C1)), 700)
    acts = r(SpecChanged(settings=replace(SETTINGS, mode="observe", paused=True), generation=2), 710)
    assert [a.to_config for a in of(acts, RollBack)] == [DEFAULT]
    r(RolloutReady(config=DEFAULT), 760)
    assert (r.state.phase, r.state.step, r.state.current, r.state.target) == ("Paused", "Idle", DEFAULT, None)


def test_an_approval_ignored_while_paused_can_be_given_again_after_removing_it() -> None:
    r = observing_with_recommendation()
    rid = recommendation_id(C1)
    r(SpecChanged(settings=replace(SETTINGS, mode="observe", paused=True), generation=2), 650)
    ignored = r(Approved(id=rid), 700)
    assert not of(ignored, RollOut) and "ApprovalIgnored" in reasons(ignored) and r.state.approval == rid
    r(SpecChanged(settings=replace(SETTINGS, mode="observe"), generation=3), 800)
    assert (r.state.phase, r.state.recommendation) == ("Observing", C1)
    removed = r(Approved(id=""), 810)  # the annotation removed: forgotten, silently
    assert r.state.approval == "" and not removed
    assert [a.config for a in of(r(Approved(id=rid), 820), RollOut)] == [C1]

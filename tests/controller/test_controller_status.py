"""Status building: conditions with observedGeneration and transition times, trials, policy round-trip."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from prefixtune.api import parse_spec
from prefixtune.api.enums import TrialRole
from prefixtune.controller import render as R
from prefixtune.controller import status as S
from prefixtune.engines.base import KnobConfig
from prefixtune.metrics.diagnosis import diagnose
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.actions import EmitEvent, Recommend, SetCondition
from prefixtune.tuning.objective import ScoreBasis
from prefixtune.tuning.phases import Phase
from prefixtune.tuning.policy import initial_state
from prefixtune.tuning.settings import TuningSettings
from prefixtune.tuning.state import MAX_TEXT, GateRecord, PolicyState, Trial, ValueTerms, recommendation_id

BASE = KnobConfig(0.9, 16, True, "fcfs")


def _state_with_trials(n: int) -> object:
    s = initial_state("vllm", TuningSettings(), BASE)
    trials = [
        Trial(id=i, epoch=0, role="baseline" if i == 0 else "trial",
              config=BASE.with_(block_size=16 * (1 + i % 2)),
              outcome="ok", started_at=1000.0 + i, finished_at=1001.0 + i, value=10.0 + i,
              signals=Signals(window_s=60, requests=100, hit_rate=0.5))
        for i in range(n)
    ]  # fmt: skip
    update = {"phase": Phase.EXPLORING, "trials": trials, "best": n - 1, "next_trial_id": n}
    return s.model_copy(update=update)


def test_status_is_valid_for_the_api_model_and_round_trips_the_policy_state() -> None:
    state = _state_with_trials(3)
    signals = Signals(window_s=60, requests=200, hit_rate=0.6, prefill_reduction=0.5, ttft_p99_s=0.5)
    actions = [SetCondition("Tuning", "True", "Exploring", "trial 2"), EmitEvent("Normal", "X", "y")]
    status = S.build_status(
        state,
        actions,
        None,
        now=2000.0,
        generation=4,
        ready=(True, "ReplicasReady", "2/2"),  # type: ignore[arg-type]
        diagnosis=diagnose(signals),
    )
    model = S.validate_status(status)
    assert model.phase.value == "Exploring"
    assert model.observed_generation == 4
    assert [c.type.value for c in model.conditions] == ["Ready", "Tuning"]
    assert all(c.observed_generation == 4 for c in model.conditions)
    assert model.best_config is not None and model.best_config.score == 12.0
    # the best trial runs the baseline's config (the configs alternate): no gain to judge
    assert model.best_config.confidence is None and model.best_config.gain is None
    assert [t.index for t in model.trials] == [0, 1, 2]
    assert S.policy_state_of(status) == state
    assert status["diagnosis"]["hitRate"] == 0.6


def test_each_trial_record_shows_its_role_score_basis_and_terms() -> None:
    sig = Signals(window_s=60, requests=100, hit_rate=0.5)
    paired = ValueTerms(
        basis=ScoreBasis.PAIRED, anchor_trial=0, anchor=10.0, ratio=1.25, baseline_window=8.0,
        canary_pods=1, baseline_pods=2, split=1.0,
    )  # fmt: skip
    rolling = ValueTerms(
        basis=ScoreBasis.LOAD_NORMALIZED, load_factor=0.8, offered_rps=2.5, reference_rps=2.0
    )
    trials = [
        Trial(id=0, epoch=0, role="baseline", config=BASE, outcome="ok", started_at=1.0, signals=sig,
              score=10.0, value=10.0, terms=ValueTerms(basis=ScoreBasis.MEASURED)),
        Trial(id=1, epoch=0, role="trial", config=BASE.with_(block_size=32), outcome="ok", started_at=2.0,
              signals=sig, score=5.0, value=12.5, terms=paired),
        Trial(id=2, epoch=0, role="trial", config=BASE.with_(block_size=64), outcome="ok", started_at=3.0,
              signals=sig, score=15.0, value=12.0, terms=rolling),
        Trial(id=3, epoch=0, role="trial", config=BASE.with_(block_size=32), outcome="infeasible",
              started_at=4.0, failure="oom"),
    ]  # fmt: skip
    state = initial_state("vllm", TuningSettings(), BASE).model_copy(
        update={"phase": Phase.EXPLORING, "trials": trials, "best": 1, "next_trial_id": 4}
    )
    status = S.build_status(state, [], None, now=10.0, generation=1, ready=(True, "ReplicasReady", "1/1"))  # type: ignore[arg-type]
    model = S.validate_status(status)
    records = status["trials"]
    assert [r["role"] for r in records] == ["baseline", "trial", "trial", "trial"]
    assert [r.get("scoreBasis") for r in records] == [
        "measured",
        "paired-with-baseline",
        "load-normalized",
        None,
    ]
    assert [r.get("score") for r in records] == [10.0, 12.5, 12.0, None]
    assert [r.get("windowScore") for r in records] == [10.0, 5.0, 15.0, None]
    assert "scoreTerms" not in records[0] and "scoreTerms" not in records[3]
    assert records[1]["scoreTerms"] == {
        "baselineTrial": 0, "baselineScore": 10.0, "ratio": 1.25, "baselineWindowScore": 8.0,
        "canaryPods": 1, "baselinePods": 2, "requestSplit": 1.0,
    }  # fmt: skip
    assert records[2]["scoreTerms"] == {"loadFactor": 0.8, "offeredRps": 2.5, "referenceRps": 2.0}
    assert model.trials[1].score_terms is not None and model.trials[1].score_terms.ratio == 1.25
    assert model.best_config is not None and model.best_config.trial == 1
    # the API's roles are the policy's (one list, two spellings of it)
    assert {str(r) for r in TrialRole} == set(get_args(Trial.model_fields["role"].annotation))


def test_last_transition_time_moves_only_when_the_status_flips() -> None:
    first = S.merge_conditions([], [("Ready", "False", "Creating", "")], now=100.0, generation=1)
    same = S.merge_conditions(first, [("Ready", "False", "ReplicasNotReady", "0/1")], now=200.0, generation=2)
    assert same[0]["lastTransitionTime"] == first[0]["lastTransitionTime"] == S.iso(100.0)
    assert same[0]["reason"] == "ReplicasNotReady" and same[0]["observedGeneration"] == 2
    flipped = S.merge_conditions(same, [("Ready", "True", "ReplicasReady", "1/1")], now=300.0, generation=2)
    assert flipped[0]["lastTransitionTime"] == S.iso(300.0)


def test_trials_are_capped_but_ids_kept() -> None:
    state = _state_with_trials(60)
    status = S.build_status(state, [], None, now=1.0, generation=1, ready=(True, "R", ""))  # type: ignore[arg-type]
    assert len(status["trials"]) == S.MAX_TRIALS_IN_STATUS
    assert status["trials"][0]["index"] == 10 and status["trials"][-1]["index"] == 59
    assert len(S.policy_state_of(status).trials) == 60  # type: ignore[union-attr]


def test_recommendation_is_kept_until_replaced() -> None:
    off = BASE.with_(prefix_caching=False)
    state = initial_state("vllm", TuningSettings(mode="observe"), BASE).model_copy(
        update={"recommendation": off}
    )
    rec = Recommend(off, "hit rate 1% < 5%")
    status = S.build_status(state, [rec], None, now=1.0, generation=1, ready=(True, "R", ""))
    assert status["recommendation"]["config"]["prefixCaching"] is False
    again = S.build_status(state, [], status, now=2.0, generation=1, ready=(True, "R", ""))
    assert again["recommendation"] == status["recommendation"]
    S.validate_status(again)


def test_the_recommendation_has_the_id_an_approval_names_and_goes_once_approved() -> None:
    """``prefixtune approve`` writes status.recommendation.id into prefixtune.io/approve; once the
    policy rolled it out (it has no recommendation then) the status shows none."""
    off = BASE.with_(prefix_caching=False)
    state = initial_state("vllm", TuningSettings(mode="observe"), BASE).model_copy(
        update={"recommendation": off}
    )
    status = S.build_status(
        state, [Recommend(off, "why")], None, now=1.0, generation=1, ready=(True, "R", "")
    )
    assert status["recommendation"]["id"] == recommendation_id(off) != recommendation_id(BASE)
    S.validate_status(status)
    older = {**status, "recommendation": {"config": status["recommendation"]["config"], "reason": "why"}}
    kept = S.build_status(state, [], older, now=2.0, generation=1, ready=(True, "R", ""))
    assert kept["recommendation"] == status["recommendation"]  # one an older release wrote gets its id
    approved = state.model_copy(update={"recommendation": None})
    gone = S.build_status(approved, [], status, now=3.0, generation=1, ready=(True, "R", ""))
    assert gone["recommendation"] is None


def test_invalid_spec_status_names_the_field_and_is_failed() -> None:
    status = S.invalid_status(None, ["spec.config.blockSize: must be one of 16, 32"], now=5.0, generation=3)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "spec.config.blockSize" in ready["message"]
    assert status["phase"] == "Failed" and status["observedGeneration"] == 3
    S.validate_status(status)


def test_every_free_text_and_list_field_is_bounded() -> None:
    """A huge message (a pod's, an engine's, a metrics source's) must not push the status past the
    API server's request limit: that would fail every patch and freeze the resource."""
    import json

    huge = "x" * 100_000
    state = _state_with_trials(60)
    trials = [t.model_copy(update={"reason": huge}) for t in state.trials]  # type: ignore[attr-defined]
    # the policy records what it recommends (observe mode) as it emits it
    update = {"trials": trials, "recommendation": BASE.with_(block_size=32)}
    state = state.model_copy(update=update)  # type: ignore[attr-defined]
    old = {
        "type": "Degraded",
        "status": "True",
        "reason": "X",
        "message": huge,
        "lastTransitionTime": S.iso(1.0),
    }
    previous = {"conditions": [old]}
    actions = [
        SetCondition("MetricsUnavailable", "True", "MetricsUnavailable", huge),
        Recommend(BASE.with_(block_size=32), huge),
    ]
    diagnosis = diagnose(Signals(window_s=60, requests=200, hit_rate=0.01, kv_usage_mean=0.99))
    status = S.build_status(
        state,
        actions,
        previous,
        now=2000.0,
        generation=1,
        ready=(False, "NotReady", huge),
        diagnosis=diagnosis,
    )
    assert len(
        json.dumps(S.build_status(state, [], None, now=1.0, generation=1, ready=(True, "R", "m")))
    ) < len(json.dumps(status))
    conditions = status["conditions"]
    assert [c["type"] for c in conditions] == ["Ready", "Tuning", "Degraded", "MetricsUnavailable"]
    assert all(len(c["message"]) <= S.MAX_CONDITION_MESSAGE for c in conditions)
    assert conditions[0]["message"].endswith("(truncated)")
    assert all(len(t["reason"]) <= MAX_TEXT for t in status["trials"]) and len(status["trials"]) == 50
    assert len(status["recommendation"]["reason"]) <= MAX_TEXT
    assert all(len(n) <= S.MAX_NOTE for n in status["diagnosis"]["notes"])
    assert len(json.dumps(status)) < 256 * 1024
    S.validate_status(status)
    stored = S.policy_state_of(status)
    assert stored is not None and all(len(t.reason) <= MAX_TEXT for t in stored.trials)


def test_conditions_other_tools_added_are_capped() -> None:
    previous = [{"type": f"Custom{i:02}", "status": "True", "message": "m" * 100_000} for i in range(40)]
    merged = S.merge_conditions(previous, [("Ready", "True", "R", "ok")], now=1.0, generation=1)
    assert (
        len(merged) == S.MAX_CONDITIONS and merged[0]["type"] == "Ready" and merged[1]["type"] == "Custom00"
    )
    assert all(len(c["message"]) <= S.MAX_CONDITION_MESSAGE for c in merged)


# --- the scale subresource's fields ----------------------------------------------------------------


def _deployments(baseline: object, canary: object = None) -> dict[str, Any]:
    def dep(status: object) -> dict[str, Any] | None:
        return None if status is None else {"spec": {"replicas": 9}, "status": status}

    return {"baseline": dep(baseline), "canary": dep(canary)}


def test_status_replicas_are_the_engine_pods_that_exist_ready_or_not() -> None:
    """The Deployments' own status.replicas summed, as a Deployment's scale reports them: a pod
    still loading the model counts (it is one the selector finds), the Deployments' spec does not."""
    deps = _deployments({"replicas": 3, "readyReplicas": 1}, {"replicas": 1, "readyReplicas": 0})
    assert S.scale_status("chat", deps) == S.ScaleStatus(4, "prefixtune.io/resource=chat")
    assert S.scale_status("chat", _deployments(None)).replicas == 0  # nothing created yet
    assert S.scale_status("chat", _deployments({})).replicas == 0  # no status yet
    for garbage in ("3", -2, True, 2.5, None):
        assert S.scale_status("chat", _deployments({"replicas": garbage}, {"replicas": 2})).replicas == 2


def test_the_selector_string_selects_the_engine_pods_of_both_roles_as_the_service_does() -> None:
    owner = R.Owner(namespace="team", name="rag", uid="uid-1")
    spec = parse_spec({"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 2})
    selector = S.scale_status("rag", {}).selector
    terms = dict(term.split("=", 1) for term in selector.split(","))
    assert terms == R.render_service(owner, spec)["spec"]["selector"]
    for role in R.ROLES:
        labels = R.render_deployment(owner, spec, BASE, role, 1)["spec"]["template"]["metadata"]["labels"]
        assert terms.items() <= labels.items(), role
    assert R.selector_string({"b": "2", "a": "1"}) == "a=1,b=2"


def test_the_scale_fields_are_written_and_kept_when_not_read_again() -> None:
    state = _state_with_trials(1)
    ok = (True, "ReplicasReady", "")
    scale = S.ScaleStatus(3, "prefixtune.io/resource=rag")
    status = S.build_status(state, [], None, now=1.0, generation=2, ready=ok, scale=scale)
    assert (status["replicas"], status["selector"]) == (3, "prefixtune.io/resource=rag")
    S.validate_status(status)
    later = S.build_status(state, [], status, now=2.0, generation=2, ready=ok)
    assert (later["replicas"], later["selector"]) == (3, "prefixtune.io/resource=rag")
    assert "replicas" not in S.build_status(state, [], None, now=1.0, generation=2, ready=ok)


def _tuning(status: dict[str, object]) -> dict[str, object]:
    conditions = status["conditions"]
    assert isinstance(conditions, list)
    return next(c for c in conditions if c["type"] == "Tuning")


def test_the_tuning_condition_follows_the_phase_and_step() -> None:
    """Driven through a baseline and a trial as the reconcile does (the previous status fed back), the
    Tuning condition moves with every step, with the trial, the budget and the generation (issue 18:
    it stayed "Baseline (epoch 0)" all run)."""
    from prefixtune.tuning.optimizer import Suggestion
    from prefixtune.tuning.policy import step
    from prefixtune.tuning.state import RolloutApplied, RolloutReady, Tick, WindowMeasured

    trial_config = BASE.with_(block_size=32)

    def suggester(*_: object) -> Suggestion:
        return Suggestion(trial_config, "scripted")

    settings = TuningSettings(warmup_s=60, measure_s=300, min_requests=10, max_trials=3, min_interval_s=0)
    state = initial_state("vllm", settings, BASE)
    signals = Signals(window_s=300, requests=500, goodput_tokens_per_s=100.0, output_tokens_per_s=110.0,
                      ttft_p99_s=0.5, itl_p99_s=0.05, requests_per_s=1.0)  # fmt: skip
    status: dict[str, object] | None = None
    seen: list[tuple[str, str, str, int]] = []
    script = [
        (RolloutReady(config=BASE), 0.0), (Tick(), 60.0),
        (WindowMeasured(signals=signals, offered_rps=1.0), 360.0),  # baseline scored: trial 1 rolls out
        (RolloutApplied(config=trial_config), 365.0), (RolloutReady(config=trial_config), 370.0),
        (Tick(), 430.0),
    ]  # fmt: skip
    for generation, (obs, now) in enumerate(script, start=1):
        state, actions = step(state, obs, now, suggester)
        status = S.build_status(state, actions, status, now=now, generation=generation, ready=(True, "R", ""))
        tuning = _tuning(status)
        seen.append((str(tuning["reason"]), str(tuning["message"]), str(tuning["status"]),
                     int(tuning["observedGeneration"])))  # type: ignore[call-overload]  # fmt: skip
    reasons = [s[0] for s in seen]
    assert reasons == ["Baseline", "Baseline", "Exploring", "Exploring", "Exploring", "Exploring"]
    messages = [s[1] for s in seen]
    assert "warming the cache up" in messages[0] and "measuring a window" in messages[1]
    assert "trial 1" in messages[2] and "rolling out" in messages[2] and "1 of 3 trials spent" in messages[2]
    assert "waiting for its pods to be ready" in messages[3]
    assert "warming the cache up" in messages[4] and "measuring a window" in messages[5]
    assert len(set(messages)) == len(messages)  # a new text at every step
    assert all(s[2] == "True" for s in seen)
    assert [s[3] for s in seen] == list(range(1, len(script) + 1))
    # the same state again (a tick that changes nothing) writes nothing: no churn
    stored = {k: v for k, v in status.items() if v is not None}  # as the API server keeps it
    same = S.build_status(state, [], stored, now=431.0, generation=len(script), ready=(True, "R", ""))
    assert not S.patch_changes(stored, same)


def test_a_fixed_spec_clears_the_invalid_spec_condition_and_message() -> None:
    """Invalid at creation, then fixed: neither Ready nor Tuning keeps the InvalidSpec reason or the
    old message (issue 18: the Tuning condition kept it, since nothing rewrote it)."""
    error = "spec.gpu.count: must be 1..8, got 12"
    invalid = S.invalid_status(None, [error], now=1.0, generation=1)
    assert {c["type"]: c["reason"] for c in invalid["conditions"]} == {
        "Ready": "InvalidSpec", "Tuning": "InvalidSpec"
    }  # fmt: skip
    fixed = S.build_status(
        initial_state("vllm", TuningSettings(), BASE), [], invalid, now=2.0, generation=2,
        ready=(False, "ReplicasNotReady", "0/1 engine pods ready"),
    )  # fmt: skip
    assert all(c["reason"] != "InvalidSpec" and error not in c["message"] for c in fixed["conditions"])
    assert _tuning(fixed)["reason"] == "Pending" and _tuning(fixed)["observedGeneration"] == 2
    assert fixed["phase"] == "Pending"


def test_the_tuning_condition_names_a_failed_trial_and_the_capacity_wait() -> None:
    from prefixtune.tuning.policy.messages import tuning_condition
    from prefixtune.tuning.state import CapacityWait

    crash = "crash: pod a-canary-x: CrashLoopBackOff (Error), 2 restart(s): ValueError: tensor parallel"
    trials = [
        Trial(id=0, epoch=0, role="baseline", config=BASE, outcome="ok", started_at=0.0, value=1.0),
        Trial(id=1, epoch=0, role="trial", config=BASE.with_(block_size=32), outcome="infeasible",
              reason=crash, failure="crash", started_at=1.0, finished_at=2.0),
    ]  # fmt: skip
    state = initial_state("vllm", TuningSettings(max_trials=4), BASE).model_copy(
        update={"phase": Phase.EXPLORING, "step": "RollingBack", "trials": trials, "target": BASE, "best": 0}
    )
    ok, reason, message = tuning_condition(state)
    assert (ok, reason) == (True, "Exploring")
    assert "rolling back to" in message and "1 of 4 trials spent" in message
    assert f"trial 1 infeasible: {crash}" in message
    wait = CapacityWait(config=BASE.with_(block_size=64), epoch=0, retry_at=100.0, reason="Insufficient GPU")
    paused = state.model_copy(update={"step": "Idle", "target": None, "capacity_wait": wait})
    ok, reason, message = tuning_condition(paused)
    assert (ok, reason) == (False, "NoCapacity") and "Insufficient GPU" in message


def test_the_tuning_condition_of_a_converged_run_names_the_best_and_what_it_does() -> None:
    from prefixtune.tuning.policy.messages import tuning_condition

    best = Trial(id=3, epoch=0, role="trial", config=BASE.with_(block_size=32), outcome="ok",
                 started_at=0.0, value=123.0)  # fmt: skip
    state = initial_state("vllm", TuningSettings(), BASE).model_copy(
        update={"phase": Phase.CONVERGED, "step": "Idle", "trials": [best], "best": 3, "note": "budget spent"}
    )
    ok, reason, message = tuning_condition(state)
    assert (ok, reason) == (False, "Converged") and message.startswith("budget spent; best [")
    assert message.endswith("value 123; applying it")
    watching = state.model_copy(update={"step": "Watching", "current": best.config})
    assert tuning_condition(watching)[2].endswith("; watching for drift")


def test_a_paused_resource_says_so_in_its_tuning_condition_at_its_generation() -> None:
    paused = initial_state("vllm", TuningSettings(paused=True), BASE).model_copy(
        update={"phase": Phase.PAUSED, "paused_from": Phase.EXPLORING}
    )
    status = S.build_status(paused, [], None, now=1.0, generation=4, ready=(True, "R", "m"))
    tuning = next(c for c in status["conditions"] if c["type"] == "Tuning")
    assert (tuning["status"], tuning["reason"], tuning["observedGeneration"]) == ("False", "Paused", 4)
    assert "paused by spec.tuning.paused" in tuning["message"] and status["phase"] == "Paused"
    off = initial_state("vllm", TuningSettings(mode="off"), BASE).model_copy(update={"phase": Phase.PAUSED})
    status = S.build_status(off, [], None, now=1.0, generation=4, ready=(True, "R", "m"))
    assert next(c for c in status["conditions"] if c["type"] == "Tuning")["reason"] == "TuningOff"


READY = (True, "ReplicasReady", "1/1")


def _gate_state(gate: GateRecord | None) -> PolicyState:
    sig = Signals(window_s=300, requests=2000, hit_rate=0.5)
    other = BASE.with_(block_size=32)
    trials = [
        Trial(id=i, epoch=0, role="baseline" if i == 0 else "trial", config=BASE if i == 0 else other,
              outcome="ok", started_at=1000.0 + i, finished_at=1001.0 + i, value=value, signals=sig)
        for i, value in enumerate((1000.0, 1150.0, 1152.0))
    ]  # fmt: skip
    s = initial_state("vllm", TuningSettings(), BASE)
    return s.model_copy(
        update={"phase": Phase.EXPLORING, "trials": trials, "best": 2, "next_trial_id": 3, "gate": gate}
    )


def test_the_best_config_shows_its_gain_the_margin_and_the_confidence_while_exploring() -> None:
    best = S.validate_status(
        S.build_status(_gate_state(None), [], None, now=2000.0, generation=1, ready=READY)
    ).best_config
    # Judged on the candidate's windows after the one that made it the best (1150): 1152 / 1000.
    assert best is not None and best.gain == pytest.approx(0.152)
    assert best.min_gain == 0.02 and best.required_confidence == 0.95
    assert best.confidence is not None and best.confidence > 0.95
    assert best.significant is None and best.candidate is None  # not decided yet


def test_the_best_config_shows_the_candidate_the_gate_kept_out() -> None:
    record = GateRecord(
        epoch=0, candidate=2, deployed=0, gain=0.016, min_gain=0.02, confidence=0.45, required=0.95,
        noise=0.03, significant=False,
    )  # fmt: skip
    state = _gate_state(record).model_copy(update={"best": 0, "phase": Phase.CONVERGED})
    best = S.validate_status(
        S.build_status(state, [], None, now=2000.0, generation=1, ready=READY)
    ).best_config
    assert best is not None and best.significant is False and best.confidence == 0.45
    assert best.candidate is not None and best.candidate.block_size == 32
    assert best.config.block_size == 16  # the deployed config stays the best

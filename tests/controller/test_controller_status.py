"""Status building: conditions with observedGeneration and transition times, trials, policy round-trip."""

from __future__ import annotations

from typing import Any

from prefixtune.api import parse_spec
from prefixtune.controller import render as R
from prefixtune.controller import status as S
from prefixtune.engines.base import KnobConfig
from prefixtune.metrics.diagnosis import diagnose
from prefixtune.metrics.signals import Signals
from prefixtune.tuning.actions import EmitEvent, Recommend, SetCondition
from prefixtune.tuning.phases import Phase
from prefixtune.tuning.policy import initial_state
from prefixtune.tuning.settings import TuningSettings
from prefixtune.tuning.state import MAX_TEXT, Trial

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
    # 12 vs the baseline's 10 on 100 requests each: likely, not certain, better
    assert model.best_config.confidence is not None and 0.8 < model.best_config.confidence < 0.99
    assert [t.index for t in model.trials] == [0, 1, 2]
    assert S.policy_state_of(status) == state
    assert status["diagnosis"]["hitRate"] == 0.6


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
    state = initial_state("vllm", TuningSettings(mode="observe"), BASE)
    rec = Recommend(BASE.with_(prefix_caching=False), "hit rate 1% < 5%")
    status = S.build_status(state, [rec], None, now=1.0, generation=1, ready=(True, "R", ""))
    assert status["recommendation"]["config"]["prefixCaching"] is False
    again = S.build_status(state, [], status, now=2.0, generation=1, ready=(True, "R", ""))
    assert again["recommendation"] == status["recommendation"]
    S.validate_status(again)


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
    state = state.model_copy(update={"trials": trials})  # type: ignore[attr-defined]
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
    assert [c["type"] for c in conditions] == ["Ready", "Degraded", "MetricsUnavailable"]
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

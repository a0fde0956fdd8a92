"""Observations from Deployment/pod states, the desired children, and spec -> settings."""

from __future__ import annotations

from typing import Any

from prefixtune.api import parse_spec
from prefixtune.controller.observe import desired, failure_kind, pod_view, rollout_observation
from prefixtune.controller.render import config_hash
from prefixtune.controller.settings import tuning_settings
from prefixtune.engines.base import KnobConfig
from prefixtune.routing.policy import Router
from prefixtune.tuning.policy import initial_state
from prefixtune.tuning.settings import TuningSettings
from prefixtune.tuning.state import PolicyState, Trial

BASE = KnobConfig(0.9, 16, True, "fcfs")
TRY = KnobConfig(0.85, 32, True, "fcfs")
NEXT = KnobConfig(0.8, 16, False, "fcfs")


def _state(strategy: str = "rolling", step: str = "RollingOut", role: str = "trial") -> PolicyState:
    s = initial_state("vllm", TuningSettings(strategy=strategy, warmup_s=1, measure_s=5), BASE)  # type: ignore[arg-type]
    trial = Trial(id=1, epoch=0, role=role, config=TRY if role == "trial" else BASE, started_at=100.0)  # type: ignore[arg-type]
    return s.model_copy(
        update={
            "phase": "Exploring", "step": step, "trials": [trial], "active": 1,
            "target": TRY if step in ("RollingOut", "WaitingReady") and role == "trial" else None,
            "measure_from": 200.0 if step == "Measuring" else None,
            "measure_until": 205.0 if step == "Measuring" else None,
        }
    )  # fmt: skip


def _pod(name: str, config: KnobConfig, *, role: str = "baseline", ready: bool = True, restarts: int = 0,
         waiting: str = "", message: str = "",
         started: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:  # fmt: skip
    state: dict[str, Any] = (
        {"waiting": {"reason": waiting, "message": message}}
        if waiting
        else {"running": {"startedAt": started}}
    )
    status: dict[str, Any] = {
        "phase": "Running",
        "podIP": "127.1.0.2",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [{"name": "engine", "restartCount": restarts, "state": state}],
    }
    if restarts:
        status["containerStatuses"][0]["lastState"] = {
            "terminated": {"reason": "Error", "exitCode": 1, "message": message}
        }
    labels = {"prefixtune.io/role": role, "prefixtune.io/config-hash": config_hash(config)}
    return {"metadata": {"name": name, "labels": labels}, "status": status}


def _dep(
    config: KnobConfig, replicas: int = 1, ready: int = 1, generation: int = 2, observed: int = 2
) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": replicas,
                 "template": {"metadata": {"labels": {"prefixtune.io/config-hash": config_hash(config)}}}},
        "status": {"observedGeneration": observed, "replicas": replicas, "updatedReplicas": ready,
                   "readyReplicas": ready, "availableReplicas": ready},
    }  # fmt: skip


def test_desired_follows_the_policy_state() -> None:
    assert desired(_state("rolling", "RollingOut")).baseline == TRY
    assert desired(_state("rolling", "RollingOut")).canary is None
    canary = desired(_state("canary", "Measuring"))
    assert canary.baseline == BASE and canary.canary == TRY and canary.subject == "canary"
    rolled = _state("rolling", "Measuring").model_copy(update={"current": TRY, "target": None})
    assert desired(rolled).baseline == TRY
    idle = _state("canary", "Idle").model_copy(update={"active": None})
    assert desired(idle) == type(canary)(baseline=BASE)


def test_rollout_applied_then_ready_only_when_every_new_pod_is_ready_and_old_ones_are_gone() -> None:
    s = _state()
    pods = [pod_view(_pod("a", TRY, ready=False)), pod_view(_pod("old", BASE))]
    obs = rollout_observation(s, {"baseline": _dep(TRY, ready=0)}, pods)
    assert obs is not None and obs.kind == "rollout_applied"
    obs = rollout_observation(
        s, {"baseline": _dep(TRY)}, [pod_view(_pod("a", TRY)), pod_view(_pod("old", BASE))]
    )
    assert obs is not None and obs.kind == "rollout_applied"  # the old pod is still there
    obs = rollout_observation(s, {"baseline": _dep(TRY)}, [pod_view(_pod("a", TRY))])
    assert obs is not None and obs.kind == "rollout_ready" and obs.config == TRY
    stale = _dep(TRY, generation=3, observed=2)
    assert rollout_observation(s, {"baseline": stale}, [pod_view(_pod("a", TRY))]).kind == "rollout_applied"  # type: ignore[union-attr]


def test_crash_loop_and_oom_are_rollout_failures() -> None:
    s = _state()
    crash = pod_view(_pod("a", TRY, ready=False, restarts=2, waiting="CrashLoopBackOff", message="boom"))
    obs = rollout_observation(s, {"baseline": _dep(TRY, ready=0)}, [crash])
    assert obs is not None and obs.kind == "rollout_failed" and obs.failure == "crash"
    assert "CrashLoopBackOff" in obs.reason
    oom = pod_view(_pod("a", TRY, ready=False, restarts=1, waiting="CrashLoopBackOff",
                        message="ValueError: out of memory at start-up: KV cache does not fit"))  # fmt: skip
    assert rollout_observation(s, {"baseline": _dep(TRY, ready=0)}, [oom]).failure == "oom_startup"  # type: ignore[union-attr]
    assert failure_kind(oom, reached_ready=True) == "oom_runtime"
    # Under load, after ready: a restart of the trial's pod is a runtime failure of the trial.
    measuring = _state(step="Measuring").model_copy(update={"current": TRY, "target": None})
    runtime = pod_view(_pod("a", TRY, restarts=1, message="torch.OutOfMemoryError: CUDA out of memory"))
    obs = rollout_observation(measuring, {"baseline": _dep(TRY)}, [runtime])
    assert obs is not None and obs.kind == "rollout_failed" and obs.failure == "oom_runtime"


def test_baseline_pod_restarted_mid_window_invalidates_the_window() -> None:
    s = _state(step="Measuring", role="baseline")
    fine = pod_view(_pod("a", BASE, started="1970-01-01T00:01:00Z"))  # started at t=60 < measure_from=200
    assert rollout_observation(s, {"baseline": _dep(BASE)}, [fine]) is None
    late = pod_view(_pod("a", BASE, started="1970-01-01T00:03:30Z"))  # t=210 > 200
    obs = rollout_observation(s, {"baseline": _dep(BASE)}, [late])
    assert obs is not None and obs.kind == "trial_invalidated"


def test_spec_to_settings_maps_every_field() -> None:
    spec = parse_spec(
        {
            "engine": "vllm", "model": "m/x", "replicas": 2,
            "tuning": {
                "mode": "observe", "paused": True, "objective": "throughput",
                "slo": {"ttftP99": "1500ms", "itlP99": "80ms"},
                "space": {"memoryFraction": {"min": 0.8, "max": 0.95}, "blockSize": [16, 32]},
                "trial": {"warmup": "1m", "measure": "5m", "minRequests": 50}, "budget": {"maxTrials": 7},
                "rollout": {"minInterval": "2m"}, "drift": {"threshold": 0.3},
            },
        }
    )  # fmt: skip
    s = tuning_settings(spec, "ns", "rag")
    assert (s.mode, s.paused, s.objective, s.strategy) == ("observe", True, "throughput", "canary")
    assert (s.slo.ttft_p99_s, s.slo.itl_p99_s) == (1.5, 0.08)
    assert s.space.memory_fraction == (0.8, 0.95) and s.space.block_size == (16, 32)
    assert s.space.schedule_policy is None
    assert (s.warmup_s, s.measure_s, s.min_requests, s.max_trials) == (60.0, 300.0, 50, 7)
    assert (s.min_interval_s, s.drift_threshold, s.seed_key) == (120.0, 0.3, "ns/rag")
    assert s.ready_timeout_s >= 600
    single = parse_spec({"engine": "vllm", "model": "m/x", "replicas": 1})
    assert tuning_settings(single, "ns", "a").strategy == "rolling"
    assert tuning_settings(single, "ns", "a").paused is False
    assert tuning_settings(single, "ns", "a", ready_timeout=30).ready_timeout_s == 30


def test_the_settings_name_the_resources_router_whose_knobs_the_search_may_tune() -> None:
    """spec.routing.router, else the engine's (SGLang behind sglang-router, vLLM behind vllm-router);
    with replicas >= 2 and routing listed, the space override carries the listed routing values."""
    spec = parse_spec(
        {
            "engine": "vllm", "model": "m/x", "replicas": 4,
            "tuning": {
                "space": {"routingPolicy": ["cache_aware", "consistent_hash"], "cacheThreshold": [0.2, 0.4]}
            },
        }
    )  # fmt: skip
    s = tuning_settings(spec, "ns", "a")
    assert s.router == Router.VLLM
    assert (s.space.routing_policy, s.space.cache_threshold) == (
        ("cache_aware", "consistent_hash"),
        (0.2, 0.4),
    )
    sglang = parse_spec({"engine": "sglang", "model": "m/x", "replicas": 2})
    assert tuning_settings(sglang, "ns", "a").router == Router.SGLANG
    chosen = parse_spec(
        {"engine": "sglang", "model": "m/x", "replicas": 2, "routing": {"router": "vllm-router"}}
    )
    assert tuning_settings(chosen, "ns", "a").router == Router.VLLM
    adopting = parse_spec({"engine": "vllm", "model": "m/x", "replicas": 2, "adopt": {"deployment": "team"}})
    assert tuning_settings(adopting, "ns", "a").router is None  # an adopting resource gets no router


async def test_the_meter_requires_the_operators_pod_labels_only_when_the_admin_says_so() -> None:
    """--prometheus-operator-labels: the window query selects namespace, pods and the operator's own
    pod labels (so a series of a pod it does not manage never counts); without it, namespace and pods."""
    import asyncio

    from prefixtune.controller.admin import AdminPolicy
    from prefixtune.controller.measure import Meter
    from prefixtune.controller.render import prometheus_labels

    spec = parse_spec({"engine": "vllm", "model": "m", "tuning": {"metrics": {"source": "prometheus"}}})
    state = initial_state("vllm", TuningSettings(warmup_s=1, measure_s=5), BASE)
    seen: list[dict[str, str]] = []

    class Recording(Meter):
        async def _prometheus(self, *args: Any) -> None:  # type: ignore[override]
            seen.append(dict(args[-1]))

    meter = Recording()
    on = AdminPolicy(prometheus_url="http://prom:9090", prometheus_operator_labels=True)
    off = AdminPolicy(prometheus_url="http://prom:9090")
    await meter.observe("u", spec, state, [], 0.0, admin=on, namespace="ns", name="rag")
    await meter.observe("u", spec, state, [], 0.0, admin=off, namespace="ns", name="rag")
    await asyncio.sleep(0)
    assert seen == [prometheus_labels("rag"), {}]


def _unschedulable(name: str, config: KnobConfig, role: str) -> dict[str, Any]:
    pod = _pod(name, config, role=role, ready=False)
    message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        ],
    }
    return pod


def test_a_rollout_pod_pending_for_a_gpu_is_no_capacity_not_a_failure() -> None:
    from prefixtune.tuning.state import RolloutNoCapacity

    for strategy, role in (("canary", "canary"), ("rolling", "baseline")):
        s = _state(strategy, "WaitingReady")
        pods = [pod_view(_pod("old", BASE)), pod_view(_unschedulable("new", TRY, role))]
        deps = {"baseline": _dep(BASE if role == "canary" else TRY), "canary": _dep(TRY, ready=0)}
        obs = rollout_observation(s, deps, pods)  # type: ignore[arg-type]
        assert isinstance(obs, RolloutNoCapacity), (strategy, obs)
        assert obs.config == TRY and "Insufficient nvidia.com/gpu" in obs.reason and "new" in obs.reason
    # A pod Pending while another of the rollout loads (a surge waiting for a GPU it frees) is not.
    pods = [pod_view(_pod("old", TRY)), pod_view(_unschedulable("new2", TRY, "baseline")),
            pod_view(_pod("new1", TRY, ready=False))]  # fmt: skip
    obs = rollout_observation(_state("rolling", "WaitingReady"), {"baseline": _dep(TRY, 2, 1)}, pods)  # type: ignore[arg-type]
    assert not isinstance(obs, RolloutNoCapacity)
    # A scheduled pod still loading is not no capacity.
    pods = [pod_view(_pod("old", BASE)), pod_view(_pod("new", TRY, role="canary", ready=False))]
    deps = {"baseline": _dep(BASE), "canary": _dep(TRY, ready=0)}
    obs = rollout_observation(_state("canary", "WaitingReady"), deps, pods)  # type: ignore[arg-type]
    assert not isinstance(obs, RolloutNoCapacity)


def test_scale_plan_brings_the_canary_up_before_the_stable_gives_a_replica() -> None:
    from prefixtune.controller.observe import Desired, Scale, scale_plan

    spec = parse_spec({"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 3})
    trial = Desired(baseline=BASE, canary=TRY)
    stable = [pod_view(_pod(f"b{i}", BASE)) for i in range(3)]
    loading = pod_view(_pod("c", TRY, role="canary", ready=False))
    serving = pod_view(_pod("c", TRY, role="canary"))
    assert scale_plan(spec, trial, [*stable, loading], True).baseline == 3  # nothing removed yet
    assert scale_plan(spec, trial, [*stable, serving], True).baseline == 2  # its replacement serves
    # The trial is over: the stable is restored first, the canary kept until it is back.
    done = Desired(baseline=BASE)
    two = [*stable[:2], serving]
    plan = scale_plan(spec, done, [*two, pod_view(_pod("b3", BASE, ready=False))], True)
    assert (plan.baseline, plan.keep_canary) == (3, True)
    assert not scale_plan(spec, done, [*stable, serving], True).keep_canary
    assert not scale_plan(spec, done, [*stable[:2], loading], True).keep_canary  # not serving: go
    # No GPU for the stable pod while the canary holds one and nothing loads: the canary must go.
    stuck = pod_view(_unschedulable("b3", BASE, "baseline"))
    assert not scale_plan(spec, done, [*two, stuck], True).keep_canary
    # ... but not while another stable pod loads (it frees a GPU once ready).
    assert scale_plan(spec, done, [*two, stuck, pod_view(_pod("b4", BASE, ready=False))], True).keep_canary
    # The next trial's config while the last trial's canary serves: the stable comes back first
    # (at full strength), the canary is kept as it is until then, and only then moves to the next
    # config (recreated: its old pod frees the GPU the new one takes).
    after = Desired(baseline=BASE, canary=NEXT)
    plan = scale_plan(spec, after, [*two, pod_view(_pod("b3", BASE, ready=False))], True)
    assert (plan.baseline, plan.keep_canary) == (3, True)
    assert not scale_plan(spec, after, [*stable, serving], True).keep_canary
    assert not scale_plan(spec, after, [*two, stuck], True).keep_canary
    assert not scale_plan(spec, after, [*stable[:2], loading], True).keep_canary  # not serving: go
    nxt = pod_view(_pod("c2", NEXT, role="canary"))
    assert scale_plan(spec, after, [*stable[:2], nxt], True) == Scale(2, 1)  # the next trial's serves


def test_a_rolling_trial_capped_below_the_replicas_runs_as_that_many_trial_pods() -> None:
    from prefixtune.controller.render import replicas_for, rolling_subset, trial_replicas

    def spec(**rollout: Any) -> Any:
        return parse_spec(
            {"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 4,
             "tuning": {"rollout": {"strategy": "rolling", **rollout}}}
        )  # fmt: skip

    capped = spec(maxTrialReplicas=2)
    assert rolling_subset(capped) == 2 and trial_replicas(capped) == 2
    assert tuning_settings(capped, "ns", "a").strategy == "canary"
    assert replicas_for(capped, "canary", True) == 2
    assert [replicas_for(capped, "baseline", True, n) for n in (0, 1, 2, 5)] == [4, 3, 2, 2]
    for uncapped in (spec(), spec(maxTrialReplicas=4), spec(maxTrialReplicas=9)):
        assert rolling_subset(uncapped) is None
        assert tuning_settings(uncapped, "ns", "a").strategy == "rolling"


def _crash_looping(name: str, config: KnobConfig, exit_message: str, reason: str = "Error") -> dict[str, Any]:
    """A pod as the kubelet reports it in CrashLoopBackOff: the kubelet's own back-off message in
    state.waiting, the engine's exit message in lastState.terminated."""
    backoff = f"back-off 40s restarting failed container=engine pod={name}_default(uid)"
    pod = _pod(name, config, ready=False, restarts=3, waiting="CrashLoopBackOff", message=backoff)
    last: dict[str, Any] = {"reason": reason, "exitCode": 1}
    if exit_message:
        last["message"] = exit_message
    pod["status"]["containerStatuses"][0]["lastState"] = {"terminated": last}
    return pod


def test_the_engines_exit_message_reaches_the_trial_reason_and_the_ready_condition() -> None:
    """Issue 18: a crash reason (weights that do not fit, an unsupported GPU count) was in the pod's
    terminated message only; the kubelet's back-off message hid it. It is bounded and printable."""
    from prefixtune.controller.execute import Children, ready_condition
    from prefixtune.controller.observe import MAX_POD_MESSAGE
    from prefixtune.controller.status import build_status
    from prefixtune.tuning.phases import Phase, Step
    from prefixtune.tuning.policy import step

    fit = "ValueError: model weights (70.6 GiB per GPU at TP=1) do not fit in H100-80GB"
    noisy = "Traceback (most recent call last):\n" + "  File x\x1b[31m\r\n" * 300 + fit + "\x00\x07"
    pod = pod_view(_crash_looping("a-7f", TRY, noisy))
    assert pod.message.endswith(fit) and "back-off" not in pod.message
    assert len(pod.message) <= MAX_POD_MESSAGE and pod.message.isprintable()
    s = _state().model_copy(update={"phase": Phase.EXPLORING, "step": Step.ROLLING_OUT})
    obs = rollout_observation(s, {"baseline": _dep(TRY, ready=0)}, [pod])
    assert obs is not None and obs.kind == "rollout_failed" and obs.failure == "crash"
    assert fit in obs.reason and "CrashLoopBackOff (Error), 3 restart(s)" in obs.reason
    # The trial's reason and the Tuning condition carry it (the policy records the trial infeasible)
    after, _ = step(s, obs, 300.0)
    status = build_status(after, [], None, now=300.0, generation=1, ready=(False, "R", ""))
    assert fit in status["trials"][-1]["reason"] and status["trials"][-1]["outcome"] == "infeasible"
    tuning = next(c for c in status["conditions"] if c["type"] == "Tuning")
    assert fit in tuning["message"]
    # The Ready condition of a resource whose only pods fail (a baseline that cannot start)
    spec = parse_spec({"engine": "vllm", "model": "m/x", "gpu": {"count": 4}})
    tp = "ValueError: tensor parallel size (--tp / tensor_parallel) must be 1..2; got 4"
    failing = pod_view(_crash_looping("b-1", BASE, tp))
    ok, reason, message = ready_condition(spec, Children({"baseline": _dep(BASE, ready=0)}, [failing]))
    assert (ok, reason) == (False, "EngineFailing")
    assert message.startswith("0/1 engine pods ready; pod b-1: CrashLoopBackOff (Error)") and tp in message
    healthy = pod_view(_pod("b-2", BASE))
    assert ready_condition(spec, Children({"baseline": _dep(BASE)}, [healthy]))[:2] == (True, "ReplicasReady")


def test_an_oom_kill_without_a_message_is_an_oom() -> None:
    killed = pod_view(_crash_looping("a", TRY, "", reason="OOMKilled"))
    assert killed.last_reason == "OOMKilled" and failure_kind(killed, reached_ready=False) == "oom_startup"
    obs = rollout_observation(_state(), {"baseline": _dep(TRY, ready=0)}, [killed])
    assert obs is not None and obs.failure == "oom_startup" and "(OOMKilled)" in obs.reason

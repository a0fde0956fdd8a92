"""In the sandbox: the engine Deployment changed under a trial (``kubectl scale`` to 0 and ``set
image``) is restored and the trial re-measured; a spec edited to an invalid value mid-canary aborts
the trial, restores the stable config on every replica, and tuning resumes once it is fixed; a
resource scaled through its scale subresource mid-canary (what an HPA does) keeps its epoch and trial.

Short on purpose: each test stops once it has seen what it checks, not at convergence. The waits
follow the sandbox's clock (``Cluster.wait_for``), so a busy machine makes them slower, not wrong.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.e2e.test_e2e_tuning import MODEL, SDEP, Cluster, resource, running_cluster

from prefixtune.controller.drift import DRIFT_REASON, RESTORED_REASON
from prefixtune.controller.render import LABEL_CONFIG_HASH, config_hash
from prefixtune.controller.status import policy_state_of
from prefixtune.sandbox.clock import HANG_GUARD_S
from prefixtune.sandbox.kubelet import KubeletConfig
from prefixtune.tuning.phases import TRIAL_STEPS, Step, watching
from prefixtune.tuning.policy._core import SPEC_INVALID
from prefixtune.tuning.state import PolicyState

pytestmark = pytest.mark.timeout(HANG_GUARD_S)
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"


@pytest.fixture
async def live_cluster() -> AsyncIterator[Cluster]:
    cfg = KubeletConfig(startup_delay_s=10.0, probe_period_s=1.0, backoff_initial_s=10.0)
    async with running_cluster(cfg) as running:
        yield running


def _tuning(strategy: str, max_trials: int, measure: str) -> dict[str, Any]:
    return {
        "slo": {"ttftP99": "2s", "itlP99": "100ms"},
        "space": {"memoryFraction": {"min": 0.8, "max": 0.85}, "blockSize": [16, 32]},
        "trial": {"warmup": "1s", "measure": measure, "minRequests": 4},
        "budget": {"maxTrials": max_trials},
        "rollout": {"minInterval": "0s", "strategy": strategy},
        "drift": {"threshold": 1.0},
    }


def _container(dep: dict[str, Any] | None) -> dict[str, Any]:
    return dict(((dep or {}).get("spec") or {})["template"]["spec"]["containers"][0])


def _template_hash(dep: dict[str, Any] | None) -> str | None:
    labels = (((dep or {}).get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}
    return labels.get(LABEL_CONFIG_HASH)


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


async def _trial_in_flight(cluster: Cluster, name: str, steps: frozenset[Step]) -> PolicyState | None:
    state = policy_state_of(await cluster.status(name))
    if state is None or state.active is None or state.step not in steps:
        return None
    return state if state.trial(state.active).role == "trial" else None


async def test_an_engine_deployment_scaled_to_zero_with_another_image_is_restored_and_remeasured(
    live_cluster: Cluster,
) -> None:
    cluster = live_cluster
    spec = {
        "engine": "vllm", "model": MODEL, "replicas": 1,
        "config": {"memoryFraction": 0.9, "blockSize": 16, "prefixCaching": True},
        "tuning": _tuning("rolling", 1, "12s"),
    }  # fmt: skip
    await cluster.apply(resource("live", spec, "rag", rate=0.3))

    async def early_in_a_trial_window() -> PolicyState | None:
        state = await _trial_in_flight(cluster, "live", frozenset({Step.WARMING_UP, Step.MEASURING}))
        if state is None or (
            state.step == Step.MEASURING and (state.measure_until or 0) - cluster.sb.clock.now() < 6
        ):
            return None  # too near its end to be sure the operator sees the change first
        return state

    before = await cluster.wait_for(early_in_a_trial_window, 150, "a trial early in its window", every_s=0.3)
    trial_id = before.active
    assert trial_id is not None
    # The operator's own rollouts (the trial's rolling update) never read as drift.
    assert not [e for e in await cluster.events("live") if e.get("reason") == DRIFT_REASON]
    dep = await cluster.deployment("live")
    image = _container(dep)["image"]
    container = {**_container(dep), "image": "registry.example/other-engine:latest"}
    # What `kubectl scale --replicas=0` and `kubectl set image` write to the Deployment.
    await cluster.sb.api.merge_patch(
        f"{DEPLOYMENTS}/live", {"spec": {"replicas": 0, "template": {"spec": {"containers": [container]}}}}
    )

    async def restored_and_remeasured() -> PolicyState | None:
        dep = await cluster.deployment("live")
        state = policy_state_of(await cluster.status("live"))
        if dep is None or state is None or dep["spec"]["replicas"] != 1 or _container(dep)["image"] != image:
            return None
        return state if state.trial(trial_id).invalidations >= 1 else None

    state = await cluster.wait_for(
        restored_and_remeasured, 60, "the Deployment restored, the trial invalidated"
    )
    assert state.trial(trial_id).outcome == "running"  # re-measured on the restored pods, not scored
    events = await cluster.events("live")
    drift = [e for e in events if e.get("reason") == DRIFT_REASON]
    assert drift and drift[0]["type"] == "Warning"
    assert "spec.replicas" in drift[0]["message"] and "containers[engine].image" in drift[0]["message"]
    assert "registry.example" not in drift[0]["message"]  # field names, not the values someone wrote
    remeasured = [e for e in events if e.get("reason") == "TrialRemeasured"]
    assert any("changed outside the operator" in e["message"] for e in remeasured)

    async def condition_cleared() -> dict[str, Any] | None:
        degraded = _condition(await cluster.status("live"), "Degraded")
        return degraded if degraded.get("reason") == RESTORED_REASON else None

    # Degraded=True (LiveDrift) while it lasted; cleared once the pods run the rendering again
    # (only a LiveDrift condition is ever cleared with this reason).
    degraded = await cluster.wait_for(condition_cleared, 60, "the Degraded condition to clear")
    assert degraded["status"] == "False"


async def test_an_invalid_spec_mid_canary_restores_the_baseline_and_tuning_resumes_once_fixed(
    live_cluster: Cluster,
) -> None:
    cluster = live_cluster
    spec = {
        "engine": "vllm", "model": MODEL, "replicas": 2,
        "config": {"memoryFraction": 0.9, "blockSize": 16, "prefixCaching": True},
        "tuning": _tuning("canary", 2, "8s"),
    }  # fmt: skip
    await cluster.apply(resource("can", spec, "rag", rate=0.4))

    async def canary_trial() -> PolicyState | None:
        state = await _trial_in_flight(cluster, "can", TRIAL_STEPS)
        if state is None or await cluster.deployment("can-canary") is None:
            return None
        base = await cluster.deployment("can")
        return state if base is not None and base["spec"]["replicas"] == 1 else None

    before = await cluster.wait_for(canary_trial, 150, "a canary trial", every_s=0.3)
    aborted_id, safe = before.active, config_hash(before.current)
    assert aborted_id is not None
    path = f"{SDEP}/namespaces/default/servingdeployments/can"
    await cluster.sb.api.merge_patch(path, {"spec": {"config": {"blockSize": 7}}})

    async def restored() -> dict[str, Any] | None:
        status = await cluster.status("can")
        ready = _condition(status, "Ready")
        base = await cluster.deployment("can")
        if ready.get("reason") != "InvalidSpec" or await cluster.deployment("can-canary") is not None:
            return None
        if base is None or base["spec"]["replicas"] != 2 or _template_hash(base) != safe:
            return None
        return status

    status = await cluster.wait_for(restored, 60, "the canary removed and the baseline restored")
    assert _condition(status, "Ready")["status"] == "False"
    assert "spec.config.blockSize" in _condition(status, "Ready")["message"]
    state = policy_state_of(status)
    assert state is not None
    aborted = state.trial(aborted_id)
    assert aborted.outcome == "aborted" and aborted.failure == SPEC_INVALID and aborted.value is None
    reasons = {e.get("reason") for e in await cluster.events("can")}
    assert {"InvalidSpec", "TrialAborted"} <= reasons
    assert DRIFT_REASON not in reasons  # the canary's creation, the scale-down and back: none is drift

    await cluster.sb.api.merge_patch(path, {"spec": {"config": {"blockSize": 16}}})

    async def resumed() -> PolicyState | None:
        status = await cluster.status("can")
        state = policy_state_of(status)
        if state is None or _condition(status, "Ready").get("reason") == "InvalidSpec":
            return None
        later = [t for t in state.trials if t.role == "trial" and t.id > aborted_id]
        return state if later else None

    state = await cluster.wait_for(resumed, 90, "tuning to resume with a new trial", follow="can")
    assert state.trial(aborted_id) == aborted  # kept as it was: recorded once, as aborted
    assert state.epoch == before.epoch  # the same search, resumed


async def test_a_canary_resource_scaled_through_the_scale_subresource_mid_trial_keeps_its_tuning(
    live_cluster: Cluster,
) -> None:
    """What an HPA does (a write to .../scale) in the middle of a canary trial: the stable Deployment
    follows (scaled, not re-rolled), the canary stays, the epoch and the trial stay (the trial is
    re-measured, then recorded under its own id), and nothing is scaled back afterwards."""
    cluster = live_cluster
    tuning = {**_tuning("canary", 1, "10s"), "trial": {"warmup": "1s", "measure": "10s", "minRequests": 3}}
    # No router: this is about the scale subresource under a canary. Behind vllm-router's
    # cache_aware (what auto picks for two vLLM replicas caching prefixes) the canary's share of
    # this RAG stream is the router's decision, and with the documents cached on the stable pod it
    # is none: the trial is invalidated for too little traffic (docs/routing.md, "Canaries").
    spec = {
        "engine": "vllm", "model": MODEL, "replicas": 2,
        "config": {"memoryFraction": 0.9, "blockSize": 16, "prefixCaching": True},
        "routing": {"policy": "kube-proxy"},
        "tuning": tuning,
    }  # fmt: skip
    await cluster.apply(resource("hpa", spec, "rag", rate=1.0))
    path = f"{SDEP}/namespaces/default/servingdeployments/hpa"

    async def canary_window() -> PolicyState | None:
        state = await _trial_in_flight(cluster, "hpa", frozenset({Step.WARMING_UP, Step.MEASURING}))
        base = await cluster.deployment("hpa")
        if state is None or await cluster.deployment("hpa-canary") is None or base is None:
            return None
        return state if base["spec"]["replicas"] == 1 else None

    before = await cluster.wait_for(canary_window, 150, "a canary trial in its window", every_s=0.3)
    trial_id, stable, epoch = before.active, config_hash(before.current), before.epoch
    assert trial_id is not None
    canary = _template_hash(await cluster.deployment("hpa-canary"))
    finished = {t.id: t.outcome for t in before.trials if t.outcome != "running"}
    scale = await cluster.sb.api.get(f"{path}/scale")
    assert scale is not None and (scale["kind"], scale["spec"]["replicas"]) == ("Scale", 2)
    assert scale["status"]["selector"] == "prefixtune.io/resource=hpa"
    await cluster.sb.api.merge_patch(f"{path}/scale", {"spec": {"replicas": 3}})

    async def followed() -> PolicyState | None:
        status = await cluster.status("hpa")
        state = policy_state_of(status)
        base, can = await cluster.deployment("hpa"), await cluster.deployment("hpa-canary")
        if state is None or state.replicas != 3 or base is None or base["spec"]["replicas"] != 2:
            return None
        if status.get("replicas") != 3 or can is None or _template_hash(can) != canary:
            return None
        return state

    state = await cluster.wait_for(followed, 60, "the stable Deployment at 3 - 1 canary, all pods up")
    assert _template_hash(await cluster.deployment("hpa")) == stable  # scaled, not re-rolled
    assert state.epoch == epoch and state.trial(trial_id).outcome == "running"
    assert {t.id: t.outcome for t in state.trials if t.id in finished} == finished

    async def settled() -> PolicyState | None:
        state = policy_state_of(await cluster.status("hpa"))
        base = await cluster.deployment("hpa")
        if state is None or not watching(state.phase, state.step) or base is None:
            return None
        if await cluster.deployment("hpa-canary") is not None or base["spec"]["replicas"] != 3:
            return None
        return state

    state = await cluster.wait_for(settled, 120, "converged on 3 stable replicas", follow="hpa")
    trial = state.trial(trial_id)
    assert (trial.outcome, trial.epoch, trial.config) == ("ok", epoch, before.trial(trial_id).config)
    assert state.epoch == epoch and trial.invalidations >= 1  # the window spanning the scale was redone
    reasons = [e.get("reason") for e in await cluster.events("hpa")]
    assert "Scaled" in reasons and "TrialRemeasured" in reasons
    assert "DeploymentChanged" not in reasons and DRIFT_REASON not in reasons
    await asyncio.sleep(3)  # more reconciles (the operator ticks every second): nothing scales back
    resource_now, scale = await cluster.get("hpa"), await cluster.sb.api.get(f"{path}/scale")
    base = await cluster.deployment("hpa")
    assert resource_now is not None and resource_now["spec"]["replicas"] == 3
    assert scale is not None and (scale["spec"]["replicas"], scale["status"]["replicas"]) == (3, 3)
    assert base is not None and base["spec"]["replicas"] == 3

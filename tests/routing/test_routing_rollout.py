"""A rollout waits for the router: a routing trial is ready when the router runs the trial's routing,
the router's Deployment is read with the engines', and its readiness re-runs the ensure."""

from __future__ import annotations

from typing import Any

from bench._reliability_tenant import MODEL, harness, resource
from prefixtune.api import parse_spec
from prefixtune.controller.execute import Children, read_children
from prefixtune.controller.observe import (
    Desired,
    Scale,
    desired,
    pod_view,
    rollout_observation,
    router_rollout,
)
from prefixtune.controller.reconcile import ensure_key
from prefixtune.controller.render import Owner, config_hash
from prefixtune.routing.render import LABEL_ROUTING_HASH, routing_hash, settings_for
from prefixtune.tuning.policy import initial_state
from prefixtune.tuning.settings import TuningSettings
from prefixtune.tuning.state import PolicyState, RolloutApplied, RolloutReady, Trial

SPEC = parse_spec({"engine": "sglang", "model": MODEL, "replicas": 2, "routing": {"policy": "cache_aware"}})
BASE = SPEC.knob_config()
TRIAL = BASE.with_(routing_policy="round_robin")


def _state(step: str = "RollingOut") -> PolicyState:
    s = initial_state("sglang", TuningSettings(warmup_s=1, measure_s=5), BASE, replicas=2)
    trial = Trial(
        id=1, epoch=0, role="trial", config=TRIAL, started_at=100.0, strategy="rolling", router_only=True
    )
    return s.model_copy(
        update={"phase": "Exploring", "step": step, "trials": [trial], "active": 1, "target": TRIAL}
    )


def _engines(ready: int = 2) -> dict[str, Any]:
    digest = config_hash(TRIAL)  # the engine knobs only: a routing trial leaves it as it was
    return {
        "metadata": {"generation": 1},
        "spec": {"replicas": 2, "template": {"metadata": {"labels": {"prefixtune.io/config-hash": digest}}}},
        "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": ready,
                   "readyReplicas": ready, "availableReplicas": ready},
    }  # fmt: skip


def _router(digest: str, available: int = 1, generation: int = 2, observed: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"name": "chat-router", "generation": generation},
        "spec": {"replicas": 1, "template": {"metadata": {"labels": {LABEL_ROUTING_HASH: digest}}}},
        "status": {"observedGeneration": observed, "replicas": 1, "updatedReplicas": available,
                   "readyReplicas": available, "availableReplicas": available},
    }  # fmt: skip


def _pods() -> list[Any]:
    labels = {"prefixtune.io/role": "baseline", "prefixtune.io/config-hash": config_hash(TRIAL)}
    status = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [],
    }
    return [
        pod_view({"metadata": {"name": f"chat-{i}", "labels": labels}, "status": status}) for i in range(2)
    ]


def _observe(router: dict[str, Any] | None, step: str = "RollingOut") -> object:
    state = _state(step)
    return rollout_observation(
        state,
        {"baseline": _engines(), "canary": None},
        _pods(),
        router_rollout(SPEC, desired(state), router, state.current),
    )


NEW = routing_hash(settings_for(SPEC, TRIAL))
OLD = routing_hash(settings_for(SPEC, BASE))


def test_during_a_routing_trial_the_router_renders_the_trials_routing() -> None:
    want = desired(_state())
    assert settings_for(SPEC, want.baseline).policy == "round_robin"
    rollout = router_rollout(SPEC, want, None, BASE)
    assert rollout is not None and rollout.digest == NEW != OLD


def test_a_routing_trial_is_not_ready_while_the_old_router_still_runs() -> None:
    assert isinstance(_observe(_router(OLD)), RolloutApplied)
    assert _observe(_router(OLD), step="WaitingReady") is None


def test_a_routing_trial_is_not_ready_before_its_router_is_available() -> None:
    assert _observe(None, step="WaitingReady") is None
    assert _observe(_router(NEW, available=0), step="WaitingReady") is None
    assert _observe(_router(NEW, observed=1), step="WaitingReady") is None  # the new spec not seen yet


def test_a_routing_trial_is_ready_once_its_router_is_available() -> None:
    assert _observe(_router(NEW), step="WaitingReady") == RolloutReady(config=TRIAL)


def test_a_config_without_a_router_waits_for_the_engines_only() -> None:
    spec = parse_spec(
        {"engine": "sglang", "model": MODEL, "replicas": 2, "routing": {"policy": "kube-proxy"}}
    )
    assert router_rollout(spec, Desired(baseline=spec.knob_config()), None, BASE) is None


def test_a_rollout_that_keeps_the_routing_does_not_wait_for_the_router() -> None:
    """An engine trial behind a router that is down: the Service sends to the engine pods meanwhile,
    and the router's state says nothing about the engines' config (never a timeout of the trial)."""
    engine_trial = BASE.with_(block_size=32)
    assert router_rollout(SPEC, Desired(baseline=engine_trial), None, BASE) is None


def test_a_rollback_of_a_routing_trial_waits_for_the_previous_routings_router() -> None:
    rollout = router_rollout(SPEC, Desired(baseline=BASE), None, TRIAL)
    assert rollout is not None and rollout.digest == OLD


def test_the_ensure_runs_again_when_a_router_pod_becomes_ready() -> None:
    want, scale = Desired(baseline=BASE), Scale(2, 0)
    deployments: dict[str, Any] = {"baseline": _engines(), "canary": None}
    waiting = Children(deployments, router=_router(OLD, available=0))  # type: ignore[arg-type]
    ready = Children(deployments, router=_router(OLD))  # type: ignore[arg-type]
    assert ensure_key(1, want, scale, waiting) != ensure_key(1, want, scale, ready)


async def test_the_routers_deployment_is_read_with_the_engines() -> None:
    async with harness() as h:
        created = await h.apply(resource("chat", {"engine": "sglang", "model": MODEL, "replicas": 2}))
        await h.reconcile("chat")
        children = await read_children(h.ctx.client, Owner("default", "chat", created["metadata"]["uid"]))
        assert children.router is not None and children.router["metadata"]["name"] == "chat-router"
        labels = children.router["spec"]["template"]["metadata"]["labels"]
        spec = parse_spec(created["spec"])
        assert labels[LABEL_ROUTING_HASH] == routing_hash(settings_for(spec, spec.knob_config()))

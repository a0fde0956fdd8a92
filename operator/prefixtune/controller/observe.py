"""Observations from the cluster: what the children should be, and what the pods say about a rollout.

Pure functions over plain manifests (the Deployment and Pod objects as the API returns them) and the
policy state. The shell lists the objects; these functions decide which observation to feed the
policy (rollout applied / ready / failed, trial invalidated), so the decisions are unit-testable.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefixtune.api.models import ServingDeploymentSpec
from prefixtune.controller.render import (
    LABEL_CONFIG_HASH,
    LABEL_ROLE,
    DeploymentRole,
    config_hash,
    replicas_for,
    template_hash,
    trial_replicas,
)
from prefixtune.engines.base import KnobConfig
from prefixtune.tuning.phases import ROLLOUT_STEPS, TRIAL_STEPS, WINDOW_STEPS, Step
from prefixtune.tuning.state import (
    Observation,
    PolicyState,
    RolloutApplied,
    RolloutFailed,
    RolloutNoCapacity,
    RolloutReady,
    TrialInvalidated,
)

OOM_PATTERN = re.compile(r"out of memory|outofmemory|oomkilled|\boom\b")
# A pod's message (the engine's own terminationMessage, the kubelet's waiting message) is the
# engine's output, not ours: control characters are dropped, whitespace runs folded, and at most
# this many characters kept, the end of it (an engine's error is its last line: a traceback ends
# with the exception). It reaches trial reasons, the Ready condition and Events.
MAX_POD_MESSAGE = 400
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]+")


def pod_message(text: str, limit: int = MAX_POD_MESSAGE) -> str:
    """A pod's message as the status may show it: printable, one line, at most ``limit`` characters
    (the tail, marked when cut)."""
    flat = " ".join(_UNPRINTABLE.sub(" ", text).split())
    if len(flat) <= limit:
        return flat
    marker = "(truncated) ... "
    return marker + flat[len(flat) - (limit - len(marker)) :]


@dataclass(frozen=True)
class Desired:
    """The configs the Deployments should run now (canary None: no canary Deployment)."""

    baseline: KnobConfig
    canary: KnobConfig | None = None

    @property
    def subject(self) -> DeploymentRole:
        """The Deployment a rollout in flight is waiting on."""
        return "canary" if self.canary is not None else "baseline"

    def config_of(self, role: DeploymentRole) -> KnobConfig | None:
        return self.baseline if role == "baseline" else self.canary


def desired(state: PolicyState) -> Desired:
    """Level-triggered rollout: the children follow the policy state, so a rollout interrupted by an
    operator restart is completed (not lost, not repeated) on the next reconcile."""
    trial = None if state.active is None else state.trial(state.active)
    canary_trial = (
        trial is not None
        and state.strategy_of(trial) == "canary"  # a routing trial serves every pod: no canary
        and trial.role == "trial"
        and state.step in TRIAL_STEPS
    )
    if canary_trial:
        assert trial is not None
        return Desired(baseline=state.current, canary=trial.config)
    return Desired(baseline=state.target if state.target is not None else state.current)


def _epoch(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class PodView:
    """What the controller needs to know about one engine pod."""

    name: str
    ip: str
    role: str
    config_hash: str
    ready: bool
    restarts: int
    waiting_reason: str = ""
    terminated_reason: str = ""
    last_reason: str = ""  # lastState.terminated.reason: why the previous run ended (Error, OOMKilled)
    message: str = ""  # bounded and printable (``pod_message``)
    phase: str = ""
    started_at: float | None = None  # the running container's start (epoch seconds)
    deleting: bool = False
    unschedulable: str = ""  # the scheduler's message while the pod cannot be placed (no free GPU)

    @property
    def crashed(self) -> bool:
        return (
            self.restarts > 0
            or self.waiting_reason
            in ("CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError")
            or self.phase == "Failed"
            or bool(self.terminated_reason)
        )


def pod_view(pod: Mapping[str, Any]) -> PodView:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    labels = meta.get("labels") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or ()}
    unschedulable = next(
        (
            str(c.get("message") or "Unschedulable")
            for c in status.get("conditions") or ()
            if c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
        ),
        "",
    )
    statuses = status.get("containerStatuses") or []
    container = statuses[0] if statuses else {}
    state = container.get("state") or {}
    last = (container.get("lastState") or {}).get("terminated") or {}
    terminated = state.get("terminated") or {}
    waiting = state.get("waiting") or {}
    running = state.get("running") or {}
    # The container's own exit message first: in CrashLoopBackOff the waiting message is the
    # kubelet's "back-off 10s restarting failed container", and the engine's error is the last exit's.
    message = str(terminated.get("message") or last.get("message") or waiting.get("message") or "")
    return PodView(
        name=str(meta.get("name", "")),
        ip=str(status.get("podIP") or ""),
        role=str(labels.get(LABEL_ROLE, "")),
        config_hash=str(labels.get(LABEL_CONFIG_HASH, "")),
        ready=conditions.get("Ready") == "True",
        restarts=int(container.get("restartCount") or 0),
        waiting_reason=str(waiting.get("reason") or ""),
        terminated_reason=str(terminated.get("reason") or ""),
        last_reason=str(last.get("reason") or ""),
        message=pod_message(message),
        phase=str(status.get("phase") or ""),
        started_at=_epoch(running.get("startedAt")),
        deleting=bool(meta.get("deletionTimestamp")),
        unschedulable=unschedulable,
    )


def failure_kind(pod: PodView, reached_ready: bool) -> str:
    """crash | oom_startup | oom_runtime, from the container's exit message (the engine's own error)."""
    text = f"{pod.terminated_reason} {pod.last_reason} {pod.message}".lower()
    if OOM_PATTERN.search(text):
        return "oom_runtime" if reached_ready else "oom_startup"
    return "crash"


def failure_detail(pod: PodView) -> str:
    """``pod NAME: CrashLoopBackOff (Error), 3 restart(s): <the engine's exit message>``."""
    why = pod.waiting_reason or pod.terminated_reason or "restarted"
    last = pod.last_reason if pod.last_reason and pod.last_reason != why else ""
    detail = f"pod {pod.name}: {why}" + (f" ({last})" if last else "") + f", {pod.restarts} restart(s)"
    if pod.message:
        detail += f": {pod.message}"
    return detail


def deployment_ready(deployment: Mapping[str, Any] | None, expected_hash: str) -> bool:
    """The Deployment runs ``expected_hash`` on every replica, all ready, no old pods left."""
    if deployment is None or template_hash(deployment) != expected_hash:
        return False
    meta = deployment.get("metadata") or {}
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    replicas = int(spec.get("replicas", 1))
    observed = int(status.get("observedGeneration") or 0)
    if observed < int(meta.get("generation") or 1):
        return False
    return (
        int(status.get("updatedReplicas") or 0) >= replicas
        and int(status.get("readyReplicas") or 0) >= replicas
        and int(status.get("availableReplicas") or 0) >= replicas
        and int(status.get("replicas") or 0) <= replicas
    )


def pods_of(pods: Sequence[PodView], role: DeploymentRole, digest: str | None = None) -> list[PodView]:
    return [
        p for p in pods if p.role == role and not p.deleting and (digest is None or p.config_hash == digest)
    ]


@dataclass(frozen=True)
class Scale:
    """The replicas of the Deployments now. ``keep_canary``: the canary Deployment is left as it is
    (not re-rendered, not deleted): its pods of an earlier config still serve and stay until the
    stable Deployment is back at full strength, whether no canary is wanted any more or the next
    trial's config is (it is applied then, and the old pods go first: ``render.deployment_strategy``)."""

    baseline: int
    canary: int
    keep_canary: bool = False


def scale_plan(
    spec: ServingDeploymentSpec, want: Desired, pods: Sequence[PodView], canary_exists: bool
) -> Scale:
    """Canary up first, as Argo Rollouts does: the stable Deployment gives up a replica only for a
    trial pod that is ready; a canary ends, or moves to the next trial's config, only once the
    stable pods it gave replicas to are ready again. The exception: stable pods that cannot be
    scheduled (no free GPU: the canary holds it), with none loading, let the canary go, or the
    stable could never come back (one replica short while it loads: the cost of running a canary
    without a spare GPU)."""
    moved = trial_replicas(spec)
    if want.canary is None:
        wanted, baseline = None, spec.replicas
    else:
        wanted = config_hash(want.canary)
        ready = sum(1 for p in pods_of(pods, "canary", wanted) if p.ready)
        baseline = replicas_for(spec, "baseline", True, ready)
    earlier = [p for p in pods_of(pods, "canary") if p.config_hash != wanted]
    if not canary_exists or not any(p.ready for p in earlier):
        return Scale(baseline, moved)
    stable = pods_of(pods, "baseline", config_hash(want.baseline))
    back = sum(1 for p in stable if p.ready) >= spec.replicas
    waiting = [p for p in pods_of(pods, "baseline") if not p.ready]
    # Stuck: a stable pod cannot be placed and none is loading that would free a GPU once ready.
    stuck = any(p.unschedulable for p in waiting) and all(p.unschedulable for p in waiting)
    return Scale(baseline, moved, keep_canary=not (back or stuck))


def rollout_observation(
    state: PolicyState,
    deployments: Mapping[DeploymentRole, Mapping[str, Any] | None],
    pods: Sequence[PodView],
) -> Observation | None:
    """What the pods say about the rollout or trial in flight; None when there is nothing to report."""
    want = desired(state)
    role = want.subject
    config = want.config_of(role)
    assert config is not None
    digest = config_hash(config)
    mine = pods_of(pods, role, digest)
    if state.step in ROLLOUT_STEPS:
        for pod in mine:
            if pod.crashed:
                return RolloutFailed(
                    config=config,
                    failure=failure_kind(pod, reached_ready=False),
                    reason=failure_detail(pod),
                )
        waiting = [p for p in mine if not p.ready]
        if waiting and all(p.unschedulable for p in waiting):
            # No node has the GPUs, and no pod of the rollout is loading that would free one once
            # ready (a surge waits for that): the cluster's state, not the config's (never infeasible).
            pod = waiting[0]
            return RolloutNoCapacity(config=config, reason=f"pod {pod.name}: {pod.unschedulable}")
        dep = deployments.get(role)
        others = [p for p in pods_of(pods, role) if p.config_hash != digest]
        ready_pods = [p for p in mine if p.ready]
        replicas = int(((dep or {}).get("spec") or {}).get("replicas", 1))
        if deployment_ready(dep, digest) and not others and len(ready_pods) >= replicas:
            return RolloutReady(config=config)
        if state.step == Step.ROLLING_OUT and dep is not None and template_hash(dep) == digest:
            return RolloutApplied(config=config)
        return None
    trial = None if state.active is None else state.trial(state.active)
    if trial is None or state.step not in WINDOW_STEPS:
        return None
    if trial.role == "trial":
        for pod in mine:
            if pod.crashed:
                return RolloutFailed(
                    config=config,
                    failure=failure_kind(pod, reached_ready=True),
                    reason=failure_detail(pod) + " (under load, after it was ready)",
                )
        if not any(p.ready for p in mine):
            return None  # not ready under load: it recovers, or crashes (a failure on a later tick)
    # A pod (re)started after the warm-up began, or none is ready: the window is not comparable.
    since = state.measure_from if state.step == Step.MEASURING else None
    restarted = [p for p in mine if since is not None and p.started_at is not None and p.started_at > since]
    if restarted or not any(p.ready for p in mine):
        who = ", ".join(p.name for p in restarted) or f"no ready {role} pod"
        return TrialInvalidated(reason=f"pods restarted or missing ({who})")
    return None


__all__ = [
    "Desired",
    "PodView",
    "Scale",
    "deployment_ready",
    "desired",
    "failure_detail",
    "failure_kind",
    "pod_message",
    "pod_view",
    "pods_of",
    "rollout_observation",
    "scale_plan",
]

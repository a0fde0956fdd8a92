"""One reconcile of one ServingDeployment: the tuning loop's thin shell.

Every call: read the resource, validate its spec, rebuild the policy state from ``status.policy``,
gather observations (spec change, rollout state from the children, a measurement window), call the
pure policy, persist the whole status in ONE patch (guarded by the resourceVersion, so two
operator replicas or a stale read never both write), then post the decision Events and bring the
children to what the new state asks for. Nothing lives in memory that the status cannot rebuild,
except the start scrape of a window in progress (see ``measure.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prefixtune.api import validate_spec
from prefixtune.api.models import (
    API_GROUP,
    API_VERSION,
    APPROVAL_MAX_CHARS,
    APPROVE_ANNOTATION,
    PLURAL,
    ServingDeploymentSpec,
)
from prefixtune.api.rules import gpu_notes
from prefixtune.controller.admin import AdminPolicy
from prefixtune.controller.adoption import REFUSED_REASON, Adopted, adopted_spec, opt_in_problems
from prefixtune.controller.api_calls import require
from prefixtune.controller.children import Freshness, Indexes
from prefixtune.controller.drift import Drift, drift_actions
from prefixtune.controller.execute import (
    APPS,
    Children,
    DriftMemo,
    Ensured,
    Known,
    deployment_drift,
    ensure_children,
    monitoring_installed,
    post_events,
    read_children,
    ready_condition,
)
from prefixtune.controller.kube import KubeClient, KubeError, ns_path
from prefixtune.controller.measure import Meter
from prefixtune.controller.observe import (
    Desired,
    Scale,
    deployment_ready,
    desired,
    rollout_observation,
    router_rollout,
    scale_plan,
)
from prefixtune.controller.ownership import Foreign, name_errors
from prefixtune.controller.render import ROLES, Owner, config_hash, deployment_name
from prefixtune.controller.routing_status import replica_routing, routing_status
from prefixtune.controller.selfmetrics import SelfMetrics
from prefixtune.controller.settings import tuning_settings
from prefixtune.controller.status import (
    build_status,
    condition_message,
    invalid_status,
    last_valid_spec,
    merge_conditions,
    patch_changes,
    policy_state_of,
    scale_status,
)
from prefixtune.engines.knobs import ENGINE_KNOB_NAMES, KnobConfig
from prefixtune.metrics.diagnosis import diagnose
from prefixtune.tuning.actions import Action, EmitEvent
from prefixtune.tuning.optimizer import Suggestion, TrialResult
from prefixtune.tuning.phases import ROLLOUT_STEPS, Phase
from prefixtune.tuning.policy import initial_state, step
from prefixtune.tuning.settings import TuningSettings
from prefixtune.tuning.space import SearchSpace
from prefixtune.tuning.state import (
    Approved,
    Observation,
    PolicyState,
    SpecChanged,
    SpecInvalid,
    Tick,
    Trial,
    TrialInvalidated,
)
from prefixtune.tuning.widening import limits_of

logger = logging.getLogger(__name__)

SLOW_RECONCILE_S = 2.0
ENSURE_EVERY_S = 30.0
SDEP_API = f"/apis/{API_GROUP}/{API_VERSION}"


@dataclass
class OperatorContext:
    """What the handlers share (kopf's memo). No tuning state: that is in each resource's status."""

    client: KubeClient
    meter: Meter = field(default_factory=Meter)
    metrics: SelfMetrics = field(default_factory=SelfMetrics)
    clock: Callable[[], float] = time.time
    ready_timeout_s: float | None = None  # override of the spec-derived timeout (tests, demo)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    monitoring: bool | None = None  # ServiceMonitor CRD present (checked once per process)
    # A cache, not state: what was last ensured per resource, to skip re-applying an unchanged
    # rendering on every tick (a full ensure still runs every ENSURE_EVERY_S).
    ensured: dict[str, tuple[str, float]] = field(default_factory=dict)
    # Objects of a resource's child names that are not its own, found by the last ensure (by uid).
    foreign: dict[str, list[Foreign]] = field(default_factory=dict)
    admin: AdminPolicy = field(default_factory=AdminPolicy)  # the cluster admin's rules for tenants
    # Drift the last ensure restored in children the next reconcile does not read itself (Service,
    # ConfigMaps): reported (condition, trial invalidated) by that reconcile.
    drift: dict[str, list[Drift]] = field(default_factory=dict)
    # A cache, not state: the resourceVersion of each resource as this process last read or wrote
    # it ("namespace/name"), so a tick can take kopf's watched body instead of a GET when that body
    # is the one it knows (``current_body``).
    seen_version: dict[str, str] = field(default_factory=dict)
    # The Deployments this process wrote whose index entries have not caught up yet (``children.py``).
    fresh: Freshness = field(default_factory=Freshness)
    # When each resource's router metrics were last scraped (status.routing; ``routing_status``).
    router_scraped: dict[str, float] = field(default_factory=dict)
    # A cache, not state: the last drift verdict of each engine Deployment (``DriftMemo``).
    drift_memo: DriftMemo = field(default_factory=DriftMemo)

    def lock(self, key: str) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())


def resource_path(namespace: str, name: str) -> str:
    return ns_path(SDEP_API, namespace, PLURAL, name)


@dataclass
class Reconciled:
    """What one reconcile did (for logs and tests)."""

    phase: str = ""
    actions: list[Action] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    foreign: list[Foreign] = field(default_factory=list)  # objects of our names left alone
    conflict: bool = False
    invalid: list[str] = field(default_factory=list)
    status_patched: bool = False  # False: the status built equals the stored one, nothing was written


def _digest(content: object) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def deployment_key(spec: ServingDeploymentSpec) -> str:
    """A stable hash of what each engine pod is besides the tuned knobs and the tuning settings: a
    change of any of these (model, image, GPUs, extra args, the engine's environment from
    ``spec.pod.env``: ``VLLM_ATTENTION_BACKEND`` changes what a config scores) starts a new tuning
    generation. Not the replicas: they are how many such pods serve, which an autoscaler changes
    (``spec_key``); nor where the pods run or what they mount (the rest of ``spec.pod``)."""
    content: dict[str, Any] = {
        "engine": str(spec.engine),
        "model": spec.model,
        "image": spec.image or "",
        "gpuCount": spec.gpu.count,
        "gpuType": str(spec.gpu.type),
        "extraArgs": list(spec.extra_args),
    }
    if spec.pod is not None and spec.pod.env:  # absent when empty: the keys of earlier specs hold
        content["env"] = [var.to_dict() for var in spec.pod.env]
    return _digest(content)


def spec_key(spec: ServingDeploymentSpec) -> str:
    """A stable hash of the whole validated spec (defaults filled in) except ``replicas``: equal
    keys across a spec change mean only the replicas changed (``kubectl scale``, an HPA), which
    the policy answers without touching the trial or the epoch. A default that follows the
    replicas (the rollout strategy: canary from 2) is part of the key, so crossing it is not."""
    return _digest(spec.model_dump(mode="json", by_alias=True, exclude={"replicas"}))


def approval_of(body: dict[str, Any]) -> str:
    """The approval the resource carries (``prefixtune.io/approve``: a recommendation's id), bounded
    ("" when none). A value too long to be an id is kept cut: it matches no recommendation."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(APPROVE_ANNOTATION) if isinstance(annotations, dict) else None
    return value.strip()[:APPROVAL_MAX_CHARS] if isinstance(value, str) else ""


def unchanged_spec(state: PolicyState, spec: ServingDeploymentSpec, settings: TuningSettings) -> PolicyState:
    """The state for a spec the policy has already seen (same generation): settings derived from
    outside the spec follow (an operator-level ready timeout), and a state an older operator wrote
    (no ``spec_key``; a ``deployment_key`` that hashed the replicas too) gets today's keys, which
    describe this very spec, so that its next change of replicas is not read as a new deployment."""
    updates: dict[str, Any] = {}
    if state.settings != settings:
        updates["settings"] = settings
    if not state.spec_key:
        updates |= {
            "spec_key": spec_key(spec),
            "replicas": spec.replicas,
            "deployment_key": deployment_key(spec),
        }
    return state.model_copy(update=updates) if updates else state


# The policy's own threads: a decision that fits a Gaussian process never waits behind blocking
# work of another purpose in the default executor (kopf's sync handlers, the heartbeat), and at
# most this many decisions run at once, however many resources are due.
DECISION_WORKERS = 2
DECISION_POOL = ThreadPoolExecutor(max_workers=DECISION_WORKERS, thread_name_prefix="prefixtune-decision")


class _FitNeeded(BaseException):
    """Raised by ``_no_fit``: this step asks the optimizer, so it runs again in the decision pool.
    A BaseException, so that no ``except Exception`` in the policy can take it for a failure."""


def _no_fit(
    space: SearchSpace, history: list[TrialResult], seed: int, settings: TuningSettings
) -> Suggestion:
    raise _FitNeeded


async def _advance(state: PolicyState, obs: Observation, now: float, actions: list[Action]) -> PolicyState:
    """One policy step. Most steps (a tick inside a window, a rollout still loading) take
    milliseconds and never ask the optimizer: they run here, on the event loop, with a suggester
    that refuses. A step that asks for a suggestion (a Gaussian-process fit, 0.04-0.2 s of CPU) is
    run again from the same inputs in the decision pool, so that kopf's event loop stays responsive;
    the policy is pure, so the second run is the step the first one would have been. (Every step in
    the pool made the cheap ones queue behind the fits: ``bench scale`` at N = 500.)"""
    began = time.perf_counter()
    try:
        try:
            new, acts = step(state, obs, now, _no_fit)
        except _FitNeeded:
            new, acts = await asyncio.get_running_loop().run_in_executor(DECISION_POOL, step, state, obs, now)
    finally:
        spent = _POLICY_SECONDS.get(None)
        if spent is not None:
            spent[0] += time.perf_counter() - began
    actions.extend(acts)
    return new


# The policy time of the reconcile in progress (per task: concurrent reconciles do not mix).
_POLICY_SECONDS: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar(
    "prefixtune_policy_seconds", default=None
)


def current_body(live: Mapping[str, Any] | None, seen_version: str | None) -> dict[str, Any] | None:
    """The watched body (kopf's live view of a daemon's resource), copied, when it is known to be
    current: its resourceVersion is the one this process last read or wrote. Otherwise None (and
    the reconcile reads the resource): the watch may not have delivered this process's own last
    status write yet, and a decision on the status before it would undo it. A newer version (an
    edit by someone else) also reads again: a version is opaque, so "newer" cannot be told from
    "older" without the API server."""
    if live is None or seen_version is None:
        return None
    version = (live.get("metadata") or {}).get("resourceVersion")
    if version is None or str(version) != seen_version:
        return None
    return copy.deepcopy(dict(live))


# A rollout still waiting after this share of its ready timeout reads its pods by a list, not from
# kopf's index: kopf lists again when a paused watch resumes (a peering handover) but sends no
# deletion for a pod deleted meanwhile, so the index can keep a pod that is gone, and a rollout that
# waits for the other config's pods to go would wait for it until the timeout (seen in the peering
# fault scenario: a rolling trial and its rollback both timed out on such a pod).
POD_RELIST_SHARE = 0.5


def relist_pods(state: PolicyState, now: float) -> bool:
    """Whether this reconcile reads the pods by a list (``POD_RELIST_SHARE``)."""
    if state.step not in ROLLOUT_STEPS:
        return False
    return now - state.step_since > POD_RELIST_SHARE * state.settings.ready_timeout_s


async def reconcile(
    ctx: OperatorContext,
    namespace: str,
    name: str,
    live: Mapping[str, Any] | None = None,
    indexes: Indexes | None = None,
) -> Reconciled | None:
    """Reconcile once; None when the resource is gone. ``live``: the resource as the operator's
    watch last saw it (kopf's daemon body), used instead of a GET when it is current; ``indexes``:
    kopf's indexes of the children, read instead of listing them (``children.py``)."""
    async with ctx.lock(f"{namespace}/{name}"):
        started = time.perf_counter()
        spent = [0.0]
        token = _POLICY_SECONDS.set(spent)
        try:
            return await _reconcile(ctx, namespace, name, live, indexes)
        except Exception:
            ctx.metrics.error(namespace, name)
            raise
        finally:
            _POLICY_SECONDS.reset(token)
            took = time.perf_counter() - started
            ctx.metrics.decision_seconds.observe(took)
            ctx.metrics.policy_seconds.observe(spent[0])
            if took > SLOW_RECONCILE_S:
                logger.warning("reconcile of %s/%s took %.1fs", namespace, name, took)


async def _reconcile(
    ctx: OperatorContext,
    namespace: str,
    name: str,
    live: Mapping[str, Any] | None,
    indexes: Indexes | None,
) -> Reconciled | None:
    client = ctx.client
    ref = f"{namespace}/{name}"
    body = current_body(live, ctx.seen_version.get(ref))
    if body is None:
        require(API_GROUP, PLURAL, "get")
        body = await client.get(resource_path(namespace, name))
        _saw(ctx, ref, body)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        ctx.seen_version.pop(ref, None)
        ctx.fresh.forget(namespace, [deployment_name(name, role) for role in ROLES])
        ctx.drift_memo.forget(namespace, [deployment_name(name, role) for role in ROLES])
        uid = str(((body or {}).get("metadata") or {}).get("uid", ""))
        ctx.meter.forget(uid)
        ctx.router_scraped.pop(uid, None)
        ctx.metrics.forget(namespace, name)
        return None
    meta = body["metadata"]
    uid = str(meta.get("uid", ""))
    generation = int(meta.get("generation") or 1)
    previous: dict[str, Any] = dict(body.get("status") or {})
    now = ctx.clock()

    spec, errors = validate_spec(body.get("spec"))
    refused = name_errors(name) + [str(e) for e in errors]
    state = policy_state_of(previous)
    adopted: Adopted | None = None
    if spec is not None and not refused and spec.adopt is not None:
        adopted, problems = await _adopt(ctx, body, previous, state)
        if adopted is None:
            return await _refused(ctx, body, previous, problems, now, generation)
        spec = adopted.spec
    if spec is not None:
        refused += ctx.admin.spec_problems(spec)
    if spec is None or refused:
        return await _invalid(ctx, body, previous, refused, now, generation)
    spec = ctx.admin.admitted(spec)

    owner = Owner.of(body, spec)
    settings = tuning_settings(spec, namespace, name, ready_timeout=ctx.ready_timeout_s)
    actions: list[Action] = []
    key = deployment_key(spec)
    if state is None or state.engine != str(spec.engine) or state.phase == Phase.PENDING:
        state = initial_state(
            str(spec.engine), settings, spec.knob_config(), generation, key,
            spec_key=spec_key(spec), replicas=spec.replicas,
        )  # fmt: skip
    elif state.spec_generation != generation:
        obs = SpecChanged(
            settings=settings, config=spec.knob_config(), generation=generation,
            deployment_key=key, spec_key=spec_key(spec), replicas=spec.replicas,
        )  # fmt: skip
        state = await _advance(state, obs, now, actions)
    else:
        state = unchanged_spec(state, spec, settings)
    approval = approval_of(body)
    if approval != state.approval and state.phase != Phase.PENDING:
        state = await _advance(state, Approved(id=approval), now, actions)

    children = await read_children(client, owner, indexes, ctx.fresh, relist_pods(state, now))
    ensured_want = desired(state)
    # Owned fields of the engine Deployments someone else changed (kubectl scale / set image): the
    # pods are not what the policy thinks they are, so nothing about them is observed this time.
    # At the replicas the last ensure applied (``scale_plan`` of the same state and pods; a pod that
    # became ready since changes the rendering, which reads as an update in flight, not drift).
    has_canary = children.deployments.get("canary") is not None
    ensured_scale = scale_plan(spec, ensured_want, children.pods, has_canary)
    drift = deployment_drift(owner, spec, ensured_want, ensured_scale, children.deployments, ctx.drift_memo)
    drift += [d for d in ctx.drift.pop(uid, []) if d not in drift]
    if state.phase == Phase.PENDING:
        # The policy's clock starts once the baseline serves: warm-up must not run on loading pods.
        if not drift and deployment_ready(children.deployments.get("baseline"), config_hash(state.current)):
            state = await _advance(state, Tick(), now, actions)
    elif drift:
        # A window over pods changed under the trial is not the trial's: re-measured, not scored.
        changed = "; ".join(d.message() for d in drift)[:300]
        reason = f"owned fields changed outside the operator ({changed}), restored"
        state = await _advance(state, TrialInvalidated(reason=reason), now, actions)
        state = await _advance(state, Tick(), now, actions)
    else:
        router = router_rollout(spec, ensured_want, children.router, state.current)
        rollout = rollout_observation(state, children.deployments, children.pods, router)
        if rollout is not None:
            state = await _advance(state, rollout, now, actions)
        checked = await ctx.meter.verify(spec, state, children.pods)
        if checked is not None:
            state = await _advance(state, checked, now, actions)
        window = await ctx.meter.observe(
            uid, spec, state, children.pods, now, admin=ctx.admin, namespace=namespace, name=name
        )
        if window is not None:
            state = await _advance(state, window, now, actions)
        state = await _advance(state, Tick(), now, actions)
    actions.extend(drift_actions(drift, previous.get("conditions") or [], _settled(children, ensured_want)))

    measured = ctx.meter.last_window.get(uid)
    # Diagnosed against the config its pods ran (status.diagnosis describes currentConfig: one of
    # another config, e.g. the window before a rolling trial's pods took over, is not shown).
    diagnosis = (
        diagnose(
            measured.signals,
            prefix_caching=measured.config.prefix_caching,
            limits=limits_of(measured.config),
            routing=replica_routing(spec, measured.config),
        )
        if measured is not None and measured.config == state.current
        else None
    )
    found = _unique([*children.foreign, *ctx.foreign.get(uid, [])])
    status = build_status(
        state, actions, previous, now=now, generation=generation,
        ready=ready_condition(spec, children, found), diagnosis=diagnosis,
        valid_spec=adopted.raw if adopted is not None else body.get("spec"),
        scale=scale_status(name, children.deployments), notes=gpu_notes(spec),
    )  # fmt: skip
    routing, scraped = await routing_status(
        client, owner, spec, ensured_want.baseline, children.pods,
        (previous or {}).get("routing"), ctx.router_scraped.get(uid), now,
    )  # fmt: skip
    if scraped:
        ctx.router_scraped[uid] = now
    if routing is not None or (previous or {}).get("routing") is not None:
        status["routing"] = routing  # None removes it (a merge patch's null)
    outcome = Reconciled(phase=state.phase, actions=actions)
    written = body
    if patch_changes(previous, status):  # nothing changed (most ticks): no write, no watch event
        got = await _write_status(ctx, namespace, name, meta.get("resourceVersion"), status)
        if got is None:
            outcome.conflict = True
            return outcome
        written, outcome.status_patched = got, True
    if measured is not None:
        ctx.meter.last_window.pop(uid, None)
    await post_events(client, body, [a for a in actions if isinstance(a, EmitEvent)], now)
    if ctx.monitoring is None:
        ctx.monitoring = await monitoring_installed(client)
    want = desired(state)
    scale = scale_plan(spec, want, children.pods, children.deployments.get("canary") is not None)
    key = ensure_key(generation, want, scale, children)
    last = ctx.ensured.get(uid)
    if last is None or last[0] != key or now - last[1] > ENSURE_EVERY_S or found or drift:
        ensured = await _ensure(
            ctx, owner, spec, want, scale, stable_pool(state.trials, want.baseline), children.known
        )
        outcome.changes = ensured.changes
        ctx.ensured[uid] = (key, now)
        seen = {(d.kind, d.name) for d in drift}
        late = [d for d in ensured.drift if (d.kind, d.name) not in seen]
        if late:
            ctx.drift[uid] = late
        outcome.foreign = _unique([*children.foreign, *ensured.foreign])
        known = set(ctx.foreign.pop(uid, []))
        if outcome.foreign:
            ctx.foreign[uid] = outcome.foreign
        if outcome.foreign != found:
            await _patch_ready(ctx, body, written, status, spec, children, outcome.foreign, now, generation)
        new = [EmitEvent("Warning", "ResourceExists", f.message()) for f in outcome.foreign if f not in known]
        await post_events(client, body, new, now)
    for change in outcome.changes:
        logger.info("%s/%s: %s", namespace, name, change)
    ctx.metrics.record(namespace, name, actions)
    best = state.trial(state.best).value if state.best is not None else None
    ctx.metrics.set_state(namespace, name, state.phase, best)
    return outcome


def ensure_key(generation: int, want: Desired, scale: Scale, children: Children) -> str:
    """What the last ensure rendered from: an ensure runs when it changes (else every
    ENSURE_EVERY_S). The router's readiness is in it: the user-facing Service switches to the router
    pods once one is ready (``render_routed``), on that tick, not up to ENSURE_EVERY_S later."""
    present = sorted(k for k, v in children.deployments.items() if v is not None)
    return f"{generation}/{want}/{scale}/{present}/{children.router_ready}"


async def _ensure(
    ctx: OperatorContext,
    owner: Owner,
    spec: ServingDeploymentSpec,
    want: Desired,
    scale: Scale,
    pool_tokens: int | None = None,
    known: Known | None = None,
) -> Ensured:
    """``ensure_children``, with the Deployments it wrote marked for a fresh read (``Freshness``).
    ``pool_tokens``: the engines' KV pool as last reported (the router's tree mirrors it);
    ``known``: the Deployments as this tick read them (``Children.known``)."""
    ensured = await ensure_children(
        ctx.client, owner, spec, want, scale, monitoring=bool(ctx.monitoring), pool_tokens=pool_tokens,
        known=known,
    )  # fmt: skip
    for name in ensured.written:
        if name != owner.adopted:  # read by its name every time (``read_children``)
            ctx.fresh.wrote(owner.namespace, name)
    return ensured


async def _write_status(
    ctx: OperatorContext, namespace: str, name: str, version: object, status: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The status merge patch, guarded by the resourceVersion it was decided on; None when somebody
    wrote in between (409: decide again on fresh data next time). Every write is remembered
    (``current_body``)."""
    require(API_GROUP, f"{PLURAL}/status", "patch")
    ref = f"{namespace}/{name}"
    try:
        written = await ctx.client.merge_patch(
            resource_path(namespace, name) + "/status",
            {"metadata": {"resourceVersion": version}, "status": dict(status)},
        )
    except KubeError as err:
        if err.status == 409:
            ctx.seen_version.pop(ref, None)
            return None
        raise
    _saw(ctx, ref, written)
    ctx.metrics.watch_lag.wrote(ref, written)
    return written


def stable_pool(trials: Sequence[Trial], baseline: KnobConfig) -> int | None:
    """The KV pool (tokens) the stable pods report: the latest trial that ran the baseline's engine
    knobs (a canary's, a rejected or aborted trial's pool is not what the router's workers hold);
    None while none has, and the router keeps its own default tree size."""
    engine = [(k, getattr(baseline, k)) for k in ENGINE_KNOB_NAMES]
    return next(
        (
            t.kv_tokens
            for t in reversed(trials)
            if t.kv_tokens and all(getattr(t.config, k) == v for k, v in engine)
        ),
        None,
    )


def _saw(ctx: OperatorContext, key: str, body: Mapping[str, Any] | None) -> None:
    """Remember the resourceVersion of the resource as read or written (``current_body``)."""
    version = ((body or {}).get("metadata") or {}).get("resourceVersion")
    if version is None:
        ctx.seen_version.pop(key, None)
    else:
        ctx.seen_version[key] = str(version)


def _settled(children: Children, want: Desired) -> bool:
    """The engine Deployments run what the operator rendered, every replica ready."""
    configs = {role: want.config_of(role) for role in ROLES}
    return all(
        deployment_ready(children.deployments.get(role), config_hash(config))
        for role, config in configs.items()
        if config is not None
    )


def _unique(found: list[Foreign]) -> list[Foreign]:
    return sorted(set(found), key=lambda f: (f.kind, f.name))


async def _patch_ready(
    ctx: OperatorContext,
    body: dict[str, Any],
    written: dict[str, Any],
    status: dict[str, Any],
    spec: ServingDeploymentSpec,
    children: Children,
    found: list[Foreign],
    now: float,
    generation: int,
) -> None:
    """The ensure found objects of our names that are not ours (or they went away) after the status
    was written: say so now in the Ready condition (a 409 leaves it to the next tick)."""
    meta = body["metadata"]
    namespace, name = str(meta.get("namespace") or "default"), str(meta["name"])
    ok, reason, message = ready_condition(spec, children, found)
    conditions = merge_conditions(
        status.get("conditions") or [],
        [("Ready", "True" if ok else "False", reason, message)],
        now,
        generation,
    )
    version = (written.get("metadata") or {}).get("resourceVersion")
    await _write_status(ctx, namespace, name, version, {"conditions": conditions})


async def _adopt(
    ctx: OperatorContext, body: dict[str, Any], previous: dict[str, Any], state: PolicyState | None
) -> tuple[Adopted | None, list[str]]:
    """The adopted Deployment read, its opt-in checked and its command parsed (``adoption``). Once
    tuning began on it (the last valid spec adopted the same Deployment), it starts from the config
    the policy started from, not from the best config its command now runs."""
    meta, raw = body["metadata"], dict(body.get("spec") or {})
    namespace, name = str(meta.get("namespace") or "default"), str(meta["name"])
    target = str((raw.get("adopt") or {}).get("deployment") or "")
    require("apps", "deployments", "get")
    live = await ctx.client.get(ns_path(APPS, namespace, "deployments", target))
    problems = opt_in_problems(live, namespace, name, target)
    if live is None or problems:
        return None, problems
    last = last_valid_spec(previous) or {}
    same = (last.get("adopt") or {}).get("deployment") == target
    return adopted_spec(raw, live, state.spec_config if state is not None and same else None)


async def _refused(
    ctx: OperatorContext,
    body: dict[str, Any],
    previous: dict[str, Any],
    problems: list[str],
    now: float,
    generation: int,
) -> Reconciled:
    """An adoption that may not go ahead: ``Ready=False`` / ``AdoptionRefused`` saying why, a Warning
    Event (once per generation and message), and no write to any other object."""
    meta = body["metadata"]
    namespace, name = str(meta.get("namespace") or "default"), str(meta["name"])
    message = "; ".join(problems)
    outcome = Reconciled(phase=str(previous.get("phase") or Phase.PENDING), invalid=problems)
    ready: dict[str, Any] = next(
        (c for c in previous.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    if (
        previous.get("observedGeneration") == generation
        and ready.get("reason") == REFUSED_REASON
        and ready.get("message") == condition_message(message)
    ):
        return outcome
    conditions = merge_conditions(
        previous.get("conditions") or [], [("Ready", "False", REFUSED_REASON, message)], now, generation
    )
    status = {"phase": outcome.phase, "observedGeneration": generation, "conditions": conditions}
    if await _write_status(ctx, namespace, name, meta.get("resourceVersion"), status) is None:
        outcome.conflict = True
        return outcome
    event = EmitEvent("Warning", REFUSED_REASON, f"adoption refused: {message}")
    await post_events(ctx.client, body, [event], now)
    return outcome


def _last_spec(ctx: OperatorContext, name: str, previous: dict[str, Any]) -> ServingDeploymentSpec | None:
    """The last valid spec recorded in the status, if it still validates and the admin allows it."""
    raw = last_valid_spec(previous)
    if raw is None or name_errors(name):
        return None
    spec, errors = validate_spec(raw)
    if spec is None or errors or ctx.admin.spec_problems(spec):
        return None
    return ctx.admin.admitted(spec)


async def _invalid(
    ctx: OperatorContext,
    body: dict[str, Any],
    previous: dict[str, Any],
    errors: list[str],
    now: float,
    generation: int,
) -> Reconciled:
    """An invalid spec: a condition and a Warning Event naming the fields. Nothing new is rolled
    out; a trial in flight is aborted and the children are kept at the last valid spec's safe
    config (the stable config on all its replicas, no canary), so an edit mid-trial never leaves a
    canary with half the traffic until someone fixes the spec. The policy state is kept: a fixed
    spec resumes tuning from it."""
    meta = body["metadata"]
    namespace, name = str(meta.get("namespace") or "default"), str(meta["name"])
    outcome = Reconciled(phase=str(Phase.FAILED), invalid=errors)
    message = "; ".join(errors)
    state = policy_state_of(previous)
    last = _last_spec(ctx, name, previous) if state is not None else None
    owner = Owner.of(body, last)
    actions: list[Action] = []
    if state is not None and last is not None:
        state = await _advance(state, SpecInvalid(reason=message), now, actions)
        if state.step in ROLLOUT_STEPS:  # the rollback to the safe config: followed to its end
            children = await read_children(ctx.client, owner)
            router = router_rollout(last, desired(state), children.router, state.current)
            rollout = rollout_observation(state, children.deployments, children.pods, router)
            if rollout is not None:
                state = await _advance(state, rollout, now, actions)
        outcome.phase, outcome.actions = str(state.phase), actions
    ready: dict[str, Any] = next(
        (c for c in previous.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    reported = (
        previous.get("observedGeneration") == generation
        and ready.get("reason") == "InvalidSpec"
        and ready.get("message") == condition_message(message)
    )
    if not reported or actions:
        base = previous
        if state is not None:
            base = build_status(
                state, actions, previous, now=now, generation=generation,
                ready=(False, "InvalidSpec", message),
            )  # fmt: skip
        status = invalid_status(base, errors, now=now, generation=generation)
        if await _write_status(ctx, namespace, name, meta.get("resourceVersion"), status) is None:
            outcome.conflict = True
            return outcome
        events = [a for a in actions if isinstance(a, EmitEvent)]
        if not reported:
            kept = "the last valid spec keeps running" if last is not None else "nothing rolled out"
            events.append(EmitEvent("Warning", "InvalidSpec", f"spec rejected, {kept}: {message}"))
        await post_events(ctx.client, body, events, now)
    if state is not None and last is not None:
        await _keep_last_valid(ctx, owner, last, desired(state), now, generation, outcome)
    ctx.metrics.set_state(namespace, name, str(Phase.FAILED), None)
    return outcome


async def _keep_last_valid(
    ctx: OperatorContext,
    owner: Owner,
    last: ServingDeploymentSpec,
    want: Desired,
    now: float,
    generation: int,
    outcome: Reconciled,
) -> None:
    """Ensure the children at ``want`` rendered from the last valid spec (cached like the normal
    path's ensure); drift found here is reported once the spec is valid again."""
    if ctx.monitoring is None:
        ctx.monitoring = await monitoring_installed(ctx.client)
    children = await read_children(ctx.client, owner)
    # Canary up first here too: the canary goes once the stable pods are back (``scale_plan``).
    scale = scale_plan(last, want, children.pods, children.deployments.get("canary") is not None)
    key = f"invalid/{generation}/{want}/{scale}"
    last_ensure = ctx.ensured.get(owner.uid)
    if last_ensure is not None and last_ensure[0] == key and now - last_ensure[1] <= ENSURE_EVERY_S:
        return
    ensured = await _ensure(ctx, owner, last, want, scale)
    ctx.ensured[owner.uid] = (key, now)
    outcome.changes, outcome.foreign = ensured.changes, ensured.foreign
    if ensured.drift:
        ctx.drift[owner.uid] = ensured.drift
    for change in ensured.changes:
        logger.info("%s/%s (invalid spec, last valid one kept): %s", owner.namespace, owner.name, change)

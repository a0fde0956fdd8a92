"""status.routing: the router's policy and what it did, from a bounded scrape of its pods.

Only for a routed resource, and about once a minute (``EVERY_S``; the status is written only when
it changes, and the routers' counters change with every request): the router pods (by their own
label) are listed, each ready one's ``--prometheus-port`` is read within ``DEADLINE_S`` seconds and
``MAX_BYTES`` bytes (``metrics.bounded``), and ``routing.metrics`` turns the samples into per-worker
shares and decisions. A failed scrape says why in ``message`` and never fails the reconcile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from prefixtune.api.models import ServingDeploymentSpec
from prefixtune.controller.api_calls import require
from prefixtune.controller.kube import KubeClient, KubeError, ns_path
from prefixtune.controller.observe import PodView, pod_view
from prefixtune.controller.render import Owner
from prefixtune.engines.base import KnobConfig
from prefixtune.metrics import bounded
from prefixtune.metrics.diagnosis import ReplicaRouting
from prefixtune.metrics.exposition import Snapshot, parse
from prefixtune.routing import metrics as router_metrics
from prefixtune.routing.policy import ROUTER_METRICS_PORT
from prefixtune.routing.render import LABEL_ROUTER, settings_for

EVERY_S = 60.0
DEADLINE_S = 2.0
MAX_BYTES = 1024 * 1024  # a router's page is a few KB (a histogram per route, a counter per worker)


def replica_routing(spec: ServingDeploymentSpec, config: KnobConfig) -> ReplicaRouting:
    """How the requests reach the replicas running ``config``, for the diagnosis' routing finding:
    the replicas and the policy it resolves to (an adopting resource has no router: kube-proxy). No
    single-replica hit rate: the operator measures per-pod windows, and what one replica holding the
    whole load's cache would hit is not in them (the twin's ``whatif --replicas N --sweep routing``
    estimates it; the operator runs no twin), so the finding names the policy and the replicas only."""
    return ReplicaRouting(replicas=spec.replicas, policy=settings_for(spec, config).policy)


def status_of(
    policy: str, router: str, metrics: router_metrics.RouterMetrics | None, message: str
) -> dict[str, Any]:
    """status.routing (camelCase) for a routed resource."""
    out: dict[str, Any] = {"policy": policy, "router": router, "message": message[:1024]}
    if metrics is not None:
        out["requests"] = metrics.requests
        out["workers"] = [
            {"worker": w.worker[:512], "requests": w.requests, "share": round(w.share, 4)}
            for w in metrics.workers
        ]
        if metrics.others:
            out["otherWorkers"] = metrics.others
        if metrics.cache_aware is not None:
            out["cacheAwareDecisions"] = metrics.cache_aware
        if metrics.load_balanced is not None:
            out["loadBalancedDecisions"] = metrics.load_balanced
        if metrics.tokenless is not None:
            out["tokenlessDecisions"] = metrics.tokenless
    return out


def tokenless_note(router: str, metrics: router_metrics.RouterMetrics) -> str | None:
    """What to say when the router routed requests by load alone for want of token ids (vllm-router
    in front of engines that do not serve their render routes), else None."""
    if not metrics.tokenless:
        return None
    decided = (metrics.cache_aware or 0.0) + (metrics.load_balanced or 0.0) + metrics.tokenless
    return (
        f"{router} routed {metrics.tokenless:g} of {decided:g} requests by load alone: the engines "
        "answered no token ids on their render routes (vLLM serves them with --enable-scale-out, which "
        "the operator renders behind a router; an engine image without them leaves cache_aware "
        "prefix-blind)"
    )


async def routing_status(
    client: KubeClient,
    owner: Owner,
    spec: ServingDeploymentSpec,
    config: KnobConfig,
    engine_pods: Sequence[PodView],
    previous: Mapping[str, Any] | None,
    last: float | None,
    now: float,
) -> tuple[dict[str, Any] | None, bool]:
    """(status.routing, scraped): None for no router (a previous one is then removed); the previous
    value while it is younger than ``EVERY_S``; else a fresh scrape."""
    settings = settings_for(spec, config)
    if not settings.routed:
        return None, False
    policy, router = settings.policy.value, settings.router.value
    kept = dict(previous) if isinstance(previous, Mapping) else None
    if kept is not None and kept.get("policy") == policy and last is not None and now - last < EVERY_S:
        return kept, False
    require("", "pods", "list")
    try:
        pods = await client.list(ns_path("/api/v1", owner.namespace, "pods"), {LABEL_ROUTER: owner.name})
    except KubeError as err:
        return status_of(policy, router, None, f"router pods not listed: {err}"), True
    ready = [view for view in map(pod_view, pods) if view.ready and view.ip and not view.deleting]
    if not ready:
        return status_of(policy, router, None, "no router pod is ready yet"), True
    snapshots: list[Snapshot] = []
    failed: list[str] = []

    async def scrape(pod: PodView) -> None:
        url = f"http://{pod.ip}:{ROUTER_METRICS_PORT}/metrics"
        try:
            text = await bounded.fetch(url, deadline_s=DEADLINE_S, max_bytes=MAX_BYTES)
            snapshots.append(parse(text, target=pod.name, t=time.time()))
        except bounded.FetchError as err:  # a status code and a short reason, never the body
            failed.append(f"{pod.name}: {err}")
        except ValueError:  # the parser's message quotes the page: not into the status
            failed.append(f"{pod.name}: not a valid Prometheus text exposition")

    # The router's own replicas at most, concurrently: one refresh takes one deadline, not one per pod.
    await asyncio.gather(*(scrape(pod) for pod in sorted(ready, key=lambda p: p.name)[: settings.replicas]))
    names = {pod.ip: pod.name for pod in engine_pods if pod.ip}
    metrics = router_metrics.read(settings.router, snapshots, names) if snapshots else None
    notes = [f"router metrics not read from {'; '.join(failed)}"] if failed else []
    if metrics is not None and metrics.cache_aware is None:
        notes.append(f"{router} exports no cache-aware decision metric")
    blind = tokenless_note(router, metrics) if metrics is not None else None
    if blind:
        notes.append(blind)
    return status_of(policy, router, metrics, "; ".join(notes)), True

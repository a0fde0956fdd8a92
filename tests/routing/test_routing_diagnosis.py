"""The operator diagnoses the routing (issue 24 item 5): replicas behind a prefix-blind policy get the
``routing-splits-cache`` finding in status.diagnosis, without a single-replica estimate (the operator
has none: its windows are per pod, and it runs no twin)."""

from __future__ import annotations

from bench._reliability_tenant import MODEL, harness, resource
from prefixtune.api import parse_spec
from prefixtune.controller.measure import Measured
from prefixtune.controller.routing_status import replica_routing
from prefixtune.metrics.diagnosis import ReplicaRouting, diagnose
from prefixtune.metrics.signals import Signals
from prefixtune.routing.policy import RoutingPolicy

CODE = "routing-splits-cache"
WINDOW = Signals(
    window_s=300.0, requests=600.0, hit_rate=0.40, prefill_reduction=0.40, running_mean=24.0,
    waiting_mean=0.0, kv_usage_mean=0.55, ttft_p50_s=0.12, ttft_p99_s=0.45, itl_p50_s=0.03,
    itl_p99_s=0.06, output_tokens_per_s=500.0, requests_per_s=2.0,
)  # fmt: skip


def test_the_routing_diagnosed_is_the_resources_replicas_and_resolved_policy_without_an_estimate() -> None:
    spec = parse_spec({"engine": "sglang", "model": MODEL, "replicas": 4, "routing": {"policy": "random"}})
    assert replica_routing(spec, spec.knob_config()) == ReplicaRouting(4, RoutingPolicy.RANDOM, None)


def test_auto_over_replicas_resolves_to_a_cache_aware_router_and_no_routing_finding() -> None:
    spec = parse_spec({"engine": "sglang", "model": MODEL, "replicas": 4})
    routing = replica_routing(spec, spec.knob_config())
    assert routing.policy == RoutingPolicy.CACHE_AWARE
    assert CODE not in {f.code for f in diagnose(WINDOW, routing=routing, prefix_caching=True).findings}


async def test_replicas_behind_kube_proxy_show_the_routing_finding_in_the_status() -> None:
    spec = {"engine": "sglang", "model": MODEL, "replicas": 4, "routing": {"policy": "kube-proxy"}}
    async with harness() as h:
        created = await h.apply(resource("chat", spec))
        await h.reconcile("chat")
        h.ctx.meter.last_window[created["metadata"]["uid"]] = Measured(WINDOW, parse_spec(spec).knob_config())
        await h.reconcile("chat")
        notes = ((await h.status("chat")).get("diagnosis") or {}).get("notes") or []
        assert any("4 replicas behind kube-proxy routing" in n for n in notes), notes

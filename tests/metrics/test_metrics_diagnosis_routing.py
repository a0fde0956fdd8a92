"""diagnose(routing=...): with replicas behind a prefix-blind policy, the diagnosis names what the
routing costs in hit rate (issue 24 item 5), from the twin's single-replica estimate."""

from __future__ import annotations

import pytest

from prefixtune.metrics.diagnosis import Finding, ReplicaRouting, diagnose
from prefixtune.metrics.signals import Signals
from prefixtune.routing.policy import RoutingPolicy

CODE = "routing-splits-cache"
WINDOW = Signals(
    window_s=300.0,
    requests=600.0,
    hit_rate=0.40,
    prefill_reduction=0.40,
    running_mean=24.0,
    waiting_mean=0.0,
    kv_usage_mean=0.55,
    ttft_p50_s=0.12,
    ttft_p99_s=0.45,
    itl_p50_s=0.03,
    itl_p99_s=0.06,
    output_tokens_per_s=500.0,
    requests_per_s=2.0,
)


def _finding(routing: ReplicaRouting | None, prefix_caching: bool | None = True) -> Finding | None:
    d = diagnose(WINDOW, routing=routing, prefix_caching=prefix_caching)
    return next((f for f in d.findings if f.code == CODE), None)


def test_random_routing_over_replicas_names_the_hit_rate_a_single_replica_would_have() -> None:
    f = _finding(ReplicaRouting(4, RoutingPolicy.KUBE_PROXY, single_replica_hit_rate=0.65))
    assert f is not None
    assert f.readings["routing_cost_points"] == pytest.approx(25.0)
    assert f.readings["single_replica_hit_rate"] == 0.65
    note = f.note
    assert "4 replicas behind kube-proxy routing: hit rate 40% where one replica" in note and "65%" in note
    assert "cache_aware" in note


@pytest.mark.parametrize(
    "policy", [RoutingPolicy.RANDOM, RoutingPolicy.ROUND_ROBIN, RoutingPolicy.POWER_OF_TWO]
)
def test_every_prefix_blind_policy_raises_it(policy: RoutingPolicy) -> None:
    assert _finding(ReplicaRouting(2, policy, single_replica_hit_rate=0.6)) is not None


@pytest.mark.parametrize("policy", [RoutingPolicy.CACHE_AWARE, RoutingPolicy.CONSISTENT_HASH])
def test_routing_that_follows_the_prefix_or_the_session_raises_nothing(policy: RoutingPolicy) -> None:
    assert _finding(ReplicaRouting(4, policy, single_replica_hit_rate=0.65)) is None


def test_one_replica_has_no_routing_to_blame() -> None:
    assert _finding(ReplicaRouting(1, RoutingPolicy.KUBE_PROXY, single_replica_hit_rate=0.65)) is None


def test_a_gap_under_the_threshold_is_no_finding() -> None:
    assert _finding(ReplicaRouting(4, RoutingPolicy.RANDOM, single_replica_hit_rate=0.43)) is None


def test_without_an_estimate_it_names_the_policy_and_how_to_price_it() -> None:
    f = _finding(ReplicaRouting(3, RoutingPolicy.RANDOM))
    assert f is not None and "twin whatif --replicas 3 --sweep routing=" in f.note


def test_caching_off_or_no_routing_given_raises_nothing() -> None:
    assert _finding(ReplicaRouting(4, RoutingPolicy.RANDOM, 0.65), prefix_caching=False) is None
    assert _finding(None) is None

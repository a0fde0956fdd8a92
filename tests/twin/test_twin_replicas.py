"""Replicas behind a router in the twin (twin/replicas.py): what routing does to the hit rate, and
how the run is put together (one clock, shares, merged totals, the single-cache reference)."""

from __future__ import annotations

import functools

import pytest

from prefixtune.routing.policy import RoutingPolicy
from prefixtune.twin.replicas import (
    ReplicaRun,
    simulate_replicas,
    single_cache_hit_rate,
    split_cache_hit_rate,
)
from prefixtune.twin.request import Request
from prefixtune.twin.router import RoutingConfig
from prefixtune.twin.run import SimOptions, simulate
from prefixtune.twin.workloads import generate

M8 = "meta-llama/Llama-3.1-8B-Instruct"
GPU = "H100-80GB"
OPTIONS = SimOptions(seed=3, model=M8, warmup_s=10.0)


@functools.cache
def _chat() -> tuple[Request, ...]:
    return tuple(generate("chatbot", rate=24, duration_s=60, seed=3))


@functools.cache
def _run(policy: RoutingPolicy, replicas: int = 4) -> ReplicaRun:
    return simulate_replicas("vllm", [], GPU, _chat(), replicas, RoutingConfig(policy=policy), OPTIONS)


def test_cache_aware_routing_beats_random_on_a_multi_turn_chat() -> None:
    aware, scattered = _run(RoutingPolicy.CACHE_AWARE), _run(RoutingPolicy.RANDOM)
    assert aware.total.hit_rate > scattered.total.hit_rate + 0.1


def test_session_affinity_keeps_conversations_on_their_cache() -> None:
    assert (
        _run(RoutingPolicy.CONSISTENT_HASH).total.hit_rate
        > _run(RoutingPolicy.KUBE_PROXY).total.hit_rate + 0.1
    )


def test_one_replica_behind_any_router_is_the_plain_engine() -> None:
    alone = simulate("vllm", [], GPU, _chat(), OPTIONS)
    routed = _run(RoutingPolicy.CACHE_AWARE, replicas=1).total
    assert (routed.hit_rate, routed.ttft_p99_s, routed.finished) == (
        alone.hit_rate,
        alone.ttft_p99_s,
        alone.finished,
    )


def test_every_request_is_routed_once_and_the_shares_add_up() -> None:
    run = _run(RoutingPolicy.POWER_OF_TWO)
    assert sum(run.decisions.values()) == len(_chat())
    assert sum(run.share) == pytest.approx(1.0)
    assert sum(r.requests for r in run.replicas) == run.total.requests


def test_the_total_hit_rate_weighs_the_replicas_by_their_queries() -> None:
    run = _run(RoutingPolicy.ROUND_ROBIN)
    lo, hi = min(r.hit_rate for r in run.replicas), max(r.hit_rate for r in run.replicas)
    assert lo <= run.total.hit_rate <= hi
    assert run.total.kv_pool_tokens == sum(r.kv_pool_tokens for r in run.replicas)


def test_a_run_repeats_for_its_seed() -> None:
    again = simulate_replicas(
        "vllm", [], GPU, _chat(), 4, RoutingConfig(policy=RoutingPolicy.CACHE_AWARE), OPTIONS
    )
    first = _run(RoutingPolicy.CACHE_AWARE)
    assert again.total.without_wall() == first.total.without_wall() and again.share == first.share


def test_the_routed_streams_hold_every_routed_request_once_in_arrival_order() -> None:
    run = _run(RoutingPolicy.CACHE_AWARE)
    ids = sorted(r.req_id for part in run.routed for r in part)
    assert ids == sorted(r.req_id for r in _chat())
    assert all(list(p) == sorted(p, key=lambda r: (r.arrival_s, r.req_id)) for p in run.routed)
    assert [len(p) / len(_chat()) for p in run.routed] == pytest.approx(list(run.share))


def test_one_stream_through_one_pool_is_the_single_cache_of_one_pool() -> None:
    assert split_cache_hit_rate("vllm", [], GPU, [_chat()], OPTIONS) == single_cache_hit_rate(
        "vllm", [], GPU, _chat(), 1, OPTIONS
    )


def test_splitting_whole_sessions_costs_the_cache_little_and_scattering_them_much() -> None:
    single = single_cache_hit_rate("vllm", [], GPU, _chat(), 4, OPTIONS)
    hashed = split_cache_hit_rate("vllm", [], GPU, _run(RoutingPolicy.CONSISTENT_HASH).routed, OPTIONS)
    scattered = split_cache_hit_rate("vllm", [], GPU, _run(RoutingPolicy.RANDOM).routed, OPTIONS)
    assert single - hashed < 0.02 < 0.1 < single - scattered


def test_lightly_loaded_replicas_hit_what_their_streams_do_through_idle_caches() -> None:
    # 8B on an H100 at 6 requests/s a replica: little in flight, so the idle replay is the engine's
    # figure (bench routing's load_effect shows where a loaded 70B parts from it)
    run = _run(RoutingPolicy.CONSISTENT_HASH)
    idle = split_cache_hit_rate("vllm", [], GPU, run.routed, OPTIONS)
    assert run.total.hit_rate == pytest.approx(idle, abs=0.005)


def test_vllm_router_sees_token_ids_only_from_vllm_serving_its_render_routes() -> None:
    from prefixtune.engines import get_adapter
    from prefixtune.routing.policy import Router

    adapter = get_adapter("vllm")
    routing = RoutingConfig(policy=RoutingPolicy.CACHE_AWARE, low_match=Router.VLLM)
    decisions = {}
    for policy in ("cache_aware", "kube-proxy"):  # the command rendered with and without a router
        argv = adapter.render(M8, adapter.default_config().with_(routing_policy=policy)).argv
        run = simulate_replicas("vllm", argv, GPU, _chat(), 4, routing, OPTIONS)
        decisions[policy] = (run.routing.tokens, set(run.decisions))
    assert decisions["cache_aware"][0] and "cache_affinity" in decisions["cache_aware"][1]
    assert decisions["kube-proxy"] == (False, {"missing_tokens"})


def test_one_cache_with_the_pools_together_hits_at_least_what_random_replicas_do() -> None:
    single = single_cache_hit_rate("vllm", [], GPU, _chat(), 4, OPTIONS)
    assert single > _run(RoutingPolicy.RANDOM).total.hit_rate


def test_an_engine_that_cannot_start_fails_every_replica() -> None:
    run = simulate_replicas(
        "vllm", ["--gpu-memory-utilization", "0.05"], GPU, _chat()[:5], 2, RoutingConfig(), OPTIONS
    )
    assert run.total.status == "oom_startup" and all(r.status == "oom_startup" for r in run.replicas)


def test_replicas_must_be_positive() -> None:
    with pytest.raises(ValueError, match="replicas"):
        simulate_replicas("vllm", [], GPU, _chat()[:5], 0, RoutingConfig(), OPTIONS)


def test_the_diagnosis_prices_random_routing_with_the_twins_single_cache() -> None:
    from prefixtune.metrics.diagnosis import ReplicaRouting, diagnose

    run = _run(RoutingPolicy.KUBE_PROXY)
    single = single_cache_hit_rate("vllm", [], GPU, _chat(), 4, OPTIONS)
    routing = ReplicaRouting(4, RoutingPolicy.KUBE_PROXY, single_replica_hit_rate=single)
    d = diagnose(run.total.signals(run.total.sim_seconds), routing=routing, prefix_caching=True)
    found = next(f for f in d.findings if f.code == "routing-splits-cache")
    assert found.readings["routing_cost_points"] == pytest.approx(100 * (single - run.total.hit_rate))


def test_requests_after_the_horizon_are_never_routed() -> None:
    cut = SimOptions(seed=3, model=M8, warmup_s=10.0, horizon_s=30.0)
    for policy in (RoutingPolicy.RANDOM, RoutingPolicy.CACHE_AWARE):
        run = simulate_replicas("vllm", [], GPU, _chat(), 4, RoutingConfig(policy=policy), cut)
        assert sum(run.decisions.values()) == sum(1 for r in _chat() if r.arrival_s < 30.0)

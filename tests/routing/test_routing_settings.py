"""RoutingSettings: the router's resolved settings, from spec.routing and the routing knobs."""

from __future__ import annotations

import pytest

from prefixtune.engines import get_adapter
from prefixtune.routing.policy import AUTO_POLICY, DEFAULT_MAX_TREE_SIZE, Router, RoutingPolicy
from prefixtune.routing.settings import RoutingSettings, policy_problem, resolve_policy


def _settings(**changes: object) -> RoutingSettings:
    values: dict[str, object] = {
        "policy": RoutingPolicy.CACHE_AWARE,
        "router": Router.SGLANG,
        "image": "img:1",
    }
    values.update(changes)
    return RoutingSettings(**values)  # type: ignore[arg-type]


def test_auto_picks_cache_aware_for_two_replicas_sharing_prefixes() -> None:
    assert resolve_policy(AUTO_POLICY, replicas=2, shares_prefixes=True) is RoutingPolicy.CACHE_AWARE


@pytest.mark.parametrize(("replicas", "shares"), [(1, True), (1, False), (4, False)])
def test_auto_needs_no_router_for_one_replica_or_no_shared_prefixes(replicas: int, shares: bool) -> None:
    assert resolve_policy(AUTO_POLICY, replicas=replicas, shares_prefixes=shares) is RoutingPolicy.KUBE_PROXY


def test_a_named_policy_resolves_to_itself() -> None:
    assert resolve_policy("round_robin", replicas=1, shares_prefixes=False) is RoutingPolicy.ROUND_ROBIN


def test_a_policy_the_router_lacks_is_refused_with_those_it_has_and_the_router_that_has_it() -> None:
    problem = policy_problem(RoutingPolicy.CONSISTENT_HASH, Router.SGLANG)
    assert problem == (
        "sglang-router has no consistent_hash policy; it has cache_aware, power_of_two, random, "
        "round_robin (or kube-proxy: no router); consistent_hash needs routing.router vllm-router"
    )
    with pytest.raises(ValueError, match="sglang-router has no consistent_hash policy"):
        _settings(policy=RoutingPolicy.CONSISTENT_HASH)
    assert _settings(policy=RoutingPolicy.CONSISTENT_HASH, router=Router.VLLM).routed


def test_kube_proxy_is_no_router() -> None:
    assert not _settings(policy=RoutingPolicy.KUBE_PROXY).routed
    assert _settings().routed


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"image": ""}, "image must not be empty"),
        ({"replicas": 0}, "replicas must be >= 1"),
        ({"cache_threshold": 1.2}, r"cache threshold must be in \[0, 1\]"),
        ({"balance_abs_threshold": -1}, "balance abs threshold must be >= 0"),
        ({"balance_rel_threshold": 0.9}, "balance rel threshold must be >= 1"),
        ({"max_tree_size": -5}, "max tree size must be >= 0"),
    ],
)
def test_bad_settings_are_refused_with_a_clear_message(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _settings(**changes)


def test_the_tree_size_is_the_routers_default_unless_set() -> None:
    assert _settings(router=Router.VLLM).tree_size == DEFAULT_MAX_TREE_SIZE[Router.VLLM]
    assert _settings(max_tree_size=1000).tree_size == 1000


def test_with_knobs_takes_every_routing_knob_from_the_config() -> None:
    config = (
        get_adapter("vllm")
        .default_config()
        .with_(
            routing_policy="power_of_two",
            cache_threshold=0.6,
            balance_abs_threshold=16,
            balance_rel_threshold=2.0,
        )
    )
    applied = _settings().with_knobs(config, engine_replicas=4, shares_prefixes=True)
    assert applied == _settings(
        policy=RoutingPolicy.POWER_OF_TWO,
        cache_threshold=0.6,
        balance_abs_threshold=16,
        balance_rel_threshold=2.0,
    )
    assert applied.knob_values() == {
        "routing_policy": "power_of_two",
        "cache_threshold": 0.6,
        "balance_abs_threshold": 16,
        "balance_rel_threshold": 2.0,
    }


def test_with_knobs_resolves_auto_by_the_engines_replicas() -> None:
    config = get_adapter("sglang").default_config()
    assert config.routing_policy == AUTO_POLICY
    assert (
        _settings().with_knobs(config, engine_replicas=1, shares_prefixes=True).policy
        is RoutingPolicy.KUBE_PROXY
    )
    assert (
        _settings().with_knobs(config, engine_replicas=3, shares_prefixes=True).policy
        is RoutingPolicy.CACHE_AWARE
    )


def test_with_knobs_refuses_a_trial_policy_the_router_lacks() -> None:
    config = get_adapter("sglang").default_config().with_(routing_policy="consistent_hash")
    with pytest.raises(ValueError, match="sglang-router has no consistent_hash policy"):
        _settings().with_knobs(config, engine_replicas=2, shares_prefixes=True)

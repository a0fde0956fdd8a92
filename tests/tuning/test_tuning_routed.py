"""Routing tuned with the engine: the router's knobs in the space (``tuning/routed.py``)."""

from __future__ import annotations

from typing import Any

from prefixtune.engines import get_adapter
from prefixtune.routing.policy import ROUTER_POLICIES, Router, RoutingPolicy
from prefixtune.tuning.optimizer import TrialResult, suggest
from prefixtune.tuning.policy import initial_state, space_of
from prefixtune.tuning.routed import LADDERS, Routing
from prefixtune.tuning.settings import SpaceOverride, TuningSettings
from prefixtune.tuning.space import SearchSpace, build_space

ROUTER_KNOBS = ("routing_policy", "cache_threshold", "balance_abs_threshold", "balance_rel_threshold")
ADAPTER = get_adapter("sglang")
ROUTED = ADAPTER.default_config().with_(routing_policy="cache_aware")


def space(
    replicas: int = 4, base: Any = ROUTED, router: Router = Router.SGLANG, **listed: Any
) -> SearchSpace:
    override = SpaceOverride.from_mapping(listed)
    return build_space(ADAPTER.knobs(), base, ADAPTER.normalize, override, routing=Routing(router, replicas))


def test_with_one_replica_the_router_knobs_never_enter_the_space_even_listed() -> None:
    sp = space(replicas=1, routing_policy=["cache_aware", "round_robin"], cache_threshold=[0.1, 0.5])
    assert not set(ROUTER_KNOBS) & set(sp.names)
    assert sp.base.routing_policy == "cache_aware"  # the base keeps its routing


def test_behind_a_router_the_space_searches_its_policies_and_a_ladder_per_threshold() -> None:
    sp = space()
    policy = sp.dimension("routing_policy")
    assert policy is not None
    assert set(policy.choices) == {p.value for p in ROUTER_POLICIES[Router.SGLANG]}
    for name, ladder in LADDERS.items():
        d = sp.dimension(name)
        assert d is not None and d.choices == ladder
    vllm = space(router=Router.VLLM).dimension("routing_policy")
    assert vllm is not None and RoutingPolicy.CONSISTENT_HASH.value in vllm.choices


def test_a_listed_routing_space_is_searched_exactly() -> None:
    sp = space(routing_policy=["cache_aware", "round_robin"], cache_threshold=[0.5, 0.7])
    policy, threshold = sp.dimension("routing_policy"), sp.dimension("cache_threshold")
    assert policy is not None and policy.choices == ("cache_aware", "round_robin")
    assert threshold is not None and threshold.choices == (0.5, 0.7)
    # the thresholds not listed are searched by default (the baseline runs a router)
    assert sp.dimension("balance_abs_threshold") is not None


def test_a_baseline_on_kube_proxy_searches_routing_only_where_listed() -> None:
    plain = ROUTED.with_(routing_policy="kube-proxy")
    assert not set(ROUTER_KNOBS) & set(space(base=plain).names)
    listed = space(base=plain, routing_policy=["kube-proxy", "cache_aware"])
    assert listed.names[-1] == "routing_policy"


def test_without_routing_information_the_adapters_table_is_searched_as_it_is() -> None:
    sp = build_space(ADAPTER.knobs(), ROUTED, ADAPTER.normalize)
    assert not set(ROUTER_KNOBS) & set(sp.names)


def test_thresholds_collapse_under_every_policy_but_cache_aware() -> None:
    """The thresholds are a conditional dimension: a round_robin config is one config whatever
    thresholds were asked, so the optimizer never spends a trial on thresholds it does not read."""
    sp = space(cache_threshold=[0.5, 0.7])
    robin = sp.normalize(
        ROUTED.with_(routing_policy="round_robin", cache_threshold=0.7, balance_abs_threshold=16)
    )
    assert (robin.cache_threshold, robin.balance_abs_threshold) == (0.5, 64)  # 0.3 is not listed: first
    aware = sp.normalize(ROUTED.with_(cache_threshold=0.7, balance_abs_threshold=16))
    assert (aware.cache_threshold, aware.balance_abs_threshold) == (0.7, 16)
    combos = [c for c in sp.categorical_combos() if c.routing_policy == "round_robin"]
    engine_combos = {(c.block_size, c.prefix_caching, c.schedule_policy) for c in combos}
    assert len(combos) == len(engine_combos)  # one per engine combination: thresholds collapsed
    assert all(sp.contains(c) for c in combos)


def test_the_optimizer_suggests_within_a_routed_space() -> None:
    sp = space()
    history = [TrialResult(sp.base, 100.0), TrialResult(sp.base.with_(routing_policy="random"), 60.0)]
    s = suggest(sp, history, seed=3)
    assert s.config is not None and sp.contains(s.config) and s.config == sp.normalize(s.config)


def test_auto_is_searched_as_the_policy_it_resolves_to() -> None:
    """A spec's ``auto`` runs cache_aware with replicas and prefix caching on: the space holds that
    policy, so a trial of cache_aware over an ``auto`` baseline is the same config."""
    auto = ROUTED.with_(routing_policy="auto")
    sp = space(base=auto)
    assert sp.base.routing_policy == "cache_aware" and sp.dimension("routing_policy") is not None
    assert sp.normalize(auto) == sp.normalize(ROUTED)
    assert sp.normalize(auto.with_(prefix_caching=False)).routing_policy == "kube-proxy"


def test_the_policys_space_holds_the_router_knobs_with_replicas_and_not_with_one() -> None:
    settings = TuningSettings(router=Router.SGLANG)
    assert "routing_policy" in space_of(initial_state("sglang", settings, ROUTED, replicas=4)).names
    assert "routing_policy" not in space_of(initial_state("sglang", settings, ROUTED, replicas=1)).names

"""The router model's decisions (twin/router.py): each policy's rule, the cache-aware tree and its
thresholds, session affinity, eviction. Pure: no engine runs here."""

from __future__ import annotations

import pytest

from prefixtune.routing.policy import CacheAwareThresholds, Router, RoutingPolicy
from prefixtune.twin.prompt import Segment, TokenSeq, chain_key
from prefixtune.twin.request import Request
from prefixtune.twin.router import (
    CHARS_PER_TOKEN,
    ApproxTree,
    Decision,
    RouterModel,
    RoutingConfig,
    imbalanced,
)

SYSTEM = Segment(chain_key(0, "system"), 100)


def _seq(*parts: tuple[str, int]) -> TokenSeq:
    segs, key = [], 0
    for name, length in parts:
        key = chain_key(key, name)
        segs.append(Segment(key, length))
    return TokenSeq(tuple(segs))


def _req(i: int, seq: TokenSeq, session: int | None = None) -> Request:
    return Request(i, float(i), seq, seq.length, 8, session=session)


def _router(policy: RoutingPolicy, n: int = 4, **kw: object) -> RouterModel:
    return RouterModel(RoutingConfig(policy=policy, **kw), n, seed=7)  # type: ignore[arg-type]


def test_tree_matches_the_longest_inserted_prefix() -> None:
    tree = ApproxTree()
    tree.insert(_seq(("sys", 100), ("q1", 50)), 0.0)
    assert tree.match(_seq(("sys", 100), ("q1", 50), ("more", 10))) == 150
    assert tree.match(_seq(("sys", 100), ("q2", 50))) == 100
    assert tree.match(_seq(("other", 100))) == 0
    assert tree.size == 150


def test_tree_counts_a_partial_segment_and_stops_there() -> None:
    tree = ApproxTree()
    tree.insert(_seq(("sys", 100)).truncate(40), 0.0)
    assert tree.match(_seq(("sys", 100), ("q", 5))) == 40


def test_eviction_drops_least_recently_used_leaves_until_the_tree_fits() -> None:
    tree = ApproxTree()
    old, new = _seq(("sys", 100), ("old", 50)), _seq(("sys", 100), ("new", 50))
    tree.insert(old, 1.0)
    tree.insert(new, 2.0)
    assert tree.evict(160) == 50
    assert tree.match(old) == 100 and tree.match(new) == 150


def test_eviction_removes_a_parent_once_its_children_are_gone() -> None:
    tree = ApproxTree()
    tree.insert(_seq(("sys", 100), ("q", 50)), 1.0)
    tree.evict(0)
    assert tree.size == 0 and tree.match(_seq(("sys", 100))) == 0


def test_imbalance_needs_both_the_absolute_and_the_relative_spread() -> None:
    t = CacheAwareThresholds(balance_abs_threshold=64, balance_rel_threshold=1.5)
    assert imbalanced([200, 100], t)  # 100 > 64 and 200 > 150
    assert not imbalanced([164, 100], t)  # 64 is not > 64
    assert not imbalanced([1000, 900], t)  # 1000 is not > 1350


def test_cache_aware_sends_an_imbalanced_load_to_the_least_loaded_replica() -> None:
    r = _router(RoutingPolicy.CACHE_AWARE)
    seq = _seq(("sys", 100), ("q", 10))
    r.trees[0].insert(seq, 0.0)
    routed = r.route(_req(1, seq), [100, 3, 30, 40], 1.0)
    assert routed == type(routed)(1, Decision.LOAD_BALANCE, 0.0)
    assert r.trees[1].match(seq) == 110  # the tree learns the text in the imbalanced case too


def test_cache_aware_follows_the_best_match_above_the_threshold() -> None:
    r = _router(RoutingPolicy.CACHE_AWARE)
    r.trees[2].insert(_seq(("sys", 100), ("q", 10)), 0.0)
    routed = r.route(_req(1, _seq(("sys", 100), ("q", 10), ("turn", 40))), [5, 0, 9, 0], 1.0)
    assert routed.replica == 2 and routed.decision is Decision.CACHE_AFFINITY
    assert routed.match_ratio == pytest.approx(110 / 150)


def test_cache_aware_needs_the_ratio_strictly_above_the_threshold() -> None:
    seq = _seq(("sys", 100), ("q", 100))  # replica 2 holds exactly half of it
    for threshold, want in ((0.5, (1, Decision.SMALLEST_TREE)), (0.49, (2, Decision.CACHE_AFFINITY))):
        r = _router(RoutingPolicy.CACHE_AWARE, thresholds=CacheAwareThresholds(cache_threshold=threshold))
        for i, (name, size) in enumerate((("x", 500), ("y", 50), ("sys", 100), ("z", 400))):
            r.trees[i].insert(_seq((name, size)), 0.0)
        routed = r.route(_req(1, seq), [0, 0, 0, 0], 1.0)
        assert (routed.replica, routed.decision) == want


def test_low_match_goes_to_the_smallest_tree_on_sglang_and_the_least_load_on_vllm() -> None:
    seq = _seq(("fresh", 100))
    sizes = [50, 10, 70, 30]
    for low_match, want, decision in (
        (Router.SGLANG, 1, Decision.SMALLEST_TREE),
        (Router.VLLM, 3, Decision.LOW_MATCH_MIN_LOAD),
    ):
        r = _router(RoutingPolicy.CACHE_AWARE, low_match=low_match)
        for tree, size in zip(r.trees, sizes, strict=True):
            tree.insert(_seq(("filler", size)), 0.0)
        routed = r.route(_req(1, seq), [4, 5, 6, 2], 1.0)
        assert (routed.replica, routed.decision) == (want, decision)


def test_vllm_router_without_token_ids_routes_by_load_alone_and_keeps_no_tree() -> None:
    seq = _seq(("sys", 100), ("q", 10))
    for tokens, want in ((True, (2, Decision.CACHE_AFFINITY)), (False, (1, Decision.MISSING_TOKENS))):
        r = _router(RoutingPolicy.CACHE_AWARE, low_match=Router.VLLM, tokens=tokens)
        r.trees[2].insert(seq, 0.0)
        routed = r.route(_req(1, seq), [3, 0, 2, 1], 1.0)
        assert (routed.replica, routed.decision) == want
        assert r.trees[1].size == (0 if not tokens else r.trees[1].size)
    blind = _router(RoutingPolicy.CACHE_AWARE, low_match=Router.VLLM, tokens=False)
    blind.route(_req(1, seq), [0, 0, 0, 0], 1.0)
    assert [t.size for t in blind.trees] == [0, 0, 0, 0]


def test_sglang_router_reads_the_text_whatever_the_engines_serve() -> None:
    seq = _seq(("sys", 100), ("q", 10))
    r = _router(RoutingPolicy.CACHE_AWARE, low_match=Router.SGLANG, tokens=False)
    r.trees[2].insert(seq, 0.0)
    assert r.route(_req(1, seq), [3, 0, 2, 1], 1.0).decision is Decision.CACHE_AFFINITY


def test_ties_on_the_best_match_pick_one_replica_per_prefix() -> None:
    r = _router(RoutingPolicy.CACHE_AWARE)
    for tree in r.trees:
        tree.insert(_seq(("sys", 100)), 0.0)
    picks = {r.route(_req(i, _seq(("sys", 100), (f"q{i}", 20))), [0] * 4, 1.0).replica for i in range(8)}
    assert len(picks) == 1  # the shared prefix's node names one holder: the routers' hot spot


def test_the_tree_budget_evicts_every_interval() -> None:
    r = _router(RoutingPolicy.CACHE_AWARE, n=1, max_tree_size=100 * CHARS_PER_TOKEN, eviction_interval_s=10.0)
    r.route(_req(1, _seq(("a", 80))), [0], 1.0)
    r.route(_req(2, _seq(("b", 80))), [0], 2.0)
    assert r.trees[0].size == 160  # over budget until the next eviction round
    r.route(_req(3, _seq(("c", 10))), [0], 10.0)
    assert r.evicted_tokens == 80 and r.trees[0].match(_seq(("a", 80))) == 0


def test_consistent_hash_keeps_a_session_on_one_replica() -> None:
    r = _router(RoutingPolicy.CONSISTENT_HASH)
    for session in range(20):
        seen = {
            r.route(_req(t, _seq((f"s{session}-{t}", 10)), session), [0] * 4, 0.0).replica for t in range(5)
        }
        assert len(seen) == 1
    assert all(s > 0 for s in r.sent)  # and sessions spread over the replicas


def test_round_robin_takes_replicas_in_turn() -> None:
    r = _router(RoutingPolicy.ROUND_ROBIN, n=3)
    assert [r.route(_req(i, _seq(("x", 5))), [0] * 3, 0.0).replica for i in range(6)] == [0, 1, 2, 0, 1, 2]


def test_power_of_two_never_picks_the_more_loaded_of_its_draws() -> None:
    r = _router(RoutingPolicy.POWER_OF_TWO, n=2)
    assert all(r.route(_req(i, _seq(("x", 5))), [9, 1], 0.0).replica == 1 for i in range(20))


def test_random_and_kube_proxy_spread_requests_and_repeat_for_a_seed() -> None:
    for policy in (RoutingPolicy.RANDOM, RoutingPolicy.KUBE_PROXY):
        a, b = _router(policy), _router(policy)
        picks = [a.route(_req(i, _seq(("x", 5))), [0] * 4, 0.0).replica for i in range(400)]
        assert picks == [b.route(_req(i, _seq(("x", 5))), [0] * 4, 0.0).replica for i in range(400)]
        assert all(60 < picks.count(k) < 140 for k in range(4))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cache_threshold": 1.5}, "cache threshold"),
        ({"balance_abs_threshold": -1}, "balance abs threshold"),
        ({"balance_rel_threshold": 0.5}, "balance rel threshold"),
    ],
)
def test_bad_thresholds_are_refused_with_their_name(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CacheAwareThresholds(**kwargs)  # type: ignore[arg-type]


def test_a_tree_smaller_than_one_token_is_refused() -> None:
    with pytest.raises(ValueError, match="max_tree_size"):
        RoutingConfig(policy=RoutingPolicy.CACHE_AWARE, max_tree_size=1)

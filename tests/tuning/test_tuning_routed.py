"""Routing tuned with the engine: the router's knobs in the space, the price of a routing trial, and
the canary behind a router (``tuning/routed.py``), in virtual time."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from prefixtune.controller.observe import desired
from prefixtune.engines import get_adapter
from prefixtune.engines.knobs import Restarts
from prefixtune.metrics.signals import Signals
from prefixtune.routing.policy import ROUTER_POLICIES, Router, RoutingPolicy
from prefixtune.tuning.actions import Action, EmitEvent, RecordTrial, RollBack, RollOut
from prefixtune.tuning.objective import ScoreBasis
from prefixtune.tuning.optimizer import Suggestion, TrialResult, suggest
from prefixtune.tuning.phases import Step
from prefixtune.tuning.policy import initial_state, space_of, step
from prefixtune.tuning.policy.rollout import ROUTER_NOT_READY
from prefixtune.tuning.routed import (
    ROUTER_READY_TIMEOUT_S,
    Routing,
    decided_split,
    one_device,
    price,
    trial_strategy,
)
from prefixtune.tuning.settings import Slo, SpaceOverride, TuningSettings
from prefixtune.tuning.space import SearchSpace, build_space
from prefixtune.tuning.state import Observation, RolloutReady, SpecChanged, Tick, WindowMeasured

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
    ladders = {"cache_threshold": (0.1, 0.3, 0.5), "balance_abs_threshold": (32, 64, 128)}
    ladders["balance_rel_threshold"] = (1.25, 1.5, 2.0)  # the routers' default and a neighbour each side
    for name, ladder in ladders.items():
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
    # resolved from the resource's own config, not the trial's: caching off in a trial keeps it
    assert sp.normalize(auto.with_(prefix_caching=False)).routing_policy == "cache_aware"


def test_the_policys_space_holds_the_router_knobs_with_replicas_and_not_with_one() -> None:
    settings = TuningSettings(router=Router.SGLANG)
    assert "routing_policy" in space_of(initial_state("sglang", settings, ROUTED, replicas=4)).names
    assert "routing_policy" not in space_of(initial_state("sglang", settings, ROUTED, replicas=1)).names


def test_a_routing_only_change_restarts_the_router_and_waits_for_its_start_only() -> None:
    running = ROUTED
    routing = price(running, running.with_(routing_policy="round_robin"), engine_ready_timeout_s=1800.0)
    engine = price(running, running.with_(block_size=32), engine_ready_timeout_s=1800.0)
    both = price(running, running.with_(block_size=32, cache_threshold=0.5), engine_ready_timeout_s=1800.0)
    assert routing.restarts == {Restarts.ROUTER} and routing.ready_timeout_s == ROUTER_READY_TIMEOUT_S
    assert engine.restarts == {Restarts.ENGINE} and engine.ready_timeout_s == 1800.0
    assert both.engines_restart and both.ready_timeout_s == 1800.0
    assert "router only" in routing.text() and "no model load" in routing.text()


def test_a_routing_change_rolls_over_every_pod_even_under_a_canary_strategy() -> None:
    """One router serves the fleet: a canary pod cannot run another routing policy than its
    baseline, so a change of a router knob is measured on every pod."""
    assert trial_strategy("canary", ROUTED, ROUTED.with_(routing_policy="random")) == "rolling"
    assert trial_strategy("canary", ROUTED, ROUTED.with_(block_size=32)) == "canary"


def test_only_a_deciding_router_policy_makes_the_split_the_routers_decision() -> None:
    assert decided_split(Router.SGLANG, ROUTED, 4)
    assert decided_split(Router.VLLM, ROUTED.with_(routing_policy="consistent_hash"), 4)
    assert not decided_split(Router.SGLANG, ROUTED.with_(routing_policy="random"), 4)
    assert not decided_split(Router.SGLANG, ROUTED.with_(routing_policy="kube-proxy"), 4)
    assert not decided_split(None, ROUTED, 4)


def test_a_deciding_policy_reached_through_auto_needs_the_replicas_it_resolves_with() -> None:
    auto = ROUTED.with_(routing_policy="auto")
    assert decided_split(Router.SGLANG, auto, 4) and not decided_split(Router.SGLANG, auto, 1)


# --- the policy in virtual time ---------------------------------------------------------------

SETTINGS = TuningSettings(
    warmup_s=60, measure_s=300, min_requests=100, max_trials=3, min_interval_s=600, seed_key="ns/r",
    slo=Slo(2.0, 0.15), strategy="canary", router=Router.SGLANG, ready_timeout_s=1800.0,
)  # fmt: skip


def window(goodput: float = 1000.0, requests: float = 500.0) -> Signals:
    # TTFT p99 at the SLO: no headroom, the score is the measured goodput (tuning/objective.py)
    return Signals(
        window_s=300.0, requests=requests, hit_rate=0.6, ttft_p50_s=0.2, ttft_p99_s=2.0, itl_p50_s=0.02,
        itl_p99_s=0.05, output_tokens_per_s=goodput * 1.05, input_tokens_per_s=2000.0, requests_per_s=1.0,
        goodput_tokens_per_s=goodput, slo_attainment=0.95,
    )  # fmt: skip


class Run:
    def __init__(self, trial: Any, replicas: int = 4, base: Any = ROUTED) -> None:
        self.state = initial_state("sglang", SETTINGS, base, replicas=replicas)
        self.base = base
        self.trial = trial
        self.actions: list[Action] = []

    def suggester(
        self, sp: SearchSpace, history: list[TrialResult], seed: int, s: TuningSettings
    ) -> Suggestion:
        return (
            Suggestion(self.trial, "scripted")
            if len(history) == 1
            else Suggestion(None, "done", converged=True)
        )

    def __call__(self, obs: Observation, now: float) -> list[Action]:
        self.state, actions = step(self.state, obs, now, self.suggester)
        self.actions.extend(actions)
        return actions

    def baseline(self) -> float:
        self(RolloutReady(config=self.base), 0.0)
        self(Tick(), 60.0)
        self(WindowMeasured(signals=window(), offered_rps=1.0), 360.0)
        return 360.0


def test_a_routing_trial_rolls_over_the_fleet_and_waits_for_the_router_only() -> None:
    trial_config = ROUTED.with_(routing_policy="round_robin")
    r = Run(trial_config)
    now = r.baseline()
    (roll,) = [a for a in r.actions if isinstance(a, RollOut)]
    assert (roll.config, roll.strategy) == (trial_config, "rolling")
    trial = r.state.trial(r.state.active or 0)
    assert trial.router_only and trial.strategy == "rolling"
    want = desired(r.state)
    assert want.canary is None and want.baseline == trial_config  # no canary: the router serves all pods
    (started,) = [e for e in r.actions if isinstance(e, EmitEvent) and e.reason == "TrialStarted"]
    assert "router only" in started.message
    # the router's start, not the engines' load: within the router's timeout nothing ends
    assert not [a for a in r(Tick(), now + ROUTER_READY_TIMEOUT_S - 1) if isinstance(a, RecordTrial)]


def test_a_router_not_available_in_time_aborts_the_routing_trial_without_calling_it_infeasible() -> None:
    r = Run(ROUTED.with_(routing_policy="round_robin"))
    now = r.baseline()
    acts = r(Tick(), now + ROUTER_READY_TIMEOUT_S + 1)
    (aborted,) = [a.trial for a in acts if isinstance(a, RecordTrial)]
    assert (aborted.outcome, aborted.failure) == ("aborted", ROUTER_NOT_READY)
    assert [e.reason for e in acts if isinstance(e, EmitEvent) and e.type == "Warning"] == ["RouterNotReady"]


def test_a_router_not_available_in_time_rolls_back_to_the_previous_routing() -> None:
    r = Run(ROUTED.with_(routing_policy="round_robin"))
    now = r.baseline()
    acts = r(Tick(), now + ROUTER_READY_TIMEOUT_S + 1)
    (back,) = [a for a in acts if isinstance(a, RollBack)]
    assert back.to_config == ROUTED and r.state.step == Step.ROLLING_BACK
    assert desired(r.state).baseline == ROUTED  # the router renders the previous routing again


def test_a_trial_of_the_policy_auto_resolves_to_restarts_nothing_of_the_router() -> None:
    r = Run(ROUTED.with_(block_size=32), base=ROUTED.with_(routing_policy="auto"))
    r.baseline()
    trial = r.state.trial(r.state.active or 0)
    assert (trial.strategy, trial.router_only) == ("canary", False)


def test_an_engine_trial_still_waits_for_the_engines_budget() -> None:
    r = Run(ROUTED.with_(block_size=32))
    now = r.baseline()
    assert not r.state.trial(r.state.active or 0).router_only
    assert not [a for a in r(Tick(), now + ROUTER_READY_TIMEOUT_S + 1) if isinstance(a, RecordTrial)]
    assert desired(r.state).canary == ROUTED.with_(block_size=32)


def test_a_routing_trial_is_scored_on_every_pod_not_paired_with_itself() -> None:
    trial_config = ROUTED.with_(routing_policy="round_robin")
    r = Run(trial_config)
    now = r.baseline()
    r(RolloutReady(config=trial_config), now + 10)
    assert r.state.current == trial_config  # the fleet runs it
    r(Tick(), now + 70)
    obs = WindowMeasured(signals=window(goodput=800.0), baseline_signals=window(), offered_rps=1.0)
    (recorded,) = [a.trial for a in r(obs, now + 370) if isinstance(a, RecordTrial)]
    assert recorded.terms is not None and recorded.terms.basis == ScoreBasis.LOAD_NORMALIZED
    assert recorded.value == pytest.approx(800.0)


def test_a_canary_behind_a_cache_aware_router_is_scored_by_the_share_it_was_sent() -> None:
    """The router sent the new canary pod whole new sessions, three times a pod's share: goodput
    per request served is equal, so the canary ties rather than winning for its share."""
    r = Run(ROUTED.with_(block_size=32))
    now = r.baseline()
    r(RolloutReady(config=ROUTED.with_(block_size=32)), now + 30)
    r(Tick(), now + 90)
    obs = WindowMeasured(
        signals=window(goodput=375.0, requests=375.0),  # 3 x a pod's share of 500 over 4 pods
        baseline_signals=window(goodput=375.0, requests=375.0),  # three stable pods
        canary_pods=1,
        baseline_pods=3,
    )
    (recorded,) = [a.trial for a in r(obs, now + 390) if isinstance(a, RecordTrial)]
    assert recorded.terms is not None and recorded.terms.basis == ScoreBasis.PAIRED
    assert recorded.terms.split == pytest.approx(3.0) and recorded.terms.ratio == pytest.approx(1.0)


def test_a_canary_behind_a_random_router_keeps_the_bounded_correction() -> None:
    spread = ROUTED.with_(routing_policy="random")
    r = Run(spread.with_(block_size=32), base=spread)
    now = r.baseline()
    r(RolloutReady(config=r.trial), now + 30)
    r(Tick(), now + 90)
    obs = WindowMeasured(
        signals=window(goodput=375.0, requests=375.0), baseline_signals=window(goodput=375.0, requests=375.0),
        canary_pods=1, baseline_pods=3,
    )  # fmt: skip
    (recorded,) = [a.trial for a in r(obs, now + 390) if isinstance(a, RecordTrial)]
    assert recorded.terms is not None and recorded.terms.split == 2.0


def test_another_router_reopens_the_search_in_a_new_epoch() -> None:
    """vllm-router has consistent_hash, sglang-router does not: the space is another one."""
    r = Run(ROUTED.with_(block_size=32))
    now = r.baseline()
    r(SpecChanged(settings=replace(SETTINGS, router=Router.VLLM)), now + 10)
    assert (r.state.phase, r.state.epoch) == ("Baseline", 1)
    policy = space_of(r.state).dimension("routing_policy")
    assert policy is not None and "consistent_hash" in policy.choices


def test_under_a_canary_strategy_a_suggestion_moving_engine_and_router_runs_its_routing_first() -> None:
    """Whole, it would roll every engine pod at once; its router part is a cheap fleet trial."""
    both = ROUTED.with_(block_size=32, routing_policy="round_robin")
    r = Run(both)
    r.baseline()
    trial = r.state.trial(r.state.active or 0)
    assert trial.config == ROUTED.with_(routing_policy="round_robin") and trial.router_only
    assert "its routing first" in trial.reason


def test_under_a_rolling_strategy_a_suggestion_moving_both_runs_whole() -> None:
    both = ROUTED.with_(block_size=32, routing_policy="round_robin")
    assert one_device("rolling", ROUTED, both) == both
    assert one_device("canary", ROUTED, ROUTED.with_(block_size=32)) == ROUTED.with_(block_size=32)


def test_auto_is_the_resources_choice_a_trial_turning_caching_on_brings_no_router() -> None:
    """The spec runs prefix caching off, so auto is kube-proxy: a trial with caching on keeps it."""
    spec = ROUTED.with_(routing_policy="auto", prefix_caching=False)
    sp = space(base=spec, prefix_caching=[True])
    assert "routing_policy" not in sp.names
    assert sp.normalize(spec.with_(prefix_caching=True)).routing_policy == "kube-proxy"

"""spec.routing: its defaults, the routing knobs' baseline, and a policy the router lacks refused."""

from __future__ import annotations

from typing import Any

import pytest

from prefixtune.api import parse_spec
from prefixtune.api.validation import validate_spec
from prefixtune.routing.policy import DEFAULT_ROUTER_IMAGE, Router

from .test_api_cel import _failing

BASE: dict[str, Any] = {"model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 4}


@pytest.mark.parametrize(
    ("engine", "router"),
    [("sglang", Router.SGLANG), ("vllm", Router.VLLM), ("trtllm", Router.SGLANG)],
)
def test_the_router_and_its_image_default_by_engine(engine: str, router: Router) -> None:
    routing = parse_spec({**BASE, "engine": engine}).routing
    assert routing.router is router
    assert routing.image == DEFAULT_ROUTER_IMAGE[router]
    assert (routing.policy, routing.replicas, routing.max_tree_size) == ("auto", 1, None)


def test_the_routing_knobs_baseline_comes_from_spec_routing() -> None:
    routing = {
        "policy": "round_robin",
        "cacheThreshold": 0.5,
        "balanceAbsThreshold": 8,
        "balanceRelThreshold": 2,
    }
    config = parse_spec({**BASE, "engine": "vllm", "routing": routing}).knob_config()
    assert (config.routing_policy, config.cache_threshold) == ("round_robin", 0.5)
    assert (config.balance_abs_threshold, config.balance_rel_threshold) == (8, 2.0)


def test_an_omitted_routing_section_leaves_the_knobs_at_auto_and_the_routers_defaults() -> None:
    config = parse_spec({**BASE, "engine": "sglang"}).knob_config()
    assert (config.routing_policy, config.cache_threshold) == ("auto", 0.3)
    assert (config.balance_abs_threshold, config.balance_rel_threshold) == (64, 1.5)


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_a_policy_the_engines_router_lacks_is_refused_at_its_field(engine: str) -> None:
    spec = {**BASE, "engine": engine, "routing": {"policy": "consistent_hash"}}
    _, errors = validate_spec(spec)
    assert [str(e) for e in errors] == [
        "spec.routing.policy: sglang-router has no consistent_hash policy; it has cache_aware, "
        "power_of_two, random, round_robin (or kube-proxy: no router); consistent_hash needs "
        "routing.router vllm-router"
    ]
    assert _failing(spec) == ["routing.policy consistent_hash needs routing.router vllm-router"]


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_a_policy_the_named_router_has_is_accepted_on_any_engine(engine: str) -> None:
    spec = {**BASE, "engine": engine, "routing": {"policy": "consistent_hash", "router": "vllm-router"}}
    assert validate_spec(spec)[1] == []
    assert _failing(spec) == []


def test_a_searched_policy_the_router_lacks_is_refused_in_the_space() -> None:
    spec = {
        **BASE,
        "engine": "sglang",
        "tuning": {"space": {"routingPolicy": ["cache_aware", "consistent_hash"]}},
    }
    _, errors = validate_spec(spec)
    assert [e.path for e in errors] == ["spec.tuning.space.routingPolicy[1]"]
    assert _failing(spec) == [
        "tuning.space.routingPolicy has consistent_hash, which needs routing.router vllm-router"
    ]
    vllm = {**spec, "engine": "vllm"}
    assert validate_spec(vllm)[1] == [] and _failing(vllm) == []


@pytest.mark.parametrize(
    ("routing", "path"),
    [
        ({"policy": "least_loaded"}, "spec.routing.policy"),
        ({"router": "nginx"}, "spec.routing.router"),
        ({"cacheThreshold": 1.5}, "spec.routing.cacheThreshold"),
        ({"balanceAbsThreshold": -1}, "spec.routing.balanceAbsThreshold"),
        ({"balanceRelThreshold": 0.5}, "spec.routing.balanceRelThreshold"),
        ({"replicas": 0}, "spec.routing.replicas"),
        ({"maxTreeSize": 0}, "spec.routing.maxTreeSize"),
        ({"image": "UPPER CASE"}, "spec.routing.image"),
    ],
)
def test_bad_routing_values_are_refused_at_their_field(routing: dict[str, Any], path: str) -> None:
    _, errors = validate_spec({**BASE, "engine": "vllm", "routing": routing})
    assert [e.path for e in errors] == [path]


def test_spec_config_refuses_a_routing_knob() -> None:
    _, errors = validate_spec({**BASE, "engine": "vllm", "config": {"routingPolicy": "random"}})
    assert [e.path for e in errors] == ["spec.config.routingPolicy"]


def test_an_adopting_resource_may_not_name_a_router_policy() -> None:
    adopt = {**BASE, "engine": "vllm", "adopt": {"deployment": "llama"}}
    _, errors = validate_spec({**adopt, "routing": {"policy": "cache_aware"}})
    assert [e.path for e in errors] == ["spec.routing.policy"]
    assert "an adopting resource gets no router" in errors[0].message
    assert validate_spec({**adopt, "routing": {"policy": "kube-proxy"}})[1] == []

"""The router's knobs in the knob registry: what a change restarts, and that no engine renders them."""

from __future__ import annotations

import pytest

from prefixtune.api.models import ConfigSpec, KnobValues
from prefixtune.engines import KnobConfig, get_adapter
from prefixtune.engines.cli import main as args_main
from prefixtune.engines.knobs import (
    BY_NAME,
    ENGINE_KNOB_NAMES,
    ENGINE_KNOBS,
    KNOBS,
    ROUTER_KNOBS,
    Restarts,
    api_text,
    restarts_of,
    to_api,
)
from prefixtune.routing.policy import AUTO_POLICY, ROUTER_POLICIES, CacheAwareThresholds, RoutingPolicy

ENGINES = ("vllm", "sglang", "trtllm")
ROUTING = ("routing_policy", "cache_threshold", "balance_abs_threshold", "balance_rel_threshold")
TRIAL = {"routing_policy": "cache_aware", "cache_threshold": 0.5, "balance_abs_threshold": 8}


def _config(engine: str = "vllm") -> KnobConfig:
    return get_adapter(engine).default_config()


def test_the_routing_knobs_are_the_registrys_last_and_restart_only_the_router() -> None:
    assert tuple(k.name for k in ROUTER_KNOBS) == ROUTING
    assert KNOBS == ENGINE_KNOBS + ROUTER_KNOBS
    assert all(k.restarts is Restarts.ROUTER for k in ROUTER_KNOBS)
    assert all(k.restarts is Restarts.ENGINE for k in ENGINE_KNOBS)
    assert [k.camel for k in ROUTER_KNOBS] == [
        "routingPolicy",
        "cacheThreshold",
        "balanceAbsThreshold",
        "balanceRelThreshold",
    ]


def test_the_routing_knobs_unset_values_are_auto_and_the_routers_defaults() -> None:
    defaults = CacheAwareThresholds()
    assert BY_NAME["routing_policy"].unset == AUTO_POLICY
    assert BY_NAME["cache_threshold"].unset == defaults.cache_threshold
    assert BY_NAME["balance_abs_threshold"].unset == defaults.balance_abs_threshold
    assert BY_NAME["balance_rel_threshold"].unset == defaults.balance_rel_threshold


def test_a_config_stored_before_the_routing_knobs_reads_with_their_unset_values() -> None:
    old = {"memory_fraction": 0.9, "block_size": 16, "prefix_caching": True, "schedule_policy": "fcfs"}
    config = KnobConfig.from_dict(old)
    assert {name: config.get(name) for name in ROUTING} == {k.name: k.unset for k in ROUTER_KNOBS}
    recorded = KnobValues.model_validate(
        {"memoryFraction": 0.9, "blockSize": 16, "prefixCaching": True, "schedulePolicy": "fcfs"}
    )
    assert recorded.to_knob_config() == config


def test_restarts_of_names_the_router_for_a_routing_change_and_the_engine_for_an_engine_one() -> None:
    base = _config()
    assert restarts_of(base, base) == frozenset()
    assert restarts_of(base, base.with_(**TRIAL)) == {Restarts.ROUTER}
    assert restarts_of(base, base.with_(block_size=32)) == {Restarts.ENGINE}
    assert restarts_of(base, base.with_(block_size=32, cache_threshold=0.9)) == {
        Restarts.ENGINE,
        Restarts.ROUTER,
    }


@pytest.mark.parametrize("engine", ENGINES)
def test_no_engine_renders_a_routing_knob_as_a_flag(engine: str) -> None:
    adapter = get_adapter(engine)
    base = adapter.default_config()
    plain = adapter.render("org/model", base)
    routed = adapter.render("org/model", base.with_(**TRIAL, balance_rel_threshold=4.0))
    assert routed == plain
    assert adapter.knob_options(base.with_(**TRIAL)) == adapter.knob_options(base)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_carries_the_same_unsearched_routing_specs(engine: str) -> None:
    knobs = get_adapter(engine).knobs()
    assert all(not knobs[name].searched for name in ROUTING)
    assert [knobs[name] for name in ROUTING] == [get_adapter("vllm").knobs()[name] for name in ROUTING]
    policies = set(knobs["routing_policy"].choices)
    assert policies == {p.value for p in RoutingPolicy}
    assert set().union(*ROUTER_POLICIES.values()) <= {RoutingPolicy(p) for p in policies}


def test_a_routing_knob_accepts_any_value_in_its_range_and_refuses_one_outside() -> None:
    adapter = get_adapter("sglang")
    assert adapter.validate(_config("sglang").with_(cache_threshold=0.42, balance_rel_threshold=3.3)) == []
    errors = adapter.validate(_config("sglang").with_(cache_threshold=1.5, balance_rel_threshold=0.5))
    assert [name for name, _ in errors] == ["cache_threshold", "balance_rel_threshold"]
    assert "must be in [0.0, 1.0], got 1.5" in errors[0][1]
    bad_policy = adapter.validate(_config("sglang").with_(routing_policy="least_loaded"))
    assert bad_policy and "must be one of kube-proxy, random" in bad_policy[0][1]


def test_spec_config_holds_only_the_engine_knobs() -> None:
    assert tuple(ConfigSpec.model_fields) == ENGINE_KNOB_NAMES
    config = _config().with_(**TRIAL)
    assert ConfigSpec.from_knob_config(config).to_knob_config() == _config()


def test_the_api_and_display_show_a_routing_knob_only_when_set() -> None:
    base = _config()
    assert "route" not in api_text(to_api(base))
    shown = api_text(to_api(base.with_(**TRIAL)))
    assert "cache_aware" in shown and "cache thr 0.5" in shown and "bal abs 8" in shown
    assert to_api(base.with_(**TRIAL))["routingPolicy"] == "cache_aware"


def test_the_args_cli_refuses_a_routing_knob(capsys: pytest.CaptureFixture[str]) -> None:
    code = args_main(["--engine", "vllm", "--model", "m", "--set", "routingPolicy=cache_aware"])
    assert code == 2
    assert (
        "'routingPolicy' is the router's knob (spec.routing), not an engine flag" in capsys.readouterr().err
    )

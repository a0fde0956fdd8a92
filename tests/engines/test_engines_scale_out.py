"""What a router needs of the engines: vLLM's ``--enable-scale-out`` (the render routes vllm-router
routes on), rendered whenever a router may be in front, owned, read back; the other engines unchanged."""

from __future__ import annotations

import pytest

from prefixtune.api import validate_spec
from prefixtune.engines import ArgsError, get_adapter
from prefixtune.engines.base import KnobConfig
from prefixtune.routing.policy import (
    ANY_ROUTER_NEEDS,
    AUTO_POLICY,
    ROUTER_NEEDS,
    EngineNeed,
    Router,
    RoutingPolicy,
)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FLAG = "--enable-scale-out"
ROUTED = [AUTO_POLICY, *(p.value for p in RoutingPolicy if p is not RoutingPolicy.KUBE_PROXY)]
SPELLINGS = ["--enable-scale-out", "--disable-scale-out", "--no-enable-scale-out", "--enable_scale_out"]


def _vllm(policy: str) -> KnobConfig:
    return get_adapter("vllm").default_config().with_(routing_policy=policy)


def test_only_vllm_router_needs_the_request_as_token_ids() -> None:
    assert ROUTER_NEEDS[Router.VLLM] == {EngineNeed.TOKEN_IDS}
    assert ROUTER_NEEDS[Router.SGLANG] == frozenset()
    assert set(ANY_ROUTER_NEEDS) == {EngineNeed.TOKEN_IDS}


@pytest.mark.parametrize("policy", ROUTED)
def test_vllm_serves_the_render_routes_whenever_a_router_may_be_in_front(policy: str) -> None:
    adapter = get_adapter("vllm")
    rendered = adapter.render(MODEL, _vllm(policy))
    assert rendered.argv.count(FLAG) == 1
    parsed = adapter.parse(rendered.argv)
    assert parsed.options.render_routes is True and parsed.extra_args == ()


def test_vllm_under_kube_proxy_renders_no_scale_out_flag() -> None:
    adapter = get_adapter("vllm")
    rendered = adapter.render(MODEL, _vllm(RoutingPolicy.KUBE_PROXY.value))
    assert not {FLAG, "--disable-scale-out"} & set(rendered.argv)
    assert adapter.parse(rendered.argv).options.render_routes is None


def test_a_trial_between_router_policies_and_thresholds_leaves_the_vllm_command_as_it_was() -> None:
    adapter = get_adapter("vllm")
    commands = {
        adapter.render(MODEL, _vllm(policy).with_(cache_threshold=0.7, balance_abs_threshold=8)).argv
        for policy in ROUTED
    }
    assert len(commands) == 1


def test_a_command_that_disables_it_reads_back_as_serving_no_render_routes() -> None:
    adapter = get_adapter("vllm")
    argv = [*adapter.render(MODEL, _vllm(RoutingPolicy.CACHE_AWARE.value)).argv, "--disable-scale-out"]
    assert adapter.parse(argv).options.render_routes is False


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_extra_args_may_not_set_the_scale_out_flag(spelling: str) -> None:
    adapter = get_adapter("vllm")
    assert adapter.owned_args([spelling]) == [spelling]
    with pytest.raises(ArgsError, match="the operator owns these flags"):
        adapter.render(MODEL, adapter.default_config(), [spelling])
    _, errors = validate_spec({"engine": "vllm", "model": MODEL, "extraArgs": [spelling]})
    (error,) = errors
    assert error.path == "spec.extraArgs[0]" and "spec.routing decides it" in error.message


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_the_other_engines_commands_do_not_follow_the_routing_policy(engine: str) -> None:
    adapter = get_adapter(engine)
    base = adapter.default_config()
    plain = adapter.render(MODEL, base.with_(routing_policy=RoutingPolicy.KUBE_PROXY.value))
    routed = adapter.render(MODEL, base.with_(routing_policy=RoutingPolicy.CACHE_AWARE.value))
    assert routed == plain
    assert adapter.parse(routed.argv, routed.files).options.render_routes is None

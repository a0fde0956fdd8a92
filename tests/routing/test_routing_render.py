"""The router's objects as the operator renders them: args from RoutingSettings, ownership, labels."""

from __future__ import annotations

from typing import Any

import pytest

from prefixtune.api import parse_spec
from prefixtune.controller import render as R
from prefixtune.routing import render as RR
from prefixtune.routing.policy import (
    DEFAULT_MAX_TREE_SIZE,
    ROUTER_METRICS_PORT,
    ROUTER_PORT,
    Router,
    RoutingPolicy,
)

OWNER = R.Owner(namespace="team", name="chat", uid="uid-1")


def _spec(engine: str = "sglang", replicas: int = 4, **extra: Any) -> Any:
    return parse_spec(
        {"engine": engine, "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": replicas, **extra}
    )


def _routed(spec: Any, monitoring: bool = False, ready: bool = True, config: Any = None) -> dict[str, Any]:
    settings = RR.settings_for(spec, config or spec.knob_config())
    objects = R.render_routed(OWNER, spec, settings, router_ready=ready, monitoring=monitoring)
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _container(dep: dict[str, Any]) -> dict[str, Any]:
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_auto_with_four_replicas_renders_a_cache_aware_router_and_its_rbac() -> None:
    objects = _routed(_spec())
    assert sorted(objects) == [
        "Deployment/chat-router",
        "Role/chat-router",
        "RoleBinding/chat-router",
        "Service/chat",
        "ServiceAccount/chat-router",
    ]
    args = _container(objects["Deployment/chat-router"])["args"]
    assert _flag(args, "--policy") == "cache_aware"


def test_one_replica_or_kube_proxy_or_caching_off_resolves_to_no_router() -> None:
    for spec in (
        _spec(replicas=1),
        _spec(routing={"policy": "kube-proxy"}),
        _spec(config={"prefixCaching": False}),
    ):
        assert not RR.settings_for(spec, spec.knob_config()).routed


@pytest.mark.parametrize(
    ("engine", "command"), [("sglang", ["sglang-router", "launch"]), ("vllm", ["vllm-router"])]
)
def test_the_router_container_runs_the_wheels_command_with_every_setting(
    engine: str, command: list[str]
) -> None:
    spec = _spec(engine, routing={"cacheThreshold": 0.5, "balanceAbsThreshold": 16, "balanceRelThreshold": 2})
    container = _container(_routed(spec)["Deployment/chat-router"])
    assert container["command"] == command
    args = container["args"]
    engine_port = R.get_adapter(engine).metrics_port
    assert (_flag(args, "--host"), _flag(args, "--port")) == ("0.0.0.0", str(ROUTER_PORT))
    assert (_flag(args, "--cache-threshold"), _flag(args, "--balance-abs-threshold")) == ("0.5", "16")
    assert _flag(args, "--balance-rel-threshold") == "2"
    assert _flag(args, "--max-tree-size") == str(DEFAULT_MAX_TREE_SIZE[Router(f"{engine}-router")])
    assert (_flag(args, "--prometheus-host"), _flag(args, "--prometheus-port")) == (
        "0.0.0.0",
        str(ROUTER_METRICS_PORT),
    )
    assert "--service-discovery" in args
    at = args.index("--selector")
    assert args[at + 1 : at + 3] == ["app.kubernetes.io/component=serving", "prefixtune.io/resource=chat"]
    assert _flag(args, "--service-discovery-namespace") == "team"
    assert _flag(args, "--service-discovery-port") == str(engine_port)


def test_a_trials_routing_knobs_reach_the_router_args() -> None:
    spec = _spec("vllm")
    trial = spec.knob_config().with_(routing_policy="consistent_hash", cache_threshold=0.9)
    args = _container(_routed(spec, config=trial)["Deployment/chat-router"])["args"]
    assert (_flag(args, "--policy"), _flag(args, "--cache-threshold")) == ("consistent_hash", "0.9")


def test_the_discovery_selector_matches_the_engine_pods_and_never_the_router_pods() -> None:
    spec = _spec()
    engine_pods = R.render_deployment(OWNER, spec, spec.knob_config(), "canary", 1)["spec"]["template"]
    router_pods = _routed(spec)["Deployment/chat-router"]["spec"]["template"]
    selector = R.engine_selector("chat")
    assert selector.items() <= engine_pods["metadata"]["labels"].items()
    assert not selector.items() <= router_pods["metadata"]["labels"].items()
    assert (
        not R.selector_labels("chat").items() <= router_pods["metadata"]["labels"].items()
    )  # engines' Service
    assert router_pods["metadata"]["labels"]["app.kubernetes.io/component"] == "router"


def test_every_router_object_is_owned_and_labelled_as_the_operators() -> None:
    for obj in _routed(_spec()).values():
        meta = obj["metadata"]
        assert meta["namespace"] == "team"
        assert meta["ownerReferences"] == [OWNER.reference()]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "prefixtune"
        assert meta["labels"]["prefixtune.io/resource"] == "chat"
        assert meta["labels"]["app.kubernetes.io/component"] == "router"


def test_the_role_grants_only_get_list_watch_pods_to_the_routers_account() -> None:
    objects = _routed(_spec())
    assert objects["Role/chat-router"]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    binding = objects["RoleBinding/chat-router"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "chat-router",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "chat-router", "namespace": "team"}]
    pod = objects["Deployment/chat-router"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "chat-router" and pod["automountServiceAccountToken"] is True


def test_the_router_runs_hardened_with_requests_sized_from_its_tree() -> None:
    spec = _spec(routing={"replicas": 2, "maxTreeSize": 1 << 20})
    dep = _routed(spec)["Deployment/chat-router"]
    assert dep["spec"]["replicas"] == 2
    container = _container(dep)
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": f"{256 + 8}Mi"}  # 4 x 1 Mi x 2 B


def test_the_routers_only_writable_directory_is_a_bounded_scratch_volume_as_its_home() -> None:
    dep = _routed(_spec())["Deployment/chat-router"]
    container = _container(dep)
    assert container["env"] == [{"name": "HOME", "value": "/tmp"}]
    (mount,) = container["volumeMounts"]
    (volume,) = dep["spec"]["template"]["spec"]["volumes"]
    assert mount == {"name": volume["name"], "mountPath": "/tmp"}
    assert volume["emptyDir"] == {"sizeLimit": "1Gi"}


def test_the_user_facing_service_keeps_its_name_and_port_and_selects_the_router_once_ready() -> None:
    spec = _spec()
    port = R.get_adapter("sglang").metrics_port
    ready = _routed(spec)["Service/chat"]
    assert ready["spec"]["selector"] == {"prefixtune.io/router": "chat"}
    assert ready["spec"]["ports"] == [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]
    waiting = _routed(spec, ready=False)["Service/chat"]
    assert waiting["spec"]["selector"] == R.selector_labels("chat")  # the engine pods meanwhile


def test_with_the_service_monitor_the_engines_get_their_own_service_and_the_monitor_only_those() -> None:
    spec = _spec()
    objects = _routed(spec, monitoring=True)
    engines = objects["Service/chat-engines"]
    assert engines["spec"]["selector"] == R.selector_labels("chat")
    selector = R.render_service_monitor(OWNER, spec)["spec"]["selector"]["matchLabels"]
    assert selector.items() <= engines["metadata"]["labels"].items()
    assert not selector.items() <= objects["Service/chat"]["metadata"]["labels"].items()


def test_the_tree_mirrors_the_engines_pool_in_characters_up_to_the_routers_default() -> None:
    assert RR.tree_size_for(Router.SGLANG, None) == DEFAULT_MAX_TREE_SIZE[Router.SGLANG]
    assert RR.tree_size_for(Router.SGLANG, 500_000) == 2_000_000
    assert RR.tree_size_for(Router.VLLM, 10**9) == DEFAULT_MAX_TREE_SIZE[Router.VLLM]
    spec = _spec()
    assert RR.settings_for(spec, spec.knob_config(), pool_tokens=100_000).tree_size == 400_000
    pinned = _spec(routing={"maxTreeSize": 1234})
    assert RR.settings_for(pinned, pinned.knob_config(), pool_tokens=100_000).tree_size == 1234


def test_the_router_defaults_by_engine_in_settings() -> None:
    assert RR.settings_for(_spec("trtllm"), _spec("trtllm").knob_config()).router is Router.SGLANG
    assert RR.settings_for(_spec("sglang"), _spec("sglang").knob_config()).policy is RoutingPolicy.CACHE_AWARE


def test_an_adopting_resource_gets_no_router() -> None:
    spec = _spec("vllm", adopt={"deployment": "llama"})
    assert not RR.settings_for(spec, spec.knob_config()).routed


def test_a_config_whose_policy_the_new_router_lacks_renders_the_specs_baseline_policy() -> None:
    # consistent_hash ran behind vllm-router; the spec now names sglang-router, which has no such policy.
    spec = _spec(routing={"router": "sglang-router", "policy": "cache_aware"})
    old = spec.knob_config().with_(routing_policy="consistent_hash")
    settings = RR.settings_for(spec, old)
    assert settings.router.value == "sglang-router" and settings.policy.value == "cache_aware"


def test_a_deleted_router_pod_drains_its_requests_in_flight_before_it_is_signalled() -> None:
    dep = _routed(_spec())["Deployment/chat-router"]
    pod = dep["spec"]["template"]["spec"]
    assert _container(dep)["lifecycle"] == {
        "preStop": {"exec": {"command": ["sleep", str(RR.ROUTER_DRAIN_S)]}}
    }
    assert pod["terminationGracePeriodSeconds"] > RR.ROUTER_DRAIN_S  # the drain ends before the kill


def test_the_router_is_probed_on_its_own_readiness_and_liveness_paths() -> None:
    container = _container(_routed(_spec())["Deployment/chat-router"])
    assert container["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "http"}

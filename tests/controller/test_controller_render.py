"""Rendering of the ServingDeployment's children: args, probes, labels, owner refs, TRT ConfigMap."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from prefixtune.api import parse_spec
from prefixtune.controller import render as R
from prefixtune.engines import get_adapter
from prefixtune.engines.base import KnobConfig

OWNER = R.Owner(namespace="team", name="rag", uid="uid-1")


def _spec(engine: str = "vllm", **extra: Any) -> Any:
    return parse_spec({"engine": engine, "model": "meta-llama/Llama-3.1-8B-Instruct", **extra})


def _container(dep: dict[str, Any]) -> dict[str, Any]:
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return container


def test_vllm_deployment_runs_the_adapters_command_with_gpu_limit_probes_and_labels() -> None:
    spec = _spec(replicas=3, gpu={"count": 2, "type": "H200"}, extraArgs=["--max-model-len", "8192"])
    config = spec.knob_config().with_(block_size=32)
    dep = R.render_deployment(OWNER, spec, config, "baseline", 3)
    container = _container(dep)
    rendered = get_adapter("vllm").render(spec.model, config, spec.extra_args, None, 2)
    assert container["command"] == list(rendered.command) == ["vllm", "serve"]
    assert container["args"] == list(rendered.args)
    assert (
        "--block-size" in container["args"]
        and container["args"][container["args"].index("--block-size") + 1] == "32"
    )
    assert "--max-model-len" in container["args"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["image"] == get_adapter("vllm").default_image
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels[R.LABEL_NAME] == "vllm"
    assert labels[R.LABEL_INSTANCE] == "rag"
    assert labels[R.LABEL_RESOURCE] == "rag"
    assert labels[R.LABEL_ROLE] == "baseline"
    assert labels[R.LABEL_CONFIG_HASH] == R.config_hash(config)
    assert dep["spec"]["selector"]["matchLabels"] == {R.LABEL_RESOURCE: "rag", R.LABEL_ROLE: "baseline"}
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8000"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert R.pod_config(dep["spec"]["template"]) == config
    assert dep["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert dep["spec"]["replicas"] == 3
    (ref,) = dep["metadata"]["ownerReferences"]
    assert ref == {
        "apiVersion": "prefixtune.io/v1alpha1", "kind": "ServingDeployment", "name": "rag", "uid": "uid-1",
        "controller": True, "blockOwnerDeletion": True,
    }  # fmt: skip
    assert dep["metadata"]["namespace"] == "team"


def test_canary_has_its_own_name_selector_and_one_replica_and_baseline_gives_one_up() -> None:
    spec = _spec(replicas=3)
    canary = R.render_deployment(
        OWNER, spec, spec.knob_config(), "canary", R.replicas_for(spec, "canary", True)
    )
    assert canary["metadata"]["name"] == "rag-canary"
    assert canary["spec"]["replicas"] == 1
    assert canary["spec"]["selector"]["matchLabels"][R.LABEL_ROLE] == "canary"
    assert R.replicas_for(spec, "baseline", True) == 2
    assert R.replicas_for(spec, "baseline", False) == 3
    # The stable pods roll one at a time, never below the replicas; the canary is recreated (its
    # next config needs no GPU beyond its own).
    assert canary["spec"]["strategy"] == {"type": "Recreate"}
    stable = R.render_deployment(OWNER, spec, spec.knob_config(), "baseline", 2)
    assert stable["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    service = R.render_service(OWNER, spec)
    # The Service selects both roles, so the canary takes its share of the same traffic.
    assert service["spec"]["selector"] == {R.LABEL_RESOURCE: "rag"}
    assert service["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_trtllm_options_file_goes_to_a_configmap_mounted_where_the_args_point() -> None:
    spec = _spec("trtllm", replicas=1)
    config = spec.knob_config()
    cm = R.render_configmap(OWNER, spec, config, "baseline")
    assert cm is not None
    dep = R.render_deployment(OWNER, spec, config, "baseline", 1)
    container = _container(dep)
    path = container["args"][container["args"].index("--extra_llm_api_options") + 1]
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == path
    assert mount["subPath"] in cm["data"]
    assert "tokens_per_block" in cm["data"][mount["subPath"]]
    (volume,) = dep["spec"]["template"]["spec"]["volumes"]
    assert volume["configMap"]["name"] == cm["metadata"]["name"] == "rag-options"
    assert cm["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    # The sandbox kubelet resolves the same file from the mount (what a real kubelet does).
    from prefixtune.sandbox.pods import mounted_files

    files = mounted_files(
        {"spec": dep["spec"]["template"]["spec"]}, container, {cm["metadata"]["name"]: cm["data"]}
    )
    parsed = get_adapter("trtllm").parse(container["command"] + container["args"], files)
    assert parsed.config == config


def test_vllm_has_no_configmap_and_sglang_uses_its_own_port() -> None:
    assert R.render_configmap(OWNER, _spec(), _spec().knob_config(), "baseline") is None
    spec = _spec("sglang")
    dep = R.render_deployment(OWNER, spec, spec.knob_config(), "baseline", 1)
    assert _container(dep)["ports"][0]["containerPort"] == get_adapter("sglang").metrics_port == 30000


def test_sglangs_latency_histograms_have_the_resources_slo_targets_as_bounds() -> None:
    # Goodput counts the requests within each target from these histograms: a target between two
    # bounds would be interpolated (the default ITL target, 150 ms, lies in SGLang's 100-200 ms).
    spec = _spec("sglang", tuning={"slo": {"ttftP99": "700ms", "itlP99": "150ms"}})
    parsed = get_adapter("sglang").parse(R.render_command(spec, spec.knob_config()).argv)
    # the bounds are the targets the goodput is computed against, to the bit
    assert float(spec.tuning.slo.ttft_p99) in parsed.options["ttft_buckets"]
    assert float(spec.tuning.slo.itl_p99) in parsed.options["itl_buckets"]


def test_config_hash_is_stable_and_distinguishes_configs() -> None:
    a = KnobConfig(0.9, 16, True, "fcfs")
    assert R.config_hash(a) == R.config_hash(KnobConfig(0.9, 16, True, "fcfs"))
    assert R.config_hash(a) != R.config_hash(a.with_(block_size=32))
    assert len(R.config_hash(a)) == 10


def test_a_routing_knob_leaves_the_engine_pods_hash_and_annotation_as_they_were() -> None:
    spec = _spec(replicas=2)
    config = spec.knob_config()
    routed = config.with_(routing_policy="round_robin", cache_threshold=0.7, balance_abs_threshold=4)
    assert R.config_hash(routed) == R.config_hash(config)
    assert R.render_deployment(OWNER, spec, routed, "baseline", 2) == R.render_deployment(
        OWNER, spec, config, "baseline", 2
    )


def test_the_config_hash_of_a_config_at_the_routers_defaults_is_the_one_before_routing_knobs() -> None:
    # The hash main rendered for this config (engine knobs only): an operator upgrade restarts nothing.
    config = KnobConfig(0.9, 16, True, "fcfs")
    before = {
        "memory_fraction": 0.9, "block_size": 16, "prefix_caching": True, "schedule_policy": "fcfs",
        "max_batched_tokens": 0, "max_running": 0,
    }  # fmt: skip
    assert (
        R.config_hash(config) == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:10]
    )


def test_service_monitor_selects_the_service() -> None:
    mon = R.render_service_monitor(OWNER, _spec())
    assert mon["kind"] == "ServiceMonitor"
    assert mon["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    assert mon["spec"]["selector"]["matchLabels"][R.LABEL_RESOURCE] == "rag"
    # The operator's labels travel onto the series, so its queries can require them.
    assert mon["spec"]["podTargetLabels"] == [R.LABEL_MANAGED_BY, R.LABEL_RESOURCE]


def test_prometheus_labels_are_the_pod_labels_as_prometheus_names_them() -> None:
    assert R.prometheus_labels("rag") == {
        "app_kubernetes_io_managed_by": "prefixtune",
        "prefixtune_io_resource": "rag",
    }


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_rendered_args_parse_back_to_the_same_config(engine: str) -> None:
    spec = _spec(engine)
    config = spec.knob_config()
    dep = R.render_deployment(OWNER, spec, config, "baseline", 1)
    container = _container(dep)
    cm = R.render_configmap(OWNER, spec, config, "baseline")
    files = {}
    if cm is not None:
        from prefixtune.sandbox.pods import mounted_files

        files = mounted_files(
            {"spec": dep["spec"]["template"]["spec"]}, container, {cm["metadata"]["name"]: cm["data"]}
        )
    assert get_adapter(engine).parse(container["command"] + container["args"], files).config == config


# --- what a router needs of the engines (vLLM's --enable-scale-out) ----------------------------


def _args(spec: Any, config: KnobConfig | None = None) -> list[str]:
    dep = R.render_deployment(OWNER, spec, config or spec.knob_config(), "baseline", spec.replicas)
    return list(_container(dep)["args"])


def test_a_scale_from_one_replica_to_two_leaves_the_vllm_pods_command_as_it_was() -> None:
    one, two = _spec(replicas=1), _spec(replicas=2)
    # The search resolves auto by the replicas of the moment: kube-proxy at one, cache_aware at two.
    at_one = _args(one, one.knob_config().with_(routing_policy="kube-proxy"))
    at_two = _args(two, two.knob_config().with_(routing_policy="cache_aware"))
    assert at_one == at_two == _args(one)
    assert "--enable-scale-out" in at_one


def test_vllm_pods_serve_a_router_when_the_space_lists_one_beside_kube_proxy() -> None:
    spec = _spec(
        replicas=2,
        routing={"policy": "kube-proxy"},
        tuning={"space": {"routingPolicy": ["kube-proxy", "cache_aware"]}},
    )
    trials = [_args(spec, spec.knob_config().with_(routing_policy=p)) for p in ("kube-proxy", "cache_aware")]
    assert trials[0] == trials[1] and "--enable-scale-out" in trials[0]


def test_vllm_pods_that_never_have_a_router_in_front_serve_no_render_routes() -> None:
    spec = _spec(replicas=2, routing={"policy": "kube-proxy"})
    assert "--enable-scale-out" not in _args(spec)
    assert "--enable-scale-out" not in _args(spec, spec.knob_config().with_(routing_policy="cache_aware"))
    adopting = _spec(replicas=2, adopt={"deployment": "team-vllm"})
    assert "--enable-scale-out" not in _args(adopting)


def test_vllm_pods_behind_sglang_router_serve_no_render_routes() -> None:
    # sglang-router routes on the request's text: the render routes would only be surface
    spec = _spec(replicas=2, routing={"router": "sglang-router"})
    assert "--enable-scale-out" not in _args(spec)
    assert "--enable-scale-out" in _args(_spec(replicas=2, routing={"router": "vllm-router"}))

"""The sandbox's pure parts: rollout arithmetic, ReplicaSet pods, Endpoints, reading pods, scrape targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from prefixtune.engines import EngineName, get_adapter
from prefixtune.sandbox import controllers as ctl
from prefixtune.sandbox import pods as podlib
from prefixtune.sandbox.prometheus import DCGM_JOB, ENGINE_JOB, config_yaml, scrape_targets
from prefixtune.sandbox.up import SandboxOptions

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _deployment(
    replicas: int = 4, surge: Any = None, unavailable: Any = None, image: str = "v1"
) -> dict[str, Any]:
    rolling = {k: v for k, v in (("maxSurge", surge), ("maxUnavailable", unavailable)) if v is not None}
    return {
        "metadata": {"name": "web", "namespace": "default", "uid": "dep-uid", "generation": 1},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": image}]},
            },
        },
    }


def _rs(
    dep: dict[str, Any], name: str, spec_replicas: int, pods: int, available: int, revision: int
) -> dict[str, Any]:
    pod_hash = ctl.template_hash(dep["spec"]["template"]) if name == "new" else f"old{revision}"
    return {
        "metadata": {
            "name": f"web-{pod_hash}",
            "namespace": "default",
            "uid": f"rs-{name}",
            "labels": {"app": "web", ctl.HASH_LABEL: pod_hash},
            "annotations": {ctl.REVISION_ANNOTATION: str(revision)},
            "ownerReferences": [{"uid": "dep-uid", "kind": "Deployment"}],
            "creationTimestamp": f"2026-01-01T00:00:0{revision}Z",
        },
        "spec": {"replicas": spec_replicas},
        "status": {"replicas": pods, "availableReplicas": available, "readyReplicas": available},
    }


def _scales(writes: list[ctl.Write]) -> dict[str, int]:
    return {
        w.path.rsplit("/", 1)[-1]: w.body["spec"]["replicas"]
        for w in writes
        if isinstance(w, ctl.Patch) and "spec" in w.body and not w.path.endswith("/status")
    }


@pytest.mark.parametrize(
    ("replicas", "surge", "unavailable", "expected"),
    [
        (4, None, None, (1, 1)),  # 25% each: surge rounds up, unavailable down
        (10, "25%", "25%", (3, 2)),
        (3, 0, 0, (0, 1)),  # both zero: kube makes unavailable 1
        (2, 1, 0, (1, 0)),
        (5, "50%", 2, (3, 2)),
    ],
)
def test_surge_and_unavailable_follow_kube_rounding(
    replicas: int, surge: Any, unavailable: Any, expected: tuple[int, int]
) -> None:
    assert ctl.surge_and_unavailable(_deployment(replicas, surge, unavailable)) == expected


def test_a_bad_surge_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"maxSurge"):
        ctl.surge_and_unavailable(_deployment(4, "lots"))


def test_a_new_template_creates_a_replicaset_within_the_surge() -> None:
    dep = _deployment(4, 1, 0, image="v2")
    old = _rs(dep, "old", 4, 4, 4, 1)
    writes = ctl.reconcile_deployment(dep, [old], 0.0)
    created = [w for w in writes if isinstance(w, ctl.Create)]
    assert len(created) == 1
    body = created[0].body
    pod_hash = ctl.template_hash(dep["spec"]["template"])
    assert body["metadata"]["name"] == f"web-{pod_hash}"
    assert body["spec"]["replicas"] == 1  # 4 + surge 1 - 4 existing
    assert body["spec"]["selector"]["matchLabels"][ctl.HASH_LABEL] == pod_hash
    assert body["spec"]["template"]["metadata"]["labels"][ctl.HASH_LABEL] == pod_hash
    assert body["metadata"]["ownerReferences"][0]["uid"] == "dep-uid"
    assert body["metadata"]["annotations"][ctl.REVISION_ANNOTATION] == "2"
    assert _scales(writes) == {}  # nothing is scaled down before the new pod is available


def test_rolling_scales_old_down_only_as_new_pods_become_available() -> None:
    dep = _deployment(4, 1, 0, image="v2")
    old = _rs(dep, "old", 4, 4, 4, 1)
    new_waiting = _rs(dep, "new", 1, 1, 0, 2)
    assert _scales(ctl.reconcile_deployment(dep, [old, new_waiting], 0.0)) == {}
    new_ready = _rs(dep, "new", 1, 1, 1, 2)
    scales = _scales(ctl.reconcile_deployment(dep, [old, new_ready], 0.0))
    assert scales == {old["metadata"]["name"]: 3}


def test_unavailable_old_replicas_are_dropped_first() -> None:
    dep = _deployment(4, 0, 1, image="v2")
    old = _rs(dep, "old", 4, 4, 2, 1)  # two old pods crash-looping
    new = _rs(dep, "new", 0, 0, 0, 2)
    scales = _scales(ctl.reconcile_deployment(dep, [old, new], 0.0))
    # Only 2 of 4 are available, below minAvailable 3: scaling down by availability would remove
    # nothing; kube's cleanup of unhealthy replicas still lets one go (4 pods - 3 min available).
    assert scales[old["metadata"]["name"]] == 3


def test_deployment_status_counts_pods_and_sets_conditions() -> None:
    dep = _deployment(2, 1, 0)
    new = _rs(dep, "new", 2, 2, 2, 1)
    writes = ctl.reconcile_deployment(dep, [new], 1_000_000.0)
    status = next(w.body["status"] for w in writes if isinstance(w, ctl.Patch) and w.path.endswith("/status"))
    assert status["replicas"] == status["updatedReplicas"] == status["availableReplicas"] == 2
    assert status["unavailableReplicas"] == 0 and status["observedGeneration"] == 1
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Available"]["status"] == "True"
    assert conds["Progressing"]["reason"] == "NewReplicaSetAvailable"


def test_progress_deadline_is_exceeded_in_sandbox_time() -> None:
    dep = _deployment(1, 1, 0)
    dep["spec"]["progressDeadlineSeconds"] = 600
    new = _rs(dep, "new", 1, 1, 0, 1)
    first = ctl.deployment_status(dep, new["status"], 1, [], 0, 1000.0, speedup=100.0)
    dep["status"] = first
    stalled = ctl.deployment_status(dep, new["status"], 1, [], 0, 1007.0, speedup=100.0)  # 7 s > 600/100
    conds = {c["type"]: c for c in stalled["conditions"]}
    assert conds["Progressing"]["status"] == "False"
    assert conds["Progressing"]["reason"] == "ProgressDeadlineExceeded"


def _pod(
    name: str, *, ready: bool, ip: str = "127.9.0.1", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "labels": labels or {"app": "web"},
            "ownerReferences": [{"uid": "rs-new"}],
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "nodeName": "sandbox-node",
            "containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 8000}]}],
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_replicaset_creates_missing_pods_and_deletes_not_ready_ones_first() -> None:
    dep = _deployment(2)
    rs = _rs(dep, "new", 3, 0, 0, 1)
    rs["spec"]["template"] = dep["spec"]["template"]
    writes = ctl.reconcile_replicaset(rs, [_pod("a", ready=True)])
    creates = [w for w in writes if isinstance(w, ctl.Create)]
    assert len(creates) == 2
    assert creates[0].body["metadata"]["generateName"] == f"{rs['metadata']['name']}-"
    assert creates[0].body["metadata"]["ownerReferences"][0]["uid"] == "rs-new"
    rs["spec"]["replicas"] = 1
    writes = ctl.reconcile_replicaset(rs, [_pod("a", ready=True), _pod("b", ready=False)])
    deletes = [w.path for w in writes if isinstance(w, ctl.Delete)]
    assert deletes == ["/api/v1/namespaces/default/pods/b"]


def test_endpoints_list_ready_and_not_ready_pods_with_named_target_ports() -> None:
    service = {
        "metadata": {"name": "web", "namespace": "default", "uid": "svc"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }
    pods = [
        _pod("a", ready=True, ip="127.9.0.1"),
        _pod("b", ready=False, ip="127.9.0.2"),
        _pod("c", ready=True, ip="127.9.0.3", labels={"app": "other"}),
    ]
    result = ctl.endpoints_for(service, pods)
    assert result is not None
    endpoints, endpoint_slice = result
    (subset,) = endpoints["subsets"]
    assert [a["ip"] for a in subset["addresses"]] == ["127.9.0.1"]
    assert [a["ip"] for a in subset["notReadyAddresses"]] == ["127.9.0.2"]
    assert subset["ports"] == [{"name": "http", "port": 8000, "protocol": "TCP"}]
    assert ctl.endpoint_targets(endpoints) == [("127.9.0.1", 8000)]
    assert [e["conditions"]["ready"] for e in endpoint_slice["endpoints"]] == [True, False]
    assert ctl.endpoints_for({"metadata": {"name": "x"}, "spec": {}}, pods) is None


class _ListingApi:
    """The controller manager's API client over fixed listings; records what it writes."""

    def __init__(self, listings: dict[str, list[dict[str, Any]]]) -> None:
        self.listings = listings
        self.applied: list[Any] = []

    async def list(self, path: str) -> list[dict[str, Any]]:
        return self.listings.get(path, [])

    async def apply(self, write: Any) -> None:
        self.applied.append(write)


async def test_a_services_endpoints_hold_only_the_selected_pods_of_its_own_namespace() -> None:
    from prefixtune.sandbox.controller_manager import ControllerManager
    from prefixtune.sandbox.kubelet import KubeletConfig

    service = {
        "metadata": {"name": "web", "namespace": "default", "uid": "svc"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }
    elsewhere = _pod("b", ready=True, ip="127.9.0.2")
    elsewhere["metadata"]["namespace"] = "other"  # the same labels in another namespace
    other = _pod("c", ready=True, ip="127.9.0.3", labels={"app": "other"})  # not selected
    pods = [_pod("a", ready=True), elsewhere, other]
    api = _ListingApi({"/api/v1/services": [service], "/api/v1/pods": pods})
    await ControllerManager(api, KubeletConfig())._sync_endpoints()  # type: ignore[arg-type]
    endpoints = next(w.body for w in api.applied if w.body["kind"] == "Endpoints")
    assert [a["ip"] for s in endpoints["subsets"] for a in s["addresses"]] == ["127.9.0.1"]


@pytest.mark.parametrize(
    ("command", "args", "image", "engine"),
    [
        (["vllm", "serve"], [MODEL], "", EngineName.VLLM),
        (["/usr/local/bin/vllm", "serve"], [MODEL], "", EngineName.VLLM),
        (["python", "-m", "sglang.launch_server"], ["--model-path", MODEL], "", EngineName.SGLANG),
        (["trtllm-serve"], [MODEL], "", EngineName.TRTLLM),
        ([], [MODEL, "--port", "8000"], "vllm/vllm-openai:v0.11.0", EngineName.VLLM),
        ([], ["--model-path", MODEL], "lmsysorg/sglang:v0.5.3", EngineName.SGLANG),
        (["bash", "-c"], ["vllm serve x"], "", None),
    ],
)
def test_engine_detection_from_command_or_image(
    command: list[str], args: list[str], image: str, engine: EngineName | None
) -> None:
    container = {"command": command, "args": args, "image": image}
    assert podlib.detect_engine(podlib.container_argv(container)) == engine


def test_a_non_engine_command_fails_like_a_bad_entrypoint() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "command": ["sleep", "1"]}]}}
    with pytest.raises(podlib.LaunchError) as exc:
        podlib.launch_plan(pod, {})
    assert exc.value.exit_code == 127 and "sleep 1" in exc.value.message


def test_configmap_mounts_whole_items_and_subpath() -> None:
    pod = {
        "spec": {
            "volumes": [
                {"name": "all", "configMap": {"name": "cm"}},
                {
                    "name": "some",
                    "configMap": {"name": "cm", "items": [{"key": "a", "path": "renamed.yaml"}]},
                },
                {"name": "missing", "configMap": {"name": "nope", "optional": True}},
            ]
        }
    }
    container = {
        "volumeMounts": [
            {"name": "all", "mountPath": "/etc/all"},
            {"name": "some", "mountPath": "/etc/some"},
            {"name": "all", "mountPath": "/opt/one.yaml", "subPath": "b"},
            {"name": "missing", "mountPath": "/etc/missing"},
        ]
    }
    files = podlib.mounted_files(pod, container, {"cm": {"a": "A", "b": "B"}})
    assert files == {
        "/etc/all/a": "A",
        "/etc/all/b": "B",
        "/etc/some/renamed.yaml": "A",
        "/opt/one.yaml": "B",
    }
    pod["spec"]["volumes"][2]["configMap"]["optional"] = False
    with pytest.raises(podlib.LaunchError, match='configmap "nope" not found'):
        podlib.mounted_files(pod, container, {"cm": {"a": "A", "b": "B"}})


def test_gpu_type_precedence_annotation_selector_node_default() -> None:
    pod: dict[str, Any] = {"metadata": {}, "spec": {}}
    assert podlib.gpu_type(pod) == "H100-80GB"
    assert podlib.gpu_type(pod, {"prefixtune.io/gpu-type": "A100-80GB"}) == "A100-80GB"
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert podlib.gpu_type(pod, {"prefixtune.io/gpu-type": "A100-80GB"}) == "NVIDIA-H200"
    pod["metadata"]["annotations"] = {podlib.GPU_ANNOTATION: "H100"}
    assert podlib.gpu_type(pod) == "H100"


def test_pod_status_backoff_keeps_phase_running_and_never_fails_terminated() -> None:
    last = podlib.terminated(2, "Error", "vllm serve: error: unrecognized arguments: --x", "t0", "t1")
    backoff = podlib.ContainerState("backoff", restart_count=3, message="back-off 40s", last_exit=last)
    status = podlib.pod_status(
        container="engine", image="i", state=backoff, pod_ip="127.1.0.1", host_ip="127.0.0.1", start_time="t0"
    )
    cs = status["containerStatuses"][0]
    assert status["phase"] == "Running" and cs["restartCount"] == 3 and not cs["ready"]
    assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert "--x" in cs["lastState"]["terminated"]["message"]
    failed = podlib.pod_status(
        container="engine",
        image="i",
        state=podlib.ContainerState("terminated", last_exit=last),
        pod_ip="",
        host_ip="127.0.0.1",
        start_time="t0",
    )
    assert failed["phase"] == "Failed" and "podIP" not in failed


def test_scrape_targets_use_each_engines_port_and_metrics_path(tmp_path: Path) -> None:
    trt = get_adapter("trtllm").render(MODEL, get_adapter("trtllm").default_config())
    vllm = get_adapter("vllm").render(MODEL, get_adapter("vllm").default_config())

    def pod(name: str, argv: tuple[str, ...], ip: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "ml", "labels": {"prefixtune.io/resource": name}},
            "spec": {"containers": [{"name": "engine", "command": list(argv[:1]), "args": list(argv[1:])}]},
            "status": {"phase": "Running", "podIP": ip},
        }

    pods = [pod("t", trt.argv, "127.2.0.1"), pod("v", vllm.argv, "127.2.0.2"), {**pod("x", vllm.argv, "")}]
    groups = scrape_targets(pods, dcgm_port=9400)
    engines = {g["labels"]["pod"]: g for g in groups[ENGINE_JOB]}
    assert set(engines) == {"t", "v"}
    assert engines["t"]["labels"]["__metrics_path__"] == "/prometheus/metrics"
    assert engines["v"]["targets"] == ["127.2.0.2:8000"] and engines["v"]["labels"]["namespace"] == "ml"
    assert engines["v"]["labels"]["prefixtune_io_resource"] == "v"  # pod labels, as a labelmap copies them
    assert [g["targets"] for g in groups[DCGM_JOB]] == [["127.2.0.1:9400"], ["127.2.0.2:9400"]]
    config = yaml.safe_load(config_yaml(tmp_path, 0.5))
    assert [j["job_name"] for j in config["scrape_configs"]] == [ENGINE_JOB, DCGM_JOB]
    assert config["global"]["scrape_interval"] == "500ms"


def test_recreate_scales_old_to_zero_before_the_new_replicaset_grows() -> None:
    dep = _deployment(2, image="v2")
    dep["spec"]["strategy"] = {"type": "Recreate"}
    old = _rs(dep, "old", 2, 2, 2, 1)
    writes = ctl.reconcile_deployment(dep, [old], 0.0)
    created = [w.body for w in writes if isinstance(w, ctl.Create)]
    assert created and created[0]["spec"]["replicas"] == 0
    assert _scales(writes) == {old["metadata"]["name"]: 0}
    new = _rs(dep, "new", 0, 0, 0, 2)
    old_draining = _rs(dep, "old", 0, 1, 1, 1)  # a pod of the old one still exists
    assert _scales(ctl.reconcile_deployment(dep, [old_draining, new], 0.0)) == {}
    old_gone = _rs(dep, "old", 0, 0, 0, 1)
    assert _scales(ctl.reconcile_deployment(dep, [old_gone, new], 0.0)) == {new["metadata"]["name"]: 2}


def test_concurrent_sandboxes_never_share_a_pod_address_octet() -> None:
    """Two sandboxes with the same octet would give two pods one address: the second pod then fails
    to bind (seen once in the reliability tests, which run six sandboxes at once, and blamed on the
    config under trial). The octet is claimed with a socket, exclusive across processes."""
    from prefixtune.sandbox.kubelet import AddressPool

    pools = [AddressPool.claim() for _ in range(20)]
    try:
        assert len({p.octet for p in pools}) == 20
        taken = pools[0].octet
        with pytest.raises(RuntimeError, match=f"ip_octet {taken}: another sandbox on this machine uses"):
            AddressPool.claim(taken)
        pools[0].close()
        pools[0].close()  # idempotent
        again = AddressPool.claim(taken)  # released: free to claim
        assert again.octet == taken and again.allocate() == AddressPool(taken).allocate()
        again.close()
    finally:
        for p in pools:
            p.close()


def test_sandbox_options_refuse_a_speedup_that_is_not_positive() -> None:
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="speedup: must be > 0"):
            SandboxOptions(speedup=bad)
    assert SandboxOptions(speedup=20).speedup == 20


def test_gpu_request_reads_requests_else_limits_over_all_containers() -> None:
    pod = {
        "spec": {
            "containers": [
                {"resources": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "4"}}},
                {"resources": {"limits": {"nvidia.com/gpu": "1"}}},
                {"resources": {}},
            ]
        }
    }
    assert podlib.gpu_request(pod) == 3
    assert podlib.gpu_request({"spec": {"containers": [{}]}}) == 0
    status = podlib.unschedulable_status(podlib.insufficient_gpu_message(), "2026-01-01T00:00:00Z")
    assert podlib.is_unschedulable({"status": status})
    assert status["conditions"][0]["message"] == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


def test_load_delay_grows_with_the_weights_per_gpu() -> None:
    from prefixtune.sandbox.kubelet import KubeletConfig

    fixed = KubeletConfig(startup_delay_s=5.0)
    assert fixed.load_delay_s("meta-llama/Llama-3.3-70B-Instruct", 1) == 5.0  # the default: no load model
    cfg = KubeletConfig(startup_delay_s=5.0, load_bytes_per_s=1e9)
    small = cfg.load_delay_s("meta-llama/Llama-3.1-8B-Instruct", 1)
    big = cfg.load_delay_s("meta-llama/Llama-3.3-70B-Instruct", 1)
    assert 5.0 < small < big
    assert cfg.load_delay_s("meta-llama/Llama-3.3-70B-Instruct", 4) - 5.0 == pytest.approx((big - 5.0) / 4)
    assert cfg.load_delay_s("no/such-model", 1) == 5.0
    with pytest.raises(ValueError, match="gpus"):
        KubeletConfig(gpus=-1)

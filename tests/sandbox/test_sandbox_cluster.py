"""The sandbox end to end over HTTP: Deployments become ready twin pods that serve the engine's API."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prefixtune.engines import get_adapter
from prefixtune.sandbox.kubelet import KubeletConfig
from prefixtune.sandbox.up import Sandbox, SandboxOptions, sandbox
from prefixtune.sandbox.waiting import wait_until

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SPEEDUP = 50.0
NS = "default"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
FAST = KubeletConfig(
    startup_delay_s=2.0, backoff_initial_s=2.0, backoff_max_s=8.0, probe_period_s=1.0, resync_s=0.2
)


def vllm_args(memory_fraction: float = 0.9, extra: Sequence[str] = ()) -> list[str]:
    adapter = get_adapter("vllm")
    config = adapter.default_config().with_(memory_fraction=memory_fraction)
    return list(adapter.render(MODEL, config, extra).argv)


def deployment(
    name: str, argv: Sequence[str], replicas: int = 1, gpus: int | None = None, **strategy: Any
) -> dict[str, Any]:
    labels = {"app": name}
    resources = {} if gpus is None else {"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "containers": [
                    {
                        "name": "engine",
                        "image": "vllm/vllm-openai:v0.11.0",
                        "command": list(argv[:2]),
                        "args": list(argv[2:]),
                        "ports": [{"name": "http", "containerPort": 8000}],
                        **resources,
                    }
                ]
            },
        },
    }
    if strategy:
        spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": strategy}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": spec}


def service(name: str, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }


async def wait_for(check: Callable[[], Any], timeout_s: float = 20.0, what: str = "condition") -> Any:
    return await wait_until(check, timeout_s, what, every_s=0.05)


async def pods_of(sb: Sandbox, app: str) -> list[dict[str, Any]]:
    return await sb.api.list(f"/api/v1/namespaces/{NS}/pods?labelSelector=app%3D{app}")


def ready(pod: dict[str, Any]) -> bool:
    conds = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
    return conds.get("Ready") == "True"


@pytest.fixture
async def sb() -> AsyncIterator[Sandbox]:
    async with sandbox(SandboxOptions(speedup=SPEEDUP, config=FAST, prometheus="off")) as running:
        yield running


async def test_deployment_gets_ready_pods_serving_real_vllm_metrics(sb: Sandbox) -> None:
    await sb.api.create(DEPLOYMENTS, deployment("rag", vllm_args(), replicas=2))

    async def two_ready() -> list[dict[str, Any]] | None:
        pods = await pods_of(sb, "rag")
        return pods if len(pods) == 2 and all(ready(p) for p in pods) else None

    pods = await wait_for(two_ready, what="2 ready pods")
    ips = {p["status"]["podIP"] for p in pods}
    assert len(ips) == 2 and all(ip.startswith("127.") and ip != "127.0.0.1" for ip in ips)
    for pod in pods:
        owner = pod["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "ReplicaSet" and owner["controller"] is True
        assert pod["metadata"]["labels"]["pod-template-hash"]
        status = pod["status"]
        assert status["phase"] == "Running"
        cs = status["containerStatuses"][0]
        assert cs["ready"] is True and cs["restartCount"] == 0 and "running" in cs["state"]

    # The twin listens on the pod's own address and the engine's real port.
    async with aiohttp.ClientSession() as http:
        ip = pods[0]["status"]["podIP"]
        async with http.get(f"http://{ip}:8000/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
        async with http.get(f"http://{ip}:8000/health") as resp:
            assert resp.status == 200
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:cache_config_info"} <= names
    assert 'gpu_memory_utilization="0.9"' in text

    async def deployment_status() -> dict[str, Any] | None:
        dep = await sb.api.get(f"{DEPLOYMENTS}/rag")
        st = (dep or {}).get("status", {})
        return st if st.get("availableReplicas") == 2 else None

    st = await wait_for(deployment_status, what="deployment status")
    assert st["replicas"] == 2 and st["updatedReplicas"] == 2 and st["readyReplicas"] == 2
    assert st["unavailableReplicas"] == 0 and st["observedGeneration"] == 1
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Available"]["status"] == "True"
    assert conds["Progressing"]["reason"] == "NewReplicaSetAvailable"


async def test_patching_args_rolls_pods_within_max_surge() -> None:
    slow = KubeletConfig(startup_delay_s=15.0, probe_period_s=1.0, resync_s=0.1)  # 0.3 s wall per start
    async with sandbox(SandboxOptions(speedup=SPEEDUP, config=slow)) as sb:
        await sb.api.create(
            DEPLOYMENTS, deployment("roll", vllm_args(0.9), replicas=2, maxSurge=1, maxUnavailable=0)
        )

        async def two_ready() -> list[dict[str, Any]] | None:
            pods = await pods_of(sb, "roll")
            return pods if len(pods) == 2 and all(ready(p) for p in pods) else None

        old_pods = await wait_for(two_ready, what="2 ready pods")
        old_hash = old_pods[0]["metadata"]["labels"]["pod-template-hash"]
        container = deployment("roll", vllm_args(0.85))["spec"]["template"]["spec"]["containers"][0]
        await sb.api.patch(
            f"{DEPLOYMENTS}/roll",
            {"spec": {"template": {"spec": {"containers": [container]}}}},
        )
        most_pods, least_ready = 0, 2

        async def rolled() -> list[dict[str, Any]] | None:
            nonlocal most_pods, least_ready
            pods = await pods_of(sb, "roll")
            most_pods = max(most_pods, len(pods))
            least_ready = min(least_ready, sum(ready(p) for p in pods))
            new = [p for p in pods if p["metadata"]["labels"]["pod-template-hash"] != old_hash]
            return pods if len(new) == 2 == len(pods) and all(ready(p) for p in pods) else None

        new_pods = await wait_for(rolled, timeout_s=30, what="the rollout")
        assert most_pods == 3  # maxSurge 1: one extra pod at a time, and the surge was used
        assert least_ready == 2  # maxUnavailable 0
        assert not {p["metadata"]["name"] for p in old_pods} & {p["metadata"]["name"] for p in new_pods}

        rss = await sb.api.list(f"/apis/apps/v1/namespaces/{NS}/replicasets")
        by_hash = {rs["metadata"]["labels"]["pod-template-hash"]: rs for rs in rss}
        assert len(by_hash) == 2 and by_hash[old_hash]["spec"]["replicas"] == 0
        new_rs = next(rs for h, rs in by_hash.items() if h != old_hash)
        assert new_rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2"
        dep = await sb.api.get(f"{DEPLOYMENTS}/roll")
        assert dep is not None and dep["metadata"]["generation"] == 2
        st = await wait_for(
            lambda: _status_when(
                sb,
                "roll",
                lambda s: (
                    s.get("observedGeneration") == 2 and s.get("updatedReplicas") == s.get("replicas") == 2
                ),
            ),
            what="status of generation 2",
        )
        assert st["replicas"] == 2 and st["availableReplicas"] == 2
        ip = new_pods[0]["status"]["podIP"]
        async with aiohttp.ClientSession() as http, http.get(f"http://{ip}:8000/metrics") as resp:
            assert 'gpu_memory_utilization="0.85"' in await resp.text()


async def _status_when(
    sb: Sandbox, name: str, check: Callable[[dict[str, Any]], bool]
) -> dict[str, Any] | None:
    dep = await sb.api.get(f"{DEPLOYMENTS}/{name}")
    st = (dep or {}).get("status", {})
    return st if check(st) else None


def bare_pod(name: str, argv: Sequence[str], restart: str = "Never") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": restart,
            "containers": [
                {
                    "name": "engine",
                    "image": "vllm/vllm-openai",
                    "command": list(argv[:2]),
                    "args": list(argv[2:]),
                }
            ],
        },
    }


async def _pod(sb: Sandbox, name: str) -> dict[str, Any]:
    pod = await sb.api.get(f"/api/v1/namespaces/{NS}/pods/{name}")
    assert pod is not None
    return pod


async def test_wrong_flag_crash_loops_and_unknown_model_fails(sb: Sandbox) -> None:
    await sb.api.create(DEPLOYMENTS, deployment("bad", [*vllm_args(), "--no-such-flag", "1"]))
    await sb.api.create(
        "/api/v1/namespaces/default/pods", bare_pod("nomodel", ["vllm", "serve", "acme/NotAModel-7B"])
    )

    async def crash_looping() -> dict[str, Any] | None:
        pods = await pods_of(sb, "bad")
        if len(pods) != 1:
            return None
        cs = pods[0].get("status", {}).get("containerStatuses", [{}])[0]
        waiting = cs.get("state", {}).get("waiting", {})
        return (
            pods[0]
            if waiting.get("reason") == "CrashLoopBackOff" and cs.get("restartCount", 0) >= 1
            else None
        )

    pod = await wait_for(crash_looping, what="CrashLoopBackOff")
    cs = pod["status"]["containerStatuses"][0]
    last = cs["lastState"]["terminated"]
    assert last["exitCode"] == 2 and "--no-such-flag" in last["message"]
    assert "back-off" in cs["state"]["waiting"]["message"]
    assert pod["status"]["phase"] == "Running" and not ready(pod)
    st = await wait_for(lambda: _status_when(sb, "bad", lambda s: "conditions" in s), what="status")
    assert st["availableReplicas"] == 0 and st["unavailableReplicas"] == 1
    assert {c["type"]: c["status"] for c in st["conditions"]}["Available"] == "False"

    async def failed() -> dict[str, Any] | None:
        pod = await _pod(sb, "nomodel")
        return pod if pod.get("status", {}).get("phase") == "Failed" else None

    pod = await wait_for(failed, what="phase Failed")
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 1 and "unknown model" in term["message"]
    # kubectl logs: each run's command line and the engine's own error, the run before with --previous
    assert "unknown model" in await _log(sb, "nomodel")
    name = (await pods_of(sb, "bad"))[0]["metadata"]["name"]
    previous = await _log(sb, name, "?previous=true")
    assert "starting vllm serve" in previous and "--no-such-flag" in previous and ": error:" in previous


async def _log(sb: Sandbox, pod: str, query: str = "") -> str:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{sb.url}/api/v1/namespaces/{NS}/pods/{pod}/log{query}") as resp,
    ):
        assert resp.status == 200 and resp.content_type == "text/plain", await resp.text()
        return await resp.text()


async def test_runtime_oom_under_load_restarts_the_twin_then_backs_off() -> None:
    cfg = KubeletConfig(
        startup_delay_s=2.0, backoff_initial_s=100.0, probe_period_s=1.0, exit_delay_s=5.0, resync_s=0.2
    )
    async with sandbox(SandboxOptions(speedup=SPEEDUP, config=cfg)) as sb:
        await sb.api.create(DEPLOYMENTS, deployment("hot", vllm_args(0.99)))

        async def ready_pod() -> dict[str, Any] | None:
            pods = await pods_of(sb, "hot")
            return pods[0] if len(pods) == 1 and ready(pods[0]) else None

        async def overload(pod: dict[str, Any]) -> int:
            # A burst of 300 concurrent requests: the batch grows until activations do not fit.
            prompts = [[1000 + i] * 64 + list(range(i * 7, i * 7 + 400)) for i in range(300)]
            async with aiohttp.ClientSession() as http:
                url = f"http://{pod['status']['podIP']}:8000/v1/completions"
                async with http.post(url, json={"prompt": prompts, "max_tokens": 400}) as resp:
                    return resp.status

        pod = await wait_for(ready_pod, what="a ready pod")
        assert await overload(pod) == 500

        async def restarted(count: int) -> Callable[[], Any]:
            async def check() -> dict[str, Any] | None:
                pod = await _pod(sb, pod_name)
                cs = pod.get("status", {}).get("containerStatuses", [{}])[0]
                return pod if cs.get("restartCount", 0) >= count else None

            return check

        pod_name = pod["metadata"]["name"]
        pod = await wait_for(await restarted(1), what="the first restart")
        last = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
        assert last["exitCode"] == 1 and "out of memory" in last["message"].lower()
        pod = await wait_for(ready_pod, what="ready again after the restart (same args)")
        assert await overload(pod) == 500

        async def backing_off() -> dict[str, Any] | None:
            pod = await _pod(sb, pod_name)
            cs = pod.get("status", {}).get("containerStatuses", [{}])[0]
            return pod if cs.get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff" else None

        pod = await wait_for(backing_off, what="CrashLoopBackOff after the second OOM")
        assert (
            not ready(pod)
            and "back-off 100s" in pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
        )


async def test_service_endpoints_track_ready_pods(sb: Sandbox) -> None:
    await sb.api.create(DEPLOYMENTS, deployment("web", vllm_args(), replicas=2))
    await sb.api.create("/api/v1/namespaces/default/services", service("web"))

    async def endpoints(count: int) -> dict[str, Any] | None:
        ep = await sb.api.get("/api/v1/namespaces/default/endpoints/web")
        addresses = [a for s in (ep or {}).get("subsets", []) for a in s.get("addresses", [])]
        return (
            ep
            if len(addresses) == count and not any(s.get("notReadyAddresses") for s in ep["subsets"])
            else None
        )

    ep = await wait_for(lambda: endpoints(2), what="2 endpoints")
    pods = await pods_of(sb, "web")
    assert {a["ip"] for a in ep["subsets"][0]["addresses"]} == {p["status"]["podIP"] for p in pods}
    assert ep["subsets"][0]["ports"] == [{"name": "http", "port": 8000, "protocol": "TCP"}]
    assert {a["targetRef"]["name"] for a in ep["subsets"][0]["addresses"]} == {
        p["metadata"]["name"] for p in pods
    }
    es = await sb.api.get("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/web-sandbox")
    assert es is not None and es["metadata"]["labels"]["kubernetes.io/service-name"] == "web"
    assert sorted(e["conditions"]["ready"] for e in es["endpoints"]) == [True, True]

    await sb.api.patch(f"{DEPLOYMENTS}/web", {"spec": {"replicas": 1}})
    ep = await wait_for(lambda: endpoints(1), what="1 endpoint after scaling down")
    remaining = await wait_for(lambda: _exactly(sb, "web", 1), what="1 pod")
    assert ep["subsets"][0]["addresses"][0]["ip"] == remaining[0]["status"]["podIP"]


async def _exactly(sb: Sandbox, app: str, n: int) -> list[dict[str, Any]] | None:
    pods = await pods_of(sb, app)
    return pods if len(pods) == n else None


TRT_OPTIONS = (
    "kv_cache_config:\n  tokens_per_block: 64\n  enable_block_reuse: true\nreturn_perf_metrics: true\n"
)


async def test_trtllm_reads_its_options_file_from_a_configmap_mount(sb: Sandbox) -> None:
    await sb.api.create(
        "/api/v1/namespaces/default/configmaps",
        {"metadata": {"name": "trt-opts"}, "data": {"llm_api_options.yaml": TRT_OPTIONS}},
    )
    pod = {
        "metadata": {"name": "trt", "labels": {"app": "trt"}},
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "image": "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24",  # a release with config info
                    "command": ["trtllm-serve"],
                    "args": [
                        MODEL,
                        "--host",
                        "0.0.0.0",
                        "--port",
                        "8000",
                        "--extra_llm_api_options",
                        "/etc/trt/llm_api_options.yaml",
                    ],
                    "volumeMounts": [{"name": "opts", "mountPath": "/etc/trt"}],
                }
            ],
            "volumes": [{"name": "opts", "configMap": {"name": "trt-opts"}}],
        },
    }
    await sb.api.create("/api/v1/namespaces/default/pods", pod)

    async def is_ready() -> dict[str, Any] | None:
        p = await _pod(sb, "trt")
        return p if ready(p) else None

    running = await wait_for(is_ready, what="the TensorRT-LLM pod ready")
    url = f"http://{running['status']['podIP']}:8000/prometheus/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 200
        text = await resp.text()
    info = [line for line in text.splitlines() if line.startswith("trtllm_kv_cache_config_info")]
    assert info and 'tokens_per_block="64"' in info[0]

    # Deleting the pod stops its engine: the port closes and the address is free again.
    await sb.api.delete("/api/v1/namespaces/default/pods/trt")

    async def port_closed() -> bool:
        try:
            async with aiohttp.ClientSession() as http, http.get(url) as resp:
                await resp.read()
            return False
        except aiohttp.ClientConnectionError:
            return True

    await wait_for(port_closed, what="the deleted pod's engine to stop")
    assert not sb.kubelet.workers


async def test_a_pod_beyond_the_free_gpus_stays_pending_until_capacity_returns() -> None:
    cfg = KubeletConfig(startup_delay_s=2.0, probe_period_s=1.0, resync_s=0.2, gpus=1)
    async with sandbox(SandboxOptions(speedup=SPEEDUP, config=cfg, prometheus="off")) as sb:
        await sb.api.create(DEPLOYMENTS, deployment("gpu", vllm_args(), replicas=2, gpus=1))

        async def one_ready_one_unschedulable() -> list[dict[str, Any]] | None:
            pods = await pods_of(sb, "gpu")
            pending = [p for p in pods if not p["spec"].get("nodeName")]
            if len(pods) == 2 and any(ready(p) for p in pods) and len(pending) == 1:
                conds = {c["type"]: c for c in pending[0].get("status", {}).get("conditions", [])}
                return pods if conds.get("PodScheduled", {}).get("reason") == "Unschedulable" else None
            return None

        pods = await wait_for(one_ready_one_unschedulable, what="one pod running, one Pending for a GPU")
        pending = next(p for p in pods if not p["spec"].get("nodeName"))
        assert pending["status"]["phase"] == "Pending"
        cond = next(c for c in pending["status"]["conditions"] if c["type"] == "PodScheduled")
        assert cond["status"] == "False"
        assert cond["message"] == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
        node = await sb.api.get("/api/v1/nodes/sandbox-node")
        assert node is not None and node["status"]["allocatable"]["nvidia.com/gpu"] == "1"

        await sb.kubelet.set_gpus(2)  # a GPU is freed elsewhere: the Pending pod is bound and starts

        async def two_ready() -> list[dict[str, Any]] | None:
            pods = await pods_of(sb, "gpu")
            return pods if len(pods) == 2 and all(ready(p) for p in pods) else None

        await wait_for(two_ready, what="both pods ready once a second GPU exists")

"""Real clients against the sandbox: the official kubernetes client, kubectl, the CLI, Prometheus."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes
import pytest
import yaml
from tests.conftest import require_component

from prefixtune.api.crd import build_crd
from prefixtune.engines import get_adapter
from prefixtune.sandbox.emulator import serve_emulator, write_kubeconfig
from prefixtune.sandbox.kubelet import KubeletConfig
from prefixtune.sandbox.prometheus import prometheus_binary
from prefixtune.sandbox.up import SandboxOptions, sandbox

ROOT = Path(__file__).resolve().parents[2]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
SDEPS = "/apis/prefixtune.io/v1alpha1"
FAST = KubeletConfig(startup_delay_s=1.0, probe_period_s=1.0, resync_s=0.2)


def _manifest(name: str, memory_fraction: float = 0.9) -> dict[str, Any]:
    adapter = get_adapter("vllm")
    argv = list(adapter.render(MODEL, adapter.default_config().with_(memory_fraction=memory_fraction)).argv)
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:v0.11.0",
                            "command": argv[:2],
                            "args": argv[2:],
                            "ports": [{"containerPort": 8000}],
                        }
                    ]
                },
            },
        },
    }


def _client_roundtrip(kubeconfig: Path) -> dict[str, Any]:
    """Apply, get, patch, delete with the official (sync) client; runs in a thread."""
    api_client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
    apps = kubernetes.client.AppsV1Api(api_client)
    core = kubernetes.client.CoreV1Api(api_client)
    apps.create_namespaced_deployment("default", _manifest("k8s"))

    def wait(predicate: Any, what: str, timeout_s: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def available() -> Any:
        dep = apps.read_namespaced_deployment("k8s", "default")
        st = dep.status
        return dep if st is not None and st.available_replicas == 1 and st.updated_replicas == 1 else None

    first = wait(available, "the deployment available")
    pods = core.list_namespaced_pod("default", label_selector="app=k8s").items
    container = _manifest("k8s", 0.8)["spec"]["template"]["spec"]["containers"][0]
    apps.patch_namespaced_deployment(
        "k8s", "default", {"spec": {"template": {"spec": {"containers": [container]}}}}
    )

    def rolled() -> Any:
        dep = apps.read_namespaced_deployment("k8s", "default")
        st = dep.status
        done = (
            st.observed_generation == 2 and st.updated_replicas == st.replicas == st.available_replicas == 1
        )
        return dep if done else None

    second = wait(rolled, "the patched deployment rolled out")
    new_pods = core.list_namespaced_pod("default", label_selector="app=k8s").items
    apps.delete_namespaced_deployment("k8s", "default")
    wait(
        lambda: not core.list_namespaced_pod("default", label_selector="app=k8s").items,
        "pods garbage-collected",
    )
    return {
        "first_generation": first.metadata.generation,
        "old_pod": pods[0].metadata.name,
        "new_pods": [p.metadata.name for p in new_pods],
        "new_args": second.spec.template.spec.containers[0].args,
        "image": second.spec.template.spec.containers[0].image,
    }


async def test_official_kubernetes_client_apply_get_patch_delete() -> None:
    async with sandbox(SandboxOptions(speedup=50.0, config=FAST, load=False)) as sb:
        result = await asyncio.to_thread(_client_roundtrip, sb.kubeconfig)
        assert result["first_generation"] == 1
        assert result["old_pod"] not in result["new_pods"] and len(result["new_pods"]) == 1
        assert "0.8" in result["new_args"] and result["image"] == "vllm/vllm-openai:v0.11.0"
        await asyncio.sleep(0.3)
        assert not sb.kubelet.workers  # the deleted pods' twins were stopped


def _kubectl() -> str | None:
    found = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if found is None and os.environ.get("CI"):
        fetched = subprocess.run([str(ROOT / "scripts" / "get-kubectl.sh")], capture_output=True, text=True)
        found = fetched.stdout.strip() or None if fetched.returncode == 0 else None
    return found


def _reads_openapi_v3(kubectl: str) -> bool:
    """kubectl >= 1.27 validates and explains through OpenAPI v3, which the emulator serves; older
    ones (Debian 12's kubernetes-client is 1.20) read only the protobuf OpenAPI v2, which it does not,
    and need ``--validate=false``."""
    out = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True)
    version = json.loads(out.stdout)["clientVersion"]
    return (int(version["major"]), int(version["minor"].rstrip("+"))) >= (1, 27)


async def test_kubectl_apply_rollout_status_get_patch_delete(tmp_path: Path) -> None:
    kubectl = _kubectl()
    require_component(kubectl is not None, "kubectl (scripts/get-kubectl.sh fetches one)")
    assert kubectl is not None
    validate = [] if _reads_openapi_v3(kubectl) else ["--validate=false"]
    manifest = tmp_path / "deploy.yaml"
    manifest.write_text(yaml.safe_dump(_manifest("kc")))
    async with sandbox(SandboxOptions(speedup=50.0, config=FAST, load=False)) as sb:

        async def run(*args: str) -> str:
            proc = await asyncio.create_subprocess_exec(
                kubectl,
                f"--kubeconfig={sb.kubeconfig}",
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}"
            return out.decode()

        assert "created" in await run("apply", *validate, "-f", str(manifest))
        assert "successfully rolled out" in await run("rollout", "status", "deployment/kc", "--timeout=60s")
        pods = json.loads(await run("get", "pods", "-l", "app=kc", "-o", "json"))["items"]
        assert len(pods) == 1 and pods[0]["status"]["phase"] == "Running"
        log = await run("logs", "deployment/kc")  # the twin kubelet's log of the pod, via pods/log
        assert "prefixtune twin kubelet: starting vllm serve" in log and "vllm serving" in log
        patch = {"spec": {"template": {"metadata": {"annotations": {"restarted": "1"}}}}}
        await run("patch", "deployment", "kc", "--type=merge", "-p", json.dumps(patch))
        assert "successfully rolled out" in await run("rollout", "status", "deployment/kc", "--timeout=60s")
        after = json.loads(await run("get", "pods", "-l", "app=kc", "-o", "json"))["items"]
        assert len(after) == 1 and after[0]["metadata"]["name"] != pods[0]["metadata"]["name"]
        await run("delete", "deployment", "kc")


async def test_kubectl_scale_changes_a_servingdeployment_through_its_scale_subresource(
    tmp_path: Path,
) -> None:
    """kubectl finds the scale subresource in discovery and writes it (a merge patch, or a GET then
    an update under --current-replicas): the resource's spec.replicas, as on a real cluster."""
    kubectl = _kubectl()
    require_component(kubectl is not None, "kubectl (scripts/get-kubectl.sh fetches one)")
    assert kubectl is not None
    async with serve_emulator() as (em, url):
        config = write_kubeconfig(tmp_path / "kubeconfig", url)
        async with em.post(CRDS, json=build_crd()) as response:
            assert response.status == 201
        body = {"metadata": {"name": "chat"}, "spec": {"engine": "vllm", "model": "m", "replicas": 2}}
        async with em.post(f"{SDEPS}/namespaces/default/servingdeployments", json=body) as response:
            assert response.status == 201

        async def run(*args: str) -> tuple[int, str]:
            proc = await asyncio.create_subprocess_exec(
                kubectl, f"--kubeconfig={config}", *args,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
            return int(proc.returncode or 0), out.decode()

        assert await run("scale", "sdep", "chat", "--replicas=3") == (
            0,
            "servingdeployment.prefixtune.io/chat scaled\n",
        )
        code, out = await run("scale", "sdep", "chat", "--current-replicas=2", "--replicas=5")
        assert code != 0 and "Expected replicas to be 2, was 3" in out  # the precondition holds
        assert (await run("scale", "sdep", "chat", "--current-replicas=3", "--replicas=4"))[0] == 0
        assert await run("get", "sdep", "chat", "-o", "jsonpath={.spec.replicas}") == (0, "4")


async def test_cli_sandbox_up_writes_a_kubeconfig_and_stops_on_sigint(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prefixtune.cli",
        "sandbox",
        "up",
        "--kubeconfig",
        str(kubeconfig),
        "--prometheus",
        "off",
        "--speedup",
        "20",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        banner = ""
        while "Ctrl-C" not in banner:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert line, f"sandbox up exited early: {banner}"
            banner += line.decode()
        assert "apply -f crds/" in banner and str(kubeconfig) in banner
        server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{server}/api/v1/namespaces/default/pods") as resp,
        ):
            assert resp.status == 200
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_cli_rejects_bad_options_with_the_flag_named(capsys: pytest.CaptureFixture[str]) -> None:
    from prefixtune.sandbox.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["up", "--speedup", "0"])
    assert exc.value.code == 2
    assert "--speedup" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["up", "--prometheus", "maybe"])
    assert "--prometheus" in capsys.readouterr().err
    assert main(["down"]) == 2


async def test_prometheus_discovers_and_scrapes_the_pods() -> None:
    require_component(prometheus_binary() is not None, "the prometheus binary (Debian package prometheus)")
    options = SandboxOptions(speedup=50.0, config=FAST, load=False, prometheus="on", scrape_interval_s=0.2)
    async with sandbox(options) as sb:
        await sb.api.create("/apis/apps/v1/namespaces/default/deployments", _manifest("prom"))
        assert sb.prometheus_url is not None
        deadline = time.monotonic() + 40
        async with aiohttp.ClientSession() as http:
            while True:
                query = 'vllm:num_requests_running{namespace="default",pod=~"prom-.*",container="engine"}'
                async with http.get(f"{sb.prometheus_url}/api/v1/query", params={"query": query}) as resp:
                    result = (await resp.json())["data"]["result"]
                if result:
                    break
                assert time.monotonic() < deadline, "Prometheus never scraped the pod"
                await asyncio.sleep(0.2)
            pods = await sb.api.list("/api/v1/namespaces/default/pods?labelSelector=app%3Dprom")
            assert result[0]["metric"]["pod"] == pods[0]["metadata"]["name"]
            assert result[0]["metric"]["job"] == "sandbox-engines"


async def test_kubectl_get_explain_apply_and_logs_without_validate_false(tmp_path: Path) -> None:
    """The real kubectl against the emulator: Tables, OpenAPI v3 validation and explain, pods/log."""
    kubectl = _kubectl()
    require_component(kubectl is not None, "kubectl (scripts/get-kubectl.sh fetches one)")
    assert kubectl is not None
    modern = _reads_openapi_v3(kubectl)
    validate = [] if modern else ["--validate=false"]
    from prefixtune.api.crd import build_crd
    from prefixtune.sandbox.emulator import serve_emulator, write_kubeconfig
    from prefixtune.sandbox.podlogs import ContainerLogs

    async with serve_emulator() as (em, url):
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
        logs = em.pod_logs = ContainerLogs()

        async def run(*args: str, ok: bool = True) -> str:
            proc = await asyncio.create_subprocess_exec(
                kubectl,
                f"--kubeconfig={kubeconfig}",
                f"--cache-dir={tmp_path / 'cache'}",
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert (proc.returncode == 0) == ok, f"kubectl {' '.join(args)}: {out.decode()} {err.decode()}"
            return out.decode() + err.decode()

        async with em.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=build_crd()) as r:
            assert r.status == 201
        applied = await run("apply", *validate, "-f", str(ROOT / "examples"))
        assert "namespace/agents created" in applied and "agent-llama-70b created" in applied
        listed = (await run("get", "servingdeployments", "-A")).splitlines()
        assert listed[0].split() == ["NAMESPACE", "NAME", "ENGINE", "PHASE", "HITRATE", "BESTSCORE", "AGE"]
        assert any(line.split()[:3] == ["agents", "agent-llama-70b", "trtllm"] for line in listed[1:])
        assert "MODEL" in (await run("get", "sdep", "-o", "wide")).splitlines()[0].split()
        if modern:  # explain and server-side validation read OpenAPI v3
            explained = await run("explain", "servingdeployment.spec.tuning")
            assert "KIND:       ServingDeployment" in explained and "budget" in explained
            typo = yaml.safe_load((ROOT / "examples" / "vllm-rag.yaml").read_text())
            typo["spec"]["engien"] = "vllm"
            (tmp_path / "typo.yaml").write_text(yaml.safe_dump(typo))
            refused = await run("apply", "-f", str(tmp_path / "typo.yaml"), ok=False)
            assert 'strict decoding error: unknown field "spec.engien"' in refused

        (tmp_path / "deploy.yaml").write_text(yaml.safe_dump(_manifest("kc")))
        await run("apply", *validate, "-f", str(tmp_path / "deploy.yaml"))
        header = (await run("get", "deployments")).splitlines()[0].split()
        assert header == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
        pod = {
            "metadata": {"name": "p"},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "i"}]},
        }
        async with em.post("/api/v1/namespaces/default/pods", json=pod) as r:
            uid = (await r.json())["metadata"]["uid"]
        pods = (await run("get", "pods")).splitlines()
        assert pods[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
        assert pods[1].split()[:3] == ["p", "0/1", "Pending"]
        logs.write(uid, "c", "2026-01-01T00:00:00Z", "hello from the twin")
        assert (await run("logs", "p")) == "hello from the twin\n"


async def test_inside_a_requests_task_the_request_log_reads_as_that_request_alone() -> None:
    from types import SimpleNamespace

    from prefixtune.sandbox import up

    log = up._InFlightRequests()
    watch, get = SimpleNamespace(id=0), SimpleNamespace(id=1)
    log.append(watch)  # an open watch stays in flight
    log.append(get)
    assert list(log) == [watch, get] and len(log) == 2  # outside any request: all in flight

    async def serve(request: object) -> list[object]:
        token = up._SERVING.set(request)
        try:
            seen = list(log)
            remapped = SimpleNamespace(id=1)
            log[log.index(request)] = remapped  # the emulator's namespace remap
            return [*seen, *log]
        finally:
            up._SERVING.reset(token)

    assert await asyncio.create_task(serve(get)) == [get, log[1]]  # itself, then its remapped self
    assert up._SERVING.get() is None and list(log) == [watch, log[1]]
    log.done(0)
    assert list(log) == [log[0]] and len(log) == 2

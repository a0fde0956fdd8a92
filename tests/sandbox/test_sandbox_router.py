"""Router pods in the sandbox: the real sglang-router / vllm-router, their own service discovery
against the emulated API server, the load generator sending through them, and no process left."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from prefixtune.engines import EngineName, get_adapter
from prefixtune.metrics.exposition import parse
from prefixtune.routing.render import LIVENESS_PATH, READINESS_PATH
from prefixtune.routing.settings import ENGINE_ROUTER
from prefixtune.sandbox.kubelet import KubeletConfig
from prefixtune.sandbox.load import (
    RATE_ANNOTATION,
    SESSION_HEADER,
    WORKLOAD_ANNOTATION,
    Declared,
    ids_completion_body,
    text_completion_body,
    user_facing,
)
from prefixtune.sandbox.pods import is_ready
from prefixtune.sandbox.router import RouterLaunchError, RouterProcess, port_of, resolve, router_of, with_host
from prefixtune.sandbox.up import Sandbox, SandboxOptions, sandbox
from prefixtune.sandbox.waiting import wait_until
from prefixtune.twin.chat import text_tokens
from prefixtune.twin.workloads import generate

T = TypeVar("T")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ROUTER_PORT = 30000
ROUTER_METRICS_PORT = 29000
DECISIONS = "vllm_router_prefix_routing_decisions_total"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
SERVICES = "/api/v1/namespaces/default/services"
COMMANDS = {
    "sglang-router": ["python3", "-m", "sglang_router.launch_router"],
    "vllm-router": ["vllm-router"],
}


def engine_deployment(
    name: str, replicas: int, engine: str = EngineName.SGLANG, routing: str = "auto"
) -> dict[str, Any]:
    """Engine pods as the engine's adapter renders them (``routing``: the routing policy the
    command is rendered for), or trtllm-serve at its defaults on port 30000 (no LLM API options file
    to mount)."""
    if engine == EngineName.TRTLLM:
        argv = ["trtllm-serve", MODEL, "--host", "0.0.0.0", "--port", "30000"]
        container = {
            "name": "engine",
            "image": "nvcr.io/nvidia/tensorrt-llm/release",
            "command": argv[:1],
            "args": argv[1:],
        }
    else:
        adapter = get_adapter(engine)
        rendered = adapter.render(MODEL, adapter.default_config().with_(routing_policy=routing))
        command, args = list(rendered.command), list(rendered.args)
        container = {"name": "engine", "image": adapter.default_image, "command": command, "args": args}
    labels = {"app": name}
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


def router_deployment(
    name: str,
    engines: str,
    router: str,
    policy: str = "cache_aware",
    probe: str = "/health",
    engine_port: int = 30000,
) -> dict[str, Any]:
    labels = {"app": name, "app.kubernetes.io/component": "router"}
    args = [
        "--host", "0.0.0.0", "--port", str(ROUTER_PORT), "--policy", policy,
        "--service-discovery", "--selector", f"app={engines}",
        "--service-discovery-namespace", "default", "--service-discovery-port", str(engine_port),
        "--prometheus-port", str(ROUTER_METRICS_PORT),
    ]  # fmt: skip
    container = {
        "name": "router",
        "image": f"example/{router}",
        "command": COMMANDS[router],
        "args": args,
        "readinessProbe": {"httpGet": {"path": probe, "port": ROUTER_PORT}, "periodSeconds": 2},
    }
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


def service(name: str, selector: dict[str, str], port: int, **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"selector": selector, "ports": [{"port": 80, "targetPort": port}]},
    }


async def ready_ips(sb: Sandbox, selector: str, n: int) -> list[str]:
    async def check() -> list[str] | None:
        pods = await sb.api.list(f"/api/v1/namespaces/default/pods?labelSelector={selector}")
        ips = [str(p["status"]["podIP"]) for p in pods if is_ready(p)]
        return sorted(ips) if len(ips) == n else None

    return await until(sb, check, 120.0, f"{n} ready pods {selector}")


async def until(sb: Sandbox, check: Callable[[], Awaitable[T | None]], timeout_s: float, what: str) -> T:
    """``wait_until`` on the sandbox's clock: a loaded machine extends the deadline, never fails it."""
    return await wait_until(check, timeout_s, what, every_s=0.2, clock=sb.clock.now)


async def discovered_router(sb: Sandbox, engine_port: int) -> tuple[str, str]:
    """(URL, IP) of the one ready ``chat-router`` pod once its own discovery has registered both
    ready ``chat`` engine pods on ``engine_port``."""
    engine_ips = await ready_ips(sb, "app%3Dchat", 2)
    (router_ip,) = await ready_ips(sb, "app%3Dchat-router", 1)
    url = f"http://{router_ip}:{ROUTER_PORT}"
    wanted = {f"http://{ip}:{engine_port}" for ip in engine_ips}

    async def discovered() -> bool:
        return await workers(url) == wanted

    await until(sb, discovered, 60.0, "the router to register both engine pods")
    return url, router_ip


async def workers(url: str) -> set[str]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/workers") as resp:
        data = await resp.json(content_type=None)
    return {str(w["url"]) for w in data.get("workers", ())}


def config() -> KubeletConfig:
    return KubeletConfig(startup_delay_s=1.0, probe_period_s=1.0, resync_s=0.2)


# --- pure parts -------------------------------------------------------------------------------


def test_the_router_binds_the_pod_address_for_its_port_and_its_metrics() -> None:
    argv = ["vllm-router", "--host=0.0.0.0", "--port", "8080", "--policy", "random"]
    assert with_host(argv, "127.9.0.4") == [
        "vllm-router", "--host", "127.9.0.4", "--port", "8080", "--policy", "random",
        "--prometheus-host", "127.9.0.4",
    ]  # fmt: skip
    assert port_of(argv) == 8080 and port_of(["vllm-router"]) == 30000


def test_commands_resolve_to_this_environments_router_and_others_are_refused() -> None:
    assert router_of(["/usr/bin/python3", "-m", "sglang_router.launch_router"]) is not None
    assert resolve(["python3", "-m", "sglang_router.launch_router", "--port", "1"])[0] == sys.executable
    assert Path(resolve(["vllm-router"])[0]).name == "vllm-router"
    with pytest.raises(RouterLaunchError, match="not a router"):
        resolve(["nginx", "-g", "daemon off;"])


def test_a_resources_workload_goes_to_its_user_facing_service_only() -> None:
    def svc(name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ml"}}

    mine = Declared("chatbot", None, "ServingDeployment ml/chat", owner="chat")
    assert user_facing(svc("chat"), [svc("chat"), svc("chat-engines")], mine)
    assert not user_facing(svc("chat-engines"), [svc("chat"), svc("chat-engines")], mine)
    assert user_facing(svc("chat-engines"), [svc("chat-engines")], mine)  # no user-facing one: as before
    on_service = Declared("chatbot", None, "Service ml/chat-engines")
    assert user_facing(svc("chat-engines"), [svc("chat"), svc("chat-engines")], on_service)


def test_through_a_router_a_sessions_next_turn_repeats_its_previous_turn_as_text() -> None:
    turn1, turn2 = [r for r in generate("chatbot", rate=2, duration_s=600, seed=5) if r.session == 0][:2]
    body1, headers = text_completion_body(turn1, MODEL)
    body2, _ = text_completion_body(turn2, MODEL)
    assert headers == {SESSION_HEADER: "0"} and body1["model"] == MODEL
    assert body2["prompt"].startswith(body1["prompt"])
    # The twin's ids of turn 2's prompt start with turn 1's prompt and the output it was told to make.
    history = text_tokens(body1["prompt"]) + body1["prefixtune"]["output_token_ids"]
    assert text_tokens(body2["prompt"])[: len(history)] == history


def test_direct_and_routed_requests_put_the_same_tokens_in_the_engines_cache() -> None:
    # A routing change (kube-proxy <-> a router) must not empty every cache: same tokens either way.
    for req in generate("chatbot", rate=2, duration_s=60, seed=3)[:20]:
        routed, _ = text_completion_body(req, MODEL)
        direct = ids_completion_body(req)
        assert text_tokens(routed["prompt"]) == direct["prompt"]
        assert routed["prefixtune"] == direct["prefixtune"]


# --- in the sandbox ---------------------------------------------------------------------------


@pytest.mark.parametrize("router", ["sglang-router", "vllm-router"])
async def test_a_router_is_ready_only_once_it_has_discovered_an_engine(router: str) -> None:
    """The rendered readiness probe (``READINESS_PATH``) against the real router: with no engine pod the
    router listens but is not ready, so a Service switched to it would have no endpoint; once an engine
    pod is ready and discovered, it is."""
    async with sandbox(SandboxOptions(speedup=10.0, config=config(), load=False)) as sb:
        await sb.api.create(DEPLOYMENTS, engine_deployment("chat", 0))
        routed = router_deployment("chat-router", "chat", router, probe=READINESS_PATH)
        await sb.api.create(DEPLOYMENTS, routed)

        async def listening() -> str | None:
            pods = await sb.api.list("/api/v1/namespaces/default/pods?labelSelector=app%3Dchat-router")
            ips = [str(p["status"]["podIP"]) for p in pods if p.get("status", {}).get("podIP")]
            for ip in ips:
                try:
                    async with (
                        aiohttp.ClientSession() as http,
                        http.get(f"http://{ip}:{ROUTER_PORT}{LIVENESS_PATH}") as r,
                    ):
                        return ip if r.status == 200 else None
                except aiohttp.ClientError:
                    return None
            return None

        ip = await until(sb, listening, 60.0, "the router to answer on /liveness")
        await sb.clock.sleep(6.0)  # three probe periods of the router with no worker
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://{ip}:{ROUTER_PORT}{READINESS_PATH}") as r,
        ):
            assert r.status == 503, await r.text()
        (pod,) = await sb.api.list("/api/v1/namespaces/default/pods?labelSelector=app%3Dchat-router")
        assert not is_ready(pod), "a router with no engine to send to reported ready"
        await sb.api.patch(f"{DEPLOYMENTS}/chat", {"spec": {"replicas": 1}})
        await ready_ips(sb, "app%3Dchat", 1)
        await ready_ips(sb, "app%3Dchat-router", 1)


@pytest.mark.parametrize(
    ("router", "engine"),
    [
        ("sglang-router", EngineName.SGLANG),
        ("vllm-router", EngineName.SGLANG),
        (ENGINE_ROUTER[EngineName.TRTLLM].value, EngineName.TRTLLM),  # trtllm-serve's twin pods
    ],
)
async def test_a_router_pod_runs_the_real_router_which_discovers_the_engine_pods(
    router: str, engine: EngineName
) -> None:
    async with sandbox(SandboxOptions(speedup=10.0, config=config(), load=False)) as sb:
        await sb.api.create(DEPLOYMENTS, engine_deployment("chat", 2, engine))
        await sb.api.create(DEPLOYMENTS, router_deployment("chat-router", "chat", router))
        url, router_ip = await discovered_router(sb, 30000)
        async with aiohttp.ClientSession() as http:
            body = {"model": MODEL, "prompt": "a text prompt through the router", "max_tokens": 3}
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["usage"]["completion_tokens"] == 3
        (pod,) = await sb.api.list("/api/v1/namespaces/default/pods?labelSelector=app%3Dchat-router")
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{sb.url}/api/v1/namespaces/default/pods/{pod['metadata']['name']}/log") as resp,
        ):
            log = await resp.text()
        assert "starting" in log and router_ip in log  # the router's own output, in the pod's log
        pids = [w.server.pid for w, _ in sb.kubelet.workers.values() if hasattr(w.server, "pid")]
        assert len(pids) == 1
    assert not _alive(pids[0]), "the router process outlived its sandbox"


async def test_the_load_follows_its_service_to_the_router_with_text_and_its_sessions_go_on() -> None:
    async with sandbox(SandboxOptions(speedup=10.0, config=config())) as sb:
        await sb.api.create(DEPLOYMENTS, engine_deployment("chat", 2))
        await sb.api.create(
            DEPLOYMENTS, router_deployment("chat-router", "chat", "vllm-router", "consistent_hash")
        )
        workload = {WORKLOAD_ANNOTATION: "chatbot", RATE_ANNOTATION: "2"}
        await sb.api.create(SERVICES, service("chat", {"app": "chat"}, 30000, **workload))
        engines = {f"http://{ip}:30000" for ip in await ready_ips(sb, "app%3Dchat", 2)}
        (router_ip,) = await ready_ips(sb, "app%3Dchat-router", 1)
        router_url = f"http://{router_ip}:{ROUTER_PORT}"
        assert sb.load is not None
        load = sb.load

        def answered(targets: set[str], n: int) -> Callable[[], Awaitable[int | None]]:
            async def check() -> int | None:
                by_target = load.stats().get("default/chat", {}).get("by_target", {})
                got = sum(v for t, v in by_target.items() if t in targets)
                return got if got >= n else None

            return check

        await until(sb, answered(engines, 10), 120.0, "10 requests to the engine pods")
        (generator, task) = load.loads[("default", "chat")]
        # The operator's switch: the user-facing Service now selects the router pods.
        await sb.api.patch(f"{SERVICES}/chat", {"spec": {"selector": {"app": "chat-router"}, "ports": [
            {"port": 80, "targetPort": ROUTER_PORT}]}})  # fmt: skip
        await until(sb, answered({router_url}, 20), 120.0, "20 requests through the router")
        assert load.loads[("default", "chat")] == (generator, task)  # one generator all along
        assert generator.routed and generator.model == MODEL
        through = [r for r in generator.stats.recent if r.target == router_url and r.status == 200]
        assert sum(r.cached_tokens for r in through) > 0  # sessions' turns hit behind the router
        # Deleting the router's Deployment deletes its pod, which stops the router's process.
        (pid,) = [w.server.pid for w, _ in sb.kubelet.workers.values() if isinstance(w.server, RouterProcess)]
        await sb.api.delete(f"{DEPLOYMENTS}/chat-router")

        async def stopped() -> bool:
            return not _alive(pid)

        await until(sb, stopped, 30.0, "the router's process to stop with its pod")


async def decisions(url: str) -> dict[str, float]:
    """vllm-router's cache-aware decisions so far, by outcome (its ``/metrics``)."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
        snapshot = parse(await resp.text(), target="router", t=0.0)
    out: dict[str, float] = {}
    for labels, value in snapshot.series(DECISIONS):
        outcome = dict(labels).get("outcome", "")
        out[outcome] = out.get(outcome, 0.0) + value
    return out


@pytest.mark.parametrize(("routing", "routed_on_prefixes"), [("cache_aware", True), ("kube-proxy", False)])
async def test_vllm_router_routes_vllm_pods_on_the_token_ids_their_render_routes_give(
    routing: str, routed_on_prefixes: bool
) -> None:
    """vllm-router asks every worker's render route for the request's token ids and routes
    cache_aware on them: engine pods rendered for a router (``--enable-scale-out``) give them, and
    every decision is a prefix hit or miss; pods rendered for kube-proxy refuse (403), and every
    decision is ``missing_tokens`` (routed by load alone)."""
    async with sandbox(SandboxOptions(speedup=10.0, config=config(), load=False)) as sb:
        engines = engine_deployment("chat", 2, engine="vllm", routing=routing)
        await sb.api.create(DEPLOYMENTS, engines)
        router = router_deployment("chat-router", "chat", "vllm-router", engine_port=8000)
        await sb.api.create(DEPLOYMENTS, router)
        url, router_ip = await discovered_router(sb, 8000)
        system = "You are a careful assistant who answers briefly. " * 20
        sent = 0
        async with aiohttp.ClientSession() as http:
            for turn in range(2):
                for session in range(3):
                    prompt = system + f"session {session}: " + "tell me more. " * (1 + 8 * turn)
                    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
                    async with http.post(f"{url}/v1/completions", json=body) as resp:
                        assert resp.status == 200, await resp.text()
                    sent += 1

        async def counted() -> dict[str, float] | None:
            got = await decisions(f"http://{router_ip}:{ROUTER_METRICS_PORT}")
            return got if sum(got.values()) >= sent else None

        by_outcome = await until(sb, counted, 30.0, "the router to count a decision per request")
    prefix = by_outcome.get("prefix_hit", 0.0) + by_outcome.get("prefix_miss", 0.0)
    if routed_on_prefixes:
        assert by_outcome.get("missing_tokens", 0.0) == 0 and prefix >= sent, by_outcome
        assert by_outcome.get("prefix_hit", 0.0) > 0, by_outcome  # later turns find their prefix
    else:
        assert by_outcome.get("missing_tokens", 0.0) >= sent and prefix == 0, by_outcome


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_nothing_but_the_router_runs_in_a_router_pod_whose_command_is_not_a_router() -> None:
    async with sandbox(SandboxOptions(speedup=10.0, config=config(), load=False)) as sb:
        bad = router_deployment("gw", "chat", "vllm-router")
        bad["spec"]["template"]["spec"]["containers"][0]["command"] = ["nginx"]
        bad["spec"]["template"]["spec"]["restartPolicy"] = "Always"
        await sb.api.create(DEPLOYMENTS, bad)

        async def terminated() -> dict[str, Any] | None:
            pods = await sb.api.list("/api/v1/namespaces/default/pods?labelSelector=app%3Dgw")
            for pod in pods:
                for cs in pod.get("status", {}).get("containerStatuses") or ():
                    last = (cs.get("lastState") or {}).get("terminated")
                    if last:
                        return dict(last)
            return None

        last = await until(sb, terminated, 60.0, "the container to fail")
        assert last["exitCode"] == 127 and "not a router" in last["message"]


async def test_a_router_that_refuses_its_flags_fails_its_pod_with_its_own_message_in_the_log() -> None:
    async with sandbox(SandboxOptions(speedup=10.0, config=config(), load=False)) as sb:
        bad = router_deployment("gw", "chat", "vllm-router", policy="nonsense")
        await sb.api.create(DEPLOYMENTS, bad)

        async def terminated() -> tuple[str, dict[str, Any]] | None:
            for pod in await sb.api.list("/api/v1/namespaces/default/pods?labelSelector=app%3Dgw"):
                for cs in pod.get("status", {}).get("containerStatuses") or ():
                    last = (cs.get("lastState") or {}).get("terminated")
                    if last:
                        return str(pod["metadata"]["name"]), dict(last)
            return None

        name, last = await until(sb, terminated, 60.0, "the router to exit")
        assert last["exitCode"] == 2 and "exited with code 2" in last["message"]
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{sb.url}/api/v1/namespaces/default/pods/{name}/log?previous=true") as resp,
        ):
            log = await resp.text()
        assert "invalid choice: 'nonsense'" in log  # argparse's own words, from the router's process


@pytest.mark.parametrize("router", ["sglang-router", "vllm-router"])
async def test_a_deleted_engine_pod_leaves_the_routers_workers(router: str) -> None:
    # The routers' discovery removes a worker when it sees the pod terminating (deletionTimestamp),
    # never on the DELETED event: the emulator marks a pod before it deletes it, as kube does.
    async with sandbox(SandboxOptions(speedup=10.0, config=config(), load=False)) as sb:
        await sb.api.create(DEPLOYMENTS, engine_deployment("chat", 2))
        await sb.api.create(DEPLOYMENTS, router_deployment("chat-router", "chat", router))
        ips = await ready_ips(sb, "app%3Dchat", 2)
        (router_ip,) = await ready_ips(sb, "app%3Dchat-router", 1)
        url = f"http://{router_ip}:{ROUTER_PORT}"

        async def registered(wanted: set[str]) -> bool:
            return await workers(url) == wanted

        await until(
            sb, lambda: registered({f"http://{ip}:30000" for ip in ips}), 60.0, "both pods registered"
        )
        await sb.api.patch(f"{DEPLOYMENTS}/chat", {"spec": {"replicas": 1}})
        (left,) = await ready_ips(sb, "app%3Dchat", 1)
        await until(sb, lambda: registered({f"http://{left}:30000"}), 60.0, "the deleted pod to leave")
        # Deleting the Deployment deletes its pods through the garbage collector: marked as well.
        await sb.api.delete(f"{DEPLOYMENTS}/chat")
        await until(sb, lambda: registered(set()), 60.0, "the collected pod to leave")

"""A hostile tenant against the operator, through the sandbox (issue #17); a helper of
``bench/reliability.py`` and of ``tests/reliability/test_reliability_tenant.py``.

Each case runs the sandbox (the emulated API server, its controllers and the twin kubelet) with the
operator's own ``reconcile`` in this process against it (a real ``KubeClient`` over HTTP), so that
what the operator did to the cluster can be read back exactly:

- ``foreign_objects``: objects that collide with a resource's child names (a LoadBalancer Service
  ``payments``, a Deployment ``web-canary``, a ConfigMap ``tr-canary-options``) are left untouched,
  the resource says ``ResourceExists`` naming each, with a Warning Event;
- ``ssrf``: ``spec.tuning.metrics.url`` pointing at a fake admin page is never fetched, and nothing a
  server answers ends up in a status or an Event (``reflected`` counts the bytes that did);
- ``stall``: tenants whose metrics endpoints drip one byte every few seconds (and one that sends a
  huge page, one with a malformed line) beside a well-behaved tenant: the good tenant's decision
  latency is measured (each reconcile, wall seconds) and must stay bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from prefixtune.api.crd import build_crd
from prefixtune.controller.kube import Connection, KubeClient
from prefixtune.controller.measure import Meter
from prefixtune.controller.reconcile import OperatorContext, reconcile
from prefixtune.sandbox.up import Sandbox, SandboxOptions, sandbox
from prefixtune.sandbox.waiting import wait_until
from prefixtune.tuning.phases import Phase

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SDEP = "/apis/prefixtune.io/v1alpha1"
CORE = "/api/v1"
APPS = "/apis/apps/v1"


def resource(name: str, spec: dict[str, Any] | None = None, ns: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "prefixtune.io/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec or {"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct"},
    }


@dataclass
class Harness:
    sb: Sandbox
    ctx: OperatorContext

    @property
    def api(self) -> Any:
        return self.sb.api

    async def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        ns = body["metadata"].get("namespace", "default")
        created: dict[str, Any] = await self.api.create(f"{SDEP}/namespaces/{ns}/servingdeployments", body)
        return created

    async def reconcile(self, name: str, ns: str = "default") -> Any:
        return await reconcile(self.ctx, ns, name)

    async def get(self, path: str) -> dict[str, Any] | None:
        got: dict[str, Any] | None = await self.api.get(path)
        return got

    async def status(self, name: str, ns: str = "default") -> dict[str, Any]:
        obj = await self.get(f"{SDEP}/namespaces/{ns}/servingdeployments/{name}")
        return dict((obj or {}).get("status") or {})

    async def ready(self, name: str, ns: str = "default") -> dict[str, Any]:
        conditions = (await self.status(name, ns)).get("conditions") or []
        return next((c for c in conditions if c.get("type") == "Ready"), {})

    async def events(self, name: str, ns: str = "default") -> list[dict[str, Any]]:
        items = await self.api.list(f"{CORE}/namespaces/{ns}/events")
        return [e for e in items if (e.get("involvedObject") or {}).get("name") == name]


@contextlib.asynccontextmanager
async def harness(
    metrics_faults: Any = None, sandbox_options: dict[str, Any] | None = None, **meter: Any
) -> AsyncIterator[Harness]:
    options: dict[str, Any] = {"load": False, "speedup": 20.0, **(sandbox_options or {})}
    async with sandbox(SandboxOptions(crds=[build_crd()], metrics_faults=metrics_faults, **options)) as sb:
        client = KubeClient(Connection(server=sb.url))
        ctx = OperatorContext(client=client, meter=Meter(**meter), ready_timeout_s=60.0)
        try:
            yield Harness(sb, ctx)
        finally:
            await client.close()


# --- foreign objects -------------------------------------------------------------------------------

FOREIGN: list[tuple[str, str, dict[str, Any]]] = [
    (
        f"{CORE}/namespaces/default/services",
        "payments",
        {
            "spec": {
                "type": "LoadBalancer",
                "selector": {"app": "payments"},
                "ports": [{"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}],
            }
        },
    ),
    (
        f"{APPS}/namespaces/default/deployments",
        "web-canary",
        {
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]},
                },
            }
        },
    ),
    (f"{CORE}/namespaces/default/configmaps", "tr-canary-options", {"data": {"config.yaml": "mine: true\n"}}),
]


def _content(obj: dict[str, Any] | None) -> dict[str, Any]:
    """What a foreign object's owner cares about: spec/data, labels, owner references."""
    obj = obj or {}
    meta = obj.get("metadata") or {}
    return {
        "spec": obj.get("spec"),
        "data": obj.get("data"),
        "labels": meta.get("labels"),
        "ownerReferences": meta.get("ownerReferences"),
        "uid": meta.get("uid"),
    }


async def foreign_objects(ticks: int = 3) -> dict[str, Any]:
    """Foreign objects named like children of ``payments``, ``web`` and ``tr``; the resources run
    ``ticks`` reconciles (a canary trial of ``web`` and ``tr`` is what deletes a canary)."""
    async with harness() as h:
        before: dict[str, dict[str, Any]] = {}
        for path, name, extra in FOREIGN:
            await h.api.create(path, {"metadata": {"name": name, "labels": {"team": "other"}}, **extra})
            before[f"{path}/{name}"] = _content(await h.get(f"{path}/{name}"))
        await h.apply(resource("payments"))
        await h.apply(
            resource("web", {"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 2})
        )
        trt = {"engine": "trtllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 2}
        await h.apply(resource("tr", trt))
        for _ in range(ticks):
            for name in ("payments", "web", "tr"):
                await h.reconcile(name)
        changed = [p for p, c in before.items() if _content(await h.get(p)) != c]
        ready = {n: await h.ready(n) for n in ("payments", "web", "tr")}
        events = {
            n: [e["message"] for e in await h.events(n) if e.get("reason") == "ResourceExists"]
            for n in ("payments", "web", "tr")
        }
        return {
            "foreign_objects": len(before),
            "foreign_changed": changed,
            "ready": ready,
            "events": events,
        }


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# --- SSRF --------------------------------------------------------------------------------------------

SECRET = "admin-password=hunter2-7f3a9c"  # what an internal page would show the operator


@dataclass
class FakePage:
    """An HTTP server answering every request 403 with a "credentials" page, counting hits."""

    hits: list[str] = field(default_factory=list)
    url: str = ""
    _runner: Any = None

    async def start(self) -> FakePage:
        from aiohttp import web

        async def answer(request: web.Request) -> web.Response:
            self.hits.append(request.path_qs)
            return web.Response(status=403, text=f"<html><h1>Router admin</h1>{SECRET}</html>" * 200)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def _measuring(spec: dict[str, Any] | None = None, **metrics: Any) -> dict[str, Any]:
    """A spec that measures at once (no warm-up, 3 s windows) with the given metrics settings."""
    out: dict[str, Any] = {
        "engine": "vllm",
        "model": MODEL,
        "tuning": {"trial": {"warmup": "0s", "measure": "3s", "minRequests": 1}},
        **(spec or {}),
    }
    if metrics:
        out["tuning"]["metrics"] = metrics
    return out


async def _everything_said(h: Harness, names: list[str]) -> str:
    """Every status and Event message about ``names`` (where a reflected answer would show)."""
    import json

    parts = []
    for name in names:
        parts.append(json.dumps(await h.status(name)))
        parts += [str(e.get("message", "")) for e in await h.events(name)]
    return "\n".join(parts)


async def ssrf(timeout_s: float = 60.0) -> dict[str, Any]:
    """Tenants name internal addresses as their Prometheus; the admin's Prometheus answers 403 with
    a body. Counts: requests to the tenant-chosen addresses, and secrets shown back anywhere."""
    from prefixtune.controller.admin import AdminPolicy

    internal = await FakePage().start()  # what a tenant points at
    admins = await FakePage().start()  # the operator's own (misbehaving) Prometheus
    try:
        async with harness(time_scale=20.0) as h:
            h.ctx.admin = AdminPolicy(prometheus_url=admins.url)
            attempts = {
                "ssrf-plain": internal.url,
                "ssrf-path": f"{internal.url}/admin/users",
                "ssrf-query": f"{internal.url}/admin?x=",
                "ssrf-creds": internal.url.replace("http://", "http://root:toor@"),
            }
            for name, url in attempts.items():
                await h.apply(resource(name, _measuring(source="prometheus", url=url)))
            await h.apply(resource("own-prom", _measuring(source="prometheus")))
            names = [*attempts, "own-prom"]
            deadline = time.monotonic() + timeout_s
            unavailable: dict[str, Any] = {}
            while time.monotonic() < deadline:
                for name in names:
                    await h.reconcile(name)
                conditions = (await h.status("own-prom")).get("conditions") or []
                unavailable = next((c for c in conditions if c.get("type") == "MetricsUnavailable"), {})
                if unavailable.get("status") == "True" and admins.hits:
                    break
                await asyncio.sleep(0.5)
            said = await _everything_said(h, names)
            refused = {n: (await h.ready(n)).get("reason") for n in attempts}
            return {
                "attempts": len(attempts),
                "tenant_url_requests": len(internal.hits),
                "operator_prometheus_requests": len(admins.hits),
                "reflected": said.count(SECRET),
                "refused": refused,
                "metrics_unavailable": unavailable.get("message", ""),
            }
    finally:
        await internal.stop()
        await admins.stop()


# --- one tenant stalls everyone ----------------------------------------------------------------------

STALLERS = 6  # as many as the old shared pool had threads (min(32, cpus + 4) on 2 cores)
# The good tenant's decisions a phase must hold for its latency figures to mean something (the
# verdict is their maximum against the read deadline). On a busy machine each reconcile takes
# longer, so a phase of fixed wall length held fewer (4 in 14 s at load 15) and the run failed on
# the count; a phase now lasts its seconds and until this many, at most PHASE_GUARD x as long.
MIN_DECISIONS = 5
PHASE_GUARD = 4.0


@dataclass
class Loop:
    """One resource reconciled every ``every_s`` (like kopf's timer), its latencies and errors."""

    name: str
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (started, seconds)
    errors: list[str] = field(default_factory=list)


async def _reconcile_forever(h: Harness, loop: Loop, every_s: float) -> None:
    while True:
        began = time.perf_counter()
        try:
            await h.reconcile(loop.name)
        except Exception as err:  # what kopf's timer would log and retry
            loop.errors.append(f"{type(err).__name__}: {str(err)[:200]}")
        loop.latencies.append((began, time.perf_counter() - began))
        await asyncio.sleep(every_s)


def _stats(values: list[float]) -> dict[str, float | int]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}
    return {
        "n": len(ordered),
        "p50_s": round(ordered[len(ordered) // 2], 3),
        "max_s": round(ordered[-1], 3),
    }


async def stall(
    quiet_s: float = 6.0, hostile_s: float = 14.0, read_deadline_s: float = 5.0
) -> dict[str, Any]:
    """A well-behaved tenant beside ``STALLERS`` tenants whose pods drip one byte every 2 s, one that
    sends an 8 MiB page and one with a malformed line. First ``quiet_s`` with every pod healthy,
    then ``hostile_s`` with the hostile pods on. The good tenant's decision latency (each reconcile)
    in both phases; the hostile tenants' own reconciles (bounded by the read deadline); errors
    raised by any reconcile (a malformed line used to fail every one)."""
    from prefixtune.controller.selfmetrics import heartbeat
    from prefixtune.sandbox.faults import MetricsFaults, TenantMode

    faults = MetricsFaults(drip_every_s=2.0, huge_bytes=8 * 1024 * 1024)
    hostile: dict[str, TenantMode] = {f"slow-{i}": "drip" for i in range(STALLERS)}
    hostile |= {"big": "huge", "bad": "malformed"}
    async with harness(time_scale=20.0, timeout_s=read_deadline_s, metrics_faults=faults) as h:
        loops = {name: Loop(name) for name in ["good", *hostile]}
        for name in loops:
            await h.apply(resource(name, _measuring()))
        server = h.ctx.metrics.serve(free_port())
        beating = asyncio.create_task(heartbeat(h.ctx.metrics.liveness, every_s=0.5))
        health: list[int] = []

        async def probe() -> None:
            import aiohttp

            url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
            async with aiohttp.ClientSession() as http:
                while True:
                    async with http.get(url) as resp:
                        health.append(resp.status)
                    await asyncio.sleep(0.5)

        tasks = [asyncio.create_task(_reconcile_forever(h, lp, 0.5)) for lp in loops.values()]
        tasks.append(asyncio.create_task(probe()))
        try:
            await _ready(h, list(loops), 60.0)
            split = time.perf_counter()
            await _phase(loops["good"], split, quiet_s)
            faults.tenants.update(hostile)
            turned = time.perf_counter()
            await _phase(loops["good"], turned, hostile_s)
        finally:
            for task in [*tasks, beating]:
                task.cancel()
            await asyncio.gather(*tasks, beating, return_exceptions=True)
            server.shutdown()
        good = loops["good"].latencies
        quiet = [d for t, d in good if split <= t < turned]
        loud = [d for t, d in good if t >= turned]
        hostile_latency = [d for n in hostile for t, d in loops[n].latencies if t >= turned]
        bad_condition = ""
        for c in (await h.status("bad")).get("conditions") or []:
            if c.get("type") == "MetricsUnavailable":
                bad_condition = str(c.get("message", ""))
        big_condition = ""
        for c in (await h.status("big")).get("conditions") or []:
            if c.get("type") == "MetricsUnavailable":
                big_condition = str(c.get("message", ""))
        said = await _everything_said(h, ["good"])
        leaked = sorted({n for n in hostile if f"{n}-" in said})
        return {
            "leaked_into_good": leaked,  # hostile tenants' pod names in the good tenant's status/Events
            "stalled_tenants": STALLERS,
            "served": dict(faults.served),
            "good_quiet": _stats(quiet),
            "good_beside_stalled": _stats(loud),
            "hostile_own": _stats(hostile_latency),
            "read_deadline_s": read_deadline_s,
            "errors": {n: lp.errors[:3] for n, lp in loops.items() if lp.errors},
            "health": {"probes": len(health), "not_ok": sum(1 for s in health if s != 200)},
            "bad_condition": bad_condition,
            "big_condition": big_condition,
        }


async def _phase(good: Loop, began: float, seconds: float) -> None:
    """Wait ``seconds``, and on until the good tenant has made MIN_DECISIONS since ``began``."""
    await asyncio.sleep(seconds)
    deadline = began + PHASE_GUARD * seconds
    while sum(1 for t, _ in good.latencies if t >= began) < MIN_DECISIONS:
        if time.perf_counter() > deadline:
            return  # reported as too few decisions: the verdict says so
        await asyncio.sleep(0.5)


async def _ingested(client: Any, sel: Any, end: float, timeout_s: float) -> None:
    """Until Prometheus holds a sample at or after ``end`` for every job scraping ``sel``."""
    query = f"max by (job) (timestamp(up{sel.render()}))"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = await asyncio.to_thread(client.custom_query, query)
        if rows and all(float(r["value"][1]) >= end for r in rows):
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"Prometheus did not ingest samples up to {end:.3f} within {timeout_s:g}s")


async def _ready(h: Harness, names: list[str], timeout_s: float) -> None:
    """Until every resource is measuring (its baseline Deployment serves). On the sandbox's clock,
    and while the resources make progress (a phase changes, a pod becomes ready): on a busy machine
    (load 15) the resources had not all left Pending after 60 wall seconds while they were moving."""

    async def phases() -> list[object]:
        return [(await h.status(n)).get("phase") for n in names]

    async def left() -> bool:
        return all(p not in (None, Phase.PENDING) for p in await phases())

    async def progress() -> tuple[object, ...]:
        pods = await h.api.list(f"{CORE}/namespaces/default/pods")
        ready = sum(
            1
            for pod in pods
            for c in (pod.get("status") or {}).get("conditions") or []
            if c.get("type") == "Ready" and c.get("status") == "True"
        )
        return (*await phases(), ready)

    what = "every resource to leave Pending"
    await wait_until(left, timeout_s, what, every_s=0.5, clock=h.sb.clock.now, progress=progress)


# --- the API calls the operator makes (for the RBAC test) ---------------------------------------------

SERVICEMONITOR_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {"plural": "servicemonitors", "singular": "servicemonitor", "kind": "ServiceMonitor"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


def call_of(method: str, path: str) -> tuple[str, str, str]:
    """(group, resource, verb) of an API request, as RBAC sees it."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    if rest and rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0]
    named = len(rest) > 1
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method)
    if verb is None:
        verb = "get" if named else "list"
    return group, resource, verb


async def observed_calls() -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) the operator's reconcile calls, through the sandbox: a
    TensorRT-LLM resource (option ConfigMaps) of two replicas (a router in front: its Deployment,
    Services, ServiceAccount, Role, RoleBinding) with the ServiceMonitor CRD installed; its children
    created, patched after a change, an owned canary deleted, the router deleted with kube-proxy."""
    import copy

    seen: set[tuple[str, str, str]] = set()
    async with harness() as h:
        await h.api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", SERVICEMONITOR_CRD)
        original = h.ctx.client.call

        async def call(method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
            seen.add(call_of(method, path))
            result: dict[str, Any] = await original(method, path, body, **kw)
            return result

        h.ctx.client.call = call  # type: ignore[method-assign]
        created = await h.apply(resource("rec", {"engine": "trtllm", "model": MODEL, "replicas": 2}))
        await h.reconcile("rec")
        uid = created["metadata"]["uid"]
        ref = {"apiVersion": "prefixtune.io/v1alpha1", "kind": "ServingDeployment", "name": "rec",
               "uid": uid, "controller": True}  # fmt: skip
        for path, name in (
            (f"{APPS}/namespaces/default/deployments", "rec"),
            (f"{CORE}/namespaces/default/configmaps", "rec-options"),
        ):
            obj = copy.deepcopy(await h.get(f"{path}/{name}"))
            assert obj is not None
            meta = {"name": f"rec-canary{name[3:]}", "labels": obj["metadata"].get("labels"),
                    "ownerReferences": [ref]}  # fmt: skip
            await h.api.create(
                path, {k: v for k, v in obj.items() if k not in ("metadata", "status")} | {"metadata": meta}
            )
        for path in (
            f"{APPS}/namespaces/default/deployments/rec",
            f"{CORE}/namespaces/default/configmaps/rec-options",
            f"{CORE}/namespaces/default/services/rec",
            "/apis/monitoring.coreos.com/v1/namespaces/default/servicemonitors/rec",
            f"{CORE}/namespaces/default/serviceaccounts/rec-router",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles/rec-router",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings/rec-router",
        ):
            await h.api.patch(path, {"metadata": {"annotations": {"prefixtune.io/rendered-hash": "changed"}}})
        h.ctx.ensured.clear()
        await h.reconcile("rec")
        path = f"{SDEP}/namespaces/default/servingdeployments/rec"
        await h.api.patch(path, {"spec": {"routing": {"policy": "kube-proxy"}}})  # the router goes
        h.ctx.ensured.clear()
        await h.reconcile("rec")
        await h.apply(resource("bad", {"engine": "vllm", "model": MODEL, "replicas": 0}))
        await h.reconcile("bad")  # an InvalidSpec Event
    return seen


# --- a pod scraped by two jobs -------------------------------------------------------------------------


async def scraped_twice(window_s: int = 8, timeout_s: float = 90.0) -> dict[str, Any]:
    """A real Prometheus in the sandbox scraping every engine pod under two jobs, a resource under
    light load: its requests in one window as the operator's query counts them, as one job alone
    counts them, and as every series summed (what the query did before: pod name only, no
    de-duplication). Needs a ``prometheus`` binary on PATH."""
    from prefixtune.controller.render import prometheus_labels
    from prefixtune.metrics import prometheus_source
    from prefixtune.metrics.bounded import BoundedPrometheus
    from prefixtune.metrics.exposition import Matcher
    from prefixtune.metrics.prometheus_source import PrometheusSource
    from prefixtune.metrics.promql import Selector
    from prefixtune.sandbox.prometheus import ENGINE_JOB

    options = {"load": True, "prometheus": "on", "prometheus_duplicate_jobs": 1, "speedup": 10.0}
    async with harness(sandbox_options=options) as h:
        body = resource("twice", {"engine": "vllm", "model": MODEL})
        body["metadata"]["annotations"] = {
            "prefixtune.io/sandbox-workload": "chatbot",
            "prefixtune.io/sandbox-rate": "2",
        }
        await h.apply(body)
        deadline = time.monotonic() + timeout_s
        pods: list[str] = []
        while time.monotonic() < deadline and not pods:
            await h.reconcile("twice")
            items = await h.api.list(f"{CORE}/namespaces/default/pods")
            pods = [
                p["metadata"]["name"]
                for p in items
                if p["metadata"]["name"].startswith("twice-")
                and any(
                    c.get("type") == "Ready" and c.get("status") == "True"
                    for c in p.get("status", {}).get("conditions", [])
                )
            ]
            await asyncio.sleep(0.5)
        if not pods:
            raise TimeoutError("the engine pod did not get ready")
        await asyncio.sleep(window_s + 4)  # traffic, scraped by both jobs
        assert h.sb.prometheus_url is not None
        client = BoundedPrometheus(h.sb.prometheus_url)
        sel = Selector.pods(pods, namespace="default")
        end = time.time()
        # Every job's samples up to ``end`` ingested before the first query: on a busy machine
        # Prometheus lags, and queries made one after another then covered different spans (43 then
        # 61 requests for the same job).
        await _ingested(client, sel, end, timeout_s)

        def requests(selector: Selector) -> float | None:
            return PrometheusSource(client, "vllm").measure(selector, window_s, end=end).signals.requests

        jobs = {
            str(r["metric"].get("job"))
            for r in client.custom_query(f"up{sel.render()}", {"time": f"{end:.3f}"})
        }
        counted = await asyncio.to_thread(requests, sel)
        # With --prometheus-operator-labels: the resource's own series carry its pod labels ...
        labelled = await asyncio.to_thread(
            requests, Selector.pods(pods, namespace="default", **prometheus_labels("twice"))
        )
        # ... and a series without them (here: a pod label claiming another resource) never counts.
        foreign = await asyncio.to_thread(
            requests, Selector.pods(pods, namespace="default", **prometheus_labels("someone-else"))
        )
        one_job = await asyncio.to_thread(
            requests, Selector((*sel.matchers, Matcher("job", "=", ENGINE_JOB)))
        )
        keep = prometheus_source._one_job_per_pod
        prometheus_source._one_job_per_pod = lambda rows: lambda labels: True
        try:
            summed = await asyncio.to_thread(requests, Selector.pods(pods))
        finally:
            prometheus_source._one_job_per_pod = keep
        return {
            "jobs": sorted(jobs),
            "counted": counted,
            "one_job": one_job,
            "every_series": summed,
            "with_operator_labels": labelled,
            "with_foreign_labels": foreign,
        }

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

import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prefixtune.api.crd import build_crd
from prefixtune.controller.kube import Connection, KubeClient
from prefixtune.controller.measure import Meter
from prefixtune.controller.reconcile import OperatorContext, reconcile
from prefixtune.sandbox.up import Sandbox, sandbox

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
async def harness(**meter: Any) -> AsyncIterator[Harness]:
    async with sandbox(load=False, crds=[build_crd()], speedup=20.0) as sb:
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


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    began = time.perf_counter()
    await call()
    return time.perf_counter() - began


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class Latencies:
    values: list[float] = field(default_factory=list)

    def worst(self) -> float:
        return max(self.values, default=0.0)

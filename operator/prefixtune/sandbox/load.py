"""Load generators of the sandbox: the declared workload, sent through each Service to its ready pods.

A Service gets a load generator when a workload is declared for it, by the annotation
``prefixtune.io/sandbox-workload`` (a twin preset: rag | chatbot | agent | qa, or a path to a
workload file) with an optional ``prefixtune.io/sandbox-rate`` (requests per sandbox second; default
the workload's own rate, else 4), found on, in order:

1. the Service itself;
2. the Service's owner (an ``ownerReferences`` entry of kind ServingDeployment);
3. a ServingDeployment of the same name in the Service's namespace.

The requests (``prefixtune.twin.workloads.generate``, deterministic per Service and seed, generated
in windows of ``window_s`` sandbox seconds, forever) are sent open-loop at their arrival times
(divided by ``speedup``), each to a ready endpoint picked at random per request, as kube-proxy does
without session affinity; so a canary pod and the baseline pods see the same traffic mix. The
endpoints are re-read from the Service's Endpoints object as they change. With no ready endpoint a
request fails as a refused connection would. Requests use the twin's ``/v1/completions`` with token
ids and the output-identity extension (``ids_completion_body``); the ids are the twin's ids of the
text a router is sent (``chat.text_ids``), so the engines cache the very same tokens whether the
load goes through a router or not, and a routing change does not empty every cache.

Through a router: the operator's user-facing Service (the resource's name) selects the router pods
once a router runs (``routing/render.py``), so the same generator goes on through it (its sessions
continue) when a router comes or goes. While a Service's ready endpoints are router pods (label
``app.kubernetes.io/component: router``), its requests carry text (the routers' prefix trees need
text; ``chat.ids_text``: 4 ASCII characters per token, so prompts keep the prefixes their token ids
share, and a session's next turn repeats the previous turn's text), the served model's name
(sglang-router requires ``model``: the first the router's ``/v1/models`` names, else the resource's
``spec.model``), the output-identity extension in the twin's ids of that text (the routers pass
unknown fields through), and the session in ``X-Session-ID`` (vllm-router's ``consistent_hash`` key;
sglang-router ignores it). Of the Services a ServingDeployment owns, only the one with its name gets
its owner's workload when there is one (not ``<name>-engines``, the engines' own Service beside a
router: one load per resource).

Pure parts: ``declared_workload`` (which workload for which Service), ``user_facing``,
``ids_completion_body``, ``text_completion_body`` and ``pick_target``.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from prefixtune.sandbox import controllers as ctl
from prefixtune.sandbox.client import ApiClient, ApiStatusError
from prefixtune.sandbox.clock import SandboxClock
from prefixtune.sandbox.router import COMPONENT_LABEL, ROUTER_COMPONENT
from prefixtune.sandbox.tasks import Wakeup, stop_task
from prefixtune.twin.chat import ids_text, text_ids
from prefixtune.twin.loadgen import Record
from prefixtune.twin.openai_api import error_message
from prefixtune.twin.request import Request

logger = logging.getLogger(__name__)

WORKLOAD_ANNOTATION = "prefixtune.io/sandbox-workload"
RATE_ANNOTATION = "prefixtune.io/sandbox-rate"
DEFAULT_RATE = 4.0
SDEP_PATH = "/apis/prefixtune.io/v1alpha1"


@dataclass(frozen=True)
class Declared:
    """The workload declared for one Service."""

    workload: str
    rate: float | None  # requests per sandbox second; None: the workload's own rate
    source: str  # where it was declared (for messages)
    owner: str | None = None  # the ServingDeployment it was declared on (None: the Service itself)
    model: str | None = None  # that resource's spec.model


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return ((obj or {}).get("metadata") or {}).get("annotations") or {}


def _declared_on(obj: Mapping[str, Any] | None, source: str, resource: bool) -> Declared | None:
    """The workload the annotations of ``obj`` declare (``resource``: a ServingDeployment's)."""
    notes = _annotations(obj)
    workload = str(notes.get(WORKLOAD_ANNOTATION, "")).strip()
    if not workload:
        return None
    raw_rate = notes.get(RATE_ANNOTATION)
    rate: float | None = None
    if raw_rate not in (None, ""):
        try:
            rate = float(str(raw_rate))
        except ValueError:
            raise ValueError(
                f"{source}: annotation {RATE_ANNOTATION} must be a number of requests/s > 0, got {raw_rate!r}"
            ) from None
        if not rate > 0:
            raise ValueError(f"{source}: annotation {RATE_ANNOTATION} must be > 0, got {raw_rate!r}")
    if not resource:
        return Declared(workload, rate, source)
    meta, spec = (obj or {}).get("metadata") or {}, (obj or {}).get("spec") or {}
    model = spec.get("model")
    return Declared(workload, rate, source, str(meta.get("name")), str(model) if model else None)


def declared_workload(
    service: Mapping[str, Any], serving_deployments: Sequence[Mapping[str, Any]]
) -> Declared | None:
    """The workload declared for ``service`` (see the module docstring for the order); None if none."""
    meta = service.get("metadata") or {}
    ns, name = meta.get("namespace", "default"), meta.get("name")
    found = _declared_on(service, f"Service {ns}/{name}", resource=False)
    if found is not None:
        return found
    owners = {
        ref.get("uid") for ref in meta.get("ownerReferences") or () if ref.get("kind") == "ServingDeployment"
    }
    for sdep in serving_deployments:
        smeta = sdep.get("metadata") or {}
        if smeta.get("uid") in owners:
            found = _declared_on(sdep, f"ServingDeployment {ns}/{smeta.get('name')}", resource=True)
            if found is not None:
                return found
    for sdep in serving_deployments:
        smeta = sdep.get("metadata") or {}
        if smeta.get("namespace", "default") == ns and smeta.get("name") == name:
            return _declared_on(sdep, f"ServingDeployment {ns}/{name}", resource=True)
    return None


SESSION_HEADER = "X-Session-ID"  # vllm-router's consistent_hash key (its first choice)


def user_facing(service: Mapping[str, Any], peers: Sequence[Mapping[str, Any]], declared: Declared) -> bool:
    """Whether ``service`` gets the generator of ``declared``: a workload declared on the Service
    itself, always; one of a ServingDeployment, on the Service with the resource's name when the
    resource has one (its other Services, such as the engines' own beside a router, get none)."""
    if declared.owner is None:
        return True
    meta = service.get("metadata") or {}
    if meta.get("name") == declared.owner:
        return True
    ns = meta.get("namespace", "default")
    return not any(
        (o.get("metadata") or {}).get("name") == declared.owner
        and (o.get("metadata") or {}).get("namespace", "default") == ns
        for o in peers
    )


def ids_completion_body(req: Request) -> dict[str, Any]:
    """The ``/v1/completions`` body of ``req`` sent to an engine pod: the twin's ids of the text
    ``text_completion_body`` sends a router (``chat.text_ids``), prompt and output identity."""
    tokens = req.seq.to_tokens()
    prompt, output = tokens[: req.prompt_len], tokens[req.prompt_len : req.prompt_len + req.output_len]
    body: dict[str, Any] = {"prompt": text_ids(prompt), "max_tokens": req.output_len}
    if len(output) == req.output_len:
        body["prefixtune"] = {"output_token_ids": text_ids(output)}
    return body


def text_completion_body(req: Request, model: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``/v1/completions`` body and headers of ``req`` sent through a router: a text prompt
    (``ids_text``), the output identity in the twin's ids of that text, the session header."""
    tokens = req.seq.to_tokens()
    prompt, output = tokens[: req.prompt_len], tokens[req.prompt_len : req.prompt_len + req.output_len]
    body: dict[str, Any] = {"prompt": ids_text(prompt), "max_tokens": req.output_len}
    if model is not None:
        body["model"] = model
    if len(output) == req.output_len:
        body["prefixtune"] = {"output_token_ids": text_ids(output)}
    headers = {SESSION_HEADER: str(req.session)} if req.session is not None else {}
    return body, headers


def pick_target(targets: Sequence[str], rng: random.Random) -> str | None:
    """A backend per request, uniformly at random (kube-proxy's default, no session affinity)."""
    return rng.choice(list(targets)) if targets else None


def _seed_for(seed: int, namespace: str, name: str) -> int:
    digest = hashlib.sha256(f"{seed}/{namespace}/{name}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclass
class LoadStats:
    """What one Service's load generator did (plain Python values)."""

    sent: int = 0
    ok: int = 0
    errors: int = 0
    no_endpoints: int = 0
    by_target: dict[str, int] = field(default_factory=dict)
    recent: collections.deque[Record] = field(default_factory=lambda: collections.deque(maxlen=2000))

    def to_dict(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "ok": self.ok,
            "errors": self.errors,
            "no_endpoints": self.no_endpoints,
            "by_target": dict(self.by_target),
        }


class ServiceLoad:
    """The load generator of one Service (a task; cancel it to stop)."""

    def __init__(
        self,
        api: ApiClient,
        session: aiohttp.ClientSession,
        namespace: str,
        name: str,
        declared: Declared,
        *,
        speedup: float,
        seed: int,
        window_s: float = 600.0,
        max_in_flight: int = 256,
        clock: SandboxClock | None = None,
    ) -> None:
        self.api = api
        self.session = session
        self.namespace = namespace
        self.name = name
        self.declared = declared
        self.speedup = speedup
        self.seed = _seed_for(seed, namespace, name)
        self.window_s = window_s
        self.max_in_flight = max_in_flight
        # Arrivals are due on the sandbox's clock: when the loop stalls the schedule waits with it
        # (no burst of late requests), as the twins' simulated time does.
        self.clock = clock or SandboxClock()
        self.targets: list[str] = []
        self.routed = False  # the Service's ready endpoints are router pods: text, model, session
        self.model: str | None = None  # the served model's name (read once routed)
        self.stats = LoadStats()
        self.error = ""
        self._rng = random.Random(self.seed)
        self._tasks: set[asyncio.Task[None]] = set()

    async def refresh_targets(self) -> None:
        endpoints = await self.api.get(f"/api/v1/namespaces/{self.namespace}/endpoints/{self.name}")
        pairs = ctl.endpoint_targets(endpoints or {})
        self.targets = sorted(f"http://{ip}:{port}" for ip, port in pairs)
        routers = await self.api.list(
            f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={COMPONENT_LABEL}%3D{ROUTER_COMPONENT}"
        )
        router_ips = {str((p.get("status") or {}).get("podIP")) for p in routers}
        self.routed = bool(pairs) and all(ip in router_ips for ip, _ in pairs)
        if self.routed and self.model is None:
            self.model = await self._served_model(self.targets[0]) or self.declared.model

    async def _served_model(self, base: str) -> str | None:
        """The first model ``base`` (a router) names in ``/v1/models`` (None: none, or "unknown", what
        sglang-router says of a worker that does not describe itself)."""
        try:
            limit = aiohttp.ClientTimeout(total=10)
            async with self.session.get(f"{base}/v1/models", timeout=limit) as resp:
                data = await resp.json(content_type=None)
            name = str(data["data"][0]["id"])
        except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, IndexError, TypeError):
            return None
        return None if name == "unknown" else name

    def _window(self, index: int) -> list[Request]:
        from prefixtune.twin.workloads import generate

        return generate(
            self.declared.workload,
            rate=self.declared.rate
            if self.declared.rate is not None
            else _default_rate(self.declared.workload),
            duration_s=self.window_s,
            seed=(self.seed + index) & 0x7FFFFFFF,
        )

    async def run(self) -> None:
        clock = self.clock
        t0 = clock.now()
        try:
            index = 0
            while True:
                try:
                    requests = await asyncio.to_thread(self._window, index)
                except ValueError as err:  # a bad workload name or file: say so once, send nothing
                    self.error = f"{self.declared.source}: {err}"
                    logger.error("sandbox load: %s", self.error)
                    return
                offset = index * self.window_s
                for req in sorted(requests, key=lambda r: (r.arrival_s, r.req_id)):
                    if req.arrival_s >= self.window_s:
                        continue  # turns past the window: the next window has its own sessions
                    due = t0 + (offset + req.arrival_s) / self.speedup
                    await clock.sleep_until(due)
                    self._send(req)
                index += 1
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _send(self, req: Request) -> None:
        target = pick_target(self.targets, self._rng)
        self.stats.sent += 1
        if target is None:
            self.stats.no_endpoints += 1
            self.stats.errors += 1
            return
        if len(self._tasks) >= self.max_in_flight:
            self.stats.errors += 1
            return
        self.stats.by_target[target] = self.stats.by_target.get(target, 0) + 1
        task = asyncio.get_running_loop().create_task(self._post(req, target))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, req: Request, target: str) -> None:
        sent = time.monotonic()
        status, error = 0, ""
        usage: dict[str, Any] = {}
        headers: dict[str, str] = {}
        if self.routed:
            body, headers = text_completion_body(req, self.model)
        else:
            body = ids_completion_body(req)
        try:
            async with self.session.post(f"{target}/v1/completions", json=body, headers=headers) as resp:
                status = resp.status
                data = await resp.json(content_type=None)
                if isinstance(data, dict):
                    usage = data.get("usage") or {}
                    if status != 200:
                        error = error_message(data)
        except (TimeoutError, aiohttp.ClientError, ValueError) as err:
            error = f"{type(err).__name__}: {err}"
        if status == 200:
            self.stats.ok += 1
        else:
            self.stats.errors += 1
        details = usage.get("prompt_tokens_details") or {}
        self.stats.recent.append(
            Record(
                req_id=req.req_id,
                session=req.session,
                kind=req.kind,
                target=target,
                scheduled_s=req.arrival_s / self.speedup,
                sent_s=sent,
                status=status,
                latency_s=time.monotonic() - sent,
                prompt_tokens=int(usage.get("prompt_tokens", 0)),
                completion_tokens=int(usage.get("completion_tokens", 0)),
                cached_tokens=int(details.get("cached_tokens") or 0),
                error=error,
            )
        )


def _default_rate(workload: str) -> float:
    from prefixtune.twin.workloads import resolve_workload

    spec = resolve_workload(workload)
    return float(spec.rate) if spec.rate else DEFAULT_RATE


class LoadManager:
    """Starts, updates and stops one ``ServiceLoad`` per Service with a declared workload."""

    def __init__(
        self,
        api: ApiClient,
        *,
        speedup: float,
        seed: int = 0,
        resync_s: float = 1.0,
        clock: SandboxClock | None = None,
    ) -> None:
        self.api = api
        self.clock = clock or SandboxClock()
        self.speedup = speedup
        self.seed = seed
        self.resync_s = resync_s
        self.wakeup = Wakeup()
        self.loads: dict[tuple[str, str], tuple[ServiceLoad, asyncio.Task[None]]] = {}
        self.problems: dict[tuple[str, str], str] = {}
        self._session: aiohttp.ClientSession | None = None

    async def run(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=512), timeout=aiohttp.ClientTimeout(total=600)
        )
        try:
            while True:
                try:
                    await self.sync()
                except (ApiStatusError, aiohttp.ClientError) as err:
                    logger.warning("sandbox load sync failed (retrying): %s", err)
                await self.wakeup.wait(self.resync_s)
        finally:
            for key in list(self.loads):
                await self._stop(key)
            await self._session.close()

    async def _serving_deployments(self) -> list[dict[str, Any]]:
        try:
            return await self.api.list(f"{SDEP_PATH}/servingdeployments")
        except ApiStatusError as err:
            if err.status == 404:  # the CRD is not installed (yet)
                return []
            raise

    async def sync(self) -> None:
        assert self._session is not None
        services = await self.api.list("/api/v1/services")
        sdeps = await self._serving_deployments()
        seen: set[tuple[str, str]] = set()
        for service in services:
            meta = service.get("metadata") or {}
            key = (str(meta.get("namespace", "default")), str(meta.get("name")))
            try:
                declared = declared_workload(service, sdeps)
            except ValueError as err:
                self.problems[key] = str(err)
                declared = None
            if declared is None:
                continue
            if not user_facing(service, services, declared):
                continue  # the resource's user-facing Service carries its load
            seen.add(key)
            current = self.loads.get(key)
            if current is not None and current[0].declared != declared:
                await self._stop(key)
                current = None
            if current is None:
                load = ServiceLoad(
                    self.api,
                    self._session,
                    key[0],
                    key[1],
                    declared,
                    speedup=self.speedup,
                    seed=self.seed,
                    clock=self.clock,
                )
                await load.refresh_targets()
                task = asyncio.get_running_loop().create_task(load.run(), name=f"load {key[0]}/{key[1]}")
                self.loads[key] = (load, task)
            else:
                await current[0].refresh_targets()
        for key in [k for k in self.loads if k not in seen]:
            await self._stop(key)

    async def _stop(self, key: tuple[str, str]) -> None:
        _, task = self.loads.pop(key)
        await stop_task(task)

    def stats(self) -> dict[str, dict[str, Any]]:
        return {f"{ns}/{name}": load.stats.to_dict() for (ns, name), (load, _) in self.loads.items()}


__all__ = [
    "RATE_ANNOTATION",
    "WORKLOAD_ANNOTATION",
    "Declared",
    "LoadManager",
    "LoadStats",
    "ServiceLoad",
    "declared_workload",
    "ids_completion_body",
    "pick_target",
    "text_completion_body",
    "user_facing",
]

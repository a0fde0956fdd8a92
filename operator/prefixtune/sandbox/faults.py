"""Fault injection for the sandbox (reliability tests and ``prefixtune bench reliability``).

Off by default; every decision is drawn from a seeded RNG, so a run is reproducible given its seed
and the order of requests.

* ``ApiFaults`` (consulted by the emulator for every request): answers 500/503 on a fraction of the
  requests of the clients under test, 409 Conflict on a fraction of their status patches, and ends
  their watch streams early (a dropped watch: the client sees the stream end and must reconnect).
  Faults apply only to requests whose ``Authorization: Bearer <token>`` names a client under test
  (the operator processes); the sandbox's own controllers and kubelet send no token and are spared.
  Every request of a client (token) is recorded in ``audit``: who wrote what, when, with which answer.
* ``MetricsFaults`` (consulted by the kubelet's pods on every scrape of the engine's metrics
  endpoint): unreachable (the connection is dropped), gap (an empty exposition), NaN (every sample
  NaN), reset (cumulative series restart from zero, as after an exporter restart); and what a hostile
  tenant's image can serve (issue #17), per resource in ``tenants``: drip (one byte every
  ``drip_every_s``), huge (the exposition padded to ``huge_bytes``), malformed (a bad line added).
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

API_ERROR_CODES = (500, 503)
MetricsMode = Literal["unreachable", "gap", "nan", "reset"]
METRICS_MODES: tuple[str, ...] = ("unreachable", "gap", "nan", "reset")
TenantMode = Literal["drip", "huge", "malformed"]
TENANT_MODES: tuple[str, ...] = ("drip", "huge", "malformed")
_RECORDED_BODIES = ("servingdeployments", "deployments")  # writes whose bodies the audit keeps


@dataclass(frozen=True)
class AuditEntry:
    """One request of a client under test, as the emulator answered it."""

    t: float  # wall clock (time.time())
    client: str  # the bearer token
    method: str
    path: str
    status: int  # what the client got (an injected fault's code, or the real answer)
    injected: str = ""  # "" | "error" | "conflict" | "watch_drop"
    body: Any = None  # parsed JSON body of writes to ServingDeployments and Deployments

    @property
    def is_write(self) -> bool:
        return self.method in ("POST", "PATCH", "PUT", "DELETE")


def bearer(headers: Mapping[str, str]) -> str:
    """The bearer token of a request ("" without one)."""
    value = str(headers.get("Authorization", ""))
    return value[7:].strip() if value.startswith("Bearer ") else ""


@dataclass
class ApiFaults:
    """API-server faults for the clients under test (see the module docstring)."""

    seed: int = 0
    error_rate: float = 0.0  # fraction of requests (not watches) answered 500 or 503
    conflict_rate: float = 0.0  # fraction of status patches answered 409 Conflict
    watch_drop_after_s: tuple[float, float] | None = None  # watch streams end after U(a, b) wall seconds
    clients: frozenset[str] | None = None  # tokens under test; None: every request with a token
    enabled: bool = True
    audit: list[AuditEntry] = field(default_factory=list)
    injected: dict[str, int] = field(default_factory=dict)  # kind -> count
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        for name in ("error_rate", "conflict_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}: must be in [0, 1], got {value}")
        if self.watch_drop_after_s is not None:
            low, high = self.watch_drop_after_s
            if not 0 < low <= high:
                raise ValueError(f"watch_drop_after_s: need 0 < low <= high, got {self.watch_drop_after_s}")
        self._rng = random.Random(self.seed)

    def under_test(self, client: str) -> bool:
        return bool(client) and (self.clients is None or client in self.clients)

    def decide(self, client: str, method: str, path: str, watch: bool) -> tuple[str, int]:
        """("", 0): serve normally; ("error", 500|503) or ("conflict", 409): answer that instead."""
        if not self.enabled or not self.under_test(client) or watch:
            return "", 0
        status_patch = method == "PATCH" and path.endswith("/status")
        if status_patch and self.conflict_rate and self._rng.random() < self.conflict_rate:
            return self._count("conflict"), 409
        if self.error_rate and self._rng.random() < self.error_rate:
            return self._count("error"), self._rng.choice(API_ERROR_CODES)
        return "", 0

    def watch_deadline(self, client: str) -> float | None:
        """Wall seconds after which this client's new watch stream is dropped (None: not dropped)."""
        if not self.enabled or not self.under_test(client) or self.watch_drop_after_s is None:
            return None
        low, high = self.watch_drop_after_s
        return self._rng.uniform(low, high)

    def count_watch_drop(self) -> None:
        self._count("watch_drop")

    def _count(self, kind: str) -> str:
        self.injected[kind] = self.injected.get(kind, 0) + 1
        return kind

    def record(
        self, client: str, method: str, path: str, status: int, injected: str = "", body: Any = None
    ) -> None:
        if not client:
            return
        keep = method in ("POST", "PATCH", "PUT") and any(f"/{r}" in path for r in _RECORDED_BODIES)
        self.audit.append(
            AuditEntry(self.clock(), client, method, path, status, injected, _json(body) if keep else None)
        )


def _json(raw: Any) -> Any:
    if isinstance(raw, bytes | bytearray):
        try:
            return json.loads(raw)
        except ValueError:
            return None
    return raw


# ------------------------------------------------------------------------------------------ metrics

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{.*\})?\s+(?P<value>\S+)(?P<rest>.*)$")
_CUMULATIVE = ("_total", "_count", "_sum", "_bucket")


@dataclass
class MetricsFaults:
    """Faults of the pods' metrics endpoints, switched on and off at run time (``set``/``clear``)."""

    mode: MetricsMode | None = None
    pods: frozenset[str] | None = None  # pod names affected; None: every pod
    served: dict[str, int] = field(default_factory=dict)  # mode -> faulty scrapes served
    tenants: dict[str, TenantMode] = field(default_factory=dict)  # resource name -> what its pods serve
    drip_every_s: float = 2.0
    huge_bytes: int = 8 * 1024 * 1024
    _offsets: dict[tuple[str, str], float] = field(default_factory=dict)  # (pod, series) -> reset base
    # (wall time, pod, fault mode or None) of the latest scrapes served: whether a window's first
    # scrape came before a fault or after it (a counter reset before it leaves nothing to notice)
    scrapes: deque[tuple[float, str, MetricsMode | None]] = field(default_factory=lambda: deque(maxlen=4096))

    def set(self, mode: str, pods: frozenset[str] | None = None) -> None:
        if mode not in METRICS_MODES:
            raise ValueError(f"metrics fault mode: must be one of {', '.join(METRICS_MODES)}, got {mode!r}")
        self.mode = mode  # type: ignore[assignment]
        self.pods = pods

    def clear(self) -> None:
        """Back to healthy scrapes; reset counters stay reset (they keep counting from the reset)."""
        self.mode = None
        self.pods = None

    def tenant_for(self, pod: str) -> TenantMode | None:
        """The hostile mode of a pod of resource ``r`` (its pods are named ``r-<hash>-<id>``)."""
        for resource, mode in self.tenants.items():
            if pod.startswith(resource + "-") and pod.count("-") - resource.count("-") == 2:
                return mode
        return None

    def active_for(self, pod: str) -> MetricsMode | None:
        if self.mode is None or (self.pods is not None and pod not in self.pods):
            return None
        return self.mode

    def transform(self, pod: str, text: str) -> str | None:
        """The exposition a pod serves now (None: drop the connection)."""
        mode = self.active_for(pod)
        if mode is not None:
            self.served[mode] = self.served.get(mode, 0) + 1
        if mode == "unreachable":
            return None
        if mode == "gap":
            return ""
        if mode == "reset":
            for line in text.splitlines():  # a new reset base for every series not yet reset
                sample = _SAMPLE.match(line)
                if sample and sample["name"].endswith(_CUMULATIVE):
                    key = (pod, sample["name"] + (sample["labels"] or ""))
                    self._offsets.setdefault(key, _float(sample["value"]))
        if mode == "nan" or any(k[0] == pod for k in self._offsets):
            return "\n".join(self._rewrite(pod, line, nan=mode == "nan") for line in text.splitlines()) + "\n"
        return text

    def _rewrite(self, pod: str, line: str, *, nan: bool) -> str:
        sample = _SAMPLE.match(line)
        if sample is None or line.startswith("#"):
            return line
        name = sample["name"]
        if nan:
            if name.endswith("_created") or name == "process_start_time_seconds":
                return line
            value = "NaN"
        else:
            base = self._offsets.get((pod, name + (sample["labels"] or "")))
            if base is None:
                return line
            value = repr(max(_float(sample["value"]) - base, 0.0))
        return f"{name}{sample['labels'] or ''} {value}{sample['rest']}"


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def install_metrics_faults(server: Any, faults: MetricsFaults, pod: str) -> None:
    """Route a TwinServer's metrics endpoint through ``faults`` (call before ``server.start()``).

    The twin binds ``server._metrics`` when it starts; an instance attribute shadows the method.
    """
    from aiohttp import web

    original = server._metrics

    async def metrics(request: web.Request) -> web.StreamResponse:
        response: web.Response = await original(request)
        hostile = faults.tenant_for(pod)
        if hostile is not None:
            faults.served[hostile] = faults.served.get(hostile, 0) + 1
            served: web.StreamResponse = await _hostile(request, response, hostile, faults)
            return served
        faults.scrapes.append((time.time(), pod, faults.active_for(pod)))  # healthy ones too
        if faults.active_for(pod) is None and not faults._offsets:
            return response
        body = response.body.decode() if isinstance(response.body, bytes | bytearray) else ""
        text = faults.transform(pod, body)
        if text is None:  # the scraper sees the connection drop (nothing is answered)
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=503)
        content_type = response.headers.get("Content-Type", "text/plain; version=0.0.4")
        return web.Response(body=text.encode(), headers={"Content-Type": content_type})

    server._metrics = metrics


async def _hostile(request: Any, response: Any, mode: TenantMode, faults: MetricsFaults) -> Any:
    import asyncio

    from aiohttp import web

    body = bytes(response.body) if isinstance(response.body, bytes | bytearray) else b""
    if mode == "malformed":
        return web.Response(body=body + b"this is { not a sample\n", content_type="text/plain")
    if mode == "huge":
        pad = b"# padding\n" * (faults.huge_bytes // 10 + 1)
        return web.Response(body=body + pad, content_type="text/plain")
    stream = web.StreamResponse(headers={"Content-Type": "text/plain; version=0.0.4"})
    await stream.prepare(request)
    try:
        for byte in body:
            await stream.write(bytes([byte]))
            await asyncio.sleep(faults.drip_every_s)
    except ConnectionResetError:  # the scraper gave up (its deadline): what a drip is for
        pass
    return stream


__all__ = [
    "API_ERROR_CODES",
    "METRICS_MODES",
    "TENANT_MODES",
    "ApiFaults",
    "AuditEntry",
    "MetricsFaults",
    "bearer",
    "install_metrics_faults",
]

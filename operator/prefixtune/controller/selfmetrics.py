"""The operator's own Prometheus metrics and its liveness (``prefixtune run --metrics-port``).

By default only aggregate series are served: trials by outcome, rollouts, rollbacks, errors, the
number of resources in each phase, decision latency. Per-resource series (``namespace``/``name``
labels, the best score) list every tenant's resources to whoever can reach the port, so they are
served only with ``--metrics-per-resource`` (the chart's ``metrics.perResource``).

``prefixtune_watch_lag_seconds`` (``WatchLag``): how far the operator's view of its resources runs
behind the API server, measured where both ends are the operator's own: from a status write's
response (the version it created) to the moment kopf hands the operator's event handler that version
or a later one. It spans the API server's fan-out to the watch, the stream, kopf's queueing and its
batching window, and a busy event loop; a tick whose watched body is not yet at the version it wrote
reads the resource again (``reconcile.current_body``), so this lag is also what such reads cost.

``/healthz`` answers 200 while the event loop makes progress: a heartbeat coroutine that also passes
through the default thread pool (where the policy's decisions run) stamps it every few seconds; when
the stamp is older than ``stale_after_s`` the answer is 503, and the kubelet restarts the pod. (The
HTTP server runs in its own thread, so without the heartbeat it would answer while every reconcile
is frozen.)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from prefixtune.tuning.actions import Action, RecordTrial, RollBack, RollOut
from prefixtune.tuning.phases import Phase

PHASES = tuple(str(phase) for phase in Phase)
HEARTBEAT_S = 2.0
# Seconds; fine enough below 1 s for p50/p99 read from the buckets (``prefixtune bench scale``).
LATENCY_BUCKETS = (
    0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0,
)  # fmt: skip
STALE_AFTER_S = 60.0


PENDING_WRITES = 16  # per resource: writes not yet seen (more: the oldest is dropped, not measured)


def _reached(seen: str, written: str) -> bool:
    """Whether a watched version holds a write: the same version, or a later one where both are
    integers (etcd's revisions and the sandbox's are; the API calls them opaque, so any other
    version counts only when equal)."""
    if seen == written:
        return True
    return seen.isdigit() and written.isdigit() and int(seen) > int(written)


class WatchLag:
    """The operator's writes of each resource not yet seen by its watch, and the histogram of the
    seconds until they were (see the module docstring). Only the event loop calls it."""

    def __init__(self, histogram: Histogram, clock: Any = time.monotonic) -> None:
        self.histogram = histogram
        self.clock = clock
        self._pending: dict[str, deque[tuple[str, float]]] = {}

    def wrote(self, key: str, body: Mapping[str, Any] | None) -> None:
        version = _version(body)
        if version:
            self._pending.setdefault(key, deque(maxlen=PENDING_WRITES)).append((version, self.clock()))

    def seen(self, key: str, body: Mapping[str, Any]) -> None:
        pending, version = self._pending.get(key), _version(body)
        if not pending or not version:
            return
        now = self.clock()
        while pending and _reached(version, pending[0][0]):
            self.histogram.observe(now - pending.popleft()[1])
        if not pending:
            del self._pending[key]

    def forget(self, key: str) -> None:
        self._pending.pop(key, None)


def _version(body: Mapping[str, Any] | None) -> str:
    return str(((body or {}).get("metadata") or {}).get("resourceVersion") or "")


class Liveness:
    """The time of the last heartbeat (monotonic), read by the /healthz handler's thread."""

    def __init__(self, stale_after_s: float = STALE_AFTER_S, clock: Any = time.monotonic) -> None:
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.last = clock()

    def beat(self) -> None:
        self.last = self.clock()

    def stalled_for(self) -> float | None:
        """Seconds since the last heartbeat when that is too long; None while alive."""
        age = self.clock() - self.last
        return age if age > self.stale_after_s else None


async def heartbeat(liveness: Liveness, every_s: float = HEARTBEAT_S) -> None:
    """Stamp ``liveness`` while the event loop and the default thread pool both make progress."""
    while True:
        await asyncio.to_thread(lambda: None)
        liveness.beat()
        await asyncio.sleep(every_s)


class SelfMetrics:
    """One registry per operator instance (tests run several in one process)."""

    def __init__(self, registry: CollectorRegistry | None = None, *, per_resource: bool = False) -> None:
        self.registry = registry or CollectorRegistry()
        self.per_resource = per_resource
        self.liveness = Liveness()
        labels: tuple[str, ...] = ("namespace", "name") if per_resource else ()
        self.trials = Counter(
            "prefixtune_trials", "Finished trials by outcome.", (*labels, "outcome"), registry=self.registry
        )
        self.rollouts = Counter(
            "prefixtune_rollouts", "Rollouts started (trials and applies).", labels, registry=self.registry
        )
        self.rollbacks = Counter("prefixtune_rollbacks", "Rollbacks started.", labels, registry=self.registry)
        self.best_score: Gauge | None = None
        if per_resource:
            self.best_score = Gauge(
                "prefixtune_best_score",
                "Objective value of the best trial of the current tuning run.",
                labels,
                registry=self.registry,
            )
        self.phase = Gauge(
            "prefixtune_phase",
            "1 for the resource's current phase, 0 for the others."
            if per_resource
            else "Resources in each phase.",
            (*labels, "phase"),
            registry=self.registry,
        )
        self.decision_seconds = Histogram(
            "prefixtune_decision_seconds",
            "Time of one reconcile (observe, decide, persist, apply).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.policy_seconds = Histogram(
            "prefixtune_policy_seconds",
            "Time of the policy's decision in one reconcile (its steps, the optimizer's fit and ask, "
            "including the wait for a thread of the decision pool).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.watch_lag = WatchLag(
            Histogram(
                "prefixtune_watch_lag_seconds",
                "Time from the operator's status write of a resource to its watch handing the operator "
                "that version (or a later one).",
                buckets=LATENCY_BUCKETS,
                registry=self.registry,
            )
        )
        self.reconcile_errors = Counter(
            "prefixtune_reconcile_errors",
            "Reconciles that failed and will be retried.",
            labels,
            registry=self.registry,
        )
        self._phases: dict[tuple[str, str], str] = {}
        self._counts: dict[str, int] = {p: 0 for p in PHASES}  # resources per phase (aggregate mode)
        if not per_resource:
            for p in PHASES:
                self.phase.labels(p).set(0.0)

    def _of(self, namespace: str, name: str) -> tuple[str, ...]:
        return (namespace, name) if self.per_resource else ()

    def error(self, namespace: str, name: str) -> None:
        _child(self.reconcile_errors, self._of(namespace, name)).inc()

    def record(self, namespace: str, name: str, actions: Sequence[Action]) -> None:
        key = self._of(namespace, name)
        for action in actions:
            if isinstance(action, RecordTrial):
                self.trials.labels(*key, action.trial.outcome).inc()
            elif isinstance(action, RollOut):
                _child(self.rollouts, key).inc()
            elif isinstance(action, RollBack):
                _child(self.rollbacks, key).inc()

    def set_state(self, namespace: str, name: str, phase: str, best: float | None) -> None:
        before = self._phases.get((namespace, name))
        self._phases[(namespace, name)] = phase
        if self.per_resource:
            for p in PHASES:
                self.phase.labels(namespace, name, p).set(1.0 if p == phase else 0.0)
            if best is not None and self.best_score is not None:
                self.best_score.labels(namespace, name).set(float(best))
        elif before != phase:
            self._move(before, phase)

    def _move(self, before: str | None, after: str | None) -> None:
        """One resource moved between phases: two gauges change, whatever the number of resources
        (a recount of every resource on each reconcile was O(N) per reconcile)."""
        for p, delta in ((before, -1), (after, 1)):
            if p is not None:
                self._counts[p] = self._counts.get(p, 0) + delta
                self.phase.labels(p).set(float(self._counts[p]))

    def forget(self, namespace: str, name: str) -> None:
        self.watch_lag.forget(f"{namespace}/{name}")
        before = self._phases.pop((namespace, name), None)
        if not self.per_resource:
            self._move(before, None)
            return
        for p in PHASES:
            if (namespace, name, p) in self._phase_keys():
                self.phase.remove(namespace, name, p)
        if self.best_score is not None and (namespace, name) in self._best_keys():
            self.best_score.remove(namespace, name)

    def _phase_keys(self) -> set[tuple[str, ...]]:
        return {
            tuple(s.labels[k] for k in ("namespace", "name", "phase"))
            for m in self.phase.collect()
            for s in m.samples
        }

    def _best_keys(self) -> set[tuple[str, ...]]:
        if self.best_score is None:
            return set()
        return {
            (s.labels["namespace"], s.labels["name"]) for m in self.best_score.collect() for s in m.samples
        }

    def serve(self, port: int, addr: str = "127.0.0.1") -> ThreadingHTTPServer:
        """/metrics and /healthz on ``addr:port`` in a daemon thread (returns the server)."""
        server = ThreadingHTTPServer((addr, port), _handler(self))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="prefixtune-metrics", daemon=True).start()
        return server


def _child(counter: Counter, labels: tuple[str, ...]) -> Counter:
    """The labelled child, or the counter itself when it has no labels (aggregate mode)."""
    return counter.labels(*labels) if labels else counter


def _handler(metrics: SelfMetrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                stalled = metrics.liveness.stalled_for()
                if stalled is None:
                    self._send(200, b"ok\n", "text/plain")
                else:
                    self._send(503, f"event loop stalled for {stalled:.0f}s\n".encode(), "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler

"""The routers' own Prometheus metrics: per-worker request share and cache-aware vs load-balanced
decisions, read from a scrape of the router pods (pure functions over parsed expositions).

The names, as each router's ``/metrics`` (``--prometheus-port``) serves them, checked by running the
wheels here against two ``prefixtune twin serve`` SGLang workers (12 completions, cache_aware):

- sglang-router 0.3.2 (the SGLang Model Gateway, ``smg_*``): per worker,
  ``smg_worker_cb_outcomes_total{worker, outcome}`` (each request's outcome at the worker it was sent
  to: success or failure); ``smg_worker_selection_total`` carries no worker label (worker_type,
  connection_mode, model, policy). It exports no cache-aware decision metric (the cache-aware
  policy's branches are debug logs only), so its decisions read as unknown.
- vllm-router 0.1.17 (``vllm_router_*``): per worker, ``vllm_router_processed_requests_total{worker}``
  ("Total requests processed by each worker"); each cache-aware decision,
  ``vllm_router_prefix_routing_decisions_total{policy, stage, outcome}`` ("Cache prefix decision"):
  ``prefix_hit`` / ``prefix_miss`` (sent by the prefix tree: to the worker holding the prefix, or, a
  low match, to the least-loaded worker), ``load_imbalance`` (sent to the least-loaded worker
  instead), and ``missing_tokens`` (the request reached the policy without token ids: routed by load
  alone). Its tree holds token ids, which it asks every worker for before each decision (``POST
  /v1/completions/render``, vLLM's scale-out endpoint): workers that answer none (vLLM without
  ``--enable-scale-out``: 403; SGLang, trtllm-serve: no such route) make every decision
  ``missing_tokens`` (``tests/routing/test_routing_real_router.py`` pins both against the binary,
  ``tests/sandbox/test_sandbox_router.py`` against twin vLLM pods with and without the flag).
  Its ``vllm_router_cache_hits_total`` / ``_misses_total`` families are in the binary but were never
  emitted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prefixtune.metrics.exposition import Snapshot
from prefixtune.routing.policy import Router

MAX_WORKERS = 32  # workers listed in the status, by share (the rest summed in ``others``)


@dataclass(frozen=True)
class RouterMetricNames:
    """Where one router says what it did: the per-worker request counter (and its worker label),
    and its decision counter, its outcome label and which outcomes are cache-aware or load-balanced
    ("" where it exports none)."""

    worker_requests: str
    worker_label: str
    decisions: str = ""
    outcome_label: str = ""
    cache_aware: frozenset[str] = frozenset()
    load_balanced: frozenset[str] = frozenset()
    tokenless: frozenset[str] = frozenset()  # routed by load alone: the engines gave no token ids


ROUTER_METRICS: Mapping[Router, RouterMetricNames] = {
    Router.SGLANG: RouterMetricNames("smg_worker_cb_outcomes_total", "worker"),
    Router.VLLM: RouterMetricNames(
        "vllm_router_processed_requests_total",
        "worker",
        decisions="vllm_router_prefix_routing_decisions_total",
        outcome_label="outcome",
        cache_aware=frozenset({"prefix_hit", "prefix_miss"}),
        load_balanced=frozenset({"load_imbalance"}),
        tokenless=frozenset({"missing_tokens"}),
    ),
}


@dataclass(frozen=True)
class WorkerShare:
    worker: str  # the engine pod's name where its address is known, else the router's worker URL
    requests: float
    share: float  # of all requests the router replicas sent


@dataclass(frozen=True)
class RouterMetrics:
    """What the router replicas did since they started (counters summed over the replicas)."""

    requests: float
    workers: tuple[WorkerShare, ...]  # the MAX_WORKERS largest shares
    others: int  # workers beyond those, not listed
    cache_aware: float | None  # requests sent by prefix match (hit or miss); None: not exported
    load_balanced: float | None  # requests sent to the least-loaded worker instead; None: not exported
    # requests routed by load alone because the engines answered no token ids; None: not exported
    tokenless: float | None = None


def _decisions(
    snapshots: Sequence[Snapshot], names: RouterMetricNames, outcomes: frozenset[str]
) -> float | None:
    """Decisions of ``outcomes``; None where the router exports no decision counter."""
    if not names.decisions:
        return None
    return sum(
        value
        for snap in snapshots
        for labels, value in snap.series(names.decisions)
        if dict(labels).get(names.outcome_label) in outcomes
    )


def _host(url: str) -> str:
    """``http://10.0.0.7:8000`` -> ``10.0.0.7``."""
    rest = url.split("://", 1)[-1]
    return rest.rsplit(":", 1)[0].strip("[]") if ":" in rest else rest.split("/", 1)[0]


def read(
    router: Router, snapshots: Sequence[Snapshot], pod_names: Mapping[str, str] | None = None
) -> RouterMetrics:
    """The router's per-worker share and decisions from one scrape of each router replica.

    ``pod_names``: engine pod IP -> pod name, to name the workers the router knows by URL."""
    names = ROUTER_METRICS[router]
    by_worker: dict[str, float] = {}
    for snap in snapshots:
        for labels, value in snap.series(names.worker_requests):
            worker = dict(labels).get(names.worker_label, "")
            if worker:
                by_worker[worker] = by_worker.get(worker, 0.0) + value
    total = sum(by_worker.values())
    ranked = sorted(by_worker.items(), key=lambda kv: (-kv[1], kv[0]))
    pods = pod_names or {}
    workers = tuple(
        WorkerShare(pods.get(_host(url), url), count, count / total if total else 0.0)
        for url, count in ranked[:MAX_WORKERS]
    )
    return RouterMetrics(
        requests=total,
        workers=workers,
        others=max(len(ranked) - MAX_WORKERS, 0),
        cache_aware=_decisions(snapshots, names, names.cache_aware),
        load_balanced=_decisions(snapshots, names, names.load_balanced),
        tokenless=_decisions(snapshots, names, names.tokenless),
    )

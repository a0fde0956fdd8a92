"""The routers' metrics in status.routing: per-worker share and decisions, from their expositions."""

from __future__ import annotations

from prefixtune.api.models import RoutingStatus
from prefixtune.controller.routing_status import status_of
from prefixtune.metrics.exposition import Snapshot, parse
from prefixtune.routing import metrics as M
from prefixtune.routing.policy import Router

# As sglang-router 0.3.2 served them here (two twin workers, 12 completions; one line trimmed).
SGLANG = """\
# TYPE smg_worker_cb_outcomes_total counter
smg_worker_cb_outcomes_total{worker="http://10.0.0.1:30000",outcome="success"} 9
smg_worker_cb_outcomes_total{worker="http://10.0.0.2:30000",outcome="success"} 2
smg_worker_cb_outcomes_total{worker="http://10.0.0.2:30000",outcome="failure"} 1
# TYPE smg_worker_selection_total counter
smg_worker_selection_total{worker_type="regular",connection_mode="http",model="m",policy="cache_aware"} 12
"""

# As vllm-router 0.1.17 names them (the decision outcomes are the binary's label values).
VLLM = """\
# TYPE vllm_router_processed_requests_total counter
vllm_router_processed_requests_total{worker="http://10.0.0.1:8000"} 30
vllm_router_processed_requests_total{worker="http://10.0.0.2:8000"} 10
# TYPE vllm_router_prefix_routing_decisions_total counter
vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="regular",outcome="prefix_hit"} 25
vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="regular",outcome="prefix_miss"} 5
vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="regular",outcome="load_imbalance"} 8
vllm_router_prefix_routing_decisions_total{policy="cache_aware",stage="regular",outcome="missing_tokens"} 2
"""


def _snap(text: str, target: str = "router-0") -> Snapshot:
    return parse(text, target=target, t=0.0)


def test_sglang_routers_share_sums_each_workers_outcomes_and_names_the_pod() -> None:
    got = M.read(Router.SGLANG, [_snap(SGLANG)], {"10.0.0.1": "chat-abc"})
    assert got.requests == 12
    assert [(w.worker, w.requests, round(w.share, 3)) for w in got.workers] == [
        ("chat-abc", 9, 0.75),
        ("http://10.0.0.2:30000", 3, 0.25),
    ]
    assert (got.cache_aware, got.load_balanced) == (None, None)  # not exported by sglang-router


def test_vllm_routers_decisions_split_prefix_tree_from_load_balancing() -> None:
    got = M.read(Router.VLLM, [_snap(VLLM)])
    assert (got.requests, got.cache_aware, got.load_balanced) == (40, 30, 8)
    assert [round(w.share, 2) for w in got.workers] == [0.75, 0.25]


def test_router_replicas_are_summed() -> None:
    got = M.read(Router.VLLM, [_snap(VLLM, "r0"), _snap(VLLM, "r1")])
    assert (got.requests, got.cache_aware, got.load_balanced) == (80, 60, 16)


def test_the_workers_listed_are_bounded_and_the_rest_counted() -> None:
    lines = ["# TYPE vllm_router_processed_requests_total counter"]
    lines += [
        f'vllm_router_processed_requests_total{{worker="http://10.0.1.{i}:8000"}} {i + 1}' for i in range(40)
    ]
    got = M.read(Router.VLLM, [_snap("\n".join(lines) + "\n")])
    assert len(got.workers) == M.MAX_WORKERS and got.others == 40 - M.MAX_WORKERS
    assert got.workers[0].requests == 40


def test_the_status_validates_and_says_what_the_router_does_not_export() -> None:
    got = M.read(Router.SGLANG, [_snap(SGLANG)])
    status = status_of(
        "cache_aware", "sglang-router", got, "sglang-router exports no cache-aware decision metric"
    )
    model = RoutingStatus.model_validate(status)
    assert model.cache_aware_decisions is None and model.workers[0].share == 0.75
    assert status_of("cache_aware", "vllm-router", None, "no router pod is ready yet") == {
        "policy": "cache_aware",
        "router": "vllm-router",
        "message": "no router pod is ready yet",
    }

"""The routers' metrics in status.routing: per-worker share and decisions, from their expositions."""

from __future__ import annotations

import asyncio

import pytest

from prefixtune.api.models import RoutingStatus
from prefixtune.controller.routing_status import status_of, tokenless_note
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


def test_vllm_routers_tokenless_decisions_are_counted_apart_and_said() -> None:
    got = M.read(Router.VLLM, [_snap(VLLM)])
    assert got.tokenless == 2
    status = RoutingStatus.model_validate(status_of("cache_aware", "vllm-router", got, ""))
    assert status.tokenless_decisions == 2
    note = tokenless_note("vllm-router", got)
    assert note is not None and "2 of 40 requests by load alone" in note and "--enable-scale-out" in note
    assert M.read(Router.SGLANG, [_snap(SGLANG)]).tokenless is None


def test_no_tokenless_decision_says_nothing() -> None:
    clean = "\n".join(line for line in VLLM.splitlines() if "missing_tokens" not in line) + "\n"
    got = M.read(Router.VLLM, [_snap(clean)])
    assert got.tokenless == 0 and tokenless_note("vllm-router", got) is None


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


class _Pods:
    """A client whose list answers ready router pods."""

    def __init__(self, n: int) -> None:
        self.n = n

    async def list(self, path: str, labels: object = None) -> list[dict[str, object]]:
        return [
            {
                "metadata": {"name": f"chat-router-{i}"},
                "status": {"podIP": f"10.0.0.{i + 1}", "conditions": [{"type": "Ready", "status": "True"}]},
            }
            for i in range(self.n)
        ]


def test_a_routers_broken_page_is_reported_without_its_text_and_only_its_replicas_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prefixtune.api.validation import parse_spec
    from prefixtune.controller import routing_status as RS
    from prefixtune.controller.render import Owner
    from prefixtune.metrics import bounded

    fetched: list[str] = []

    async def fetch(url: str, **_: object) -> str:
        fetched.append(url)
        return "# TYPE ok counter\nok_total 1\nSECRET-TOKEN { leaked here\n"

    monkeypatch.setattr(bounded, "fetch", fetch)
    spec = parse_spec(
        {
            "engine": "sglang",
            "model": "m/x",
            "replicas": 2,
            "routing": {"policy": "cache_aware", "replicas": 2},
        }
    )
    status, scraped = asyncio.run(
        RS.routing_status(
            _Pods(5),
            Owner("default", "chat", "u"),
            spec,
            spec.knob_config(),
            [],
            None,
            None,
            0.0,  # type: ignore[arg-type]
        )
    )
    assert scraped and status is not None
    assert "not a valid Prometheus text exposition" in status["message"]
    assert "SECRET-TOKEN" not in str(status)
    assert len(fetched) == 2  # the router's two replicas, not every pod that carries its label

"""``prefixtune bench routing`` on a short window: its JSON, its checks and its PNG (the full run's
figures are in docs/bench-results/routing.json)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from bench import routing
from prefixtune.engines.base import EngineName
from prefixtune.routing.policy import RoutingPolicy
from prefixtune.routing.settings import ENGINE_ROUTER

SHORT = routing.Setup(warmup_s=5.0, measure_s=25.0)


@functools.cache
def _rag() -> dict[str, Any]:
    return routing.run_scenario("rag", SHORT)


def test_every_policy_runs_on_the_same_stream_of_requests() -> None:
    doc = _rag()
    assert list(doc["policies"]) == [str(p) for p in RoutingPolicy]
    arrived = {row["requests"] for row in doc["policies"].values()}
    assert len(arrived) == 1 and arrived.pop() > 0
    assert all(len(row["share"]) == routing.REPLICAS for row in doc["policies"].values())


def test_the_checks_compare_the_tuned_cache_aware_with_the_single_cache_and_random() -> None:
    doc = _rag()
    tuned, scattered = doc["cache_aware_tuned"], doc["policies"]["random"]
    assert doc["cache_threshold_sweep"][f"{tuned['cache_threshold']:g}"]["hit_rate"] == tuned["hit_rate"]
    assert doc["cache_aware_gap_points"] == 100 * (doc["single_cache_hit_rate"] - tuned["split_hit_rate"])
    assert doc["cache_aware_measured_gap_points"] == 100 * (doc["single_cache_hit_rate"] - tuned["hit_rate"])
    assert doc["cache_aware_within_5_points"] == (doc["cache_aware_gap_points"] <= routing.WITHIN_POINTS)
    assert doc["gain_over_random_points"] == 100 * (tuned["hit_rate"] - scattered["hit_rate"])
    assert tuned["hit_rate"] > scattered["hit_rate"]  # the corpus's documents stay on their replica


def test_each_engine_is_routed_by_the_router_the_operator_renders_for_it() -> None:
    doc = _rag()
    assert doc["router"] == str(ENGINE_ROUTER[EngineName(doc["engine"])])
    assert "smallest_tree" in doc["policies"]["cache_aware"]["decisions"]  # sglang-router's low match


def test_the_sweep_covers_the_thresholds_the_operator_searches_by_default() -> None:
    assert routing.cache_thresholds("sglang") == (0.1, 0.3, 0.5)
    assert list(_rag()["cache_threshold_sweep"]) == ["0.1", "0.3", "0.5"]


def _row(goodput: float, ttft: float) -> dict[str, float]:
    return {"goodput_tokens_per_s": goodput, "ttft_p99_s": ttft}


def test_the_tuned_threshold_is_the_objectives_choice_and_the_default_where_it_ties() -> None:
    assert routing._tuned({0.1: _row(90, 1.0), 0.3: _row(100, 1.0), 0.5: _row(120, 2.0)}, 0.3) == 0.5
    # within 1% of the most goodput, the lowest TTFT p99 decides
    assert routing._tuned({0.1: _row(100, 0.5), 0.3: _row(100.5, 1.0), 0.5: _row(99.8, 0.9)}, 0.3) == 0.1
    # the default among the best stays
    assert routing._tuned({0.1: _row(100, 1.0), 0.3: _row(100, 1.0), 0.5: _row(100, 1.0)}, 0.3) == 0.3


def test_the_load_effect_runs_one_replicas_stream_alone_at_each_stretch() -> None:
    effect = _rag()["load_effect"]
    assert list(effect["measured_hit_rate"]) == [f"x{k}" for k in routing.STRETCH]
    assert 0.0 < effect["idle_cache_hit_rate"] <= 1.0


def test_main_writes_the_json_and_the_plot(tmp_path: Path, capsys: Any) -> None:
    args = ["--scenarios", "rag", "--warmup", "5", "--measure", "10", "--out", str(tmp_path)]
    assert routing.main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads((tmp_path / "routing.json").read_text())
    assert printed["checks"] == written["checks"] and written["field_notes"]["hit_rate_after"] == 0.75
    png = (tmp_path / "routing.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width > height >= 300  # three panels side by side


def test_main_refuses_an_unknown_scenario(capsys: Any) -> None:
    assert routing.main(["--scenarios", "chat"]) == 2
    assert "unknown scenario" in capsys.readouterr().err

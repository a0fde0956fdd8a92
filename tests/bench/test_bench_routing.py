"""``prefixtune bench routing`` on a short window: its JSON, its checks and its PNG (the full run's
figures are in docs/bench-results/routing.json)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from bench import routing
from prefixtune.routing.policy import RoutingPolicy

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


def test_the_checks_compare_cache_aware_with_the_single_cache_and_random() -> None:
    doc = _rag()
    aware, scattered = doc["policies"]["cache_aware"], doc["policies"]["random"]
    assert doc["cache_aware_gap_points"] == 100 * (doc["single_cache_hit_rate"] - aware["hit_rate"])
    assert doc["cache_aware_within_5_points"] == (doc["cache_aware_gap_points"] <= routing.WITHIN_POINTS)
    assert doc["gain_over_random_points"] == 100 * (aware["hit_rate"] - scattered["hit_rate"])
    assert aware["hit_rate"] > scattered["hit_rate"]  # the corpus's documents stay on their replica


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

"""``prefixtune bench twin``: the report's shape (the speed figures themselves live in the bench)."""

from __future__ import annotations

import json

import pytest

from prefixtune.cli import main
from prefixtune.twin.cache import native_pool_status


def test_bench_twin_reports_cases_speedups_and_the_pool(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "twin", "--json", "--cases", "chatbot,rag-sglang", "--duration", "15"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["setup"]["vllm_pool"] == native_pool_status()
    assert [c["name"] for c in report["cases"]] == ["chatbot", "rag-sglang"]
    for case in report["cases"]:
        assert case["status"] == "ok" and case["requests"] > 0
        assert case["sim_seconds"] >= 15 and case["wall_seconds"] > 0
        sim, wall = case["sim_seconds"], case["wall_seconds"]  # both rounded to 3 decimals
        assert sim / (wall + 0.0005) - 0.1 <= case["speedup"] <= sim / max(wall - 0.0005, 1e-9) + 0.1
    target = report["target"]
    assert target["measured"] and target["speedup"] == report["cases"][0]["speedup"]
    assert target["met_wall"] == (target["speedup"] >= 500)


def test_bench_twin_refuses_unknown_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "twin", "--cases", "chatbot,nope"]) == 2
    assert "unknown case(s) nope; known: chatbot" in capsys.readouterr().err

"""``prefixtune bench twin``: the report's shape (the speed figures themselves live in the bench)."""

from __future__ import annotations

import json

import pytest

from prefixtune.benchcli import load_bench
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
    # Wall and CPU figures side by side, and whether the machine was too busy to trust the wall one.
    for case in report["cases"]:
        assert case["machine_busy"] == (case["cpu_share"] < 0.9)
    assert report["machine_busy"] == any(c["machine_busy"] for c in report["cases"])
    assert target["machine_busy"] == report["cases"][0]["machine_busy"]
    assert target["verdict_from"] == ("cpu" if target["machine_busy"] else "wall")
    assert target["met"] == target["met_cpu" if target["machine_busy"] else "met_wall"]


def test_a_run_that_got_under_nine_tenths_of_a_core_is_flagged_busy() -> None:
    twin = load_bench("twin")
    assert twin.cpu_share(0.35, 1.0) == pytest.approx(0.35)  # the 349x run of issue 25: a share like this
    assert twin.machine_busy(twin.cpu_share(0.35, 1.0))
    assert not twin.machine_busy(twin.cpu_share(0.98, 1.0))


def test_bench_twin_prints_wall_and_cpu_speed_and_the_busy_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "twin", "--cases", "chatbot", "--duration", "10"]) == 0
    out = capsys.readouterr().out
    assert "machine_busy: " in out
    assert "x wall, " in out and "x cpu (cpu share " in out


def test_bench_twin_refuses_unknown_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "twin", "--cases", "chatbot,nope"]) == 2
    assert "unknown case(s) nope; known: chatbot" in capsys.readouterr().err

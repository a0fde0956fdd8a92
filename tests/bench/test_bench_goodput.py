"""``prefixtune bench goodput``: one scenario's windows, as JSON with its setup."""

from __future__ import annotations

import json

import pytest

from bench import goodput


def test_goodput_bench_reports_each_windows_shares_and_attainment(capsys: pytest.CaptureFixture[str]) -> None:
    assert goodput.main(["--scenario", "vllm-rag-long-itl", "--loads", "0.3", "--seeds", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["setup"]["scenarios"] == ["vllm-rag-long-itl"] and out["setup"]["loads"] == [0.3]
    (row,) = out["windows"]
    tpot = row["tpot"]
    # the 20 ms target inside vLLM's 10-25 ms bucket: the cubic reads the exact share within 0.01,
    # the linear reading 0.06 under it
    assert tpot["observations"] > 100
    assert abs(tpot["cubic"] - tpot["exact"]) < 0.01 < tpot["exact"] - tpot["linear"]
    assert out["summary"]["share_error_cubic"]["max"] < out["summary"]["share_error_linear"]["max"]
    assert row["attainment"]["estimate"] == pytest.approx(tpot["cubic"] * row["ttft"]["cubic"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--scenario", "nope"], "unknown scenario"),
        (["--loads", "x"], "--loads"),
        (["--seeds", "0"], "--seeds"),
    ],
)
def test_goodput_bench_refuses_bad_input(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert goodput.main(args) == 2
    assert needle in capsys.readouterr().err

"""``prefixtune twin whatif``: argument errors, and a small real sweep through the twin (short duration)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prefixtune.engines import get_adapter
from prefixtune.report import whatif
from prefixtune.twin import cli as twin_cli
from prefixtune.twin.workloads import generate

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BASE = ["--engine", "vllm", "--model", MODEL, "--gpu", "H100-80GB", "--workload", "chatbot"]


def test_parse_sweep_checks_values_with_the_adapter() -> None:
    knobs = get_adapter("sglang").knobs()
    assert whatif.parse_sweep("memory_fraction=0.5, 0.8", knobs) == ("memory_fraction", [0.5, 0.8])
    assert whatif.parse_sweep("block_size=1,64", knobs) == ("block_size", [1, 64])
    assert whatif.parse_sweep("prefix_caching=on,false", knobs) == ("prefix_caching", [True, False])
    assert whatif.parse_sweep("schedule_policy=lpm,fcfs", knobs) == ("schedule_policy", ["lpm", "fcfs"])


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        ("block_size=16,48", "--sweep block_size: must be one of 16, 32, 64, 128; got 48"),
        ("memory_fraction=0.5,1.5", "--sweep memory_fraction: must be in (0.0, 1.0], got 1.5"),
        ("memory_fraction=half", "--sweep memory_fraction: 'half' is not a number"),
        ("prefix_caching=maybe", "--sweep prefix_caching: 'maybe' is not a boolean; use true/false"),
        ("schedule_policy=lpm", "--sweep schedule_policy: must be one of fcfs, priority; got 'lpm'"),
        ("blocksize=16", "--sweep: unknown knob 'blocksize'; choose from memory_fraction, block_size"),
        ("block_size", "--sweep must be KNOB=V1,V2,..."),
        ("block_size=16,,32", "--sweep block_size: empty value"),
        ("block_size=16,16", "--sweep block_size: value 16 given twice"),
    ],
)
def test_bad_sweeps_are_usage_errors(tmp_path: Path, capsys: Any, sweep: str, message: str) -> None:
    code = whatif.main([*BASE, "--sweep", sweep, "--out", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("prefixtune twin whatif: ") and message in err
    assert not (tmp_path / whatif.RESULTS_JSON).exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--sweep", "block_size=16", "--sweep", "block_size=32"],
            "--sweep given more than once for block_size",
        ),
        (["--sweep", "block_size=16", "--rate", "0"], "--rate must be > 0; got 0.0"),
        (["--sweep", "block_size=16", "--jobs", "0"], "--jobs must be >= 1; got 0"),
        (["--sweep", "block_size=16", "--slo-ttft", "-1"], "--slo-ttft must be > 0 seconds"),
        (["--sweep", "block_size=16", "--gpu", "B200"], "unknown gpu 'B200'"),
    ],
)
def test_other_argument_errors(tmp_path: Path, capsys: Any, args: list[str], message: str) -> None:
    assert whatif.main([*BASE, *args, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_unknown_workload_and_missing_sweep(tmp_path: Path, capsys: Any) -> None:
    args = ["--engine", "vllm", "--model", MODEL, "--gpu", "H100", "--workload", "nosuch"]
    assert whatif.main([*args, "--sweep", "block_size=16", "--out", str(tmp_path)]) == 2
    assert "nosuch" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        whatif.main([*BASE, "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "--sweep" in capsys.readouterr().err


def test_whatif_is_a_twin_subcommand(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        twin_cli.main(["whatif", "--help"])
    assert exc.value.code == 0
    assert "--sweep KNOB=V1,V2,..." in capsys.readouterr().out


def test_small_sweep_in_parallel(
    tmp_path: Path, capsys: Any, assert_png: Callable[[Path], tuple[int, int]]
) -> None:
    out = tmp_path / "wi"
    args = [*BASE, "--rate", "4", "--duration", "8", "--jobs", "2", "--out", str(out)]
    code = whatif.main([*args, "--sweep", "memory_fraction=0.2,0.9", "--sweep", "block_size=16,128"])
    assert code == 0
    captured = capsys.readouterr()
    assert "whatif [" in captured.err and "4/4" in captured.err  # progress bar on stderr
    table = captured.out.splitlines()
    assert table[0].split()[:4] == ["memory_fraction", "block_size", "status", "hit_rate"]
    doc = json.loads((out / whatif.RESULTS_JSON).read_text())
    assert doc["sweeps"] == {"memory_fraction": [0.2, 0.9], "block_size": [16, 128]}
    results = doc["results"]
    assert [(r["config"]["memory_fraction"], r["config"]["block_size"]) for r in results] == [
        (0.2, 16), (0.2, 128), (0.9, 16), (0.9, 128),
    ]  # fmt: skip
    # 0.2 of an H100 cannot hold the 8B model's weights: infeasible at start-up, and shown as such.
    assert [r["status"] for r in results] == ["oom_startup", "oom_startup", "ok", "ok"]
    assert all(r["config"]["prefix_caching"] is True for r in results)  # unswept knobs: engine default
    ok16, ok128 = results[2], results[3]
    assert ok16["finished"] > 0 and 0 < ok16["hit_rate"] <= 1
    assert ok16["hit_rate"] > ok128["hit_rate"]  # larger blocks share fewer full blocks
    assert [line.split()[2] for line in table[1:5]] == ["oom_startup", "oom_startup", "ok", "ok"]
    assert doc["plots"] == ["whatif_memory_fraction.png", "whatif_block_size.png"]
    for name in doc["plots"]:
        width, height = assert_png(out / name)
        assert width > height  # three panels side by side

    # The same point in this process gives the same numbers (parallel runs change nothing).
    adapter = get_adapter("vllm")
    requests = generate("chatbot", rate=4, duration_s=8, seed=0)
    options = {"seed": 0, "tp": 1, "slo_ttft_s": 2.0, "slo_itl_s": 0.15, "warmup_s": 0.0}
    config = adapter.default_config().with_(memory_fraction=0.9, block_size=128)
    (inline,) = whatif.run_sweep("vllm", MODEL, "H100-80GB", [config], requests, options, jobs=1)
    inline.pop("wall_seconds")
    assert inline == {k: v for k, v in ok128.items() if k != "wall_seconds"}


def test_format_table_hides_metrics_of_infeasible_points() -> None:
    rows = [
        {"config": {"block_size": 16}, "status": "oom_runtime", "hit_rate": 0.5, "ttft_p50_s": 0.1,
         "ttft_p99_s": 0.2, "goodput_tokens_per_s": 10.0, "output_tokens_per_s": 10.0},
        {"config": {"block_size": 32}, "status": "ok", "hit_rate": 0.5, "ttft_p50_s": 0.1,
         "ttft_p99_s": 1.5, "goodput_tokens_per_s": 1234.5, "output_tokens_per_s": 2000.0},
    ]  # fmt: skip
    lines = whatif.format_table(rows, ["block_size"]).splitlines()
    assert lines[1].split() == ["16", "oom_runtime", "-", "-", "-", "-", "-"]
    assert lines[2].split() == ["32", "ok", "50.0%", "100ms", "1.50s", "1234", "2000"]

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
        (
            ["--sweep", "block_size=16", "--gpu", "B200"],
            "no twin model for GPU 'B200' (the twin models H100-80GB, H200, A100-80GB): a what-if",
        ),
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
    assert doc["plots"] == [
        "whatif_memory_fraction.png",
        "whatif_block_size.png",
        "whatif_map_memory_fraction_block_size.png",
    ]
    for name in doc["plots"][:2]:
        width, height = assert_png(out / name)
        assert width > height  # three panels side by side
    assert_png(out / doc["plots"][2])  # the grid's map

    # The same point in this process gives the same numbers (parallel runs change nothing).
    adapter = get_adapter("vllm")
    requests = generate("chatbot", rate=4, duration_s=8, seed=0)
    options = {"seed": 0, "tp": 1, "slo_ttft_s": 2.0, "slo_itl_s": 0.15, "warmup_s": 0.0}
    config = adapter.default_config().with_(memory_fraction=0.9, block_size=128)
    (inline,) = whatif.run_sweep("vllm", MODEL, "H100-80GB", [config], requests, options, jobs=1)
    inline.pop("wall_seconds")
    assert inline == {k: v for k, v in ok128.items() if k != "wall_seconds"}


def _row(block_size: int, status: str = "ok", **metrics: float) -> dict[str, Any]:
    base = {"hit_rate": 0.5, "ttft_p50_s": 0.1, "ttft_p99_s": 1.5, "itl_p99_s": 0.05,
            "goodput_tokens_per_s": 1234.5, "output_tokens_per_s": 2000.0}  # fmt: skip
    return {"config": {"block_size": block_size}, "status": status, **base, **metrics}


def test_format_table_hides_metrics_of_infeasible_points() -> None:
    rows = [_row(16, "oom_runtime", ttft_p99_s=0.2), _row(32)]
    lines = whatif.format_table(rows, ["block_size"]).splitlines()
    assert lines[1].split() == ["16", "oom_runtime", "-", "-", "-", "-", "-", "-", "-"]
    assert lines[2].split() == [
        "32",
        "ok",
        "50.0%",
        "100ms",
        "1.50s",
        "50ms",
        "1234",
        "2000",
        "met",
        "<-",
        "best",
    ]


def test_slo_verdict_names_the_limits_a_row_breaks() -> None:
    slo = whatif.TableSlo(ttft_p99_s=2.0, itl_p99_s=0.15)
    assert whatif.slo_verdict(_row(16), slo) == "met"
    assert whatif.slo_verdict(_row(16, ttft_p99_s=2.5), slo) == "ttft"
    assert whatif.slo_verdict(_row(16, itl_p99_s=0.2), slo) == "itl"
    assert whatif.slo_verdict(_row(16, ttft_p99_s=2.5, itl_p99_s=0.2), slo) == "ttft+itl"
    assert whatif.slo_verdict(_row(16, "oom_startup"), slo) == "-"
    # the limits are the run's, not fixed
    assert whatif.slo_verdict(_row(16, ttft_p99_s=1.5), whatif.TableSlo(ttft_p99_s=1.0)) == "ttft"


def test_best_row_is_the_highest_goodput_of_the_feasible_rows() -> None:
    rows = [
        _row(16, "oom_runtime", goodput_tokens_per_s=9000.0),  # infeasible: never best
        _row(32, goodput_tokens_per_s=1500.0, output_tokens_per_s=1600.0),
        _row(64, goodput_tokens_per_s=1400.0, output_tokens_per_s=3000.0),  # more tokens, fewer in SLO
        _row(128, goodput_tokens_per_s=1500.0),  # a tie: the first keeps it
    ]
    assert whatif.best_index(rows) == 1
    marks = [
        line.endswith(whatif.BEST_MARK) for line in whatif.format_table(rows, ["block_size"]).splitlines()
    ]
    assert marks[1:5] == [False, True, False, False]
    assert whatif.best_index([_row(16, goodput_tokens_per_s=0.0), _row(32, "oom_startup")]) is None


def test_overloaded_rows_are_flagged_by_their_median_ttft() -> None:
    slo = whatif.TableSlo(ttft_p99_s=2.0, itl_p99_s=0.15)
    tail = _row(32, ttft_p50_s=0.3, ttft_p99_s=4.0)  # a burst: the p99 misses, the median does not
    queue = _row(64, ttft_p50_s=50.0, ttft_p99_s=90.0, goodput_tokens_per_s=10.0)
    assert not whatif.overloaded(tail, slo) and whatif.overloaded(queue, slo)
    assert not whatif.overloaded(_row(16, "oom_runtime", ttft_p50_s=50.0), slo)
    lines = whatif.format_table([tail, queue], ["block_size"], slo).splitlines()
    assert whatif.OVERLOADED_MARK not in lines[1] and lines[2].endswith(whatif.OVERLOADED_MARK)
    assert lines[1].split()[-3:] == ["ttft", "<-", "best"]


def test_table_legend_says_the_slo_and_the_rules() -> None:
    text = whatif.format_table([_row(16)], ["block_size"], whatif.TableSlo(ttft_p99_s=0.8, itl_p99_s=0.1))
    legend = text.split("\n\n", 1)[1]
    assert "TTFT p99 <= 800ms and ITL p99 <= 100ms" in legend
    assert f"({whatif.BEST_OBJECTIVE})" in legend and "median TTFT" in legend


def test_whatif_axes_start_at_zero() -> None:
    from prefixtune.report import plots

    # 2% apart: on axes cut to the data's range this fills the panel
    rows = [_row(16, hit_rate=0.50, goodput_tokens_per_s=5000.0, ttft_p99_s=0.100),
            _row(32, hit_rate=0.51, goodput_tokens_per_s=5100.0, ttft_p99_s=0.102)]  # fmt: skip
    fig = plots.whatif_figure(rows, "block_size", [16, 32], [], title="t", slo_ttft_s=2.0)
    hit, ttft, goodput = fig.axes
    assert hit.get_ylim() == (0.0, 1.0)
    assert ttft.get_ylim()[0] == 0.0 and ttft.get_ylim()[1] >= 2000.0  # the SLO line is in view
    assert goodput.get_ylim()[0] == 0.0 and 5100.0 < goodput.get_ylim()[1] < 6000.0
    assert "TTFT SLO" in ttft.get_legend_handles_labels()[1]


# --- the batch limits (issue 23) -------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_the_token_budget_sweeps_by_its_neutral_name_on_every_engine(
    engine: str, tmp_path: Path, capsys: Any, assert_png: Callable[[Path], tuple[int, int]]
) -> None:
    out = tmp_path / engine
    args = ["--engine", engine, "--model", MODEL, "--gpu", "H100-80GB", "--workload", "rag"]
    code = whatif.main(
        [*args, "--rate", "4", "--duration", "8", "--jobs", "2", "--out", str(out),
         "--sweep", "max_batched_tokens=1024,16384"]
    )  # fmt: skip
    assert code == 0
    assert capsys.readouterr().out.splitlines()[0].split()[:2] == ["max_batched_tokens", "status"]
    doc = json.loads((out / whatif.RESULTS_JSON).read_text())
    results = doc["results"]
    assert [r["config"]["max_batched_tokens"] for r in results] == [1024, 16384]
    assert [r["limits"]["max_batched_tokens"] for r in results] == [1024, 16384]  # what the twin ran
    assert all(r["status"] == "ok" for r in results)
    assert doc["plots"] == ["whatif_max_batched_tokens.png"]
    width, height = assert_png(out / "whatif_max_batched_tokens.png")
    assert width > 2 * height  # four panels: TTFT p50, TTFT p99, ITL p99, goodput


def test_the_running_cap_sweeps_and_binds(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "cap"
    code = whatif.main(
        [*BASE, "--rate", "8", "--duration", "8", "--jobs", "1", "--out", str(out),
         "--sweep", "max_running=2,256", "--json"]
    )  # fmt: skip
    assert code == 0
    capped, free = json.loads(capsys.readouterr().out)["results"]
    assert capped["limits"]["max_running"] == 2 and capped["max_running"] == 2
    assert capped["ttft_p50_s"] > free["ttft_p50_s"]


def test_a_fraction_by_budget_sweep_maps_the_start_up_boundary(
    tmp_path: Path, capsys: Any, assert_png: Callable[[Path], tuple[int, int]]
) -> None:
    out = tmp_path / "map"
    args = ["--engine", "sglang", "--model", MODEL, "--gpu", "H100-80GB", "--workload", "qa"]
    code = whatif.main(
        [*args, "--rate", "4", "--duration", "4", "--jobs", "2", "--out", str(out),
         "--sweep", "memory_fraction=0.9,0.97", "--sweep", "max_batched_tokens=8192,32768"]
    )  # fmt: skip
    assert code == 0
    doc = json.loads((out / whatif.RESULTS_JSON).read_text())
    # SGLang keeps activations outside its fraction: a 32k-token chunk does not fit beside 0.97
    assert [r["status"] for r in doc["results"]] == ["ok", "ok", "ok", "oom_startup"]
    assert doc["plots"][-1] == "whatif_map_memory_fraction_max_batched_tokens.png"
    assert_png(out / doc["plots"][-1])


def test_a_batch_limit_must_be_an_integer_in_the_engines_range(tmp_path: Path, capsys: Any) -> None:
    # 0 is a valid value (the engine's own default, flag not rendered); below it is not
    code = whatif.main([*BASE, "--sweep", "max_running=-3,8", "--out", str(tmp_path)])
    assert code == 2
    assert "--sweep max_running: must be in [1, 65536], got -3" in capsys.readouterr().err
    code = whatif.main([*BASE, "--sweep", "max_batched_tokens=1.5", "--out", str(tmp_path)])
    assert code == 2
    assert "--sweep max_batched_tokens: '1.5' is not an integer" in capsys.readouterr().err


def test_a_row_that_served_nothing_shows_no_latencies_and_no_verdict() -> None:
    # TensorRT-LLM without chunked prefill refuses every prompt over max_num_tokens: status ok, nothing
    # finished, latencies of zero that would read as a met SLO
    rows = [_row(16, finished=0, ttft_p99_s=0.0, goodput_tokens_per_s=0.0), _row(32)]
    lines = whatif.format_table(rows, ["block_size"]).splitlines()
    assert lines[1].split() == ["16", "ok", "-", "-", "-", "-", "-", "-", "-"]
    assert whatif.slo_verdict(rows[0], whatif.TableSlo()) == "-"
    assert whatif.best_index(rows) == 1


def test_trtllm_refuses_long_prompts_unless_chunked_prefill_is_swept_on(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "trt"
    args = ["--engine", "trtllm", "--model", MODEL, "--gpu", "H100-80GB", "--workload", "rag"]
    code = whatif.main(
        [*args, "--rate", "2", "--duration", "8", "--jobs", "1", "--out", str(out),
         "--sweep", "max_batched_tokens=4096", "--sweep", "chunked_prefill=false,true"]
    )  # fmt: skip
    assert code == 0
    table = capsys.readouterr().out.splitlines()
    plain, chunked = json.loads((out / whatif.RESULTS_JSON).read_text())["results"]
    # every RAG prompt (a ~6k-token context) is over max_num_tokens: refused at the API
    assert plain["status"] == "ok" and plain["finished"] == 0 and plain["rejected"] > 0
    assert table[1].split() == ["4096", "False", "ok", "-", "-", "-", "-", "-", "-", "-"]
    assert chunked["rejected"] == 0 and chunked["finished"] == plain["rejected"]
    assert chunked["limits"]["chunked_prefill"] is True

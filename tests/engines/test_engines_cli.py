"""``prefixtune args``: JSON output and errors."""

from __future__ import annotations

import json

import pytest
import yaml

from prefixtune.cli import main as prefixtune_main
from prefixtune.engines import get_adapter
from prefixtune.engines.cli import main


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, object], str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else {}), err


def test_vllm_command_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, _ = run(
        capsys,
        [
            "--engine",
            "vllm",
            "--model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--set",
            "blockSize=32",
            "--set",
            "prefix_caching=false",
            "--set",
            "memory-fraction=0.8",
            "--set",
            "maxRunning=64",
            "--tp",
            "2",
            "--extra-arg=--max-model-len=4096",
        ],
    )
    assert code == 0
    assert set(doc) == {"engine", "model", "config", "command", "args", "argv", "files"}
    assert doc["engine"] == "vllm"
    assert doc["command"] == ["vllm", "serve"]
    assert doc["argv"] == [*doc["command"], *doc["args"]]  # type: ignore[misc]
    assert doc["files"] == {}
    assert doc["config"] == {
        "memory_fraction": 0.8,
        "block_size": 32,
        "prefix_caching": False,
        "schedule_policy": "fcfs",
        "max_batched_tokens": 0,  # the engine's own default: not rendered
        "max_running": 64,
    }
    parsed = get_adapter("vllm").parse(doc["argv"])  # type: ignore[arg-type]
    assert parsed.tensor_parallel == 2
    assert parsed.extra_args == ("--max-model-len=4096",)
    assert parsed.config.block_size == 32
    assert parsed.config.max_running == 64
    assert "--max-num-batched-tokens" not in doc["argv"]  # type: ignore[operator]


def test_trtllm_files_and_trailing_args(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, _ = run(
        capsys,
        [
            "--engine",
            "trtllm",
            "--model",
            "m",
            "--set",
            "schedulePolicy=max_utilization",
            "--",
            "--max_seq_len",
            "8192",
        ],
    )
    assert code == 0
    files = doc["files"]
    assert isinstance(files, dict) and len(files) == 1
    (text,) = files.values()
    assert yaml.safe_load(text)["scheduler_config"] == {"capacity_scheduler_policy": "MAX_UTILIZATION"}
    assert doc["args"][-2:] == ["--max_seq_len", "8192"]  # type: ignore[index]


def test_dispatch_through_prefixtune(capsys: pytest.CaptureFixture[str]) -> None:
    assert prefixtune_main(["args", "--engine", "sglang", "--model", "m"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == ["sglang", "serve"]
    assert "--enable-metrics" in doc["args"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--engine", "vllm", "--model", "m", "--set", "blockSize=24"],
            "--set block_size: must be one of 16, 32, 64, 128; got 24",
        ),
        (
            ["--engine", "vllm", "--model", "m", "--set", "blocksize=16"],
            "unknown knob 'blocksize'; known knobs: memory_fraction",
        ),
        (
            ["--engine", "sglang", "--model", "m", "--set", "schedule_policy=priority"],
            "must be one of fcfs, lpm, dfs-weight, hrrn, lof, random",
        ),
        (
            ["--engine", "vllm", "--model", "m", "--set", "memoryFraction=high"],
            "--set memory_fraction: must be a number in (0.0, 1.0]",
        ),
        (
            ["--engine", "vllm", "--model", "m", "--set", "prefixCaching=maybe"],
            "--set prefix_caching: must be one of True, False",
        ),
        (["--engine", "vllm", "--model", "m", "--set", "block_size"], "--set expects KNOB=VALUE"),
        (["--engine", "vllm", "--model", "m", "--extra-arg=--block-size=32"], "may not set --block-size=32"),
        (["--engine", "trtllm", "--model", "m", "--", "--nope"], "unrecognized arguments: --nope"),
        (["--engine", "tgi", "--model", "m"], "invalid choice: 'tgi'"),
    ],
)
def test_errors_exit_2_with_a_clear_message(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run(capsys, argv)
    assert code == 2
    assert message in err

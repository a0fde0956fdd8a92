"""The tuner benchmark's scenario suite parses and covers what it must (no twin runs here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def bench() -> ModuleType:
    name = "prefixtune_bench_tuner_under_test"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "tuner.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_suite_covers_engines_workloads_and_bounds() -> None:
    suite = bench().suite()
    assert len(suite) >= 8
    assert {s.engine for s in suite.values()} == {"vllm", "sglang", "trtllm"}
    assert {s.workload for s in suite.values()} >= {"rag", "chatbot", "agent", "qa"}
    assert {s.bound for s in suite.values()} == {"prefill", "decode"}
    for s in suite.values():
        assert not s.search_space().empty


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"blocksize": 16}, "unknown field(s) blocksize"),
        ({"engine": "tgi"}, "known engines"),
        ({"space": {"block_size": [17]}}, "space.block_size: 17"),
        ({"objective": "latency"}, "allowed: goodput, throughput, ttft"),
    ],
)
def test_bad_scenario_names_the_field(patch: dict[str, object], needle: str) -> None:
    data: dict[str, object] = {"name": "x", "engine": "vllm", "model": "llama-3.1-8b"}
    data.update({"gpu": "H100-80GB", "workload": "qa", "rate": 1.0})
    data.update(patch)
    with pytest.raises(bench().ScenarioError) as err:
        bench().parse_scenario(data, "x.yaml")
    assert needle in str(err.value) and "x.yaml" in str(err.value)


def test_cli_rejects_unknown_scenario_and_method(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench().main(["--scenario", "nope"]) == 2
    assert "unknown nope" in capsys.readouterr().err
    assert bench().main(["--suite", "--methods", "bo,annealing"]) == 2
    assert "annealing" in capsys.readouterr().err

"""``twin run --replicas N --routing POLICY`` and ``twin whatif --sweep routing=...``: what routing
would give a user's workload, from the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prefixtune.report import whatif
from prefixtune.twin.cli import main

M8 = "meta-llama/Llama-3.1-8B-Instruct"
BASE = ["--engine", "vllm", "--model", M8, "--gpu", "H100-80GB", "--workload", "chatbot"]
LOAD = ["--rate", "16", "--duration", "30"]


def test_run_with_replicas_prints_the_total_and_each_replica(capsys: Any) -> None:
    assert main(["run", *BASE, *LOAD, "--replicas", "3", "--routing", "cache_aware"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("3 replicas, routing cache_aware (decisions: cache_affinity ")
    header = next(line for line in out.splitlines() if line.lstrip().startswith("replica"))
    assert header.split() == [
        "replica",
        "share",
        "hit_rate",
        "ttft_p50_s",
        "ttft_p99_s",
        "goodput_tokens_per_s",
        "requests",
    ]
    rows = out.splitlines()[out.splitlines().index(header) + 1 :]
    assert [row.split()[0] for row in rows] == ["0", "1", "2"]


def test_run_with_replicas_as_json_has_the_router_and_the_shares(capsys: Any) -> None:
    args = ["run", *BASE, *LOAD, "--replicas", "2", "--routing", "consistent_hash", "--json"]
    assert main([*args, "--cache-threshold", "0.5", "--max-tree-size", "4000"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["routing"]["policy"] == "consistent_hash" and doc["routing"]["replicas"] == 2
    assert doc["routing"]["cache_threshold"] == 0.5 and doc["routing"]["max_tree_size"] == 4000
    assert sum(r["share"] for r in doc["replicas"]) == pytest.approx(1.0)
    assert doc["total"]["setup"]["routing"]["policy"] == "consistent_hash"
    assert 0 < doc["total"]["hit_rate"] <= 1


def test_run_without_replicas_prints_the_plain_summary(capsys: Any) -> None:
    assert main(["run", *BASE, *LOAD, "--json"]) == 0
    assert "routing" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "0"], "--replicas must be >= 1"),
        (["--replicas", "2", "--routing", "cache_aware", "--cache-threshold", "2"], "cache threshold must"),
        (["--replicas", "2", "--balance-rel-threshold", "0.5"], "balance rel threshold must be >= 1"),
    ],
)
def test_run_refuses_bad_routing_arguments(capsys: Any, args: list[str], message: str) -> None:
    assert main(["run", *BASE, *LOAD, *args]) == 2
    assert message in capsys.readouterr().err


def test_whatif_sweeps_the_routing_policy_over_replicas(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "wi"
    args = [*BASE, *LOAD, "--replicas", "4", "--jobs", "1", "--out", str(out)]
    assert whatif.main([*args, "--sweep", "routing=random,cache_aware"]) == 0
    doc = json.loads((out / whatif.RESULTS_JSON).read_text())
    random, aware = doc["results"]
    assert (random["config"]["routing"], aware["config"]["routing"]) == ("random", "cache_aware")
    assert aware["hit_rate"] > random["hit_rate"]
    assert [len(r["replicas"]) for r in doc["results"]] == [4, 4]
    assert set(aware["replicas"][0]) == set(whatif.REPLICA_KEYS)
    assert doc["setup"]["router"]["policy"] == "kube-proxy" and doc["plots"] == ["whatif_routing.png"]
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["routing", "status"]
    shares = out[out.index("per replica (request share, hit rate):") + 1 :]
    assert [line.split(":")[0].strip() for line in shares[:2]] == ["routing=random", "routing=cache_aware"]
    assert len(shares[1].split(":")[1].split()) == 8  # four replicas, a share and a hit rate each


def test_whatif_refuses_a_routing_sweep_without_replicas(tmp_path: Path, capsys: Any) -> None:
    assert whatif.main([*BASE, *LOAD, "--out", str(tmp_path), "--sweep", "routing=random"]) == 2
    assert "needs --replicas >= 2" in capsys.readouterr().err


def test_whatif_refuses_an_unknown_routing_policy(tmp_path: Path, capsys: Any) -> None:
    args = [*BASE, *LOAD, "--replicas", "2", "--out", str(tmp_path)]
    assert whatif.main([*args, "--sweep", "routing=nearest"]) == 2
    assert "--sweep routing" in capsys.readouterr().err

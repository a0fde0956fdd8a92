"""``prefixtune status``: the facts and their formatting (pure), and the CLI's errors without a cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prefixtune.report.status_view import config_text, format_detail, format_table, main, summarize


def test_summarize_recorded(recorded: dict[str, Any]) -> None:
    facts = summarize(recorded)
    trials = recorded["status"]["trials"]
    last = trials[6]["signals"]  # trial 7 is infeasible: the latest measured window is trial 6's
    assert facts["phase"] == "Converged"
    # 8 records (the baseline and 7 trials): the budget counts the trials, as status.budget says
    status, spec = recorded["status"], recorded["spec"]
    assert (facts["trials"], facts["budget"]) == (7, 11)
    assert (status["budget"]["used"], spec["tuning"]["budget"]["maxTrials"]) == (7, 11)
    assert facts["outcomes"] == {"ok": 6, "infeasible": 2}
    assert facts["latestTrial"] == 6
    assert facts["hitRate"] == pytest.approx(last["hit_rate"])
    assert (facts["ttftP50S"], facts["ttftP99S"]) == (last["ttft_p50_s"], last["ttft_p99_s"])
    assert facts["bestConfig"] == recorded["status"]["bestConfig"]["config"]
    assert facts["bestScore"] == recorded["status"]["bestConfig"]["score"]
    assert facts["bound"] == "decode" and facts["notes"] == recorded["status"]["diagnosis"]["notes"]
    json.dumps(facts)  # plain values only


def test_format_detail_recorded(recorded: dict[str, Any]) -> None:
    recorded["status"]["bestConfig"]["confidence"] = 0.9
    text = format_detail(summarize(recorded))
    best = recorded["status"]["bestConfig"]
    lines = text.splitlines()
    assert lines[0] == "demo/chat  vllm  meta-llama/Llama-3.1-8B-Instruct"
    assert "  phase        Converged  (mode auto, objective goodput)" in lines
    assert "  trials       7 of 11 spent; records: 2 infeasible, 6 ok" in lines
    assert f"  best         {config_text(best['config'])}" in lines
    assert f"  score        {best['score']:.4g}  confidence 90.0%" in lines
    hit = recorded["status"]["trials"][6]["signals"]["hit_rate"]
    assert any(line.startswith(f"  latest       trial 6: hit rate {100 * hit:.1f}%") for line in lines)
    assert "  diagnosis    decode-bound" in lines
    assert any(line.startswith("    - decode takes") for line in lines)


def test_config_text() -> None:
    cfg = {"memoryFraction": 0.9, "blockSize": 16, "prefixCaching": False, "schedulePolicy": "lpm"}
    assert config_text(cfg) == "mem 0.90 · block 16 · cache off · lpm"
    assert config_text(None) == "-"


def test_new_resource_and_conditions_that_need_attention() -> None:
    fresh = {"metadata": {"name": "x"}, "spec": {"engine": "sglang", "model": "m"}}
    facts = summarize(fresh)
    assert (facts["phase"], facts["trials"], facts["budget"], facts["namespace"]) == (
        "Pending",
        None,  # the operator has not counted yet
        20,
        "default",
    )
    text = format_detail(facts)
    assert "- of 20 spent; records: none yet" in text and "no trial measured yet hit rate -" in text
    degraded = {
        **fresh,
        "status": {
            "phase": "Exploring",
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "AllReplicasReady"},
                {"type": "Degraded", "status": "True", "reason": "TrialInfeasible", "message": "oom"},
            ],
        },
    }
    text = format_detail(summarize(degraded))
    assert "  Degraded     True TrialInfeasible: oom" in text
    assert "AllReplicasReady" not in text  # healthy conditions stay quiet


def test_format_table(recorded: dict[str, Any]) -> None:
    other = {"metadata": {"name": "b", "namespace": "demo"}, "spec": {"engine": "trtllm"}}
    lines = format_table([summarize(recorded), summarize(other)]).splitlines()
    assert lines[0].split() == [
        "NAMESPACE",
        "NAME",
        "ENGINE",
        "PHASE",
        "TRIALS",
        "BEST",
        "SCORE",
        "BASIS",
        "HIT",
        "TTFT-P99",
    ]
    assert lines[1].split()[:5] == ["demo", "chat", "vllm", "Converged", "7/11"]
    assert lines[2].split() == ["demo", "b", "trtllm", "Pending", "-/20", "-", "-", "-", "-", "-"]
    assert lines[0].index("PHASE") == lines[1].index("Converged") == lines[2].index("Pending")
    assert format_table([]) == "No ServingDeployments found."


def test_cli_without_a_cluster(tmp_path: Path, capsys: Any) -> None:
    assert main(["-n", "demo", "chat", "--kubeconfig", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("prefixtune status: no cluster:") and "--kubeconfig" in err


def test_cli_unreachable_api_server(tmp_path: Path, capsys: Any) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    assert main(["--kubeconfig", str(kubeconfig)]) == 1
    assert "cannot reach the API server" in capsys.readouterr().err


def test_cli_all_namespaces_takes_no_name(capsys: Any) -> None:
    assert main(["-A", "chat"]) == 2
    assert "-A/--all-namespaces takes no NAME" in capsys.readouterr().err


def test_the_trials_counter_reads_the_budget_the_operator_spent_not_the_records() -> None:
    """A baseline, five trials and one re-run (invalidated by a pod restart) of a budget of 5: six
    records or more, five spent (issue 18: it read "trials 6 of 5")."""
    from prefixtune.controller.status import build_status
    from prefixtune.engines.base import KnobConfig
    from prefixtune.tuning.phases import Phase
    from prefixtune.tuning.policy import initial_state
    from prefixtune.tuning.settings import TuningSettings
    from prefixtune.tuning.state import Trial

    base = KnobConfig(0.9, 16, True, "fcfs")
    state = initial_state("vllm", TuningSettings(max_trials=5), base)
    outcomes = ["ok", "ok", "infeasible", "invalidated", "ok", "ok", "ok"]
    trials = [
        Trial(id=i, epoch=0, role="baseline" if i == 0 else "trial",
              config=base.with_(memory_fraction=0.5 + i / 20), outcome=o, started_at=float(i),
              finished_at=i + 0.5, value=1.0 if o == "ok" else None)
        for i, o in enumerate(outcomes)
    ]  # fmt: skip
    update = {"phase": Phase.CONVERGED, "trials": trials, "best": 1, "next_trial_id": 7}
    state = state.model_copy(update=update)
    status = build_status(state, [], None, now=10.0, generation=1, ready=(True, "ReplicasReady", "1/1"))
    assert status["budget"] == {"used": 5, "maxTrials": 5}
    resource = {"metadata": {"name": "x"}, "spec": {"engine": "vllm", "model": "m"}, "status": status}
    facts = summarize(resource)
    assert (facts["trials"], facts["budget"]) == (5, 5) and len(status["trials"]) == 7
    assert "  trials       5 of 5 spent; records: 1 infeasible, 1 invalidated, 5 ok" in format_detail(facts)
    assert format_table([facts]).splitlines()[1].split()[4] == "5/5"


def test_the_detail_shows_the_id_an_approval_names() -> None:
    rec = {"id": "0123456789ab", "config": {"blockSize": 32}, "reason": "twin what-if"}
    observing = {
        "metadata": {"name": "x"},
        "spec": {"engine": "vllm", "model": "m", "tuning": {"mode": "observe"}},
        "status": {"phase": "Observing", "recommendation": rec},
    }
    text = format_detail(summarize(observing))
    assert "recommends   block 32 (id 0123456789ab: prefixtune approve NAME): twin what-if" in text

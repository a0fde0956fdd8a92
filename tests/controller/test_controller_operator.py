"""`prefixtune run` options, kopf settings, the API call list, self-metrics and the demo's pure parts."""

from __future__ import annotations

import urllib.request
from typing import Any

import kopf
import pytest

from prefixtune import cli
from prefixtune.controller import api_calls
from prefixtune.controller.operator import (
    OperatorOptions,
    operator_argv,
    operator_settings,
    options_from_args,
)
from prefixtune.controller.selfmetrics import SelfMetrics
from prefixtune.demo import (
    PROGRESS_CAP,
    next_deadline,
    progress_rows,
    progress_token,
    router_lines,
    summary,
    table,
)
from prefixtune.engines.base import KnobConfig
from prefixtune.tuning.actions import RecordTrial, RollBack, RollOut
from prefixtune.tuning.state import Trial


def test_run_options() -> None:
    opts = options_from_args(["--namespace", "a", "-n", "b", "--metrics-port", "9100", "--peering", "pt"])
    assert opts.namespaces == ["a", "b"] and not opts.clusterwide
    assert opts.metrics_port == 9100 and opts.peering == "pt" and not opts.standalone
    assert options_from_args([]).clusterwide
    assert options_from_args(["--all-namespaces", "--standalone"]).standalone
    with pytest.raises(SystemExit):
        options_from_args(["--all-namespaces", "--namespace", "x"])
    with pytest.raises(SystemExit):
        options_from_args(["--peering", "x", "--standalone"])
    with pytest.raises(SystemExit, match="--tick"):
        options_from_args(["--tick", "0"])
    assert cli.SUBCOMMANDS["run"][0] == "prefixtune.controller.operator"
    assert cli.SUBCOMMANDS["demo"][0] == "prefixtune.demo"
    argv = operator_argv("/k", tick_s=1, time_scale=10, ready_timeout_s=60)
    assert argv[-7:] == ["--all-namespaces", "--tick", "1", "--time-scale", "10", "--ready-timeout", "60"]
    # Without one the operator reads the time scale from the sandbox's clock file (else 1).
    assert "--time-scale" not in operator_argv("/k", clock_file="/c")
    assert options_from_args([]).time_scale == 1.0


def test_run_help_shows_the_sandbox_options(capsys: pytest.CaptureFixture[str]) -> None:
    """--clock-file and --time-scale are documented (the README's sandbox steps use --clock-file)."""
    with pytest.raises(SystemExit):
        options_from_args(["--help"])
    out = capsys.readouterr().out
    assert "--clock-file" in out and "--time-scale" in out and "local sandbox only" in out


def test_kopf_settings_keep_progress_out_of_status_and_peer_when_asked() -> None:
    settings = operator_settings(OperatorOptions(peering="prefixtune", clusterwide=True))
    assert settings.posting.enabled
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert settings.peering.name == "prefixtune" and settings.peering.mandatory
    assert settings.peering.clusterwide
    assert operator_settings(OperatorOptions(standalone=True)).peering.standalone


def test_every_call_site_is_listed() -> None:
    api_calls.require("apps", "deployments", "patch")
    api_calls.require("prefixtune.io", "servingdeployments/status", "patch")
    api_calls.require("", "events", "create")
    with pytest.raises(AssertionError, match="not listed"):
        api_calls.require("", "secrets", "get")
    assert all(c.verbs and c.why for c in api_calls.API_CALLS)


def test_self_metrics_count_decisions_and_serve() -> None:
    m = SelfMetrics(per_resource=True)
    cfg = KnobConfig(0.9, 16, True, "fcfs")
    trial = Trial(id=1, epoch=0, role="trial", config=cfg, outcome="infeasible", started_at=1.0)
    m.record("ns", "a", [RollOut(cfg, "rolling", "x", 1), RollBack(cfg, "y"), RecordTrial(trial)])
    m.set_state("ns", "a", "Exploring", 12.5)
    assert (
        m.registry.get_sample_value(
            "prefixtune_trials_total", {"namespace": "ns", "name": "a", "outcome": "infeasible"}
        )
        == 1
    )
    assert m.registry.get_sample_value("prefixtune_rollouts_total", {"namespace": "ns", "name": "a"}) == 1
    assert m.registry.get_sample_value("prefixtune_rollbacks_total", {"namespace": "ns", "name": "a"}) == 1
    assert (
        m.registry.get_sample_value(
            "prefixtune_phase", {"namespace": "ns", "name": "a", "phase": "Exploring"}
        )
        == 1
    )
    assert m.registry.get_sample_value("prefixtune_best_score", {"namespace": "ns", "name": "a"}) == 12.5
    m.forget("ns", "a")
    assert (
        m.registry.get_sample_value(
            "prefixtune_phase", {"namespace": "ns", "name": "a", "phase": "Exploring"}
        )
        is None
    )
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    m.serve(port, addr="127.0.0.1")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "prefixtune_decision_seconds_bucket" in text


def test_demo_deadline_follows_progress_up_to_a_cap() -> None:
    # No progress: the deadline stays; progress moves it to 240 s after now, never past 4x in all.
    assert next_deadline(240.0, 200.0, 0.0, 240.0, moved=False) == 240.0
    assert next_deadline(240.0, 200.0, 0.0, 240.0, moved=True) == 440.0
    assert next_deadline(440.0, 100.0, 0.0, 240.0, moved=True) == 440.0  # never earlier
    assert next_deadline(900.0, 900.0, 0.0, 240.0, moved=True) == PROGRESS_CAP * 240.0
    # The token moves when one resource's tuning does (a trial started), not when nothing changed.
    from prefixtune.controller.status import POLICY_KEY
    from prefixtune.tuning.settings import TuningSettings
    from prefixtune.tuning.state import PolicyState

    a = KnobConfig(0.9, 16, False, "fcfs")
    base = PolicyState(engine="vllm", settings=TuningSettings(), spec_config=a, current=a, trials=[])
    trial = Trial(id=0, epoch=0, role="baseline", config=a, outcome="running", started_at=0.0)
    running = base.model_copy(update={"trials": [trial], "active": 0})

    def obj(uid: str, state: PolicyState) -> dict[str, object]:
        return {"metadata": {"uid": uid}, "status": {"policy": {POLICY_KEY: state.to_json()}}}

    before = progress_token([obj("u1", base), obj("u2", base)])
    assert progress_token([obj("u1", base), obj("u2", base)]) == before
    assert progress_token([obj("u1", base), obj("u2", running)]) != before


def test_demo_table_and_summary() -> None:
    res: dict[str, Any] = {
        "metadata": {"name": "x", "namespace": "d"},
        "spec": {"engine": "vllm", "tuning": {"budget": {"maxTrials": 5}}},
    }
    cfg = {"memoryFraction": 0.9, "blockSize": 16, "prefixCaching": True, "schedulePolicy": "fcfs"}
    # The records as the operator writes them (trial_record: each says its role) and the policy
    # state beside them.
    from prefixtune.controller.status import POLICY_KEY, trial_record
    from prefixtune.tuning.settings import TuningSettings
    from prefixtune.tuning.state import PolicyState

    k = KnobConfig(0.9, 16, True, "fcfs")
    base = Trial(id=0, epoch=0, role="baseline", config=k, outcome="ok", started_at=0.0, value=40.0)
    tried = Trial(id=1, epoch=0, role="trial", config=k, outcome="infeasible", started_at=1.0, reason="x")
    trials = [base, tried]
    state = PolicyState(engine="vllm", settings=TuningSettings(), spec_config=k, current=k, trials=trials)
    res["status"] = {
        "phase": "Converged",
        "currentConfig": cfg,
        "bestConfig": {"config": cfg, "score": 60.0},
        "diagnosis": {"hitRate": 0.9},
        "budget": {"used": 1, "maxTrials": 5},
        "trials": [trial_record(base), trial_record(tried)],
        "policy": {POLICY_KEY: state.to_json()},
    }
    assert res["status"]["trials"][0]["role"] == "baseline"
    rows = progress_rows([res])
    assert rows[1][:6] == ["d/x", "vllm", "Converged", "1/5", "60", "90%"]
    assert rows[1][6] == "mem 0.90 · block 16 · cache on · fcfs"  # the knob registry's display
    assert "RESOURCE" in table(rows)
    text = summary([res])
    assert "+50% vs baseline" in text and "infeasible" in text
    assert "baseline: mem 0.90 · block 16 · cache on · fcfs  score 40" in text
    # The operator's count, not the records': a baseline, a re-run and 2 trials are 2 of a budget of 2
    res["status"]["budget"] = {"used": 2, "maxTrials": 2}
    res["status"]["trials"] = [{"index": i, "config": cfg, "outcome": "ok"} for i in range(4)]
    assert progress_rows([res])[1][3] == "2/2"
    del res["status"]["budget"]  # a status written before the operator counted: not guessed
    assert progress_rows([res])[1][3] == "-/5"


def test_kopf_settings_bound_the_workers_for_many_objects() -> None:
    from prefixtune.controller.operator import POSTING_WORKERS

    settings = operator_settings(OperatorOptions())
    assert settings.queueing.worker_limit is None  # a limit below N starves resources (bench scale)
    assert settings.posting.worker_limit == POSTING_WORKERS == 4
    assert settings.execution.max_workers == 4


def test_decisions_run_on_their_own_bounded_pool() -> None:
    from prefixtune.controller import reconcile

    assert reconcile.DECISION_POOL._max_workers == reconcile.DECISION_WORKERS == 2


async def test_only_a_step_that_asks_the_optimizer_leaves_the_event_loop(monkeypatch: Any) -> None:
    import threading

    from prefixtune.controller import reconcile

    ran: list[tuple[str, str]] = []

    def fake_step(state: Any, obs: Any, now: float, suggester: Any = None) -> tuple[Any, list[Any]]:
        ran.append((obs, threading.current_thread().name))
        if obs == "decide" and suggester is not None:  # the policy asks its injected suggester
            suggester(None, [], 0, None)
        return f"{state}+{obs}", []

    monkeypatch.setattr(reconcile, "step", fake_step)
    assert await reconcile._advance("s", "tick", 0.0, []) == "s+tick"
    assert await reconcile._advance("s", "decide", 0.0, []) == "s+decide"
    loop = threading.current_thread().name
    assert ran[0] == ("tick", loop)  # no fit: on the loop, no thread hop
    assert ran[1] == ("decide", loop)  # refused by the loop's suggester...
    assert ran[2][0] == "decide" and ran[2][1].startswith("prefixtune-decision")  # ...run in the pool
    assert len(ran) == 3


def test_watch_lag_is_the_time_from_a_write_to_the_watch_delivering_it_or_later() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    from prefixtune.controller.selfmetrics import WatchLag

    now = [100.0]
    hist = Histogram("lag", "lag", buckets=(0.1, 0.5, 1.0), registry=CollectorRegistry())
    lag = WatchLag(hist, clock=lambda: now[0])

    def body(version: str) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": version}}

    def observed() -> list[float]:
        return [s.value for m in hist.collect() for s in m.samples if s.name == "lag_bucket"]

    lag.wrote("ns/a", body("7"))
    lag.wrote("ns/a", body("9"))
    now[0] = 100.3
    lag.seen("ns/a", body("6"))  # an older version: not yet
    lag.seen("ns/b", body("8"))  # another resource
    assert observed() == [0.0, 0.0, 0.0, 0.0]
    lag.seen("ns/a", body("8"))  # a later version holds the write of 7 (batched by kopf)
    assert observed() == [0.0, 1.0, 1.0, 1.0]
    now[0] = 101.2
    lag.seen("ns/a", body("9"))
    assert observed() == [0.0, 1.0, 1.0, 2.0]
    lag.wrote("ns/a", body("x1"))  # not an integer: only the same version counts
    lag.seen("ns/a", body("x2"))
    lag.forget("ns/a")
    lag.seen("ns/a", body("x1"))
    assert observed() == [0.0, 1.0, 1.0, 2.0]


def test_aggregate_phase_counts_follow_moves_without_a_recount() -> None:
    m = SelfMetrics()
    for name in ("a", "b", "c"):
        m.set_state("ns", name, "Exploring", None)
    m.set_state("ns", "a", "Converged", None)
    m.set_state("ns", "a", "Converged", None)  # no move: nothing changes
    m.forget("ns", "b")
    m.forget("ns", "gone")  # never seen: nothing to take away

    def count(phase: str) -> float | None:
        return m.registry.get_sample_value("prefixtune_phase", {"phase": phase})

    assert (count("Exploring"), count("Converged"), count("Pending")) == (1.0, 1.0, 0.0)
    m._phases.clear()  # the counts are kept as resources move, not recounted from every resource
    m.set_state("ns", "d", "Exploring", None)
    assert count("Exploring") == 2.0


def test_self_metrics_serve_the_policy_time_beside_the_reconcile_time() -> None:
    m = SelfMetrics()
    m.policy_seconds.observe(0.004)
    assert m.registry.get_sample_value("prefixtune_policy_seconds_bucket", {"le": "0.005"}) == 1.0
    assert m.registry.get_sample_value("prefixtune_decision_seconds_count") == 0.0


def test_stop_operator_terminates_and_kills_a_child_that_ignores_sigterm() -> None:
    import signal
    import subprocess
    import sys

    from prefixtune.controller.operator import stop_operator

    def child(ignore_term: bool) -> subprocess.Popen[bytes]:
        code = (
            "import signal, sys, time\n"
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + "print('ready', flush=True)\ntime.sleep(600)\n"
        )
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"  # its handler is set
        return proc

    polite = child(ignore_term=False)
    assert stop_operator(polite, grace_s=30.0) == -signal.SIGTERM
    stubborn = child(ignore_term=True)
    assert stop_operator(stubborn, grace_s=0.5) == -signal.SIGKILL
    assert stop_operator(stubborn) == -signal.SIGKILL  # already gone: its status again, no signal
    for proc in (polite, stubborn):
        assert proc.stdout is not None
        proc.stdout.close()


def test_demo_names_each_router_pod_its_policy_readiness_and_registered_engines() -> None:
    def pod(name: str, labels: dict[str, str], command: list[str], ready: bool) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"containers": [{"name": "c", "command": command}]},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }

    router = {"app.kubernetes.io/component": "router"}
    pods = [
        pod("chat-router-1", router, ["vllm-router", "--policy", "consistent_hash"], True),
        pod("gw-2", router, ["python3", "-m", "sglang_router.launch_router"], False),
        pod("chat-engine-1", {"app": "chat"}, ["python3", "-m", "sglang.launch_server"], True),
    ]
    lines = router_lines(pods, {"chat-router-1": 4})
    assert lines == [
        "  default/chat-router-1: vllm-router --policy consistent_hash, ready, 4 engine pods registered",
        "  default/gw-2: sglang-router --policy cache_aware, not ready, ? engine pods registered",
    ]

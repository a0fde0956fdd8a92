"""The HTML report, rendered from recorded data: plots exist and are PNGs, every trial and decision
is listed, nothing is fetched from the network."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prefixtune import cli
from prefixtune.report import report
from prefixtune.report.status_view import config_text

PngCheck = Callable[[Path], tuple[int, int]]


def test_report_has_every_plot_trial_and_event(
    tmp_path: Path, recorded: dict[str, Any], recorded_events: list[dict[str, Any]], assert_png: PngCheck
) -> None:
    index = report.write_report(recorded, recorded_events, tmp_path / "out")
    text = index.read_text(encoding="utf-8")
    pngs = sorted(p.name for p in index.parent.glob("*.png"))
    assert pngs == sorted(
        [report.SCORE_PNG, report.CONFIGS_PNG, report.HIT_RATE_PNG, report.TTFT_PNG, report.THROUGHPUT_PNG]
    )
    for name in pngs:
        assert_png(index.parent / name)
        assert f'src="{name}"' in text
    assert set(re.findall(r'src="([^"]+)"', text)) == set(pngs)  # nothing else is loaded
    rows = re.findall(r"<tr class=\"(\w+)\"><td>(\d+)</td><td>([^<]*)</td><td>(\w+)</td>", text)
    trials = recorded["status"]["trials"]
    assert len(trials) == 8 and sum(t["outcome"] == "infeasible" for t in trials) == 2
    expected = [(t["index"], config_text(t["config"]), t["outcome"]) for t in trials]
    assert [(int(i), cfg, out) for _, i, cfg, out in rows] == expected
    for event in recorded_events:
        assert event["reason"] in text
    assert text.count("TrialInfeasible") == 2
    assert "http://" not in text and "https://" not in text
    assert "<script" not in text.lower() and "<link" not in text.lower()


def test_report_escapes_event_text(tmp_path: Path, recorded: dict[str, Any]) -> None:
    event = {"type": "Warning", "reason": "TrialAborted", "message": "p99 <b>3s</b> & rising", "count": 1}
    text = report.write_report(recorded, [event], tmp_path).read_text()
    assert "p99 &lt;b&gt;3s&lt;/b&gt; &amp; rising" in text
    assert "<b>3s</b>" not in text


def test_report_of_a_new_resource_without_trials(tmp_path: Path, assert_png: PngCheck) -> None:
    resource = {
        "metadata": {"name": "fresh", "namespace": "ns"},
        "spec": {"engine": "sglang", "model": "m", "tuning": {"objective": "ttft"}},
        "status": {"phase": "Pending"},
    }
    index = report.write_report(resource, [], tmp_path)
    text = index.read_text()
    assert "No Events recorded." in text and "0 trials" in text
    assert len(list(index.parent.glob("*.png"))) == 5
    for png in index.parent.glob("*.png"):
        assert_png(png)


def test_cli_from_file_writes_the_report(
    tmp_path: Path, recorded: dict[str, Any], recorded_events: list[dict[str, Any]], capsys: Any
) -> None:
    res = tmp_path / "sdep.json"
    res.write_text(json.dumps({"kind": "ServingDeploymentList", "items": [recorded]}))
    ev = tmp_path / "events.json"
    ev.write_text(json.dumps({"kind": "EventList", "items": recorded_events}))
    out = tmp_path / "out"
    code = cli.main(
        ["report", "demo/chat", "--out", str(out), "--from-file", str(res), "--events-file", str(ev)]
    )
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"report": str(out / "index.html"), "trials": 8, "events": len(recorded_events)}
    assert (out / "index.html").is_file()


def test_cli_from_file_accepts_a_bare_status(tmp_path: Path, recorded: dict[str, Any]) -> None:
    res = tmp_path / "status.json"
    res.write_text(json.dumps(recorded["status"]))
    assert report.main(["ns/x", "--out", str(tmp_path / "o"), "--from-file", str(res)]) == 0
    assert "prefixtune report: ns/x" in (tmp_path / "o" / "index.html").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from-file", "/nonexistent/sdep.json"], "cannot read /nonexistent/sdep.json"),
        (["--events-file", "e.json"], "--events-file goes with --from-file"),
        ([], "give NS/NAME (or --from-file FILE)"),
    ],
)
def test_cli_input_errors(tmp_path: Path, capsys: Any, args: list[str], message: str) -> None:
    assert report.main(["--out", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err


def test_cli_without_a_cluster_says_so(tmp_path: Path, capsys: Any) -> None:
    code = report.main(["demo/chat", "--out", str(tmp_path), "--kubeconfig", str(tmp_path / "missing")])
    assert code == 1
    assert "no cluster" in capsys.readouterr().err


def test_report_is_a_subcommand() -> None:
    assert cli.SUBCOMMANDS["report"][:2] == ("prefixtune.report.report", "main")
    assert cli.SUBCOMMANDS["status"][:2] == ("prefixtune.report.status_view", "main")

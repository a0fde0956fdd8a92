"""Scores a reader can reconcile: every view (status, report table, score plot, demo summary) shows
each trial's score with its basis and the terms it was made from, the same number under the same
label, and the printed terms recompute it."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest

from prefixtune.controller.status import build_status
from prefixtune.demo import summary
from prefixtune.engines.base import KnobConfig
from prefixtune.metrics.signals import Signals
from prefixtune.report import plots, report
from prefixtune.report.scores import derivation, score_label, score_rows
from prefixtune.report.status_view import format_detail, summarize
from prefixtune.tuning.objective import ScoreBasis
from prefixtune.tuning.phases import Phase
from prefixtune.tuning.policy import initial_state
from prefixtune.tuning.settings import TuningSettings
from prefixtune.tuning.state import Trial, ValueTerms

BASE = KnobConfig(0.9, 16, True, "fcfs")


def _window(goodput: float) -> Signals:
    return Signals(window_s=60, requests=100, hit_rate=0.5, goodput_tokens_per_s=goodput, ttft_p99_s=0.2)


def _mixed() -> dict[str, Any]:
    """A resource whose status (as the controller writes it) holds every basis: a measured baseline,
    a canary paired with it (the lowest raw goodput, yet the best), a rolling load-normalized trial,
    an infeasible one and an aborted one (its partial window's own score)."""
    paired = ValueTerms(
        basis=ScoreBasis.PAIRED, anchor_trial=0, anchor=321.9, ratio=1.3986, baseline_window=152.8,
        canary_pods=1, baseline_pods=2, split=0.85,
    )  # fmt: skip
    rolling = ValueTerms(
        basis=ScoreBasis.LOAD_NORMALIZED, load_factor=0.8, offered_rps=2.5, reference_rps=2.0
    )
    trials = [
        Trial(id=0, epoch=0, role="baseline", config=BASE, outcome="ok", started_at=1.0,
              signals=_window(321.9), score=321.9, value=321.9, terms=ValueTerms(basis=ScoreBasis.MEASURED)),
        Trial(id=1, epoch=0, role="trial", config=BASE.with_(memory_fraction=0.7), outcome="ok",
              started_at=2.0, signals=_window(90.82), score=90.82, value=321.9 * 1.3986, terms=paired),
        Trial(id=2, epoch=0, role="trial", config=BASE.with_(block_size=32), outcome="ok", started_at=3.0,
              signals=_window(400.0), score=400.0, value=320.0, terms=rolling),
        Trial(id=3, epoch=0, role="trial", config=BASE.with_(memory_fraction=0.98), outcome="infeasible",
              started_at=4.0, failure="oom"),
        Trial(id=4, epoch=0, role="trial", config=BASE.with_(block_size=64), outcome="aborted",
              started_at=5.0, signals=_window(50.0), score=50.0, value=50.0,
              terms=ValueTerms(basis=ScoreBasis.MEASURED)),
    ]  # fmt: skip
    state = initial_state("vllm", TuningSettings(), BASE).model_copy(
        update={"phase": Phase.CONVERGED, "trials": trials, "best": 1, "next_trial_id": 5}
    )
    status = build_status(state, [], None, now=10.0, generation=1, ready=(True, "ReplicasReady", "1/1"))  # type: ignore[arg-type]
    return {
        "metadata": {"name": "chat", "namespace": "demo"},
        "spec": {"engine": "vllm", "model": "m", "tuning": {"objective": "goodput"}},
        "status": status,
    }


def _numbers(text: str) -> list[float]:
    return [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", text)]


def test_the_report_table_and_the_score_plot_show_the_same_scores_under_the_same_label() -> None:
    resource = _mixed()
    trials = resource["status"]["trials"]
    page = report.render_html(resource, [], [], "now")
    cells = re.findall(r'<tr class="(\w+)"><td>(\d+)</td>.*?<td class="score">([^<]*)</td>', page)
    table = {int(i): (None if v == "-" else float(v)) for _, i, v in cells}
    assert sorted(table) == [t["index"] for t in trials]
    fig = plots.score_figure(score_rows(trials, "goodput"), objective="goodput")
    (ax,) = fig.axes
    plotted = {int(x): float(y) for c in ax.collections if c.get_gid() == "score" for x, y in c.get_offsets()}
    unscored = {int(x) for c in ax.collections if c.get_gid() == "unscored" for x, _ in c.get_offsets()}
    # the same trials, the same numbers (the table prints 4 significant digits)
    assert set(plotted) == {i for i, v in table.items() if v is not None} == {0, 1, 2, 4}
    assert unscored == {i for i, v in table.items() if v is None} == {3}
    for index, value in plotted.items():
        assert table[index] == pytest.approx(value, rel=1e-3)
        assert value == next(t["score"] for t in trials if t["index"] == index)
    # the canary's score, not its pod's raw goodput (the lowest of all), is what both show
    assert plotted[1] == pytest.approx(321.9 * 1.3986) and trials[1]["windowScore"] == 90.82
    assert ax.get_ylabel() == score_label("goodput")
    assert f"<th>{html.escape(score_label('goodput'))}</th>" in page
    # raw window figures are labelled as the pods' own, apart from the score
    assert "window: the pods under test (raw)" in page
    assert f"<th>window {score_label('goodput')}</th>" in page


def test_every_printed_derivation_recomputes_its_score() -> None:
    trials = _mixed()["status"]["trials"]
    rows = {r.index: r for r in score_rows(trials, "goodput")}
    assert {i: r.basis for i, r in rows.items()} == {
        0: ScoreBasis.MEASURED, 1: ScoreBasis.PAIRED, 2: ScoreBasis.LOAD_NORMALIZED, 3: None,
        4: ScoreBasis.MEASURED,
    }  # fmt: skip
    assert rows[3].how == ""  # not scored: nothing to derive
    (measured,) = _numbers(rows[0].how)
    assert measured == pytest.approx(rows[0].score, rel=1e-3)
    # paired: trial 0's anchor x ratio; ratio = (canary / pods) / (stable / pods) / split
    trial, anchor, ratio, canary, cpods, stable, bpods, split = _numbers(rows[1].how)
    assert trial == 0 and rows[1].how.startswith("paired-with-baseline: trial 0's")
    assert anchor * ratio == pytest.approx(rows[1].score, rel=1e-3)
    assert (canary / cpods) / (stable / bpods) / split == pytest.approx(ratio, rel=1e-3)
    # load-normalized: window x factor; factor = reference / offered, within [0.5, 2]
    window, factor, reference, offered, low, high = _numbers(rows[2].how)
    assert window * factor == pytest.approx(rows[2].score, rel=1e-3)
    assert reference / offered == pytest.approx(factor) and (low, high) == (0.5, 2)


def test_a_ttft_canary_divides_its_anchor_by_the_ratio_of_the_latencies() -> None:
    record = {
        "index": 3, "score": -0.4, "windowScore": -0.5, "scoreBasis": "paired-with-baseline",
        "scoreTerms": {"baselineTrial": 0, "baselineScore": -0.6, "ratio": 1.5, "baselineWindowScore": -0.75},
    }  # fmt: skip
    text = derivation(record, "ttft")
    assert text.startswith("paired-with-baseline: trial 0's -0.6 / ratio 1.5;")
    _, anchor, ratio, stable, canary = _numbers(text)
    assert anchor / ratio == pytest.approx(record["score"]) and stable / canary == pytest.approx(ratio)


def test_status_shows_the_best_score_with_its_basis_and_terms() -> None:
    resource = _mixed()
    facts = summarize(resource)
    assert (facts["bestTrial"], facts["bestBasis"]) == (1, "paired-with-baseline")
    lines = format_detail(facts).splitlines()
    score_at = next(i for i, line in enumerate(lines) if line.startswith("  score        450.2"))
    how = lines[score_at + 1].strip()
    assert how == "trial 1: " + derivation(resource["status"]["trials"][1], "goodput")


def test_the_demo_summary_compares_the_best_with_the_baseline_the_status_names() -> None:
    resource = _mixed()
    assert "role" not in resource["spec"]  # the role comes from the status the controller wrote
    text = summary([resource]).splitlines()
    assert text[1].startswith(
        "  baseline: mem 0.90 · block 16 · cache on · fcfs  score 321.9 (trial 0; measured"
    )
    assert text[2].endswith(f"score 450.2 ({450.2 / 321.9 - 1:+.0%} vs baseline)")
    assert text[3].strip() == "trial 1; " + derivation(resource["status"]["trials"][1], "goodput")
    # a later tuning run's baseline is the one compared with
    resource["status"]["trials"].append({**resource["status"]["trials"][0], "index": 5, "score": 300.0})
    assert "score 300 (trial 5;" in summary([resource]).splitlines()[1]


def test_the_ttft_demo_summary_counts_a_shorter_ttft_as_a_gain() -> None:
    resource = _mixed()
    resource["spec"]["tuning"]["objective"] = "ttft"
    status = resource["status"]
    status["trials"][0]["score"], status["bestConfig"]["score"] = -0.8, -0.5
    assert "(+60% vs baseline)" in summary([resource])

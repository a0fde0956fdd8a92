"""``prefixtune bench scale``: its statistics, and one small run end to end (N = 3)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench import scale

TEXT = """# HELP prefixtune_decision_seconds Time.
# TYPE prefixtune_decision_seconds histogram
prefixtune_decision_seconds_bucket{le="0.1"} 8.0
prefixtune_decision_seconds_bucket{le="1.0"} 10.0
prefixtune_decision_seconds_bucket{le="+Inf"} 10.0
prefixtune_decision_seconds_count 10.0
prefixtune_decision_seconds_sum 2.0
"""


def test_quantiles_come_from_the_buckets_observed_between_two_scrapes() -> None:
    after = scale.histograms(TEXT)["prefixtune_decision_seconds"]
    before = {0.1: 4.0, 1.0: 4.0, float("inf"): 4.0}
    window = scale.delta(after, before)
    assert window == {0.1: 4.0, 1.0: 6.0, float("inf"): 6.0}
    assert scale.quantile(0.5, window) == pytest.approx(0.075)  # 3 of 4 in (0, 0.1]
    assert scale.quantile(0.99, window) == pytest.approx(0.1 + 0.9 * (5.94 - 4) / 2)


def test_summary_rates_are_per_wall_second_and_per_resource_hour() -> None:
    hist = scale.histograms(TEXT)
    before = {
        "hist": {},
        "proc": {"cpu_s": 10.0, "rss_mb": 1.0, "peak_rss_mb": 1.0},
        "requests": 100,
        "trials": 0,
    }
    after = {"hist": hist, "proc": {"cpu_s": 46.0, "rss_mb": 120.0, "peak_rss_mb": 130.0}, "requests": 700,
             "trials": 5}  # fmt: skip
    row = scale.summarize(10, 60.0, before, after)
    assert row["api_requests_per_s"] == 10.0 and row["reconciles"] == 10
    assert row["cpu_s_per_resource_hour"] == 216.0  # 36 CPU s over 10 resources x 1/60 h
    assert (row["rss_mb"], row["peak_rss_mb"], row["trials_finished"]) == (120.0, 130.0, 5)
    assert scale.verdict([row])["measured"] is False


@pytest.mark.e2e
def test_a_small_fleet_runs_and_reports_every_figure(tmp_path: Path) -> None:
    # A short cadence for a test (the bench's defaults are minute windows and a 70 s stagger).
    row = asyncio.run(
        scale.run_one(
            3,
            duration_s=8.0,
            settle_s=6.0,
            log_dir=tmp_path,
            tick_s=1.0,
            warmup="2s",
            measure="6s",
            stagger_s=0.0,
        )
    )
    assert row["n"] == 3 and row["reconciles"] > 0
    # The operator's requests since the start (it created the children); in the window itself a tick
    # at rest reads nothing (the watched body and kopf's indexes), so that count may be 0.
    assert scale._operator_requests(row["api_requests_by_agent"]) > 0
    assert row["rss_mb"] > 0 and row["operator_cpu_s"] >= 0
    assert row["reconcile_p99_s"] is not None and row["decision_p50_s"] is not None
    assert row["watch_lag_events"] > 0 and row["watch_lag_p99_s"] is not None  # status writes seen
    assert row["handled_s"] >= row["create_s"]  # the window began after every resource was handled


def test_a_fleet_that_finished_no_trial_is_never_judged_to_meet_the_targets() -> None:
    quiet = {"n": 500, "decision_p99_s": 0.005, "reconcile_p99_s": 0.005, "rss_mb": 183.0}
    assert scale.verdict([{**quiet, "trials_finished": 0}]) == {
        "n": 500,
        "measured": False,
        "targets": scale.TARGETS,
        "why": "no trial finished in the window",
    }
    assert scale.verdict([{**quiet, "trials_finished": 431}])["all_met"] is True


def test_a_trial_duration_that_is_no_duration_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert scale.main(["--n", "2", "--warmup", "30", "--measure", "300s"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench scale: --warmup: '30' is not a duration")

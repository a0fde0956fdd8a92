"""What a window keeps of a scrape (issue #21, a fleet per replica): only the series its recipe
reads. A whole engine exposition parses to ~300 KB and an open window keeps up to five scrapes per
pod, so at 500 resources whole scrapes held ~0.75 GB; the signals must not change by the slimming."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from prefixtune.engines.base import EngineName
from prefixtune.metrics.exposition import Snapshot, parse
from prefixtune.metrics.histogram import Slo
from prefixtune.metrics.recipe import for_engine
from prefixtune.metrics.scrape_source import window_signals

DATA = Path(__file__).resolve().parents[2] / "operator" / "prefixtune" / "sandbox" / "data"


@pytest.mark.parametrize("engine", [EngineName.VLLM, EngineName.SGLANG, EngineName.TRTLLM])
def test_a_slimmed_window_reads_the_same_signals_as_the_whole_scrapes(engine: EngineName) -> None:
    recorded = json.loads((DATA / f"standin-{engine.value}.json").read_text())
    start = parse(recorded["start"], target="p", t=0.0)
    end = parse(recorded["end"], target="p", t=float(recorded["interval_s"]))
    rec = for_engine(engine)
    kept = rec.sample_names()
    slim_start, slim_end = start.only(kept), end.only(kept)
    # every sample the recipe reads is kept, every other one dropped (the stand-ins are short
    # expositions: SGLang's keeps 92 of its 158 samples, vLLM's 81 of 291)
    assert {n for n, _ in slim_start.values} == {n for n, _ in start.values} & kept
    assert 0 < len(slim_start.values) < len(start.values) and slim_start.identity == start.identity
    slo = Slo(1.0, 0.1)
    whole = window_signals(rec, {"p": [start, end]}, slo=slo)
    slim = window_signals(rec, {"p": [slim_start, slim_end]}, slo=slo)
    assert slim.signals == whole.signals
    assert slim.signals.requests_per_s is not None and slim.signals.requests_per_s > 0


@pytest.mark.parametrize("engine", [EngineName.VLLM, EngineName.SGLANG, EngineName.TRTLLM])
def test_parsing_only_a_windows_samples_gives_the_slimmed_scrape(engine: EngineName) -> None:
    recorded = json.loads((DATA / f"standin-{engine.value}.json").read_text())
    kept = for_engine(engine).sample_names()
    for text in (recorded["start"], recorded["end"]):
        whole = parse(text, target="p", t=0.0).only(kept)
        only = parse(text, target="p", t=0.0, only=kept)
        assert only.values == whole.values and only.cumulative == whole.cumulative
        assert only.identity and set(only.identity) <= set(whole.identity)  # ours, and the start time
        assert all(n == "process_start_time_seconds" or n.endswith("_created") for (n, _), _ in only.identity)


def test_a_restart_shows_in_the_identity_of_a_scrape_parsed_for_a_window() -> None:
    text = (
        "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 100\n"
        "# TYPE req counter\nreq_total 5\nreq_created 100\n"
        "# TYPE other counter\nother_total 1\nother_created 7\n"
    )
    only = frozenset({"req_total"})
    before = parse(text, target="p", t=0.0, only=only)
    assert {n for (n, _), _ in before.identity} == {"process_start_time_seconds", "req_created"}
    assert set(before.values) == {("req_total", frozenset())} and before.cumulative == {"req_total"}
    after = parse(text.replace("req_created 100", "req_created 200"), target="p", t=1.0, only=only)
    assert after.restarted_since(before)


@pytest.mark.parametrize(
    "bad",
    [
        "this is { not a sample",
        'vllm:unread_gauge{model_name="m"} not-a-number',
        "= 1",
    ],
)
def test_a_malformed_line_a_window_does_not_read_still_fails_the_parse(bad: str) -> None:
    recorded = json.loads((DATA / "standin-vllm.json").read_text())
    kept = for_engine(EngineName.VLLM).sample_names()
    with pytest.raises(ValueError, match="not a valid Prometheus text exposition: line"):
        parse(recorded["end"] + bad + "\n", target="p", t=1.0, only=kept)
    with pytest.raises(ValueError, match="not a valid Prometheus text exposition"):
        parse(recorded["end"] + bad + "\n", target="p", t=1.0)


def test_the_shape_check_passes_every_line_of_the_engines_recorded_expositions() -> None:
    for engine in EngineName:
        recorded = json.loads((DATA / f"standin-{engine.value}.json").read_text())
        kept = for_engine(engine).sample_names()
        for text in (recorded["start"], recorded["end"]):
            assert parse(text, target="p", t=0.0, only=kept).values  # no line refused


@pytest.mark.parametrize("engine", [EngineName.VLLM, EngineName.SGLANG, EngineName.TRTLLM])
def test_a_windows_later_scrapes_reuse_its_start_scrapes_series_keys(engine: EngineName) -> None:
    recorded = json.loads((DATA / f"standin-{engine.value}.json").read_text())
    rec = for_engine(engine)
    kept = rec.sample_names()

    def scrape(text: str, t: float) -> Snapshot:
        return parse(text, target="p", t=t, only=kept)

    first = scrape(recorded["start"], 0.0)
    plain = scrape(recorded["end"], float(recorded["interval_s"]))
    later = plain.only(kept, like=first)
    assert later == plain  # the same scrape: equal keys, values, identity
    reused = [key for key in later.values if key in first.values]
    assert reused and all(any(key is mine for mine in first.values) for key in reused)
    slo = Slo(1.0, 0.1)
    assert window_signals(rec, {"p": [first, later]}, slo=slo) == window_signals(
        rec, {"p": [first, plain]}, slo=slo
    )

    def held(like: Snapshot | None) -> int:
        """Bytes four later scrapes of the window hold (the start scrape's are the window's anyway)."""
        tracemalloc.start()
        kept_scrapes = [scrape(recorded["end"], float(i)).only(kept, like) for i in range(4)]
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert len(kept_scrapes) == 4
        return size

    # measured: 12 KB a scrape against 78 KB (vLLM), 10 against 105 (SGLang), 3 against 47 (TRT-LLM)
    assert held(first) < 0.5 * held(None)

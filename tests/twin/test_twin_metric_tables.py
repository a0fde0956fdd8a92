"""The exporter's metric tables: the generic builder turns ``Series`` rows into prometheus_client
objects, moves them on the events they name, and refuses rows it cannot honour."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from prefixtune.twin.cache import Match
from prefixtune.twin.exporter import (
    MODEL_NAME,
    Admitted,
    Child,
    EngineExporter,
    Finished,
    MetricState,
    Move,
    Series,
    SeriesKind,
    TableMetrics,
    Tokens,
    counter,
    gauge,
    histogram,
    info,
)
from prefixtune.twin.workloads import generate

LABELS = {"model_name": MODEL_NAME}


class Seen(MetricState):
    """Records the events it sees and the counter's value at that moment (after the moves)."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def update(self, event: object) -> None:
        self.events.append(type(event).__name__)


def _count(e: Tokens) -> int:
    return e.n


class Demo(TableMetrics):
    table = (
        gauge("t:running", "running", LABELS, "running"),
        counter(
            "t:hits", "hits at first admission", LABELS,
            Move(Admitted, lambda e: e.match.hit_tokens, when=lambda e: e.first),
        ),
        counter(
            "t:done", "done by reason", LABELS, by="reason",
            children=(Child("length", moves=(Move(Finished, lambda e: 1),)), Child("stop")),
        ),
        histogram("t:gap", "gaps", LABELS, (0.1, 1.0), Move(Tokens, lambda e: e.gap_s, times=_count)),
        info("t:config", "config", LABELS, ("blocks", lambda s: str(s.gauges.pool_blocks))),
    )  # fmt: skip
    state_type = Seen


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_a_table_becomes_series_moved_by_the_events_it_names() -> None:
    x = EngineExporter("vllm", "m")
    demo = Demo(x)
    req = generate("chatbot", rate=5.0, duration_s=5.0, seed=1)[0]
    demo.on_admitted(req, Match(hit_tokens=32), 0.0, True)
    demo.on_admitted(req, Match(hit_tokens=16), 1.0, False)  # a re-admission: ``when`` says no
    demo.on_tokens(0.5, 3, 2.0)
    demo.on_finished(req, 32, 3.0, 0.1, 0.2, 2.7)
    for blocks in (3, 7):  # the config-info child is re-labelled at each scrape, not added
        x.bind(partial(replace, x.snapshot, running=2, pool_blocks=blocks))
        x.refresh()
        demo.refresh(x.snapshot, None)
    got = samples(generate_latest(x.registry))
    m = (("model_name", "m"),)
    assert got[("t:hits_total", m)] == 32.0
    assert got[("t:done_total", (*m, ("reason", "length")))] == 1.0
    assert got[("t:done_total", (*m, ("reason", "stop")))] == 0.0  # declared children exist at zero
    assert got[("t:gap_bucket", (("le", "0.1"), *m))] == 0.0
    assert got[("t:gap_bucket", (("le", "1.0"), *m))] == 3.0
    assert got[("t:gap_count", m)] == 3.0
    assert got[("t:config", (("blocks", "7"), *m))] == 1.0
    assert [k for k in got if k[0] == "t:config"] == [("t:config", (("blocks", "7"), *m))]
    assert got[("t:running", m)] == 2.0
    assert demo.state.events == ["Admitted", "Admitted", "Tokens", "Finished"]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            Series("t:g", SeriesKind.GAUGE, "g", LABELS, moves=(Move(Tokens, lambda e: 1),)),
            "read at scrape time",
        ),
        (Series("t:c", SeriesKind.COUNTER, "c", LABELS, "running"), "only a gauge has a scrape-time source"),
        (Series("t:h", SeriesKind.HISTOGRAM, "h", LABELS), "needs buckets"),
        (Series("t:h", SeriesKind.HISTOGRAM, "h", LABELS, buckets=(1.0,), mirror=lambda s: 1.0), "mirrors"),
        (Series("t:c", SeriesKind.COUNTER, "c", LABELS, info=(("a", lambda s: "1"),)), "config info"),
        (
            Series(
                "t:c", SeriesKind.COUNTER, "c", LABELS, moves=(Move(Tokens, lambda e: 1, times=lambda e: 2),)
            ),
            "once",
        ),
    ],
)
def test_the_builder_refuses_a_row_it_cannot_honour(row: Series, message: str) -> None:
    class Bad(TableMetrics):
        table = (row,)

    with pytest.raises(ValueError, match=message) as err:
        Bad(EngineExporter("vllm", "m"))
    assert row.name in str(err.value)

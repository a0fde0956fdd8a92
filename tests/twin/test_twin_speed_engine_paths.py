"""The engine's fast paths keep its behaviour: arrivals in any submission order, the collector pause,
and the one-sort percentiles of the summary."""

from __future__ import annotations

import gc
import random

import pytest

from prefixtune.twin.cache.base import Match
from prefixtune.twin.engine import TwinEngine, gc_paused
from prefixtune.twin.observer import NullObserver
from prefixtune.twin.prompt import Segment, TokenSeq, chain_key
from prefixtune.twin.request import Request
from prefixtune.twin.run import parse_command
from prefixtune.twin.summary import percentile, percentiles, weighted_percentile, weighted_percentiles

M8 = "meta-llama/Llama-3.1-8B-Instruct"


class _Admissions(NullObserver):
    def __init__(self) -> None:
        self.ids: list[int] = []

    def admitted(self, req: Request, match: Match, now: float) -> None:
        self.ids.append(req.req_id)


def _request(i: int, arrival: float) -> Request:
    key = chain_key(0, "user", i)
    return Request(i, arrival, TokenSeq((Segment(key, 50), Segment(chain_key(key, "out"), 5))), 50, 5)


def test_requests_are_admitted_by_arrival_whatever_the_submission_order() -> None:
    rng = random.Random(3)
    # ties on purpose: equal arrivals go in submission order
    arrivals = [round(rng.uniform(0.0, 2.0), 1) for _ in range(60)]
    reqs = [_request(i, t) for i, t in enumerate(arrivals)]
    order = list(range(len(reqs)))
    rng.shuffle(order)
    obs = _Admissions()
    eng = TwinEngine(parse_command("vllm", [], model=M8), "H100", observer=obs)
    for i in order:
        eng.submit(reqs[i])
    eng.advance(float("inf"))
    position = {i: n for n, i in enumerate(order)}
    assert obs.ids == sorted(range(len(reqs)), key=lambda i: (arrivals[i], position[i]))
    assert eng.counters.finished == len(reqs)


def test_a_late_submission_arrives_at_the_next_step() -> None:
    obs = _Admissions()
    eng = TwinEngine(parse_command("vllm", [], model=M8), "H100", observer=obs)
    eng.submit(_request(0, 5.0))
    eng.advance(1.0)
    eng.submit(_request(1, 0.5))  # already past: queued before the later one
    assert eng.next_event_s() == eng.now
    eng.advance(float("inf"))
    assert obs.ids == [1, 0]


def test_gc_paused_nests_and_restores() -> None:
    was = gc.isenabled()
    gc.enable()
    try:
        with gc_paused():
            assert not gc.isenabled()
            with gc_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()  # the inner block does not turn it back on
        assert gc.isenabled()
        gc.disable()
        with gc_paused():
            pass
        assert not gc.isenabled()  # left as it was
    finally:
        if was:
            gc.enable()
        else:
            gc.disable()


def test_percentiles_equal_one_at_a_time() -> None:
    rng = random.Random(5)
    values = [rng.expovariate(1.0) for _ in range(301)]
    pairs = [(round(rng.uniform(0, 0.05), 3), rng.randrange(1, 50)) for _ in range(500)]  # equal values
    qs = (0.0, 0.5, 0.9, 0.99, 1.0)
    assert percentiles(values, qs) == [percentile(values, q) for q in qs]
    assert weighted_percentiles(pairs, qs) == [weighted_percentile(pairs, q) for q in qs]
    assert percentiles([], qs) == weighted_percentiles([], qs) == [0.0] * len(qs)
    # the weighted quantile: the first value whose cumulative count reaches q * total
    assert weighted_percentiles([(3.0, 1), (1.0, 1), (2.0, 2)], (0.25, 0.5, 0.75, 1.0)) == [
        1.0,
        2.0,
        2.0,
        3.0,
    ]
    assert percentile([1.0, 3.0], 0.5) == pytest.approx(2.0)

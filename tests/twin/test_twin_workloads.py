"""Workloads: presets, workload files, arrival processes, determinism, Mooncake trace replay."""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from prefixtune.twin.arrivals import Arrivals, gaps_cv
from prefixtune.twin.request import Request
from prefixtune.twin.trace import load_trace
from prefixtune.twin.workloads import (
    PRESETS,
    Dist,
    WorkloadError,
    WorkloadSpec,
    dump_workload,
    from_trace,
    generate,
    load_workload,
    parse_workload,
    resolve_workload,
    trace_sessions,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "workloads"


# --- presets and files ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_example_file_is_the_preset(name: str) -> None:
    assert load_workload(EXAMPLES / f"{name}.yaml") == PRESETS[name]


def test_dump_round_trips_every_preset(tmp_path: Path) -> None:
    for name, spec in PRESETS.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(dump_workload(spec))
        assert load_workload(path) == spec


def test_json_workload_file(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    path.write_text(
        json.dumps(
            {
                "name": "mini",
                "prefixes": [{"name": "sys", "count": 3, "length": 100, "weights": [5, 1, 1]}],
                "suffix": {"dist": "uniform", "low": 10, "high": 20},
                "output": 32,
                "arrival": {"process": "bursty", "cv": 2.5},
            }
        )
    )
    spec = load_workload(path)
    assert spec.prefixes[0].weights == (5.0, 1.0, 1.0)
    assert spec.arrival.process == "bursty"
    reqs = generate(spec, rate=5, duration_s=20, seed=1)
    assert reqs and all(r.output_len == 32 and 110 <= r.prompt_len <= 120 for r in reqs)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"suffix": 1, "output": 1, "arrival": {"process": "weird"}}, "arrival.process"),
        ({"suffix": {"dist": "lognormal", "median": 100}, "output": 1}, "suffix: dist 'lognormal' needs"),
        ({"suffix": 100}, "output: Field required"),
        (
            {"suffix": 1, "output": 1, "prefixes": [{"name": "a", "count": 2, "length": 5, "weights": [1]}]},
            "prefixes.0: weights has 1 entries but count is 2",
        ),
        ({"suffix": 1, "output": 1, "bogus": 1}, "bogus: Extra inputs are not permitted"),
        ({"suffix": 1, "output": 1, "session": {"turns": 0}}, "session.turns: turns must be at least 1"),
        ({"suffix": 1, "output": 1, "rate": -1}, "rate: Input should be greater than 0"),
        (
            {"suffix": {"dist": "uniform", "low": 9, "high": 3}, "output": 1},
            "suffix: uniform needs low <= high",
        ),
        (
            {"suffix": 1, "output": 1, "arrival": {"process": "diurnal", "amplitude": 1.5}},
            "arrival.amplitude",
        ),
        (
            {"suffix": 1, "output": 1, "prefixes": [{"name": "a", "length": 1}, {"name": "a", "length": 2}]},
            "duplicate pool name(s) a",
        ),
    ],
)
def test_bad_workload_names_the_field(data: dict[str, object], expected: str) -> None:
    with pytest.raises(WorkloadError) as err:
        parse_workload({"name": "x", **data}, source="w.yaml")
    assert str(err.value).startswith("w.yaml: ")
    assert expected in str(err.value)


def test_bad_workload_file_errors(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="cannot read it"):
        load_workload(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(WorkloadError, match="not valid YAML"):
        load_workload(bad)
    bad.write_text("- a list\n")
    with pytest.raises(WorkloadError, match="expected a mapping"):
        load_workload(bad)
    with pytest.raises(WorkloadError, match="unknown workload 'nope'; presets: rag, chatbot"):
        resolve_workload("nope")
    with pytest.raises(WorkloadError, match="rate must be > 0"):
        generate("rag", rate=0, duration_s=10)
    with pytest.raises(WorkloadError, match="duration_s must be > 0"):
        generate("rag", rate=1, duration_s=-1)


# --- distributions ----------------------------------------------------------------------------


def test_distributions_have_their_parameters() -> None:
    rng = np.random.default_rng(3)
    n = 20_000
    normal = Dist(dist="normal", mean=500, std=100).sample(rng, n, integer=True)
    assert abs(np.mean(normal) - 500) < 5 and abs(np.std(normal) - 100) < 5
    logn = Dist(dist="lognormal", median=200, sigma=0.8).sample(rng, n, integer=False)
    assert abs(np.median(logn) / 200 - 1) < 0.05
    uni = Dist(dist="uniform", low=1, high=5).ints(rng, n)
    assert set(uni) == {1, 2, 3, 4, 5}
    geo = Dist(dist="geometric", mean=2.5).ints(rng, n)
    assert min(geo) == 1 and abs(np.mean(geo) - 2.5) < 0.1
    clipped = Dist(dist="normal", mean=0, std=100, min=10, max=20).ints(rng, 1000)
    assert min(clipped) >= 10 and max(clipped) <= 20
    assert Dist.model_validate(7).sample(rng, 3, integer=True) == [7.0, 7.0, 7.0]


# --- arrivals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arrivals", "cv_range"),
    [
        (Arrivals("poisson"), (0.9, 1.1)),
        (Arrivals("bursty", cv=3.0), (2.4, 3.6)),
        (Arrivals("bursty", cv=0.5), (0.45, 0.55)),
    ],
)
def test_renewal_arrivals_have_the_rate_and_cv(arrivals: Arrivals, cv_range: tuple[float, float]) -> None:
    times = arrivals.times(20.0, 1000.0, np.random.default_rng(11))
    assert all(b >= a for a, b in itertools.pairwise(times))
    assert times[0] >= 0 and times[-1] < 1000.0
    # 20,000 expected; a bursty process's count varies more (sd ~ cv * sqrt(n)).
    assert abs(len(times) / 1000.0 - 20.0) < 1.5
    lo, hi = cv_range
    assert lo < gaps_cv(times) < hi


def test_diurnal_rate_follows_the_sinusoid() -> None:
    arr = Arrivals("diurnal", period_s=400.0, amplitude=0.8)
    times = np.asarray(arr.times(10.0, 4000.0, np.random.default_rng(5)))
    assert abs(len(times) / 4000.0 - 10.0) < 0.5  # mean rate over whole periods
    phase = (times % 400.0) / 400.0
    peak = np.sum((phase > 0.15) & (phase < 0.35))  # around sin = 1
    trough = np.sum((phase > 0.65) & (phase < 0.85))  # around sin = -1
    assert peak / trough > 4.0  # (1 + 0.8) / (1 - 0.8) = 9 at the extremes


def test_bad_arrival_parameters() -> None:
    with pytest.raises(ValueError, match=r"arrival\.process must be one of poisson, bursty, diurnal"):
        Arrivals("gamma")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"arrival\.cv must be > 0"):
        Arrivals("bursty", cv=0)
    with pytest.raises(ValueError, match="rate must be > 0"):
        Arrivals().times(0.0, 10.0, np.random.default_rng(0))


def test_generated_request_rate_matches_for_multi_turn() -> None:
    reqs = generate("agent", rate=10, duration_s=800, seed=2)
    late = [r for r in reqs if r.arrival_s >= 100]  # after the sessions' ramp-up
    assert abs(len(late) / 700 - 10) < 1.0


# --- determinism and structure -----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_generation_is_deterministic(name: str) -> None:
    a = generate(name, rate=5, duration_s=60, seed=42)
    b = generate(name, rate=5, duration_s=60, seed=42)
    c = generate(name, rate=5, duration_s=60, seed=43)
    assert a == b
    assert a != c
    assert [r.req_id for r in a] == list(range(len(a)))
    assert all(x.arrival_s <= y.arrival_s for x, y in itertools.pairwise(a))


def test_longer_duration_extends_without_changing_earlier_sessions() -> None:
    short = generate("chatbot", rate=5, duration_s=100, seed=9)
    long = generate("chatbot", rate=5, duration_s=200, seed=9)
    key = [(r.session, r.arrival_s, r.seq) for r in short]
    assert key == [(r.session, r.arrival_s, r.seq) for r in long if r.arrival_s < 100]


def test_chat_history_contains_previous_prompt_and_output() -> None:
    reqs = generate("chatbot", rate=5, duration_s=300, seed=4)
    by_session: dict[int, list[object]] = {}
    for r in reqs:
        assert r.session is not None
        by_session.setdefault(r.session, []).append(r)
    multi = [turns for turns in by_session.values() if len(turns) >= 3]
    assert multi
    for turns in multi:
        for prev, cur in itertools.pairwise(turns):
            # The next prompt starts with the whole previous sequence: prompt AND output.
            assert cur.seq.common_prefix(prev.seq) == prev.seq.length  # type: ignore[attr-defined]
            assert cur.prompt_len > prev.seq.length  # type: ignore[attr-defined]
            assert cur.arrival_s > prev.arrival_s  # type: ignore[attr-defined]
    assert {r.kind for r in reqs} == {"chatbot/new-session", "chatbot/follow-up"}


def test_shared_prefixes_do_not_depend_on_the_seed() -> None:
    a = generate("rag", rate=5, duration_s=30, seed=1)
    b = generate("rag", rate=5, duration_s=30, seed=2)
    # Same application, different users: the shared context is common, the questions are not.
    contexts_a = {r.seq.segments[1] for r in a}
    contexts_b = {r.seq.segments[1] for r in b}
    assert len(contexts_a) == 4 and contexts_a == contexts_b  # the 4 document sets, by identity
    assert all(x.seq != y.seq for x in a[:5] for y in b[:5])


def test_qa_shares_only_the_preamble() -> None:
    reqs = generate("qa", rate=5, duration_s=60, seed=3)
    assert max(reqs[0].seq.common_prefix(r.seq) for r in reqs[1:]) == 12


def test_history_off_and_max_prompt() -> None:
    spec = WorkloadSpec.model_validate(
        {
            "name": "nohist",
            "prefixes": [{"name": "sys", "length": 50}],
            "session": {"turns": 4, "think_time_s": 1, "history": False},
            "suffix": 30,
            "output": 10,
        }
    )
    reqs = generate(spec, rate=4, duration_s=20, seed=0)
    assert {r.prompt_len for r in reqs} == {80}
    capped = spec.model_copy(
        update={"session": spec.session.model_copy(update={"history": True}), "max_prompt_tokens": 150}
    )
    lens = sorted({r.prompt_len for r in generate(capped, rate=4, duration_s=20, seed=0)})
    assert lens == [80, 120]  # the third turn would be 160 > 150: the session ends


# --- trace replay ----------------------------------------------------------------------------


@functools.cache
def _replayed(path: Path) -> list[Request]:
    return from_trace(path, seed=1)


@pytest.fixture
def conversation(traces_dir: Path) -> tuple[Path, list[Request]]:
    path = traces_dir / "mooncake_conversation_trace.jsonl"
    return path, _replayed(path)


def test_trace_replay_keeps_every_record_and_jitters_inside_buckets(
    conversation: tuple[Path, list[Request]],
) -> None:
    path, full = conversation
    records = load_trace(path)
    assert len(full) == len(records)
    assert sum(r.prompt_len for r in full) == sum(r.input_length for r in records)
    # The conversation trace has ~1,180 distinct timestamps (3 s buckets); jitter spreads them.
    assert len({round(r.timestamp_ms) for r in records}) < 0.11 * len(records)
    assert len({r.arrival_s for r in full}) > 0.99 * len(full)
    # Buckets do not overlap, so in arrival order each request lies within one bucket of its
    # timestamp (timestamps in arrival order).
    stamps = sorted(r.timestamp_ms / 1000 for r in records)
    arrivals = [r.arrival_s for r in full]
    offsets = [a - t for a, t in zip(arrivals, stamps, strict=True)]
    assert min(offsets) >= 0 and max(offsets) < 3.01
    assert 1.3 < sum(offsets) / len(offsets) < 1.7  # uniform in the bucket: mean ~1.5 s


def test_trace_replay_time_scale(conversation: tuple[Path, list[Request]]) -> None:
    path, full = conversation
    fast = from_trace(path, seed=1, time_scale=4.0)
    assert [r.arrival_s * 4.0 for r in fast] == pytest.approx([r.arrival_s for r in full])
    limited = from_trace(path, seed=1, limit=100)
    assert limited == [replace(r, req_id=i) for i, r in enumerate(full[:100])]


def test_trace_replay_session_subsampling(conversation: tuple[Path, list[Request]]) -> None:
    path, full = conversation
    quarter = from_trace(path, seed=1, session_sample=0.25)
    sessions_all = {r.session for r in full}
    sessions_kept = {r.session for r in quarter}
    assert 0.22 < len(sessions_kept) / len(sessions_all) < 0.28
    # Whole sessions are kept: every request of a kept session is there.
    assert len(quarter) == sum(1 for r in full if r.session in sessions_kept)
    other = from_trace(path, seed=2, session_sample=0.25)
    assert {r.session for r in other} != sessions_kept


def test_trace_sessions_keep_turns_in_order(conversation: tuple[Path, list[Request]]) -> None:
    path, full = conversation
    sessions = trace_sessions(load_trace(path))
    assert 0 not in sessions  # id 0 is in every record: a shared prefix, not a session
    sizes = Counter(sessions)
    assert sizes.most_common(1)[0][1] >= 10  # conversations of many turns exist
    last: dict[int, float] = {}
    for r in full:
        assert r.session is not None
        assert r.arrival_s >= last.get(r.session, -math.inf)
        last[r.session] = r.arrival_s
    # Turns of one session share their leading blocks.
    big = sizes.most_common(1)[0][0]
    turns = [r for r in full if r.session == big]
    assert all(t.seq.common_prefix(turns[0].seq) >= 1024 for t in turns[1:])


def test_trace_errors(tmp_path: Path) -> None:
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1}\n')
    with pytest.raises(WorkloadError, match=r"t\.jsonl:1: missing field"):
        from_trace(bad)
    with pytest.raises(WorkloadError, match="time_scale must be > 0"):
        from_trace(bad, time_scale=0)
    with pytest.raises(WorkloadError, match="session_sample must be in"):
        from_trace(bad, session_sample=1.5)

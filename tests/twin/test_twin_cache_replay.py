"""Mooncake trace loading and cache-only replay, including the engine-semantics hit-rate table."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from prefixtune.twin.prompt import TokenSeq
from prefixtune.twin.replay import cache_main, replay_cache
from prefixtune.twin.request import Request
from prefixtune.twin.trace import TraceError, TraceKeys, load_requests, load_trace, parse_trace, to_requests

# workloads-and-calibration.md §A1: vLLM semantics, cache-only replay at block size 512, token hit
# rates at pools of N blocks of 512 tokens.
POOLS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
TABLE = {
    "conversation": (0.043, 0.046, 0.057, 0.094, 0.192, 0.276, 0.346, 0.367),
    "synthetic": (0.048, 0.088, 0.155, 0.259, 0.395, 0.551, 0.645, 0.650),
}


@cache
def _requests(path: Path) -> list[Request]:
    """Each trace is loaded once per test session (loading is ~1 s; the tests only read it)."""
    return load_requests(path)


@pytest.mark.parametrize("trace", sorted(TABLE))
def test_vllm_replay_at_block_512_reproduces_the_engine_semantics_table(trace: str, traces_dir: Path) -> None:
    reqs = _requests(traces_dir / f"mooncake_{trace}_trace.jsonl")
    got = []
    for n in POOLS:
        r = replay_cache("vllm", reqs, n * 512, 512)
        assert r["requests"] == len(reqs) and r["rejected"] == 0
        got.append(r["token_hit_rate"])
    for n, want, rate in zip(POOLS, TABLE[trace], got, strict=True):
        assert rate == pytest.approx(want, abs=0.01), f"{trace} at {n} blocks: {rate:.4f} vs table {want}"


def test_engines_agree_on_the_trace_at_block_512_with_a_large_pool(traces_dir: Path) -> None:
    """With the trace's 512-token granularity the radix tree and the block hashes see the same
    prefixes; TensorRT-LLM differs slightly (it stores P-1 tokens, and partial reuse lets a repeated
    prompt hit P-1 tokens where vLLM hits whole blocks)."""
    reqs = _requests(traces_dir / "mooncake_synthetic_trace.jsonl")[:1500]
    rates = {
        e: replay_cache(e, reqs, 65536 * 512, 512)["token_hit_rate"] for e in ("vllm", "sglang", "trtllm")
    }
    assert rates["sglang"] == pytest.approx(rates["vllm"], abs=0.002)
    assert rates["trtllm"] == pytest.approx(rates["vllm"], abs=0.01)


def test_replay_result_is_plain_and_deterministic(traces_dir: Path) -> None:
    reqs = _requests(traces_dir / "mooncake_conversation_trace.jsonl")[:400]
    a = replay_cache("sglang", reqs, 200_000, 16)
    b = replay_cache("sglang", reqs, 200_000, 16)
    for r in (a, b):
        r.pop("wall_seconds")
        r.pop("requests_per_s")
    assert a == b
    json.dumps(a)  # plain Python values only
    assert {type(v) for v in a.values()} <= {str, int, float, bool, dict}
    assert 0.0 < a["token_hit_rate"] < 1.0 and 0.0 < a["block_hit_rate"] < 1.0


def test_replay_accepts_token_seqs_and_reports_block_hit_rate() -> None:
    from prefixtune.twin.prompt import Segment

    seqs = [TokenSeq((Segment(1, 64), Segment(100 + i, 16))) for i in range(3)]
    r = replay_cache("vllm", seqs, 1024, 16)
    # 64 shared tokens = 4 blocks hit by requests 2 and 3; 5 full blocks each
    assert r["hit_tokens"] == 128 and r["block_hit_rate"] == pytest.approx(8 / 15)
    assert r["token_hit_rate"] == pytest.approx(128 / 240)


def test_replay_skips_prompts_larger_than_the_pool() -> None:
    from prefixtune.twin.prompt import Segment

    r = replay_cache("vllm", [TokenSeq((Segment(1, 5000),)), TokenSeq((Segment(2, 50),))], 1024, 16)
    assert (r["requests"], r["rejected"]) == (1, 1)
    with pytest.raises(ValueError, match="pool_tokens"):
        replay_cache("vllm", [], 8, 16)


# -- trace loading ----------------------------------------------------------------------------


def test_trace_records_become_chained_segments(traces_dir: Path) -> None:
    records = load_trace(traces_dir / "mooncake_conversation_trace.jsonl")
    assert len(records) == 12031
    keys = TraceKeys("t")
    first = keys.prompt(records[0])
    assert first.length == records[0].input_length == 6758
    assert [s.length for s in first.segments] == [512] * 13 + [6758 - 512 * 13]
    second = keys.prompt(records[1])  # shares only hash id 0 with the first
    assert first.common_prefix(second) == 512
    # re-blocking: block 16 ids inside a shared 512 block agree, then diverge
    assert first.block_ids(16)[:32] == second.block_ids(16)[:32]
    assert first.block_ids(16)[32] != second.block_ids(16)[32]


def test_arrival_order_is_stable_within_equal_timestamps() -> None:
    lines = [
        '{"timestamp": 3000, "input_length": 10, "output_length": 1, "hash_ids": [1]}',
        '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [2, 3]}',
        '{"timestamp": 3000, "input_length": 20, "output_length": 3, "hash_ids": [4]}',
        '{"timestamp": 0, "input_length": 5, "output_length": 4, "hash_ids": [5]}',
    ]
    reqs = to_requests(parse_trace(lines))
    assert [r.output_len for r in reqs] == [2, 4, 1, 3]
    assert [r.arrival_s for r in reqs] == [0.0, 0.0, 3.0, 3.0]
    assert [r.req_id for r in reqs] == [0, 1, 2, 3]
    assert reqs[0].prompt_len == 600 and reqs[0].seq.length == 602


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"x\.jsonl:2: invalid JSON"),
        ("[1, 2]", r"x\.jsonl:2: expected a JSON object"),
        ('{"timestamp": 0, "input_length": 5}', r"x\.jsonl:2: missing field\(s\) output_length, hash_ids"),
        ('{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [9]}', "'timestamp' must be"),
        (
            '{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [9]}',
            "'input_length' must be >= 1",
        ),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 1.5, "hash_ids": [9]}',
            "'output_length' must be an",
        ),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}',
            "'hash_ids' must be a non-empty",
        ),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}',
            "'hash_ids' must hold",
        ),
        (
            '{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [9]}',
            r"has 1 ids but input_length 513 needs ceil\(513/512\) = 2",
        ),
        (
            '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [7, 1]}',
            "id 1 follows id 7 here but the start on line 1; ids must be prefix-chained",
        ),
    ],
)
def test_bad_trace_lines_get_clear_errors(line: str, message: str) -> None:
    good = '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}'
    with pytest.raises(TraceError, match=message):
        parse_trace([good, line], source="x.jsonl")


def test_missing_trace_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path / "nope.jsonl")


# -- CLI ----------------------------------------------------------------------------------------


def test_cli_replays_a_trace_as_json(traces_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = traces_dir / "mooncake_synthetic_trace.jsonl"
    argv = [
        "--engine",
        "trtllm",
        "--trace",
        str(path),
        "--requests",
        "300",
        "--pool-tokens",
        "2000000",
        "--json",
    ]
    assert cache_main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "trtllm" and out["block_size"] == 32 and out["requests"] == 300
    assert out["pool_tokens"] == 2_000_000 and 0.0 < out["token_hit_rate"] < 1.0


def test_cli_text_output_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n'
        '{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [1, 3]}\n'
    )
    assert cache_main(["--engine", "sglang", "--trace", str(trace), "--pool-tokens", "5000"]) == 0
    out = capsys.readouterr().out
    assert "sglang block 1 pool 5000 tokens" in out and "token hit rate 0.4267" in out  # 512 of 1200
    trace.write_text('{"timestamp": 0}\n')
    assert cache_main(["--engine", "vllm", "--trace", str(trace), "--pool-tokens", "5000"]) == 2
    assert "t.jsonl:1: missing field(s)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cache_main(["--engine", "vllm", "--trace", str(trace), "--pool-tokens", "5000", "--no-partial-reuse"])
    assert "apply to --engine trtllm only" in capsys.readouterr().err


def test_cli_replays_a_workload_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cache_main(
            [
                "--engine",
                "vllm",
                "--workload",
                "rag",
                "--requests",
                "200",
                "--pool-tokens",
                "1000000",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == 200 and out["token_hit_rate"] > 0.5

"""The twin engine's behaviour: the field-notes effects, OOM, preemption, determinism, the API."""

from __future__ import annotations

import json
import math
import random

import pytest

from prefixtune.engines.base import EngineName, KnobConfig, ParsedCommand
from prefixtune.twin.cache.base import Match
from prefixtune.twin.engine import TwinEngine
from prefixtune.twin.memory import StartupOOM
from prefixtune.twin.observer import NullObserver
from prefixtune.twin.prompt import Segment, TokenSeq, chain_key
from prefixtune.twin.request import Request
from prefixtune.twin.run import SimOptions, parse_command, simulate
from prefixtune.twin.summary import GoodputSlo

M8 = "meta-llama/Llama-3.1-8B-Instruct"


def make_requests(
    n: int,
    rate: float | None,
    *,
    groups: int = 0,
    shared: int = 0,
    unique: int = 100,
    output: int = 100,
    seed: int = 0,
) -> list[Request]:
    """Poisson arrivals (all at 0 when ``rate`` is None); a shared prefix from ``groups`` groups."""
    rng = random.Random(seed)
    t = 0.0
    out: list[Request] = []
    for i in range(n):
        if rate is not None:
            t += rng.expovariate(rate)
        segs = []
        if groups and shared:
            segs.append(Segment(chain_key(0, "system", rng.randrange(groups)), shared))
        key = chain_key(0, "user", seed, i)
        segs += [Segment(key, unique), Segment(chain_key(key, "out"), output)]
        prompt = (shared if groups else 0) + unique
        out.append(Request(i, t, TokenSeq(tuple(segs)), prompt, output))
    return out


# --- the field-notes effects ---------------------------------------------------------------------


def test_decode_bound_caching_cuts_ttft_not_throughput() -> None:
    reqs = make_requests(400, 3.0, groups=4, shared=1500, unique=100, output=800)
    on = simulate("vllm", [], "H100", reqs, SimOptions(model=M8, warmup_s=30, horizon_s=90))
    off = simulate(
        "vllm", ["--no-enable-prefix-caching"], "H100", reqs, SimOptions(model=M8, warmup_s=30, horizon_s=90)
    )
    assert on.status == off.status == "ok"
    assert on.hit_rate > 0.8 and off.hit_rate == 0.0
    assert on.ttft_p50_s <= 0.6 * off.ttft_p50_s  # >= 40% lower
    assert on.output_tokens_per_s == pytest.approx(off.output_tokens_per_s, rel=0.05)


def test_prefill_bound_caching_raises_requests_per_second() -> None:
    reqs = make_requests(600, 40.0, groups=4, shared=4000, unique=200, output=16)
    on = simulate("vllm", [], "H100", reqs, SimOptions(model=M8, warmup_s=3, horizon_s=13))
    off = simulate(
        "vllm", ["--no-enable-prefix-caching"], "H100", reqs, SimOptions(model=M8, warmup_s=3, horizon_s=13)
    )
    assert on.requests_per_s >= 1.5 * off.requests_per_s
    assert on.prefill_tokens_saved_fraction > 0.8 and off.prefill_tokens_saved_fraction == 0.0


def test_memory_fraction_trade_off_then_runtime_oom() -> None:
    # decode-bound and KV-bound (a queue that never empties): the batch grows with the pool, while
    # the memory left for activations shrinks
    reqs = make_requests(1500, 60.0, unique=1500, output=300)
    fractions = (0.85, 0.9, 0.95, 0.97, 0.98, 0.985, 0.99, 0.993)
    runs = {
        u: simulate(
            "vllm",
            ["--gpu-memory-utilization", str(u), "--max-num-batched-tokens", "4096"],
            "H100",
            reqs,
            SimOptions(model=M8, warmup_s=10, horizon_s=25),
        )
        for u in fractions
    }
    assert [runs[u].status for u in fractions[-2:]] == ["oom_runtime", "oom_runtime"]
    assert "out of memory" in runs[0.99].error
    ok = [u for u in fractions if runs[u].status == "ok"]
    assert ok == list(fractions[: len(ok)])  # OOM only at the high end
    assert runs[0.85].mean_running < runs[0.95].mean_running  # more pool, bigger batch...
    best = max(ok, key=lambda u: runs[u].output_tokens_per_s)
    assert runs[best].output_tokens_per_s > 1.05 * runs[0.85].output_tokens_per_s
    # ...but before the OOM the highest fractions that still run are slower than the best one
    assert best < ok[-1]
    assert runs[ok[-1]].output_tokens_per_s < 0.95 * runs[best].output_tokens_per_s


def test_oom_startup_summary() -> None:
    s = simulate(
        "vllm", [], "H100", make_requests(5, 1.0), SimOptions(model="meta-llama/Llama-3.3-70B-Instruct")
    )
    assert s.status == "oom_startup" and "do not fit" in s.error
    assert s.requests == 0 and s.output_tokens_per_s == 0.0
    with pytest.raises(StartupOOM):
        TwinEngine(parse_command("vllm", [], model="llama-3.3-70b-fp8"), "H100")


def test_preemption_when_the_pool_is_tiny() -> None:
    reqs = make_requests(64, None, unique=500, output=500)
    argv = ["--gpu-memory-utilization", "0.25", "--max-model-len", "4096"]
    s = simulate("vllm", argv, "H100", reqs, SimOptions(model=M8))
    assert s.status == "ok" and s.kv_pool_tokens < 30_000
    assert s.preemptions > 0
    assert s.finished == 64  # every preempted request is recomputed and completes


def test_guaranteed_no_evict_never_preempts_but_max_utilization_does() -> None:
    reqs = make_requests(64, None, unique=500, output=500)
    base = parse_command("trtllm", [], model=M8)
    small = {**base.options, "max_model_len": 2048}
    results = {}
    for policy in ("guaranteed_no_evict", "max_utilization"):
        parsed = ParsedCommand(
            EngineName.TRTLLM,
            M8,
            base.config.with_(memory_fraction=0.02, schedule_policy=policy),
            8000,
            options=small,
        )
        results[policy] = simulate("trtllm", parsed, "H100", reqs)
    assert results["guaranteed_no_evict"].preemptions == 0
    assert results["max_utilization"].preemptions > 0
    assert all(r.finished == 64 for r in results.values())


@pytest.mark.parametrize(
    ("engine", "argv"),
    [
        ("vllm", []),
        ("vllm", ["--block-size", "64", "--no-enable-chunked-prefill"]),
        ("sglang", []),
        ("sglang", ["--schedule-policy", "lpm", "--page-size", "16"]),
        ("sglang", ["--schedule-policy", "dfs-weight"]),
        ("sglang", ["--schedule-policy", "lof"]),
        ("sglang", ["--schedule-policy", "random"]),
        ("trtllm", []),
    ],
)
def test_engines_and_policies_serve_a_shared_prefix_workload(engine: str, argv: list[str]) -> None:
    reqs = make_requests(150, 30.0, groups=3, shared=1000, unique=50, output=50)
    s = simulate(engine, argv, "H100", reqs, SimOptions(model=M8, seed=3))
    assert s.status == "ok" and s.finished == 150 and s.rejected == 0
    assert s.hit_rate > 0.5
    assert 0 < s.ttft_p50_s <= s.ttft_p99_s
    assert s.itl_p50_s > 0 and s.output_tokens_per_s > 0


def test_lpm_serves_cached_prefixes_first() -> None:
    # a burst from 20 prefix groups (under lpm's 128-request limit): once a group's prefix is cached,
    # lpm runs the rest of that group first, so less prefill waits in front of the average request
    reqs = make_requests(120, None, groups=20, shared=3000, unique=20, output=20, seed=1)
    fcfs = simulate("sglang", ["--max-running-requests", "8"], "H100", reqs, SimOptions(model=M8))
    lpm = simulate(
        "sglang",
        ["--max-running-requests", "8", "--schedule-policy", "lpm"],
        "H100",
        reqs,
        SimOptions(model=M8),
    )
    assert lpm.ttft_p50_s < 0.9 * fcfs.ttft_p50_s


def test_sglang_reads_its_fraction_and_tp2_runs() -> None:
    reqs = make_requests(40, 10.0, output=50)
    s = simulate("sglang", ["--tp-size", "2"], "H100", reqs, SimOptions(model="llama-3.3-70b-fp8"))
    assert s.status == "ok" and s.setup["tp"] == 2 and s.finished == 40


# --- determinism, summary, API -------------------------------------------------------------------


def test_same_seed_same_summary() -> None:
    from prefixtune.twin.workloads import generate

    reqs = generate("chatbot", rate=10, duration_s=12, seed=5)
    a = simulate(
        "sglang",
        ["--schedule-policy", "random"],
        "H100",
        reqs,
        SimOptions(model=M8, seed=5, slo=GoodputSlo(ttft_s=0.5)),
    )
    b = simulate(
        "sglang",
        ["--schedule-policy", "random"],
        "H100",
        reqs,
        SimOptions(model=M8, seed=5, slo=GoodputSlo(ttft_s=0.5)),
    )
    assert a.without_wall() == b.without_wall()
    data = a.to_dict()
    json.dumps(data)  # plain Python only
    for key in (
        "status",
        "requests",
        "sim_seconds",
        "wall_seconds",
        "hit_rate",
        "prefill_tokens_saved_fraction",
        "ttft_p50_s",
        "ttft_p99_s",
        "itl_p50_s",
        "itl_p99_s",
        "output_tokens_per_s",
        "input_tokens_per_s",
        "requests_per_s",
        "goodput_tokens_per_s",
        "mean_running",
        "max_running",
        "kv_usage_mean",
        "kv_pool_tokens",
        "preemptions",
        "gpu_busy_fraction",
    ):
        assert key in data
        assert type(data[key]) in (int, float, str)
    assert 0 < data["goodput_tokens_per_s"] <= data["output_tokens_per_s"]
    assert data["setup"]["engine"] == "sglang" and data["setup"]["config"]["schedule_policy"] == "random"


class _Recorder(NullObserver):
    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []
        self.tokens_total = 0
        self.busy = 0.0
        self.last = 0.0

    def admitted(self, req: Request, match: Match, now: float) -> None:
        self.events.append(("admitted", req.req_id, round(now, 9)))
        self._mono(now)

    def first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self.events.append(("first", req.req_id, round(now, 9)))
        self.tokens_total += 1
        self._mono(now)

    def tokens(self, gap_s: float, count: int, now: float) -> None:
        assert gap_s > 0 and count > 0
        self.tokens_total += count
        self._mono(now)

    def finished(
        self, req: Request, now: float, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        assert e2e_s == pytest.approx(queue_s + prefill_s + decode_s)
        assert min(queue_s, prefill_s, decode_s) >= 0
        self.events.append(("finished", req.req_id, round(now, 9)))
        self._mono(now)

    def step(
        self, now: float, duration_s: float, steps: int, prefill_tokens: int, decode_tokens: int
    ) -> None:
        self.busy += duration_s
        self._mono(now)

    def _mono(self, now: float) -> None:
        assert now >= self.last - 1e-12
        self.last = now


def test_incremental_api_matches_batch_and_is_split_invariant() -> None:
    reqs = make_requests(120, 20.0, groups=3, shared=600, unique=60, output=120, seed=2)
    parsed = parse_command("vllm", [], model=M8)

    def run(horizons: list[float]) -> tuple[_Recorder, TwinEngine]:
        rec = _Recorder()
        eng = TwinEngine(parsed, "H100", seed=1, observer=rec)
        for r in reqs:
            eng.submit(r)
        for h in horizons:
            eng.advance(h)
            assert eng.now >= h or eng.idle()
        eng.advance(math.inf)
        return rec, eng

    one, e1 = run([])
    many, e2 = run([0.5 * i for i in range(1, 40)])
    assert [e[:2] for e in one.events] == [e[:2] for e in many.events]
    assert one.events[-1][2] == pytest.approx(many.events[-1][2], rel=1e-9)
    assert one.tokens_total == sum(r.output_len for r in reqs) == e1.counters.generation_tokens
    assert e1.counters.busy_s == pytest.approx(one.busy)
    g = e2.gauges()
    assert g.running == 0 and g.waiting == 0 and g.status == "ok" and g.pool_tokens == e2.memory.pool_tokens


def test_engine_accepts_requests_submitted_while_running() -> None:
    eng = TwinEngine.from_argv("vllm", ["vllm", "serve", M8], gpu="H200")
    reqs = make_requests(30, 5.0, output=40)
    for r in reqs:
        eng.advance(r.arrival_s)
        eng.submit(r)
        assert eng.next_event_s() is not None
    eng.advance(math.inf)
    assert eng.idle() and eng.counters.finished == 30 and eng.status == "ok"


def test_bad_policy_and_options_are_rejected_with_the_allowed_values() -> None:
    parsed = ParsedCommand(EngineName.VLLM, M8, KnobConfig(0.9, 16, True, "lpm"), 8000)
    with pytest.raises(
        ValueError, match="schedule_policy 'lpm' is not modelled for vllm; allowed: fcfs, priority"
    ):
        TwinEngine(parsed, "H100")
    parsed = ParsedCommand(
        EngineName.VLLM, M8, KnobConfig(0.9, 16, True, "fcfs"), 8000, options={"max_running": 0}
    )
    with pytest.raises(ValueError, match="max_running"):
        TwinEngine(parsed, "H100")
    with pytest.raises(ValueError, match="tensor parallel size"):
        TwinEngine(ParsedCommand(EngineName.VLLM, M8, parsed.config, 8000, tensor_parallel=4), "H100")


def test_cli_run_json(capsys: pytest.CaptureFixture[str]) -> None:
    from prefixtune.cli import main

    rc = main(
        [
            "twin",
            "run",
            "--engine",
            "vllm",
            "--model",
            M8,
            "--gpu",
            "H100",
            "--workload",
            "rag",
            "--rate",
            "2",
            "--duration",
            "20",
            "--seed",
            "4",
            "--json",
            "--",
            "--gpu-memory-utilization",
            "0.85",
        ]
    )
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "ok" and data["setup"]["config"]["memory_fraction"] == 0.85
    assert data["setup"]["workload"]["workload"] == "rag" and data["hit_rate"] > 0.5


def test_cli_run_plain_output_is_rounded() -> None:
    from prefixtune.twin.cli import format_plain, format_plain_value, significant

    assert significant(20.449627481155982, 4) == "20.45"
    assert significant(0.013558493261516702, 4) == "0.01356"
    assert significant(12345.6, 4) == "12346" and significant(0.0, 4) == "0"
    assert format_plain_value("hit_rate", 0.6229030828638349) == "0.623"
    assert format_plain_value("prefill_tokens_saved_fraction", 0.62290308) == "0.623"
    assert format_plain_value("output_tokens_per_s", 188.805395284479) == "188.8"
    assert format_plain_value("kv_pool_tokens", 454048) == "454048"
    text = format_plain({"status": "ok", "ttft_p99_s": 0.039463263251105545, "setup": {"x": 1}})
    assert text.splitlines() == [
        "status                           ok",
        "ttft_p99_s                       0.03946",
    ]


def test_cli_run_plain_output_explains_gpu_busy_fraction() -> None:
    from prefixtune.twin.cli import PLAIN_LABELS, format_plain

    lines = format_plain({"gpu_busy_fraction": 0.9961234, "mean_running": 1.2}).splitlines()
    label, legend = PLAIN_LABELS["gpu_busy_fraction"]
    assert lines[0].split(maxsplit=2) == ["gpu_busy_fraction", "0.996", f"({label})"]
    assert lines[-1] == legend and "not load" in label and "mean_running" in legend
    assert format_plain({"mean_running": 1.2}).splitlines() == ["mean_running                     1.200"]


def test_cli_errors_name_the_problem(capsys: pytest.CaptureFixture[str]) -> None:
    from prefixtune.twin.cli import main

    assert main(["run", "--engine", "vllm", "--model", "gpt-x", "--gpu", "H100", "--workload", "qa"]) == 2
    assert "unknown model 'gpt-x'" in capsys.readouterr().err
    assert (
        main(["run", "--engine", "vllm", "--model", M8, "--gpu", "H100", "--workload", "qa", "--rate", "-1"])
        == 2
    )
    assert "--rate must be > 0" in capsys.readouterr().err
    assert main(["nope"]) == 2


class _Gaps(NullObserver):
    """Sums the inter-token gaps the engine reports, and each request's decode time."""

    def __init__(self) -> None:
        self.gap_sum = 0.0
        self.gaps = 0
        self.decode_sum = 0.0
        self.preempted_any = False

    def tokens(self, gap_s: float, count: int, now: float) -> None:
        self.gap_sum += gap_s * count
        self.gaps += count

    def finished(
        self, req: Request, now: float, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        self.decode_sum += decode_s

    def preempted(self, req: Request, now: float) -> None:
        self.preempted_any = True


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_inter_token_gaps_add_up_to_each_requests_decode_time(engine: str) -> None:
    # Arrivals while others decode: SGLang then runs prefill-only batches, and its decoding requests
    # wait through them; that wait is part of their next token's gap (as a client measures it).
    reqs = make_requests(80, 12.0, groups=2, shared=800, unique=400, output=60, seed=4)
    gaps = _Gaps()
    eng = TwinEngine(parse_command(engine, [], model=M8), "H100", seed=0, observer=gaps)
    eng.submit_all(reqs)
    eng.advance(math.inf)
    assert not gaps.preempted_any and eng.counters.finished == len(reqs)
    assert gaps.gaps == sum(r.output_len - 1 for r in reqs)
    assert gaps.gap_sum == pytest.approx(gaps.decode_sum, rel=1e-6)

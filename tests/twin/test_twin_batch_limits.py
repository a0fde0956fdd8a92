"""The batch limits in the twin: the step token budget and the running-request cap (issue 23).

Each test pins one effect as behaviour at a fixed load: the budget trades TTFT of long prompts
against ITL; the cap queues requests; the budget's activation peak shrinks the pool where the
engine profiles it before sizing the pool; each engine's start-up and API refusals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from prefixtune.engines.base import ArgsError
from prefixtune.twin.engine import TwinEngine
from prefixtune.twin.memory import StartupOOM
from prefixtune.twin.request import Request
from prefixtune.twin.run import SimOptions, simulate
from prefixtune.twin.summary import GoodputSlo
from prefixtune.twin.workloads import WorkloadSpec, generate, parse_workload

M8 = "meta-llama/Llama-3.1-8B-Instruct"
GPU = "H100-80GB"

# Long unique prompts, short answers (as docs/batch-limits/long-prompts.yaml, shorter)
LONG_PROMPTS: WorkloadSpec = parse_workload(
    {
        "name": "long-prompts",
        "prefixes": [{"name": "system", "length": 200}],
        "suffix": {"dist": "lognormal", "median": 6000, "sigma": 0.3, "min": 2000, "max": 16000},
        "output": {"dist": "lognormal", "median": 200, "sigma": 0.5, "min": 16, "max": 1024},
        "rate": 3.0,
        "duration_s": 40,
    }
)


def _run(engine: str, argv: Sequence[str], requests: Sequence[Request], seed: int = 0) -> dict[str, Any]:
    options = SimOptions(seed=seed, model=M8, slo=GoodputSlo(ttft_s=2.0, itl_s=0.15))
    return simulate(engine, list(argv), GPU, requests, options).to_dict()


def _long_prompts() -> list[Request]:
    return generate(LONG_PROMPTS, seed=0)


def _boot(engine: str, argv: Sequence[str]) -> TwinEngine:
    from prefixtune.engines import get_adapter

    adapter = get_adapter(engine)
    rendered = adapter.render(M8, adapter.default_config())
    return TwinEngine.from_argv(engine, [*rendered.argv, *argv], rendered.files, gpu=GPU)


# --- the token budget: TTFT against ITL --------------------------------------------------------------


def test_a_smaller_vllm_budget_raises_ttft_of_long_prompts_and_lowers_itl_p99() -> None:
    requests = _long_prompts()
    small = _run("vllm", ["--max-num-batched-tokens", "512"], requests)
    large = _run("vllm", ["--max-num-batched-tokens", "8192"], requests)
    assert small["status"] == large["status"] == "ok"
    assert small["finished"] == large["finished"] == len(requests)
    # a 6k-token prompt takes 12 steps at 512 tokens, one at 8192
    assert small["ttft_p50_s"] > 1.3 * large["ttft_p50_s"]
    # a decode step that carries an 8k-token chunk is slow: every running request's next token waits
    assert small["itl_p99_s"] < 0.5 * large["itl_p99_s"]


def test_sglang_decoding_waits_through_every_chunk_of_a_prompt() -> None:
    # Prefill batches run apart from decode batches (no --enable-mixed-chunk): a long prompt stalls
    # decoding for all its chunks in a row, so a smaller chunk cannot lower ITL p99 the way it does on
    # vLLM, where each chunk shares its step with the decodes.
    requests = _long_prompts()
    sglang = _run("sglang", ["--chunked-prefill-size", "1024"], requests)
    vllm = _run("vllm", ["--max-num-batched-tokens", "1024"], requests)
    assert sglang["status"] == vllm["status"] == "ok"
    assert sglang["itl_p99_s"] > 4 * vllm["itl_p99_s"]


def test_a_budget_too_small_for_the_prompts_falls_behind() -> None:
    # every step pays its fixed overhead for a few hundred tokens: prefill throughput drops below the
    # offered prompt tokens and the queue grows (the median TTFT goes past the SLO)
    requests = generate(LONG_PROMPTS, rate=4.0, seed=0)
    starved = _run("vllm", ["--max-num-batched-tokens", "256"], requests)
    enough = _run("vllm", ["--max-num-batched-tokens", "2048"], requests)
    assert starved["ttft_p50_s"] > 2.0 > enough["ttft_p50_s"]
    assert starved["goodput_tokens_per_s"] < 0.5 * enough["goodput_tokens_per_s"]


# --- the running cap -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "flag"),
    [("vllm", "--max-num-seqs"), ("sglang", "--max-running-requests"), ("trtllm", "--max_batch_size")],
)
def test_the_running_cap_queues_requests_when_it_binds(engine: str, flag: str) -> None:
    requests = generate("qa", rate=20.0, duration_s=20, seed=0)
    capped = _run(engine, [flag, "8"], requests)
    free = _run(engine, [], requests)
    assert capped["status"] == free["status"] == "ok"
    assert capped["max_running"] == 8 < free["max_running"]
    assert capped["ttft_p50_s"] > 5 * free["ttft_p50_s"]  # requests wait for a running slot


def test_the_running_cap_is_held_at_every_step() -> None:
    eng = _boot("vllm", ["--max-num-seqs", "3"])
    eng.submit_all(generate("qa", rate=50.0, duration_s=2, seed=1))
    waited = False
    while not eng.idle():
        eng.advance(eng.now + 0.05)
        g = eng.gauges()
        assert g.running <= 3
        waited = waited or (g.running == 3 and g.waiting > 0)
    assert waited


# --- activation memory and the pool ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "flag"), [("vllm", "--max-num-batched-tokens"), ("trtllm", "--max_num_tokens")]
)
def test_a_larger_budget_shrinks_the_pool_where_the_engine_profiles_it_first(engine: str, flag: str) -> None:
    # vLLM's profile run and TensorRT-LLM's dry run forward a full budget of tokens before the pool
    # is sized: their activation peak comes out of the pool.
    pools = [_boot(engine, [flag, str(b)]).memory.pool_tokens for b in (2048, 8192, 32768)]
    assert pools[0] > pools[1] > pools[2]
    per_token = _boot(engine, []).memory.act_per_token
    kv = _boot(engine, []).memory.kv_bytes_per_token
    # the pool loses (about) the activations of the extra tokens, in KV tokens
    assert pools[0] - pools[2] == pytest.approx((32768 - 2048) * per_token / kv, rel=0.1)


def test_sglang_keeps_activations_outside_the_fraction_so_the_chunk_leaves_the_pool_alone() -> None:
    pools = {_boot("sglang", ["--chunked-prefill-size", str(c)]).memory.pool_tokens for c in (2048, 16384)}
    assert len(pools) == 1


def test_sglang_refuses_to_start_when_the_fraction_leaves_too_little_for_the_chunk() -> None:
    fraction = ["--mem-fraction-static", "0.97"]
    assert _boot("sglang", [*fraction, "--chunked-prefill-size", "8192"]).status == "ok"
    with pytest.raises(StartupOOM, match=r"32768-token prefill; lower the fraction"):
        _boot("sglang", [*fraction, "--chunked-prefill-size", "32768"])
    # the same chunk starts with a lower fraction
    assert _boot("sglang", ["--mem-fraction-static", "0.9", "--chunked-prefill-size", "32768"]).status == "ok"


def test_a_tight_vllm_fraction_runs_out_of_memory_under_load_with_a_small_budget_only() -> None:
    # A larger budget profiles (reserves) more activation memory, which the running batch can use.
    requests = generate("qa", rate=40.0, duration_s=20, seed=0)
    tight = ["--gpu-memory-utilization", "0.99"]
    small = _run("vllm", [*tight, "--max-num-batched-tokens", "512"], requests)
    large = _run("vllm", [*tight, "--max-num-batched-tokens", "8192"], requests)
    assert small["status"] == "oom_runtime"
    assert large["status"] == "ok"


# --- what each engine refuses ----------------------------------------------------------------------


def test_vllm_without_chunked_prefill_takes_max_model_len_as_its_budget() -> None:
    eng = _boot("vllm", ["--no-enable-chunked-prefill", "--max-model-len", "16384"])
    assert eng.limits.max_batched_tokens == 16384
    assert not eng.limits.chunked_prefill


def test_vllm_refuses_a_budget_below_max_model_len_without_chunked_prefill() -> None:
    argv = ["--no-enable-chunked-prefill", "--max-model-len", "16384", "--max-num-batched-tokens", "8192"]
    with pytest.raises(ArgsError, match=r"max_num_batched_tokens \(8192\) is smaller than max_model_len"):
        _boot("vllm", argv)


def test_vllm_refuses_a_budget_below_an_explicit_running_cap_and_lowers_its_default() -> None:
    with pytest.raises(ArgsError, match=r"must be greater than or equal to max_num_seqs \(1024\)"):
        _boot("vllm", ["--max-num-batched-tokens", "512", "--max-num-seqs", "1024"])
    assert _boot("vllm", ["--max-num-batched-tokens", "512"]).max_running == 512  # min(1024, budget)


def test_trtllm_without_chunked_prefill_rejects_prompts_over_max_num_tokens() -> None:
    requests = _long_prompts()
    long = sum(1 for r in requests if r.prompt_len > 4096)
    assert 0 < long < len(requests)
    plain = _run("trtllm", ["--max_num_tokens", "4096"], requests)
    assert plain["rejected"] == long
    assert plain["finished"] == len(requests) - long
    chunked = _run("trtllm", ["--max_num_tokens", "4096", "--enable_chunked_prefill"], requests)
    assert chunked["rejected"] == 0 and chunked["finished"] == len(requests)


# --- determinism -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "argv"),
    [
        ("vllm", ["--max-num-batched-tokens", "1024", "--max-num-seqs", "64"]),
        ("sglang", ["--chunked-prefill-size", "2048", "--max-running-requests", "64"]),
        ("trtllm", ["--max_num_tokens", "2048", "--max_batch_size", "64", "--enable_chunked_prefill"]),
    ],
)
def test_the_same_limits_and_seed_give_the_same_summary(engine: str, argv: list[str]) -> None:
    requests = _long_prompts()
    first, second = _run(engine, argv, requests), _run(engine, argv, requests)
    first.pop("wall_seconds")
    second.pop("wall_seconds")
    assert first == second

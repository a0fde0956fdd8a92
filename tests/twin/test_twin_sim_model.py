"""The twin's static models: catalog, memory (pool sizes, start-up OOM) and the roofline cost model."""

from __future__ import annotations

import math
import random

import pytest

from prefixtune.twin.catalog import GIB, get_gpu, get_model
from prefixtune.twin.cost import DecodeRun, RooflineCost
from prefixtune.twin.memory import StartupOOM, plan_memory

M8 = "meta-llama/Llama-3.1-8B-Instruct"


# --- catalog ---------------------------------------------------------------------------------------


def test_models_by_hf_and_short_name() -> None:
    assert get_model(M8) is get_model("llama-3.1-8b")
    assert get_model("nvidia/Llama-3.1-8B-Instruct-FP8").weight_dtype == "fp8"
    assert get_model("NVIDIA/llama-3.3-70b-instruct-fp8").layers == 80
    assert get_model(M8).kv_bytes_per_token("auto") == 128 * 1024  # B1: 128 KiB/token
    assert get_model("llama-3.3-70b-fp8").kv_bytes_per_token("fp8") == 160 * 1024


def test_unknown_model_and_gpu_list_known_names() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'gpt-5'.*meta-llama/Llama-3.1-8B-Instruct"):
        get_model("gpt-5")
    with pytest.raises(ValueError, match=r"unknown gpu 'B200'.*H100-80GB.*H200.*A100-80GB"):
        get_gpu("B200")
    assert get_gpu("h100").name == "H100-80GB"
    assert get_gpu("A100").fp8_flops is None


# --- memory ----------------------------------------------------------------------------------------


def _pool(engine: str, model: str, gpu: str, u: float, tp: int = 1, kv: str = "auto", **kw: int) -> int:
    plan = plan_memory(
        engine, get_model(model), get_gpu(gpu), tp, u, 16, kv, kw.get("mbt", 8192), kw.get("max_len")
    )
    return plan.pool_tokens


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "kv", "u", "expected"),
    [
        # calibration B5 (vLLM): pool tokens at the given fraction
        (M8, "H100", 1, "auto", 0.90, 440_000),
        (M8, "H100", 1, "auto", 0.95, 473_000),
        (M8, "H200", 1, "auto", 0.90, 888_000),
        ("llama-3.3-70b-fp8", "H200", 1, "auto", 0.90, 177_000),
        ("llama-3.3-70b-fp8", "H100", 2, "fp8", 0.90, 437_000),
    ],
)
def test_vllm_pool_matches_calibration_table(
    model: str, gpu: str, tp: int, kv: str, u: float, expected: int
) -> None:
    got = _pool("vllm", model, gpu, u, tp, kv, max_len=32_768)
    assert got == pytest.approx(expected, rel=0.05)


def test_each_engine_reads_the_fraction_its_own_way() -> None:
    model, gpu = get_model(M8), get_gpu("H100")
    kappa = model.kv_bytes_per_token("auto")
    sg = plan_memory("sglang", model, gpu, 1, 0.9, 1, "auto", 8192, None)
    free = gpu.memory_bytes - 0.5 * GIB
    assert sg.pool_bytes == pytest.approx(0.9 * free - model.weight_bytes)  # (weights + KV) share
    trt = plan_memory("trtllm", model, gpu, 1, 0.9, 32, "auto", 8192, None)
    vl = plan_memory("vllm", model, gpu, 1, 0.9, 16, "auto", 8192, None)
    # TRT-LLM: 0.9 of what is left after weights and the activation peak
    peak = model.weight_bytes + 0.35 * GIB + trt.act_per_token * 8192 + (64 + 32 * 12) * 1024**2
    assert trt.pool_bytes == pytest.approx(0.9 * (free - peak))
    # vLLM's 0.9 also covers activations and graphs: the smallest pool of the three
    assert min(trt.pool_tokens, sg.pool_tokens) > vl.pool_tokens
    assert vl.pool_tokens == pytest.approx(440_000, rel=0.03)
    assert sg.num_blocks == int(sg.pool_bytes // kappa)


def test_vllm_activation_peak_grows_with_the_token_budget() -> None:
    small = _pool("vllm", M8, "H100", 0.9, mbt=2048)
    large = _pool("vllm", M8, "H100", 0.9, mbt=32768)
    assert small > large


def test_startup_oom_when_weights_do_not_fit() -> None:
    with pytest.raises(StartupOOM, match="do not fit"):
        _pool("vllm", "meta-llama/Llama-3.3-70B-Instruct", "H100", 0.9)  # 141 GB BF16 on 80 GB
    with pytest.raises(StartupOOM, match="do not fit"):
        _pool("trtllm", "meta-llama/Llama-3.3-70B-Instruct", "H100", 0.9)
    with pytest.raises(StartupOOM, match="no memory left for the KV cache"):
        _pool("vllm", "meta-llama/Llama-3.3-70B-Instruct", "H200", 0.9)  # 0.9 * 140 GiB < weights
    assert _pool("vllm", "meta-llama/Llama-3.3-70B-Instruct", "H200", 0.9, tp=2, max_len=32768) > 300_000


def test_startup_oom_when_one_max_length_sequence_does_not_fit() -> None:
    # 70B FP8 on one H100: a pool of ~20k tokens cannot hold vLLM's default 128k max_model_len
    with pytest.raises(StartupOOM, match="max seq len"):
        _pool("vllm", "llama-3.3-70b-fp8", "H100", 0.95)
    assert 5_000 < _pool("vllm", "llama-3.3-70b-fp8", "H100", 0.95, max_len=4096) < 40_000


def test_startup_oom_when_the_fraction_exceeds_free_memory_or_leaves_no_pool() -> None:
    with pytest.raises(StartupOOM, match="free memory on device"):
        _pool("vllm", M8, "H100", 0.999)
    with pytest.raises(StartupOOM, match="no memory left for the KV cache"):
        _pool("vllm", M8, "H100", 0.2)
    with pytest.raises(StartupOOM, match="no memory left for the KV cache"):
        _pool("sglang", M8, "H100", 0.18)


def test_high_fractions_shrink_the_activation_budget() -> None:
    model, gpu = get_model(M8), get_gpu("H100")
    budgets = [
        plan_memory("vllm", model, gpu, 1, u, 16, "auto", 8192, None).activation_budget for u in (0.9, 0.99)
    ]
    assert budgets[0] > 2 * budgets[1]
    tight = plan_memory("vllm", model, gpu, 1, 0.99, 16, "auto", 8192, None)
    assert tight.pressure(8192, 0) < 1.0  # the profiled prefill step always fits...
    assert tight.pressure(256, 1024) > 1.0  # ...a big running batch does not
    assert tight.step_penalty(0.5) == 1.0 and tight.step_penalty(0.95) > 1.2


# --- cost ------------------------------------------------------------------------------------------


def _cost(
    model: str = M8, gpu: str = "H100", tp: int = 1, kv: str = "auto", engine: str = "vllm"
) -> RooflineCost:
    # The roofline (section C) stays the fallback where no measured kernels exist; its own figures.
    return RooflineCost.for_engine(engine, get_model(model), get_gpu(gpu), tp, kv, 16)


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "kv", "batch", "ctx", "table_ms"),
    [
        # calibration section C table ("dec" columns)
        (M8, "H100", 1, "auto", 1, 2048, 7.2),
        (M8, "H100", 1, "auto", 32, 2048, 11.4),
        (M8, "H100", 1, "auto", 128, 2048, 24.2),
        (M8, "H200", 1, "auto", 128, 2048, 17.3),
        ("llama-3.3-70b-fp8", "H100", 2, "auto", 32, 2048, 23.2),
        ("llama-3.3-70b-fp8", "H200", 1, "fp8", 128, 2048, 34.8),
    ],
)
def test_decode_step_matches_section_c(
    model: str, gpu: str, tp: int, kv: str, batch: int, ctx: int, table_ms: float
) -> None:
    c = _cost(model, gpu, tp, kv)
    t = c.step_time(batch, batch, batch * ctx, batch * (ctx - 0.5))
    assert t * 1e3 == pytest.approx(table_ms, rel=0.06)


def test_prefill_ttft_cold_and_warm_match_section_c() -> None:
    c = _cost()
    read, pairs = c.prefill_chunk(2000, 0)
    cold = c.step_time(1, 2000, read, pairs)
    read, pairs = c.prefill_chunk(100, 1900)
    warm = c.step_time(1, 100, read, pairs)
    assert cold * 1e3 == pytest.approx(64, rel=0.05)
    assert warm * 1e3 == pytest.approx(7, rel=0.1)
    assert c.host_transfer_time(1000) * 1e3 == pytest.approx(2.6, rel=0.05)  # PCIe, 8B BF16


def test_decode_run_closed_form_equals_the_step_sum() -> None:
    rng = random.Random(7)
    for _ in range(300):
        run = DecodeRun(
            rng.uniform(0, 2),
            rng.uniform(0, 5),
            rng.uniform(0.0, 0.2),
            rng.uniform(0, 5),
            rng.uniform(0.0, 0.2),
        )
        k = rng.randrange(0, 60)
        assert run.total(k) == pytest.approx(sum(run.step(j) for j in range(k)), rel=1e-9, abs=1e-9)
        deadline = rng.uniform(0, 100)
        n = run.steps_until(deadline)
        assert n >= 1
        if deadline > 0:
            assert run.total(n) >= deadline
            assert n == 1 or run.total(n - 1) < deadline


def test_real_decode_run_matches_step_time() -> None:
    c = _cost()
    batch, read0 = 64, 64 * 1500
    run = c.decode_run(batch, read0)
    for j in (0, 10, 500):
        read = read0 + j * batch
        assert run.step(j) == pytest.approx(c.step_time(batch, batch, read, read - batch / 2), rel=1e-12)
    assert math.isclose(run.total(3), run.step(0) + run.step(1) + run.step(2))


def test_a100_runs_fp8_checkpoints_as_weight_only_fp8() -> None:
    a100, h100 = get_gpu("A100-80GB"), get_gpu("H100")
    assert a100.peak_flops("fp8") == a100.peak_flops("bf16") == 312e12  # no FP8 tensor cores: BF16 compute
    assert h100.peak_flops("fp8") == pytest.approx(2 * h100.peak_flops("bf16"), rel=0.01)
    fp8 = "nvidia/Llama-3.1-8B-Instruct-FP8"
    on_a100 = RooflineCost.for_engine("vllm", get_model(fp8), a100, 1, "auto", 16)
    assert on_a100.t_weights == pytest.approx(8.0e9 / 0.8 / 2.0e12)  # FP8 bytes streamed
    assert _pool("vllm", fp8, "A100", 0.9) > _pool("vllm", M8, "A100", 0.9)  # FP8 weights leave more KV


def test_vllm_batch_defaults_follow_the_gpu() -> None:
    from prefixtune.twin.engine import engine_limits
    from prefixtune.twin.run import parse_command

    parsed = parse_command("vllm", [], model=M8)
    h100 = engine_limits(parsed, get_gpu("H100"), get_model(M8))
    a100 = engine_limits(parsed, get_gpu("A100"), get_model(M8))
    assert (h100.max_running, h100.max_batched_tokens) == (1024, 8192)  # engines.md 1.1b
    assert (a100.max_running, a100.max_batched_tokens) == (256, 2048)
    trt = engine_limits(parse_command("trtllm", [], model=M8), get_gpu("H100"), get_model(M8))
    assert (trt.max_running, trt.max_batched_tokens, trt.chunked_prefill) == (2048, 8192, False)

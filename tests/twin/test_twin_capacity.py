"""The twin calibrated to a window predicts a config's capacity (twin/capacity.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from prefixtune.engines import get_adapter
from prefixtune.twin.arrivals import Arrivals
from prefixtune.twin.capacity import (
    MIN_CV,
    CapacityError,
    CapacityModel,
    WindowStats,
    WorkloadSample,
    arrival_cv,
    bin_counts,
    predict_capacity,
    synthetic_workload,
)
from prefixtune.twin.summary import GoodputSlo
from prefixtune.twin.workloads import generate

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
GPU = "H100-80GB"
QUICK = CapacityModel(seeds=(7,), warmup_s=30.0, window_s=90.0, refine=2)


def stats(**kw: float) -> WindowStats:
    base = {
        "rate_rps": 1.0, "prompt_p50": 2000.0, "prompt_p90": 4000.0, "output_p50": 150.0,
        "output_p90": 300.0, "prefill_reduction": 0.5,
    }  # fmt: skip
    base.update(kw)
    return WindowStats(**base)


def test_the_synthetic_workload_has_the_windows_quantiles_and_shared_share() -> None:
    st = stats()
    wl = synthetic_workload(st)
    reqs = generate(wl, rate=20.0, duration_s=300.0, seed=3)
    prompts = np.array([r.prompt_len for r in reqs], float)
    outputs = np.array([r.output_len for r in reqs], float)
    assert np.percentile(prompts, 50) == pytest.approx(st.prompt_p50, rel=0.08)
    assert np.percentile(prompts, 90) == pytest.approx(st.prompt_p90, rel=0.08)
    assert np.percentile(outputs, 50) == pytest.approx(st.output_p50, rel=0.08)
    assert np.percentile(outputs, 90) == pytest.approx(st.output_p90, rel=0.08)
    # one shared prefix as long as the saved share of a mean prompt
    (pool,) = wl.prefixes
    shared = pool.length.value
    assert shared is not None and shared / prompts.mean() == pytest.approx(0.5, rel=0.08)
    assert wl.arrival.process == "poisson"
    assert synthetic_workload(stats(prefill_reduction=0.0)).prefixes == ()
    paced = synthetic_workload(stats(arrival_cv=0.3)).arrival
    assert (paced.process, paced.cv) == ("bursty", 0.3)


def test_arrival_cv_reads_a_scrape_intervals_counts() -> None:
    def cv_of(process: Arrivals, seed: int) -> float:
        times = process.times(4.0, 600.0, np.random.default_rng(seed))
        return arrival_cv(bin_counts(times, 0.0, 600.0))

    poisson = [cv_of(Arrivals(), s) for s in range(10)]
    paced = [cv_of(Arrivals("bursty", cv=0.3), s) for s in range(10)]
    assert 0.8 < float(np.median(poisson)) < 1.2
    assert float(np.median(paced)) < 0.5
    clockwork = [i * 0.25 for i in range(2400)]
    assert arrival_cv(bin_counts(clockwork, 0.0, 600.0)) == MIN_CV
    assert bin_counts([1.0, 2.0, 16.0, 31.0], 0.0, 30.0) == [2, 1]  # whole intervals only
    assert arrival_cv([2, 1]) == 1.0  # too few intervals to tell


def test_the_workloads_statistics_pool_over_its_windows() -> None:
    wl = synthetic_workload(stats())
    first = generate(wl, rate=2.0, duration_s=400.0, seed=5)
    second = generate(wl, rate=2.0, duration_s=400.0, seed=6)
    sample = WorkloadSample()
    with pytest.raises(CapacityError, match="no request arrived"):
        sample.stats(0.4)
    sample.add(first, 100.0, 400.0)
    sample.add(second, 100.0, 400.0)
    inside = [r for reqs in (first, second) for r in reqs if 100.0 <= r.arrival_s < 400.0]
    st = sample.stats(0.4)
    assert st.rate_rps == pytest.approx(len(inside) / 600.0)
    assert len(sample.counts) == 40  # 20 scrape intervals a window
    assert st.prompt_p50 <= st.prompt_p90 and st.output_p50 <= st.output_p90
    assert st.prefill_reduction == 0.4  # the config's own; the rest is the workload's


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"rate_rps": 0.0}, "rate_rps"),
        ({"prompt_p90": 100.0}, "90th percentile"),
        ({"prefill_reduction": 1.0}, "prefill_reduction"),
        ({"arrival_cv": 0.0}, "arrival_cv"),
    ],
)
def test_window_stats_refuse_what_no_window_shows(bad: dict[str, float], message: str) -> None:
    with pytest.raises(CapacityError, match=message):
        stats(**bad)


def _predict(budget: int, st: WindowStats, slo: GoodputSlo, model: CapacityModel = QUICK) -> float:
    adapter = get_adapter("vllm")
    cfg = adapter.normalize(adapter.default_config().with_(max_batched_tokens=budget, memory_fraction=0.9))
    cmd = adapter.render(MODEL, cfg)
    return predict_capacity("vllm", cmd.argv, GPU, slo, st, files=cmd.files, model=model)


def test_capacity_is_where_the_slos_stop_holding_and_is_deterministic() -> None:
    st = stats(rate_rps=0.5, prompt_p50=6000.0, prompt_p90=9000.0, output_p50=60.0, output_p90=120.0)
    loose = _predict(8192, st, GoodputSlo(ttft_s=3.0, itl_s=0.1))
    tight = _predict(8192, st, GoodputSlo(ttft_s=0.5, itl_s=0.1))
    assert 1.0 < loose <= QUICK.top
    assert tight < loose  # a tighter TTFT SLO is met at less load
    assert _predict(8192, st, GoodputSlo(ttft_s=3.0, itl_s=0.1)) == loose  # fixed seeds: the same answer
    # a window already past what the config carries: no headroom
    assert _predict(8192, replace(st, rate_rps=40.0), GoodputSlo(ttft_s=3.0, itl_s=0.1)) == 1.0


def test_a_smaller_token_budget_carries_more_short_answers_behind_long_prompts() -> None:
    # vllm-rag-long-itl's mechanism: each long prompt's chunks slow the decodes in the same steps;
    # smaller chunks keep a short answer's time per token within a tight ITL SLO at more load
    st = stats(rate_rps=0.6, prompt_p50=12000.0, prompt_p90=13500.0, output_p50=60.0, output_p90=110.0,
               prefill_reduction=0.2)  # fmt: skip
    slo = GoodputSlo(ttft_s=3.0, itl_s=0.02)
    fine = CapacityModel(seeds=(7,), warmup_s=60.0, window_s=240.0, step=1.1)
    small, large = _predict(2048, st, slo, fine), _predict(8192, st, slo, fine)
    assert math.isfinite(small) and small > large * 1.05  # 1.63 vs 1.48

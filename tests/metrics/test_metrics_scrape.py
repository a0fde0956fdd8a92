"""ScrapeSource: window signals from scrape deltas, per engine, with restarts, over real HTTP."""

from __future__ import annotations

import bisect
import math

import pytest
from tests.metrics.conftest import (
    ITL_BUCKETS,
    TTFT_BUCKETS,
    Pods,
    SyntheticEngine,
    ground_truth,
    true_quantile,
)

from prefixtune.engines.base import EngineName
from prefixtune.metrics.exposition import Matcher, Snapshot, parse, total_of
from prefixtune.metrics.histogram import Slo
from prefixtune.metrics.recipe import for_engine
from prefixtune.metrics.scrape_source import ScrapeSource, gpu_utilization, increases, window_signals

ENGINES = list(EngineName)


def text(value: float, created: float, extra: str = "") -> str:
    return (
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        f'vllm:prefix_cache_hits_total{{model_name="m"}} {value}\n'
        f'vllm:prefix_cache_hits_created{{model_name="m"}} {created}\n' + extra
    )


KEY = ("vllm:prefix_cache_hits_total", frozenset({("model_name", "m")}))


def test_counter_increase_chains_through_scrapes() -> None:
    snaps = [parse(text(v, 100.0), target="p", t=t) for t, v in ((0, 10), (1, 15), (2, 40))]
    inc = increases(snaps)
    assert inc is not None and not inc.restarted
    assert inc.values[KEY] == 30
    assert increases(snaps[:1]) is None


def test_decrease_is_a_reset_and_the_post_reset_value_is_the_increase() -> None:
    snaps = [parse(text(v, 100.0), target="p", t=t) for t, v in ((0, 10), (1, 50), (2, 5), (3, 9))]
    inc = increases(snaps)
    assert inc is not None and inc.restarted
    assert inc.values[KEY] == 40 + 5 + 4


def test_changed_created_timestamp_is_a_reset_even_without_a_decrease() -> None:
    a = parse(text(10, 100.0), target="p", t=0)
    b = parse(text(12, 200.0), target="p", t=1)  # a new process already counted 12 since it started
    inc = increases([a, b])
    assert inc is not None and inc.restarted and inc.values[KEY] == 12


def test_series_created_inside_the_window_count_from_zero_and_nan_is_dropped() -> None:
    a = parse(text(1, 100.0), target="p", t=0)
    extra = '# TYPE x counter\nx_total{mode="a"} 7\n# TYPE g gauge\ng NaN\n'
    b = parse(text(1, 100.0, extra), target="p", t=1)
    inc = increases([a, b])
    assert inc is not None
    assert inc.values[("x_total", frozenset({("mode", "a")}))] == 7
    assert not b.has("g")


def test_bad_exposition_names_the_target() -> None:
    with pytest.raises(ValueError, match="pod-7"):
        parse("this is { not metrics", target="pod-7", t=0)


def test_label_matchers() -> None:
    snap = parse('# TYPE c counter\nc_total{mode="device_hit"} 3\nc_total{mode="input"} 5\n', target="p", t=0)
    assert total_of(snap, "c_total", [Matcher("mode", "=~", ".*_hit")]) == 3
    assert total_of(snap, "c_total", [Matcher("mode", "!~", ".*_hit")]) == 5
    assert total_of(snap, "c_total", [Matcher("mode", "!=", "input")]) == 3
    assert total_of(snap, "c_total") == 8
    assert total_of(snap, "missing_total") is None
    with pytest.raises(ValueError, match="op must be one of"):
        Matcher("mode", "==", "x")
    with pytest.raises(ValueError, match="bad regex"):
        Matcher("mode", "=~", "(")


def drive(engines: list[SyntheticEngine], t0: float, t1: float, step: float = 0.05) -> None:
    n = round((t1 - t0) / step)
    for i in range(1, n + 1):
        for e in engines:
            e.tick(t0 + i * step)


def scrape(engines: list[SyntheticEngine], t: float) -> dict[str, Snapshot]:
    return {e.pod: parse(e.exposition().decode(), target=e.pod, t=t) for e in engines}


def in_bucket_or_next(estimate: float | None, true: float, bounds: tuple[float, ...]) -> bool:
    """The estimate is within one bucket of the true quantile's bucket."""
    assert estimate is not None
    grid = (*bounds, math.inf)
    return abs(bisect.bisect_left(grid, estimate) - bisect.bisect_left(grid, true)) <= 1


@pytest.mark.parametrize("engine", ENGINES)
def test_window_signals_match_ground_truth_per_engine(engine: EngineName) -> None:
    engines = [SyntheticEngine(engine, f"p{i}", seed=i, rate=40.0, hit_share=0.3 + 0.4 * i) for i in range(2)]
    for e in engines:
        e.tick(0.0)
    drive(engines, 0.0, 2.0)
    chains: dict[str, list[Snapshot]] = {e.pod: [] for e in engines}
    previous = 2.0
    for t in (2.0, 4.0, 6.0, 12.0):
        drive(engines, previous, t)
        previous = t
        for pod, snap in scrape(engines, t).items():
            chains[pod].append(snap)
    win = window_signals(for_engine(engine), chains, slo=Slo(ttft_p99_s=0.5, itl_p99_s=0.05))
    truth = ground_truth(engines, 2.0, 12.0)
    s = win.signals
    assert s.window_s == pytest.approx(10.0)
    assert s.requests == truth["requests"]
    assert s.hit_rate == pytest.approx(truth["hit_rate"], rel=1e-9)
    assert s.prefill_reduction == pytest.approx(truth["prefill_reduction"], rel=1e-9)
    for key in ("requests_per_s", "input_tokens_per_s", "output_tokens_per_s"):
        assert getattr(s, key) == pytest.approx(truth[key], rel=1e-9), key
    for q, key in ((0.5, "ttft_p50_s"), (0.9, "ttft_p90_s"), (0.99, "ttft_p99_s")):
        assert in_bucket_or_next(getattr(s, key), true_quantile(truth["ttft"], q), TTFT_BUCKETS), key
    for q, key in ((0.5, "itl_p50_s"), (0.99, "itl_p99_s")):
        assert in_bucket_or_next(getattr(s, key), true_quantile(truth["itl"], q), ITL_BUCKETS), key
    # gauges at the scrapes (t = 2, 4, 6, 12 s): running 10, 8, 10, 8 on both pods
    assert s.running_mean == pytest.approx(9.0) and s.running_max == 10
    assert s.kv_usage_mean == pytest.approx(0.55) and s.waiting_mean == 0
    assert s.slo_attainment is not None and 0 < s.slo_attainment < 1
    assert s.goodput_tokens_per_s == pytest.approx(s.output_tokens_per_s * s.slo_attainment)
    # the ITL test is per request, as goodput defines it: each request's mean time per token, from
    # the per-request histogram (both SLOs sit on bucket bounds, so the shares are exact counts)
    ttft_ok = sum(x <= 0.5 for x in truth["ttft"]) / len(truth["ttft"])
    tpot_ok = sum(x <= 0.05 for x in truth["tpot"]) / len(truth["tpot"])
    assert s.slo_attainment == pytest.approx(ttft_ok * tpot_ok, rel=1e-9)
    if engine is EngineName.TRTLLM:
        assert s.preemptions_per_s is None and "preemptions_per_s" in s.missing()
        assert s.hit_rate != pytest.approx(s.prefill_reduction)  # blocks vs tokens
    else:
        assert s.preemptions_per_s == pytest.approx(truth["preemptions_per_s"], rel=1e-9)
    assert "gpu_util" in s.missing()  # no DCGM given: missing, not 0
    assert win.resets == ()


def test_idle_window_reports_missing_ratios_and_quantiles_not_zero() -> None:
    e = SyntheticEngine(EngineName.VLLM, "p0", seed=1, rate=0.0, hit_share=0.5)
    chains = {"p0": [parse(e.exposition().decode(), target="p0", t=t) for t in (0.0, 10.0)]}
    s = window_signals(for_engine(EngineName.VLLM), chains).signals
    assert s.requests == 0 and s.requests_per_s == 0
    for key in ("hit_rate", "prefill_reduction", "ttft_p50_s", "itl_p99_s"):
        assert getattr(s, key) is None and key in s.missing()


def test_target_with_one_scrape_is_noted_and_left_out() -> None:
    engines = [
        SyntheticEngine(EngineName.SGLANG, f"p{i}", seed=i, rate=30.0, hit_share=0.5) for i in range(2)
    ]
    for e in engines:
        e.tick(0.0)
    first = scrape(engines, 0.0)
    drive(engines, 0.0, 5.0)
    last = scrape(engines, 5.0)
    chains = {"p0": [first["p0"], last["p0"]], "p1": [last["p1"]]}
    win = window_signals(for_engine(EngineName.SGLANG), chains)
    assert any("p1" in n and "fewer than two" in n for n in win.notes)
    assert win.signals.requests == ground_truth(engines[:1], 0.0, 5.0)["requests"]


def dcgm_text(pod_label: str) -> str:
    return (
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-0",{pod_label}="a-0",namespace="ns"}} 80\n'
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-1",{pod_label}="b-0",namespace="ns"}} 20\n'
    )


def test_gpu_utilization_from_dcgm_percent_filtered_by_pod_label_variants() -> None:
    for label in ("pod", "exported_pod", "pod_name"):
        snaps = [parse(dcgm_text(label), target="dcgm", t=t) for t in (0.0, 1.0)]
        assert gpu_utilization(snaps, ["a-0"]) == pytest.approx(0.8)
        assert gpu_utilization(snaps, None) == pytest.approx(0.5)
        assert gpu_utilization(snaps, ["zzz"]) is None
    prof = '# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\nDCGM_FI_PROF_GR_ENGINE_ACTIVE{pod="a-0"} 0.42\n'
    both = parse(dcgm_text("pod") + prof, target="dcgm", t=0.0)
    assert gpu_utilization([both], ["a-0"]) == pytest.approx(0.42)  # the profiling ratio is preferred


class VirtualTime:
    """A clock for ScrapeSource whose sleep advances time and ticks the synthetic engines."""

    def __init__(self, engines: list[SyntheticEngine], restart_at: float | None = None) -> None:
        self.now = 1000.0
        self.engines = engines
        self.restart_at = restart_at
        for e in engines:
            e.tick(self.now)

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        end = self.now + seconds
        steps = max(1, round(seconds / 0.05))
        start = self.now
        for i in range(1, steps + 1):
            self.now = end if i == steps else start + i * seconds / steps
            if self.restart_at is not None and self.now > self.restart_at:
                self.engines[0].restart()  # a new process: its counters start again from 0
                self.restart_at = None
            for e in self.engines:
                e.tick(self.now)


async def test_scrape_source_over_http_with_a_restart_mid_window(pods: Pods) -> None:
    engines = [
        SyntheticEngine(EngineName.VLLM, f"vllm-{i}", seed=i, rate=30.0, hit_share=0.6) for i in range(2)
    ]
    for e in engines:
        pods.add(e)
    dcgm = pods.add_static(
        "dcgm", dcgm_text("pod").replace("a-0", "vllm-0").replace("b-0", "vllm-1").encode()
    )
    vt = VirtualTime(engines, restart_at=1004.0)
    source = ScrapeSource(
        "vllm", pods.urls, dcgm_urls=[dcgm], pods=["vllm-0", "vllm-1"], clock=vt.clock, slo=Slo(1.0, 0.1)
    )
    win = await source.measure(10.0, sample_every_s=1.0, sleep=vt.sleep)
    assert (win.start, win.end) == (1000.0, 1010.0)
    assert win.resets == ("vllm-0",)
    assert any("vllm-0" in n and "reset" in n for n in win.notes)
    truth = ground_truth(engines, 1000.0, 1010.0)
    s = win.signals
    assert s.requests == truth["requests"]
    assert s.hit_rate == pytest.approx(truth["hit_rate"], rel=1e-9)
    assert s.output_tokens_per_s == pytest.approx(truth["output_tokens_per_s"], rel=1e-9)
    assert s.gpu_util == pytest.approx(0.5)  # vllm-0 at 80 %, vllm-1 at 20 %


async def test_scrape_source_without_restart_tracking_loses_only_the_pre_restart_part(pods: Pods) -> None:
    e = SyntheticEngine(EngineName.VLLM, "vllm-0", seed=3, rate=30.0, hit_share=0.6)
    pods.add(e)
    vt = VirtualTime([e], restart_at=1005.0)
    source = ScrapeSource("vllm", pods.urls, clock=vt.clock)
    win = await source.measure(10.0, sleep=vt.sleep)  # start and end scrapes only
    assert win.resets == ("vllm-0",)
    assert win.signals.requests == len(e.window(1005.0, 1010.0))  # only what the new process counted


async def test_unreachable_target_is_noted_and_bad_arguments_are_named(pods: Pods) -> None:
    e = SyntheticEngine(EngineName.TRTLLM, "trt-0", seed=1, rate=20.0, hit_share=0.5)
    pods.add(e)
    vt = VirtualTime([e])
    urls = {**pods.urls, "trt-1": "http://127.0.0.1:9/prometheus/metrics"}
    source = ScrapeSource("trtllm", urls, clock=vt.clock, timeout_s=1.0)
    win = await source.measure(4.0, sleep=vt.sleep)
    assert any("trt-1" in n and "failed" in n for n in win.notes)
    assert win.signals.requests == len(e.window(1000.0, 1004.0))
    with pytest.raises(ValueError, match="window_s"):
        await source.measure(0.0)
    with pytest.raises(ValueError, match="targets"):
        ScrapeSource("vllm", {})
    with pytest.raises(ValueError, match=r"known engines|engine must be one of"):
        ScrapeSource("tgi", {"a": "http://x"})


def test_declared_family_without_samples_is_zero_and_untyped_total_is_a_counter() -> None:
    declared = "# HELP c_total c\n# TYPE c_total counter\n"
    a = parse(declared, target="p", t=0)
    b = parse(declared, target="p", t=1)
    inc = increases([a, b])
    assert inc is not None and "c_total" in inc.seen  # exists: its increase is 0, not missing
    untyped = parse("u_total 5\nplain 3\n", target="p", t=0)
    assert "u_total" in untyped.cumulative and "plain" not in untyped.cumulative

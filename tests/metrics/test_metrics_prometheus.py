"""A real Prometheus scraping engines of all three kinds over HTTP; PrometheusSource and ScrapeSource
against the exporters' ground truth for the same window, with a pod restart mid-window.

Tolerances (the brief's): hit rate and prefill reduction +-0.02, rates +-5 %, quantiles within one
histogram bucket of the true quantile; the two sources agree with each other within the same bounds.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import threading
import time
from typing import Any

import pytest
from tests.metrics.conftest import (
    ITL_BUCKETS,
    TTFT_BUCKETS,
    Pods,
    Prometheus,
    SyntheticEngine,
    ground_truth,
    true_quantile,
)

from prefixtune.engines import get_adapter
from prefixtune.engines.base import EngineName
from prefixtune.metrics import histogram as H
from prefixtune.metrics.histogram import Slo
from prefixtune.metrics.prometheus_source import PrometheusSource, bucket_vector, connect, scalar
from prefixtune.metrics.promql import Selector, buckets
from prefixtune.metrics.scrape_source import ScrapeSource, Window
from prefixtune.metrics.signals import Signals

pytestmark = pytest.mark.integration

WINDOW_S = 8
GPU_BUSY = {"vllm-0": 80, "vllm-1": 20, "sglang-0": 60, "sglang-1": 40, "trtllm-0": 30, "trtllm-1": 50}
SLO = Slo(ttft_p99_s=0.5, itl_p99_s=0.05)
RATES = ("requests_per_s", "input_tokens_per_s", "output_tokens_per_s")
QUANTILES = (
    ("ttft", 0.5, "ttft_p50_s", TTFT_BUCKETS),
    ("ttft", 0.9, "ttft_p90_s", TTFT_BUCKETS),
    ("ttft", 0.99, "ttft_p99_s", TTFT_BUCKETS),
    ("itl", 0.5, "itl_p50_s", ITL_BUCKETS),
    ("itl", 0.99, "itl_p99_s", ITL_BUCKETS),
)


def dcgm_exposition() -> bytes:
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for i, (pod, busy) in enumerate(sorted(GPU_BUSY.items())):
        lines.append(
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="GPU-{i}",modelName="NVIDIA H100 80GB HBM3",'
            f'Hostname="node-0",pod="{pod}",namespace="ns",container="engine"}} {busy}'
        )
    return ("\n".join(lines) + "\n").encode()


def bucket_of(value: float, bounds: tuple[float, ...]) -> int:
    return bisect.bisect_left((*bounds, math.inf), value)


def check_against_truth(s: Signals, truth: dict[str, Any], who: str) -> None:
    assert s.hit_rate is not None and abs(s.hit_rate - truth["hit_rate"]) <= 0.02, (who, s.hit_rate, truth)
    assert s.prefill_reduction is not None
    assert abs(s.prefill_reduction - truth["prefill_reduction"]) <= 0.02, who
    for key in RATES:
        got = getattr(s, key)
        assert got is not None and got == pytest.approx(truth[key], rel=0.05), (who, key, got, truth[key])
    for series, q, key, bounds in QUANTILES:
        got = getattr(s, key)
        true = true_quantile(truth[series], q)
        assert got is not None and abs(bucket_of(got, bounds) - bucket_of(true, bounds)) <= 1, (
            who,
            key,
            got,
            true,
        )


def restart_later(engine: SyntheticEngine, at: float, down_s: float) -> threading.Thread:
    """The pod stops serving requests at ``at``; ``down_s`` later a new process (counters 0) starts."""

    def run() -> None:
        time.sleep(max(0.0, at - time.time()))
        engine.paused = True
        time.sleep(down_s)
        engine.restart()
        engine.paused = False

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


async def test_real_prometheus_and_direct_scrapes_match_ground_truth(
    prometheus: Prometheus, pods: Pods
) -> None:
    shares = {EngineName.VLLM: (0.3, 0.7), EngineName.SGLANG: (0.85, 0.6), EngineName.TRTLLM: (0.2, 0.5)}
    for n, engine in enumerate(EngineName):
        for i, share in enumerate(shares[engine]):
            pods.add(
                SyntheticEngine(engine, f"{engine.value}-{i}", seed=10 * n + i, rate=40.0, hit_share=share)
            )
    dcgm_url = pods.add_static("dcgm", dcgm_exposition())
    jobs: list[dict[str, Any]] = []
    for engine in EngineName:
        path = get_adapter(engine).metrics_path
        static = [
            {"targets": [pods.urls[e.pod].split("/")[2]], "labels": {"namespace": "ns", "pod": e.pod}}
            for e in pods.of(engine)
        ]
        jobs.append({"job_name": engine.value, "metrics_path": path, "static_configs": static})
    # The DCGM exporter's own pod labels make Prometheus rename the exposition's pod -> exported_pod.
    dcgm_target = {
        "targets": [dcgm_url.split("/")[2]],
        "labels": {"namespace": "gpu-operator", "pod": "dcgm-0"},
    }
    jobs.append({"job_name": "dcgm", "static_configs": [dcgm_target]})
    prometheus.configure(jobs)
    pods.start()
    await asyncio.to_thread(prometheus.wait_targets_up, len(pods.engines) + 1)
    await asyncio.sleep(1.0)

    restarted = pods.of(EngineName.VLLM)[1]
    restart_later(restarted, time.time() + 3.0, down_s=1.5)
    scrapers = {
        engine: ScrapeSource(
            engine,
            {e.pod: pods.urls[e.pod] for e in pods.of(engine)},
            slo=SLO,
            dcgm_urls=[dcgm_url],
            pods=[e.pod for e in pods.of(engine)],
        )
        for engine in EngineName
    }
    measured = await asyncio.gather(*(s.measure(WINDOW_S, sample_every_s=1.0) for s in scrapers.values()))
    scraped: dict[EngineName, Window] = dict(zip(scrapers, measured, strict=True))
    await asyncio.sleep(1.5)  # let Prometheus ingest the scrapes up to the window end

    client = connect(prometheus.url)
    for engine in EngineName:
        engines = pods.of(engine)
        sel = Selector.pods([e.pod for e in engines], namespace="ns")
        end = scraped[engine].end
        prom = PrometheusSource(client, engine, slo=SLO).measure(sel, WINDOW_S, end=end)
        truth_prom = ground_truth(engines, prom.start, prom.end)  # the span Prometheus' samples cover
        assert WINDOW_S - 2 <= prom.end - prom.start <= WINDOW_S
        truth_scrape = ground_truth(engines, scraped[engine].start, scraped[engine].end)
        check_against_truth(prom.signals, truth_prom, f"prometheus/{engine}")
        check_against_truth(scraped[engine].signals, truth_scrape, f"scrape/{engine}")
        p, s = prom.signals, scraped[engine].signals
        assert p.hit_rate is not None and s.hit_rate is not None and abs(p.hit_rate - s.hit_rate) <= 0.02
        for key in RATES:
            assert getattr(p, key) == pytest.approx(getattr(s, key), rel=0.05), (engine, key)
        for _, _, key, bounds in QUANTILES:
            assert abs(bucket_of(getattr(p, key), bounds) - bucket_of(getattr(s, key), bounds)) <= 1, (
                engine,
                key,
            )
        busy = sum(GPU_BUSY[e.pod] for e in engines) / len(engines) / 100
        assert p.gpu_util == pytest.approx(busy) and s.gpu_util == pytest.approx(busy)
        assert p.running_mean is not None and s.running_mean is not None and 8 <= p.running_mean <= 11
        assert p.slo_attainment == pytest.approx(s.slo_attainment, abs=0.03)
        if engine is EngineName.TRTLLM:
            assert p.preemptions_per_s is None and "preemptions_per_s" in p.missing()
        else:
            assert p.preemptions_per_s is not None
        want_resets = ("pod=vllm-1",) if engine is EngineName.VLLM else ()
        assert prom.resets == want_resets, (engine, prom.resets)
        assert scraped[engine].resets == (("vllm-1",) if engine is EngineName.VLLM else ())

        # our histogram_quantile equals Prometheus' own on the same bucket increases
        for base, q in ((get_adapter(engine).metrics.ttft, 0.9), (get_adapter(engine).metrics.itl, 0.99)):
            query = buckets(base, sel, WINDOW_S)
            ours = H.quantile(q, bucket_vector(client.custom_query(query, params={"time": end})))
            theirs = scalar(client.custom_query(f"histogram_quantile({q}, {query})", params={"time": end}))
            assert ours is not None and theirs is not None and ours == pytest.approx(theirs, rel=1e-9)

    # Pods nobody scrapes: every signal is missing, none is zero.
    empty = PrometheusSource(client, "vllm").measure(Selector.pods(["nope"], namespace="ns"), WINDOW_S)
    assert set(empty.signals.missing()) == set(Signals.__dataclass_fields__) - {"window_s"}

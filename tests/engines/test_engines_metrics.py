"""Metric names per engine and reading the effective config back from scraped samples."""

from __future__ import annotations

import re

import pytest

from prefixtune.engines import get_adapter

ENGINES = ("vllm", "sglang", "trtllm")
COUNTERS = (
    "prompt_tokens",
    "generation_tokens",
    "requests_finished",
    "preemptions",
    "hit_numerator",
    "hit_miss",
)


@pytest.mark.parametrize("engine", ENGINES)
def test_counters_are_scraped_with_total(engine: str) -> None:
    metrics = get_adapter(engine).metrics
    for field in COUNTERS:
        name = getattr(metrics, field)
        assert name == "" or name.endswith("_total"), (field, name)
    for field in ("ttft", "itl", "e2e"):
        assert getattr(metrics, field).endswith("_seconds")
    prefix = {"vllm": "vllm:", "sglang": "sglang:", "trtllm": "trtllm_"}[engine]
    for field in ("requests_running", "requests_waiting", "kv_usage", "ttft", "hit_numerator"):
        assert getattr(metrics, field).startswith(prefix)


def test_hit_rate_sources_per_engine() -> None:
    vllm = get_adapter("vllm").metrics
    assert (vllm.hit_numerator, vllm.hit_denominator, vllm.hit_unit) == (
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "tokens",
    )
    assert vllm.kv_usage == "vllm:kv_cache_usage_perc"
    assert vllm.itl == "vllm:inter_token_latency_seconds"
    sglang = get_adapter("sglang").metrics
    assert sglang.hit_numerator == sglang.hit_denominator == "sglang:prefill_effective_tokens_total"
    pattern = re.compile(sglang.extra["hit_label_regex"])
    assert [m for m in ("input", "device_hit", "host_hit", "storage_hit") if pattern.fullmatch(m)] == [
        "device_hit",
        "host_hit",
        "storage_hit",
    ]
    assert sglang.extra["hit_label"] == "mode"
    assert sglang.kv_usage == "sglang:token_usage"
    trt = get_adapter("trtllm").metrics
    assert (trt.hit_numerator, trt.hit_miss, trt.hit_denominator, trt.hit_unit) == (
        "trtllm_kv_cache_reused_blocks_total",
        "trtllm_kv_cache_missed_blocks_total",
        "",
        "blocks",
    )
    assert trt.cached_prompt_tokens == "trtllm_prompt_cached_tokens_total"


def test_vllm_effective_config_from_cache_config_info() -> None:
    labels = {
        "block_size": "32",
        "gpu_memory_utilization": "0.85",
        "enable_prefix_caching": "True",
        "num_gpu_blocks": "10000",
        "cache_dtype": "auto",
        "num_cpu_blocks": "None",
    }
    samples = [("vllm:num_requests_running", {}, 3.0), ("vllm:cache_config_info", labels, 1.0)]
    assert get_adapter("vllm").effective_config(samples) == {
        "block_size": 32,
        "memory_fraction": 0.85,
        "prefix_caching": True,
        "kv_blocks": 10000,
        "kv_tokens": 320000,
    }
    off = dict(labels, enable_prefix_caching="False", num_gpu_blocks="None")
    assert get_adapter("vllm").effective_config([("vllm:cache_config_info", off, 1.0)]) == {
        "block_size": 32,
        "memory_fraction": 0.85,
        "prefix_caching": False,
    }
    assert get_adapter("vllm").effective_config([]) == {}


def test_sglang_effective_config_from_gauges() -> None:
    samples = [
        ("sglang:page_size", {"model_name": "m"}, 16.0),
        ("sglang:max_total_num_tokens", {"model_name": "m"}, 450000.0),
        ("sglang:num_pages", {"model_name": "m"}, 28125.0),
        ("sglang:token_usage", {}, 0.4),
    ]
    assert get_adapter("sglang").effective_config(samples) == {
        "block_size": 16,
        "kv_tokens": 450000,
        "kv_blocks": 28125,
    }


def test_trtllm_effective_config_from_info_labels_and_gauges() -> None:
    info = {"tokens_per_block": "64", "enable_block_reuse": "false", "free_gpu_memory_fraction": "0.8"}
    samples = [
        ("trtllm_kv_cache_config_info", info, 1.0),
        ("trtllm_kv_cache_max_blocks", {}, 5000.0),
        ("trtllm_kv_cache_tokens_per_block", {}, 64.0),
    ]
    assert get_adapter("trtllm").effective_config(samples) == {
        "block_size": 64,
        "prefix_caching": False,
        "memory_fraction": 0.8,
        "kv_blocks": 5000,
        "kv_tokens": 320000,
    }
    # without the info gauge, the block size comes from its own gauge
    assert get_adapter("trtllm").effective_config(samples[1:]) == {
        "block_size": 64,
        "kv_blocks": 5000,
        "kv_tokens": 320000,
    }

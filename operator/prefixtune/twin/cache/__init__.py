"""The twin's KV cache models, one per engine, behind the ``KVCache`` protocol (``base.py``).

``make_cache(engine, num_blocks, block_size, prefix_caching, **engine_options)`` builds one through
the engine's twin model (``twin/models/``: its ``cache_options`` and ``make_cache``). Options
use the engine-neutral names of the adapters' ``ParsedCommand`` options; ``None`` means "engine
default". Per engine:

- vllm: none. The block pool in C (``vllm_native.py``) when it is built, else the Python one
  (``vllm.py``); the same answers either way.
- sglang: ``eviction_policy`` (``lru`` default, ``lfu``).
- trtllm: ``partial_reuse`` (bool, default True), ``copy_on_partial_reuse`` (bool, default True),
  ``host_cache_bytes`` (int, default 0) with ``kv_bytes_per_token`` (bytes of KV per token, needed
  when host_cache_bytes > 0), or ``host_cache_tokens`` directly.
"""

from __future__ import annotations

from prefixtune.twin.cache.base import CacheStats, KVCache, Match
from prefixtune.twin.cache.sglang import EVICTION_POLICIES, SglangCache
from prefixtune.twin.cache.trtllm import TrtllmCache
from prefixtune.twin.cache.vllm import VllmCache
from prefixtune.twin.cache.vllm_native import NativeVllmCache, native_pool_status, use_native_pool
from prefixtune.twin.models.base import find_twin_model, known

__all__ = [
    "EVICTION_POLICIES",
    "CacheStats",
    "KVCache",
    "Match",
    "NativeVllmCache",
    "SglangCache",
    "TrtllmCache",
    "VllmCache",
    "bool_option",
    "int_option",
    "make_cache",
    "native_pool_status",
    "use_native_pool",
]


def bool_option(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"cache option {name} must be true or false, got {value!r}")
    return value


def int_option(name: str, value: object, minimum: int) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or int(value) != value
        or value < minimum
    ):
        raise ValueError(f"cache option {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def make_cache(
    engine: str,
    num_blocks: int,
    block_size: int,
    prefix_caching: bool = True,
    **engine_options: object,
) -> KVCache:
    """The KV cache model of ``engine`` with ``num_blocks`` blocks (vLLM blocks, SGLang pages,
    TensorRT-LLM blocks) of ``block_size`` tokens."""
    model = find_twin_model(engine)
    if model is None:
        raise ValueError(f"engine must be one of {', '.join(known())}, got {engine!r}")
    num_blocks = int_option("num_blocks", num_blocks, 1)
    block_size = int_option("block_size", block_size, 1)
    prefix_caching = bool_option("prefix_caching", prefix_caching)
    opts = {k: v for k, v in engine_options.items() if v is not None}
    unknown = sorted(set(opts) - set(model.cache_options))
    if unknown:
        allowed = ", ".join(model.cache_options) or "none"
        raise ValueError(f"unknown {model.name} cache option(s) {', '.join(unknown)} (allowed: {allowed})")
    return model.make_cache(num_blocks, block_size, prefix_caching, opts)

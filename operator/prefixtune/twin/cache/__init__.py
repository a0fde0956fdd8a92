"""The twin's KV cache models, one per engine, behind the ``KVCache`` protocol (``base.py``).

``make_cache(engine, num_blocks, block_size, prefix_caching, **engine_options)`` builds one. Options
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

from collections.abc import Mapping

from prefixtune.engines.base import EngineName
from prefixtune.twin.cache.base import CacheStats, KVCache, Match
from prefixtune.twin.cache.sglang import EVICTION_POLICIES, SglangCache
from prefixtune.twin.cache.trtllm import TrtllmCache
from prefixtune.twin.cache.vllm import VllmCache
from prefixtune.twin.cache.vllm_native import NativeVllmCache, native_pool_status, use_native_pool

__all__ = [
    "ENGINE_OPTIONS",
    "CacheStats",
    "KVCache",
    "Match",
    "NativeVllmCache",
    "SglangCache",
    "TrtllmCache",
    "VllmCache",
    "make_cache",
    "native_pool_status",
]

ENGINE_OPTIONS: Mapping[EngineName, tuple[str, ...]] = {
    EngineName.VLLM: (),
    EngineName.SGLANG: ("eviction_policy",),
    EngineName.TRTLLM: (
        "partial_reuse",
        "copy_on_partial_reuse",
        "host_cache_bytes",
        "kv_bytes_per_token",
        "host_cache_tokens",
    ),
}


def _engine(engine: str | EngineName) -> EngineName:
    try:
        return EngineName(str(engine).lower())
    except ValueError:
        allowed = ", ".join(e.value for e in EngineName)
        raise ValueError(f"engine must be one of {allowed}, got {engine!r}") from None


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"cache option {name} must be true or false, got {value!r}")
    return value


def _int(name: str, value: object, minimum: int) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or int(value) != value
        or value < minimum
    ):
        raise ValueError(f"cache option {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def make_cache(
    engine: str | EngineName,
    num_blocks: int,
    block_size: int,
    prefix_caching: bool = True,
    **engine_options: object,
) -> KVCache:
    """The KV cache model of ``engine`` with ``num_blocks`` blocks (vLLM blocks, SGLang pages,
    TensorRT-LLM blocks) of ``block_size`` tokens."""
    name = _engine(engine)
    num_blocks = _int("num_blocks", num_blocks, 1)
    block_size = _int("block_size", block_size, 1)
    prefix_caching = _bool("prefix_caching", prefix_caching)
    opts = {k: v for k, v in engine_options.items() if v is not None}
    unknown = sorted(set(opts) - set(ENGINE_OPTIONS[name]))
    if unknown:
        allowed = ", ".join(ENGINE_OPTIONS[name]) or "none"
        raise ValueError(f"unknown {name.value} cache option(s) {', '.join(unknown)} (allowed: {allowed})")
    if name is EngineName.VLLM:
        if use_native_pool():
            return NativeVllmCache(num_blocks, block_size, prefix_caching)
        return VllmCache(num_blocks, block_size, prefix_caching)
    if name is EngineName.SGLANG:
        policy = str(opts.get("eviction_policy", "lru"))
        if policy not in EVICTION_POLICIES:
            raise ValueError(
                f"cache option eviction_policy must be one of {', '.join(EVICTION_POLICIES)}, got {policy!r}"
            )
        return SglangCache(num_blocks, block_size, prefix_caching, eviction_policy=policy)
    host_tokens = _host_tokens(opts)
    return TrtllmCache(
        num_blocks,
        block_size,
        prefix_caching,
        partial_reuse=_bool("partial_reuse", opts.get("partial_reuse", True)),
        copy_on_partial_reuse=_bool("copy_on_partial_reuse", opts.get("copy_on_partial_reuse", True)),
        host_blocks=host_tokens // block_size,
    )


def _host_tokens(opts: Mapping[str, object]) -> int:
    if "host_cache_tokens" in opts:
        if "host_cache_bytes" in opts:
            raise ValueError("give either cache option host_cache_tokens or host_cache_bytes, not both")
        return _int("host_cache_tokens", opts["host_cache_tokens"], 0)
    host_bytes = _int("host_cache_bytes", opts.get("host_cache_bytes", 0), 0)
    if host_bytes == 0:
        return 0
    if "kv_bytes_per_token" not in opts:
        raise ValueError("cache option host_cache_bytes needs kv_bytes_per_token (bytes of KV per token)")
    per_token = _int("kv_bytes_per_token", opts["kv_bytes_per_token"], 1)
    return host_bytes // per_token

"""vLLM's cache model with its block pool in C (``_vllm_pool.c``): the twin's speed path.

Same semantics, answers and counters as ``VllmCache`` (``vllm.py`` documents them; the C file says
how it keeps them), call for call and block id for block id: ``tests/twin/test_twin_vllm_native.py``
drives both with the same calls (and ``VllmCache`` is checked against a naive free queue in
``test_twin_vllm_queue.py``). The pure-Python model stays the reference and the fallback.

The extension is built by ``pip install`` when a C compiler is there (it is optional, so an install
without one still works, on the Python pool). ``make_cache`` uses it when it imports, unless
``PREFIXTUNE_TWIN_NATIVE=0`` is set; ``native_pool_status()`` says which pool runs and why.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from prefixtune.twin.cache.base import CacheStats, Match, check_lengths
from prefixtune.twin.cache.vllm import count_admission
from prefixtune.twin.prompt import TokenSeq

if TYPE_CHECKING:
    from prefixtune.twin.cache._vllm_pool import Pool

NATIVE_ENV = "PREFIXTUNE_TWIN_NATIVE"  # "0": use the Python pool even when the C one is built

_Pool: type[Pool] | None
_import_error: str | None
try:
    from prefixtune.twin.cache._vllm_pool import Pool as _Pool

    _import_error = None
except ImportError as exc:  # not built (no C compiler at install time): the Python pool runs
    _Pool, _import_error = None, str(exc)


def native_pool_built() -> bool:
    return _Pool is not None


def native_pool_status() -> str:
    """Which vLLM pool ``make_cache`` uses now, and why: "native", or "python (<reason>)"."""
    if _Pool is None:
        return f"python (the C pool is not built: {_import_error})"
    if os.environ.get(NATIVE_ENV, "1") == "0":
        return f"python ({NATIVE_ENV}=0)"
    return "native"


def use_native_pool() -> bool:
    return _Pool is not None and os.environ.get(NATIVE_ENV, "1") != "0"


class NativeVllmCache:
    """The block pool of one vLLM engine, in C (``num_blocks`` blocks of ``block_size`` tokens)."""

    __slots__ = ("_admit", "_commit", "_grow", "_pool", "block_size", "num_blocks", "prefix_caching", "stats")

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        if _Pool is None:
            raise RuntimeError(native_pool_status())
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.stats = CacheStats()
        self._pool = _Pool(num_blocks, block_size, prefix_caching)
        # bound once: these run a few times per request
        self._admit = self._pool.admit
        self._grow = self._pool.grow
        self._commit = self._pool.commit

    def lookup(self, seq: TokenSeq, prompt_len: int) -> Match:
        if not self.prefix_caching:
            return Match(0)
        n = self._pool.lookup(seq.segments, prompt_len)
        return Match(n * self.block_size, hit_blocks=n)

    def admit(self, req_id: int, seq: TokenSeq, prompt_len: int, num_tokens: int, now: float) -> Match | None:
        if not (1 <= prompt_len <= seq.length and num_tokens >= 1):
            check_lengths(seq, prompt_len, num_tokens)
        nh = self._admit(req_id, seq.segments, prompt_len, num_tokens)
        self.stats.evicted_blocks = self._pool.evicted
        if nh < 0:
            return None
        return count_admission(self.stats, prompt_len, nh, self.block_size)

    def grow(self, req_id: int, num_tokens: int, now: float) -> bool:
        ok = self._grow(req_id, num_tokens)
        self.stats.evicted_blocks = self._pool.evicted
        return ok

    def commit(self, req_id: int, computed_tokens: int, now: float) -> None:
        self._commit(req_id, computed_tokens)

    def release(self, req_id: int, now: float) -> None:
        self._pool.release(req_id)

    def free_blocks(self) -> int:
        return self._pool.free_blocks()

    def usage(self) -> float:
        return self._pool.usage()

    def cached_blocks(self) -> int:
        """Blocks holding a hash (referenced or not): the size of the prefix cache."""
        return self._pool.cached_blocks()

    def free_order(self) -> list[int]:
        """The free blocks in the order allocation takes them (for tests)."""
        return self._pool.free_order()

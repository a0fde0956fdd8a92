"""The C block pool (``NativeVllmCache``) against the Python one (``VllmCache``), call for call.

``VllmCache`` is itself checked against a naive free queue (test_twin_vllm_queue.py); here the two
implementations get the same calls and must give the same answer to every one, the same counters,
free/usage/cached gauges and the same free queue, block id for block id. Whole simulations must
give identical summaries with either pool.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import pytest
from tests.conftest import require_component

from prefixtune.twin.cache import VllmCache, make_cache, native_pool_status
from prefixtune.twin.cache.vllm_native import NATIVE_ENV, NativeVllmCache, native_pool_built
from prefixtune.twin.prompt import Segment, TokenSeq, chain_key


def test_native_pool_is_built() -> None:
    """CI must run the C pool (the speed target depends on it); locally a missing compiler skips."""
    require_component(native_pool_built(), f"the C vLLM pool ({native_pool_status()})")
    assert native_pool_status() in ("native", f"python ({NATIVE_ENV}=0)")


needs_native = pytest.mark.skipif(not native_pool_built(), reason=native_pool_status())


def _python_free_order(c: VllmCache) -> list[int]:
    """VllmCache's free queue as allocation would take it: the hashless stack from its top, then
    the live entries of the LRU deque (an entry is stale while its block has stale counts left)."""
    stale = list(c._stale)
    out = c._free_plain[::-1]
    for b in c._queue:
        if stale[b]:
            stale[b] -= 1
        else:
            out.append(b)
    return out


class _Pair:
    """Both pools driven with the same calls; every answer and the whole state compared after each."""

    def __init__(self, nb: int, bs: int, pc: bool = True) -> None:
        self.py, self.c = VllmCache(nb, bs, pc), NativeVllmCache(nb, bs, pc)

    def check(self) -> None:
        assert self.c.free_blocks() == self.py.free_blocks()
        assert self.c.usage() == self.py.usage()
        assert self.c.cached_blocks() == self.py.cached_blocks()
        assert self.c.stats == self.py.stats
        assert self.c.free_order() == _python_free_order(self.py)

    def admit(self, rid: int, s: TokenSeq, p: int, n: int) -> bool:
        assert self.c.lookup(s, p) == self.py.lookup(s, p)
        m = self.c.admit(rid, s, p, n, 0.0)
        assert m == self.py.admit(rid, s, p, n, 0.0)
        self.check()
        return m is not None

    def grow(self, rid: int, n: int) -> None:
        assert self.c.grow(rid, n, 0.0) == self.py.grow(rid, n, 0.0)
        self.check()

    def commit(self, rid: int, k: int) -> None:
        self.c.commit(rid, k, 0.0)
        self.py.commit(rid, k, 0.0)
        self.check()

    def release(self, rid: int) -> None:
        self.c.release(rid, 0.0)
        self.py.release(rid, 0.0)
        self.check()


def _random_seq(rng: random.Random, roots: int, bs: int, parts: int) -> TokenSeq:
    segs, key = [], 0
    for _ in range(rng.randint(1, parts)):
        key = chain_key(key, rng.randrange(roots))  # few roots: prefixes (and repeats) are shared
        segs.append(Segment(key, rng.randint(1, 3 * bs)))
    return TokenSeq(tuple(segs))


def _drive(pair: _Pair, rng: random.Random, ops: int, roots: int, bs: int, parts: int) -> Iterator[int]:
    live: dict[int, list[int]] = {}  # request -> [seq length, tokens allocated]
    for rid in range(ops):
        if rng.random() < 0.45 or not live:
            s = _random_seq(rng, roots, bs, parts)
            p = rng.randint(1, s.length)
            n = rng.randint(p, s.length)
            if pair.admit(rid, s, p, n):
                live[rid] = [s.length, n]
                pair.commit(rid, rng.randint(0, n))  # often partly committed, as a preempted request
        else:
            r = rng.choice(list(live))
            roll = rng.random()
            if roll < 0.4:
                pair.grow(r, rng.randint(1, live[r][0]))
            elif roll < 0.6:
                pair.commit(r, rng.randint(0, live[r][0]))
            else:
                del live[r]
                pair.release(r)
        yield rid
    for r in list(live):
        pair.release(r)


@needs_native
@pytest.mark.parametrize("seed", range(300))
def test_native_pool_matches_python_call_for_call(seed: int) -> None:
    rng = random.Random(seed)
    nb, bs, pc = rng.randint(1, 40), rng.choice([1, 2, 4, 16]), rng.random() < 0.85
    pair = _Pair(nb, bs, pc)
    for _ in _drive(pair, rng, 300, rng.randint(1, 4), bs, 4):
        pass


@needs_native
@pytest.mark.parametrize("seed", range(8))
def test_native_pool_matches_python_on_long_busy_runs(seed: int) -> None:
    """Bigger pools and longer runs: long eviction sweeps, duplicates, a hash table far from empty."""
    rng = random.Random(5000 + seed)
    bs = rng.choice([1, 4, 16])
    pair = _Pair(rng.randint(200, 800), bs)
    for _ in _drive(pair, rng, 3000, 3, bs, 8):
        pass


@needs_native
def test_native_pool_duplicate_holders() -> None:
    """The capped last block of a fully cached prompt is recomputed into a second holder of its
    hash; evicting the first holder promotes the second, evicting that forgets the hash."""
    pair = _Pair(8, 2)
    head = Segment(chain_key(0, "a"), 4)
    a = TokenSeq((head,))
    longer = TokenSeq((head, Segment(chain_key(head.key, "more"), 2)))
    for rid in (0, 1):
        assert pair.admit(rid, a, 4, 4)
        pair.commit(rid, 4)
    assert pair.c.cached_blocks() == 3
    pair.release(0)
    pair.release(1)
    plain = pair.c.free_blocks() - 3
    b = TokenSeq((Segment(chain_key(0, "b"), 2 * (plain + 1)),))
    assert pair.admit(2, b, 1, 2 * (plain + 1))  # one eviction
    assert pair.c.lookup(longer, 6).hit_blocks == 2  # the duplicate hits
    c = TokenSeq((Segment(chain_key(0, "c"), 4),))
    assert pair.admit(3, c, 1, 4)
    assert pair.c.lookup(longer, 6).hit_blocks == 0


@needs_native
def test_native_pool_errors_name_the_request_and_leave_the_pool_unchanged() -> None:
    cache = NativeVllmCache(16, 4)
    s = TokenSeq((Segment(chain_key(0, "x"), 10),))
    assert cache.admit(7, s, 10, 10, 0.0) is not None
    before = (cache.free_blocks(), cache.free_order(), cache.stats)
    with pytest.raises(ValueError, match="request 7 is already admitted"):
        cache.admit(7, s, 10, 10, 0.0)
    for call in (
        lambda: cache.grow(8, 4, 0.0),
        lambda: cache.commit(8, 4, 0.0),
        lambda: cache.release(8, 0.0),
    ):
        with pytest.raises(KeyError, match="request 8 is not admitted"):
            call()
    with pytest.raises(ValueError, match=r"prompt_len must be in 1\.\.10"):
        cache.admit(9, s, 11, 11, 0.0)
    with pytest.raises(ValueError, match="num_tokens must be >= 1"):
        cache.admit(9, s, 5, 0, 0.0)
    assert (cache.free_blocks(), cache.free_order(), cache.stats) == before
    with pytest.raises(ValueError, match="num_blocks must be >= 1"):
        NativeVllmCache(0, 16)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        NativeVllmCache(4, 0)
    huge = TokenSeq((Segment(1 << 64, 8),))
    with pytest.raises(OverflowError, match="64-bit"):
        cache.admit(10, huge, 8, 8, 0.0)
    assert cache.free_order() == before[1]
    from prefixtune.twin.cache._vllm_pool import Pool

    bare = Pool.__new__(Pool)  # no __init__: refused, not a crash
    with pytest.raises(RuntimeError, match="__init__ was not called"):
        bare.admit(1, s.segments, 10, 10)
    with pytest.raises(RuntimeError, match="__init__ was not called"):
        bare.release(1)


@needs_native
def test_make_cache_picks_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NATIVE_ENV, raising=False)
    assert isinstance(make_cache("vllm", 8, 16), NativeVllmCache)
    monkeypatch.setenv(NATIVE_ENV, "0")
    assert type(make_cache("vllm", 8, 16)) is VllmCache
    assert native_pool_status() == f"python ({NATIVE_ENV}=0)"


_SIM_CASES = [
    ("chatbot", 20.0, ()),
    ("rag", 8.0, ()),
    ("agent", 10.0, ("--block-size", "32")),
    ("qa", 8.0, ()),
    # a small pool: evictions, preemptions (recompute), re-admissions that hit their own blocks
    ("chatbot", 20.0, ("--gpu-memory-utilization", "0.25", "--max-model-len", "16384")),
    ("rag", 8.0, ("--no-enable-prefix-caching",)),
]


@needs_native
@pytest.mark.parametrize(("workload", "rate", "argv"), _SIM_CASES)
def test_simulations_are_identical_with_either_pool(
    workload: str, rate: float, argv: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefixtune.twin.run import SimOptions, simulate
    from prefixtune.twin.workloads import generate

    out = {}
    for native in ("1", "0"):
        monkeypatch.setenv(NATIVE_ENV, native)
        reqs = generate(workload, rate=rate, duration_s=40.0, seed=3)
        s = simulate(
            "vllm", list(argv), "H100", reqs, SimOptions(model="meta-llama/Llama-3.1-8B-Instruct", seed=3)
        )
        d = dict(vars(s))
        d.pop("wall_seconds")
        out[native] = d
    assert out["1"] == out["0"]
    if "0.25" in argv:
        assert out["1"]["preemptions"] > 0  # the case under test
    assert os.environ[NATIVE_ENV] == "0"

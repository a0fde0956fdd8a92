"""The three engines' KV cache models: block boundaries, eviction order, capacity and ref counts."""

from __future__ import annotations

import random

import pytest

from prefixtune.twin.cache import SglangCache, TrtllmCache, VllmCache, make_cache
from prefixtune.twin.cache.base import KVCache
from prefixtune.twin.prompt import Segment, TokenSeq, chain_key

SYS = Segment(chain_key(0, "system prompt"), 2050)


def seq_of(*parts: tuple[str, int], parent: Segment | None = None) -> TokenSeq:
    segs = [parent] if parent is not None else []
    key = parent.key if parent is not None else 0
    for name, n in parts:
        key = chain_key(key, name)
        segs.append(Segment(key, n))
    return TokenSeq(tuple(segs))


def with_suffix(i: int, n: int = 100) -> TokenSeq:
    return seq_of((f"user {i}", n), parent=SYS)


def serve(cache: KVCache, req_id: int, seq: TokenSeq, prompt_len: int | None = None) -> int:
    """Admit, commit and release a prompt; the hit tokens."""
    p = seq.length if prompt_len is None else prompt_len
    m = cache.admit(req_id, seq, p, p, 0.0)
    assert m is not None
    cache.commit(req_id, p, 0.0)
    cache.release(req_id, 0.0)
    return m.hit_tokens


# -- block boundary: a 2,050-token shared system prompt ------------------------------------------


@pytest.mark.parametrize(
    ("engine", "block", "options", "expected"),
    [
        ("vllm", 16, {}, 2048),
        ("vllm", 128, {}, 2048),  # 2,048 = 16 x 128: block 128 also ends inside the 2,050 tokens
        ("sglang", 1, {}, 2050),
        ("sglang", 64, {}, 2048),
        ("trtllm", 32, {}, 2050),  # partial reuse: the 2 tokens of block 65 are copied
        ("trtllm", 32, {"partial_reuse": False}, 2048),
        ("trtllm", 128, {}, 2050),
    ],
)
def test_shared_system_prompt_hits_per_block_size(
    engine: str, block: int, options: dict[str, object], expected: int
) -> None:
    cache = make_cache(engine, 4096, block, True, **options)
    assert serve(cache, 0, with_suffix(0)) == 0
    hits = [serve(cache, i, with_suffix(i)) for i in range(1, 5)]
    assert hits == [expected] * 4
    assert cache.stats.hit_tokens == 4 * expected
    assert cache.stats.query_tokens == 5 * 2150


def test_block_128_hits_1920_when_the_prefix_ends_before_2048() -> None:
    sys2000 = Segment(chain_key(0, "short system prompt"), 2000)
    cache = VllmCache(4096, 128)
    serve(cache, 0, seq_of(("a", 100), parent=sys2000))
    assert serve(cache, 1, seq_of(("b", 100), parent=sys2000)) == 1920


def test_prefix_caching_off_never_hits() -> None:
    for engine, block in (("vllm", 16), ("sglang", 1), ("trtllm", 32)):
        cache = make_cache(engine, 8192, block, False)
        assert [serve(cache, i, with_suffix(0)) for i in range(3)] == [0, 0, 0]
        assert cache.free_blocks() == 8192


# -- prompt - 1 cap -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "block", "expected"), [("vllm", 16, 2032), ("sglang", 1, 2047), ("trtllm", 32, 2047)]
)
def test_a_fully_cached_prompt_still_computes_its_last_token(engine: str, block: int, expected: int) -> None:
    seq = seq_of(("doc", 2048))
    cache = make_cache(engine, 8192, block, True)
    serve(cache, 0, seq)
    assert serve(cache, 1, seq) == expected  # vLLM: floor((P-1)/B)*B; SGLang/TRT: P-1
    assert cache.lookup(seq, 2048).hit_tokens == expected


def test_lookup_has_no_side_effects() -> None:
    for engine, block in (("vllm", 16), ("sglang", 1), ("trtllm", 32)):
        cache = make_cache(engine, 8192, block, True)
        serve(cache, 0, with_suffix(0))
        before = (cache.stats.query_tokens, cache.stats.hit_tokens, cache.free_blocks())
        assert cache.lookup(with_suffix(1), 2150).hit_tokens > 0
        assert (cache.stats.query_tokens, cache.stats.hit_tokens, cache.free_blocks()) == before


# -- vLLM free-queue order --------------------------------------------------------------------------


def test_vllm_evicts_the_tail_of_a_chain_first() -> None:
    cache = VllmCache(num_blocks=8, block_size=4)
    a = seq_of(("a", 16))  # 4 blocks
    serve(cache, 0, seq_of(("a", 16), ("x", 1)))  # caches a's 4 blocks (17 tokens -> 5 blocks, 4 full)
    assert cache.lookup(a.extend(Segment(1, 1)), 17).hit_tokens == 16
    # 4 blocks come from the hashless front of the queue (3 never used + a's partial block)
    m = cache.admit(1, seq_of(("b", 16)), 16, 16, 0.0)
    assert m is not None and cache.lookup(a.extend(Segment(1, 1)), 17).hit_tokens == 16
    # one more block: the front of the cached queue is a's LAST block (freed in reverse order)
    assert cache.grow(1, 20, 0.0)
    assert cache.lookup(a.extend(Segment(1, 1)), 17).hit_tokens == 12
    assert cache.grow(1, 24, 0.0)
    assert cache.lookup(a.extend(Segment(1, 1)), 17).hit_tokens == 8


def test_vllm_hit_on_a_free_block_touches_it() -> None:
    cache = VllmCache(num_blocks=4, block_size=4)
    a, b = seq_of(("a", 4), ("a2", 1)), seq_of(("b", 4), ("b2", 1))
    serve(cache, 0, a)  # a's block cached, then freed (queue: plain..., a)
    serve(cache, 1, b)  # b's block cached (queue: plain..., a, b)
    assert serve(cache, 2, a) == 4  # touch a: it moves behind b when freed again
    # fill the pool: plain blocks first, then b (the least recently used cached block)
    assert cache.admit(3, seq_of(("c", 12)), 12, 12, 0.0) is not None
    assert cache.lookup(a, 5).hit_tokens == 4
    assert cache.lookup(b, 5).hit_tokens == 0


# -- SGLang LRU leaves and pages ------------------------------------------------------------------


def test_sglang_evicts_least_recently_used_leaves_and_parents_after_their_children() -> None:
    cache = SglangCache(num_blocks=40, block_size=1)
    base = seq_of(("base", 10))
    x = seq_of(("x", 10), parent=base.segments[0])
    y = seq_of(("y", 10), parent=base.segments[0])
    serve(cache, 0, x.extend(Segment(11, 1)))  # tree: base(10) -> x(10) (+ the 1 token is computed)
    serve(cache, 1, y.extend(Segment(12, 1)))  # base -> {x, y}; y more recent
    assert cache.cached_tokens() == 30 + 2  # the single-token tails were committed too
    # allocate 15 tokens beyond the 8 never used: evicts the oldest leaves first (x's branch)
    assert cache.admit(2, seq_of(("z", 15)), 15, 15, 0.0) is not None
    assert cache.lookup(y.extend(Segment(12, 1)), 21).hit_tokens == 20
    assert cache.lookup(x.extend(Segment(11, 1)), 21).hit_tokens == 10  # only base is left of x
    # more pressure: y's leaf goes, then base (a parent becomes evictable once childless)
    assert cache.grow(2, 40, 0.0)
    assert cache.lookup(y.extend(Segment(12, 1)), 21).hit_tokens == 0
    assert cache.free_blocks() == 0


def test_sglang_pages_share_only_full_pages_and_branch_mid_page() -> None:
    cache = SglangCache(num_blocks=100, block_size=8)
    base = Segment(chain_key(0, "base"), 20)  # 2 full pages + 4 tokens
    serve(cache, 0, seq_of(("a", 12), parent=base))  # 32 tokens: 4 full pages cached
    assert serve(cache, 1, seq_of(("b", 12), parent=base)) == 16  # the branch at 20 is in page 3
    assert cache.match_len(seq_of(("a", 12), parent=base)) == 32
    assert cache.match_len(seq_of(("b", 12), parent=base)) == 32  # b's own pages were inserted


def test_sglang_lfu_keeps_frequently_hit_prefixes() -> None:
    hot, cold = seq_of(("hot", 8), ("h", 1)), seq_of(("cold", 8), ("c", 1))
    results = {}
    for policy in ("lru", "lfu"):
        cache = SglangCache(num_blocks=24, block_size=1, eviction_policy=policy)
        for i in range(4):
            serve(cache, i, hot)
        serve(cache, 10, cold)
        assert cache.admit(11, seq_of(("big", 10)), 10, 10, 0.0) is not None  # evicts 2 leaves' worth
        results[policy] = (cache.match_len(hot), cache.match_len(cold))
    # hot's last token is never hit (the prompt - 1 cap), so its 1-token leaf goes first either way;
    # then LRU takes hot's older 8-token node, LFU the never-hit cold prompt
    assert results["lru"] == (0, 9)
    assert results["lfu"] == (8, 0)


# -- TensorRT-LLM host tier ---------------------------------------------------------------------


def test_trtllm_host_tier_keeps_evicted_blocks_reusable() -> None:
    doc = seq_of(("doc", 64), ("q", 1))  # 2 full blocks of 32 (+1 token)
    no_host = TrtllmCache(num_blocks=4, block_size=32)
    with_host = TrtllmCache(num_blocks=4, block_size=32, host_blocks=8)
    for cache in (no_host, with_host):
        serve(cache, 0, doc)
        assert cache.admit(1, seq_of(("filler", 128)), 128, 128, 0.0) is not None  # needs all 4 GPU blocks
        cache.release(1, 0.0)
    assert no_host.lookup(doc, 65).hit_tokens == 0
    m = with_host.lookup(doc, 65)
    assert (m.hit_tokens, m.host_tokens) == (64, 64)
    got = with_host.admit(2, doc, 65, 65, 0.0)
    assert got is not None and (got.hit_tokens, got.host_tokens) == (64, 64)
    assert with_host.stats.host_hit_tokens == 64
    assert with_host.stats.offloaded_blocks >= 2 and with_host.stats.onboarded_blocks == 2
    with_host.commit(2, 65, 0.0)
    with_host.release(2, 0.0)
    assert with_host.lookup(doc, 65).host_tokens == 0  # onboarded: on the GPU again


def test_trtllm_counts_reused_and_missed_blocks() -> None:
    cache = TrtllmCache(num_blocks=512, block_size=32)
    serve(cache, 0, with_suffix(0))
    m = cache.admit(1, with_suffix(1), 2150, 2150, 0.0)
    assert m is not None
    assert (m.hit_blocks, m.miss_blocks) == (65, 68 - 65)  # 64 full + 1 partial of ceil(2150/32) = 68


# -- capacity and ref counts ---------------------------------------------------------------------

ENGINES = [
    ("vllm", 16, {}),
    ("sglang", 1, {}),
    ("sglang", 16, {}),
    ("trtllm", 32, {}),
    ("trtllm", 32, {"copy_on_partial_reuse": False}),
    ("trtllm", 32, {"host_cache_tokens": 32 * 16}),
]


@pytest.mark.parametrize(("engine", "block", "options"), ENGINES)
def test_admit_fails_without_change_when_blocks_run_out(
    engine: str, block: int, options: dict[str, object]
) -> None:
    cache = make_cache(engine, 64, block, True, **options)
    held = seq_of(("held", 40 * block))
    assert cache.admit(0, held, held.length, held.length, 0.0) is not None
    free = cache.free_blocks()
    assert free == 24
    too_big = seq_of(("big", (free + 1) * block))
    stats = (cache.stats.query_tokens, cache.stats.hit_tokens)
    assert cache.admit(1, too_big, too_big.length, too_big.length, 0.0) is None
    assert cache.free_blocks() == free and (cache.stats.query_tokens, cache.stats.hit_tokens) == stats
    assert not cache.grow(0, (40 + free + 1) * block, 0.0)
    assert cache.free_blocks() == free
    assert cache.grow(0, (40 + free) * block, 0.0)
    assert cache.free_blocks() == 0 and cache.usage() == 1.0
    cache.release(0, 0.0)
    assert cache.free_blocks() == 64 and cache.usage() == 0.0


@pytest.mark.parametrize(("engine", "block", "options"), ENGINES)
def test_cached_unreferenced_blocks_are_free_capacity(
    engine: str, block: int, options: dict[str, object]
) -> None:
    cache = make_cache(engine, 64, block, True, **options)
    for i in range(3):  # fill the pool with cached prompts
        serve(cache, i, seq_of((f"doc {i}", 20 * block), ("end", 1)))
    assert cache.free_blocks() == 64 and cache.usage() == 0.0
    big = seq_of(("big", 64 * block))
    assert cache.admit(9, big, big.length, big.length, 0.0) is not None  # everything cached is evicted
    assert cache.free_blocks() == 0
    assert cache.lookup(seq_of(("doc 0", 20 * block), ("end", 1)), 20 * block + 1).hit_tokens == 0


@pytest.mark.parametrize(("engine", "block", "options"), ENGINES)
def test_shared_blocks_are_referenced_once_per_pool(
    engine: str, block: int, options: dict[str, object]
) -> None:
    cache = make_cache(engine, 64, block, True, **options)
    doc = seq_of(("doc", 32 * block))
    a, b = doc.extend(Segment(1, block)), doc.extend(Segment(2, block))
    assert cache.admit(0, a, a.length, a.length, 0.0) is not None
    cache.commit(0, a.length, 0.0)
    m = cache.admit(1, b, b.length, b.length, 0.0)
    assert m is not None and m.hit_tokens == 32 * block
    assert cache.free_blocks() == 64 - 33 - 1  # the 32 shared blocks count once
    cache.release(0, 0.0)
    assert cache.free_blocks() == 64 - 33  # a's own block is free again; the shared ones are still held
    cache.release(1, 0.0)
    assert cache.free_blocks() == 64


@pytest.mark.parametrize(("engine", "block", "options"), [*ENGINES, ("trtllm", 4, {"host_cache_tokens": 40})])
def test_random_interleavings_keep_the_books_balanced(
    engine: str, block: int, options: dict[str, object]
) -> None:
    """Many overlapping requests with shared prefixes, growth, partial commits and pool pressure."""
    rng = random.Random(7)
    cache = make_cache(engine, 96, block, True, **options)
    roots = [
        Segment(chain_key(0, "root", r), rng.randint(1, 6) * block + rng.randint(0, block)) for r in range(4)
    ]
    running: dict[int, tuple[TokenSeq, int]] = {}
    for req_id in range(600):
        if running and (len(running) > 5 or rng.random() < 0.45):
            rid = rng.choice(sorted(running))
            seq, tokens = running.pop(rid)
            if rng.random() < 0.5 and cache.grow(rid, min(tokens + block, seq.length), 0.0):
                cache.commit(rid, min(tokens + block, seq.length), 0.0)
            cache.release(rid, 0.0)
            continue
        root = rng.choice(roots)
        seq = seq_of(
            (f"s{rng.randint(0, 5)}", rng.randint(1, 5 * block)),
            ("u", rng.randint(1, 3 * block)),
            parent=root,
        )
        p = rng.randint(1, seq.length)
        first = rng.randint(1, p)
        m = cache.admit(req_id, seq, p, max(first, cache.lookup(seq, p).hit_tokens), 0.0)
        assert 0.0 <= cache.usage() <= 1.0 and cache.free_blocks() >= 0
        if m is None:
            continue
        assert 0 <= m.hit_tokens <= p - 1 and 0 <= m.host_tokens <= m.hit_tokens
        done = max(first, m.hit_tokens)
        cache.commit(req_id, done, 0.0)
        running[req_id] = (seq, done)
    for rid in list(running):
        cache.release(rid, 0.0)
    assert cache.free_blocks() == 96 and cache.usage() == 0.0


def test_make_cache_rejects_bad_options_clearly() -> None:
    with pytest.raises(ValueError, match="engine must be one of vllm, sglang, trtllm"):
        make_cache("tgi", 10, 16)
    with pytest.raises(ValueError, match=r"unknown vllm cache option\(s\) partial_reuse \(allowed: none\)"):
        make_cache("vllm", 10, 16, True, partial_reuse=False)
    with pytest.raises(ValueError, match="eviction_policy must be one of lru, lfu"):
        make_cache("sglang", 10, 1, True, eviction_policy="mru")
    with pytest.raises(ValueError, match="host_cache_bytes needs kv_bytes_per_token"):
        make_cache("trtllm", 10, 32, True, host_cache_bytes=1 << 30)
    with pytest.raises(ValueError, match="num_blocks must be an integer >= 1"):
        make_cache("vllm", 0, 16)
    cache = make_cache(
        "trtllm", 10, 32, True, host_cache_bytes=1 << 20, kv_bytes_per_token=1024, eviction_policy=None
    )
    assert isinstance(cache, TrtllmCache) and cache.host_blocks == 1024 // 32

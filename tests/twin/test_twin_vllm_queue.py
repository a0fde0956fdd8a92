"""vLLM's cache model against a naive reference: one Python list as the free queue.

``VllmCache`` keeps the free queue as a stack of hashless blocks plus a deque with lazily deleted
(stale) entries, and reference-counts only hashed blocks. The reference below does the textbook
thing (pop the front, append freed cached blocks in reverse, prepend hashless ones, remove a touched
block from the middle); both must agree on every match, counter and the final eviction order.
"""

from __future__ import annotations

import random

import pytest

from prefixtune.twin.cache import VllmCache
from prefixtune.twin.cache.base import CacheStats, Match
from prefixtune.twin.prompt import Segment, TokenSeq, chain_key


class NaiveVllm:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool) -> None:
        self.bs = block_size
        self.pc = prefix_caching
        self.queue: list[int] = list(range(num_blocks))  # front = index 0
        self.hash: list[int | None] = [None] * num_blocks
        self.ref = [0] * num_blocks
        self.holders: dict[int, list[int]] = {}  # hash -> blocks holding it, first = the one hits use
        self.reqs: dict[int, tuple[list[int], list[int], list[int]]] = {}  # blocks, ids, [hashed]
        self.stats = CacheStats()

    def _hits(self, seq: TokenSeq, prompt_len: int) -> list[int]:
        if not self.pc:
            return []
        out = []
        for h in seq.block_keys(self.bs)[: (prompt_len - 1) // self.bs]:
            if h not in self.holders:
                break
            out.append(self.holders[h][0])
        return out

    def lookup(self, seq: TokenSeq, prompt_len: int) -> Match:
        n = len(self._hits(seq, prompt_len))
        return Match(n * self.bs, hit_blocks=n) if self.pc else Match(0)

    def _allocate(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b = self.queue.pop(0)
            h = self.hash[b]
            if h is not None:
                self.holders[h].remove(b)
                if not self.holders[h]:
                    del self.holders[h]
                self.hash[b] = None
                self.stats.evicted_blocks += 1
            self.ref[b] = 1
            out.append(b)
        return out

    def admit(self, rid: int, seq: TokenSeq, prompt_len: int, num_tokens: int) -> Match | None:
        hit = self._hits(seq, prompt_len)
        need = -(-num_tokens // self.bs) - len(hit)
        if need > len(self.queue) - sum(1 for b in hit if self.ref[b] == 0):
            return None
        for b in hit:
            if self.ref[b] == 0:
                self.queue.remove(b)
            self.ref[b] += 1
        blocks = hit + self._allocate(max(need, 0))
        self.reqs[rid] = (blocks, seq.block_keys(self.bs) if self.pc else [], [len(hit)])
        miss = -(-prompt_len // self.bs) - len(hit)
        self.stats.query_tokens += prompt_len
        self.stats.hit_tokens += len(hit) * self.bs
        self.stats.hit_blocks += len(hit)
        self.stats.miss_blocks += miss
        return Match(len(hit) * self.bs, hit_blocks=len(hit), miss_blocks=miss)

    def grow(self, rid: int, num_tokens: int) -> bool:
        blocks = self.reqs[rid][0]
        need = -(-num_tokens // self.bs) - len(blocks)
        if need > len(self.queue):
            return False
        blocks.extend(self._allocate(max(need, 0)))
        return True

    def commit(self, rid: int, computed: int) -> None:
        blocks, ids, hashed = self.reqs[rid]
        full = min(computed // self.bs, len(blocks), len(ids))
        for i in range(hashed[0], full):
            self.hash[blocks[i]] = ids[i]
            self.holders.setdefault(ids[i], []).append(blocks[i])
        hashed[0] = max(hashed[0], full)

    def release(self, rid: int) -> None:
        blocks, _, _ = self.reqs.pop(rid)
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.hash[b] is None:
                    self.queue.insert(0, b)
                else:
                    self.queue.append(b)


def _seq(rng: random.Random, roots: int) -> TokenSeq:
    segs, key = [], 0
    for _ in range(rng.randint(1, 4)):
        key = chain_key(key, rng.randrange(roots))  # few roots: prefixes (and repeats) are shared
        segs.append(Segment(key, rng.randint(1, 20)))
    return TokenSeq(tuple(segs))


@pytest.mark.parametrize("seed", range(150))
def test_vllm_cache_matches_the_naive_free_queue(seed: int) -> None:
    rng = random.Random(seed)
    nb, bs, pc = rng.randint(1, 24), rng.choice([1, 2, 4]), rng.random() < 0.85
    fast, ref = VllmCache(nb, bs, pc), NaiveVllm(nb, bs, pc)
    roots = rng.randint(1, 4)
    live: dict[int, list[int]] = {}  # request -> [seq length, tokens allocated]
    seqs: dict[int, TokenSeq] = {}
    for rid in range(400):
        op = rng.random()
        if op < 0.35 or not live:
            s = _seq(rng, roots)
            p = rng.randint(1, s.length)
            n = rng.randint(p - p // 2, s.length)
            assert fast.lookup(s, p) == ref.lookup(s, p)
            m = fast.admit(rid, s, p, n, 0.0)
            assert m == ref.admit(rid, s, p, n)
            if m is not None:
                live[rid], seqs[rid] = [s.length, n], s
        else:
            r = rng.choice(list(live))
            if op < 0.55:
                t = rng.randint(1, live[r][0])
                ok = fast.grow(r, t, 0.0)
                assert ok == ref.grow(r, t)
                if ok:
                    live[r][1] = max(live[r][1], t)
            elif op < 0.8:
                c = rng.randint(0, live[r][1])
                fast.commit(r, c, 0.0)
                ref.commit(r, c)
            else:
                del live[r]
                fast.release(r, 0.0)
                ref.release(r)
        assert fast.free_blocks() == len(ref.queue)
        assert fast.cached_blocks() == sum(len(h) for h in ref.holders.values())
        assert fast.stats == ref.stats
    for r in list(live):
        fast.release(r, 0.0)
        ref.release(r)
    # the whole free queue, front to back, block by block
    assert fast._allocate(fast.free_blocks()) == ref._allocate(len(ref.queue))
    assert fast.stats == ref.stats


def test_stale_entries_are_compacted_in_order() -> None:
    """Touching free blocks over and over with no eviction piles up stale entries; compaction
    bounds the queue and keeps the LRU order."""
    cache, ref = VllmCache(64, 4), NaiveVllm(64, 4, True)
    seqs = [TokenSeq((Segment(chain_key(0, i), 9),)) for i in range(4)]  # 2 full blocks each
    for rid in range(2000):
        s = seqs[rid % 4]
        assert cache.admit(rid, s, 9, 9, 0.0) == ref.admit(rid, s, 9, 9)
        cache.commit(rid, 9, 0.0)
        ref.commit(rid, 9)
        cache.release(rid, 0.0)
        ref.release(rid)
    assert len(cache._queue) <= 2 * cache.free_blocks() + cache.num_blocks
    assert cache._allocate(cache.free_blocks()) == ref._allocate(len(ref.queue))


def _same_state(fast: VllmCache, ref: NaiveVllm) -> None:
    assert fast.free_blocks() == len(ref.queue)
    assert fast.cached_blocks() == sum(len(h) for h in ref.holders.values())
    assert fast.stats == ref.stats


def test_duplicate_holders_evicted_in_one_allocation() -> None:
    """Two blocks hold one hash (the capped last block of a fully cached prompt is recomputed);
    both are free; evicting the first holder promotes the other, evicting that one forgets the hash."""
    fast, ref = VllmCache(8, 2), NaiveVllm(8, 2, True)
    head = Segment(chain_key(0, "a"), 4)
    a = TokenSeq((head,))  # two full blocks
    longer = TokenSeq((head, Segment(chain_key(head.key, "more"), 2)))  # looks both blocks up
    for rid in (0, 1):  # the second admission hits block 0 and recomputes block 1: a duplicate
        assert fast.admit(rid, a, 4, 4, 0.0) == ref.admit(rid, a, 4, 4)
        fast.commit(rid, 4, 0.0)
        ref.commit(rid, 4)
    assert fast._dups  # the case under test
    for rid in (0, 1):
        fast.release(rid, 0.0)
        ref.release(rid)
    _same_state(fast, ref)
    plain = len(ref.queue) - 3  # hashless blocks come first, then the three cached ones
    b = TokenSeq((Segment(chain_key(0, "b"), 2 * (plain + 1)),))
    assert fast.admit(2, b, 1, 2 * (plain + 1), 0.0) == ref.admit(2, b, 1, 2 * (plain + 1))  # one eviction
    _same_state(fast, ref)
    assert fast.lookup(longer, 6) == ref.lookup(longer, 6) == Match(4, hit_blocks=2)  # the duplicate hits
    c = TokenSeq((Segment(chain_key(0, "c"), 4),))
    assert fast.admit(3, c, 1, 4, 0.0) == ref.admit(3, c, 1, 4)  # evicts the promoted holder and block 0
    _same_state(fast, ref)
    assert not fast._dups
    assert fast.lookup(longer, 6) == ref.lookup(longer, 6) == Match(0)


def test_release_of_a_single_hashed_block() -> None:
    fast, ref = VllmCache(4, 4), NaiveVllm(4, 4, True)
    s = TokenSeq((Segment(chain_key(0, "x"), 6),))  # one full block and a partial one
    assert fast.admit(0, s, 6, 6, 0.0) == ref.admit(0, s, 6, 6)
    fast.commit(0, 6, 0.0)
    ref.commit(0, 6)
    fast.release(0, 0.0)
    ref.release(0)
    _same_state(fast, ref)
    assert fast._allocate(fast.free_blocks()) == ref._allocate(len(ref.queue))


@pytest.mark.parametrize("seed", range(12))
def test_long_runs_on_a_busy_pool_match_the_naive_free_queue(seed: int) -> None:
    """Longer sequences and pools than the sweep above: allocations that evict many entries at once,
    with stale and duplicate entries among them, and queues long enough to compact."""
    rng = random.Random(1000 + seed)
    nb, bs = rng.randint(24, 96), rng.choice([1, 2, 4])
    fast, ref = VllmCache(nb, bs), NaiveVllm(nb, bs, True)
    live: dict[int, list[int]] = {}
    for rid in range(1500):
        if rng.random() < 0.45 or not live:
            segs, key = [], 0
            for _ in range(rng.randint(1, 6)):
                key = chain_key(key, rng.randrange(3))
                segs.append(Segment(key, rng.randint(1, 3 * bs)))
            s = TokenSeq(tuple(segs))
            p = rng.randint(1, s.length)
            n = rng.randint(p, s.length)
            m = fast.admit(rid, s, p, n, 0.0)
            assert m == ref.admit(rid, s, p, n)
            if m is not None:
                live[rid] = [s.length, n]
                c = rng.randint(0, n)  # often partly committed, as a preempted request
                fast.commit(rid, c, 0.0)
                ref.commit(rid, c)
        else:
            r = rng.choice(list(live))
            if rng.random() < 0.5:
                t = rng.randint(1, live[r][0])
                assert fast.grow(r, t, 0.0) == ref.grow(r, t)
            else:
                del live[r]
                fast.release(r, 0.0)
                ref.release(r)
        _same_state(fast, ref)
    for r in list(live):
        fast.release(r, 0.0)
        ref.release(r)
    assert fast._allocate(fast.free_blocks()) == ref._allocate(len(ref.queue))


# -- chains: a request's freed blocks of one prompt segment enter the queue together (tail first);
# these cases put chain boundaries where a free queue is hardest to get right (a chain evicted in
# part, a hit ending inside one, duplicates, gaps), step by step against the naive queue.


class _Both:
    """Drives VllmCache and NaiveVllm with the same calls and checks they agree after each."""

    def __init__(self, nb: int, bs: int) -> None:
        self.fast, self.ref = VllmCache(nb, bs), NaiveVllm(nb, bs, True)

    def admit(self, rid: int, s: TokenSeq, p: int, n: int) -> Match | None:
        assert self.fast.lookup(s, p) == self.ref.lookup(s, p)
        m = self.fast.admit(rid, s, p, n, 0.0)
        assert m == self.ref.admit(rid, s, p, n)
        _same_state(self.fast, self.ref)
        return m

    def grow(self, rid: int, n: int) -> bool:
        ok = self.fast.grow(rid, n, 0.0)
        assert ok == self.ref.grow(rid, n)
        _same_state(self.fast, self.ref)
        return ok

    def commit(self, rid: int, c: int) -> None:
        self.fast.commit(rid, c, 0.0)
        self.ref.commit(rid, c)
        _same_state(self.fast, self.ref)

    def release(self, rid: int) -> None:
        self.fast.release(rid, 0.0)
        self.ref.release(rid)
        _same_state(self.fast, self.ref)

    def lookup(self, s: TokenSeq, p: int) -> Match:
        m = self.fast.lookup(s, p)
        assert m == self.ref.lookup(s, p)
        return m

    def drain(self) -> None:
        assert self.fast._allocate(self.fast.free_blocks()) == self.ref._allocate(len(self.ref.queue))
        assert self.fast.stats == self.ref.stats


def _one_segment(name: str, n: int) -> TokenSeq:
    return TokenSeq((Segment(chain_key(0, name), n),))


def test_partial_eviction_of_a_chain_takes_its_tail() -> None:
    both = _Both(8, 1)
    a = _one_segment("a", 6)
    both.admit(0, a, 6, 6)
    both.commit(0, 6)
    both.release(0)  # one chain in the queue: blocks of slots 6..1
    b = _one_segment("b", 4)
    both.admit(1, b, 4, 4)  # 2 hashless blocks, then 2 evictions from the chain's front (slots 6, 5)
    assert both.lookup(a, 6) == Match(4, hit_blocks=4)
    assert both.grow(1, 5)  # one more: slot 4
    assert both.lookup(a, 6) == Match(3, hit_blocks=3)
    both.release(1)
    both.drain()


def test_hit_that_ends_inside_a_chain_leaves_its_front_queued() -> None:
    both = _Both(12, 1)
    a = _one_segment("a", 8)
    both.admit(0, a, 8, 8)
    both.commit(0, 8)
    both.release(0)
    head = TokenSeq((Segment(a.segments[0].key, 3), Segment(chain_key(a.segments[0].key, "x"), 2)))
    assert both.admit(1, head, 5, 5) == Match(3, hit_blocks=3, miss_blocks=2)  # the chain's back 3
    assert both.admit(2, _one_segment("c", 6), 6, 6)  # evicts 4 from the chain's front (slots 8..5)
    both.release(1)
    both.release(2)
    both.drain()


def test_touch_inside_a_chain_and_duplicates() -> None:
    """A chain whose blocks alternate between first holders and duplicates: a hit takes blocks from
    its middle and front; evicting the rest promotes and drops holders in queue order."""
    both = _Both(16, 1)
    p = _one_segment("p", 5)
    both.admit(0, p, 5, 5)  # A
    both.admit(1, p, 5, 5)  # B: nothing is cached yet, so it computes the same blocks
    both.commit(0, 1)  # A: slot 1 first
    both.commit(1, 2)  # B: slot 1 a duplicate, slot 2 first
    both.commit(0, 3)  # A: slot 2 a duplicate, slot 3 first
    both.commit(1, 4)  # B: slot 3 a duplicate, slot 4 first
    assert both.fast._dups
    both.release(1)  # B's chain: slots 4 (first), 3 (dup), 2 (first), 1 (dup)
    assert both.admit(2, p, 5, 5) == Match(4, hit_blocks=4, miss_blocks=1)  # touches slots 2 and 4
    both.release(0)
    both.release(2)
    big = _one_segment("big", 12)
    assert both.admit(3, big, 12, 12)  # evicts across all of it
    assert both.lookup(p, 5) == both.ref.lookup(p, 5)
    both.release(3)
    both.drain()


def test_capped_last_block_is_recomputed_as_a_duplicate_then_promoted() -> None:
    both = _Both(12, 2)
    a = _one_segment("a", 6)  # three full blocks
    both.admit(0, a, 6, 6)
    both.commit(0, 6)
    both.release(0)
    assert both.admit(1, a, 6, 6) == Match(4, hit_blocks=2, miss_blocks=1)  # prompt - 1 cap
    both.commit(1, 6)  # the third block again: a duplicate
    both.release(1)
    for rid, n in ((2, 9), (3, 1), (4, 1), (5, 1)):  # held: the plain blocks, then one eviction each
        assert both.admit(rid, _one_segment(f"f{rid}", n * 2), 1, n * 2)
        assert both.lookup(a, 6) == both.ref.lookup(a, 6)
    both.drain()


def test_gap_in_a_chain_stops_hits_but_the_later_blocks_stay_cached() -> None:
    """A sequence whose middle block is not cached while later ones are (another sequence holds
    them): the hit stops at the gap, and the later blocks occupy the pool until evicted."""
    both = _Both(12, 1)
    k1 = chain_key(0, "s")
    k2 = chain_key(k1, "t")
    short = TokenSeq((Segment(k1, 2), Segment(k2, 4)))
    long = TokenSeq((Segment(k1, 3), Segment(k2, 4)))  # block keys of k2 shared with `short`
    both.admit(0, short, 6, 6)
    both.commit(0, 6)
    both.release(0)
    assert both.lookup(long, 7) == Match(2, hit_blocks=2)  # (k1, 3) is missing
    assert both.admit(1, long, 7, 7) == Match(2, hit_blocks=2, miss_blocks=5)
    both.commit(1, 7)  # k2's blocks again: duplicates of short's
    both.release(1)
    assert both.admit(2, _one_segment("z", 9), 9, 9)
    assert both.lookup(short, 6) == both.ref.lookup(short, 6)
    both.release(2)
    both.drain()


def test_preempted_request_releases_its_uncommitted_blocks_first() -> None:
    both = _Both(10, 2)
    a = _one_segment("a", 12)
    both.admit(0, a, 12, 12)
    both.commit(0, 5)  # two of six blocks hashed, then preempted
    both.release(0)
    assert both.admit(1, a, 12, 12) == Match(4, hit_blocks=2, miss_blocks=4)
    both.commit(1, 12)
    both.release(1)
    assert both.admit(2, _one_segment("b", 14), 14, 14)
    assert both.lookup(a, 12) == both.ref.lookup(a, 12)
    both.drain()

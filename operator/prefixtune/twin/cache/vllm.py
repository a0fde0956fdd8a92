"""vLLM V1's KV cache: a block pool with chained block hashes and an LRU free queue.

Semantics (reference/engines.md §3.1):

- Only full blocks are hashed; a block's hash names the whole prefix ending at it, which is exactly
  ``TokenSeq.block_keys(block_size)`` (``block_ids`` as ints).
- A hit is the longest run of consecutive cached blocks from the start, within the first
  ``prompt - 1`` tokens (the last token is always computed).
- The free queue: allocation pops the FRONT (evicting a hash the block still holds); freed cached
  blocks are appended to the TAIL, a request's blocks in REVERSE order (so the tail of a chain is
  evicted first); freed blocks without a hash are PREPENDED (reused before any cached block); a hit
  on a free block takes it out of the queue (``touch``).
- Several blocks may hold the same hash (the capped last block of a fully cached prompt is
  recomputed into a fresh block): vLLM keeps them all in its hash map and hits the first one.

How it is kept cheap (about 90 blocks move through the pool per request, so per-block work is what
costs): the free queue is a stack of hashless free blocks (they all sit at the front; which one
comes first is unobservable) and, for cached free blocks, LRU at the left, two parallel deques of
entries: ``_queue`` (the block) and ``_queue_h`` (the hash it held when queued; no tuple per entry,
which the allocator would touch cold). A touch does not remove the block's entry: it counts it
*stale* instead (``_stale[block]``); a block's stale entries are always older than its live one, so
allocation pops from the left and skips an entry while its block has stale ones left. The entry
carries the hash, so eviction needs no per-block hash table, and an allocation drops the evicted
hashes from the hash map in one bulk pass (block by block only when one of them has duplicates).
A request's blocks are ``hashed`` leading blocks (hit or committed) followed by hashless ones, so a
release sends the hashless tail to the stack in one slice and only reference-counts the hashed
part. ``_ref`` counts holders of hashed blocks; a hashless block (one holder at most: hashless
blocks are never hit) keeps 1, so committing a block writes no count, and an evicted block is set
back to 1.
Prefix caching off: nothing is hashed, nothing hits, every freed block is hashless.

This is the reference model and the fallback: ``make_cache`` runs the same semantics in C
(``_vllm_pool.c`` behind ``NativeVllmCache``, about a fifth of the cost per request) when that
is built.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import compress, islice, takewhile
from operator import eq, is_not, itemgetter

from prefixtune.twin.cache.base import CacheStats, Match, check_lengths
from prefixtune.twin.prompt import TokenSeq

BlockKey = int  # TokenSeq.block_keys: a block's chained hash as one int

_is_block = partial(is_not, None)  # a hash-map lookup found a block (block 0 is falsy)
_is_one = partial(eq, 1)  # a holder count that a release drops to 0
_consume = deque[object](maxlen=0).extend  # runs an iterator of side effects at C speed


def count_admission(stats: CacheStats, prompt_len: int, hit_blocks: int, block_size: int) -> Match:
    """vLLM's counters for one admitted request (its prompt, the full blocks it hit), and its Match."""
    hit_tokens = hit_blocks * block_size
    miss = -(-prompt_len // block_size) - hit_blocks
    stats.query_tokens += prompt_len
    stats.hit_tokens += hit_tokens
    stats.hit_blocks += hit_blocks
    stats.miss_blocks += miss
    return Match(hit_tokens, hit_blocks=hit_blocks, miss_blocks=miss)


@dataclass(slots=True)
class _Running:
    seq: TokenSeq
    prompt_len: int
    blocks: list[int]  # block ids in sequence order
    ids: list[BlockKey] | None  # block hashes of the whole seq (computed once; None when caching is off)
    hashed: int  # leading blocks that hold their hash (blocks[i] holds ids[i]); the rest hold none


@dataclass
class VllmCache:
    """The block pool of one vLLM engine (``num_blocks`` blocks of ``block_size`` tokens)."""

    num_blocks: int
    block_size: int
    prefix_caching: bool = True
    stats: CacheStats = field(default_factory=CacheStats)

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        n = self.num_blocks
        # holders of a hashed block; 0 exactly for the cached free ones. Hashless blocks keep 1 (used
        # or not), so a block is counted right the moment it is committed, with no write then.
        self._ref: list[int] = [1] * n
        # hash -> the block a hit uses (the first cached); further holders of the same hash in _dups
        self._cached: dict[BlockKey, int] = {}
        self._dups: dict[BlockKey, list[int]] = {}
        # cached free blocks, LRU at the left; an entry is stale while its block has _stale left
        self._queue: deque[int] = deque()  # blocks
        self._queue_h: deque[BlockKey] = deque()  # the hash each entry's block held when queued
        self._stale: list[int] = [0] * n
        self._queued = 0  # live entries in _queue: free blocks that hold a hash
        self._free_plain: list[int] = list(range(n - 1, -1, -1))  # stack: pop() is the queue front
        self._reqs: dict[int, _Running] = {}

    # -- queries -------------------------------------------------------------------------------

    def _hit_blocks(self, ids: list[BlockKey], prompt_len: int) -> list[int]:
        limit = (prompt_len - 1) // self.block_size
        # the longest run of cached hashes from the start, found without a Python loop
        found: Iterator[int | None] = map(self._cached.get, islice(ids, limit))
        return list(takewhile(_is_block, found))  # type: ignore[arg-type]  # stops before the first None

    def lookup(self, seq: TokenSeq, prompt_len: int) -> Match:
        if not self.prefix_caching:
            return Match(0)
        ids = seq.block_keys(self.block_size, limit=prompt_len - 1)
        n = len(self._hit_blocks(ids, prompt_len))
        return Match(n * self.block_size, hit_blocks=n)

    def free_blocks(self) -> int:
        return len(self._free_plain) + self._queued

    def usage(self) -> float:
        return 1.0 - (len(self._free_plain) + self._queued) / self.num_blocks

    def cached_blocks(self) -> int:
        """Blocks holding a hash (referenced or not): the size of the prefix cache."""
        return len(self._cached) + sum(len(d) for d in self._dups.values())

    # -- pool operations ------------------------------------------------------------------------

    def _allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the front of the free queue (caller checked there are enough)."""
        plain = self._free_plain
        k = min(n, len(plain))
        if k:
            out = plain[-k:]
            out.reverse()  # the stack's top is the queue front
            del plain[-k:]
        else:
            out = []
        m = n - k
        if m:
            self._queued -= m
            self.stats.evicted_blocks += m
            popleft = self._queue.popleft
            popleft_h = self._queue_h.popleft
            stale = self._stale
            ref = self._ref
            hashes: list[BlockKey] = []
            keep = hashes.append
            append = out.append
            while m:
                b = popleft()
                if stale[b]:  # touched since this entry was queued: its live entry is further back
                    stale[b] -= 1
                    popleft_h()
                    continue
                keep(popleft_h())
                ref[b] = 1  # hashless now
                append(b)
                m -= 1
            dups = self._dups
            if dups and not dups.keys().isdisjoint(hashes):
                cached = self._cached
                for b, h in zip(out[k:], hashes, strict=True):
                    if h in dups:
                        self._uncache(b, h)
                    else:
                        del cached[h]
            else:
                _consume(map(self._cached.pop, hashes))  # evict the hashes the blocks still hold
        return out

    def _uncache(self, block: int, h: BlockKey) -> None:
        dups = self._dups.get(h)
        if self._cached[h] == block:
            if dups:
                self._cached[h] = dups.pop(0)  # the next one cached is the one hits use now
                if not dups:
                    del self._dups[h]
            else:
                del self._cached[h]
        else:
            dups.remove(block)  # type: ignore[union-attr]  # a non-first holder is in dups
            if not dups:
                del self._dups[h]

    def _compact(self) -> None:
        """Drop stale entries (touches pile them up while nothing is evicted); order is kept."""
        stale = self._stale
        live: list[int] = []
        live_h: list[BlockKey] = []
        keep = live.append
        keep_h = live_h.append
        for b, h in zip(self._queue, self._queue_h, strict=True):
            if stale[b]:
                stale[b] -= 1
            else:
                keep(b)
                keep_h(h)
        self._queue = deque(live)
        self._queue_h = deque(live_h)

    def admit(self, req_id: int, seq: TokenSeq, prompt_len: int, num_tokens: int, now: float) -> Match | None:
        if req_id in self._reqs:
            raise ValueError(f"request {req_id} is already admitted")
        if not (1 <= prompt_len <= seq.length and num_tokens >= 1):
            check_lengths(seq, prompt_len, num_tokens)
        bs = self.block_size
        if self.prefix_caching:
            ids = seq.block_keys(bs)
            # the longest run of cached hashes from the start (as _hit_blocks)
            found: Iterator[int | None] = map(self._cached.get, islice(ids, (prompt_len - 1) // bs))
            hit: list[int] = list(takewhile(_is_block, found))  # type: ignore[arg-type]
        else:
            ids = None
            hit = []
        nh = len(hit)
        need = -(-num_tokens // bs) - nh
        ref = self._ref
        free = len(self._free_plain) + self._queued
        # touched free blocks leave the queue: count them only when the bound says they could matter
        if need > free - nh and need > free - list(map(ref.__getitem__, hit)).count(0):
            return None
        if nh:
            stale = self._stale
            touched = 0
            for b in hit:  # touch: a free cached block leaves the queue (its entry goes stale)
                if ref[b]:
                    ref[b] += 1
                else:
                    ref[b] = 1
                    stale[b] += 1
                    touched += 1
            if touched:
                self._queued -= touched
                if len(self._queue) > 2 * self._queued + self.num_blocks:
                    self._compact()
        blocks = hit + self._allocate(need) if need > 0 else hit
        self._reqs[req_id] = _Running(seq, prompt_len, blocks, ids, nh)
        return count_admission(self.stats, prompt_len, nh, bs)

    def grow(self, req_id: int, num_tokens: int, now: float) -> bool:
        r = self._reqs.get(req_id)
        if r is None:
            raise KeyError(f"request {req_id} is not admitted")
        need = -(-num_tokens // self.block_size) - len(r.blocks)
        if need <= 0:
            return True
        if need > len(self._free_plain) + self._queued:
            return False
        r.blocks += self._allocate(need)
        return True

    def commit(self, req_id: int, computed_tokens: int, now: float) -> None:
        r = self._reqs.get(req_id)
        if r is None:
            raise KeyError(f"request {req_id} is not admitted")
        ids = r.ids
        if ids is None:
            return
        blocks = r.blocks
        start = r.hashed
        full = min(computed_tokens // self.block_size, len(blocks), len(ids))
        if full <= start:
            return
        new_blocks = blocks[start:full]
        new_ids = ids[start:full]
        r.hashed = full
        # one pass: each hash maps to its block unless some block holds it already (then this one
        # is a duplicate); their ref is 1 already (hashless blocks keep 1)
        holders = list(map(self._cached.setdefault, new_ids, new_blocks))
        if holders != new_blocks:
            dups = self._dups
            for b, h, first in zip(new_blocks, new_ids, holders, strict=True):
                if first != b:
                    dups.setdefault(h, []).append(b)

    def release(self, req_id: int, now: float) -> None:
        r = self._reqs.pop(req_id, None)
        if r is None:
            raise KeyError(f"request {req_id} is not admitted")
        blocks = r.blocks
        k = r.hashed
        if k < len(blocks):  # hashless blocks go to the front; the tail block ends up behind
            self._free_plain.extend(reversed(blocks[k:]))
        if not k:
            return
        ids = r.ids
        assert ids is not None  # hashed blocks exist only with prefix caching
        # tail blocks first: they are evicted first
        rev_blocks = blocks[k - 1 :: -1]
        rev_ids = ids[k - 1 :: -1]
        ref = self._ref
        # holders before this release (one C-level gather)
        held: tuple[int, ...] = itemgetter(*rev_blocks)(ref) if k > 1 else (ref[rev_blocks[0]],)
        z = held.count(1)  # free after it
        if held[:z].count(1) == z:  # the freed ones lead (usual: a shared prefix stays held)
            for b in rev_blocks[:z]:
                ref[b] = 0
            for b in rev_blocks[z:]:
                ref[b] -= 1
            self._queue.extend(rev_blocks[:z])
            self._queue_h.extend(rev_ids[:z])
            self._queued += z
            return
        for b in rev_blocks:
            ref[b] -= 1
        freed = list(map(_is_one, held))
        self._queue.extend(compress(rev_blocks, freed))
        self._queue_h.extend(compress(rev_ids, freed))
        self._queued += z

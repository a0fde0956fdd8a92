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

The free queue is two O(1) structures: a stack of hashless free blocks (they all sit at the front;
which one comes first is unobservable) and an insertion-ordered dict of cached free blocks (LRU at
the front). Prefix caching off: nothing is hashed, nothing hits, every freed block is hashless.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import islice, takewhile
from operator import is_not

from prefixtune.twin.cache.base import CacheStats, Match
from prefixtune.twin.prompt import TokenSeq

BlockKey = int  # TokenSeq.block_keys: a block's chained hash as one int

_is_block = partial(is_not, None)  # a hash-map lookup found a block (block 0 is falsy)


@dataclass(slots=True)
class _Running:
    seq: TokenSeq
    prompt_len: int
    blocks: list[int]  # block ids in sequence order
    ids: list[BlockKey] | None  # block hashes of the whole seq (computed once; None when caching is off)
    hashed: int  # leading blocks that hold their hash


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
        self._hash: list[BlockKey | None] = [None] * n
        self._ref: list[int] = [0] * n
        # hash -> the block a hit uses (the first cached); further holders of the same hash in _dups
        self._cached: dict[BlockKey, int] = {}
        self._dups: dict[BlockKey, list[int]] = {}
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # LRU order: front is evicted first
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
        return len(self._free_plain) + len(self._free_cached)

    def usage(self) -> float:
        return 1.0 - self.free_blocks() / self.num_blocks

    def cached_blocks(self) -> int:
        """Blocks holding a hash (referenced or not): the size of the prefix cache."""
        return len(self._cached) + sum(len(d) for d in self._dups.values())

    # -- pool operations ------------------------------------------------------------------------

    def _allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the front of the free queue (caller checked there are enough)."""
        plain = self._free_plain
        k = min(n, len(plain))
        out = plain[-k:][::-1] if k else []  # the stack's top is the queue front
        if k:
            del plain[-k:]
        if n > k:
            pop = self._free_cached.popitem
            hashes = self._hash
            cached = self._cached
            dups = self._dups
            append = out.append
            for _ in range(n - k):
                b, _ = pop(last=False)
                h = hashes[b]  # blocks in this queue hold a hash: evict it
                hashes[b] = None
                if h in dups:
                    self._uncache(b, h)
                else:
                    del cached[h]  # type: ignore[arg-type]
                append(b)
            self.stats.evicted_blocks += n - k
        ref = self._ref
        for b in out:
            ref[b] = 1
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

    def admit(self, req_id: int, seq: TokenSeq, prompt_len: int, num_tokens: int, now: float) -> Match | None:
        if req_id in self._reqs:
            raise ValueError(f"request {req_id} is already admitted")
        _check_lengths(seq, prompt_len, num_tokens)
        bs = self.block_size
        ids = seq.block_keys(bs) if self.prefix_caching else None
        hit = self._hit_blocks(ids, prompt_len) if ids is not None else []
        need = -(-num_tokens // bs) - len(hit)
        touched_free = sum(1 for b in hit if self._ref[b] == 0)
        if need > self.free_blocks() - touched_free:
            return None
        ref = self._ref
        for b in hit:  # touch: a free cached block leaves the queue
            if ref[b] == 0:
                del self._free_cached[b]
            ref[b] += 1
        blocks = hit + self._allocate(max(need, 0))
        self._reqs[req_id] = _Running(seq, prompt_len, blocks, ids, len(hit))
        hit_tokens = len(hit) * bs
        self.stats.query_tokens += prompt_len
        self.stats.hit_tokens += hit_tokens
        self.stats.hit_blocks += len(hit)
        self.stats.miss_blocks += -(-prompt_len // bs) - len(hit)
        return Match(hit_tokens, hit_blocks=len(hit), miss_blocks=-(-prompt_len // bs) - len(hit))

    def grow(self, req_id: int, num_tokens: int, now: float) -> bool:
        r = self._req(req_id)
        need = -(-num_tokens // self.block_size) - len(r.blocks)
        if need <= 0:
            return True
        if need > self.free_blocks():
            return False
        r.blocks.extend(self._allocate(need))
        return True

    def commit(self, req_id: int, computed_tokens: int, now: float) -> None:
        r = self._req(req_id)
        if r.ids is None:
            return
        full = min(computed_tokens // self.block_size, len(r.blocks), len(r.ids))
        if full <= r.hashed:
            return
        hashes = self._hash
        cached = self._cached
        for b, h in zip(r.blocks[r.hashed : full], r.ids[r.hashed : full], strict=True):
            hashes[b] = h
            if h in cached:
                self._dups.setdefault(h, []).append(b)
            else:
                cached[h] = b
        r.hashed = full

    def release(self, req_id: int, now: float) -> None:
        r = self._reqs.pop(req_id, None)
        if r is None:
            raise KeyError(f"request {req_id} is not admitted")
        ref = self._ref
        hashes = self._hash
        to_plain = self._free_plain.append
        free_cached = self._free_cached
        for b in reversed(r.blocks):  # tail blocks first: they are evicted first
            n = ref[b] - 1
            ref[b] = n
            if n == 0:
                if hashes[b] is None:
                    to_plain(b)
                else:
                    free_cached[b] = None

    def _req(self, req_id: int) -> _Running:
        r = self._reqs.get(req_id)
        if r is None:
            raise KeyError(f"request {req_id} is not admitted")
        return r


def _check_lengths(seq: TokenSeq, prompt_len: int, num_tokens: int) -> None:
    if not 1 <= prompt_len <= seq.length:
        raise ValueError(f"prompt_len must be in 1..{seq.length} (the seq length), got {prompt_len}")
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")

"""TensorRT-LLM's KV cache: a radix tree of blocks with partial reuse and an optional host tier.

Semantics (reference/engines.md §3.3; ``kvCacheManager.cpp`` ``addSequence``/``loadOrAllocateBlocks``/
``storeContextBlocks``/``storeBlocksForReuse``):

- Blocks of ``tokens_per_block`` tokens form a radix tree (each block's key is its tokens after its
  parent). A new request matches its first ``input - 1`` tokens block by block ("the last token
  cannot be reused"); its last query block may be partial.
- Partial reuse (``enable_partial_reuse``, default on): when no child matches a query block exactly,
  the child sharing the longest run of leading tokens contributes those tokens and matching stops.
  With ``copy_on_partial_reuse`` (default on) the matched tokens are copied into a new block; without
  it only an unreferenced leaf can be taken over (it leaves the tree). Partial reuse off: full blocks.
- Counters: reused blocks (full + partial), missed blocks (the rest of ceil(input / block)), reused
  tokens (``prompt_cached_tokens``), input tokens.
- Stored: full blocks of the first ``computed - 1`` tokens when prefill completes
  (``storeContextBlocks``); at release also the partly filled last block (``storeBlocksForReuse``),
  which only partial reuse can hit (stored only when partial reuse is on).
- Eviction: LRU over unreferenced LEAF blocks. Retention priorities exist in TensorRT-LLM (0-100,
  default 35); this model gives every block the default priority, so it is plain LRU.
- Host tier (``host_cache_size``): an evicted GPU block is copied to host memory (LRU there, a host
  block is dropped only as a leaf) and stays in the tree; a hit on it is onboarded into a GPU block
  and reported in ``Match.host_tokens`` (the scheduler charges the PCIe transfer).

Duplicates: when a request stores a block whose key already has a node (another request stored the
same prefix meanwhile), this model frees the request's copy and references the existing node (the
engine keeps its private copy until release); capacity differs by that copy at most.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import count

from prefixtune.twin.cache.base import CacheStats, Match, admitted, check_lengths
from prefixtune.twin.prompt import PrefixId, TokenSeq

_SCAN_CHILDREN = 8  # up to this many children, partial matching compares with each; beyond, an index


class _Block:
    __slots__ = (
        "access",
        "alive",
        "children",
        "full",
        "gpu_children",
        "key",
        "ntok",
        "on_gpu",
        "parent",
        "partial",
        "pinned",
        "ref",
        "seq",
        "start",
        "uid",
    )

    def __init__(
        self,
        parent: _Block | None,
        seq: TokenSeq | None,
        start: int,
        ntok: int,
        key: PrefixId,
        full: bool,
        uid: int,
    ):
        self.parent = parent
        self.seq = seq
        self.start = start  # absolute token position of the block in seq
        self.ntok = ntok
        self.full = full
        self.key = key  # identity of the block's last token (with its parent: the whole prefix)
        # child blocks (full and partly filled) by their key; a full block's key is the id at a block
        # boundary, a partial one's is not, so an exact lookup by block id only finds full blocks
        self.children: dict[PrefixId, _Block] = {}
        # built on demand at wide branch points: segment key -> {child: max offset it holds}
        self.partial: dict[int, dict[_Block, int]] | None = None
        self.gpu_children = 0
        self.ref = 0
        self.on_gpu = True
        self.pinned = False
        self.access = 0
        self.alive = True
        self.uid = uid


def _block_pieces(seq: TokenSeq, start: int, ntok: int, key: PrefixId) -> list[tuple[int, int, int]]:
    """``_pieces`` of a block whose last token is ``key``: one piece when the block lies in one segment."""
    if key[1] >= ntok:
        return [(key[0], key[1] - ntok, key[1])]
    return _pieces(seq, start, start + ntok)


def _pieces(seq: TokenSeq, start: int, end: int) -> list[tuple[int, int, int]]:
    """Segments overlapping tokens [start, end): (key, lo, hi) with the covered offsets in (lo, hi]."""
    ends = seq._ends  # cached segment end positions (TokenSeq internals, read-only)
    i = bisect_right(ends, start)
    out = []
    segs = seq.segments
    while i < len(segs) and ends[i] - segs[i].length < end:
        seg_start = ends[i] - segs[i].length
        lo = start - seg_start if start > seg_start else 0
        out.append((segs[i].key, lo, (end if end < ends[i] else ends[i]) - seg_start))
        i += 1
    return out


@dataclass(slots=True)
class _Running:
    seq: TokenSeq
    prompt_len: int
    ids: list[PrefixId]  # block keys of the whole seq
    path: list[_Block]  # referenced tree blocks, in sequence order (all full, all on GPU)
    private: int  # blocks held outside the tree
    stored_limit: int  # tokens whose blocks have been offered to the tree


@dataclass(frozen=True, slots=True)
class _Plan:
    full: list[_Block]
    partial_tokens: int
    partial_block: _Block | None

    def host_tokens(self, block_size: int) -> int:
        host = sum(block_size for b in self.full if not b.on_gpu)
        if self.partial_block is not None and not self.partial_block.on_gpu:
            host += self.partial_tokens
        return host


@dataclass
class TrtllmCache:
    """The block pool of one TensorRT-LLM engine (``num_blocks`` blocks of ``block_size`` tokens)."""

    num_blocks: int
    block_size: int  # tokens_per_block
    prefix_caching: bool = True  # enable_block_reuse
    partial_reuse: bool = True  # enable_partial_reuse
    copy_on_partial_reuse: bool = True
    host_blocks: int = 0  # host tier capacity in blocks (host_cache_size / bytes per block)
    stats: CacheStats = field(default_factory=CacheStats)

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.block_size < 1:
            raise ValueError(f"block_size (tokens_per_block) must be >= 1, got {self.block_size}")
        if self.host_blocks < 0:
            raise ValueError(f"host_blocks must be >= 0, got {self.host_blocks}")
        self._uids = count(1)
        self._tick = 0
        self._root = _Block(None, None, 0, 0, (0, 0), True, 0)
        self._root.ref = 1
        self._tree_gpu = 0  # tree blocks on GPU
        self._tree_gpu_free = 0  # ... of which unreferenced (free capacity)
        self._private = 0
        self._host_used = 0
        self._gpu_heap: list[tuple[int, int, _Block]] = []
        self._host_heap: list[tuple[int, int, _Block]] = []
        self._reqs: dict[int, _Running] = {}
        self.stats.extra.setdefault("host_evicted_blocks", 0)

    # -- matching ------------------------------------------------------------------------------

    def _partial_match(
        self, parent: _Block, seq: TokenSeq, start: int, end: int
    ) -> tuple[int, _Block | None]:
        """Longest run of leading tokens of seq[start:end) held by one child of ``parent``."""
        if parent.partial is None:
            if len(parent.children) <= _SCAN_CHILDREN:
                return self._scan_children(parent, seq, start, end)
            parent.partial = {}
            for child in parent.children.values():
                self._index(parent.partial, child)
        got_total = 0
        holder: _Block | None = None
        for key, lo, hi in _pieces(seq, start, end):
            cands = parent.partial.get(key)
            if not cands:
                break
            best, best_blk = 0, None
            for blk, ext in cands.items():
                if ext > best:
                    best, best_blk = ext, blk
                    if ext >= hi:
                        break
            if best <= lo:
                break
            got = min(best, hi)
            got_total += got - lo
            holder = best_blk
            if got < hi:
                break
        return got_total, holder

    @staticmethod
    def _scan_children(parent: _Block, seq: TokenSeq, start: int, end: int) -> tuple[int, _Block | None]:
        """``_partial_match`` by comparing with each child (few children: cheaper than an index)."""
        best, holder = 0, None
        first = seq.prefix_id(start + 1)
        for child in parent.children.values():
            src = child.seq
            assert src is not None
            if src.prefix_id(start + 1) != first:
                continue
            lo, hi = 1, min(end - start, child.ntok)  # tokens agree through lo; find the last that agrees
            if seq.prefix_id(start + hi) == src.prefix_id(start + hi):
                lo = hi
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if seq.prefix_id(start + mid) == src.prefix_id(start + mid):
                    lo = mid
                else:
                    hi = mid - 1
            if lo > best:
                best, holder = lo, child
                if best == end - start:
                    break
        return best, holder

    @staticmethod
    def _index(partial: dict[int, dict[_Block, int]], b: _Block) -> None:
        assert b.seq is not None
        for seg_key, _, hi in _block_pieces(b.seq, b.start, b.ntok, b.key):
            holders = partial.get(seg_key)
            if holders is None:
                partial[seg_key] = {b: hi}
            else:
                holders[b] = hi

    def _plan(self, seq: TokenSeq, prompt_len: int, ids: list[PrefixId] | None = None) -> _Plan:
        if not self.prefix_caching:
            return _Plan([], 0, None)
        bs = self.block_size
        limit = prompt_len - 1
        if ids is None:
            ids = seq.block_ids(bs, limit)
        node = self._root
        full: list[_Block] = []
        for key in ids[: limit // bs]:
            child = node.children.get(key)
            if child is None:
                break
            full.append(child)
            node = child
        start = len(full) * bs
        avail = min(bs, limit - start)
        if self.partial_reuse and avail > 0:
            n, blk = self._partial_match(node, seq, start, start + avail)
            if blk is not None and n > 0:
                usable = self.copy_on_partial_reuse or (blk.ref == 0 and not blk.children)
                if usable:
                    return _Plan(full, n, blk)
        return _Plan(full, 0, None)

    def lookup(self, seq: TokenSeq, prompt_len: int) -> Match:
        plan = self._plan(seq, prompt_len)
        reused = len(plan.full) + (1 if plan.partial_block is not None else 0)
        hit = len(plan.full) * self.block_size + plan.partial_tokens
        return Match(
            hit,
            host_tokens=plan.host_tokens(self.block_size),
            hit_blocks=reused,
            miss_blocks=-(-prompt_len // self.block_size) - reused,
        )

    # -- capacity ------------------------------------------------------------------------------

    def free_blocks(self) -> int:
        return self.num_blocks - self._tree_gpu - self._private + self._tree_gpu_free

    def usage(self) -> float:
        return 1.0 - self.free_blocks() / self.num_blocks

    def host_used_blocks(self) -> int:
        return self._host_used

    # -- eviction ------------------------------------------------------------------------------

    def _gpu_evictable(self, b: _Block) -> bool:
        return (
            b.alive
            and b.on_gpu
            and b.ref == 0
            and b.gpu_children == 0
            and not b.pinned
            and b is not self._root
        )

    def _host_evictable(self, b: _Block) -> bool:
        return b.alive and not b.on_gpu and not b.children and not b.pinned

    def _push_gpu(self, b: _Block) -> None:
        if self._gpu_evictable(b):
            heapq.heappush(self._gpu_heap, (b.access, b.uid, b))
            if len(self._gpu_heap) > 4 * (self._tree_gpu + 16):
                self._gpu_heap = [
                    e for e in self._gpu_heap if self._gpu_evictable(e[2]) and e[0] == e[2].access
                ]
                heapq.heapify(self._gpu_heap)

    def _push_host(self, b: _Block) -> None:
        if self._host_evictable(b):
            heapq.heappush(self._host_heap, (b.access, b.uid, b))
            if len(self._host_heap) > 4 * (self._host_used + 16):
                self._host_heap = [
                    e for e in self._host_heap if self._host_evictable(e[2]) and e[0] == e[2].access
                ]
                heapq.heapify(self._host_heap)

    def _pop(self, heap: list[tuple[int, int, _Block]], gpu: bool) -> _Block | None:
        while heap:
            access, _, b = heapq.heappop(heap)
            ok = self._gpu_evictable(b) if gpu else self._host_evictable(b)
            if ok and access == b.access:
                return b
        return None

    def _detach(self, b: _Block) -> None:
        """Take ``b`` (no children) out of the tree."""
        parent = b.parent
        assert parent is not None and b.seq is not None
        if parent.children.get(b.key) is b:
            del parent.children[b.key]
        if parent.partial is not None:
            for key, _, _ in _block_pieces(b.seq, b.start, b.ntok, b.key):
                holders = parent.partial.get(key)
                if holders is not None:
                    holders.pop(b, None)
                    if not holders:
                        del parent.partial[key]
        if b.on_gpu:
            parent.gpu_children -= 1
        b.alive = False

    def _drop_subtree(self, b: _Block) -> None:
        """Remove ``b`` and its descendants (host blocks) from the tree, leaves first."""
        if not b.children:
            self._detach(b)
            return
        order: list[_Block] = []
        stack = [b]
        while stack:
            n = stack.pop()
            order.append(n)
            stack.extend(n.children.values())
        for n in reversed(order):
            if not n.on_gpu:
                self._host_used -= 1
                self.stats.extra["host_evicted_blocks"] += 1
            self._detach(n)

    def _evict_one_gpu(self) -> None:
        victim = self._pop(self._gpu_heap, gpu=True)
        if victim is None:  # the caller checked capacity; running short is a bookkeeping bug
            raise RuntimeError("no evictable GPU block although capacity was checked")
        parent = victim.parent
        assert parent is not None
        self._tree_gpu -= 1
        self._tree_gpu_free -= 1
        self.stats.evicted_blocks += 1
        offload = self.host_blocks > 0
        if offload and self._host_used >= self.host_blocks:
            host_victim = self._pop(self._host_heap, gpu=False)
            if host_victim is None:
                offload = False
            else:
                self._drop_host_leaf(host_victim)
        if offload:
            victim.on_gpu = False
            parent.gpu_children -= 1
            self._host_used += 1
            self.stats.offloaded_blocks += 1
            self._push_host(victim)
        else:  # dropped, with any host blocks below it (TensorRT-LLM frees a reused block's children)
            self._drop_subtree(victim)
        self._push_gpu(parent)

    def _drop_host_leaf(self, b: _Block) -> None:
        parent = b.parent
        assert parent is not None
        self._host_used -= 1
        self.stats.extra["host_evicted_blocks"] += 1
        self._detach(b)
        if not parent.on_gpu:
            self._push_host(parent)

    def _take_gpu(self) -> None:
        """Make one GPU block available for a new use (evicting if the pool has none unused)."""
        if self.num_blocks - self._tree_gpu - self._private <= 0:
            self._evict_one_gpu()

    # -- tree updates --------------------------------------------------------------------------

    def _new_block(self, parent: _Block, seq: TokenSeq, start: int, ntok: int, key: PrefixId) -> _Block:
        b = _Block(parent, seq, start, ntok, key, ntok == self.block_size, next(self._uids))
        parent.children[key] = b
        if parent.partial is not None:
            self._index(parent.partial, b)
        parent.gpu_children += 1
        self._tree_gpu += 1
        return b

    def _ref(self, b: _Block) -> None:
        if b.ref == 0:
            self._tree_gpu_free -= 1
        b.ref += 1

    def _unref(self, b: _Block) -> None:
        b.ref -= 1
        if b.ref == 0:
            self._tree_gpu_free += 1
            self._push_gpu(b)

    def _onboard(self, b: _Block) -> None:
        """Bring a host block back to the GPU (its parent is on the GPU already)."""
        self._take_gpu()
        assert b.parent is not None
        b.on_gpu = True
        b.parent.gpu_children += 1
        self._host_used -= 1
        self._tree_gpu += 1
        self._tree_gpu_free += 1  # unreferenced until the caller refs it
        self.stats.onboarded_blocks += 1

    def _touch(self, blocks: list[_Block]) -> None:
        for b in blocks:  # root side first: deeper blocks are more recent
            self._tick += 1
            b.access = self._tick

    # -- the KVCache protocol ------------------------------------------------------------------

    def admit(self, req_id: int, seq: TokenSeq, prompt_len: int, num_tokens: int, now: float) -> Match | None:
        if req_id in self._reqs:
            raise ValueError(f"request {req_id} is already admitted")
        check_lengths(seq, prompt_len, num_tokens)
        bs = self.block_size
        ids = seq.block_ids(bs) if self.prefix_caching else []
        plan = self._plan(seq, prompt_len, ids)
        need = max(-(-num_tokens // bs) - len(plan.full), 0)
        consume = need + sum(1 for b in plan.full if b.ref == 0 or not b.on_gpu)
        pb = plan.partial_block
        if pb is not None and pb.on_gpu and pb.ref == 0 and self.copy_on_partial_reuse:
            consume += 1  # the copy source is pinned while the copy is taken
        if consume > self.free_blocks():
            return None
        host_tokens = plan.host_tokens(bs)
        for b in plan.full:
            b.pinned = True
        if pb is not None:
            pb.pinned = True
        for b in plan.full:
            if not b.on_gpu:
                self._onboard(b)
            self._ref(b)
            b.pinned = False
        if pb is not None:
            if not self.copy_on_partial_reuse:
                pb.pinned = False  # take the free leaf over: it leaves the tree
                if pb.on_gpu:
                    self._tree_gpu -= 1
                    self._tree_gpu_free -= 1
                    self._private += 1
                    need -= 1
                else:
                    self._host_used -= 1
                    self.stats.onboarded_blocks += 1
                self._detach(pb)
                self._push_gpu(pb.parent)  # type: ignore[arg-type]
            elif not pb.on_gpu:
                self.stats.onboarded_blocks += 1
        for _ in range(need):
            self._take_gpu()
            self._private += 1
        if pb is not None:
            pb.pinned = False
            self._push_gpu(pb)
            self._push_host(pb)
        self._touch(plan.full)
        private = max(-(-num_tokens // bs) - len(plan.full), 0)
        self._reqs[req_id] = _Running(seq, prompt_len, ids, list(plan.full), private, len(plan.full) * bs)
        reused = len(plan.full) + (1 if pb is not None else 0)
        hit = len(plan.full) * bs + plan.partial_tokens
        missed = -(-prompt_len // bs) - reused
        self.stats.query_tokens += prompt_len
        self.stats.hit_tokens += hit
        self.stats.host_hit_tokens += host_tokens
        self.stats.hit_blocks += reused
        self.stats.miss_blocks += missed
        return Match(hit, host_tokens=host_tokens, hit_blocks=reused, miss_blocks=missed)

    def grow(self, req_id: int, num_tokens: int, now: float) -> bool:
        r = self._req(req_id)
        need = -(-num_tokens // self.block_size) - (len(r.path) + r.private)
        if need > self.free_blocks():
            return False
        for _ in range(max(need, 0)):
            self._take_gpu()
            self._private += 1
            r.private += 1
        return True

    def _store(self, r: _Running, limit: int, with_partial: bool) -> None:
        """Offer the request's blocks of its first ``limit`` tokens to the tree."""
        bs = self.block_size
        seq = r.seq
        limit = min(limit, seq.length, (len(r.path) + r.private) * bs)
        node = r.path[-1] if r.path else self._root
        new_path: list[_Block] = []
        for end in range((len(r.path) + 1) * bs, limit + 1, bs):
            key = r.ids[end // bs - 1]
            existing = node.children.get(key)
            if existing is None:
                b = self._new_block(node, seq, end - bs, bs, key)
                b.ref = 1
            else:  # same prefix stored meanwhile: use it, free our copy
                b = existing
                if not b.on_gpu:  # our copy brings it back to the GPU
                    b.on_gpu = True
                    node.gpu_children += 1
                    self._host_used -= 1
                    self._tree_gpu += 1
                    self._tree_gpu_free += 1
                self._ref(b)
            self._private -= 1
            r.private -= 1
            new_path.append(b)
            node = b
        r.path.extend(new_path)
        self._touch(new_path)
        r.stored_limit = max(r.stored_limit, limit)
        tail = limit - len(r.path) * bs
        if with_partial and self.partial_reuse and tail > 0 and r.private > 0:
            start = len(r.path) * bs
            n, holder = self._partial_match(node, seq, start, start + tail)
            if not (holder is not None and n == tail and holder.ntok == tail):  # not stored already
                b = self._new_block(node, seq, start, tail, seq.prefix_id(start + tail))
                self._private -= 1
                r.private -= 1
                self._tree_gpu_free += 1  # nobody references it after release
                self._touch([b])
                self._push_gpu(b)

    def commit(self, req_id: int, computed_tokens: int, now: float) -> None:
        r = self._req(req_id)
        if self.prefix_caching:
            self._store(r, computed_tokens - 1, with_partial=False)

    def release(self, req_id: int, now: float) -> None:
        r = self._reqs.pop(req_id, None)
        if r is None:
            raise KeyError(f"request {req_id} is not admitted")
        self._touch(r.path)
        if self.prefix_caching:
            self._store(r, r.stored_limit, with_partial=True)
        for b in reversed(r.path):
            self._unref(b)
        self._private -= r.private

    def _req(self, req_id: int) -> _Running:
        return admitted(self._reqs, req_id)

"""SGLang's KV cache: a radix tree over token sequences, with pages, lock refs and leaf eviction.

Semantics (reference/engines.md §3.2; SGLang ``RadixCache`` / ``schedule_batch.py``):

- Matching walks the tree; with ``page_size > 1`` only whole pages match (a branch in mid-page
  shares only the full pages before it); page size 1 shares every common token.
- The match is looked up on the first ``input - 1`` tokens (``adjust_max_prefix_ids``): the last
  token is always computed.
- A running request locks (``lock_ref``) the path from its deepest cached node to the root; only
  unlocked LEAVES are evicted, oldest ``last_access`` first (``lru``; ``lfu`` orders by hit count,
  then access); a parent becomes a candidate once it has no children.
- Computed full pages are inserted into the tree as the request goes (``cache_unfinished_req``) and
  at the end; a duplicate (someone inserted the same prefix meanwhile) frees the request's copy.
- ``--disable-radix-cache``: no tree, nothing shared, pages freed when the request ends.

Edges are compressed: a node covers the absolute token range ``[start, end)`` of the ``TokenSeq``
that inserted it and holds no per-token objects. Token identities are prefix-chained, so "same token
at position q" is ``a.prefix_id(q) == b.prefix_id(q)`` and the match inside an edge is a binary
search. Access times are a logical counter (the order of cache events), so ties in simulated time
resolve in event order, as SGLang's ``time.monotonic()`` stamps do.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from itertools import count

from prefixtune.twin.cache.base import CacheStats, Match, admitted, check_lengths
from prefixtune.twin.prompt import PrefixId, TokenSeq

EVICTION_POLICIES = ("lru", "lfu")


class _Node:
    __slots__ = ("access", "alive", "children", "end", "hits", "key", "lock", "parent", "seq", "start", "uid")

    def __init__(
        self, parent: _Node | None, seq: TokenSeq | None, start: int, end: int, key: PrefixId, uid: int
    ) -> None:
        self.parent = parent
        self.seq = seq
        self.start = start
        self.end = end
        self.key = key  # this node's key in parent.children: identity of its first page
        self.children: dict[PrefixId, _Node] = {}
        self.lock = 0
        self.access = 0
        self.hits = 0
        self.alive = True
        self.uid = uid


@dataclass(slots=True)
class _Running:
    seq: TokenSeq
    prompt_len: int
    node: _Node  # deepest tree node this request locks (the root when nothing is cached)
    cached_len: int  # tokens of the seq covered by the locked path
    alloc_tokens: int  # tokens the request has room for


@dataclass
class SglangCache:
    """The token pool and radix cache of one SGLang engine (``num_blocks`` pages of ``block_size``)."""

    num_blocks: int
    block_size: int  # page_size
    prefix_caching: bool = True  # False = --disable-radix-cache
    eviction_policy: str = "lru"
    stats: CacheStats = field(default_factory=CacheStats)

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.block_size < 1:
            raise ValueError(f"block_size (page_size) must be >= 1, got {self.block_size}")
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ValueError(
                f"eviction_policy must be one of {', '.join(EVICTION_POLICIES)}, got {self.eviction_policy!r}"
            )
        self._uids = count(1)
        self._tick = 0
        self._root = _Node(None, None, 0, 0, (0, 0), 0)
        self._root.lock = 1  # never evicted
        self._tree_pages = 0
        self._evictable_pages = 0  # pages in unlocked nodes
        self._private_pages = 0  # pages requests hold outside the tree
        self._nodes = 0
        self._heap: list[tuple[tuple[int, int], int, _Node]] = []
        self._reqs: dict[int, _Running] = {}

    # -- matching ------------------------------------------------------------------------------

    def _match_in_edge(self, child: _Node, seq: TokenSeq, pos: int, limit: int) -> int:
        """Largest page-aligned q in [pos + page, min(child.end, limit)] where seq agrees with the edge
        (the first page is known to agree: it is the child's key)."""
        p = self.block_size
        src = child.seq
        assert src is not None
        hi = min(child.end, limit)
        if seq.prefix_id(hi) == src.prefix_id(hi):
            return hi
        lo_page, hi_page = (pos + p) // p, hi // p  # agree at lo_page, disagree at hi_page
        while hi_page - lo_page > 1:
            mid = (lo_page + hi_page) // 2
            q = mid * p
            if seq.prefix_id(q) == src.prefix_id(q):
                lo_page = mid
            else:
                hi_page = mid
        return lo_page * p

    def _walk(self, seq: TokenSeq, limit: int) -> tuple[_Node, int, _Node | None, int]:
        """Match ``seq`` within its first ``limit`` tokens: (deepest fully matched node, its end,
        the child the match ends inside or None, matched length)."""
        p = self.block_size
        n = (min(limit, seq.length) // p) * p
        node = self._root
        pos = 0
        while pos < n:
            child = node.children.get(seq.prefix_id(pos + p))
            if child is None:
                break
            q = self._match_in_edge(child, seq, pos, n)
            if q < child.end:
                return node, pos, child, q
            node, pos = child, q
        return node, pos, None, pos

    def match_len(self, seq: TokenSeq, limit: int | None = None) -> int:
        """Tokens of ``seq`` (within ``limit``) found in the tree now, page aligned; for ``lpm``."""
        if not self.prefix_caching:
            return 0
        return self._walk(seq, seq.length if limit is None else limit)[3]

    def lookup(self, seq: TokenSeq, prompt_len: int) -> Match:
        if not self.prefix_caching:
            return Match(0)
        hit = self._walk(seq, prompt_len - 1)[3]
        return Match(hit, hit_blocks=hit // self.block_size)

    # -- capacity ------------------------------------------------------------------------------

    def _pool_free(self) -> int:
        return self.num_blocks - self._tree_pages - self._private_pages

    def free_blocks(self) -> int:
        return self._pool_free() + self._evictable_pages

    def usage(self) -> float:
        return 1.0 - self.free_blocks() / self.num_blocks

    def cached_tokens(self) -> int:
        """Tokens held by the tree (locked or not)."""
        return self._tree_pages * self.block_size

    # -- tree maintenance ----------------------------------------------------------------------

    def _pages(self, node: _Node) -> int:
        return (node.end - node.start) // self.block_size

    def _priority(self, node: _Node) -> tuple[int, int]:
        return (node.hits, node.access) if self.eviction_policy == "lfu" else (0, node.access)

    def _push_if_evictable(self, node: _Node) -> None:
        if node.lock == 0 and not node.children and node is not self._root:
            heapq.heappush(self._heap, (self._priority(node), node.uid, node))
            if len(self._heap) > 4 * self._nodes + 64:
                self._heap = [e for e in self._heap if self._valid(e)]
                heapq.heapify(self._heap)

    def _valid(self, entry: tuple[tuple[int, int], int, _Node]) -> bool:
        node = entry[2]
        return node.alive and node.lock == 0 and not node.children and entry[0] == self._priority(node)

    def _touch_path(self, node: _Node, hit: bool = False) -> None:
        path = []
        while node is not self._root:
            path.append(node)
            node = node.parent  # type: ignore[assignment]
        for n in reversed(path):  # root side first: deeper nodes are more recent
            self._tick += 1
            n.access = self._tick
            if hit:
                n.hits += 1

    def _lock(self, node: _Node) -> None:
        while node is not self._root:
            if node.lock == 0:
                self._evictable_pages -= self._pages(node)
            node.lock += 1
            node = node.parent  # type: ignore[assignment]

    def _unlock(self, node: _Node) -> None:
        while node is not self._root:
            node.lock -= 1
            if node.lock == 0:
                self._evictable_pages += self._pages(node)
                self._push_if_evictable(node)
            node = node.parent  # type: ignore[assignment]

    def _unlocked_on_path(self, node: _Node, child: _Node | None, q: int) -> int:
        """Pages that locking the match (node, plus ``child`` up to ``q``) takes out of the evictable pool."""
        pages = (q - child.start) // self.block_size if child is not None and child.lock == 0 else 0
        while node is not self._root:
            if node.lock == 0:
                pages += self._pages(node)
            node = node.parent  # type: ignore[assignment]
        return pages

    def _split(self, child: _Node, q: int) -> _Node:
        """Cut ``child`` at ``q``: a new node covers [child.start, q) and keeps child below it."""
        parent = child.parent
        assert parent is not None and child.seq is not None
        mid = _Node(parent, child.seq, child.start, q, child.key, next(self._uids))
        mid.lock = child.lock
        mid.access = child.access
        mid.hits = child.hits
        parent.children[child.key] = mid
        child.parent = mid
        child.start = q
        child.key = child.seq.prefix_id(q + self.block_size)
        mid.children[child.key] = child
        self._nodes += 1
        return mid

    def _evict(self, pages: int) -> None:
        freed = 0
        heap = self._heap
        while freed < pages and heap:
            entry = heapq.heappop(heap)
            if not self._valid(entry):
                continue
            node = entry[2]
            parent = node.parent
            assert parent is not None
            del parent.children[node.key]
            node.alive = False
            n = self._pages(node)
            self._tree_pages -= n
            self._evictable_pages -= n
            self._nodes -= 1
            freed += n
            self.stats.evicted_blocks += n
            self._push_if_evictable(parent)
        if freed < pages:  # the caller checked capacity; running short is a bookkeeping bug
            raise RuntimeError(f"radix cache could free only {freed} of {pages} pages")

    def _take(self, pages: int) -> None:
        short = pages - self._pool_free()
        if short > 0:
            self._evict(short)
        self._private_pages += pages

    # -- the KVCache protocol ------------------------------------------------------------------

    def admit(self, req_id: int, seq: TokenSeq, prompt_len: int, num_tokens: int, now: float) -> Match | None:
        if req_id in self._reqs:
            raise ValueError(f"request {req_id} is already admitted")
        check_lengths(seq, prompt_len, num_tokens)
        p = self.block_size
        if self.prefix_caching:
            node, _, child, hit = self._walk(seq, prompt_len - 1)
        else:
            node, child, hit = self._root, None, 0
        need = max(-(-num_tokens // p) - hit // p, 0)
        if need > self.free_blocks() - self._unlocked_on_path(node, child, hit):
            return None
        if child is not None:
            node = self._split(child, hit)
        self._touch_path(node, hit=True)
        self._lock(node)
        self._take(need)
        self._reqs[req_id] = _Running(seq, prompt_len, node, hit, max(num_tokens, hit))
        pages = -(-prompt_len // p)
        self.stats.query_tokens += prompt_len
        self.stats.hit_tokens += hit
        self.stats.hit_blocks += hit // p
        self.stats.miss_blocks += pages - hit // p
        return Match(hit, hit_blocks=hit // p, miss_blocks=pages - hit // p)

    def grow(self, req_id: int, num_tokens: int, now: float) -> bool:
        r = self._req(req_id)
        p = self.block_size
        need = -(-num_tokens // p) - -(-r.alloc_tokens // p)
        if need > self.free_blocks():
            return False
        if need > 0:
            self._take(need)
        r.alloc_tokens = max(r.alloc_tokens, num_tokens)
        return True

    def commit(self, req_id: int, computed_tokens: int, now: float) -> None:
        r = self._req(req_id)
        if not self.prefix_caching:
            return
        p = self.block_size
        target = (min(computed_tokens, r.alloc_tokens, r.seq.length) // p) * p
        if target <= r.cached_len:
            return
        seq = r.seq
        node, pos = r.node, r.cached_len
        while pos < target:
            key = seq.prefix_id(pos + p)
            child = node.children.get(key)
            if child is None:  # new content: the request's pages move into the tree
                new = _Node(node, seq, pos, target, key, next(self._uids))
                node.children[key] = new
                self._tree_pages += (target - pos) // p
                self._evictable_pages += (target - pos) // p  # unlocked until _lock below
                self._nodes += 1
                node, pos = new, target
                break
            q = self._match_in_edge(child, seq, pos, target)
            if q < child.end:
                child = self._split(child, q)
            node, pos = child, q  # duplicate content: the request's own copy is freed
        self._private_pages -= (target - r.cached_len) // p
        self._lock(node)
        self._unlock(r.node)
        r.node, r.cached_len = node, target
        self._touch_path(node)

    def release(self, req_id: int, now: float) -> None:
        r = self._reqs.pop(req_id, None)
        if r is None:
            raise KeyError(f"request {req_id} is not admitted")
        p = self.block_size
        self._private_pages -= -(-r.alloc_tokens // p) - r.cached_len // p
        self._touch_path(r.node)
        self._unlock(r.node)

    def _req(self, req_id: int) -> _Running:
        return admitted(self._reqs, req_id)

"""Token sequences without the tokens: the prefix identity the twin's caches need.

A sequence is a tuple of segments. Each segment has a ``key`` that identifies its content *and
everything before it* (producers chain keys: a segment's key already depends on its parent), and a
``length`` in tokens. So the token at offset ``o`` of segment ``s`` is identified by ``(s.key, o)``,
and the prefix ``[0, p)`` of a sequence is identified by the identity of its last token. Two
sequences share exactly the prefix up to the end of their last common token identity.

This lets one representation serve every source: workload generators (a system prompt, tool
schemas, turns of history, a question), Mooncake traces (one segment per 512-token hash id, already
chained), and raw token-id arrays from HTTP (one segment per token, chained by ``from_tokens``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

# A position identity: the key of the segment holding the token, and the token's offset + 1 there.
# ``(key, n)`` names the prefix that ends after the n-th token of segment ``key``.
PrefixId = tuple[int, int]


def chain_key(parent: int, *parts: int | str) -> int:
    """A stable 63-bit key for content ``parts`` that follows the prefix named by ``parent``.

    Stable across processes (no Python ``hash`` randomisation), so pods and load generators agree.
    """
    h = hashlib.blake2b(digest_size=8)
    h.update(parent.to_bytes(8, "little", signed=True))
    for part in parts:
        h.update(b"\x00")
        h.update(str(part).encode())
    return int.from_bytes(h.digest(), "little") >> 1


ROOT_KEY = 0
_OFFSET_LIMIT = 1 << 32  # block_keys packs a token offset into 32 bits


# Block keys of recently hashed sequences, by (block size, id of the last segment): a sequence that
# extends one of them (the next turn of a conversation) computes only its new blocks. The entry keeps
# the segments alive (so the id is not reused) and is checked by equality before use.
_CHAIN_TRIES = 3  # how many of a sequence's longest proper prefixes are looked up
_CHAIN_MAX_KEYS = 1 << 20  # memory bound: keys held by the memo in all
_CHAIN_MEMO: dict[tuple[int, int], tuple[tuple[Segment, ...], int, list[int]]] = {}
_chain_held = [0]


def _remember_chain(block_size: int, segs: tuple[Segment, ...], length: int, keys: list[int]) -> None:
    if not segs or len(keys) > _CHAIN_MAX_KEYS // 4:
        return
    memo = _CHAIN_MEMO
    k = (block_size, id(segs[-1]))
    old = memo.pop(k, None)
    if old is not None:
        _chain_held[0] -= len(old[2])
    memo[k] = (segs, length, keys)
    _chain_held[0] += len(keys)
    while _chain_held[0] > _CHAIN_MAX_KEYS and memo:  # drop the oldest
        dropped = memo.pop(next(iter(memo)), None)
        if dropped is not None:
            _chain_held[0] -= len(dropped[2])


@dataclass(frozen=True, slots=True)
class Segment:
    key: int
    length: int


@dataclass(frozen=True)
class TokenSeq:
    segments: tuple[Segment, ...]

    @cached_property
    def length(self) -> int:
        return sum(s.length for s in self.segments)

    @cached_property
    def _ends(self) -> tuple[int, ...]:
        ends: list[int] = []
        total = 0
        for s in self.segments:
            total += s.length
            ends.append(total)
        return tuple(ends)

    def __len__(self) -> int:
        return self.length

    def prefix_id(self, p: int) -> PrefixId:
        """Identity of the prefix ``[0, p)`` (``1 <= p <= length``)."""
        if not 1 <= p <= self.length:
            raise ValueError(f"prefix length {p} outside 1..{self.length}")
        lo, hi = 0, len(self._ends) - 1
        while lo < hi:  # first segment whose end >= p
            mid = (lo + hi) // 2
            if self._ends[mid] >= p:
                hi = mid
            else:
                lo = mid + 1
        start = self._ends[lo] - self.segments[lo].length
        return (self.segments[lo].key, p - start)

    def block_ids(self, block_size: int, limit: int | None = None) -> list[PrefixId]:
        """Identities of the full blocks of ``block_size`` tokens (within the first ``limit`` tokens).

        Block ``k`` is identified by the prefix ending at ``(k + 1) * block_size``; that is exactly
        vLLM's chained block hash (parent hash + this block's tokens). Computed once per block size
        and memoised: a request's sequence is hashed at admission, commit and release, as vLLM keeps
        a request's block hashes.
        """
        memo = self._block_memo
        ids = memo.get(block_size)
        if ids is None:
            ids = memo[block_size] = self._compute_block_ids(block_size)
        n = self.length if limit is None else min(limit, self.length)
        full = n // block_size
        return ids if full == len(ids) else ids[:full]

    @cached_property
    def _block_memo(self) -> dict[int, list[PrefixId]]:
        return {}

    def _compute_block_ids(self, block_size: int) -> list[PrefixId]:
        # Block ends that fall inside one segment form an arithmetic run: emit each run in one
        # comprehension instead of walking token positions (this is the twin's hot path).
        out: list[PrefixId] = []
        start = 0
        next_end = block_size
        for seg in self.segments:
            seg_end = start + seg.length
            if next_end <= seg_end:
                key = seg.key
                out.extend([(key, end - start) for end in range(next_end, seg_end + 1, block_size)])
                next_end += ((seg_end - next_end) // block_size + 1) * block_size
            start = seg_end
        return out

    def block_keys(self, block_size: int, limit: int | None = None) -> list[int]:
        """``block_ids`` as plain ints: block ``(key, offset)`` is ``key << 32 | offset``.

        The same identities (one-to-one while a segment is shorter than 2**32 tokens), cheaper to
        build (a segment's blocks are one ``range``) and to hash than tuples: vLLM's cache model
        keys its hash map with them.
        """
        memo = self._block_key_memo
        keys = memo.get(block_size)
        if keys is None:
            keys = memo[block_size] = self._compute_block_keys(block_size)
        n = self.length if limit is None else min(limit, self.length)
        full = n // block_size
        return keys if full == len(keys) else keys[:full]

    @cached_property
    def _block_key_memo(self) -> dict[int, list[int]]:
        return {}

    def _compute_block_keys(self, block_size: int) -> list[int]:
        segs = self.segments
        n = len(segs)
        # A conversation's turn extends the previous turn's sequence (its prompt and output): start
        # from the keys memoised for the longest recent prefix of this one, when there is one.
        out: list[int] = []
        first = 0
        start = 0
        memo = _CHAIN_MEMO
        for j in (*range(n - 1, max(1, n - _CHAIN_TRIES - 1), -1), 1) if n > 1 else ():
            entry = memo.get((block_size, id(segs[j - 1])))
            if entry is not None and entry[0] == segs[:j]:
                out = entry[2][:]
                first, start = j, entry[1]
                break
        next_end = (len(out) + 1) * block_size
        for seg in segs[first:] if first else segs:
            seg_end = start + seg.length
            if next_end <= seg_end:
                if seg.length >= _OFFSET_LIMIT:
                    raise ValueError(f"segment length {seg.length} must be < 2**32 for block keys")
                base = (seg.key << 32) - start
                out.extend(range(base + next_end, base + seg_end + 1, block_size))
                next_end += ((seg_end - next_end) // block_size + 1) * block_size
            start = seg_end
        _remember_chain(block_size, segs, start, out)
        if first != 1 and n > 1 and (block_size, id(segs[0])) not in memo:
            # the first segment alone (a shared system prompt): the first turns of sessions share it
            head = segs[:1]
            _remember_chain(block_size, head, head[0].length, out[: head[0].length // block_size])
        return out

    def common_prefix(self, other: TokenSeq) -> int:
        """Number of leading tokens the two sequences share."""
        shared = 0
        for a, b in zip(self.segments, other.segments, strict=False):
            if a.key != b.key:
                return shared
            if a.length != b.length:
                return shared + min(a.length, b.length)
            shared += a.length
        return shared

    def extend(self, *segments: Segment) -> TokenSeq:
        return TokenSeq(self.segments + tuple(segments))

    def truncate(self, n: int) -> TokenSeq:
        """The first ``n`` tokens (a partial last segment keeps its key: same tokens, same ids)."""
        out: list[Segment] = []
        left = n
        for s in self.segments:
            if left <= 0:
                break
            out.append(s if s.length <= left else Segment(s.key, left))
            left -= s.length
        return TokenSeq(tuple(out))

    def __iter__(self) -> Iterator[Segment]:
        return iter(self.segments)

    @classmethod
    def of(cls, segments: Iterable[Segment]) -> TokenSeq:
        return cls(tuple(segments))

    @classmethod
    def from_tokens(cls, tokens: Sequence[int], parent: int = ROOT_KEY) -> TokenSeq:
        """Raw token ids (as the OpenAI endpoint receives them): one chained segment per token."""
        segs: list[Segment] = []
        key = parent
        for tok in tokens:
            key = chain_key(key, int(tok))
            segs.append(Segment(key, 1))
        return cls(tuple(segs))

    def to_tokens(self, vocab: int = 128_000) -> list[int]:
        """Deterministic token ids for this sequence, for sending it over HTTP.

        Token ``o`` of segment ``key`` is derived from ``(key, o)``, so equal prefixes give equal
        token arrays. (The receiving side re-chains them with ``from_tokens``; its identities differ
        from these but equality of prefixes is preserved, which is all a cache can observe.)
        """
        out: list[int] = []
        for s in self.segments:
            seed = s.key & 0xFFFFFFFF
            out.extend((seed * 2654435761 + o * 40503) % vocab for o in range(s.length))
        return out

"""Block keys memoised along a conversation's chain of sequences must equal keys computed from scratch.

``TokenSeq.block_keys`` starts from the keys of a recently hashed sequence this one extends (the
previous turn of a conversation, or a shared first segment); the reference below walks every block.
"""

from __future__ import annotations

import random

import pytest

from prefixtune.twin import prompt
from prefixtune.twin.prompt import Segment, TokenSeq


def _reference_keys(seq: TokenSeq, block_size: int) -> list[int]:
    out = []
    start = 0
    for seg in seq.segments:
        for offset in range(1, seg.length + 1):
            if (start + offset) % block_size == 0:
                out.append((seg.key << 32) | offset)
        start += seg.length
    return out


def _conversation(rng: random.Random, shared: list[Segment]) -> list[TokenSeq]:
    """Turns that extend each other (prompt + output of the last turn, then a new suffix and output)."""
    segs = list(rng.sample(shared, k=rng.randint(0, len(shared))))
    turns = []
    for _ in range(rng.randint(1, 6)):
        segs = segs + [Segment(rng.getrandbits(62), rng.randint(1, 70)) for _ in range(rng.randint(1, 3))]
        turns.append(TokenSeq(tuple(segs)))
    return turns


@pytest.mark.parametrize("seed", range(12))
def test_chained_block_keys_equal_keys_from_scratch(seed: int) -> None:
    rng = random.Random(seed)
    shared = [Segment(rng.getrandbits(62), rng.randint(1, 90)) for _ in range(3)]
    seqs: list[TokenSeq] = []
    for _ in range(15):
        turns = _conversation(rng, shared)
        seqs.extend(turns)
        last = turns[-1]
        seqs.append(last.truncate(rng.randint(1, last.length)))  # keeps (some) segment objects
        seqs.append(TokenSeq(tuple(Segment(s.key, s.length) for s in last.segments)))  # equal, not same
        seqs.append(TokenSeq((*last.segments[:-1], Segment(last.segments[-1].key + 1, 5))))  # a sibling
    for seq in seqs:
        for bs in (1, 3, 16):
            fresh = TokenSeq(seq.segments)  # its own memo is empty: only the chain memo can help
            assert fresh.block_keys(bs) == _reference_keys(seq, bs)
            limit = rng.randint(0, seq.length)
            assert fresh.block_keys(bs, limit=limit) == _reference_keys(seq, bs)[: limit // bs]


def test_chain_memo_is_used_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prompt, "_CHAIN_MAX_KEYS", 400)
    monkeypatch.setattr(prompt, "_CHAIN_MEMO", {})
    monkeypatch.setattr(prompt, "_chain_held", [0])
    first = TokenSeq((Segment(1, 40), Segment(2, 40)))
    keys = first.block_keys(4)
    second = first.extend(Segment(3, 8), Segment(4, 8))
    # the first 20 keys are the very objects computed for ``first``: taken from the memo, not recomputed
    assert all(a is b for a, b in zip(second.block_keys(4), keys, strict=False))
    assert second.block_keys(4) == _reference_keys(second, 4)
    for i in range(200):  # many unrelated sequences: the memo stays within its bound
        TokenSeq((Segment(100 + i, 64),)).block_keys(4)
    assert prompt._chain_held[0] <= 400
    assert sum(len(e[2]) for e in prompt._CHAIN_MEMO.values()) == prompt._chain_held[0]

"""The contract between the twin's scheduler and each engine's KV cache model.

One request's KV lives in blocks (vLLM blocks, SGLang pages, TensorRT-LLM blocks) taken from a
fixed pool. A block that holds a computed, full block of tokens stays cached after its request ends
and can be hit by a later request; a cached block nobody references is *free capacity*: it is
evicted on demand (each engine in its own order) when a block is needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from prefixtune.twin.prompt import TokenSeq


@dataclass(frozen=True)
class Match:
    """The cached prefix a request can reuse, in the engine's own accounting.

    ``hit_tokens`` is what the engine's counter reports as hit (vLLM: full blocks, capped at
    prompt-1; SGLang: full pages; TensorRT-LLM: with partial reuse, tokens of a partly matched
    block too). ``host_tokens`` is the part of it found only in a host (CPU) tier, which costs a
    transfer. ``hit_blocks``/``miss_blocks`` are the engine's block counters (TensorRT-LLM counts
    blocks, not tokens).
    """

    hit_tokens: int
    host_tokens: int = 0
    hit_blocks: int = 0
    miss_blocks: int = 0


@dataclass
class CacheStats:
    """Cumulative counters, as the engine would export them."""

    query_tokens: int = 0
    hit_tokens: int = 0
    host_hit_tokens: int = 0
    hit_blocks: int = 0
    miss_blocks: int = 0
    evicted_blocks: int = 0
    offloaded_blocks: int = 0  # TensorRT-LLM host tier: blocks copied GPU -> host on eviction
    onboarded_blocks: int = 0  # host -> GPU on reuse
    extra: dict[str, int] = field(default_factory=dict)


class KVCache(Protocol):
    """The pool and prefix cache of one engine instance. All methods are O(blocks touched)."""

    block_size: int
    num_blocks: int
    stats: CacheStats

    def lookup(self, seq: TokenSeq, prompt_len: int) -> Match:
        """What a request with this prompt (the first ``prompt_len`` tokens of ``seq``) would hit now.

        No side effects and no stats: the scheduler uses it to order and admit requests.
        """
        ...

    def admit(self, req_id: int, seq: TokenSeq, prompt_len: int, num_tokens: int, now: float) -> Match | None:
        """Start a request: reuse its cached prefix and allocate blocks for its first ``num_tokens``.

        ``num_tokens`` >= the hit covers the hit plus the first chunk the scheduler will compute.
        Returns the match (and counts it in ``stats`` once, as the engine's counters do), or None
        when not enough blocks can be freed; then nothing changes.
        """
        ...

    def grow(self, req_id: int, num_tokens: int, now: float) -> bool:
        """The request now needs room for ``num_tokens`` tokens in total (next chunk, decode).

        Allocates blocks as needed, evicting free cached blocks. False when no block can be found
        (the scheduler then preempts a request); then nothing changes.
        """
        ...

    def commit(self, req_id: int, computed_tokens: int, now: float) -> None:
        """The first ``computed_tokens`` of the request's ``seq`` have KV now: full blocks become
        cached (hittable by others), when prefix caching is on."""
        ...

    def release(self, req_id: int, now: float) -> None:
        """The request finished or was preempted: its blocks are unreferenced (cached ones stay)."""
        ...

    def free_blocks(self) -> int:
        """Blocks that can be handed out now (never used + cached but unreferenced)."""
        ...

    def usage(self) -> float:
        """The engine's KV-usage gauge: referenced blocks / pool (cached-but-free counts as free)."""
        ...


R = TypeVar("R")


def admitted(reqs: Mapping[int, R], req_id: int) -> R:
    """The running request ``req_id``; KeyError naming it when it was never admitted (or released)."""
    r = reqs.get(req_id)
    if r is None:
        raise KeyError(f"request {req_id} is not admitted")
    return r


def check_lengths(seq: TokenSeq, prompt_len: int, num_tokens: int) -> None:
    """The admission arguments every cache model takes: a prompt within the sequence, >= 1 token."""
    if not 1 <= prompt_len <= seq.length:
        raise ValueError(f"prompt_len must be in 1..{seq.length} (the seq length), got {prompt_len}")
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")

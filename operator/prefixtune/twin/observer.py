"""What a running twin engine reports as things happen: the hook the exporter and the summary use.

The engine (``prefixtune.twin.engine.TwinEngine``) calls an ``EngineObserver`` at each event, in
simulated time. Decode runs are skipped ahead in one event, so output tokens are reported in bulk and
for the whole batch: ``tokens(gap_s, count, now)`` means ``count`` output tokens (summed over the
running requests) were each generated ``gap_s`` after their request's previous token; that is what
the engines' inter-token-latency histograms observe. Per request, the engine reports the first token
and the end (with its phase times); the per-request token count is ``req.output_len``. An observer
must be cheap (it runs inside the simulation loop) and must not call back into the engine.

``Gauges`` is a snapshot the engine returns on demand (``TwinEngine.gauges()``), for Prometheus gauges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from prefixtune.twin.cache.base import Match
from prefixtune.twin.request import Request


@dataclass(frozen=True)
class Gauges:
    """The engine's instantaneous state, as its gauges would show it."""

    now: float
    running: int  # requests in the running batch
    waiting: int  # requests queued (including preempted ones waiting to be recomputed)
    kv_usage: float  # 0..1, referenced blocks / pool (cached-but-free counts as free), as the engines
    pool_blocks: int  # blocks in the KV pool
    pool_tokens: int  # pool_blocks * block_size
    block_size: int
    free_blocks: int  # never used + cached but unreferenced
    status: str  # "ok" | "oom_runtime"


class EngineObserver(Protocol):
    """Callbacks from the simulated engine, in the order things happen (``now`` never decreases)."""

    def admitted(self, req: Request, match: Match, now: float) -> None:
        """The request left the waiting queue and joined the running batch; ``match`` is its cache hit
        (also called again after a preemption, when it is re-admitted and recomputed)."""
        ...

    def first_token(self, req: Request, ttft_s: float, now: float) -> None:
        """The prefill finished and the first output token was produced (once per request)."""
        ...

    def tokens(self, gap_s: float, count: int, now: float) -> None:
        """``count`` output tokens after the first ones (over the whole batch), each ``gap_s`` after
        its request's previous token (inter-token latency). The last of them was produced at ``now``."""
        ...

    def finished(
        self, req: Request, now: float, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        """The request produced its last token. ``queue_s``: arrival to first admission; ``prefill_s``:
        first admission to first token; ``decode_s``: first token to last token."""
        ...

    def preempted(self, req: Request, now: float) -> None:
        """The request lost its KV blocks (vLLM recompute / SGLang retract) and waits again."""
        ...

    def step(
        self, now: float, duration_s: float, steps: int, prefill_tokens: int, decode_tokens: int
    ) -> None:
        """``steps`` engine iterations ran back to back, ending at ``now`` and lasting ``duration_s`` in
        total (the GPU was busy all that time), computing ``prefill_tokens`` prompt tokens and
        ``decode_tokens`` output tokens. Idle time is the gaps between step reports."""
        ...

    def oom(self, now: float, reason: str) -> None:
        """Runtime out-of-memory: the engine died; nothing more happens after this."""
        ...


class NullObserver:
    """An observer that ignores everything; subclass it to implement only the hooks you need."""

    def admitted(self, req: Request, match: Match, now: float) -> None:
        return None

    def first_token(self, req: Request, ttft_s: float, now: float) -> None:
        return None

    def tokens(self, gap_s: float, count: int, now: float) -> None:
        return None

    def finished(
        self, req: Request, now: float, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        return None

    def preempted(self, req: Request, now: float) -> None:
        return None

    def step(
        self, now: float, duration_s: float, steps: int, prefill_tokens: int, decode_tokens: int
    ) -> None:
        return None

    def oom(self, now: float, reason: str) -> None:
        return None


class FanOut:
    """Forward every callback to several observers, in order."""

    def __init__(self, observers: Sequence[EngineObserver]) -> None:
        self.observers = tuple(observers)

    def admitted(self, req: Request, match: Match, now: float) -> None:
        for o in self.observers:
            o.admitted(req, match, now)

    def first_token(self, req: Request, ttft_s: float, now: float) -> None:
        for o in self.observers:
            o.first_token(req, ttft_s, now)

    def tokens(self, gap_s: float, count: int, now: float) -> None:
        for o in self.observers:
            o.tokens(gap_s, count, now)

    def finished(
        self, req: Request, now: float, e2e_s: float, queue_s: float, prefill_s: float, decode_s: float
    ) -> None:
        for o in self.observers:
            o.finished(req, now, e2e_s, queue_s, prefill_s, decode_s)

    def preempted(self, req: Request, now: float) -> None:
        for o in self.observers:
            o.preempted(req, now)

    def step(
        self, now: float, duration_s: float, steps: int, prefill_tokens: int, decode_tokens: int
    ) -> None:
        for o in self.observers:
            o.step(now, duration_s, steps, prefill_tokens, decode_tokens)

    def oom(self, now: float, reason: str) -> None:
        for o in self.observers:
            o.oom(now, reason)

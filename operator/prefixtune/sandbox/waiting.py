"""Polling a sandbox until something holds (tests, benchmarks and the demo wait on a live cluster)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from prefixtune.tuning.state import PolicyState

T = TypeVar("T")
PROGRESS_CAP = 4.0  # with progress: at most this many times timeout_s in all


async def wait_until(
    check: Callable[[], Awaitable[T | None]],
    timeout_s: float,
    what: str,
    every_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    progress: Callable[[], Awaitable[object]] | None = None,
) -> T:
    """Call ``check`` every ``every_s`` until it returns something truthy, and return that; raise
    TimeoutError naming ``what`` once ``timeout_s`` has passed on ``clock`` (``check`` runs at least
    once). With the sandbox's clock (``Sandbox.clock.now``) the deadline follows the sandbox's
    progress: a machine too busy for the sandbox to keep up extends it rather than failing the wait.

    ``progress`` follows what is awaited when another process does the work (the operator, which a
    busy machine slows down on its own): a token of how far it has got, polled with ``check``. Each
    change of the token moves the deadline to ``timeout_s`` after it, up to ``PROGRESS_CAP`` times
    ``timeout_s`` in all: the wait fails when nothing moved for ``timeout_s``, not when a slow
    machine made steady progress take longer."""
    start = clock()
    deadline = start + timeout_s
    cap = start + PROGRESS_CAP * timeout_s
    last = await progress() if progress is not None else None
    while True:
        got = await check()
        if got:
            return got
        now = clock()
        if progress is not None:
            token = await progress()
            if token != last:
                last = token
                deadline = min(cap, max(deadline, now + timeout_s))
        if now > deadline:
            if progress is not None and deadline >= cap:
                raise TimeoutError(f"timed out after {PROGRESS_CAP * timeout_s:g}s in all waiting for {what}")
            how = "" if progress is None else " without progress"
            raise TimeoutError(f"timed out after {timeout_s:g}s{how} waiting for {what}")
        await asyncio.sleep(every_s)


def tuning_progress(state: PolicyState | None) -> tuple[object, ...]:
    """How far a resource's tuning has got, as a token for ``wait_until(progress=...)``: it changes
    when the policy moves to another phase or step, a trial starts or ends, or a window is re-measured."""
    if state is None:
        return ()
    finished = sum(1 for t in state.trials if t.outcome != "running")
    invalidations = sum(t.invalidations for t in state.trials)
    return (
        state.phase,
        state.step,
        state.active,
        len(state.trials),
        finished,
        invalidations,
        state.metrics_held,
    )

"""Polling a sandbox until something holds (tests, benchmarks and the demo wait on a live cluster)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_until(
    check: Callable[[], Awaitable[T | None]],
    timeout_s: float,
    what: str,
    every_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Call ``check`` every ``every_s`` until it returns something truthy, and return that; raise
    TimeoutError naming ``what`` once ``timeout_s`` has passed on ``clock`` (``check`` runs at least
    once). With the sandbox's clock (``Sandbox.clock.now``) the deadline follows the sandbox's
    progress: a machine too busy for the sandbox to keep up extends it rather than failing the wait."""
    deadline = clock() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        if clock() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}")
        await asyncio.sleep(every_s)

"""Polling a sandbox until something holds (tests, benchmarks and the demo wait on a live cluster)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_until(
    check: Callable[[], Awaitable[T | None]], timeout_s: float, what: str, every_s: float = 1.0
) -> T:
    """Call ``check`` every ``every_s`` until it returns something truthy, and return that; raise
    TimeoutError naming ``what`` once ``timeout_s`` has passed (``check`` runs at least once)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}")
        await asyncio.sleep(every_s)

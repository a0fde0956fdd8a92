"""The sandbox's asyncio plumbing: wake-ups shared by watches and resync loops, stopping tasks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)


class Wakeup:
    """An edge-triggered flag shared by watch tasks and a resync loop."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout_s: float) -> None:
        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation that
        # arrives as the event fires, and the sandbox would never stop.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._event.wait()
        self._event.clear()


async def stop_task(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait for it to end, without swallowing a cancellation of the caller."""
    task.cancel()
    await asyncio.wait({task})


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait for all of them to end."""
    items = list(tasks)
    for t in items:
        t.cancel()
    await asyncio.gather(*items, return_exceptions=True)


def log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("%s failed: %r", task.get_name(), task.exception())

"""What the emulator's HTTP tests share: an emulator served on a loopback port, and one request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from prefixtune.sandbox.emulator import RealisticEmulator, serve_emulator


@pytest.fixture
async def em() -> AsyncIterator[RealisticEmulator]:
    async with serve_emulator() as (emulator, _url):
        yield emulator


async def call(em: RealisticEmulator, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    """(status, JSON body) of one request to the emulator."""
    async with em.request(method, path, **kwargs) as response:
        return response.status, await response.json(content_type=None)

"""Fixtures of the report tests: recorded data from tests/report/data (see record_fixture.py) and a
PNG check (signature and IHDR size, read from the bytes)."""

from __future__ import annotations

import copy
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).parent / "data"
_RESOURCE = json.loads((DATA / "sdep-recorded.json").read_text())
_EVENTS = json.loads((DATA / "sdep-events.json").read_text())["items"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def recorded() -> dict[str, Any]:
    """A ServingDeployment recorded from the policy driven against the twin (8 trials, 2 infeasible)."""
    return copy.deepcopy(_RESOURCE)


@pytest.fixture
def recorded_events() -> list[dict[str, Any]]:
    return copy.deepcopy(_EVENTS)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, f"{path.name}: not a PNG (signature {head[:8]!r})"
    assert head[12:16] == b"IHDR", f"{path.name}: first chunk is {head[12:16]!r}, not IHDR"
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def _assert_png(path: Path) -> tuple[int, int]:
    assert path.is_file(), f"{path} missing"
    width, height = png_size(path)
    assert width >= 400 and height >= 300, f"{path.name}: {width}x{height} is smaller than 400x300"
    assert path.stat().st_size > 5000, f"{path.name}: only {path.stat().st_size} bytes (an empty plot?)"
    return width, height


@pytest.fixture
def assert_png() -> Callable[[Path], tuple[int, int]]:
    """Asserts a file is a PNG of at least 400x300 pixels with some content; returns its size."""
    return _assert_png

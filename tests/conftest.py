"""Shared test configuration."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
TRACES = SHARED / "traces"
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require_component(available: bool, what: str) -> None:
    """Skip locally when a real component is missing; in CI a missing component is a failure."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{what} is required in CI but is not available")
    pytest.skip(f"{what} not available locally (CI=true makes this a failure)")


@pytest.fixture
def traces_dir() -> Path:
    require_component(TRACES.is_dir(), f"shared traces at {TRACES}")
    return TRACES

"""A clock one process publishes and another reads: the sandbox's time for the operator.

The sandbox (``prefixtune.sandbox.clock``) runs on a clock that stands still while the machine cannot
keep up; the operator is another process, and with ``prefixtune run --clock-file PATH`` it reads that
clock for every decision and every scrape timestamp, and the sandbox's speed-up (the twins'
simulated seconds per sandbox second: the operator's ``--time-scale`` unless it is given). The file
is a memory map of four doubles, (time, wall time, speed-up, time): the writer rewrites all four, a
reader that sees the first and last differ read a torn write and retries. This module belongs to
neither side, so that the controller does not import the sandbox.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
from pathlib import Path

_FORMAT = "<dddd"  # (clock time, wall time, speed-up, clock time): a reader that sees the two differ retries
_SIZE = struct.calcsize(_FORMAT)


class ClockFile:
    """The sandbox clock published for other processes (the operator): ``write`` on every tick;
    ``speedup``: the sandbox's, published with it."""

    def __init__(self, path: str | Path, speedup: float = 1.0) -> None:
        if not speedup > 0:
            raise ValueError(f"speedup: must be > 0, got {speedup}")
        self.path = Path(path)
        self.speedup = float(speedup)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(self._fd, _SIZE)
        self._map = mmap.mmap(self._fd, _SIZE)

    def write(self, value: float, wall: float | None = None) -> None:
        wall_now = time.time() if wall is None else wall
        self._map[:_SIZE] = struct.pack(_FORMAT, value, wall_now, self.speedup, value)

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)


class FileClock:
    """The sandbox clock as another process reads it (``path`` written by ``ClockFile``).

    ``clock()`` is sandbox time; ``to_wall(t)`` maps a sandbox time to the wall clock (for systems
    that stamp on the wall clock, as Prometheus does), by the offset at the last write."""

    def __init__(self, path: str | Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size < _SIZE:
                raise ValueError(f"{path}: not a sandbox clock file (under {_SIZE} bytes)")
            self._view = mmap.mmap(fd, _SIZE, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)

    def _read(self) -> tuple[float, float, float]:
        while True:
            a, wall, speedup, b = struct.unpack(_FORMAT, self._view[:_SIZE])
            if a == b:
                return float(a), float(wall), float(speedup)

    def __call__(self) -> float:
        return self._read()[0]

    @property
    def speedup(self) -> float:
        """The sandbox's speed-up: its twins' simulated seconds per sandbox second."""
        return self._read()[2]

    def to_wall(self, t: float) -> float:
        sandbox, wall, _ = self._read()
        return t + (wall - sandbox)


__all__ = ["ClockFile", "FileClock"]

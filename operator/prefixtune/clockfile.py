"""A clock one process publishes and another reads: the sandbox's time for the operator.

The sandbox (``prefixtune.sandbox.clock``) runs on a clock that stands still while the machine cannot
keep up; the operator is another process, and with ``prefixtune run --clock-file PATH`` it reads that
clock for every decision and every scrape timestamp. The file is a memory map of three doubles,
(time, wall time, time): the writer rewrites all three, a reader that sees the first and last differ
read a torn write and retries. This module belongs to neither side, so that the controller does not
import the sandbox.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
from pathlib import Path

_FORMAT = "<ddd"  # (clock time, wall time, clock time): a reader that sees the two differ retries
_SIZE = struct.calcsize(_FORMAT)


class ClockFile:
    """The sandbox clock published for other processes (the operator): ``write`` on every tick."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(self._fd, _SIZE)
        self._map = mmap.mmap(self._fd, _SIZE)

    def write(self, value: float, wall: float | None = None) -> None:
        self._map[:_SIZE] = struct.pack(_FORMAT, value, time.time() if wall is None else wall, value)

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

    def _read(self) -> tuple[float, float]:
        while True:
            a, wall, b = struct.unpack(_FORMAT, self._view[:_SIZE])
            if a == b:
                return float(a), float(wall)

    def __call__(self) -> float:
        return self._read()[0]

    def to_wall(self, t: float) -> float:
        sandbox, wall = self._read()
        return t + (wall - sandbox)


__all__ = ["ClockFile", "FileClock"]

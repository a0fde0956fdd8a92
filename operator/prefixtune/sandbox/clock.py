"""The sandbox's clock: time that follows the sandbox's progress, not the wall clock.

The sandbox runs its API server, controllers, kubelet, twins and load generators in one event loop,
at ``speedup`` simulated seconds per wall second. A machine busy with other work can starve that
loop: a task due now runs hundreds of milliseconds late. Measured on this 2-core machine with two
CPU burners (issue 25), the loop's lag reached seconds, so on wall time requests went out late
and in bursts, readiness probes timed out, and the operator's wall-clock deadlines
(``--ready-timeout``, measurement windows) ran out while nothing had been able to happen.

``SandboxClock`` keeps sandbox time in wall-equivalent epoch seconds (``now()``; simulated seconds
are that times ``speedup``). ``tick()``, called every ``TICK_S`` by the sandbox's pacer task, adds
the wall time since the previous tick, but at most ``max_step_s``: time the loop spent stalled beyond
that does not count, so everything that runs on this clock (the twins' simulated time, the load's
arrivals, the kubelet's delays, the operator's windows and timeouts) slows down together instead of
falling behind. ``lost_s`` is the wall time dropped so far, ``pace()`` the sandbox seconds per wall
second since the start (1.0 on a machine that keeps up).

The operator is another process: the sandbox publishes its clock in a small file
(``prefixtune.clockfile.ClockFile``) and ``prefixtune run --clock-file PATH`` reads it
(``FileClock``) for every decision and every scrape timestamp, so its deadlines follow the
sandbox's progress too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prefixtune.clockfile import ClockFile

TICK_S = 0.01  # wall seconds between the pacer's ticks
MAX_STEP_S = 0.1  # the most wall time one tick may add: a longer stall of the loop is dropped
# Wall seconds after which a test or benchmark that waits on sandbox time is hung rather than slow:
# its own deadlines are in sandbox time, so this only has to allow for a sandbox at a low pace.
HANG_GUARD_S = 1800


class SandboxClock:
    """Sandbox time (see the module docstring). ``mono`` and ``epoch`` are injectable for tests."""

    def __init__(
        self,
        *,
        max_step_s: float = MAX_STEP_S,
        mono: Callable[[], float] = time.monotonic,
        epoch: Callable[[], float] = time.time,
    ) -> None:
        if not max_step_s > 0:
            raise ValueError(f"max_step_s: must be > 0, got {max_step_s}")
        self.max_step_s = max_step_s
        self._mono = mono
        self._start_mono = self._last = mono()
        self._start = self._at = epoch()
        self.lost_s = 0.0
        self.worst_stall_s = 0.0

    def now(self) -> float:
        """Sandbox time, wall-equivalent epoch seconds (never decreases)."""
        return self._at + min(self._mono() - self._last, self.max_step_s)

    def tick(self) -> float:
        """Fold the wall time since the last tick in (at most ``max_step_s`` of it); sandbox time."""
        mono = self._mono()
        gap = mono - self._last
        step = min(gap, self.max_step_s)
        self._at += step
        self._last = mono
        if gap > step:
            self.lost_s += gap - step
            self.worst_stall_s = max(self.worst_stall_s, gap)
        return self._at

    def elapsed(self) -> float:
        """Sandbox seconds since the clock started (wall-equivalent)."""
        return self.now() - self._start

    def pace(self) -> float:
        """Sandbox seconds per wall second since the start (1.0: the sandbox kept up)."""
        wall = self._mono() - self._start_mono
        return 1.0 if wall <= 0 else min(1.0, self.elapsed() / wall)

    async def sleep(self, seconds: float) -> None:
        """Wait until ``seconds`` of sandbox time have passed."""
        await self.sleep_until(self.now() + seconds)

    async def sleep_until(self, when: float) -> None:
        """Wait until sandbox time reaches ``when``."""
        while (left := when - self.now()) > 0:
            await asyncio.sleep(left)


async def run_pacer(clock: SandboxClock, out: ClockFile | None = None, tick_s: float = TICK_S) -> None:
    """Tick ``clock`` every ``tick_s`` (and publish it to ``out``) until cancelled."""
    while True:
        value = clock.tick()
        if out is not None:
            out.write(value)
        await asyncio.sleep(tick_s)


__all__ = ["HANG_GUARD_S", "MAX_STEP_S", "TICK_S", "SandboxClock", "run_pacer"]

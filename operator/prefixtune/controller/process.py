"""The operator's process, set for a long life over many resources (``prefixtune run`` only).

``bench scale`` at N = 500 on a 2-core machine found three costs that grow with the fleet and
belong to the process, not to any reconcile:

* **The collector's pauses.** A reconcile allocates a few thousand objects that live across its
  awaits; at CPython's default (a young collection every 700 net allocations) a fleet's reconciles
  promote them to the old generation, whose full collections ran every ~5 s and took 0.3 s each,
  stopping the event loop and every reconcile in flight. Everything alive once the optimizer is
  imported (~155,000 objects: modules, classes, functions) moves to the permanent generation
  (``gc.freeze``), which no collection scans again, and young collections run every
  ``YOUNG_THRESHOLD`` allocations, so that a reconcile's temporaries die young.
* **glibc's malloc arenas.** Each thread that allocates gets an arena of its own (up to 8 per
  core), and freed memory stays in the arena it was freed in: the decision threads' Gaussian-process
  fits (numpy, scipy) and the default thread pool's work left tens of MB resident. The process
  keeps ``MALLOC_ARENAS`` (``mallopt(M_ARENA_MAX)``, as the ``MALLOC_ARENA_MAX`` variable does), set
  before the operator's own threads start (kopf's, the decision pool's; OpenBLAS's threads, started
  when numpy is imported, are older and may hold an arena each).
* **Freed memory kept.** glibc returns the top of its heap only; every ``TRIM_EVERY_S`` the process
  gives free pages back (``malloc_trim``), after the collector has run.

An operator run in a thread of another program (tests, ``run_in_thread``) leaves that program's
process as it is. Where glibc is not the C library (musl, macOS) the two malloc settings are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import logging

logger = logging.getLogger(__name__)

YOUNG_THRESHOLD = 20_000  # CPython's default: 700
MALLOC_ARENAS = 2
TRIM_EVERY_S = 60.0
_M_ARENA_MAX = -8  # glibc malloc.h


def _libc() -> ctypes.CDLL | None:
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim"):
            return libc
    return None


def limit_malloc_arenas() -> bool:
    """At most ``MALLOC_ARENAS`` malloc arenas for the threads started from now on; False where
    this C library has no ``mallopt``. Call it before the operator's threads start."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(_M_ARENA_MAX, MALLOC_ARENAS) == 1)


def quiet_collector() -> None:
    """Freeze what is alive now out of the collector's way, and collect young objects less often."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


async def trim_memory(every_s: float = TRIM_EVERY_S) -> None:
    """Give freed heap pages back to the system every ``every_s`` seconds (runs until cancelled)."""
    libc = _libc()
    if libc is None:
        return
    while True:
        await asyncio.sleep(every_s)
        libc.malloc_trim(0)

"""The operator's process, set for a long life (``controller/process.py``). In subprocesses: the
collector and malloc are process-wide, and a test process keeps its own settings."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from prefixtune.controller import process


def _run(code: str) -> list[object]:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    result: list[object] = json.loads(out.stdout)
    return result


def test_the_operators_process_freezes_its_imports_and_collects_young_objects_less_often() -> None:
    before, frozen, young = _run(
        "import gc, json\n"
        "from prefixtune.controller.operator import _preload\n"
        "from prefixtune.controller.process import quiet_collector\n"
        "_preload()\n"
        "before = gc.get_freeze_count()\n"
        "quiet_collector()\n"
        "print(json.dumps([before, gc.get_freeze_count(), gc.get_threshold()[0]]))\n"
    )
    assert before == 0
    assert isinstance(frozen, int) and frozen > 100_000  # the optimizer's libraries and ours
    assert young == process.YOUNG_THRESHOLD > 700  # CPython's default is 700


def test_the_operators_process_limits_malloc_arenas_on_glibc() -> None:
    (limited,) = _run(
        "import json\nfrom prefixtune.controller.process import limit_malloc_arenas\n"
        "print(json.dumps([limit_malloc_arenas()]))\n"
    )
    assert limited is True  # this machine's Python runs on glibc (the operator's image too)


async def test_freed_memory_is_given_back_on_a_period_until_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trims: list[int] = []

    class _Libc:
        def malloc_trim(self, pad: int) -> int:
            trims.append(pad)
            return 1

    monkeypatch.setattr(process, "_libc", lambda: _Libc())
    task = asyncio.create_task(process.trim_memory(every_s=0.01))
    for _ in range(1000):  # at most ~10 s on a loaded machine
        if len(trims) >= 3:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert trims[:3] == [0, 0, 0]

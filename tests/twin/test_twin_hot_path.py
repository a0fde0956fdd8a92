"""The inlined hot paths of ``DecodeRun`` give bit-identical results to the plain formulas they replace
(the twin's outputs must not move when its speed work does)."""

from __future__ import annotations

import math
import random

from prefixtune.twin.cost import DecodeRun, _lin_sum


def _total_ref(run: DecodeRun, k: int) -> float:
    """``DecodeRun.total`` written with ``_lin_sum`` and ``max``/``min`` (as before the inlining)."""
    if k <= 0:
        return 0.0
    dm, dc = run.m0 - run.c0, run.c1 - run.m1
    if dc > 0:
        cross = math.floor(dm / dc) + 1 if dm >= 0 else 0
        mem_steps = min(k, max(0, cross))
    elif dc < 0:
        start = min(k, max(0, math.ceil(dm / dc) if dm < 0 else 0))
        return run.base * k + _lin_sum(run.c0, run.c1, 0, start) + _lin_sum(run.m0, run.m1, start, k)
    else:
        mem_steps = k if dm >= 0 else 0
    return run.base * k + _lin_sum(run.m0, run.m1, 0, mem_steps) + _lin_sum(run.c0, run.c1, mem_steps, k)


def _step_ref(run: DecodeRun, j: int) -> float:
    return run.base + max(run.m0 + run.m1 * j, run.c0 + run.c1 * j)


def _steps_until_ref(run: DecodeRun, deadline: float) -> int:
    if deadline <= 0:
        return 1
    hi = max(1, math.ceil(deadline / _step_ref(run, 0)))
    lo = max(1, math.floor(deadline / _step_ref(run, hi - 1)))
    if lo >= hi or _total_ref(run, hi - 1) < deadline:
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if _total_ref(run, mid) >= deadline:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _runs(rng: random.Random) -> list[DecodeRun]:
    runs = []
    for _ in range(150):
        base = rng.uniform(1e-3, 3e-3)
        per_read, b, read0 = rng.uniform(1e-10, 5e-9), rng.randint(1, 512), rng.randint(1, 2_000_000)
        m0, m1 = per_read * read0, per_read * b
        runs.append(DecodeRun(base, m0, m1, m0, m1))  # the fitted model's shape (m == c)
        c0, c1 = rng.uniform(0.0, 2 * m0), rng.uniform(0.0, 2 * m1)
        runs.append(DecodeRun(base, m0, m1, c0, c1))  # the roofline's (a crossing or none)
    return runs


def test_total_is_bit_identical_to_the_plain_closed_form() -> None:
    rng = random.Random(7)
    for run in _runs(rng):
        for k in (0, 1, 2, 3, 17, 128, rng.randint(1, 5000)):
            assert run.total(k) == _total_ref(run, k)


def test_steps_until_is_the_same_integer_as_the_plain_search() -> None:
    rng = random.Random(11)
    for run in _runs(rng):
        for deadline in (-1.0, 0.0, run.step(0) / 2, run.step(0), run.total(40), rng.uniform(0.0, 30.0)):
            assert run.steps_until(deadline) == _steps_until_ref(run, deadline)
            assert run.steps_until(deadline * (1 + 1e-15)) == _steps_until_ref(run, deadline * (1 + 1e-15))

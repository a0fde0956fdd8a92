"""The sandbox's clock (issue 25): sandbox time stands still while the sandbox's loop is stalled, and
what runs on it (the twins, the load, the kubelet's probes, the operator, the waits) follows it.

Every test injects the clock's monotonic source, so a "stall" is a jump of that source: no test
depends on how fast this machine is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from prefixtune.clockfile import ClockFile, FileClock
from prefixtune.controller.operator import OperatorOptions, operator_clock, options_from_args
from prefixtune.sandbox import kubelet as kubelet_mod
from prefixtune.sandbox.clock import SandboxClock
from prefixtune.sandbox.kubelet import PROBE_FAILURE_THRESHOLD, Kubelet, KubeletConfig, _readiness
from prefixtune.sandbox.load import Declared, ServiceLoad
from prefixtune.sandbox.waiting import wait_until
from prefixtune.twin.serve import ServeOptions, make_server


class Mono:
    """A monotonic source the test moves by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def frozen(start: float = 1000.0) -> tuple[SandboxClock, Mono]:
    mono = Mono()
    return SandboxClock(mono=mono, epoch=lambda: start), mono


def test_a_stall_of_the_loop_is_dropped_from_sandbox_time() -> None:
    clock, mono = frozen()
    for _ in range(10):  # a loop that keeps up: ticks every 10 ms, all of it counts
        mono.t += 0.01
        clock.tick()
    assert clock.elapsed() == pytest.approx(0.1)
    assert clock.lost_s == 0 and clock.pace() == pytest.approx(1.0)
    mono.t += 5.0  # the process got no CPU for 5 s
    assert clock.now() == pytest.approx(
        1000.0 + 0.1 + clock.max_step_s
    )  # at most one step, even before the tick
    clock.tick()
    assert clock.elapsed() == pytest.approx(0.1 + clock.max_step_s)
    assert clock.lost_s == pytest.approx(5.0 - clock.max_step_s)
    assert clock.worst_stall_s == pytest.approx(5.0)
    assert clock.pace() == pytest.approx((0.1 + clock.max_step_s) / 5.1)


def test_sandbox_time_never_goes_back_between_and_across_ticks() -> None:
    clock, mono = frozen()
    seen = []
    for step in (0.003, 0.2, 0.05, 1.0, 0.0, 0.02):
        mono.t += step
        seen.append(clock.now())
        seen.append(clock.tick())
        seen.append(clock.now())
    assert seen == sorted(seen)
    with pytest.raises(ValueError, match="max_step_s"):
        SandboxClock(max_step_s=0)


def test_the_clock_file_carries_sandbox_time_to_another_reader(tmp_path: Path) -> None:
    out = ClockFile(tmp_path / "clock")
    out.write(1234.5, wall=1300.0)  # the sandbox lost 65.5 s to stalls so far
    reader = FileClock(tmp_path / "clock")
    assert reader() == 1234.5
    assert reader.to_wall(1234.0) == 1299.5  # Prometheus stamps samples on the wall clock
    out.write(1235.0, wall=1300.6)
    assert reader() == 1235.0
    out.close()
    (tmp_path / "short").write_bytes(b"\0" * 4)
    with pytest.raises(ValueError, match="not a sandbox clock file"):
        FileClock(tmp_path / "short")


def test_the_operator_runs_on_the_sandbox_clock_when_given_one(tmp_path: Path) -> None:
    out = ClockFile(tmp_path / "clock")
    out.write(500.0)
    clock, meter = operator_clock(OperatorOptions(time_scale=10.0, clock_file=str(tmp_path / "clock")))
    # Its decisions (the policy's now: windows, warm-ups, ready timeouts) and its scrape timestamps
    # read sandbox time: while the sandbox stands still, so does the operator's ready timeout.
    assert clock() == 500.0 and meter.born == 500.0
    assert meter._clock() == 5000.0
    out.write(501.0)
    assert clock() == 501.0
    out.close()
    wall, _ = operator_clock(OperatorOptions())
    assert wall() > 1e9  # the wall clock without one


def test_a_bad_clock_file_is_refused_with_its_name(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"--clock-file: .*missing"):
        options_from_args(["--clock-file", str(tmp_path / "missing")])


def test_the_clock_file_carries_the_speedup_the_operator_scales_rates_by(tmp_path: Path) -> None:
    """``prefixtune run --clock-file`` alone is enough against a sandbox: the file says its
    speed-up (the README's sandbox steps pass no --time-scale); an explicit one still wins."""
    out = ClockFile(tmp_path / "clock", speedup=10.0)
    out.write(100.0)
    assert FileClock(tmp_path / "clock").speedup == 10.0
    assert options_from_args(["--clock-file", str(tmp_path / "clock")]).time_scale == 10.0
    assert options_from_args(["--clock-file", str(tmp_path / "clock"), "--time-scale", "4"]).time_scale == 4.0
    out.close()
    with pytest.raises(ValueError, match="speedup"):
        ClockFile(tmp_path / "other", speedup=0)
    (tmp_path / "blank").write_bytes(b"\0" * 32)  # created, never written
    with pytest.raises(SystemExit, match="no speed-up written"):
        options_from_args(["--clock-file", str(tmp_path / "blank")])


async def test_a_wait_on_sandbox_time_does_not_run_out_while_the_sandbox_stands_still() -> None:
    clock, mono = frozen()
    calls = 0

    async def never() -> bool:
        nonlocal calls
        calls += 1
        return False

    task = asyncio.ensure_future(wait_until(never, 0.5, "nothing", every_s=0.01, clock=clock.now))
    await asyncio.sleep(0.2)  # longer than the timeout in wall time: the sandbox did not advance
    assert not task.done() and calls > 3
    for _ in range(10):  # the sandbox advances 0.6 s
        mono.t += 0.06
        clock.tick()
    with pytest.raises(TimeoutError, match="waiting for nothing"):
        await asyncio.wait_for(task, 5)


async def _at_least(load: ServiceLoad, n: int) -> bool:
    return load.stats.sent >= n


async def test_the_load_sends_no_burst_after_a_stall() -> None:
    clock, mono = frozen()
    speedup = 10.0
    load = ServiceLoad(
        None,  # type: ignore[arg-type]  # no endpoints: requests are counted, nothing is posted
        None,  # type: ignore[arg-type]
        "default",
        "svc",
        Declared("rag", 20.0, "test"),
        speedup=speedup,
        seed=1,
        clock=clock,
    )
    arrivals = sorted(r.arrival_s for r in load._window(0))
    task = asyncio.ensure_future(load.run())
    await asyncio.sleep(0)  # the load starts (its time origin: sandbox time now)
    mono.t += 30.0  # the loop stalls for 30 wall seconds (300 simulated seconds at 10x)
    due = clock.now() - 1000.0  # sandbox time moved by one step only
    expected = sum(1 for a in arrivals if a / speedup <= due)
    assert 0 < expected < sum(1 for a in arrivals if a <= 300.0) / 10
    try:
        # The requests due by sandbox time go out (however long this machine takes to send them)...
        await wait_until(lambda: _at_least(load, expected), 60, "the due requests", every_s=0.01)
        await asyncio.sleep(0.2)
        # ...and no more: on the wall clock every request of those 300 simulated seconds would go
        # out at once; the sandbox clock stands still, so they wait.
        assert load.stats.sent == expected
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_the_twin_simulates_on_the_sandbox_clock() -> None:
    clock, mono = frozen()
    server = make_server(
        "vllm", "meta-llama/Llama-3.1-8B-Instruct", "H100", (), ServeOptions(speedup=10.0, clock=clock.now)
    )
    await server.start()
    try:
        await asyncio.sleep(0.1)  # wall time passes; the sandbox's does not
        assert server.sim_now() == 0.0 and server.engine.now == 0.0
        mono.t += 3.0  # a 3 s stall, then the twin catches up: by one step, not by 30 simulated s
        server.catch_up()
        assert server.sim_now() == pytest.approx(clock.max_step_s * 10.0)
        assert server.engine.now <= server.sim_now() + 1.0
    finally:
        await server.stop()


SLOW_HEALTH_S = 1.0  # how long slow_health takes to answer


@pytest.fixture
async def slow_health() -> AsyncIterator[str]:
    async def health(_: web.Request) -> web.Response:
        await asyncio.sleep(SLOW_HEALTH_S)
        return web.Response(status=200)

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/health"
    finally:
        await runner.cleanup()


async def test_a_probe_that_timed_out_while_sandbox_time_stood_still_says_nothing(
    slow_health: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubelet_mod, "PROBE_TIMEOUT_S", 0.2)
    api: Any = None
    stalled, _ = frozen()
    kubelet = Kubelet(api, KubeletConfig(), clock=stalled)
    try:
        assert await kubelet.probe(slow_health) is None  # the sandbox stood still: inconclusive
    finally:
        await kubelet.stop_all()
        kubelet.close()
    kubelet = Kubelet(api, KubeletConfig(), clock=SandboxClock(max_step_s=100.0))
    try:
        assert await kubelet.probe(slow_health) is False  # sandbox time passed: a real timeout
    finally:
        await kubelet.stop_all()
        kubelet.close()


def test_readiness_needs_failure_threshold_failures_in_a_row() -> None:
    assert _readiness({}, "/health", 2.0) == ("/health", 2.0, PROBE_FAILURE_THRESHOLD, 1.0)
    pod = {
        "spec": {"containers": [{"readinessProbe": {"httpGet": {"path": "/ready"}, "failureThreshold": 1}}]}
    }
    assert _readiness(pod, "/health", 2.0) == ("/ready", 10.0, 1, 1.0)  # kube's default timeout: 1 s
    # The pod's timeoutSeconds (the operator renders 5), not a fixed one of the kubelet's.
    probe = {"httpGet": {"path": "/health"}, "timeoutSeconds": 5, "periodSeconds": 10}
    assert _readiness({"spec": {"containers": [{"readinessProbe": probe}]}}, "/x", 2.0)[3] == 5.0


async def test_a_probe_waits_as_long_as_it_is_told(slow_health: str) -> None:
    """A probe given a timeout longer than the engine takes passes; a shorter one fails (sandbox
    time passing: not the inconclusive None of a stalled sandbox)."""
    api: Any = None
    kubelet = Kubelet(api, KubeletConfig(), clock=SandboxClock(max_step_s=100.0))
    try:
        assert await kubelet.probe(slow_health, timeout_s=0.2) is False
        assert await kubelet.probe(slow_health, timeout_s=SLOW_HEALTH_S + 5.0) is True
    finally:
        await kubelet.stop_all()
        kubelet.close()


async def test_an_unreachable_probe_is_a_failure() -> None:
    api: Any = None
    stalled, _ = frozen()
    kubelet = Kubelet(api, KubeletConfig(), clock=stalled)
    try:  # refused at once: the engine is not there, whatever the sandbox's pace
        assert await kubelet.probe("http://127.0.0.1:1/health") is False
    finally:
        await kubelet.stop_all()
        kubelet.close()


class Steps:
    """A clock that moves by ``step`` on every read (time passes on its own)."""

    def __init__(self, step: float) -> None:
        self.t = 0.0
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


async def test_a_wait_that_follows_progress_outlasts_its_timeout_while_progress_goes_on() -> None:
    clock = Steps(1.0)
    moves = iter(range(1000))

    async def moving() -> int:
        return next(moves)  # the operator does something on every poll

    async def never() -> bool:
        return False

    # Steady progress: the deadline moves on, up to the cap (4x the timeout in all).
    with pytest.raises(TimeoutError, match="after 40s in all"):
        await wait_until(never, 10, "a slow tuning", every_s=0, clock=clock, progress=moving)
    assert 35 <= clock.t <= 50

    async def stuck() -> int:
        return 0

    clock = Steps(1.0)
    with pytest.raises(TimeoutError, match="after 10s without progress"):
        await wait_until(never, 10, "a stuck tuning", every_s=0, clock=clock, progress=stuck)
    assert clock.t <= 15


def test_tuning_progress_changes_with_the_policy() -> None:
    from prefixtune.engines.base import KnobConfig
    from prefixtune.sandbox.waiting import tuning_progress
    from prefixtune.tuning.settings import TuningSettings
    from prefixtune.tuning.state import PolicyState, Trial

    a = KnobConfig(0.9, 16, False, "fcfs")
    base = PolicyState(engine="vllm", settings=TuningSettings(), spec_config=a, current=a, trials=[])
    trial = Trial(id=0, epoch=0, role="baseline", config=a, outcome="running", started_at=0.0)
    measuring = base.model_copy(update={"trials": [trial], "active": 0, "step": "Measuring"})
    remeasured = measuring.model_copy(update={"trials": [trial.model_copy(update={"invalidations": 1})]})
    tokens = [tuning_progress(s) for s in (None, base, measuring, remeasured)]
    assert len(set(tokens)) == 4
    assert tuning_progress(measuring.model_copy()) == tokens[2]


def test_pod_times_are_written_on_the_sandbox_clock() -> None:
    # Found under load: pods' startedAt came from the wall clock, which runs ahead of sandbox time by
    # the stalls dropped from it, so the operator (on sandbox time) saw every pod as restarted after
    # its window began and re-measured the same trial 205 times.
    from prefixtune.sandbox.kubelet import PodWorker

    api: Any = None
    lagging, _ = frozen(start=1_000_000.0)  # sandbox time, far behind the wall clock
    kubelet = Kubelet(api, KubeletConfig(), clock=lagging)
    try:
        assert kubelet.stamp() == "1970-01-12T13:46:40Z"
        worker = PodWorker(kubelet, {"metadata": {"name": "p", "namespace": "default", "uid": "u"}})
        assert worker.start_time == kubelet.stamp()
    finally:
        kubelet.close()

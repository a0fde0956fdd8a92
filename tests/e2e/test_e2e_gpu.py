"""Rollouts under GPU scarcity in the sandbox (#21 item 2): the node has a fixed number of GPUs,
pods beyond them stay Pending with the scheduler's Unschedulable condition, models load for a time
proportional to their weights. The operator is a real ``prefixtune run`` process.

- a canary trial never removes a serving pod before its replacement serves (watched all along);
- a trial whose pod is Pending for a GPU ends as no capacity, never infeasible, and the same config
  is tried again once a GPU is added to the node mid-test;
- a rolling trial capped by ``maxTrialReplicas`` never moves more replicas onto its config.

The watch samples the pods continuously (a list every few tens of milliseconds); generous deadlines
on the sandbox's clock, no timing assertions.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from prefixtune.api.crd import build_crd
from prefixtune.controller.operator import operator_argv, spawn_operator, stop_operator
from prefixtune.controller.render import config_hash
from prefixtune.controller.status import policy_state_of
from prefixtune.sandbox.clock import HANG_GUARD_S
from prefixtune.sandbox.kubelet import KubeletConfig
from prefixtune.sandbox.up import Sandbox, SandboxOptions, sandbox
from prefixtune.sandbox.waiting import tuning_progress, wait_until
from prefixtune.tuning.phases import TRIAL_STEPS, Phase
from prefixtune.tuning.state import PolicyState

SPEEDUP = 10.0
SDEP = "/apis/prefixtune.io/v1alpha1/namespaces/default/servingdeployments"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
T = TypeVar("T")
pytestmark = pytest.mark.timeout(HANG_GUARD_S)


@dataclass
class Env:
    sb: Sandbox
    log: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    async def status(self, name: str) -> dict[str, Any]:
        obj = await self.sb.api.get(f"{SDEP}/{name}")
        return dict((obj or {}).get("status") or {})

    async def state(self, name: str) -> PolicyState | None:
        return policy_state_of(await self.status(name))

    async def events(self, name: str) -> list[dict[str, Any]]:
        items = await self.sb.api.list("/api/v1/namespaces/default/events")
        return [e for e in items if (e.get("involvedObject") or {}).get("name") == name]

    async def wait_for(
        self, check: Callable[[], Awaitable[T | None]], timeout_s: float, what: str, name: str
    ) -> T:
        async def progress() -> tuple[object, ...]:
            return tuning_progress(await self.state(name))

        return await wait_until(check, timeout_s, what, 0.5, clock=self.sb.clock.now, progress=progress)


@contextlib.asynccontextmanager
async def env(gpus: int) -> AsyncIterator[Env]:
    # 8B weights (16 GB) at 2 GB/s of sandbox time: ~8 s of loading on top of the fixed 2 s, so a
    # trial pod is visibly loading (not ready) while the stable pods serve.
    cfg = KubeletConfig(startup_delay_s=2.0, probe_period_s=1.0, gpus=gpus, load_bytes_per_s=2e9)
    with tempfile.TemporaryDirectory(prefix="prefixtune-gpu-") as tmp:
        async with sandbox(
            SandboxOptions(speedup=SPEEDUP, crds=[build_crd()], config=cfg, prometheus="off")
        ) as sb:
            e = Env(sb, Path(tmp) / "operator.log")
            argv = operator_argv(
                str(sb.kubeconfig),
                tick_s=1.0,
                time_scale=SPEEDUP,
                ready_timeout_s=300.0,
                clock_file=sb.clock_file,
            )
            e.procs.append(spawn_operator(argv, str(e.log)))
            try:
                yield e
            finally:
                for proc in e.procs:
                    stop_operator(proc)


def resource(name: str, replicas: int, rollout: dict[str, Any], rate: float) -> dict[str, Any]:
    return {
        "apiVersion": "prefixtune.io/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {
            "name": name,
            "annotations": {
                "prefixtune.io/sandbox-workload": "rag",
                "prefixtune.io/sandbox-rate": f"{rate:g}",
            },
        },
        "spec": {
            "engine": "vllm",
            "model": MODEL,
            "replicas": replicas,
            "config": {"memoryFraction": 0.9, "blockSize": 16, "prefixCaching": False},
            "tuning": {
                "slo": {"ttftP99": "2s", "itlP99": "100ms"},
                "space": {
                    "memoryFraction": {"min": 0.85, "max": 0.9},
                    "blockSize": [16],
                    "prefixCaching": [True],
                },
                "trial": {"warmup": "2s", "measure": "6s", "minRequests": 4},
                "budget": {"maxTrials": 2},
                "rollout": {"minInterval": "0s", **rollout},
                "drift": {"threshold": 1.0},
            },
        },
    }


@dataclass
class Watch:
    """What the pods of one resource did, sampled continuously."""

    min_serving: int | None = None  # fewest ready serving pods seen once all replicas first served
    # the most pods at once on the config of the trial in flight (a trial's own pods, while it runs)
    max_on_trial: int = 0
    samples: int = 0


def _trial_in_flight(state: PolicyState | None) -> tuple[int, str] | None:
    """(id, config hash) of the trial being rolled out or measured, if any."""
    if state is None or state.active is None or state.step not in TRIAL_STEPS:
        return None
    trial = state.trial(state.active)
    return None if trial.role != "trial" else (trial.id, config_hash(trial.config))


async def watch(e: Env, name: str, replicas: int, out: Watch, stop: asyncio.Event) -> None:
    full = False
    while not stop.is_set():
        before = _trial_in_flight(await e.state(name))
        pods = await e.sb.api.list(
            f"/api/v1/namespaces/default/pods?labelSelector=prefixtune.io%2Fresource%3D{name}"
        )
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        serving = sum(
            1
            for p in live
            if any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (p.get("status") or {}).get("conditions") or ()
            )
        )
        full = full or serving >= replicas
        if full:
            out.min_serving = serving if out.min_serving is None else min(out.min_serving, serving)
        after = _trial_in_flight(await e.state(name))
        if before is not None and after == before:  # the same trial ran all through the sample
            on_trial = [
                p
                for p in live
                if (p["metadata"].get("labels") or {}).get("prefixtune.io/config-hash") == before[1]
            ]
            out.max_on_trial = max(out.max_on_trial, len(on_trial))
        out.samples += 1
        await asyncio.sleep(0.03)


async def test_no_capacity_is_retried_when_a_gpu_appears_and_the_canary_comes_up_first() -> None:
    # Two replicas on a node of exactly two GPUs: the canary cannot be placed (no spare GPU).
    async with env(gpus=2) as e:
        await e.sb.api.create(SDEP, resource("chat", 2, {"strategy": "canary"}, rate=0.6))
        seen = Watch()
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(e, "chat", 2, seen, stop))
        try:

            async def paused() -> PolicyState | None:
                s = await e.state("chat")
                return s if s is not None and s.capacity_wait is not None else None

            waiting = await e.wait_for(paused, 200, "a trial paused for lack of a GPU", "chat")
            first = next(t for t in waiting.trials if t.failure == "no_capacity")
            assert first.outcome == "invalidated" and "Insufficient nvidia.com/gpu" in first.reason
            cond = {c["type"]: c for c in (await e.status("chat")).get("conditions") or []}
            assert cond["Tuning"]["reason"] == "NoCapacity"

            # The Pending canary is not left behind while the trial waits.
            async def canary_gone() -> bool | None:
                dep = await e.sb.api.get("/apis/apps/v1/namespaces/default/deployments/chat-canary")
                return True if dep is None else None

            await e.wait_for(canary_gone, 60, "the Pending canary's Deployment to be deleted", "chat")

            await e.sb.kubelet.set_gpus(3)  # a GPU comes free

            async def converged() -> PolicyState | None:
                s = await e.state("chat")
                return s if s is not None and s.phase == Phase.CONVERGED else None

            state = await e.wait_for(
                converged, 300, "the retried trial to run and the resource to converge", "chat"
            )
            await e.wait_for(canary_gone, 60, "the canary to go after the trials", "chat")
            reasons = {ev.get("reason") for ev in await e.events("chat")}
        finally:
            stop.set()
            await watcher
    retried = [t for t in state.trials if t.role == "trial" and t.config == first.config and t.id != first.id]
    assert retried and retried[0].outcome == "ok", [(t.id, t.outcome, t.failure) for t in state.trials]
    assert not [t for t in state.trials if t.outcome == "infeasible"]
    # The GPU that came free is the one spare: each later canary fits in it (the last trial's canary
    # serves until the stable is back, then goes before the next config's pod), none waits again.
    waits = [(t.id, t.config) for t in state.trials if t.failure == "no_capacity"]
    assert waits == [(first.id, first.config)], waits
    assert "NoCapacity" in reasons and "TrialInfeasible" not in reasons
    # Never fewer than 2 ready pods once both first served: the canary came up before the baseline
    # gave up its replica, and the baseline was back before the canary went.
    assert seen.samples > 50 and seen.min_serving is not None
    assert seen.min_serving >= 2, f"a serving pod was removed before its replacement was ready ({seen})"


async def test_a_rolling_trial_never_moves_more_replicas_than_max_trial_replicas() -> None:
    async with env(gpus=4) as e:
        await e.sb.api.create(
            SDEP, resource("fleet", 3, {"strategy": "rolling", "maxTrialReplicas": 1}, rate=0.6)
        )
        seen = Watch()
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(e, "fleet", 3, seen, stop))
        try:

            async def first_trial_done() -> PolicyState | None:
                s = await e.state("fleet")
                if s is None:
                    return None
                done = [t for t in s.trials if t.role == "trial" and t.outcome != "running"]
                return s if done and s.step not in TRIAL_STEPS else None

            state = await e.wait_for(first_trial_done, 300, "the first trial to finish", "fleet")
        finally:
            stop.set()
            await watcher
    trial = next(t for t in state.trials if t.role == "trial")
    assert trial.outcome == "ok", (trial.outcome, trial.reason)
    assert seen.max_on_trial == 1, f"{seen.max_on_trial} pods ran the untested config (maxTrialReplicas 1)"
    assert state.settings.strategy == "canary"  # the capped rolling trial runs beside the stable pods
    assert seen.min_serving is not None and seen.min_serving >= 3

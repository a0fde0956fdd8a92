"""Fault injection against the running operator in the sandbox, and the invariants checked after it.

Each scenario starts a sandbox (emulated API server, twin kubelet, load), one or more real
``prefixtune run`` operator processes (each with its own bearer token, so the emulator's audit says
which process wrote what), applies a small ServingDeployment and injects one kind of fault at random
points of the tuning loop, repeated, until the resource converges:

* ``operator_kill``: SIGKILL the operator after a random delay, restart it; repeated.
* ``api_faults``: the API server answers 500/503 on a fraction of the operator's requests, 409 on a
  fraction of its status patches, and drops its watch streams after a few seconds.
* ``metrics``: the pods' metrics endpoints go unreachable, return gaps (empty), NaN, or reset their
  counters, for a few seconds while a window is measured; then recover.
* ``engine_crash``: the engine of a trial's pod dies under load (CUDA OOM, or a plain crash).
* ``pod_delete``: a pod under measurement is deleted (the ReplicaSet replaces it).
* ``peering``: two replicas share a kopf peering (priorities as the chart sets them); the active
  one is SIGKILLed, the standby takes over; repeated with a new standby each time.

Invariants (``check_invariants``, pure), from the statuses the operators wrote (the emulator's audit
of every successful status patch, in order), the final status and the Events:

* trials_lost: a trial id written once and missing from the final history (or reused for another
  trial);
* duplicate_trials: a trial recorded twice (the same id twice in one history, its finished record
  changed after it was written, or two scoring Events for it);
* rollouts_on_missing_data: a pod-template change of a Deployment to a config whose rollout was
  decided while the policy held for missing metrics (rollbacks excluded);
* the resource converges (phase Converged) and the phase resumes after each fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import yaml

from prefixtune.api.crd import build_crd
from prefixtune.controller.operator import operator_argv, spawn_operator, stop_operator
from prefixtune.controller.render import LABEL_CONFIG_HASH, LABEL_RESOURCE, config_hash
from prefixtune.controller.status import policy_state_of
from prefixtune.sandbox.emulator import kubeconfig
from prefixtune.sandbox.faults import ApiFaults, AuditEntry, MetricsFaults
from prefixtune.sandbox.kubelet import ApiStatusError, KubeletConfig
from prefixtune.sandbox.up import Sandbox, SandboxOptions, sandbox
from prefixtune.sandbox.waiting import tuning_progress, wait_until
from prefixtune.tuning.phases import Phase, Step
from prefixtune.tuning.state import PolicyState

SPEEDUP = 10.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SDEP = "/apis/prefixtune.io/v1alpha1"
PEERING = "prefixtune"
PEERING_LIFETIME_S = 10  # kopf's default is 60 s; short here so a killed active is replaced quickly
PEERING_GRACE_S = 2.0  # for the peers to see a new keep-alive (a watch event) and pause
KINDS = ("operator_kill", "api_faults", "metrics", "engine_crash", "pod_delete", "peering")
KUBELET = KubeletConfig(startup_delay_s=20.0, probe_period_s=2.0, backoff_initial_s=10.0)
PEERING_CRDS = Path(__file__).resolve().parents[1] / "crds" / "kopf-peering.yaml"
SCORING_REASONS = ("BaselineMeasured", "TrialScored", "TrialInfeasible", "TrialAborted")
T = TypeVar("T")


# ------------------------------------------------------------------------------------ invariants


@dataclass
class Invariants:
    trials_lost: int = 0
    duplicate_trials: int = 0
    rollouts_on_missing_data: int = 0
    details: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.trials_lost == 0 and self.duplicate_trials == 0 and self.rollouts_on_missing_data == 0


def _owner_of(path: str) -> tuple[str, str] | None:
    """(kind, resource name) of an audited write: ("status", sdep) or ("deployment", owner)."""
    parts = path.rstrip("/").split("/")
    if "servingdeployments" in parts and parts[-1] == "status":
        return "status", parts[-2]
    if "deployments" in parts and parts[-1] != "deployments":
        name = parts[-1]
        return "deployment", name.removesuffix("-canary")
    return None


def _template_hash(body: Any) -> str | None:
    try:
        labels = body["spec"]["template"]["metadata"]["labels"]
    except (KeyError, TypeError):
        return None
    value = labels.get(LABEL_CONFIG_HASH) if isinstance(labels, Mapping) else None
    return str(value) if value else None


def written_states(audit: Sequence[AuditEntry], name: str) -> list[tuple[float, str, PolicyState]]:
    """(time, client, state) of every successful status write of resource ``name``, in order."""
    out = []
    for e in audit:
        if e.method != "PATCH" or e.status >= 300 or not isinstance(e.body, Mapping):
            continue
        if _owner_of(e.path) != ("status", name):
            continue
        state = policy_state_of(e.body.get("status"))
        if state is not None:
            out.append((e.t, e.client, state))
    return out


def check_invariants(
    audit: Sequence[AuditEntry], name: str, final: PolicyState | None, events: Sequence[Mapping[str, Any]]
) -> Invariants:
    """The invariants of one resource after a run (see the module docstring)."""
    inv = Invariants()
    states = written_states(audit, name)
    identity: dict[int, tuple[int, str, str]] = {}
    finished: dict[int, tuple[str, float | None, float | None]] = {}
    duplicated: set[int] = set()
    for _, _, state in [*states, *(((0.0, "final", final),) if final is not None else ())]:
        ids = [t.id for t in state.trials]
        for dup in {i for i in ids if ids.count(i) > 1}:
            if dup not in duplicated:
                duplicated.add(dup)
                inv.details.append(f"trial {dup} appears twice in one history")
        for t in state.trials:
            who = (t.epoch, t.role, config_hash(t.config))
            if identity.setdefault(t.id, who) != who and t.id not in duplicated:
                duplicated.add(t.id)
                inv.details.append(f"trial id {t.id} reused for another trial")
            if t.outcome == "running":
                continue
            record = (t.outcome, t.value, t.finished_at)
            if finished.setdefault(t.id, record) != record and t.id not in duplicated:
                duplicated.add(t.id)
                inv.details.append(f"trial {t.id} finished twice: {finished[t.id]} then {record}")
    scored: dict[int, int] = {}
    for event in events:
        if event.get("reason") not in SCORING_REASONS:
            continue
        words = str(event.get("message", "")).split()
        if len(words) > 1 and words[0] == "trial" and words[1].isdigit():
            scored[int(words[1])] = scored.get(int(words[1]), 0) + 1
    for trial_id, n in sorted(scored.items()):
        if n > 1 and trial_id not in duplicated:
            duplicated.add(trial_id)
            inv.details.append(f"trial {trial_id} has {n} scoring Events")
    inv.duplicate_trials = len(duplicated)
    if final is not None:
        have = {t.id for t in final.trials}
        lost = sorted(set(identity) - have)
        inv.trials_lost = len(lost)
        if lost:
            inv.details.append(f"trials lost from the final history: {lost}")
    inv.rollouts_on_missing_data = _rollouts_on_missing_data(audit, name, inv.details)
    return inv


def _rollouts_on_missing_data(audit: Sequence[AuditEntry], name: str, details: list[str]) -> int:
    """Template changes to a config whose rollout was decided while metrics were held."""
    decided: dict[str, tuple[bool, bool]] = {}  # config hash -> (held at decision, a rollback)
    last_target: str | None = None
    templates: dict[str, str] = {}
    count = 0
    for e in audit:
        owner = _owner_of(e.path)
        if owner is None or owner[1] != name or e.status >= 300 or not isinstance(e.body, Mapping):
            continue
        if owner[0] == "status":
            state = policy_state_of(e.body.get("status"))
            if state is None:
                continue
            target = None if state.target is None else config_hash(state.target)
            if target is not None and target != last_target:
                decided[target] = (state.metrics_held, state.step == Step.ROLLING_BACK)
            last_target = target
            continue
        digest = _template_hash(e.body)
        deployment = (
            e.path.rstrip("/").split("/")[-1]
            if e.method == "PATCH"
            else str((e.body.get("metadata") or {}).get("name", ""))
        )
        if digest is None or templates.get(deployment) == digest:
            continue
        templates[deployment] = digest
        held, rollback = decided.get(digest, (False, True))
        if held and not rollback:
            count += 1
            details.append(f"{deployment}: template changed to {digest} decided while metrics were held")
    return count


# ------------------------------------------------------------------------------------ operators


@dataclass
class Operators:
    """``prefixtune run`` processes against the sandbox, each with its own token (its audit name)."""

    url: str
    workdir: Path
    peering: bool = False
    clock_file: Path | None = None  # the sandbox's clock: the operators' deadlines follow its progress
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    killed_at: dict[str, float] = field(default_factory=dict)
    started_at: dict[str, float] = field(default_factory=dict)
    starts: int = 0

    def start(self, name: str, priority: int = 0) -> None:
        config = kubeconfig(self.url)
        config["users"][0]["user"]["token"] = name
        path = self.workdir / f"kubeconfig-{name}"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        argv = operator_argv(
            str(path), tick_s=1.0, time_scale=SPEEDUP, ready_timeout_s=60.0, clock_file=self.clock_file
        )
        if self.peering:
            i = argv.index("--standalone")
            argv[i : i + 1] = ["--peering", PEERING, "--priority", str(priority),
                               "--peering-lifetime", str(PEERING_LIFETIME_S)]  # fmt: skip
        self.starts += 1
        self.started_at[name] = time.time()
        self.procs[name] = spawn_operator(argv, str(self.workdir / f"operator-{self.starts}-{name}.log"))

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        self.killed_at[name] = time.time()

    def crashed(self) -> list[str]:
        """Operators that exited without being killed (a crash is a finding)."""
        return [n for n, p in self.procs.items() if p.poll() is not None and n not in self.killed_at]

    def stop(self) -> None:
        for proc in self.procs.values():
            stop_operator(proc)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.workdir.glob("operator-*.log")))


# ------------------------------------------------------------------------------------ scenarios


@dataclass(frozen=True)
class FaultScenario:
    kind: str
    seed: int = 0
    repeats: int = 2
    timeout_s: float = 240.0
    rate: float = 0.3  # requests per sandbox second
    max_trials: int = 0  # the resource's budget; 0: enough for the repeats

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"scenario kind: must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.repeats < 1:
            raise ValueError(f"repeats: must be >= 1, got {self.repeats}")


@dataclass
class ScenarioResult:
    kind: str
    seed: int
    injected: dict[str, int] = field(default_factory=dict)
    survived: dict[str, int] = field(default_factory=dict)
    missed: dict[str, int] = field(default_factory=dict)  # faults that missed their window, retried
    converged: bool = False
    invariants: Invariants = field(default_factory=Invariants)
    checks: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    injections: list[Injection] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0  # this process and its operators (children reaped by the scenario's end)
    sandbox_clock: dict[str, float] = field(default_factory=dict)  # Sandbox.pace() at the end
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.converged and self.invariants.ok and all(self.checks.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "seed": self.seed, "ok": self.ok, "converged": self.converged,
            "injected": dict(self.injected), "survived": dict(self.survived), "missed": dict(self.missed),
            "trials_lost": self.invariants.trials_lost, "duplicate_trials": self.invariants.duplicate_trials,
            "rollouts_on_missing_data": self.invariants.rollouts_on_missing_data,
            "checks": dict(self.checks), "details": list(self.invariants.details) + list(self.notes),
            "wall_s": round(self.wall_s, 1), "cpu_s": round(self.cpu_s, 1),
            "sandbox_clock": dict(self.sandbox_clock), "error": self.error,
        }  # fmt: skip


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have exited (the operators)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def resource_body(name: str, max_trials: int, rate: float) -> dict[str, Any]:
    spec = {
        "engine": "vllm", "model": MODEL, "replicas": 1,
        "config": {"memoryFraction": 0.9, "blockSize": 16, "prefixCaching": False},
        "tuning": {
            "objective": "goodput",
            "slo": {"ttftP99": "2s", "itlP99": "100ms"},
            "space": {"blockSize": [16, 32], "prefixCaching": [True, False]},
            "trial": {"warmup": "1s", "measure": "4s", "minRequests": 6},
            "budget": {"maxTrials": max_trials},
            "rollout": {"minInterval": "0s"},
            "drift": {"threshold": 1.0},  # small windows are noisy: no drift re-tunes
        },
    }  # fmt: skip
    return {
        "apiVersion": "prefixtune.io/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {
                "prefixtune.io/sandbox-workload": "rag",
                "prefixtune.io/sandbox-rate": f"{rate:g}",
            },
        },
        "spec": spec,
    }


@dataclass
class Run:
    """What an injector works with."""

    sb: Sandbox
    ops: Operators
    name: str
    rng: random.Random
    result: ScenarioResult
    metrics: MetricsFaults | None = None
    api: ApiFaults | None = None

    async def state(self) -> PolicyState | None:
        try:
            obj = await self.sb.api.get(f"{SDEP}/namespaces/default/servingdeployments/{self.name}")
        except ApiStatusError:
            return None
        return policy_state_of((obj or {}).get("status"))

    async def wait(self, check: Callable[[], Awaitable[T | None]], timeout_s: float, what: str) -> T:
        """Wait on the sandbox's clock (a busy machine slows it), and for as long as the resource's
        tuning makes progress (a busy machine slows the operators too): the deadline follows both."""
        return await wait_until(
            check, timeout_s, what, every_s=0.25, clock=self.sb.clock.now, progress=self.progress
        )

    async def progress(self) -> tuple[object, ...]:
        return tuning_progress(await self.state())

    async def hit(self, injection: Injection) -> bool:
        """Once its trial is over: whether the fault hit its window (``missed``); a miss is noted,
        taken off the injected counts, and the injector tries another window."""
        final = await self.state()
        audit = self.api.audit if self.api is not None else []
        scrapes = tuple(self.metrics.scrapes) if self.metrics is not None else ()
        why = "" if final is None else missed(injection, written_states(audit, self.name), final, scrapes)
        if why:
            injection.missed = why
            self.result.injected[injection.kind] -= 1
            if not self.result.injected[injection.kind]:
                del self.result.injected[injection.kind]
            self.result.missed[injection.kind] = self.result.missed.get(injection.kind, 0) + 1
            self.result.notes.append(f"missed: {injection.kind} trial={injection.trial}: {why}")
        return not why

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds`` of sandbox time (the operators' clock: ``--clock-file``)."""
        await self.sb.clock.sleep(seconds)

    async def acted(self, client: str, since: float = 0.0) -> bool:
        """Whether operator ``client`` has acted (written something besides peering keep-alives)."""
        audit = self.api.audit if self.api is not None else []
        return any(e.client == client and acting(e) and e.t > since for e in audit)

    async def converged(self) -> PolicyState | None:
        """The state once tuning is over and the best config is applied (Converged, Watching)."""
        s = await self.state()
        return s if s is not None and s.phase == Phase.CONVERGED and s.step == Step.WATCHING else None

    async def measuring(self, role: str | None = None) -> PolicyState | None:
        """The state when a window (of ``role``) is being measured; ends the injector once converged."""
        s = await self.state()
        if s is not None and s.phase == Phase.CONVERGED:
            raise TuningOver
        if s is None or s.step != Step.MEASURING or s.active is None:
            return None
        return s if role is None or s.trial(s.active).role == role else None

    async def pods(self, digest: str | None = None, ready: bool = True) -> list[dict[str, Any]]:
        out = []
        for pod in await self.sb.api.list("/api/v1/namespaces/default/pods"):
            labels = pod["metadata"].get("labels") or {}
            if labels.get(LABEL_RESOURCE) != self.name:
                continue
            if digest is not None and labels.get(LABEL_CONFIG_HASH) != digest:
                continue
            conditions = (pod.get("status") or {}).get("conditions") or []
            is_ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            if (not ready or is_ready) and not pod["metadata"].get("deletionTimestamp"):
                out.append(pod)
        return out

    def count(self, kind: str, trial: int | None = None, client: str = "") -> Injection:
        self.result.injected[kind] = self.result.injected.get(kind, 0) + 1
        injection = Injection(kind, time.time(), trial=trial, client=client, at=self.sb.clock.now())
        self.result.injections.append(injection)
        return injection


class TuningOver(Exception):
    """The resource converged: no more windows to inject faults into."""


@dataclass
class Injection:
    """One fault injected: when, until when (metrics), on which trial, which replica took over."""

    kind: str
    t: float
    until: float | None = None
    trial: int | None = None
    client: str = ""  # operator_kill: the restarted one; active_replica_kill: the standby
    handled: bool = False
    at: float = 0.0  # when, on the sandbox's clock (the operators' clock: their windows' times)
    missed: str = ""  # why it missed its window (``missed``); not counted as injected


def handled(inj: Injection, states: Sequence[tuple[float, str, PolicyState]], final: PolicyState) -> bool:
    """Whether the operator handled one injected fault as it must (see the module docstring)."""
    after = [(t, client, s) for t, client, s in states if t > inj.t]
    if inj.kind in ("operator_kill", "active_replica_kill", "higher_priority_replica_joins"):
        return any(client == inj.client for _, client, _ in after)  # the new process acted
    trial = next((t for t in final.trials if t.id == inj.trial), None)
    if inj.kind.startswith("metrics_"):
        # Handled: the operator noticed (a hold, or the window re-measured for a counter reset), and
        # the window the trial was finally scored on began after the fault did.
        if trial is None:
            return False
        noticed = any(s.metrics_held for _, _, s in after) or (
            inj.kind == "metrics_reset" and trial.invalidations >= 1
        )
        running = [
            s for _, _, s in states if any(x.id == trial.id and x.outcome == "running" for x in s.trials)
        ]
        scored_from = running[-1].measure_from if running else None
        clean = trial.outcome != "ok" or (scored_from is not None and scored_from >= inj.at)
        return noticed and clean
    if inj.kind in ("engine_oom", "engine_crash"):
        if trial is None or trial.outcome != "infeasible":
            return False
        kind_ok = trial.failure.startswith("oom") if inj.kind == "engine_oom" else trial.failure == "crash"
        rolled_back = any(s.step == Step.ROLLING_BACK and s.target != trial.config for _, _, s in after)
        return kind_ok and rolled_back
    if inj.kind == "pod_delete":
        return trial is not None and trial.invalidations >= 1 and trial.outcome != "running"
    return True  # API faults: survived when the scenario converges with its invariants


WINDOW_FAULTS = ("engine_oom", "engine_crash", "pod_delete", "metrics_unreachable", "metrics_gap",
                 "metrics_nan", "metrics_reset")  # fmt: skip


def missed(
    inj: Injection,
    states: Sequence[tuple[float, str, PolicyState]],
    final: PolicyState,
    scrapes: Sequence[tuple[float, str, str | None]] = (),
) -> str:
    """Why a fault aimed at a measurement window did not hit it ("" when it did), from what the
    operators wrote: the last status written before the fault had left that window, or the trial was
    scored by a reconcile that began before the fault (its ``finished_at``, on the operators' clock).
    On a busy machine an operator writes late, so an injector that read "Measuring" can act after the
    operator moved on; such a fault tests nothing and is tried again on another window.

    A counter reset takes effect at the first scrape served after it (``MetricsFaults``), and the
    operator takes a window's first scrape in a reconcile after the one that wrote "Measuring". When
    no scrape (``scrapes``: wall time, pod, fault mode) was served between that write and the reset,
    the window began from the reset counters: it counts nothing from before the reset, so there is
    nothing to notice and the fault missed."""
    if inj.kind not in WINDOW_FAULTS:
        return ""
    before = [(t, s) for t, _, s in states if t <= inj.t]
    last = before[-1][1] if before else None
    if last is None or last.step != Step.MEASURING or last.active != inj.trial:
        where = "none" if last is None else f"{last.phase}/{last.step}, active {last.active}"
        return f"the operator had left the window of trial {inj.trial} ({where})"
    trial = next((t for t in final.trials if t.id == inj.trial), None)
    scored = None if trial is None or trial.outcome != "ok" else trial.finished_at
    if scored is not None and scored <= inj.at:
        return f"trial {inj.trial} was scored at {scored:.2f}, before the fault ({inj.at:.2f})"
    if inj.kind == "metrics_reset":
        window = [t for t, s in before if _same_window(s, last)]
        opened = window[0] if window else inj.t
        if not any(opened < t <= inj.t and mode is None for t, _, mode in scrapes):
            return f"trial {inj.trial}'s window had no scrape before the reset: it began from reset counters"
    return ""


def _same_window(s: PolicyState, window: PolicyState) -> bool:
    return s.step == Step.MEASURING and s.active == window.active and s.measure_from == window.measure_from


Injector = Callable[[Run, FaultScenario], Awaitable[None]]


async def _inject_operator_kill(run: Run, sc: FaultScenario) -> None:
    for _ in range(sc.repeats):
        n = run.ops.starts
        await run.wait(partial(run.acted, f"operator-{n - 1}"), 120, f"operator-{n - 1} to act")
        await run.pause(run.rng.uniform(0.5, 8.0))  # a random point of the tuning loop
        if await run.converged():
            return
        run.ops.kill(f"operator-{n - 1}")
        run.count("operator_kill", client=f"operator-{n}")
        await asyncio.sleep(run.rng.uniform(0.2, 2.0))
        run.ops.start(f"operator-{n}")


async def _inject_metrics(run: Run, sc: FaultScenario) -> None:
    assert run.metrics is not None
    modes = ("unreachable", "gap", "nan", "reset")
    offset = run.rng.randrange(len(modes))
    i = hits = 0
    while hits < sc.repeats:  # until that many faults hit a window (TuningOver ends it sooner)
        delay = run.rng.uniform(0.0, 1.5)
        while True:  # a random point of a measurement window (the fault must hit one)
            await run.wait(run.measuring, 120, "a measurement window")
            await run.pause(delay)
            state = await run.measuring()
            if state is not None:
                break
        mode = modes[(offset + i) % len(modes)]
        began = time.time()
        run.metrics.set(mode)  # every pod of the scenario, new ones included
        injection = run.count(f"metrics_{mode}", trial=state.active)
        await run.pause(run.rng.uniform(4.0, 7.0))
        # An outage outlasts a scrape: on a loaded machine the operator's next scrape can come later
        # than the few seconds above, so the fault stays until the operator has seen it.
        await run.wait(partial(_noticed, run, state.active), 90, "the operator to notice the metrics fault")
        run.metrics.clear()
        injection.until = time.time()
        run.result.notes.append(f"metrics {mode} for {injection.until - began:.1f}s")
        await run.pause(run.rng.uniform(3.0, 6.0))
        await run.wait(partial(_not_active, run, state.active), 120, "the faulted window's trial to finish")
        i += 1
        hits += await run.hit(injection)


async def _noticed(run: Run, trial_id: int | None) -> bool:
    """The operator holds for missing metrics, or re-measures the trial, or the trial is over."""
    s = await run.state()
    if s is None:
        return False
    trial = next((t for t in s.trials if t.id == trial_id), None)
    return s.metrics_held or trial is None or trial.invalidations >= 1 or trial.outcome != "running"


async def _measured_pods(
    run: Run, measuring: Callable[[], Awaitable[PolicyState | None]], what: str, max_delay_s: float
) -> tuple[PolicyState, list[dict[str, Any]]]:
    """Wait for ``what`` in its measurement window, then, at a random point up to ``max_delay_s``
    into it, the pods that run the measured config; none when the operator has left the window by
    then (``missed`` judges the fault afterwards, from what the operator wrote)."""
    state = await run.wait(measuring, 150, f"{what} in its measurement window")
    assert state.active is not None
    digest = config_hash(state.trial(state.active).config)
    await run.pause(run.rng.uniform(0.0, max_delay_s))
    pods = await run.pods(digest)
    now = await run.state()
    same = now is not None and (now.active, now.step, now.measure_from) == (
        state.active, Step.MEASURING, state.measure_from
    )  # fmt: skip
    if not same:
        run.result.notes.append(f"missed the window of trial {state.active}: it ended before the fault")
        return state, []
    return state, pods


async def _inject_engine_crash(run: Run, sc: FaultScenario) -> None:
    i = 0
    while i < sc.repeats:  # until that many faults hit a window (TuningOver ends it sooner)
        state, pods = await _measured_pods(run, partial(run.measuring, "trial"), "a trial", max_delay_s=2.0)
        if not pods:
            await run.wait(partial(_not_active, run, state.active), 60, "the missed trial to finish")
            continue
        oom = (i + run.rng.randrange(2)) % 2 == 0
        injection = None
        if run.sb.kubelet.crash("default", pods[0]["metadata"]["name"], oom=oom):
            injection = run.count("engine_oom" if oom else "engine_crash", trial=state.active)
            run.result.notes.append(f"crashed trial {state.active} ({'oom' if oom else 'crash'})")
        await run.wait(partial(_not_active, run, state.active), 60, "the crashed trial to finish")
        if injection is not None and await run.hit(injection):
            i += 1


async def _not_active(run: Run, trial_id: int | None) -> bool:
    s = await run.state()
    return s is not None and s.active != trial_id


async def _inject_pod_delete(run: Run, sc: FaultScenario) -> None:
    deleted = 0
    while deleted < sc.repeats:  # until that many faults hit a window (TuningOver ends it sooner)
        state, pods = await _measured_pods(run, run.measuring, "a trial or baseline", max_delay_s=1.5)
        if not pods:
            await run.wait(partial(_not_active, run, state.active), 90, "the missed window to finish")
            continue
        name = pods[0]["metadata"]["name"]
        await run.sb.api.delete(f"/api/v1/namespaces/default/pods/{name}")
        injection = run.count("pod_delete", trial=state.active)
        run.result.notes.append(f"deleted pod {name} while measuring trial {state.active}")
        await run.wait(partial(_not_active, run, state.active), 90, "the trial to finish")
        deleted += await run.hit(injection)


async def _inject_peering(run: Run, sc: FaultScenario) -> None:
    # The chart starts both pods at once; here the standby wins the start (it acts alone), then the
    # active one (higher priority) joins and must take over.
    await run.wait(partial(run.acted, "replica-1"), 120, "the standby (alone) to act")
    await run.pause(run.rng.uniform(0.5, 4.0))
    run.ops.start("replica-0", priority=200)
    run.count("higher_priority_replica_joins", client="replica-0")
    active, since = "replica-0", 0.0
    for i in range(sc.repeats):
        await run.wait(partial(run.acted, active, since), 120, f"{active} to act")
        await run.pause(run.rng.uniform(0.5, 8.0))  # a random point of the tuning loop
        if await run.converged():
            return
        standby = f"replica-{i + 1}"
        run.ops.kill(active)
        since = time.time()
        run.count("active_replica_kill", client=standby)
        run.result.notes.append(f"killed {active}; {standby} should take over")
        active = standby
        run.ops.start(f"replica-{i + 2}", priority=100 - 10 * (i + 1))  # a new standby


async def _inject_nothing(run: Run, sc: FaultScenario) -> None:
    return None


INJECTORS: dict[str, Injector] = {
    "operator_kill": _inject_operator_kill,
    "api_faults": _inject_nothing,
    "metrics": _inject_metrics,
    "engine_crash": _inject_engine_crash,
    "pod_delete": _inject_pod_delete,
    "peering": _inject_peering,
}


def acting(e: AuditEntry) -> bool:
    """A write that acts on the cluster (not a peering keep-alive)."""
    return e.is_write and e.status < 300 and "kopf.dev" not in e.path


def registered_at(audit: Sequence[AuditEntry], client: str) -> float | None:
    """When a replica first wrote its peering keep-alive (from then on, peers can see it)."""
    return next((e.t for e in audit if e.client == client and "kopf.dev" in e.path and e.status < 300), None)


def peering_overlaps(
    audit: Sequence[AuditEntry], killed_at: Mapping[str, float], order: Sequence[str]
) -> list[AuditEntry]:
    """Acting writes of a lower-priority replica (later in ``order``) decided while a higher-priority
    one was registered and alive: the write's reconcile began (its last read of a ServingDeployment)
    more than PEERING_GRACE_S after the higher one's first keep-alive, and before its kill. kopf
    pauses a replica between handler calls, so a reconcile already in flight may still finish."""
    overlaps: list[AuditEntry] = []
    for i, high in enumerate(order):
        joined = registered_at(audit, high)
        if joined is None:
            continue
        begin, end = joined + PEERING_GRACE_S, killed_at.get(high, math.inf)
        for low in order[i + 1 :]:
            last_read = -math.inf
            for e in audit:
                if e.client != low:
                    continue
                if e.method == "GET" and "/servingdeployments/" in e.path:
                    last_read = e.t
                elif acting(e) and begin < last_read < end and e.t < end + PEERING_GRACE_S:
                    overlaps.append(e)
    return overlaps


async def run_scenario(sc: FaultScenario, workdir: Path) -> ScenarioResult:
    """Run one scenario in a fresh sandbox; never raises for a failed run (see ``error``)."""
    result = ScenarioResult(sc.kind, sc.seed)
    started, cpu_started = time.monotonic(), cpu_seconds()
    api = ApiFaults(seed=sc.seed)  # always on: the audit; faults only in api_faults
    if sc.kind == "api_faults":
        api = ApiFaults(seed=sc.seed, error_rate=0.05, conflict_rate=0.2, watch_drop_after_s=(2.0, 8.0))
    metrics = MetricsFaults() if sc.kind == "metrics" else None
    crds = [build_crd()]
    peering = sc.kind == "peering"
    if peering:
        crds += [d for d in yaml.safe_load_all(PEERING_CRDS.read_text()) if d]
    name = f"rel-{sc.kind.replace('_', '-')}"
    max_trials = sc.repeats + 2 if sc.kind in ("engine_crash", "pod_delete") else 3
    workdir.mkdir(parents=True, exist_ok=True)
    options = SandboxOptions(
        speedup=SPEEDUP, crds=crds, config=KUBELET, seed=sc.seed, api_faults=api, metrics_faults=metrics
    )
    async with sandbox(options) as sb:
        ops = Operators(sb.url, workdir, peering=peering, clock_file=sb.clock_file)
        run = Run(sb, ops, name, random.Random(sc.seed * 7919 + KINDS.index(sc.kind)), result, metrics, api)
        try:
            if peering:
                await sb.api.create(
                    "/apis/kopf.dev/v1/clusterkopfpeerings",
                    {
                        "apiVersion": "kopf.dev/v1",
                        "kind": "ClusterKopfPeering",
                        "metadata": {"name": PEERING},
                    },
                )
                ops.start("replica-1", priority=100)  # replica-0 joins later (_inject_peering)
            else:
                ops.start("operator-0")
            await sb.api.create(
                f"{SDEP}/namespaces/default/servingdeployments",
                resource_body(name, sc.max_trials or max_trials, sc.rate),
            )
            injector: asyncio.Task[None] = asyncio.ensure_future(INJECTORS[sc.kind](run, sc))
            try:
                final = await run.wait(run.converged, sc.timeout_s, f"{name} to converge")
                with contextlib.suppress(TuningOver):
                    await asyncio.wait_for(injector, timeout=max(5.0, sc.timeout_s / 4))
            finally:
                injector.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await injector
            result.converged = True
            await asyncio.sleep(2.0)  # let the last writes land
            final = await run.state() or final
            events = [
                e for e in await sb.api.list("/api/v1/namespaces/default/events")
                if (e.get("involvedObject") or {}).get("name") == name
            ]  # fmt: skip
            result.invariants = check_invariants(api.audit, name, final, events)
            _write_timeline(workdir / "timeline.txt", api.audit, name, result.injections)
            (workdir / "audit.txt").write_text(
                "".join(
                    f"{e.t:.2f} {e.client} {e.method} {e.path} {e.status} {e.injected}\n" for e in api.audit
                )
            )
            await _scenario_checks(run, sc, final, events, api)
        except Exception as err:  # reported, not raised: one failed scenario must not hide the others
            result.error = f"{type(err).__name__}: {err}"
            final_state = await run.state()
            if final_state is not None:
                result.notes.append(f"last phase {final_state.phase}/{final_state.step}")
        finally:
            crashed = ops.crashed()
            ops.stop()
            result.sandbox_clock = sb.pace()
        result.checks["no_operator_crash"] = not crashed
        if crashed:
            result.notes.append(f"operators that exited on their own: {crashed}")
        if api.injected:
            for kind, n in api.injected.items():
                result.injected[f"api_{kind}"] = n
        if metrics is not None:
            result.notes.append(f"faulty scrapes served: {metrics.served}")
    result.wall_s = time.monotonic() - started
    result.cpu_s = cpu_seconds() - cpu_started
    result.survived = {k: 0 for k in result.injected}
    for injection in (i for i in result.injections if not i.missed):
        if result.ok and (injection.handled or injection.kind not in _CHECKED_EACH):
            result.survived[injection.kind] += 1
    for kind, n in result.injected.items():  # API faults are counted by the emulator, not one by one
        if kind.startswith("api_") and result.ok:
            result.survived[kind] = n
    return result


async def _scenario_checks(
    run: Run, sc: FaultScenario, final: PolicyState, events: Sequence[Mapping[str, Any]], api: ApiFaults
) -> None:
    checks = run.result.checks
    states = written_states(api.audit, run.name)
    trials = final.trials
    hits = [i for i in run.result.injections if not i.missed]
    for injection in hits:
        injection.handled = handled(injection, states, final)
        if not injection.handled:
            run.result.notes.append(f"not handled: {injection}")
    checks["each_fault_handled"] = all(i.handled for i in hits)
    if sc.kind == "api_faults":
        checks["faults_hit_the_operator"] = sum(api.injected.values()) > 0
    elif sc.kind == "metrics":
        held = [s for _, _, s in states if s.metrics_held]
        checks["held_on_missing_data"] = bool(held) or _remeasured(trials)
        checks["hold_released"] = not final.metrics_held
        reasons = {e.get("reason") for e in events}
        checks["metrics_unavailable_event"] = "MetricsUnavailable" in reasons or _remeasured(trials)
    elif sc.kind == "engine_crash":
        failed = [t for t in trials if t.outcome == "infeasible" and t.role == "trial"]
        checks["crashed_trials_infeasible"] = len(failed) >= run.result.injected.get("engine_oom", 0) + (
            run.result.injected.get("engine_crash", 0)
        )
        checks["rolled_back"] = all(
            any(s.step == Step.ROLLING_BACK and s.target != t.config for _, _, s in states) for t in failed
        )
        checks["baseline_restored"] = all(_restored(states, t.id) for t in failed)
        deployment = await run.sb.api.get(f"/apis/apps/v1/namespaces/default/deployments/{run.name}")
        labels = (((deployment or {}).get("spec") or {}).get("template") or {}).get("metadata") or {}
        checks["serves_the_converged_config"] = (labels.get("labels") or {}).get(LABEL_CONFIG_HASH) == (
            config_hash(final.current)
        ) and all(final.current != t.config for t in failed)
    elif sc.kind == "pod_delete":
        checks["remeasured_not_scored"] = _remeasured(trials) and all(t.outcome != "running" for t in trials)
    elif sc.kind == "peering":
        order = sorted(run.ops.procs, key=lambda n: int(n.split("-")[1]))
        overlapping = peering_overlaps(api.audit, run.ops.killed_at, order)
        checks["one_active_at_a_time"] = not overlapping
        overlaps = len(overlapping)
        run.result.notes += [f"overlap: {e.client} {e.method} {e.path} at {e.t:.2f}" for e in overlapping[:5]]
        run.result.notes.append(f"killed at: {run.ops.killed_at}")
        writers = [n for n in order if any(e.client == n and acting(e) for e in api.audit)]
        killed = [n for n in order if n in run.ops.killed_at]
        checks["standby_took_over"] = all(order[order.index(k) + 1] in writers for k in killed)
        run.result.notes.append(f"writers in order: {writers}; overlaps {overlaps}")


_CHECKED_EACH = ("operator_kill", "active_replica_kill", "higher_priority_replica_joins", "engine_oom",
                 "engine_crash", "pod_delete", "metrics_unreachable", "metrics_gap", "metrics_nan",
                 "metrics_reset")  # fmt: skip


def _write_timeline(
    path: Path, audit: Sequence[AuditEntry], name: str, injections: Sequence[Injection]
) -> None:
    """Every status the operators wrote, and the faults, one line each (for reading a failed run)."""
    lines = [(i.t, f"FAULT {i.kind} trial={i.trial} until={i.until}") for i in injections]
    for t, client, s in written_states(audit, name):
        lines.append((t, f"{client} {s.phase}/{s.step} active={s.active} held={s.metrics_held} "
                         f"trials={[(x.id, x.outcome, x.invalidations) for x in s.trials]}"))  # fmt: skip
    path.write_text("".join(f"{t:.2f} {text}\n" for t, text in sorted(lines)))


def _restored(states: Sequence[tuple[float, str, PolicyState]], trial_id: int) -> bool:
    """After trial ``trial_id`` failed, the rollback it caused completed: the stable pods run its
    target (the best config known then) once the RollingBack step is over."""
    failed_at = next((i for i, (_, _, s) in enumerate(states) if _infeasible(s, trial_id)), None)
    if failed_at is None:
        return False
    target = None
    for _, _, s in states[failed_at:]:
        if s.step == Step.ROLLING_BACK and s.target is not None:
            target = s.target
        elif target is not None:
            return s.current == target
    return False


def _infeasible(state: PolicyState, trial_id: int) -> bool:
    return any(t.id == trial_id and t.outcome == "infeasible" for t in state.trials)


def _remeasured(trials: Sequence[Any]) -> bool:
    return any(t.invalidations >= 1 and t.outcome != "running" for t in trials)


async def run_scenario_in_process(sc: FaultScenario, workdir: Path) -> dict[str, Any]:
    """``run_scenario`` in a child Python process (sandboxes cannot share one event loop's kmock DNS
    patching when they overlap): its ``to_dict()``; a child that fails gives ok False and its error."""
    workdir.mkdir(parents=True, exist_ok=True)
    args = [sc.kind, str(sc.seed), str(sc.repeats), str(sc.max_trials), str(sc.timeout_s), str(workdir)]
    with open(workdir / "scenario.log", "wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, *args, stdout=asyncio.subprocess.PIPE, stderr=log
        )
        out, _ = await proc.communicate()
    try:
        result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (workdir / "scenario.log").read_text(errors="replace")[-2000:]
        return {
            "kind": sc.kind,
            "ok": False,
            "error": f"the scenario process failed (exit {proc.returncode}): {tail}",
        }
    return result


def _main(argv: Sequence[str]) -> int:
    kind, seed, repeats, max_trials, timeout_s, workdir = argv
    sc = FaultScenario(kind, int(seed), int(repeats), float(timeout_s), max_trials=int(max_trials))
    result = asyncio.run(run_scenario(sc, Path(workdir)))
    print(json.dumps(result.to_dict()))
    return 0


__all__ = [
    "KINDS",
    "FaultScenario",
    "Invariants",
    "Operators",
    "ScenarioResult",
    "check_invariants",
    "peering_overlaps",
    "resource_body",
    "run_scenario",
    "run_scenario_in_process",
    "written_states",
]


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))

"""``prefixtune bench scale``: the real operator against the sandbox with N ServingDeployments.

For each N: the sandbox (emulated API server, controllers, the kubelet with light stand-in pods,
``sandbox/standin.py``: a recorded vLLM /metrics exposition whose counters advance, no twins) runs in
this process (the stand-ins on a loop and thread of their own); the operator is its own ``prefixtune
run`` process (its RSS and CPU are its own) on the sandbox's clock. N resources are created, each
tuning on a short cadence (``WARMUP``, ``MEASURE``, no rollout interval, the operator's default tick).
Once every resource is handled, this process's collector stops rescanning the built cluster
(``process.quiet_collector``): a real API server has no collector pauses to count against the
operator. After ``--settle`` seconds the measured window of ``--duration`` seconds begins; over it:

* reconcile and decision latency: p50/p99 from the operator's own histograms
  (``prefixtune_decision_seconds``: one reconcile; ``prefixtune_policy_seconds``: the policy's
  decision within it), the difference of two scrapes of its /metrics, read as histogram_quantile does;
* API requests per second: the emulator's count of the operator's requests (User-Agent kopf and
  prefixtune-operator) over the window;
* CPU seconds per resource-hour and RSS: the operator process's (``/proc``), RSS at the end and its
  peak (VmHWM);
* trials finished in the window, and how far the resources got (phases at the end);
* ``handled_s``: from the first create until the operator had written every resource's status (the
  settle and the window begin after it).

* watch-event lag: p50/p99 of ``prefixtune_watch_lag_seconds``, from the operator's status write
  of a resource (the API server's response) to kopf handing the operator's event handler that
  version or a later one (``selfmetrics.WatchLag``): the API server's fan-out, the stream, kopf's
  queue and batching window, and the operator's busy event loop, all on one clock (the operator's);

``machine_busy`` comes from ``bench.twin``'s helpers: a CPU-bound probe process spun for a second in
the middle of the window gets less than ``BUSY_SHARE`` of a core when the machine (the sandbox and
the operator included) is saturated.

    prefixtune bench scale [--n 50,200,500] [--duration 120] [--settle 60] [--json] [--out F] [--png F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.twin import cpu_share, machine_busy
from prefixtune.api.durations import DurationError, parse_duration

TARGETS = {"decision_p99_s": 1.0, "reconcile_p99_s": 2.0, "rss_mb": 300.0}  # at N = 500
SDEP = "/apis/prefixtune.io/v1alpha1"
NAMESPACE = "scale"
OPERATOR_AGENTS = ("kopf", "prefixtune-operator")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TICK_S = 5.0  # the operator's default (prefixtune run --tick)
WARMUP = "10s"
MEASURE = "60s"
STAGGER_S = 70.0  # the creates are spread over about one trial (warm-up + window)
# The sandbox's controllers and kubelet resync the whole cluster (lists of every Deployment,
# ReplicaSet, pod, Service) at most this often: at N = 500 a 2 s floor kept them at a third of the
# sandbox's CPU on a 2-core machine, slowing every answer the operator waits for. A rollout still
# reaches its pod within two floors, far inside a trial's warm-up and window.
SYNC_FLOOR_S = 5.0


def resource(i: int, warmup: str = WARMUP, measure: str = MEASURE) -> dict[str, Any]:
    """One vLLM resource tuning on a short cadence (a stand-in's windows all score alike)."""
    return {
        "apiVersion": "prefixtune.io/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": f"sdep-{i:04d}", "namespace": NAMESPACE},
        "spec": {
            "engine": "vllm",
            "model": MODEL,
            "replicas": 1,
            "tuning": {
                "trial": {"warmup": warmup, "measure": measure, "minRequests": 5},
                "budget": {"maxTrials": 200},
                "rollout": {"minInterval": "0s"},
                "drift": {"threshold": 1.0},
                "metrics": {"source": "scrape"},
            },
        },
    }


def histograms(text: str) -> dict[str, dict[float, float]]:
    """Cumulative bucket counts per histogram of a text exposition: {name: {le: count}}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        for s in family.samples:
            if s.name.endswith("_bucket"):
                out.setdefault(family.name, {})[float(s.labels["le"])] = float(s.value)
    return out


def delta(after: Mapping[float, float], before: Mapping[float, float]) -> dict[float, float]:
    """The buckets of the observations made between two scrapes."""
    return {le: count - before.get(le, 0.0) for le, count in after.items()}


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """histogram_quantile over cumulative buckets (the operator's metric, read as Prometheus does)."""
    from prefixtune.metrics.histogram import buckets_from
    from prefixtune.metrics.histogram import quantile as hq

    return hq(q, buckets_from(buckets))


def proc_stats(pid: int) -> dict[str, float]:
    """CPU seconds (user + system), RSS and peak RSS (MB) of a process, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    mem: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                mem[key] = int(value.split()[0]) / 1024.0
    return {"cpu_s": cpu, "rss_mb": mem.get("VmRSS", 0.0), "peak_rss_mb": mem.get("VmHWM", 0.0)}


def busy_probe(seconds: float = 1.0) -> float:
    """The CPU share a CPU-bound process gets for ``seconds`` now (1.0: a core to itself)."""
    code = (
        "import time\nw=time.perf_counter();c=time.process_time()\n"
        f"while time.perf_counter()-w<{seconds}: pass\n"
        "print(time.process_time()-c, time.perf_counter()-w)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    cpu, wall = (float(x) for x in out.stdout.split())
    return cpu_share(cpu, wall)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _scrape(url: str) -> str:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as resp:
        return await resp.text()


def _agents(sb: Any) -> Mapping[str, int]:
    """The emulator's requests per client (``SandboxEmulator.requests_by_agent``)."""
    from prefixtune.sandbox.up import SandboxEmulator

    assert isinstance(sb.emulator, SandboxEmulator)
    return sb.emulator.requests_by_agent


def _operator_requests(counts: Mapping[str, int]) -> int:
    return sum(n for agent, n in counts.items() if agent in OPERATOR_AGENTS)


def summarize(
    n: int,
    wall_s: float,
    before: Mapping[str, Any],
    after: Mapping[str, Any],
) -> dict[str, Any]:
    """The figures of one run from the snapshots at the window's start and end."""
    rec = delta(
        after["hist"].get("prefixtune_decision_seconds", {}),
        before["hist"].get("prefixtune_decision_seconds", {}),
    )
    pol = delta(
        after["hist"].get("prefixtune_policy_seconds", {}),
        before["hist"].get("prefixtune_policy_seconds", {}),
    )
    lag = delta(
        after["hist"].get("prefixtune_watch_lag_seconds", {}),
        before["hist"].get("prefixtune_watch_lag_seconds", {}),
    )
    cpu = after["proc"]["cpu_s"] - before["proc"]["cpu_s"]
    requests = after["requests"] - before["requests"]

    def r(x: float | None, nd: int = 4) -> float | None:
        return None if x is None else round(x, nd)

    reconciles = rec.get(float("inf"), 0.0)
    return {
        "n": n,
        "window_s": round(wall_s, 1),
        "reconciles": int(reconciles),
        "reconciles_per_s": r(reconciles / wall_s if wall_s > 0 else None, 2),
        "reconcile_p50_s": r(quantile(0.5, rec)),
        "reconcile_p99_s": r(quantile(0.99, rec)),
        "decision_p50_s": r(quantile(0.5, pol)),
        "decision_p99_s": r(quantile(0.99, pol)),
        "api_requests": int(requests),
        "api_requests_per_s": r(requests / wall_s if wall_s > 0 else None, 1),
        "watch_lag_p50_s": r(quantile(0.5, lag)),
        "watch_lag_p99_s": r(quantile(0.99, lag)),
        "watch_lag_events": int(lag.get(float("inf"), 0.0)),
        "operator_cpu_s": r(cpu, 2),
        "cpu_s_per_resource_hour": r(cpu / (n * wall_s / 3600.0) if n and wall_s > 0 else None, 2),
        "operator_cpu_share": r(cpu_share(cpu, wall_s), 3),
        "rss_mb": r(after["proc"]["rss_mb"], 1),
        "peak_rss_mb": r(after["proc"]["peak_rss_mb"], 1),
        "trials_finished": after["trials"] - before["trials"],
    }


async def _resources(sb: Any) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = await sb.api.list(f"{SDEP}/namespaces/{NAMESPACE}/servingdeployments")
    return got


def finished_trials(objs: Sequence[Mapping[str, Any]]) -> int:
    """Trial records of the resources that have ended (as their statuses hold them)."""
    return sum(
        1
        for o in objs
        for t in ((o.get("status") or {}).get("trials") or [])
        if t.get("outcome") not in (None, "running")
    )


async def _snapshot(sb: Any, metrics_url: str, pid: int) -> dict[str, Any]:
    text = await _scrape(metrics_url)
    objs = await _resources(sb)
    trials = finished_trials(objs)
    phases: dict[str, int] = {}
    for o in objs:
        phase = str((o.get("status") or {}).get("phase") or "none")
        phases[phase] = phases.get(phase, 0) + 1
    return {
        "t": time.monotonic(),
        "hist": histograms(text),
        "proc": proc_stats(pid),
        "requests": _operator_requests(_agents(sb)),
        "trials": trials,
        "phases": phases,
    }


async def _handled(sb: Any) -> int:
    """How many of the resources the operator has written a status for."""
    objs = await _resources(sb)
    return sum(1 for o in objs if o.get("status"))


async def _until_handled(sb: Any, n: int, proc: subprocess.Popen[bytes], log: Path) -> float:
    """Wait until the operator has handled all ``n`` resources; when that happened (monotonic).
    The deadline follows its progress: 60 s without one more resource handled fails the run."""
    from prefixtune.sandbox.waiting import wait_until

    seen = [0]  # handled at the last check: the progress token, without listing them again

    async def done() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {proc.returncode}; see {log}")
        seen[0] = await _handled(sb)
        return seen[0] >= n

    async def progress() -> int:
        return seen[0]

    await wait_until(done, 60.0, f"the operator to handle all {n} resources", clock=sb.clock.now,
                     progress=progress)  # fmt: skip
    return time.monotonic()


async def _until_trials(
    sb: Any, n: int, per_resource: float, proc: subprocess.Popen[bytes], log: Path
) -> None:
    """Wait until the fleet has finished ``per_resource`` trials per resource on average (so that
    the measured window holds the optimizer's fits, not only the initial design); 300 s without one
    more finished trial fails the run."""
    from prefixtune.sandbox.waiting import wait_until

    seen = [0]

    async def done() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {proc.returncode}; see {log}")
        seen[0] = finished_trials(await _resources(sb))
        return seen[0] >= per_resource * n

    async def progress() -> int:
        return seen[0]

    await wait_until(
        done,
        300.0,
        f"{per_resource:g} trials per resource",
        every_s=5.0,
        clock=sb.clock.now,
        progress=progress,
    )


async def run_one(
    n: int,
    duration_s: float,
    settle_s: float,
    log_dir: Path,
    *,
    tick_s: float = TICK_S,
    warmup: str = WARMUP,
    measure: str = MEASURE,
    settle_trials: float = 0.0,
    stagger_s: float = STAGGER_S,
    sync_floor_s: float = SYNC_FLOOR_S,
) -> dict[str, Any]:
    from prefixtune.api.crd import build_crd
    from prefixtune.controller.operator import operator_argv, spawn_operator, stop_operator
    from prefixtune.controller.process import quiet_collector
    from prefixtune.sandbox.kubelet import KubeletConfig
    from prefixtune.sandbox.up import SandboxOptions, sandbox

    cfg = KubeletConfig(
        stand_in=True, startup_delay_s=2.0, probe_period_s=10.0, dcgm_port=None, resync_s=5.0,
        min_sync_s=sync_floor_s,
    )  # fmt: skip
    opts = SandboxOptions(speedup=1.0, crds=[build_crd()], config=cfg, load=False)
    async with sandbox(opts) as sb:
        await sb.api.create(
            "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
        port = _free_port()
        argv = operator_argv(
            str(sb.kubeconfig), tick_s=tick_s, ready_timeout_s=120.0, clock_file=sb.clock_file,
            metrics_port=port, namespaces=[NAMESPACE],
        )  # fmt: skip
        log = log_dir / f"operator-{n}.log"
        proc = spawn_operator(argv, str(log))
        try:
            t0 = time.monotonic()
            began = sb.clock.now()
            for i in range(n):
                # Spread over ``stagger_s``: a fleet's resources are not created in one instant, and
                # N resources in lock-step would all decide in the same second (a burst, not a load).
                await sb.clock.sleep_until(began + stagger_s * i / n)
                await sb.api.create(
                    f"{SDEP}/namespaces/{NAMESPACE}/servingdeployments", resource(i, warmup, measure)
                )
            created_s = time.monotonic() - t0
            # The settle begins once the operator has handled every resource (each has a status): a
            # fixed sleep from the creates would measure a window in which a slow-starting operator
            # (imports, the first list) may not have reconciled anything yet.
            handled_s = await _until_handled(sb, n, proc, log) - t0
            # The sandbox's cluster of N resources is built: its collector stops rescanning it,
            # as the operator's does after its imports (a full collection of this process's
            # million objects stalled the API server the operator waits on for 1-2 s).
            quiet_collector()
            if settle_trials > 0:
                await _until_trials(sb, n, settle_trials, proc, log)
            settled_s = time.monotonic() - t0
            await asyncio.sleep(settle_s)
            if proc.poll() is not None:
                raise RuntimeError(f"the operator exited with {proc.returncode}; see {log}")
            url = f"http://127.0.0.1:{port}/metrics"
            before = await _snapshot(sb, url, proc.pid)
            await asyncio.sleep(duration_s / 2)
            share = await asyncio.to_thread(busy_probe)
            await asyncio.sleep(max(0.0, duration_s / 2 - 1.0))
            after = await _snapshot(sb, url, proc.pid)
            row = summarize(n, after["t"] - before["t"], before, after)
            row.update(
                create_s=round(created_s, 1),
                handled_s=round(handled_s, 1),
                settled_s=round(settled_s, 1),
                trials_per_resource_at_start=round(before["trials"] / n, 2),
                phases_at_end=after["phases"],
                probe_cpu_share=round(share, 3),
                machine_busy=machine_busy(share),
                sandbox_pace=sb.pace(),
                api_requests_by_agent=dict(_agents(sb)),
            )
            return row
        finally:
            stop_operator(proc, 15.0)


def verdict(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The must-show at N = 500, as measured (never assumed)."""
    row = next((r for r in rows if r["n"] == 500), None)
    if row is None:
        return {"n": 500, "measured": False, "targets": TARGETS}
    if not row.get("trials_finished"):  # latency of a fleet that decided nothing says nothing
        return {"n": 500, "measured": False, "targets": TARGETS, "why": "no trial finished in the window"}
    met = {k: row.get(k) is not None and row[k] < limit for k, limit in TARGETS.items()}
    return {"n": 500, "measured": True, "targets": TARGETS, "met": met, "all_met": all(met.values())}


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="prefixtune bench scale", description=__doc__.splitlines()[0])
    p.add_argument("--n", default="50,200,500", help="resource counts, comma-separated")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of the measured window")
    p.add_argument("--settle", type=float, default=60.0, help="seconds after creation before measuring")
    p.add_argument(
        "--settle-trials",
        type=float,
        default=0.0,
        help="before --settle, wait until the fleet finished this many trials per resource (mean)",
    )
    p.add_argument(
        "--stagger", type=float, default=STAGGER_S, help="spread the creates over this many seconds"
    )
    p.add_argument("--tick", type=float, default=TICK_S, help="the operator's --tick, seconds")
    p.add_argument(
        "--sync-floor",
        type=float,
        default=SYNC_FLOOR_S,
        help="seconds between the sandbox's full resyncs (controllers, kubelet), at least",
    )
    p.add_argument("--warmup", default=WARMUP, help="each resource's spec.tuning.trial.warmup")
    p.add_argument("--measure", default=MEASURE, help="each resource's spec.tuning.trial.measure")
    p.add_argument("--log-dir", default=None, help="keep the operator's logs here (default: a temporary dir)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--png", default=None, help="plot latency against N here")
    ns = p.parse_args(list(argv))
    try:
        counts = [int(x) for x in ns.n.split(",") if x.strip()]
    except ValueError:
        print(f"bench scale: --n must be a comma list of integers, got {ns.n!r}", file=sys.stderr)
        return 2
    if not counts or min(counts) < 1 or not ns.duration >= 2 or ns.settle < 0 or not ns.sync_floor >= 0:
        print("bench scale: --n >= 1, --duration >= 2, --settle >= 0, --sync-floor >= 0", file=sys.stderr)
        return 2
    for flag, value in (("--warmup", ns.warmup), ("--measure", ns.measure)):
        try:
            parse_duration(value)
        except DurationError as e:
            print(f"bench scale: {flag}: {e}", file=sys.stderr)
            return 2
    load_before = list(os.getloadavg())
    rows = []
    with tempfile.TemporaryDirectory(prefix="prefixtune-scale-") as scratch:
        tmp = ns.log_dir or scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for n in counts:
            row = asyncio.run(
                run_one(
                    n,
                    ns.duration,
                    ns.settle,
                    Path(tmp),
                    tick_s=ns.tick,
                    warmup=ns.warmup,
                    measure=ns.measure,
                    settle_trials=ns.settle_trials,
                    stagger_s=ns.stagger,
                    sync_floor_s=ns.sync_floor,
                )
            )
            print(f"bench scale: {json.dumps(row)}", file=sys.stderr, flush=True)
            rows.append(row)
    report: dict[str, Any] = {
        "setup": {
            "counts": counts,
            "duration_s": ns.duration,
            "settle_s": ns.settle,
            "settle_trials": ns.settle_trials,
            "stagger_s": ns.stagger,
            "tick_s": ns.tick,
            "sandbox_sync_floor_s": ns.sync_floor,
            "resource": f"vllm, 1 replica, warm-up {ns.warmup}, measure {ns.measure}, minInterval 0s, scrape",
            "pods": "stand-ins: a recorded vLLM exposition (sandbox/standin.py), one aiohttp server",
            "operator": "prefixtune run, its own process, on the sandbox clock",
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": list(os.getloadavg()),
        },
        "machine_busy": any(r["machine_busy"] for r in rows),
        "watch_lag_note": (
            "from the operator's status write of a resource (the API server's response) to kopf handing "
            "the operator's event handler that version or a later one; the operator's clock at both ends"
        ),
        "target": verdict(rows),
        "runs": rows,
    }
    text = json.dumps(report, indent=2)
    if ns.out:
        Path(ns.out).write_text(text + "\n")
    if ns.png:
        from prefixtune.report.plots import scale_plot

        scale_plot(rows, Path(ns.png))
    if ns.json:
        print(text)
    else:
        for r in rows:
            print(
                f"N={r['n']:4d}  reconcile p50/p99 {r['reconcile_p50_s']}/{r['reconcile_p99_s']} s  "
                f"decision p50/p99 {r['decision_p50_s']}/{r['decision_p99_s']} s  "
                f"watch lag p50/p99 {r['watch_lag_p50_s']}/{r['watch_lag_p99_s']} s  "
                f"{r['api_requests_per_s']} req/s  {r['cpu_s_per_resource_hour']} cpu-s/res-h  "
                f"RSS {r['rss_mb']} MB{'  (machine busy)' if r['machine_busy'] else ''}"
            )
    return 0

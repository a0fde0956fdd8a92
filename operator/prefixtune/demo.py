"""``prefixtune demo`` (``make demo``): the sandbox, the operator and one example per engine, live.

Starts the sandbox in this process (emulated API server, Deployment controller, twin kubelet, load
generators), the operator as a separate ``prefixtune run`` process against the sandbox's kubeconfig
(a process, not a thread: on a 2-core machine the twins and the operator must not share one GIL),
creates the examples as they are written, admitted by the sandbox with demo timings (what
``prefixtune sandbox up --demo-timings`` does: ``sandbox/profile.py``), shows a refreshing progress
table until every resource has converged (or the deadline), then prints baseline vs best per resource
and the routers in front of the multi-replica examples (the real sglang-router / vllm-router processes
the twin kubelet runs for router pods, with the engine pods each registered by its own discovery).

Demo timings: the twins run ``--speedup`` x faster than the wall clock (default 10: an 8 s window
is 80 simulated seconds); warm-up 2 s and measurement 8 s of sandbox time per trial, at most 5 trials;
a light load per Service (``--rate`` requests per simulated second, default 1: 30-90 requests per
window) so that a 2-core machine keeps up (at 2 it no longer does: the demo takes twice as long).
The deadline follows progress: it is ``--deadline`` sandbox seconds after the last change of any
resource's tuning (a phase, a trial started or ended), at most 4x it in all.
Scores still carry +-10-20% counting noise, and at such light loads every config meets the SLOs,
so goodput alone cannot tell caching on from off (the SGLang chat example used to end on caching off
in about half the runs). The score's headroom (``tuning/objective.py``) ranks them below capacity,
and the significance gate keeps the deployed config on a gain the noise hides: 10 of 10 runs ended
all three examples with caching on (README, Benchmarks).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from prefixtune.api.models import API_GROUP, API_VERSION, PLURAL
from prefixtune.engines.knobs import api_text
from prefixtune.report.scores import baseline_record, best_record, derivation, number
from prefixtune.routing.policy import RoutingPolicy
from prefixtune.tuning.objective import GOALS
from prefixtune.tuning.phases import Phase

EXAMPLES = ("vllm-rag.yaml", "sglang-chatbot.yaml", "trtllm-agent.yaml")
SDEP_API = f"/apis/{API_GROUP}/{API_VERSION}"
PROGRESS_CAP = 4.0  # the deadline follows progress up to this many times --deadline in all


def examples_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "examples"


def progress_token(objs: Sequence[Mapping[str, Any]]) -> tuple[object, ...]:
    """How far the resources' tuning has got (``waiting.tuning_progress`` of each, by uid): it
    changes whenever one of them moves on."""
    from prefixtune.controller.status import policy_state_of
    from prefixtune.sandbox.waiting import tuning_progress

    return tuple(
        (str((o.get("metadata") or {}).get("uid")), tuning_progress(policy_state_of(o.get("status"))))
        for o in objs
    )


def next_deadline(deadline: float, now: float, start: float, limit_s: float, moved: bool) -> float:
    """The demo's deadline (sandbox seconds): ``limit_s`` after the last progress, at most
    ``PROGRESS_CAP`` x ``limit_s`` after the start."""
    if not moved:
        return deadline
    return min(start + PROGRESS_CAP * limit_s, max(deadline, now + limit_s))


def progress_rows(objs: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """One row per ServingDeployment: resource, engine, phase, trials spent of the budget (as the
    operator counts them: ``status.budget``), best score, hit rate."""
    rows = [["RESOURCE", "ENGINE", "PHASE", "TRIAL", "BEST SCORE", "HIT RATE", "CURRENT CONFIG"]]
    for obj in objs:
        meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        found = status.get("budget")
        spent: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        done = spent.get("used", "-")
        asked = ((spec.get("tuning") or {}).get("budget") or {}).get("maxTrials", "?")
        budget = spent.get("maxTrials") or asked
        best = (status.get("bestConfig") or {}).get("score")
        hit = (status.get("diagnosis") or {}).get("hitRate")
        rows.append(
            [
                f"{meta.get('namespace')}/{meta.get('name')}",
                str(spec.get("engine", "")),
                str(status.get("phase", Phase.PENDING)),
                f"{done}/{budget}",
                "-" if best is None else f"{best:.4g}",
                "-" if hit is None else f"{hit:.0%}",
                api_text(status.get("currentConfig")),
            ]
        )
    return rows


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def summary(objs: Sequence[Mapping[str, Any]]) -> str:
    """Baseline vs best config and score per resource, each score with how it was made."""
    lines = []
    for obj in objs:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        trials = status.get("trials") or []
        objective = str(((obj.get("spec") or {}).get("tuning") or {}).get("objective") or "goodput")
        baseline = baseline_record(status)
        best = status.get("bestConfig") or {}
        best_trial = best_record(status)
        name = f"{meta.get('namespace')}/{meta.get('name')} ({(obj.get('spec') or {}).get('engine')})"
        lines.append(f"{name}: phase {status.get('phase', 'Pending')}, {len(trials)} trials")
        b_score = None if baseline is None else number(baseline.get("score"))
        line = f"  baseline: {api_text(None if baseline is None else baseline.get('config'))}"
        line += f"  score {'-' if b_score is None else f'{b_score:.4g}'}"
        if baseline is not None and b_score is not None:
            line += f" (trial {baseline.get('index')}; {derivation(baseline, objective)})"
        lines.append(line)
        s = number(best.get("score"))
        gain = ""
        if s is not None and b_score and objective in GOALS:
            # better or worse as the objective counts it (ttft scores are negative seconds: a score
            # of the wrong sign compares to nothing)
            with contextlib.suppress(ValueError):
                gain = f" ({GOALS[objective].ratio(s, b_score) - 1:+.0%} vs baseline)"
        lines.append(
            f"  best:     {api_text(best.get('config'))}  score {'-' if s is None else f'{s:.4g}'}{gain}"
        )
        if best_trial is not None and s is not None:
            lines.append(f"            trial {best_trial.get('index')}; {derivation(best_trial, objective)}")
        infeasible = [t for t in trials if t.get("outcome") == "infeasible"]
        if infeasible:
            lines.append(
                f"  infeasible (rolled back): {', '.join(api_text(t.get('config')) for t in infeasible)}"
            )
    return "\n".join(lines)


def router_lines(pods: Sequence[Mapping[str, Any]], workers: Mapping[str, int | None]) -> list[str]:
    """One line per router pod (label ``app.kubernetes.io/component: router``): its Deployment's
    pod, the router and policy its command runs, whether it is ready, and how many engine pods it
    registered by its own service discovery (``workers``: pod name -> count, None when unknown)."""
    from prefixtune.sandbox.pods import is_ready
    from prefixtune.sandbox.router import COMPONENT_LABEL, ROUTER_COMPONENT, container_command, router_of

    lines = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get(COMPONENT_LABEL) != ROUTER_COMPONENT:
            continue
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        argv = container_command(containers[0])
        router = router_of(argv)
        default = RoutingPolicy.CACHE_AWARE.value  # both routers' default --policy
        policy = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--policy"), default)
        count = workers.get(str(meta.get("name")))
        lines.append(
            f"  {meta.get('namespace')}/{meta.get('name')}: {router.value if router else argv[:1]} "
            f"--policy {policy}, {'ready' if is_ready(pod) else 'not ready'}, "
            f"{'?' if count is None else count} engine pods registered"
        )
    return lines


async def show_routers(api: Any) -> None:
    """The routers in front of the multi-replica examples (the real wheels' processes), and the
    engine pods each discovered by itself."""
    import aiohttp

    from prefixtune.sandbox.router import COMPONENT_LABEL, ROUTER_COMPONENT, container_command, port_of

    pods = await api.list(f"/api/v1/pods?labelSelector={COMPONENT_LABEL}%3D{ROUTER_COMPONENT}")
    workers: dict[str, int | None] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        for pod in pods:
            name, ip = str(pod["metadata"]["name"]), (pod.get("status") or {}).get("podIP")
            port = port_of(container_command(((pod.get("spec") or {}).get("containers") or [{}])[0]))
            try:
                async with http.get(f"http://{ip}:{port}/workers") as resp:
                    workers[name] = len((await resp.json(content_type=None)).get("workers") or ())
            except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
                workers[name] = None
    lines = router_lines(pods, workers)
    print("\nrouters (sglang-router / vllm-router from their wheels, in front of the engine pods):")
    print("\n".join(lines) if lines else "  none (every example runs kube-proxy routing)")


async def _run(args: argparse.Namespace) -> int:
    from prefixtune.api.crd import build_crd
    from prefixtune.controller.operator import operator_argv, spawn_operator, stop_operator
    from prefixtune.sandbox.kubelet import KubeletConfig
    from prefixtune.sandbox.profile import DemoTimings
    from prefixtune.sandbox.up import SandboxOptions, sandbox

    resources = [yaml.safe_load((examples_dir() / name).read_text()) for name in args.examples]
    timings = DemoTimings(
        warmup=args.warmup,
        measure=args.measure,
        max_trials=args.max_trials,
        min_requests=args.min_requests,
        rate=args.rate,
    )
    config = KubeletConfig(startup_delay_s=20.0, probe_period_s=2.0, backoff_initial_s=10.0)
    print(
        f"prefixtune demo: sandbox at speedup {args.speedup:g}x, {len(resources)} ServingDeployments "
        "(demo timings: sandbox/profile.py)",
        flush=True,
    )
    options = SandboxOptions(speedup=args.speedup, crds=[build_crd()], config=config, demo_timings=timings)
    async with sandbox(options) as sb:
        # The operator runs on the sandbox's clock: on a machine too busy for the sandbox to keep up
        # its windows and its ready timeout follow the sandbox's progress (a readiness timeout of a
        # sandbox that lagged is not an infeasible config).
        argv = operator_argv(str(sb.kubeconfig), tick_s=1.0, ready_timeout_s=60.0, clock_file=sb.clock_file)
        operator = spawn_operator(argv, args.operator_log)
        print(f"operator: pid {operator.pid}, log {args.operator_log}; API server {sb.url}", flush=True)
        try:
            for res in resources:
                ns = res["metadata"].get("namespace", "default")
                with contextlib.suppress(Exception):
                    await sb.api.create(
                        "/api/v1/namespaces",
                        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                    )
                await sb.api.create(f"{SDEP_API}/namespaces/{ns}/{PLURAL}", res)
            started, began = sb.clock.now(), time.monotonic()  # the deadline is in sandbox seconds
            deadline = started + args.deadline
            objs: list[dict[str, Any]] = []
            token: tuple[object, ...] = ()
            tty = sys.stdout.isatty()
            shown = ""
            while sb.clock.now() < deadline:
                await asyncio.sleep(2.0)
                objs = [o for o in await sb.api.list(f"{SDEP_API}/{PLURAL}")]
                now_token = progress_token(objs)
                moved, token = now_token != token, now_token
                deadline = next_deadline(deadline, sb.clock.now(), started, args.deadline, moved)
                text = table(progress_rows(objs))
                if text != shown:
                    elapsed = f"[{time.monotonic() - began:5.0f}s]"
                    print(("\x1b[2J\x1b[H" if tty else "") + f"{elapsed}\n{text}\n", flush=True)
                    shown = text
                if operator.poll() is not None:
                    print(f"the operator exited with {operator.returncode}; see {args.operator_log}")
                    break
                if objs and all((o.get("status") or {}).get("phase") == Phase.CONVERGED for o in objs):
                    break
            print("\nsummary (scores: the objective measured in the sandbox, per simulated second):")
            print(summary(objs))
            await show_routers(sb.api)
            converged = sum(1 for o in objs if (o.get("status") or {}).get("phase") == Phase.CONVERGED)
            print(f"\n{converged}/{len(objs)} converged in {time.monotonic() - began:.0f}s")
            pace = sb.pace()
            if pace["lost_s"] > 0:
                print(
                    f"the machine was too busy for the sandbox to keep up: it ran at {pace['pace']:.0%} of "
                    f"its speed-up ({pace['lost_s']:.0f}s of stalls dropped from sandbox time, the worst "
                    f"{pace['worst_stall_s']:.1f}s); every deadline and window followed it"
                )
            await write_reports(sb.api, objs, Path(args.report_dir))
            return 0 if converged == len(objs) else 1
        finally:
            stop_operator(operator)


async def write_reports(api: Any, objs: Sequence[Mapping[str, Any]], out: Path) -> None:
    """One HTML report per resource (trials, plots, the operator's Events), and where it is."""
    from prefixtune.report.cluster import events_of
    from prefixtune.report.report import write_report

    events = await api.list("/api/v1/events")
    print("\nreports:")
    for obj in objs:
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace", "default")), str(meta.get("name"))
        path = await asyncio.to_thread(write_report, obj, events_of(events, ns, name), out / f"{ns}-{name}")
        print(f"  {ns}/{name}: {path}")


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="prefixtune demo", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    p.add_argument(
        "--speedup", type=float, default=10.0, help="simulated seconds per wall second (default 10)"
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=240.0,
        help="sandbox seconds without progress before the summary, at most 4x it in all (wall "
        "seconds while the machine keeps up; default 240)",
    )
    p.add_argument("--warmup", default="2s", help="trial warm-up, sandbox time (default 2s)")
    p.add_argument("--measure", default="8s", help="trial measurement window, sandbox time (default 8s)")
    p.add_argument("--max-trials", type=int, default=5, help="trials per resource (default 5)")
    p.add_argument("--min-requests", type=int, default=6, help="requests a window needs (default 6)")
    p.add_argument(
        "--rate", type=float, default=1.0, help="requests per simulated second per Service (default 1.0)"
    )
    p.add_argument(
        "--examples", nargs="+", default=list(EXAMPLES), help=f"example files (default {' '.join(EXAMPLES)})"
    )
    p.add_argument(
        "--report-dir", default="out/demo-reports", help="where the reports go (default out/demo-reports)"
    )
    default_log = str(Path(tempfile.gettempdir()) / "prefixtune-demo-operator.log")
    p.add_argument(
        "--operator-log", default=default_log, help=f"where the operator logs (default {default_log})"
    )
    args = p.parse_args(list(argv))
    for name in ("speedup", "deadline", "rate"):
        if not getattr(args, name) > 0:
            p.error(f"--{name} must be > 0")
    if not 1 <= args.max_trials <= 200:
        p.error("--max-trials must be in 1..200")
    missing = [n for n in args.examples if not (examples_dir() / n).is_file()]
    if missing:
        p.error(f"--examples: not found in {examples_dir()}: {', '.join(missing)}")
    signal.signal(signal.SIGTERM, _interrupt)  # clean up the operator and the twins on SIGTERM too
    try:
        return asyncio.run(_run(args))
    except KeyboardInterrupt:
        return 130


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt

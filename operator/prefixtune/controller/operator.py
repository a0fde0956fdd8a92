"""``prefixtune run``: the operator process (kopf with sensible settings), and an in-thread runner.

    prefixtune run [--namespace NS ... | --all-namespaces] [--metrics-port P] [--metrics-address A]
                   [--metrics-per-resource] [--peering NAME] [--standalone] [--tick S]
                   [--kubeconfig FILE] [--allowed-images R,...] [--prometheus-url URL]
                   [--prometheus-allowed-hosts H,...] [--prometheus-ca-file FILE]
                   [--clock-file FILE] [--time-scale K]         # the local sandbox only

What tenants may make the operator do is set here by the admin (``admin.py``): the engine images
allowed, the Prometheus it queries (a spec's own URL only on an allowed host), its CA bundle.

Peering: two replicas of the operator share a kopf peering object (kopf.dev ClusterKopfPeering for
--all-namespaces, KopfPeering per namespace otherwise; CRDs in crds/kopf-peering.yaml); the one
with the highest priority is active, the other pauses. --standalone disables peering (one replica).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import kopf

from prefixtune.clockfile import FileClock
from prefixtune.controller import process
from prefixtune.controller.admin import AdminPolicy, add_spec_policy_arguments, spec_policy_from_args
from prefixtune.controller.handlers import build_registry
from prefixtune.controller.kube import Connection, KubeClient
from prefixtune.controller.measure import Meter
from prefixtune.controller.reconcile import OperatorContext
from prefixtune.controller.redaction import install_log_redaction
from prefixtune.controller.selfmetrics import SelfMetrics, heartbeat

logger = logging.getLogger(__name__)

ANNOTATION_PREFIX = "prefixtune.io"
DEFAULT_TICK_S = 5.0
POSTING_WORKERS = 4  # kopf's concurrent Event-posting workers (settings.posting.worker_limit)


@dataclass
class OperatorOptions:
    namespaces: list[str] = field(default_factory=list)
    clusterwide: bool = False
    standalone: bool = False
    peering: str | None = None
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"  # the chart sets 0.0.0.0 (Prometheus scrapes the pod IP)
    metrics_per_resource: bool = False
    admin: AdminPolicy = field(default_factory=AdminPolicy)
    tick_s: float = DEFAULT_TICK_S
    kubeconfig: str | None = None
    time_scale: float = 1.0  # sandbox only: the twins' simulated seconds per wall second
    clock_file: str | None = None  # sandbox only: its clock (``sandbox.clock``) instead of the wall clock
    ready_timeout_s: float | None = None
    priority: int = 0
    peering_lifetime_s: int | None = None  # seconds a silent peer counts as alive (kopf: 60)


def operator_settings(opts: OperatorOptions) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.posting.enabled = True  # kopf's own Events for handler failures (warnings and up)
    settings.posting.level = logging.WARNING
    settings.networking.error_backoffs = [1, 2, 5, 10, 20, 30]
    settings.networking.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.watching.reconnect_backoff = 1.0
    settings.queueing.error_delays = [1, 2, 5, 10, 30, 60]
    settings.execution.max_workers = 4
    # Many objects: at most POSTING_WORKERS posting Events. The per-object watch-event workers stay
    # unbounded (kopf's default): a limit below the number of resources starves the rest, since a
    # resource whose tick runs keeps its worker (bench scale at N = 200 with a limit of 64).
    settings.posting.worker_limit = POSTING_WORKERS
    # Handler progress and the diff base live in our annotations, never in status (the operator
    # writes the whole status itself).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.peering.standalone = opts.standalone
    settings.peering.clusterwide = opts.clusterwide
    settings.peering.priority = opts.priority
    if opts.peering_lifetime_s is not None:
        settings.peering.lifetime = opts.peering_lifetime_s
    if opts.peering:
        settings.peering.name = opts.peering
        settings.peering.mandatory = True
    return settings


def _preload() -> None:
    """Import the optimizer's libraries now (seconds), not inside the first decision."""
    import sklearn.gaussian_process  # noqa: F401
    import skopt.space  # noqa: F401


def operator_clock(opts: OperatorOptions) -> tuple[Callable[[], float], Meter]:
    """The operator's clock and its Meter: the wall clock, or with ``--clock-file`` the sandbox's
    (``sandbox.clock``), which stands still while the sandbox cannot keep up, so that its windows,
    warm-ups and ready timeouts follow the sandbox's progress (a rollout the sandbox had no time to
    run is not infeasible)."""
    if opts.clock_file is None:
        return time.time, Meter(time_scale=opts.time_scale)
    file_clock = FileClock(opts.clock_file)
    meter = Meter(time_scale=opts.time_scale, clock=file_clock, to_wall=file_clock.to_wall, born=file_clock())
    return file_clock, meter


def build_registry_with_login(opts: OperatorOptions, connection: Connection) -> kopf.OperatorRegistry:
    registry = build_registry(opts.tick_s)

    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(
            server=connection.server,
            token=connection.token,
            ca_path=connection.ca_file,
            insecure=not connection.verify,
            certificate_path=connection.cert_file,
            private_key_path=connection.key_file,
            default_namespace=opts.namespaces[0] if opts.namespaces else None,
        )

    kopf.on.login(registry=registry)(login)
    return registry


async def run_operator(
    opts: OperatorOptions,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
    context: OperatorContext | None = None,
    own_process: bool = False,
) -> None:
    """Run the operator until stopped. ``own_process``: the process is the operator's alone
    (``prefixtune run``), so it is set for a long life (``process.py``: the collector, freed memory);
    an operator run in a thread of another program (tests) leaves that program's process as it is."""
    connection = Connection.load(opts.kubeconfig)
    install_log_redaction(connection.token)
    clock, meter = operator_clock(opts)
    ctx = context or OperatorContext(
        client=KubeClient(connection),
        meter=meter,
        clock=clock,
        metrics=SelfMetrics(per_resource=opts.metrics_per_resource),
        ready_timeout_s=opts.ready_timeout_s,
        admin=opts.admin,
    )
    if opts.metrics_port is not None:
        ctx.metrics.serve(opts.metrics_port, opts.metrics_address)
    beating = asyncio.create_task(heartbeat(ctx.metrics.liveness), name="liveness heartbeat")
    await asyncio.to_thread(_preload)
    trimming: asyncio.Task[None] | None = None
    if own_process:
        process.quiet_collector()
        trimming = asyncio.create_task(process.trim_memory(), name="malloc trim")
    try:
        await kopf.operator(
            registry=build_registry_with_login(opts, connection),
            settings=operator_settings(opts),
            clusterwide=opts.clusterwide,
            namespaces=opts.namespaces,
            standalone=opts.standalone,
            peering_name=opts.peering,
            priority=opts.priority,
            memo=kopf.Memo(ctx=ctx),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        beating.cancel()
        if trimming is not None:
            trimming.cancel()
        await ctx.client.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prefixtune run", description="Run the prefixtune operator (kopf).")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (cluster-wide)"
    )
    p.add_argument(
        "--metrics-port", type=int, default=None, help="serve the operator's own Prometheus metrics here"
    )
    p.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        help="address the metrics/health server binds (default 127.0.0.1; the chart sets 0.0.0.0)",
    )
    p.add_argument(
        "--metrics-per-resource",
        action="store_true",
        help="also serve per-resource series (namespace/name labels; they list every tenant's resources)",
    )
    add_spec_policy_arguments(p)
    p.add_argument("--prometheus-ca-file", default=None, help="CA bundle for an https Prometheus")
    p.add_argument(
        "--prometheus-operator-labels",
        action="store_true",
        help="count only series that carry the operator's pod labels (app_kubernetes_io_managed_by, "
        "prefixtune_io_resource: its ServiceMonitor copies them)",
    )
    peer = p.add_mutually_exclusive_group()
    peer.add_argument(
        "--peering", default=None, help="kopf peering name: replicas sharing it elect one active"
    )
    peer.add_argument("--standalone", action="store_true", help="no peering (a single replica)")
    p.add_argument("--priority", type=int, default=0, help="peering priority (the highest is active)")
    p.add_argument(
        "--peering-lifetime",
        type=int,
        default=None,
        help="seconds after its last keep-alive that a killed peer still counts as alive (default 60)",
    )
    p.add_argument("--tick", type=float, default=DEFAULT_TICK_S, help="seconds between tuning-loop ticks")
    p.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, else $KUBECONFIG)"
    )
    sandbox = p.add_argument_group("local sandbox only (prefixtune sandbox up)")
    sandbox.add_argument(
        "--clock-file",
        default=None,
        help="the sandbox's clock (sandbox up --clock-file): windows, warm-ups and timeouts run on "
        "sandbox time, which stands still while the machine is too busy for the sandbox to keep up",
    )
    sandbox.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="the twins' simulated seconds per second: rates are per simulated second (default: the "
        "clock file's speed-up, else 1)",
    )
    p.add_argument(
        "--ready-timeout", type=float, default=None, help="seconds a rollout may take to get ready"
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def options_from_args(argv: Sequence[str]) -> OperatorOptions:
    args = _parser().parse_args(list(argv))
    if args.metrics_port is not None and not 0 < args.metrics_port < 65536:
        raise SystemExit(f"prefixtune run: --metrics-port must be 1..65535, got {args.metrics_port}")
    if not args.tick > 0:
        raise SystemExit(f"prefixtune run: --tick must be > 0 seconds, got {args.tick}")
    if args.peering_lifetime is not None and not args.peering_lifetime >= 2:
        raise SystemExit(
            f"prefixtune run: --peering-lifetime must be >= 2 seconds, got {args.peering_lifetime}"
        )
    if args.time_scale is not None and not args.time_scale > 0:
        raise SystemExit(f"prefixtune run: --time-scale must be > 0, got {args.time_scale}")
    time_scale = 1.0 if args.time_scale is None else float(args.time_scale)
    if args.clock_file is not None:
        try:
            published = FileClock(args.clock_file).speedup
        except (OSError, ValueError) as err:
            raise SystemExit(f"prefixtune run: --clock-file: {err}") from None
        if not published > 0:
            raise SystemExit(
                f"prefixtune run: --clock-file: {args.clock_file}: no speed-up written (is the sandbox up?)"
            )
        if args.time_scale is None:
            time_scale = published
    try:
        policy = spec_policy_from_args(args)
    except ValueError as err:
        raise SystemExit(f"prefixtune run: {err}") from None
    admin = replace(
        policy,
        prometheus_ca_file=args.prometheus_ca_file,
        prometheus_operator_labels=bool(args.prometheus_operator_labels),
    )
    namespaces = list(args.namespace)
    clusterwide = bool(args.all_namespaces) or not namespaces
    return OperatorOptions(
        namespaces=namespaces,
        clusterwide=clusterwide,
        standalone=bool(args.standalone),
        peering=args.peering,
        metrics_port=args.metrics_port,
        metrics_address=str(args.metrics_address),
        metrics_per_resource=bool(args.metrics_per_resource),
        admin=admin,
        tick_s=float(args.tick),
        kubeconfig=args.kubeconfig or os.environ.get("KUBECONFIG") or None,
        time_scale=time_scale,
        clock_file=args.clock_file,
        ready_timeout_s=args.ready_timeout,
        priority=int(args.priority),
        peering_lifetime_s=args.peering_lifetime,
    )


def main(argv: Sequence[str]) -> int:
    process.limit_malloc_arenas()  # before the operator's threads start (``process.py``)
    opts = options_from_args(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <pid>`: dump the stacks
    verbose = "-v" in argv or "--verbose" in argv
    install_log_redaction()
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kopf").setLevel(logging.INFO if verbose else logging.WARNING)
    scope = "all namespaces" if opts.clusterwide else ", ".join(opts.namespaces)
    peering = "standalone" if opts.standalone else f"peering {opts.peering or 'auto'}"
    logger.info("prefixtune operator: watching %s (%s), tick %gs", scope, peering, opts.tick_s)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_operator(opts, own_process=True))
    return 0


def operator_argv(
    kubeconfig: str,
    *,
    tick_s: float = DEFAULT_TICK_S,
    time_scale: float | None = None,
    ready_timeout_s: float | None = None,
    clock_file: str | Path | None = None,
    metrics_port: int | None = None,
    namespaces: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of ``prefixtune run`` as a separate process (the demo, end-to-end tests);
    without ``time_scale`` the operator reads it from ``clock_file`` (else 1)."""
    import sys

    argv = [sys.executable, "-m", "prefixtune.cli", "run", "--standalone", "--kubeconfig", kubeconfig]
    argv += [f"--namespace={ns}" for ns in namespaces] or ["--all-namespaces"]
    argv += ["--tick", f"{tick_s:g}"]
    if time_scale is not None:
        argv += ["--time-scale", f"{time_scale:g}"]
    if ready_timeout_s is not None:
        argv += ["--ready-timeout", f"{ready_timeout_s:g}"]
    if clock_file is not None:
        argv += ["--clock-file", str(clock_file)]
    if metrics_port is not None:
        argv += ["--metrics-port", str(metrics_port)]
    return argv + list(extra)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGTERM when its parent dies (no orphaned operator after a crash)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn_operator(argv: Sequence[str], log_path: str) -> subprocess.Popen[bytes]:
    """Start ``prefixtune run`` (``operator_argv``) as a child process logging to ``log_path``."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)


def stop_operator(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> int | None:
    """Stop a ``spawn_operator`` child: SIGTERM (kopf ends its handlers and exits), SIGKILL when it
    has not exited within ``grace_s``. Its exit status; None if even SIGKILL left it unreaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    try:
        return proc.wait(5)
    except subprocess.TimeoutExpired:
        return None

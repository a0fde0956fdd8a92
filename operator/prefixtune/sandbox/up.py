"""The whole local sandbox in one async context manager: API server, controllers, kubelet, load, Prometheus.

::

    async with sandbox(SandboxOptions(speedup=20, prometheus="auto")) as sb:
        sb.url          # the emulated API server (http://127.0.0.1:PORT)
        sb.kubeconfig   # a kubeconfig file for it (kopf, the kubernetes client, kubectl)
        sb.emulator     # the RealisticEmulator (assert on stored objects in tests)
        sb.kubelet.pod_url("default", "my-pod-abcde")   # a running pod's engine URL
        sb.prometheus_url   # a real Prometheus scraping the pods, or None (direct scraping)
        sb.clock            # sandbox time (``clock.py``): stands still while the loop is stalled
        sb.clock_file       # that clock for the operator: ``prefixtune run --clock-file``

Everything runs in the current event loop as tasks; leaving the block stops them all (twins first,
then Prometheus, then the API server). ``prefixtune sandbox up`` (``cli.py``) runs the same in the
foreground.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import aiohttp

from prefixtune.clockfile import ClockFile
from prefixtune.sandbox.client import ApiClient, ApiStatusError, run_watches
from prefixtune.sandbox.clock import SandboxClock, run_pacer
from prefixtune.sandbox.controller_manager import ControllerManager
from prefixtune.sandbox.emulator import RealisticEmulator, serve_emulator, write_kubeconfig
from prefixtune.sandbox.faults import ApiFaults, MetricsFaults
from prefixtune.sandbox.kubelet import Kubelet, KubeletConfig
from prefixtune.sandbox.load import SDEP_PATH, LoadManager
from prefixtune.sandbox.profile import DemoTimings
from prefixtune.sandbox.prometheus import PrometheusRunner, prometheus_binary
from prefixtune.sandbox.tasks import Wakeup, cancel_all

logger = logging.getLogger(__name__)

PrometheusMode = Literal["auto", "on", "off"]
PROMETHEUS_MODES: tuple[str, ...] = ("auto", "on", "off")


@dataclass
class Sandbox:
    """A running sandbox (see the module docstring)."""

    url: str
    kubeconfig: Path
    emulator: RealisticEmulator
    api: ApiClient
    config: KubeletConfig
    controllers: ControllerManager
    kubelet: Kubelet
    load: LoadManager | None
    prometheus: PrometheusRunner | None
    prometheus_note: str
    clock: SandboxClock
    clock_file: Path
    demo_timings: DemoTimings | None = None  # what ServingDeployments are admitted with (profile.py)

    def pace(self) -> dict[str, float]:
        """How well the sandbox kept up: sandbox seconds per wall second since the start, the wall
        seconds dropped from sandbox time while its loop was stalled, and the worst stall."""
        c = self.clock
        return {
            "pace": round(c.pace(), 3),
            "lost_s": round(c.lost_s, 2),
            "worst_stall_s": round(c.worst_stall_s, 2),
        }

    @property
    def prometheus_url(self) -> str | None:
        return self.prometheus.url if self.prometheus is not None else None

    def pod_url(self, namespace: str, name: str) -> str:
        return self.kubelet.pod_url(namespace, name)


class _InFlightRequests(list[Any]):
    """kmock's request log, holding only the requests still being handled.

    kmock 0.8 records every request and, for each new one, filters the whole log once per reaction
    (``request in payload._source``): every request costs O(requests so far), and a sandbox that
    runs controllers, a kubelet and an operator slows down within a minute (60 ms a request after a
    few hundred). Matching needs only the request at hand, so the log keeps the requests in flight.
    ``len()`` still counts every request because kmock numbers requests by it. Request-counting
    assertions need the full log: tests that count requests use their own emulator.

    Even the requests in flight were too many to filter for each new one: every open watch is one,
    and at N = 500 (``bench scale``) a few dozen requests at once made the reactions' filters a
    quarter of the sandbox's CPU. Inside a request's own task (``_SERVING``, a context variable
    that ``SandboxEmulator._handle`` sets) the log reads as that request alone: all that kmock asks
    of it there is whether the request at hand passes a reaction's filters.
    """

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.in_flight: set[int] = set()

    def append(self, item: Any) -> None:
        super().append(item)
        self.total += 1
        self.in_flight.add(int(item.id))

    def done(self, request_id: int) -> None:
        self.in_flight.discard(request_id)
        self[:] = [r for r in list.__iter__(self) if int(r.id) in self.in_flight]

    def __len__(self) -> int:
        return self.total

    def __setitem__(self, index: Any, value: Any) -> None:
        """The emulator replaces a request by its remapped self (``RealisticEmulator._handle``):
        that one is then the request served."""
        if isinstance(index, int) and _SERVING.get() is list.__getitem__(self, index):
            _SERVING.set(value)
        super().__setitem__(index, value)

    def __iter__(self) -> Iterator[Any]:
        serving = _SERVING.get()
        return iter((serving,)) if serving is not None else list.__iter__(self)


# The request that the current task serves (``_InFlightRequests``); None outside a request's task.
_SERVING: contextvars.ContextVar[Any] = contextvars.ContextVar("prefixtune_sandbox_serving", default=None)


class SandboxEmulator(RealisticEmulator):
    """The emulator with a request log that does not grow (see ``_InFlightRequests``)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._requests = _InFlightRequests()
        self._handled = 0
        # Requests served per client (the User-Agent's product name: kopf, prefixtune-operator, the
        # sandbox's own aiohttp clients as "Python"): the scale benchmark's API requests per second.
        self.requests_by_agent: collections.Counter[str] = collections.Counter()

    async def _handle(self, request: Any) -> Any:
        headers = getattr(request, "headers", None) or {}
        agent = next((str(v) for k, v in headers.items() if str(k).lower() == "user-agent"), "")
        self.requests_by_agent[agent.split("/", 1)[0] or "unknown"] += 1
        token = _SERVING.set(request)
        try:
            return await super()._handle(request)
        finally:
            _SERVING.reset(token)
            log = self._requests
            if isinstance(log, _InFlightRequests):
                log.done(int(request.id))
            self._handled += 1
            if self._handled % 1000 == 0:  # each reaction keeps the requests it served, for assertions
                for payload in self._payloads:
                    payload._requests.clear()


def resolve_prometheus(mode: str) -> tuple[bool, str]:
    """Whether to run Prometheus for ``mode`` (auto | on | off), and the sentence that says so."""
    if mode not in PROMETHEUS_MODES:
        raise ValueError(f"prometheus: must be one of {', '.join(PROMETHEUS_MODES)}, got {mode!r}")
    binary = prometheus_binary()
    if mode == "off":
        return False, "Prometheus off: metrics come from direct scrapes of the pods (metrics.source: scrape)."
    if binary is None:
        if mode == "on":
            raise FileNotFoundError(
                "--prometheus on: no 'prometheus' binary on PATH (Debian: apt-get install prometheus); "
                "use --prometheus auto or off for direct scraping"
            )
        return False, (
            "Prometheus not installed: metrics come from direct scrapes of the pods (metrics.source: scrape)."
        )
    return True, f"Prometheus ({binary}) scrapes the pods via file-based service discovery."


async def _prometheus_sync(api: ApiClient, runner: PrometheusRunner, wakeup: Wakeup, resync_s: float) -> None:
    while True:
        with contextlib.suppress(ApiStatusError, aiohttp.ClientError):
            runner.sync(await api.list("/api/v1/pods"))
        await wakeup.wait(resync_s)


@dataclass(frozen=True)
class SandboxOptions:
    """What a sandbox runs: ``sandbox(SandboxOptions(speedup=20, crds=[crd]))``.

    ``config`` sets the kubelet's timings (its ``speedup`` and ``seed`` are replaced by these);
    ``crds`` are CustomResourceDefinitions to install before anything starts (e.g. the
    ServingDeployment CRD); ``demo_timings`` admits every ServingDeployment with them
    (``profile.py``); ``clock_file`` is where the clock is published (default: a temporary file).
    ``api_faults`` and ``metrics_faults`` inject faults (``faults.py``; off when None);
    ``prometheus_duplicate_jobs`` has Prometheus scrape every engine pod that many more times.
    ``knob_overrides`` makes every engine run these knob values whatever its command says (an engine
    that ignores a knob, as TensorRT-LLM's shallow kv_cache_config merge ignores the CLI fraction).
    """

    # Serving: the API server's address, and the kubeconfig written for it.
    port: int = 0  # 0 picks a free port
    host: str = "127.0.0.1"
    kubeconfig: str | Path | None = None  # None: a file in the sandbox's temporary directory
    clock_file: str | Path | None = None  # None: a file in the sandbox's temporary directory
    namespace: str = "default"  # the kubeconfig's namespace
    # What runs, and how fast.
    speedup: float = 1.0  # simulated seconds per sandbox second
    config: KubeletConfig | None = None
    seed: int = 0
    crds: Sequence[Mapping[str, Any]] = ()
    demo_timings: DemoTimings | None = None  # what ServingDeployments are admitted with (profile.py)
    load: bool = True  # the load manager (traffic for ServingDeployments that ask for it)
    prometheus: str = "off"  # auto | on | off (``resolve_prometheus``)
    scrape_interval_s: float = 1.0
    # Fault injection (off by default).
    api_faults: ApiFaults | None = None
    metrics_faults: MetricsFaults | None = None
    prometheus_duplicate_jobs: int = 0
    knob_overrides: Mapping[str, object] | None = None

    def __post_init__(self) -> None:
        if not self.speedup > 0:
            raise ValueError(f"speedup: must be > 0, got {self.speedup}")


@contextlib.asynccontextmanager
async def sandbox(options: SandboxOptions | None = None) -> AsyncIterator[Sandbox]:
    """Run the sandbox in this event loop for the duration of the block (``SandboxOptions``: what runs)."""
    opts = options or SandboxOptions()
    run_prometheus, note = resolve_prometheus(opts.prometheus)
    cfg = replace(opts.config or KubeletConfig(), speedup=float(opts.speedup), seed=opts.seed)
    with contextlib.ExitStack() as files:
        tmp = files.enter_context(tempfile.TemporaryDirectory(prefix="prefixtune-sandbox-"))
        kubeconfig_path = Path(tmp) / "kubeconfig" if opts.kubeconfig is None else Path(opts.kubeconfig)
        clock = SandboxClock()
        clock_path = Path(tmp) / "clock" if opts.clock_file is None else Path(opts.clock_file)
        clock_file = ClockFile(clock_path, speedup=cfg.speedup)
        files.callback(clock_file.close)
        clock_file.write(clock.tick())
        emulator = SandboxEmulator(seed=opts.seed, faults=opts.api_faults)
        if opts.demo_timings is not None:
            emulator.admission = opts.demo_timings.admit
        async with serve_emulator(port=opts.port, host=opts.host, emulator=emulator) as (emulator, url):
            write_kubeconfig(kubeconfig_path, url, opts.namespace)
            session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
            api = ApiClient(url, session)
            runner: PrometheusRunner | None = None
            tasks: list[asyncio.Task[Any]] = []
            try:
                for crd in opts.crds:
                    await api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
                controllers = ControllerManager(api, cfg, clock)
                kubelet = Kubelet(api, cfg, clock)
                emulator.pod_logs = kubelet.logs  # pods/log reads the node's logs, as via its kubelet
                files.callback(kubelet.close)  # its address octet is claimed until the sandbox ends
                kubelet.metrics_faults = opts.metrics_faults
                kubelet.knob_overrides = dict(opts.knob_overrides or {})
                kubelet.kubeconfig = kubeconfig_path  # routers discover their engines through it
                loads = None
                if opts.load:
                    loads = LoadManager(api, speedup=cfg.speedup, seed=opts.seed, clock=clock)
                wakeups = [controllers.wakeup, kubelet.wakeup]
                if run_prometheus:
                    runner = PrometheusRunner(
                        host=opts.host,
                        scrape_interval_s=opts.scrape_interval_s,
                        dcgm_port=cfg.dcgm_port,
                        duplicate_jobs=opts.prometheus_duplicate_jobs,
                    )
                    await runner.start()
                    prom_wakeup = Wakeup()
                    wakeups.append(prom_wakeup)
                    tasks.append(
                        asyncio.create_task(_prometheus_sync(api, runner, prom_wakeup, cfg.resync_s))
                    )
                loop = asyncio.get_running_loop()
                tasks.insert(0, loop.create_task(run_pacer(clock, clock_file), name="sandbox clock"))
                tasks.append(loop.create_task(run_watches(api, wakeups), name="sandbox watches"))
                tasks.append(loop.create_task(controllers.run(), name="sandbox controllers"))
                tasks.append(loop.create_task(kubelet.run(), name="sandbox kubelet"))
                if loads is not None:
                    load_paths = ("/api/v1/services", "/api/v1/endpoints", f"{SDEP_PATH}/servingdeployments")
                    tasks.append(
                        loop.create_task(run_watches(api, [loads.wakeup], load_paths), name="load watches")
                    )
                    tasks.append(loop.create_task(loads.run(), name="sandbox load"))
                yield Sandbox(
                    url=url,
                    kubeconfig=kubeconfig_path,
                    emulator=emulator,
                    api=api,
                    config=cfg,
                    controllers=controllers,
                    kubelet=kubelet,
                    load=loads,
                    prometheus=runner,
                    prometheus_note=note,
                    clock=clock,
                    clock_file=clock_file.path,
                    demo_timings=opts.demo_timings,
                )
            finally:
                # One at a time, newest first: the load (no requests into dying twins), then the
                # kubelet's twins, the controllers, the watches.
                for task in reversed(tasks):
                    await cancel_all([task])
                if runner is not None:
                    await runner.stop()
                await session.close()


def usage_text(sb: Sandbox) -> str:
    kc = sb.kubeconfig
    lines = [
        f"prefixtune sandbox: API server at {sb.url}",
        f"  kubeconfig: {kc}",
        f"  speedup: {sb.config.speedup:g}x (simulated seconds per sandbox second; sandbox time stands",
        "    still while the machine is too busy to keep up: see clock.py)",
        f"  clock: {sb.clock_file} (the operator's --clock-file: it carries the speed-up too)",
        f"  {sb.prometheus_note}",
    ]
    if sb.demo_timings is not None:
        t = sb.demo_timings
        lines += [
            f"  demo timings: every ServingDeployment is admitted with warm-up {t.warmup}, window "
            f"{t.measure}, {t.max_trials} trials,",
            f"    no rollout interval, metrics scraped from the pods, at most 2 replicas, load {t.rate:g} "
            "request/simulated s",
            "    (annotation prefixtune.io/sandbox-profile: demo-timings; see sandbox/profile.py)",
        ]
    else:
        lines.append("  ServingDeployments run their own timings (--demo-timings: minutes, not hours)")
    if sb.prometheus_url:
        lines.append(f"  Prometheus: {sb.prometheus_url}")
    lines += [
        "",
        "Use it:",
        f"  export KUBECONFIG={kc}",
        f"  kubectl --kubeconfig {kc} apply -f crds/",
        f"  kubectl --kubeconfig {kc} apply -f examples/",
        f"  kubectl --kubeconfig {kc} get servingdeployments,deployments,pods -A",
        f"  kubectl --kubeconfig {kc} logs deployment/<name>   # the twin's log",
        f"  KUBECONFIG={kc} <the operator>   # kopf's default login reads the kubeconfig",
        f"  prefixtune run -A --standalone --kubeconfig {kc} --clock-file {sb.clock_file}",
        "",
        "kubectl before 1.27 needs apply --validate=false (no OpenAPI v2); diff, server-side apply,",
        "get -w's columns and scale of built-in kinds are not emulated (kubectl scale sdep works).",
        "Ctrl-C stops everything.",
    ]
    return "\n".join(lines)


__all__ = [
    "PROMETHEUS_MODES",
    "Sandbox",
    "SandboxEmulator",
    "SandboxOptions",
    "resolve_prometheus",
    "sandbox",
    "usage_text",
]

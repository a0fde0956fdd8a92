"""The sandbox's twin kubelet: one node, ``sandbox-node``, whose pods run as live twins.

It schedules unassigned pods onto itself and runs each pod's engine container as a live twin
(``prefixtune.twin.serve.TwinServer``) booted from the container's real command line
(``pods.launch_plan`` + the engine adapter's ``parse``). Each pod gets its own loopback address
(127.S.x.y; Linux routes all of 127.0.0.0/8 to lo) and the twin binds that address on the port its
args name, so every pod exposes the real engine port and paths. It talks to the API server over
HTTP (``client.py``); the controllers that create its pods are in ``controller_manager.py``.

Container lifecycle, in sandbox time (seconds divided by ``speedup``):

* Scheduling: with ``gpus`` set the node has that many ``nvidia.com/gpu`` allocatable
  (``Kubelet.set_gpus`` changes it mid-run, as a node joining or a GPU freed elsewhere would; the
  default None binds every pod, as before). Pods are bound oldest first while the
  GPUs they request fit beside those of the pods already bound (a pod being deleted frees its GPUs
  at once, since its twin stops at once); one that does not fit stays Pending and unbound with the
  scheduler's PodScheduled False / Unschedulable "Insufficient nvidia.com/gpu" condition, and is
  bound on a later sync once GPUs are free.
* ``ContainerCreating`` -> running, not ready, for the start-up delay (weights loading): a fixed
  ``startup_delay_s`` plus, with ``load_bytes_per_s`` set, the model's weights per GPU (the twin
  catalog's size) at that rate, so a 70B model loads longer than an 8B one; then the
  twin boots and binds; the pod turns Ready when its readiness probe passes (the container's
  ``readinessProbe.httpGet`` if any, else the engine's health path), probed every probe period, and
  NotReady after ``failureThreshold`` (kube's default 3) failures in a row; a probe fails when no
  answer came within its ``timeoutSeconds`` (kube's default 1; simulated seconds, as the period, but
  at least ``PROBE_TIMEOUT_FLOOR_S`` sandbox seconds: a busy machine's scheduling delay is not the
  engine's), and one that timed out while sandbox time stood still (``clock.py``: the machine was
  too busy) counts for nothing.
* Delays and back-offs run on the sandbox clock, as the twins' simulated time does.
* The container fails as the engine would: a wrong flag (the adapter's ArgsError, exit code 2, at
  once), an unknown model or GPU (exit 1), a start-up OOM (exit 1, after the start-up delay), a bad
  port (exit 1). A running twin that hits a runtime OOM answers 503 on /health (the pod goes NotReady)
  and then exits 1. The error is in ``lastState.terminated.message`` (``state.terminated.message``
  when the pod fails for good).
* restartPolicy Always/OnFailure: the first restart is immediate, then CrashLoopBackOff with back-off
  10 s, 20 s, ... 300 s (kube's), reset after 10 minutes of running; ``restartCount`` counts restarts;
  the twin restarts from the same args. restartPolicy Never: the pod's phase becomes Failed.
* Deleting a pod stops its twin at once (no graceful termination period) and frees its address.
* Logs (``podlogs.py``, served as ``pods/log``): each run's command line, the server listening, and
  the exit message; the current and the previous run, forgotten with the pod.

Router pods (``router.py``): a pod labelled ``app.kubernetes.io/component: router`` runs the real
``sglang-router`` / ``vllm-router`` as a child process from the container's own command (bound to the
pod's address; its service discovery reads the sandbox's API server through ``Kubelet.kubeconfig``),
probed like an engine (its readiness probe, else ``/health``), without the weights' start-up delay,
and stopped with the pod.

Fault injection (``faults.py``): ``Kubelet.crash`` kills a running engine (CUDA OOM or a crash), and
``Kubelet.metrics_faults`` makes the pods' metrics endpoints unreachable, empty, NaN or reset.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import random
import shlex
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from prefixtune.engines import ArgsError, get_adapter
from prefixtune.sandbox import pods as podlib
from prefixtune.sandbox.client import ApiClient, ApiStatusError
from prefixtune.sandbox.clock import SandboxClock
from prefixtune.sandbox.faults import MetricsFaults, install_metrics_faults
from prefixtune.sandbox.podlogs import ContainerLogs
from prefixtune.sandbox.router import RouterLaunchError, RouterProcess, container_command, is_router_pod
from prefixtune.sandbox.standin import StandInPod, StandInServer
from prefixtune.sandbox.tasks import Wakeup, log_failure, stop_task

logger = logging.getLogger(__name__)

PROBE_FAILURE_THRESHOLD = 3  # kube's default failureThreshold of a probe

PROBE_TIMEOUT_S = 2.0  # sandbox seconds a probe may take when the caller names no timeout
PROBE_TIMEOUT_FLOOR_S = 1.0  # the shortest probe timeout, sandbox seconds (timeoutSeconds / speed-up)
PROBE_DEFAULT_TIMEOUT_S = 1.0  # kube's default timeoutSeconds of a probe
UNLIMITED_GPUS_SHOWN = 8  # the allocatable a node without GPU accounting advertises


@dataclass(frozen=True)
class KubeletConfig:
    """Timings are in sandbox seconds (divided by ``speedup`` for wall time)."""

    speedup: float = 1.0
    startup_delay_s: float = 30.0  # weights loading + warm-up before the engine binds its port
    backoff_initial_s: float = 10.0
    backoff_max_s: float = 300.0
    probe_period_s: float = 5.0  # readiness probe period when the container sets none
    exit_delay_s: float = 1.0  # between a runtime OOM (503 on /health) and the process exit
    dcgm_port: int | None = 9400  # a DCGM-exporter-like GPU utilization endpoint per pod (None: off)
    resync_s: float = 1.0  # wall seconds between full resyncs without events
    # Wall seconds at least between two full syncs of the kubelet and the controllers (the events
    # meanwhile coalesce into the next): 0 syncs on every event. Each sync lists every pod (or every
    # Deployment and ReplicaSet), so with hundreds of pods syncing per event is quadratic (bench scale).
    min_sync_s: float = 0.0
    default_gpu: str = podlib.DEFAULT_GPU
    node_name: str = podlib.NODE_NAME
    seed: int = 0
    ip_octet: int = 0  # the second octet of pod addresses (127.S.x.y); 0 picks one at random
    # The node's nvidia.com/gpu allocatable; None: no GPU accounting (any number of pods is bound, the
    # node advertises UNLIMITED_GPUS_SHOWN as before), so suites that run many resources need no sizing.
    gpus: int | None = None
    load_bytes_per_s: float = 0.0  # weight load rate per GPU in sandbox time (0: no size-based load)
    # Light stand-ins instead of live twins (``standin.py``: a recorded /metrics exposition whose
    # counters advance, health and ready; no OpenAI API, no DCGM): the scale benchmark's pods.
    stand_in: bool = False

    def __post_init__(self) -> None:
        if not self.speedup > 0:
            raise ValueError(f"speedup: must be > 0, got {self.speedup}")
        for name in (
            "startup_delay_s",
            "backoff_initial_s",
            "backoff_max_s",
            "probe_period_s",
            "exit_delay_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.gpus is not None and self.gpus < 0:
            raise ValueError(f"gpus: must be >= 0, got {self.gpus}")
        if self.load_bytes_per_s < 0:
            raise ValueError(f"load_bytes_per_s: must be >= 0, got {self.load_bytes_per_s}")
        if not 0 <= self.ip_octet <= 254:
            raise ValueError(f"ip_octet: must be 1..254 (0: random), got {self.ip_octet}")

    def wall(self, sandbox_s: float) -> float:
        return sandbox_s / self.speedup

    def load_delay_s(self, model: str, gpus: int) -> float:
        """Sandbox seconds from the container's start to the engine binding its port: the fixed
        delay plus the weights per GPU at ``load_bytes_per_s`` (a model the catalog does not know
        loads in the fixed delay; it fails at boot anyway)."""
        if self.load_bytes_per_s <= 0:
            return self.startup_delay_s
        from prefixtune.twin.catalog import get_model

        try:
            weights = float(get_model(model).weight_bytes)
        except (KeyError, ValueError):
            return self.startup_delay_s
        return self.startup_delay_s + weights / max(gpus, 1) / self.load_bytes_per_s


class AddressPool:
    """Loopback addresses for pods: 127.S.x.y, y in 1..254, never 127.0.0.1."""

    def __init__(self, octet: int) -> None:
        self.octet = octet
        self._free_from = 1
        self._used: set[int] = set()
        self._claim: socket.socket | None = None

    @classmethod
    def claim(cls, octet: int = 0) -> AddressPool:
        """A pool whose octet no other sandbox on this machine holds while this one lives.

        Sandboxes run side by side (the reliability tests start six at once); two that picked the
        same octet would hand out the same addresses, and a pod would fail to bind its port, a
        failure the operator blames on the config under trial. The claim is a socket listening on
        127.S.255.1 (never a pod address): the kernel makes it exclusive across processes and
        drops it when the process dies. ``octet`` 0 tries the octets 16..250 in random order.
        """
        candidates = [octet] if octet else random.SystemRandom().sample(range(16, 251), 235)
        for candidate in candidates:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((f"127.{candidate}.255.1", _OCTET_CLAIM_PORT))
                sock.listen(1)
            except OSError as err:
                sock.close()
                if err.errno != errno.EADDRINUSE:
                    raise
                continue
            pool = cls(candidate)
            pool._claim = sock
            return pool
        if octet:
            raise RuntimeError(f"ip_octet {octet}: another sandbox on this machine uses 127.{octet}.x.y")
        raise RuntimeError("every pod address octet (16..250) is taken by other sandboxes on this machine")

    def close(self) -> None:
        """Give up the octet's claim (idempotent)."""
        if self._claim is not None:
            self._claim.close()
            self._claim = None

    def allocate(self) -> str:
        n = self._free_from
        while n in self._used:
            n += 1
        if n >= 255 * 254:
            raise RuntimeError("the sandbox ran out of pod addresses")
        self._used.add(n)
        self._free_from = n + 1
        return self._address(n)

    def release(self, address: str) -> None:
        parts = address.split(".")
        n = int(parts[2]) * 254 + int(parts[3]) - 1
        self._used.discard(n)
        self._free_from = min(self._free_from, n)

    def _address(self, n: int) -> str:
        return f"127.{self.octet}.{n // 254}.{n % 254 + 1}"


_OCTET_CLAIM_PORT = 65000  # on 127.S.255.1: no pod gets that address (pods get 127.S.x.y, x <= 254)


@dataclass
class _Exit:
    code: int
    reason: str
    message: str
    started_at: str
    finished_at: str = ""  # set on the sandbox clock when the exit is handled


class PodWorker:
    """Runs one pod's engine container for as long as the pod exists (a task the kubelet cancels)."""

    def __init__(self, kubelet: Kubelet, pod: Mapping[str, Any]) -> None:
        self.kubelet = kubelet
        self.pod = pod
        meta = pod.get("metadata") or {}
        self.namespace = str(meta.get("namespace", "default"))
        self.name = str(meta.get("name"))
        self.uid = str(meta.get("uid", ""))
        self.ip = ""
        self.server: Any = None  # the running TwinServer, if any
        self.restarts = 0
        self.start_time = kubelet.stamp()
        self._status: dict[str, Any] = {}
        self.injected_exit = ""  # a crash injected by Kubelet.crash: the container's exit message
        self.logging = False  # a container run started: its output goes to the node's logs

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"

    @property
    def url(self) -> str:
        return getattr(self.server, "url", "") if self.server is not None else ""

    async def run(self) -> None:
        cfg = self.kubelet.config
        self.ip = self.kubelet.addresses.allocate()
        container = podlib.engine_container(self.pod) if self.pod.get("spec", {}).get("containers") else {}
        self.container_name = str(container.get("name", "engine"))
        self.image = str(container.get("image", ""))
        policy = str(self.pod.get("spec", {}).get("restartPolicy", "Always"))
        last_exit: dict[str, Any] | None = None
        backoff = cfg.backoff_initial_s
        try:
            await self._report(podlib.ContainerState("creating"))
            while True:
                exit_ = await self._run_container(last_exit)
                exit_.finished_at = exit_.finished_at or self.kubelet.stamp()
                if exit_.message:
                    self._log(exit_.message)
                last_exit = podlib.terminated(
                    exit_.code, exit_.reason, exit_.message, exit_.started_at, exit_.finished_at
                )
                if policy == "Never" or (policy == "OnFailure" and exit_.code == 0):
                    state = podlib.ContainerState(
                        "terminated", restart_count=self.restarts, last_exit=last_exit
                    )
                    await self._report(state)
                    return
                ran_s = _seconds_between(exit_.started_at, exit_.finished_at) * cfg.speedup
                if ran_s > 2 * cfg.backoff_max_s:
                    backoff = cfg.backoff_initial_s
                if self.restarts > 0:  # the first restart is immediate, as the kubelet does
                    message = podlib.backoff_message(backoff, self.container_name, self.pod)
                    await self._report(
                        podlib.ContainerState(
                            "backoff", restart_count=self.restarts, message=message, last_exit=last_exit
                        )
                    )
                    await self.kubelet.clock.sleep(cfg.wall(backoff))
                    backoff = min(backoff * 2, cfg.backoff_max_s)
                self.restarts += 1
        finally:
            await self._stop_server()
            self.kubelet.addresses.release(self.ip)

    async def _run_container(self, last_exit: dict[str, Any] | None) -> _Exit:
        from prefixtune.twin.memory import StartupOOM
        from prefixtune.twin.serve import ServeOptions, TwinServer, oom_startup_prefix

        cfg = self.kubelet.config
        started = self.kubelet.stamp()
        running = podlib.ContainerState(
            "running", started_at=started, restart_count=self.restarts, last_exit=last_exit
        )
        if is_router_pod(self.pod):
            return await self._run_router(running, started)
        try:
            configmaps = await self.kubelet.configmaps(self.namespace)
            plan = podlib.launch_plan(self.pod, configmaps, self.kubelet.node_labels)
        except podlib.LaunchError as err:
            return _Exit(err.exit_code, err.reason, err.message, started)
        self.container_name = plan.container
        self.kubelet.logs.start(self.uid, self.container_name)
        self.logging = True
        self._log(f"prefixtune twin kubelet: starting {shlex.join(plan.argv)}")
        adapter = get_adapter(plan.engine)
        try:
            parsed = adapter.parse(list(plan.argv), plan.files)
        except ArgsError as err:  # argparse prints usage and exits 2
            prog = adapter.prog(plan.argv)
            return _Exit(2, "Error", f"{prog}: error: {err}", started)
        if self.kubelet.knob_overrides:
            # An engine that runs other knob values than its command says (TensorRT-LLM's shallow
            # merge of kv_cache_config, a page size a backend forces); its metrics report what it runs.
            parsed = replace(parsed, config=parsed.config.with_(**self.kubelet.knob_overrides))
        await self._report(running)
        delay = cfg.load_delay_s(parsed.model, podlib.gpu_request(self.pod))
        await self.kubelet.clock.sleep(cfg.wall(delay))
        if cfg.stand_in:
            return await self._run_stand_in(parsed, running, started)
        try:
            server = TwinServer(
                plan.engine,
                parsed,
                plan.gpu,
                ServeOptions(
                    host=self.ip,
                    port=int(parsed.port),
                    speedup=cfg.speedup,
                    seed=self.kubelet.seed_for(self.uid, self.restarts),
                    exit_delay_s=cfg.wall(cfg.exit_delay_s),  # TwinServer waits wall seconds
                    dcgm_port=cfg.dcgm_port,
                    pod=self.name,
                    namespace=self.namespace,
                    engine_version=adapter.version_of(self.image) if self.image else None,
                    clock=self.kubelet.clock.now,
                ),
            )
        except StartupOOM as err:
            return _Exit(1, "Error", f"{oom_startup_prefix(plan.engine)}: {err}", started)
        except (ValueError, KeyError) as err:
            return _Exit(1, "Error", f"{type(err).__name__}: {err}", started)
        if self.kubelet.metrics_faults is not None:
            install_metrics_faults(server, self.kubelet.metrics_faults, self.name)
        try:
            await server.start()
        except OSError as err:
            await server.stop()
            return self._bind_failed(err, parsed.port, started)
        self._log(
            f"prefixtune twin: {plan.engine.value} serving {parsed.model} on http://{self.ip}:{parsed.port}"
        )
        return await self._serve_until_exit(server, running, plan.engine.value, started, "the engine exited")

    async def _run_router(self, running: podlib.ContainerState, started: str) -> _Exit:
        """A router pod (``router.py``): the real router's process, probed as an engine is."""
        container = podlib.engine_container(self.pod)
        self.container_name = str(container.get("name", "router"))
        self.kubelet.logs.start(self.uid, self.container_name)
        self.logging = True
        argv = container_command(container)
        self._log(f"prefixtune twin kubelet: starting {shlex.join(argv)}")
        kubeconfig = str(self.kubelet.kubeconfig) if self.kubelet.kubeconfig else None
        try:
            process = RouterProcess(argv, self.ip, kubeconfig, self._log)
        except RouterLaunchError as err:
            reason = "StartError" if err.exit_code == 127 else "Error"
            return _Exit(err.exit_code, reason, err.message, started)
        await self._report(running)
        await process.start()
        self.server = process
        try:
            await self._probe_until_exit(process, running, "")
        finally:
            await self._stop_server()
        if self.injected_exit:
            message, self.injected_exit = self.injected_exit, ""
            return _Exit(1, "Error", message, started)
        code = process.exit_code
        return _Exit(code or 1, "Error", f"the router exited with code {code}", started)

    async def _run_stand_in(self, parsed: Any, running: podlib.ContainerState, started: str) -> _Exit:
        """The container as a stand-in (``KubeletConfig.stand_in``): probed and stopped as a twin."""
        cfg = self.kubelet.config
        pod = StandInPod(
            self.kubelet.stand_ins,
            self.ip,
            int(parsed.port),
            parsed,
            speedup=cfg.speedup,
            clock=self.kubelet.clock.now,
            exit_delay_s=cfg.wall(cfg.exit_delay_s),
        )
        try:
            await pod.start()
        except OSError as err:
            return self._bind_failed(err, parsed.port, started)
        self._log(
            f"prefixtune stand-in: {parsed.engine.value} serving {parsed.model} on {self.ip}:{parsed.port}"
        )
        return await self._serve_until_exit(pod, running, parsed.engine.value, started, "")

    def _bind_failed(self, err: OSError, port: object, started: str) -> _Exit:
        reason = "address already in use" if err.errno == errno.EADDRINUSE else str(err)
        return _Exit(1, "Error", f"OSError: cannot bind {self.ip}:{port}: {reason}", started)

    async def _serve_until_exit(
        self, server: Any, running: podlib.ContainerState, engine: str, started: str, why: str
    ) -> _Exit:
        """Probe a started twin or stand-in until its process exits, then how it ended: an exit the
        faults injected, else the runtime OOM that ends a serving engine (``why`` when it gave none)."""
        self.server = server
        try:
            await self._probe_until_exit(server, running, engine)
        finally:
            await self._stop_server()
        if self.injected_exit:
            message, self.injected_exit = self.injected_exit, ""
            return _Exit(1, "Error", message, started)
        reason = server.oom_reason or why
        return _Exit(server.exit_code or 1, "Error", f"torch.OutOfMemoryError: {reason}", started)

    async def _probe_until_exit(self, server: Any, running: podlib.ContainerState, engine: str) -> None:
        """Probe readiness every period until the twin's process exits (after a runtime OOM)."""
        cfg = self.kubelet.config
        default_path = get_adapter(engine).health_path if engine else "/health"  # "": a router
        path, period, threshold, timeout = _readiness(self.pod, default_path, cfg.probe_period_s)
        timeout_s = max(PROBE_TIMEOUT_FLOOR_S, cfg.wall(timeout))
        url = f"{server.url}{path}"
        ready = False
        failures = 0
        exited = asyncio.ensure_future(server.exited.wait())
        try:
            while not exited.done():
                answer = await self.kubelet.probe(url, timeout_s)
                if answer is not None:  # None: timed out while the sandbox itself stood still
                    failures = 0 if answer else failures + 1
                # As the kubelet: Ready on one success, NotReady after failureThreshold failures in a
                # row (one probe that timed out while the machine was busy is not a dead engine).
                ok = failures == 0 if not ready else failures < threshold
                if ok != ready:
                    ready = ok
                    await self._report(
                        podlib.ContainerState(
                            "running",
                            started_at=running.started_at,
                            ready=ready,
                            restart_count=running.restart_count,
                            last_exit=running.last_exit,
                        )
                    )
                await asyncio.wait(
                    {exited}, timeout=cfg.wall(period) if ready else min(cfg.wall(period), 0.05)
                )
        finally:
            exited.cancel()

    def _log(self, text: str) -> None:
        """A line of the running container's output (``podlogs.py``), on the sandbox clock."""
        if self.logging:
            self.kubelet.logs.write(self.uid, self.container_name, self.kubelet.stamp(), text)

    async def _stop_server(self) -> None:
        server, self.server = self.server, None
        if isinstance(server, StandInPod | RouterProcess):
            await server.stop()
        elif server is not None:
            await stop_twin(server)

    async def _report(self, state: podlib.ContainerState) -> None:
        status = podlib.pod_status(
            container=self.container_name,
            image=self.image,
            state=state,
            pod_ip=self.ip,
            host_ip="127.0.0.1",
            start_time=self.start_time,
            previous=self._status,
            now=self.kubelet.stamp(),
        )
        self._status = status
        await self.kubelet.api.patch(f"{self.path}/status", {"status": status})


def _readiness(
    pod: Mapping[str, Any], default_path: str, default_period: float
) -> tuple[str, float, int, float]:
    """The readiness probe's path, period, failureThreshold and timeoutSeconds (kube's defaults:
    10 s, 3, 1 s)."""
    for container in pod.get("spec", {}).get("containers") or ():
        probe = container.get("readinessProbe") or {}
        http = probe.get("httpGet")
        if http:
            threshold = max(1, int(probe.get("failureThreshold", PROBE_FAILURE_THRESHOLD)))
            timeout = max(1.0, float(probe.get("timeoutSeconds", PROBE_DEFAULT_TIMEOUT_S)))
            return str(http.get("path", "/")), float(probe.get("periodSeconds", 10)), threshold, timeout
    return default_path, default_period, PROBE_FAILURE_THRESHOLD, PROBE_DEFAULT_TIMEOUT_S


def _seconds_between(start: str, end: str) -> float:
    import datetime

    fmt = "%Y-%m-%dT%H:%M:%SZ"
    try:
        return (datetime.datetime.strptime(end, fmt) - datetime.datetime.strptime(start, fmt)).total_seconds()
    except ValueError:
        return 0.0


class Kubelet:
    """Runs the pods of the sandbox node as live twins (see the module docstring)."""

    def __init__(self, api: ApiClient, config: KubeletConfig, clock: SandboxClock | None = None) -> None:
        self.api = api
        self.config = config
        self.clock = clock or SandboxClock()  # start-up delays, back-offs and the twins' time
        rng = random.Random(config.seed)
        self.addresses = AddressPool.claim(config.ip_octet)
        self._seed = rng.randrange(2**31)
        self.wakeup = Wakeup()
        self.workers: dict[str, tuple[PodWorker, asyncio.Task[None]]] = {}  # pod uid ->
        self.node_labels = {
            "kubernetes.io/hostname": config.node_name,
            "kubernetes.io/os": "linux",
            "prefixtune.io/gpu-type": config.default_gpu,
        }
        self._probe_session: aiohttp.ClientSession | None = None
        self.metrics_faults: MetricsFaults | None = None  # fault injection on the pods' metrics
        self.knob_overrides: dict[str, object] = {}  # knobs every engine runs regardless of its command
        self.gpus = config.gpus  # the node's nvidia.com/gpu allocatable now (set_gpus; None: no limit)
        self.stand_ins = StandInServer()  # every stand-in pod's endpoints (``KubeletConfig.stand_in``)
        self.logs = ContainerLogs()  # the containers' output, served as pods/log by the emulator
        # The kubeconfig of the sandbox's API server: router pods' own service discovery reads it.
        self.kubeconfig: Path | None = None

    async def set_gpus(self, gpus: int | None) -> None:
        """Change the node's GPU allocatable (capacity freed or taken elsewhere); Pending pods are
        bound on the next sync if they fit now."""
        if gpus is not None and gpus < 0:
            raise ValueError(f"gpus: must be >= 0, got {gpus}")
        self.gpus = gpus
        await self.register_node()
        self.wakeup.set()

    def crash(self, namespace: str, name: str, *, oom: bool, message: str = "") -> bool:
        """Make a running pod's engine die as if under load: a CUDA OOM (``oom``) or a crash (exit 1
        with ``message``). False when the pod runs no engine now. (Fault injection.)"""
        for worker, _ in self.workers.values():
            if worker.namespace != namespace or worker.name != name or worker.server is None:
                continue
            server = worker.server
            if oom and isinstance(server, RouterProcess):
                return False  # a router holds no KV cache: it cannot run out of GPU memory
            if oom:
                server.on_oom(message or "CUDA out of memory (injected fault)")
            else:
                worker.injected_exit = message or "RuntimeError: engine crashed (injected fault)"
                server.exit_code = 1
                server.exited.set()
            return True
        return False

    def stamp(self) -> str:
        """Now on the sandbox clock, as Kubernetes writes times: the pods' start and transition
        times must compare with the operator's clock (``--clock-file``), not with the wall clock,
        which runs ahead of sandbox time by the stalls dropped from it."""
        return podlib.now_iso(self.clock.now())

    def seed_for(self, uid: str, restarts: int) -> int:
        digest = hashlib.sha256(f"{self._seed}/{uid}/{restarts}".encode()).digest()
        return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF

    async def configmaps(self, namespace: str) -> dict[str, dict[str, str]]:
        items = await self.api.list(f"/api/v1/namespaces/{namespace}/configmaps")
        return {str(cm["metadata"]["name"]): dict(cm.get("data") or {}) for cm in items}

    async def probe(self, url: str, timeout_s: float | None = None) -> bool | None:
        """Whether the probe passed within ``timeout_s`` sandbox seconds (default
        ``PROBE_TIMEOUT_S``); None when it timed out while sandbox time stood still (the machine was
        too busy for this process to run, the engine's answer says nothing)."""
        limit = PROBE_TIMEOUT_S if timeout_s is None else timeout_s
        if self._probe_session is None:
            self._probe_session = aiohttp.ClientSession()
        began = self.clock.now()
        try:
            async with self._probe_session.get(url, timeout=aiohttp.ClientTimeout(total=limit)) as resp:
                return 200 <= resp.status < 400
        except TimeoutError:
            return None if self.clock.now() - began < limit else False
        except (aiohttp.ClientError, OSError):
            return False

    async def register_node(self) -> None:
        gpus = str(UNLIMITED_GPUS_SHOWN if self.gpus is None else self.gpus)
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.config.node_name, "labels": dict(self.node_labels)},
            "spec": {},
        }
        if await self.api.get(f"/api/v1/nodes/{self.config.node_name}") is None:
            await self.api.create("/api/v1/nodes", node)
        status = {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": self.stamp(),
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.config.node_name},
            ],
            "capacity": {"cpu": "64", "memory": "512Gi", podlib.GPU_RESOURCE: gpus, "pods": "110"},
            "allocatable": {
                "cpu": "64",
                "memory": "512Gi",
                podlib.GPU_RESOURCE: gpus,
                "pods": "110",
            },
            "nodeInfo": {"kubeletVersion": "v1.30.0-prefixtune-sandbox", "operatingSystem": "linux"},
        }
        await self.api.patch(f"/api/v1/nodes/{self.config.node_name}/status", {"status": status})

    async def run(self) -> None:
        await self.register_node()
        try:
            while True:
                try:
                    await self.sync()
                except (ApiStatusError, aiohttp.ClientError) as err:
                    logger.warning("kubelet sync failed (retrying): %s", err)
                if self.config.min_sync_s > 0:
                    await asyncio.sleep(self.config.min_sync_s)
                await self.wakeup.wait(self.config.resync_s)
        finally:
            await self.stop_all()

    async def sync(self) -> None:
        pods = await self.api.list("/api/v1/pods")
        live: set[str] = set()
        used = sum(
            podlib.gpu_request(p)
            for p in pods
            if (p.get("spec") or {}).get("nodeName") == self.config.node_name
            and not (p.get("metadata") or {}).get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        )
        oldest_first = sorted(
            pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or "")
        )
        for pod in oldest_first:
            meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
            uid = str(meta.get("uid", ""))
            node = spec.get("nodeName")
            if node and node != self.config.node_name:
                continue
            if meta.get("deletionTimestamp"):
                continue  # terminating: its worker stops below
            if not node:  # play the scheduler: bind it to this node if its GPUs fit
                path = f"/api/v1/namespaces/{meta.get('namespace', 'default')}/pods/{meta.get('name')}"
                wanted = podlib.gpu_request(pod)
                if self.gpus is not None and used + wanted > self.gpus:
                    await self._unschedulable(path, pod)
                    continue
                if await self.api.patch(path, {"spec": {"nodeName": self.config.node_name}}) is None:
                    continue
                used += wanted
            live.add(uid)
            if uid not in self.workers:
                worker = PodWorker(self, pod)
                task = asyncio.get_running_loop().create_task(worker.run(), name=f"pod {meta.get('name')}")
                task.add_done_callback(log_failure)
                self.workers[uid] = (worker, task)
        for uid in [u for u in self.workers if u not in live]:
            await self._stop(uid)

    async def _unschedulable(self, path: str, pod: Mapping[str, Any]) -> None:
        """Say why the pod stays Pending, as the scheduler does (written once, not every sync)."""
        if podlib.is_unschedulable(pod):
            return
        status = podlib.unschedulable_status(podlib.insufficient_gpu_message(), self.stamp())
        await self.api.patch(f"{path}/status", {"status": status})  # None: deleted in between

    async def _stop(self, uid: str) -> None:
        _, task = self.workers.pop(uid)
        await stop_task(task)
        self.logs.forget(uid)  # the pod is gone, and its log files with it

    async def stop_all(self) -> None:
        for uid in list(self.workers):
            await self._stop(uid)
        if self._probe_session is not None:
            await self._probe_session.close()
            self._probe_session = None
        await self.stand_ins.close()

    def close(self) -> None:
        """Release what outlives the pods: the claim on the address octet."""
        self.addresses.close()

    def pod_url(self, namespace: str, name: str) -> str:
        """The base URL of a running pod's engine ("" when none runs)."""
        for worker, _ in self.workers.values():
            if worker.namespace == namespace and worker.name == name:
                return worker.url
        return ""


async def stop_twin(server: Any) -> None:
    """Stop a TwinServer as a killed process stops: requests in flight fail at once.

    ``TwinServer.stop`` alone waits (aiohttp's graceful shutdown, up to 60 s) for the handlers of
    requests still in the simulation; a killed container has no such grace.
    """
    from prefixtune.twin.serve import RequestError

    def fail_pending() -> None:
        for pending in list(server.pending.values()):
            if not pending.done.done():
                pending.done.set_exception(RequestError("the engine was stopped", status=503))
                pending.done.exception()  # retrieved: no "exception never retrieved" warning
            pending.chunks.put_nowait(0)
        server.pending.clear()

    async def keep_failing() -> None:  # requests that arrive while the server closes
        while True:
            await asyncio.sleep(0.02)
            fail_pending()

    fail_pending()
    guard = asyncio.ensure_future(keep_failing())
    try:
        await server.stop()
    finally:
        guard.cancel()


__all__ = [
    "PROBE_FAILURE_THRESHOLD",
    "AddressPool",
    "ApiStatusError",  # re-exported: bench/_reliability_faults.py imports it from here
    "Kubelet",
    "KubeletConfig",
    "PodWorker",
    "stop_twin",
]

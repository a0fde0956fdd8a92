"""The real request routers in sandbox pods: ``sglang-router`` / ``vllm-router`` from their wheels.

A pod labelled ``app.kubernetes.io/component: router`` is a router, not an engine: the twin kubelet
runs the container's own command as a child process (the ``sandbox`` extra installs both wheels),
with two rewrites, as it binds every twin to its pod's address:

* ``--host`` and ``--prometheus-host`` become the pod's loopback address (127.S.x.y), so that the
  router serves its port and its metrics on the pod IP its Service's endpoints name, and two routers
  on the same port do not collide;
* the console scripts (``sglang-router``, ``vllm-router``, ``smg``) and ``python[3] -m
  sglang_router.launch_router`` / ``vllm_router.launch_router`` resolve to this Python's
  environment (a container with ``args`` only gets its image's entrypoint by the image's name).

Service discovery is the router's own (``--service-discovery --selector ... --service-discovery-
namespace ...``): its Kubernetes client (kube-rs) lists and watches pods on the sandbox's emulated
API server, through ``KUBECONFIG`` pointing at the sandbox's kubeconfig (a real pod would use its
ServiceAccount's in-cluster token; the emulator enforces no RBAC). Both wheels were seen to list,
watch and register the ready twin pods that way (their logs: "Adding pod ... url:
http://127.S.x.y:8000"). The router's output goes to the pod's log; stopping the pod stops the
process group (SIGTERM, then SIGKILL after ``STOP_GRACE_S``), and the child is killed with its parent
should the sandbox's process die first (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import re
import shutil
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prefixtune.routing.policy import Router

COMPONENT_LABEL = "app.kubernetes.io/component"
ROUTER_COMPONENT = "router"
STOP_GRACE_S = 5.0  # wall seconds between SIGTERM and SIGKILL when a router pod stops
DEFAULT_PORT = 30000  # both routers' --port default
_HOST_FLAGS = ("--host", "--prometheus-host")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# The console scripts of the wheels and the modules behind them: argv[0] (or ``-m`` module) -> router.
_SCRIPTS: Mapping[str, Router] = {
    "sglang-router": Router.SGLANG,
    "smg": Router.SGLANG,
    "vllm-router": Router.VLLM,
}
_MODULES: Mapping[str, Router] = {
    "sglang_router.launch_router": Router.SGLANG,
    "vllm_router.launch_router": Router.VLLM,
}
# A container with args only runs its image's entrypoint: image name marker -> command.
_IMAGE_ENTRYPOINTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vllm-router", ("vllm-router",)),
    ("sglang-router", ("python3", "-m", "sglang_router.launch_router")),
    ("sglang", ("python3", "-m", "sglang_router.launch_router")),
)


class RouterLaunchError(Exception):
    """The router container cannot start: what the runtime would print, and its exit code."""

    def __init__(self, message: str, exit_code: int = 127) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def is_router_pod(pod: Mapping[str, Any]) -> bool:
    """The pod carries ``app.kubernetes.io/component: router`` (the operator's router Deployment)."""
    labels = ((pod.get("metadata") or {}).get("labels")) or {}
    return bool(labels.get(COMPONENT_LABEL) == ROUTER_COMPONENT)


def router_of(argv: Sequence[str]) -> Router | None:
    """Which router a command line starts (None: not one of the two)."""
    if not argv:
        return None
    name = posixpath.basename(argv[0])
    if name in _SCRIPTS:
        return _SCRIPTS[name]
    if name.startswith("python") and len(argv) >= 3 and argv[1] == "-m":
        return _MODULES.get(argv[2])
    return None


def container_command(container: Mapping[str, Any]) -> list[str]:
    """command + args, the image's entrypoint standing in for a missing command."""
    command = [str(c) for c in container.get("command") or ()]
    args = [str(a) for a in container.get("args") or ()]
    if not command:
        image = str(container.get("image") or "").lower().rsplit("/", 1)[-1]
        for marker, entrypoint in _IMAGE_ENTRYPOINTS:
            if marker in image:
                command = list(entrypoint)
                break
    return [*command, *args]


def with_host(argv: Sequence[str], host: str) -> list[str]:
    """``argv`` with ``--host`` and ``--prometheus-host`` set to ``host`` (added when absent)."""
    out: list[str] = []
    seen: set[str] = set()
    skip = False
    for i, token in enumerate(argv):
        if skip:
            skip = False
            continue
        flag = token.split("=", 1)[0]
        if flag in _HOST_FLAGS and i > 0:
            seen.add(flag)
            out += [flag, host]
            skip = "=" not in token
            continue
        out.append(token)
    for flag in _HOST_FLAGS:
        if flag not in seen:
            out += [flag, host]
    return out


def port_of(argv: Sequence[str]) -> int:
    """The router's ``--port`` (its default when absent)."""
    for i, token in enumerate(argv):
        value = argv[i + 1] if token == "--port" and i + 1 < len(argv) else None
        if token.startswith("--port="):
            value = token.split("=", 1)[1]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise RouterLaunchError(f"--port: invalid int value: {value!r}", exit_code=2) from None
    return DEFAULT_PORT


def resolve(argv: Sequence[str]) -> list[str]:
    """The command line to execute here: the console script or ``-m`` module from this environment."""
    router = router_of(argv)
    if router is None:
        shown = " ".join(argv) or "(empty command)"
        raise RouterLaunchError(
            f"exec: {shown!r}: not a router the sandbox can run; expected 'sglang-router ...', "
            "'vllm-router ...' or 'python3 -m sglang_router.launch_router ...'"
        )
    name = posixpath.basename(argv[0])
    if name.startswith("python"):
        return [sys.executable, *argv[1:]]
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        raise RouterLaunchError(
            f"exec: {name!r}: executable file not found in $PATH (install the sandbox extra: "
            "pip install 'prefixtune[sandbox]', which brings sglang-router and vllm-router)"
        )
    return [found, *argv[1:]]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGKILL when the sandbox's process exits (no orphaned routers)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class RouterProcess:
    """One router container as a child process: ``start``, then ``exited`` is set when it ends.

    ``url`` is the base URL it serves on (the pod's address and ``--port``), as a TwinServer's is.
    """

    def __init__(
        self, argv: Sequence[str], host: str, kubeconfig: str | None, log: Callable[[str], None]
    ) -> None:
        self.argv = resolve(with_host(argv, host))
        self.port = port_of(self.argv)
        self.url = f"http://{host}:{self.port}"
        self.kubeconfig = kubeconfig
        self.log = log
        self.exited = asyncio.Event()
        self.exit_code = 0
        self.injected_exit = ""
        self._proc: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        # Never a real cluster: the router's discovery reads the sandbox's kubeconfig only (none: an
        # empty one, so discovery fails rather than reach ~/.kube/config or an in-cluster API server).
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE_")}
        env.update({"NO_COLOR": "1", "HF_HUB_OFFLINE": "1"})  # plain logs; no tokenizer downloads
        env["KUBECONFIG"] = self.kubeconfig or os.devnull
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        self._pump = asyncio.get_running_loop().create_task(self._read_output())

    async def _read_output(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        while line := await proc.stdout.readline():
            self.log(_ANSI.sub("", line.decode(errors="replace").rstrip()))
        self.exit_code = await proc.wait()
        self.exited.set()

    async def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after ``STOP_GRACE_S``; idempotent."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        if self._pump is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self._pump, STOP_GRACE_S)
            self._pump = None


__all__ = [
    "COMPONENT_LABEL",
    "ROUTER_COMPONENT",
    "RouterLaunchError",
    "RouterProcess",
    "container_command",
    "is_router_pod",
    "port_of",
    "resolve",
    "router_of",
    "with_host",
]

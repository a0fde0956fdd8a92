"""What the twin kubelet reads from a Pod and writes back to its status: pure functions, no I/O.

Reading a pod (``launch_plan``):

* **Engine** from the container's command: ``vllm serve ...``, ``sglang serve ...`` or ``python[3] -m
  sglang.launch_server ...``, ``trtllm-serve ...`` (a path such as ``/usr/local/bin/vllm`` counts by
  its basename). A container with ``args`` but no ``command`` runs its image's entrypoint: an image
  whose name says vllm, sglang or tensorrt-llm/trtllm gets that engine's command. Anything else is
  not an engine: the container fails the way a bad entrypoint would (exit code 127).
* **Files** the engine reads (TensorRT-LLM's ``--extra_llm_api_options`` YAML) from the container's
  ConfigMap volume mounts: whole-volume mounts (every key, or the volume's ``items`` with their
  ``path``), and ``subPath`` mounts of one key.
* **GPU type**, first found of: the pod annotation ``prefixtune.io/sandbox-gpu`` (e.g. ``H200``), the
  nodeSelector ``nvidia.com/gpu.product`` (GPU feature discovery's label, e.g.
  ``NVIDIA-H100-80GB-HBM3``) or ``prefixtune.io/gpu-type``, the same labels on the sandbox node,
  else ``H100-80GB``. Values are resolved by the twin's GPU catalog (its names and aliases).

Scheduling (``gpu_request``, ``unschedulable_status``): a pod asks for the ``nvidia.com/gpu`` of its
containers' requests (else limits, as Kubernetes defaults an extended resource's request to its
limit); one that asks for more than the node has free stays Pending, unbound, with the scheduler's
condition: PodScheduled False, reason Unschedulable, "0/1 nodes are available: 1 Insufficient
nvidia.com/gpu."

Writing a pod's status (``pod_status``): phase, the PodScheduled/Initialized/ContainersReady/Ready
conditions, one containerStatus (state running / waiting ContainerCreating or CrashLoopBackOff /
terminated, lastState, restartCount) and the loopback podIP, as the real kubelet reports them.
"""

from __future__ import annotations

import datetime
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefixtune.engines import EngineName, get_adapter
from prefixtune.engines.registry import detect_engine

GPU_ANNOTATION = "prefixtune.io/sandbox-gpu"
GPU_LABELS = ("nvidia.com/gpu.product", "prefixtune.io/gpu-type")
DEFAULT_GPU = "H100-80GB"
NODE_NAME = "sandbox-node"
GPU_RESOURCE = "nvidia.com/gpu"

# Entrypoints of the engines' images, for containers that set only ``args``.
_IMAGE_ENTRYPOINTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sglang", ("python3", "-m", "sglang.launch_server")),
    ("tensorrt", ("trtllm-serve",)),
    ("trtllm", ("trtllm-serve",)),
    ("vllm", ("vllm", "serve")),
)


class LaunchError(Exception):
    """The container cannot start: ``message`` is what the process would print, ``exit_code`` its code."""

    def __init__(self, message: str, exit_code: int = 1, reason: str = "Error") -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.reason = reason


@dataclass(frozen=True)
class LaunchPlan:
    """What to boot for one container: the engine, its full argv, the files it reads and the GPU."""

    container: str
    engine: EngineName
    argv: tuple[str, ...]
    files: Mapping[str, str] = field(default_factory=dict)
    gpu: str = DEFAULT_GPU
    port: int = 0  # the port the engine's args bind (the adapter's default when the args set none)


def now_iso(at: float | None = None) -> str:
    """``at`` (epoch seconds; the sandbox's clock in the kubelet) or now, as Kubernetes writes times."""
    when = (
        datetime.datetime.now(tz=datetime.UTC)
        if at is None
        else datetime.datetime.fromtimestamp(at, datetime.UTC)
    )
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def container_argv(container: Mapping[str, Any]) -> tuple[str, ...]:
    """command + args, with the image's entrypoint standing in for a missing command."""
    command = [str(c) for c in container.get("command") or ()]
    args = [str(a) for a in container.get("args") or ()]
    if not command:
        image = str(container.get("image") or "").lower()
        for marker, entrypoint in _IMAGE_ENTRYPOINTS:
            if marker in image.rsplit("/", 1)[-1] or marker in image:
                command = list(entrypoint)
                break
    if command:
        command[0] = posixpath.basename(command[0]) if "/" in command[0] else command[0]
    return (*command, *args)


def _configmap_files(
    mount_path: str, sub_path: str, volume: Mapping[str, Any], configmaps: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    source = volume.get("configMap") or {}
    name = str(source.get("name", ""))
    data = configmaps.get(name)
    if data is None:
        if source.get("optional"):
            return {}
        raise LaunchError(
            f'configmap "{name}" not found (volume {volume.get("name")!r})',
            exit_code=128,
            reason="CreateContainerConfigError",
        )
    items = source.get("items")
    layout = {str(i["key"]): str(i.get("path", i["key"])) for i in items} if items else {k: k for k in data}
    if sub_path:  # one file mounted at mount_path
        for key, rel in layout.items():
            if rel == sub_path and key in data:
                return {mount_path: data[key]}
        return {}
    return {posixpath.join(mount_path, rel): data[key] for key, rel in layout.items() if key in data}


def mounted_files(
    pod: Mapping[str, Any], container: Mapping[str, Any], configmaps: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    """Absolute path -> content for every ConfigMap file mounted into ``container``."""
    volumes = {str(v.get("name")): v for v in (pod.get("spec", {}).get("volumes") or ())}
    files: dict[str, str] = {}
    for mount in container.get("volumeMounts") or ():
        volume = volumes.get(str(mount.get("name")))
        if volume is None or "configMap" not in volume:
            continue
        files.update(
            _configmap_files(str(mount["mountPath"]), str(mount.get("subPath", "")), volume, configmaps)
        )
    return files


def gpu_type(pod: Mapping[str, Any], node_labels: Mapping[str, str] | None = None) -> str:
    """The GPU type a pod runs on (see the module docstring for the order of sources)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if annotations.get(GPU_ANNOTATION):
        return str(annotations[GPU_ANNOTATION])
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    for source in (selector, node_labels or {}):
        for label in GPU_LABELS:
            if source.get(label):
                return str(source[label])
    return DEFAULT_GPU


def engine_container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The container that runs the engine: the first whose command starts one, else the first."""
    containers: list[Mapping[str, Any]] = list((pod.get("spec") or {}).get("containers") or ())
    if not containers:
        raise LaunchError("pod has no containers (spec.containers is empty)", reason="CreateContainerError")
    for c in containers:
        if detect_engine(container_argv(c)) is not None:
            return c
    return containers[0]


def launch_plan(
    pod: Mapping[str, Any],
    configmaps: Mapping[str, Mapping[str, str]],
    node_labels: Mapping[str, str] | None = None,
) -> LaunchPlan:
    """Everything needed to boot the pod's engine; LaunchError when the container cannot start.

    The engine's own argument errors (a wrong flag, a missing model) are left to the engine: the
    adapter's ``parse`` raises ArgsError when the twin boots, as the real engine would fail at start.
    """
    container = engine_container(pod)
    argv = container_argv(container)
    engine = detect_engine(argv)
    if engine is None:
        shown = " ".join(argv) or "(empty command)"
        raise LaunchError(
            f"exec: {shown!r}: not an LLM engine the sandbox can run; expected 'vllm serve ...', "
            "'sglang serve ...' (or 'python3 -m sglang.launch_server ...') or 'trtllm-serve ...'",
            exit_code=127,
            reason="StartError",
        )
    files = mounted_files(pod, container, configmaps)
    port = port_flag(argv) or get_adapter(engine).metrics_port
    return LaunchPlan(
        container=str(container.get("name", "engine")),
        engine=engine,
        argv=argv,
        files=files,
        gpu=gpu_type(pod, node_labels),
        port=port,
    )


def port_flag(argv: Sequence[str]) -> int:
    """The value of ``--port`` (engines bind it); 0 when absent or not a number."""
    for i, token in enumerate(argv):
        value = None
        if token == "--port" and i + 1 < len(argv):
            value = argv[i + 1]
        elif token.startswith("--port="):
            value = token.split("=", 1)[1]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


# --------------------------------------------------------------------------------------------------
# Status


@dataclass(frozen=True)
class ContainerState:
    """The container's state as the kubelet reports it.

    ``kind`` is ``creating`` (waiting ContainerCreating), ``running`` (with ``ready``), ``backoff``
    (waiting CrashLoopBackOff), or ``terminated`` (restartPolicy Never: the pod failed).
    """

    kind: str
    started_at: str = ""
    ready: bool = False
    restart_count: int = 0
    message: str = ""  # backoff: the back-off message
    last_exit: Mapping[str, Any] | None = None  # lastState.terminated (or state.terminated)


def terminated(
    exit_code: int, reason: str, message: str, started_at: str, finished_at: str
) -> dict[str, Any]:
    out: dict[str, Any] = {"exitCode": int(exit_code), "reason": reason, "finishedAt": finished_at}
    if started_at:
        out["startedAt"] = started_at
    if message:
        out["message"] = message
    return out


def container_status(name: str, image: str, state: ContainerState) -> dict[str, Any]:
    status: dict[str, Any] = {
        "name": name,
        "image": image,
        "imageID": "",
        "ready": state.ready,
        "restartCount": int(state.restart_count),
        "started": state.kind == "running",
        "lastState": {},
        "state": {},
    }
    if state.kind == "running":
        status["state"] = {"running": {"startedAt": state.started_at}}
        status["containerID"] = f"sandbox://{name}-{state.restart_count}"
    elif state.kind == "creating":
        status["state"] = {"waiting": {"reason": "ContainerCreating"}}
    elif state.kind == "backoff":
        status["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": state.message}}
    elif state.kind == "terminated":
        status["state"] = {"terminated": dict(state.last_exit or {})}
    else:
        raise ValueError(
            f"container state kind must be creating|running|backoff|terminated, got {state.kind!r}"
        )
    if state.last_exit is not None and state.kind != "terminated":
        status["lastState"] = {"terminated": dict(state.last_exit)}
    return status


def _condition(kind: str, ok: bool, since: str, reason: str = "") -> dict[str, Any]:
    cond: dict[str, Any] = {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": since}
    if reason and not ok:
        cond["reason"] = reason
    return cond


def pod_status(
    *,
    container: str,
    image: str,
    state: ContainerState,
    pod_ip: str,
    host_ip: str,
    start_time: str,
    previous: Mapping[str, Any] | None = None,
    now: str | None = None,
) -> dict[str, Any]:
    """The pod's whole status. Condition transition times are kept from ``previous`` when unchanged."""
    stamp = now or now_iso()
    if state.kind == "terminated":
        phase = "Failed" if int((state.last_exit or {}).get("exitCode", 1)) != 0 else "Succeeded"
    elif state.kind == "creating":
        phase = "Pending"
    else:  # running, or restarting in back-off: the kubelet keeps the pod Running
        phase = "Running"
    ready = state.kind == "running" and state.ready
    reason = "" if ready else "ContainersNotReady"
    wanted = {
        "PodScheduled": (True, ""),
        "Initialized": (True, ""),
        "ContainersReady": (ready, reason),
        "Ready": (ready, reason),
    }
    before = {c.get("type"): c for c in (previous or {}).get("conditions") or ()}
    conditions = []
    for kind, (ok, why) in wanted.items():
        old = before.get(kind)
        same = old is not None and old.get("status") == ("True" if ok else "False")
        since = str(old.get("lastTransitionTime", stamp)) if same and old is not None else stamp
        conditions.append(_condition(kind, ok, since, why))
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": host_ip,
        "startTime": start_time,
        "qosClass": "BestEffort",
        "containerStatuses": [container_status(container, image, state)],
    }
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status


def backoff_message(delay_s: float, container: str, pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return (
        f"back-off {round(delay_s)}s restarting failed container={container} "
        f"pod={meta.get('name')}_{meta.get('namespace')}({meta.get('uid')})"
    )


def gpu_request(pod: Mapping[str, Any]) -> int:
    """The GPUs a pod asks for: the sum over its containers of ``requests`` (else ``limits``)."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or ():
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get(GPU_RESOURCE)
        if value is None:
            value = (resources.get("limits") or {}).get(GPU_RESOURCE)
        try:
            total += int(str(value)) if value is not None else 0
        except ValueError:
            continue  # the API server would have refused it; the sandbox asks for nothing
    return total


def insufficient_gpu_message(nodes: int = 1) -> str:
    """The default scheduler's message for a pod no node has the GPUs for."""
    return f"0/{nodes} nodes are available: {nodes} Insufficient {GPU_RESOURCE}."


def unschedulable_status(message: str, since: str) -> dict[str, Any]:
    """The status the scheduler writes on a pod it cannot place: Pending, PodScheduled False."""
    return {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": since,
            }
        ],
    }


def is_unschedulable(pod: Mapping[str, Any]) -> bool:
    """The pod carries the scheduler's PodScheduled False / Unschedulable condition."""
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


def is_ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition is True (and it is not being deleted)."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def is_active(pod: Mapping[str, Any]) -> bool:
    """Counts towards a ReplicaSet's replicas: not finished and not being deleted."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in {"Succeeded", "Failed"}


def restart_count(pod: Mapping[str, Any]) -> int:
    return sum(
        int(cs.get("restartCount", 0)) for cs in (pod.get("status") or {}).get("containerStatuses") or ()
    )


__all__ = [
    "DEFAULT_GPU",
    "GPU_ANNOTATION",
    "GPU_LABELS",
    "GPU_RESOURCE",
    "NODE_NAME",
    "ContainerState",
    "LaunchError",
    "LaunchPlan",
    "backoff_message",
    "container_argv",
    "container_status",
    "detect_engine",
    "engine_container",
    "gpu_request",
    "gpu_type",
    "insufficient_gpu_message",
    "is_active",
    "is_ready",
    "is_unschedulable",
    "launch_plan",
    "mounted_files",
    "now_iso",
    "pod_status",
    "port_flag",
    "restart_count",
    "terminated",
    "unschedulable_status",
]

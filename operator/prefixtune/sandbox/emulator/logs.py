"""``GET pods/<name>/log``: a pod's container log, from whatever plays its node's kubelet.

As kube-apiserver (kubernetes ``pkg/registry/core/pod/strategy.go`` ``LogLocation``, and the
kubelet's ``validateContainerLogStatus`` in ``pkg/kubelet/kubelet_pods.go``): without
``container`` a pod with one container means that one, with several it is 400 ``a container name
must be specified for pod P, choose one of: [a b]`` (and ``or one of the init containers: [...]``);
an unknown container is 400 ``container X is not valid for pod P``; a pod not yet bound to a node
answers an empty log; a container that never started is 400 ``container "c" in pod "p" is waiting
to start: <reason>``; ``previous=true`` without an earlier run is 400 ``previous terminated container
"c" in pod "p" not found``. ``tailLines`` (>= 0), ``limitBytes`` (> 0) and ``timestamps`` are
honoured; the answer is ``text/plain``.

Not emulated: ``follow`` (the log so far is returned and the response ends), ``sinceSeconds`` and
``sinceTime`` (ignored). Without a log source (an emulator without the sandbox's kubelet) every
started container's log is empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from prefixtune.sandbox.emulator.errors import api_error


class LogLineLike(Protocol):
    @property
    def stamp(self) -> str: ...

    @property
    def text(self) -> str: ...


class PodLogSource(Protocol):
    """Where a pod's container logs are kept (the sandbox kubelet's ``ContainerLogs``)."""

    def read(self, uid: str, container: str, previous: bool) -> Sequence[LogLineLike] | None: ...


def _names(containers: Any) -> list[str]:
    return [str(c.get("name")) for c in containers or () if isinstance(c, Mapping)]


def log_container(pod: Mapping[str, Any], wanted: str | None) -> str:
    """The container a log request is for (``LogLocation``'s choice and checks)."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    name = str((pod.get("metadata") or {}).get("name"))
    containers, inits = _names(spec.get("containers")), _names(spec.get("initContainers"))
    if not wanted:
        if len(containers) == 1:
            return containers[0]
        if not containers:
            raise api_error(400, f"a container name must be specified for pod {name}")
        message = (
            f"a container name must be specified for pod {name}, choose one of: [{' '.join(containers)}]"
        )
        if inits:
            message += f" or one of the init containers: [{' '.join(inits)}]"
        raise api_error(400, message)
    if wanted not in containers + inits:
        raise api_error(400, f"container {wanted} is not valid for pod {name}")
    return wanted


def _int_param(params: Mapping[str, str], key: str, minimum: int) -> int | None:
    raw = params.get(key)
    if raw in (None, ""):
        return None
    try:
        value = int(str(raw))
    except ValueError as exc:
        raise api_error(400, f"{key}: Invalid value: {raw!r}: must be an integer") from exc
    if value < minimum:
        bound = "greater than or equal to 0" if minimum == 0 else f"greater than {minimum - 1}"
        raise api_error(422, f"{key}: Invalid value: {value}: must be {bound}")
    return value


def _waiting_reason(pod: Mapping[str, Any], container: str) -> str:
    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    for key in ("containerStatuses", "initContainerStatuses"):
        for entry in status.get(key) or ():
            if isinstance(entry, Mapping) and entry.get("name") == container:
                reason = ((entry.get("state") or {}).get("waiting") or {}).get("reason")
                return str(reason or "ContainerCreating")
    return "ContainerCreating"


def pod_log(pod: Mapping[str, Any], params: Mapping[str, str], source: PodLogSource | None) -> bytes:
    """The body of ``GET pods/<name>/log`` for ``pod`` and the request's query parameters."""
    container = log_container(pod, params.get("container"))
    tail = _int_param(params, "tailLines", 0)
    limit = _int_param(params, "limitBytes", 1)
    previous = params.get("previous") in ("true", "1")
    timestamps = params.get("timestamps") in ("true", "1")
    meta = pod.get("metadata") or {}
    if not (pod.get("spec") or {}).get("nodeName"):
        return b""  # no host assigned: an empty location, an empty log
    lines = source.read(str(meta.get("uid", "")), container, previous) if source is not None else ()
    name = meta.get("name")
    if lines is None:
        if previous:
            raise api_error(400, f'previous terminated container "{container}" in pod "{name}" not found')
        reason = _waiting_reason(pod, container)
        raise api_error(400, f'container "{container}" in pod "{name}" is waiting to start: {reason}')
    chosen = list(lines)
    if tail is not None:
        chosen = chosen[max(len(chosen) - tail, 0) :]
    text = "".join(f"{line.stamp} {line.text}\n" if timestamps else f"{line.text}\n" for line in chosen)
    body = text.encode()
    return body[:limit] if limit is not None else body

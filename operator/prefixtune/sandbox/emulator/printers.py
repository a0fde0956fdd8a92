"""The printers of Table rows: the columns of a resource and the cells of one object (pure).

What kube-apiserver prints, and so what is emulated here:

* Custom resources (apiextensions-apiserver ``pkg/registry/customresource/tableconvertor/
  tableconvertor.go``, kubernetes 045bbb19): a ``Name`` column (format ``name``), then the version's
  ``additionalPrinterColumns``, each a JSONPath (``jsonpath.py``) evaluated against the object with
  missing keys allowed; a missing value is a ``null`` cell; ``integer``/``number``/``boolean``/
  ``string`` cells keep their JSON type when the value has it (else ``null``), ``date`` cells become
  the short human age (``ShortHumanDuration``). A version without printer columns gets one ``Age``
  column of ``.metadata.creationTimestamp`` (``serveDefaultColumnsIfEmpty``, apiextensions-apiserver
  ``pkg/apiserver/customresource_handler.go``).
* Built-in kinds (kubernetes ``pkg/printers/internalversion/printers.go``, printed wide on the
  server): pods (NAME READY STATUS RESTARTS AGE, wide IP NODE NOMINATED NODE READINESS GATES, the
  STATUS reason as ``printPod`` derives it), deployments (NAME READY UP-TO-DATE AVAILABLE AGE, wide
  CONTAINERS IMAGES SELECTOR), replicasets (NAME DESIRED CURRENT READY AGE, wide the same three),
  namespaces (NAME STATUS AGE) and services (NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE, wide
  SELECTOR). Ages use ``HumanDuration`` (apimachinery ``pkg/util/duration/duration.go``).

Deviations: other built-in kinds get NAME and AGE (their real printers are not reproduced); a
printer column outside the JSONPath subset is ``null`` (the real server would have refused the
CRD); a ``string`` column of a map or list is printed as JSON (Go prints its own syntax).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefixtune.sandbox.emulator.jsonpath import JsonPath, JsonPathError, as_text

Obj = Mapping[str, Any]

# The descriptions kube-apiserver gives (metav1.ObjectMeta{}.SwaggerDoc()), shortened to their first sentence.
_NAME_DOC = (
    "Name must be unique within a namespace. Is required when creating resources, although some "
    "resources may allow a client to request the generation of an appropriate name automatically."
)
_AGE_DOC = "CreationTimestamp is a timestamp representing the server time when this object was created."


# ----------------------------------------------------------------------------------------- durations


def _seconds_since(timestamp: Any, now: datetime.datetime) -> float | None:
    if not isinstance(timestamp, str) or not timestamp:
        return None
    try:
        when = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return None
    return (now - when).total_seconds()


def short_human_duration(seconds: float) -> str:
    """apimachinery's ``ShortHumanDuration``: one unit (``42s``, ``5m``, ``3h``, ``12d``, ``2y``)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    hours = s // 3600
    if hours < 24:
        return f"{hours}h"
    if hours < 24 * 365:
        return f"{hours // 24}d"
    return f"{hours // (24 * 365)}y"


def human_duration(seconds: float) -> str:
    """apimachinery's ``HumanDuration``: two to three significant figures (``2m5s``, ``3h20m``, ``4d2h``)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = hours // 24 // 365, (hours // 24) % 365
        return f"{years}y" if days == 0 else f"{years}y{days}d"
    return f"{hours // 24 // 365}y"


def _age(timestamp: Any, now: datetime.datetime, short: bool = False) -> str:
    seconds = _seconds_since(timestamp, now)
    if seconds is None:
        return "<unknown>"
    return short_human_duration(seconds) if short else human_duration(seconds)


def _typed_cell(column_type: str, value: Any, now: datetime.datetime) -> Any:
    """``cellForJSONValue``: the value kept in the column's JSON type, or None when it has another."""
    if value is None:
        return None
    if column_type == "integer" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if column_type == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if column_type == "boolean" and isinstance(value, bool):
        return value
    if column_type == "date" and isinstance(value, str):
        seconds = _seconds_since(value, now)
        return "<invalid>" if seconds is None else short_human_duration(seconds)
    return None


@dataclass(frozen=True)
class Column:
    """One ``TableColumnDefinition``."""

    name: str
    type: str = "string"
    format: str = ""
    description: str = ""
    priority: int = 0

    def definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


Cells = Callable[[Obj, datetime.datetime], list[Any]]


@dataclass(frozen=True)
class Printer:
    """The columns of a resource and the function that fills one row's cells."""

    columns: tuple[Column, ...]
    cells: Cells


_NAME = Column("Name", format="name", description=_NAME_DOC)
_AGE = Column("Age", description=_AGE_DOC)


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _part(obj: Any, key: str) -> Mapping[str, Any]:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _items(obj: Any, key: str) -> list[Mapping[str, Any]]:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def crd_printer(printer_columns: Sequence[Mapping[str, Any]]) -> Printer:
    """The printer of a custom resource version from its ``additionalPrinterColumns``."""
    specs = list(printer_columns) or [
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp", "description": _AGE_DOC}
    ]
    columns = [_NAME]
    paths: list[JsonPath | None] = []
    for spec in specs:
        json_path = str(spec.get("jsonPath", ""))
        try:
            paths.append(JsonPath.parse(json_path))
        except JsonPathError:
            paths.append(None)
        columns.append(
            Column(
                name=str(spec.get("name", "")),
                type=str(spec.get("type", "string")),
                format=str(spec.get("format", "")),
                description=str(
                    spec.get("description")
                    or f"Custom resource definition column (in JSONPath format): {json_path}"
                ),
                priority=_int(spec.get("priority")),
            )
        )
    types = [c.type for c in columns[1:]]

    def cells(obj: Obj, now: datetime.datetime) -> list[Any]:
        row: list[Any] = [_meta(obj).get("name")]
        for path, column_type in zip(paths, types, strict=True):
            found = path.find(obj) if path is not None else []
            if not found:
                row.append(None)
            elif column_type == "string":
                row.append(as_text(found[0]))
            else:
                row.append(_typed_cell(column_type, found[0], now))
        return row

    return Printer(tuple(columns), cells)


def _format_labels(labels: Mapping[str, Any]) -> str:
    """apimachinery's ``labels.FormatLabels``: ``k=v`` sorted by key, ``<none>`` when empty."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>"


def _format_selector(selector: Mapping[str, Any]) -> str:
    """``metav1.FormatLabelSelector``: match labels and expressions, sorted by key, ``<none>`` if empty."""
    parts = [(str(k), f"{k}={v}") for k, v in (_part(selector, "matchLabels")).items()]
    for expr in _items(selector, "matchExpressions"):
        key, op = str(expr.get("key", "")), str(expr.get("operator", ""))
        values = ",".join(sorted(str(v) for v in expr.get("values") or []))
        text = {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})",
                "Exists": key, "DoesNotExist": f"!{key}"}.get(op, key)  # fmt: skip
        parts.append((key, text))
    return ",".join(text for _, text in sorted(parts)) or "<none>"


def _containers_cells(pod_spec: Mapping[str, Any]) -> list[str]:
    containers = _items(pod_spec, "containers")
    return [
        ",".join(str(c.get("name", "")) for c in containers),
        ",".join(str(c.get("image", "")) for c in containers),
    ]


def _restartable_init(container: Mapping[str, Any] | None) -> bool:
    return container is not None and container.get("restartPolicy") == "Always"


def _terminated_reason(terminated: Mapping[str, Any], prefix: str = "") -> str:
    if terminated.get("reason"):
        return prefix + str(terminated["reason"])
    if _int(terminated.get("signal")):
        return f"{prefix}Signal:{_int(terminated.get('signal'))}"
    return f"{prefix}ExitCode:{_int(terminated.get('exitCode'))}"


def _later(first: str, second: Any) -> str:
    return second if isinstance(second, str) and second > first else first


def pod_cells(pod: Obj, now: datetime.datetime) -> list[Any]:
    """``printPod``: READY, the STATUS reason, RESTARTS (with the last restart's age), AGE, then wide."""
    spec, status, meta = _part(pod, "spec"), _part(pod, "status"), _meta(pod)
    init_specs = {str(c.get("name")): c for c in _items(spec, "initContainers")}
    total = len(_items(spec, "containers")) + sum(1 for c in init_specs.values() if _restartable_init(c))
    phase = str(status.get("phase") or "")
    reason = str(status.get("reason") or phase)
    for condition in _items(status, "conditions"):
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"
    restarts = sidecar_restarts = ready = 0
    last_restart = sidecar_last = ""
    initializing = False
    init_statuses = _items(status, "initContainerStatuses")
    for i, container in enumerate(init_statuses):
        state, finished = _part(container, "state"), _part(_part(container, "lastState"), "terminated")
        restarts += _int(container.get("restartCount"))
        last_restart = _later(last_restart, finished.get("finishedAt"))
        sidecar = _restartable_init(init_specs.get(str(container.get("name"))))
        if sidecar:
            sidecar_restarts += _int(container.get("restartCount"))
            sidecar_last = _later(sidecar_last, finished.get("finishedAt"))
        terminated, waiting = _part(state, "terminated"), _part(state, "waiting")
        if terminated and _int(terminated.get("exitCode")) == 0:
            continue
        if sidecar and container.get("started") is True:
            ready += 1 if container.get("ready") else 0
            continue
        if terminated:
            reason = _terminated_reason(terminated, "Init:")
        elif waiting.get("reason") and waiting.get("reason") != "PodInitializing":
            reason = f"Init:{waiting['reason']}"
        else:
            reason = f"Init:{i}/{len(init_specs)}"
        initializing = True
        break
    initialized = any(
        c.get("type") == "Initialized" and c.get("status") == "True" for c in _items(status, "conditions")
    )
    if not initializing or initialized:
        restarts, last_restart = sidecar_restarts, sidecar_last
        running = False
        for container in reversed(_items(status, "containerStatuses")):
            state, finished = _part(container, "state"), _part(_part(container, "lastState"), "terminated")
            restarts += _int(container.get("restartCount"))
            last_restart = _later(last_restart, finished.get("finishedAt"))
            waiting, terminated = _part(state, "waiting"), _part(state, "terminated")
            if waiting.get("reason"):
                reason = str(waiting["reason"])
            elif terminated:
                reason = _terminated_reason(terminated)
            elif container.get("ready") and "running" in state:
                running = True
                ready += 1
        if reason == "Completed" and running:
            pod_ready = any(
                c.get("type") == "Ready" and c.get("status") == "True" for c in _items(status, "conditions")
            )
            reason = "Running" if pod_ready else "NotReady"
    if meta.get("deletionTimestamp") and status.get("reason") == "NodeLost":
        reason = "Unknown"
    elif meta.get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
        reason = "Terminating"
    restarts_text = str(restarts)
    if restarts and last_restart:
        restarts_text = f"{restarts} ({_age(last_restart, now)} ago)"
    pod_ips = _items(status, "podIPs")
    gates = [str(g.get("conditionType")) for g in _items(spec, "readinessGates")]
    gates_text = "<none>"
    if gates:
        true = {str(c.get("type")) for c in _items(status, "conditions") if c.get("status") == "True"}
        gates_text = f"{sum(1 for g in gates if g in true)}/{len(gates)}"
    return [
        meta.get("name"),
        f"{ready}/{total}",
        reason,
        restarts_text,
        _age(meta.get("creationTimestamp"), now),
        str(pod_ips[0].get("ip")) if pod_ips and pod_ips[0].get("ip") else "<none>",
        str(spec.get("nodeName") or "<none>"),
        str(status.get("nominatedNodeName") or "<none>"),
        gates_text,
    ]


def deployment_cells(deploy: Obj, now: datetime.datetime) -> list[Any]:
    spec, status, meta = _part(deploy, "spec"), _part(deploy, "status"), _meta(deploy)
    desired = _int(spec.get("replicas", 1))
    return [
        meta.get("name"),
        f"{_int(status.get('readyReplicas'))}/{desired}",
        _int(status.get("updatedReplicas")),
        _int(status.get("availableReplicas")),
        _age(meta.get("creationTimestamp"), now),
        *_containers_cells(_part(_part(spec, "template"), "spec")),
        _format_selector(_part(spec, "selector")),
    ]


def replicaset_cells(rs: Obj, now: datetime.datetime) -> list[Any]:
    spec, status, meta = _part(rs, "spec"), _part(rs, "status"), _meta(rs)
    return [
        meta.get("name"),
        _int(spec.get("replicas", 1)),
        _int(status.get("replicas")),
        _int(status.get("readyReplicas")),
        _age(meta.get("creationTimestamp"), now),
        *_containers_cells(_part(_part(spec, "template"), "spec")),
        _format_selector(_part(spec, "selector")),
    ]


def namespace_cells(ns: Obj, now: datetime.datetime) -> list[Any]:
    meta = _meta(ns)
    return [
        meta.get("name"),
        str(_part(ns, "status").get("phase") or ""),
        _age(meta.get("creationTimestamp"), now),
    ]


def _external_ip(spec: Mapping[str, Any], status: Mapping[str, Any]) -> str:
    kind, external = str(spec.get("type") or "ClusterIP"), [str(ip) for ip in spec.get("externalIPs") or []]
    if kind in ("ClusterIP", "NodePort"):
        return ",".join(external) or "<none>"
    if kind == "LoadBalancer":
        ingress = _items(_part(status, "loadBalancer"), "ingress")
        lb = sorted(
            {str(i.get("ip") or i.get("hostname")) for i in ingress if i.get("ip") or i.get("hostname")}
        )
        return ",".join(lb + external) or "<pending>"
    if kind == "ExternalName":
        return str(spec.get("externalName") or "")
    return "<unknown>"


def service_cells(svc: Obj, now: datetime.datetime) -> list[Any]:
    spec, meta = _part(svc, "spec"), _meta(svc)
    ports = []
    for port in _items(spec, "ports"):
        node_port = _int(port.get("nodePort"))
        number = f"{_int(port.get('port'))}:{node_port}" if node_port else str(_int(port.get("port")))
        ports.append(f"{number}/{port.get('protocol') or 'TCP'}")
    cluster_ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    return [
        meta.get("name"),
        str(spec.get("type") or "ClusterIP"),
        str(cluster_ips[0]) if cluster_ips else "<none>",
        _external_ip(spec, _part(svc, "status")),
        ",".join(ports) or "<none>",
        _age(meta.get("creationTimestamp"), now),
        _format_labels(_part(spec, "selector")),
    ]


def _default_cells(obj: Obj, now: datetime.datetime) -> list[Any]:
    return [_meta(obj).get("name"), _age(_meta(obj).get("creationTimestamp"), now)]


_WORKLOAD_WIDE = (
    Column("Containers", priority=1, description="Names of each container in the template."),
    Column("Images", priority=1, description="Images referenced by each container in the template."),
    Column("Selector", priority=1, description="Label selector for pods."),
)

BUILTIN_PRINTERS: dict[tuple[str, str], Printer] = {
    ("", "pods"): Printer(
        (
            _NAME,
            Column("Ready", description="The aggregate readiness state of this pod for accepting traffic."),
            Column("Status", description="The aggregate status of the containers in this pod."),
            Column(
                "Restarts",
                description="The number of times the containers in this pod have been restarted "
                "and when the last container in this pod has restarted.",
            ),
            _AGE,
            Column("IP", priority=1, description="podIP address allocated to the pod."),
            Column("Node", priority=1, description="NodeName of the node the pod is scheduled onto."),
            Column("Nominated Node", priority=1, description="nominatedNodeName of the pod."),
            Column("Readiness Gates", priority=1, description="Readiness gates of the pod."),
        ),
        pod_cells,
    ),
    ("apps", "deployments"): Printer(
        (
            _NAME,
            Column("Ready", description="Number of the pod with ready state"),
            Column(
                "Up-to-date",
                description="Total number of non-terminated pods targeted by this deployment "
                "that have the desired template spec.",
            ),
            Column(
                "Available",
                description="Total number of available non-terminating pods targeted by "
                "this deployment for at least minReadySeconds.",
            ),
            _AGE,
            *_WORKLOAD_WIDE,
        ),
        deployment_cells,
    ),
    ("apps", "replicasets"): Printer(
        (
            _NAME,
            Column("Desired", type="integer", description="Replicas is the number of desired replicas."),
            Column(
                "Current",
                type="integer",
                description="Replicas is the most recently observed number of replicas.",
            ),
            Column("Ready", type="integer", description="The number of ready replicas for this replica set."),
            _AGE,
            *_WORKLOAD_WIDE,
        ),
        replicaset_cells,
    ),
    ("", "namespaces"): Printer(
        (_NAME, Column("Status", description="The status of the namespace"), _AGE), namespace_cells
    ),
    ("", "services"): Printer(
        (
            _NAME,
            Column("Type", description="type determines how the Service is exposed."),
            Column("Cluster-IP", description="clusterIP is the IP address of the service."),
            Column(
                "External-IP",
                description="externalIPs is a list of IP addresses for which nodes in "
                "the cluster will also accept traffic for this service.",
            ),
            Column("Port(s)", description="The list of ports that are exposed by this service."),
            _AGE,
            Column(
                "Selector",
                priority=1,
                description="Route service traffic to pods with label keys "
                "and values matching this selector.",
            ),
        ),
        service_cells,
    ),
}

DEFAULT_PRINTER = Printer((_NAME, _AGE), _default_cells)

"""Table responses (``kubectl get``): the request kubectl sends, the Table the emulator answers."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from tests.sandbox.conftest import call

from prefixtune.sandbox.emulator import RealisticEmulator, jsonpath, printers, tables

# What kubectl's human-readable get sends (kubernetes/kubectl pkg/cmd/get/get.go, transformRequests).
KUBECTL_GET = {
    "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
}
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
GADGETS = "/apis/example.dev/v1/namespaces/default/gadgets"
NOW = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
COLUMNS = [
    {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
    {"name": "Size", "type": "integer", "jsonPath": ".spec.size", "priority": 1},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Score", "type": "number", "jsonPath": ".status.score", "format": "float"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def gadget_crd(columns: list[dict[str, Any]] | None) -> dict[str, Any]:
    version: dict[str, Any] = {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    }
    if columns is not None:
        version["additionalPrinterColumns"] = columns
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.dev"},
        "spec": {
            "group": "example.dev",
            "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
            "versions": [version],
        },
    }


async def test_a_custom_resource_list_is_a_table_of_its_printer_columns(em: RealisticEmulator) -> None:
    assert (await call(em, "POST", CRDS, json=gadget_crd(COLUMNS)))[0] == 201
    body = {"metadata": {"name": "g1"}, "spec": {"color": "red", "size": 3}}
    assert (await call(em, "POST", GADGETS, json=body))[0] == 201
    status = {"conditions": [{"type": "Other", "status": "False"}, {"type": "Ready", "status": "True"}],
              "score": 2}  # fmt: skip
    assert (await call(em, "PATCH", f"{GADGETS}/g1", json={"status": status},
                       headers={"Content-Type": "application/merge-patch+json"}))[0] == 200  # fmt: skip
    code, table = await call(em, "GET", GADGETS, headers=KUBECTL_GET)
    assert code == 200 and table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    names = [(c["name"], c["type"], c["priority"]) for c in table["columnDefinitions"]]
    assert names == [("Name", "string", 0), ("Color", "string", 0), ("Size", "integer", 1),
                     ("Ready", "string", 0), ("Score", "number", 0), ("Age", "date", 0)]  # fmt: skip
    assert table["columnDefinitions"][0]["format"] == "name"
    [row] = table["rows"]
    assert row["cells"][:5] == ["g1", "red", 3, "True", 2.0]
    assert row["cells"][5].endswith("s")  # a fresh object's short age
    assert row["object"]["kind"] == "PartialObjectMetadata" and row["object"]["metadata"]["name"] == "g1"
    assert "spec" not in row["object"]
    assert table["metadata"]["resourceVersion"] == str(em.resource_version)


async def test_a_missing_value_is_a_null_cell_and_a_get_is_a_one_row_table(em: RealisticEmulator) -> None:
    await call(em, "POST", CRDS, json=gadget_crd(COLUMNS))
    await call(em, "POST", GADGETS, json={"metadata": {"name": "bare"}, "spec": {"size": "big"}})
    code, table = await call(em, "GET", f"{GADGETS}/bare", headers=KUBECTL_GET)
    assert code == 200 and len(table["rows"]) == 1
    # no color, a size that is not an integer, no status: nulls (kubectl prints <none>)
    assert table["rows"][0]["cells"][:5] == ["bare", None, None, None, None]


async def test_a_crd_without_printer_columns_gets_name_and_age(em: RealisticEmulator) -> None:
    await call(em, "POST", CRDS, json=gadget_crd(None))
    await call(em, "POST", GADGETS, json={"metadata": {"name": "g"}})
    _, table = await call(em, "GET", GADGETS, headers=KUBECTL_GET)
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Age"]
    assert table["columnDefinitions"][1]["type"] == "date"


async def test_plain_json_without_the_table_accept_header(em: RealisticEmulator) -> None:
    await call(em, "POST", CRDS, json=gadget_crd(COLUMNS))
    await call(em, "POST", GADGETS, json={"metadata": {"name": "g"}})
    _, listed = await call(em, "GET", GADGETS, headers={"Accept": "application/json"})
    assert listed["kind"] == "GadgetList"
    _, first_json = await call(
        em,
        "GET",
        GADGETS,
        headers={"Accept": "application/json,application/json;as=Table;v=v1;g=meta.k8s.io"},
    )
    assert first_json["kind"] == "GadgetList"


@pytest.mark.parametrize(
    ("include", "expected"),
    [("Object", "Gadget"), ("None", None), ("Metadata", "PartialObjectMetadata")],
)
async def test_include_object_chooses_what_a_row_carries(
    em: RealisticEmulator, include: str, expected: str | None
) -> None:
    await call(em, "POST", CRDS, json=gadget_crd(COLUMNS))
    await call(em, "POST", GADGETS, json={"metadata": {"name": "g"}, "spec": {"color": "blue"}})
    _, table = await call(em, "GET", f"{GADGETS}?includeObject={include}", headers=KUBECTL_GET)
    row = table["rows"][0]
    assert (row.get("object") or {}).get("kind") == expected


async def test_an_unknown_include_object_is_a_bad_request(em: RealisticEmulator) -> None:
    code, body = await call(em, "GET", "/api/v1/namespaces?includeObject=All", headers=KUBECTL_GET)
    assert code == 400 and "includeObject" in body["message"]


async def test_a_v1beta1_only_client_gets_a_v1beta1_table(em: RealisticEmulator) -> None:
    accept = {"Accept": "application/json;as=Table;v=v1beta1;g=meta.k8s.io"}
    _, table = await call(em, "GET", "/api/v1/namespaces", headers=accept)
    assert table["apiVersion"] == "meta.k8s.io/v1beta1"
    assert {r["cells"][0] for r in table["rows"]} == {"default", "kube-public", "kube-system"}
    assert {r["cells"][1] for r in table["rows"]} == {"Active"}


async def test_deployments_and_pods_get_their_built_in_columns(em: RealisticEmulator) -> None:
    deploy = {
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}},
        },
    }  # fmt: skip
    assert (await call(em, "POST", "/apis/apps/v1/namespaces/default/deployments", json=deploy))[0] == 201
    _, table = await call(em, "GET", "/apis/apps/v1/namespaces/default/deployments", headers=KUBECTL_GET)
    assert [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0] == [
        "Name", "Ready", "Up-to-date", "Available", "Age"
    ]  # fmt: skip
    assert table["rows"][0]["cells"][:4] == ["web", "0/2", 0, 0]
    assert table["rows"][0]["cells"][5:] == ["c", "nginx:1", "app=web"]
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    await call(em, "POST", "/api/v1/namespaces/default/pods", json=pod)
    _, table = await call(em, "GET", "/api/v1/namespaces/default/pods/p", headers=KUBECTL_GET)
    assert [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0] == [
        "Name", "Ready", "Status", "Restarts", "Age"
    ]  # fmt: skip
    assert table["rows"][0]["cells"][:2] == ["p", "0/1"]


def _pod(status: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "creationTimestamp": "2026-01-02T03:00:00Z", **meta},
        "spec": {"containers": [{"name": "a"}, {"name": "b"}], "initContainers": [{"name": "init"}]},
        "status": status,
    }


def test_a_running_ready_pod_with_restarts_says_when_it_last_restarted() -> None:
    running = {"running": {}}
    status = {
        "phase": "Running",
        "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}],
        "initContainerStatuses": [{"name": "init", "state": {"terminated": {"exitCode": 0}}}],
        "containerStatuses": [
            {"name": "a", "ready": True, "state": running, "restartCount": 2,
             "lastState": {"terminated": {"finishedAt": "2026-01-02T03:01:05Z"}}},
            {"name": "b", "ready": True, "state": running, "restartCount": 1},
        ],
        "podIPs": [{"ip": "10.0.0.7"}],
    }  # fmt: skip
    cells = printers.pod_cells(_pod(status), NOW)
    assert cells[:5] == ["p", "2/2", "Running", "3 (3m ago)", "4m5s"]
    assert cells[5] == "10.0.0.7"


def test_a_crash_looping_container_names_its_waiting_reason() -> None:
    status = {
        "phase": "Running",
        "containerStatuses": [
            {"name": "a", "ready": False, "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            {"name": "b", "ready": True, "state": {"running": {}}},
        ],
    }
    assert printers.pod_cells(_pod(status), NOW)[1:3] == ["1/2", "CrashLoopBackOff"]


def test_an_initializing_pod_counts_its_init_containers() -> None:
    status = {"phase": "Pending", "initContainerStatuses": [{"name": "init", "state": {"running": {}}}]}
    assert printers.pod_cells(_pod(status), NOW)[2] == "Init:0/1"
    failed = {
        "phase": "Pending",
        "initContainerStatuses": [{"name": "init", "state": {"terminated": {"exitCode": 3}}}],
    }
    assert printers.pod_cells(_pod(failed), NOW)[2] == "Init:ExitCode:3"


def test_a_deleted_pod_is_terminating_and_a_fresh_one_is_pending() -> None:
    pending = {"phase": "Pending"}
    assert printers.pod_cells(_pod(pending), NOW)[2] == "Pending"
    deleted = _pod(pending, deletionTimestamp="2026-01-02T03:04:00Z")
    assert printers.pod_cells(deleted, NOW)[2] == "Terminating"
    done = {
        "phase": "Succeeded",
        "containerStatuses": [{"name": "a", "state": {"terminated": {"reason": "Completed"}}}],
    }
    assert printers.pod_cells(_pod(done, deletionTimestamp="2026-01-02T03:04:00Z"), NOW)[2] == "Completed"


@pytest.mark.parametrize(
    ("seconds", "long", "short"),
    [(-5, "<invalid>", "<invalid>"), (-1, "0s", "0s"), (59, "59s", "59s"), (119, "119s", "1m"),
     (125, "2m5s", "2m"), (600, "10m", "10m"), (3 * 3600 + 20 * 60, "3h20m", "3h"),
     (30 * 3600, "30h", "1d"), (98 * 3600, "4d2h", "4d"), (400 * 86400, "400d", "1y"),
     (3 * 365 * 86400 + 86400, "3y1d", "3y"), (9 * 365 * 86400, "9y", "9y")],
)  # fmt: skip
def test_ages_follow_apimachinery_durations(seconds: int, long: str, short: str) -> None:
    assert printers.human_duration(seconds) == long
    assert printers.short_human_duration(seconds) == short


@pytest.mark.parametrize(
    ("accept", "version"),
    [("application/json", None), ("", None), ("application/json;as=Table;v=v2;g=meta.k8s.io", None),
     ("application/json;as=Table;v=v1;g=other.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io",
      tables.TableVersion.V1BETA1),
     ("application/json;as=Table;v=v1;g=meta.k8s.io", tables.TableVersion.V1)],
)  # fmt: skip
def test_the_accept_header_picks_the_table_version(accept: str, version: tables.TableVersion | None) -> None:
    assert tables.requested_table(accept) == version


def test_a_printer_column_outside_the_jsonpath_subset_is_null_not_an_error() -> None:
    printer = printers.crd_printer([{"name": "X", "type": "string", "jsonPath": ".spec..deep"}])
    assert printer.cells({"metadata": {"name": "n"}, "spec": {"deep": 1}}, NOW) == ["n", None]
    with pytest.raises(jsonpath.JsonPathError):
        jsonpath.JsonPath.parse(".spec..deep")

"""RealisticEmulator behaviours, each over real HTTP with an aiohttp client."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from tests.sandbox.conftest import call

from prefixtune.sandbox.emulator import RealisticEmulator, kubeconfig, serve_emulator, write_kubeconfig

CMS = "/api/v1/namespaces/default/configmaps"
DEPLOYS = "/apis/apps/v1/namespaces/default/deployments"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
WIDGETS = "/apis/example.dev/v1/namespaces/default/widgets"
MERGE = {"Content-Type": "application/merge-patch+json"}
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
JSONPATCH = {"Content-Type": "application/json-patch+json"}


SCALE_PATHS = {
    "specReplicasPath": ".spec.replicas",
    "statusReplicasPath": ".status.replicas",
    "labelSelectorPath": ".status.selector",
}


def widget_crd(
    status: bool = True, served: tuple[str, ...] = ("v1",), scale: dict[str, str] | None = None
) -> dict[str, Any]:
    subresources: dict[str, Any] = {"status": {}} if status else {}
    if scale is not None:
        subresources["scale"] = scale
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.dev"},
        "spec": {
            "group": "example.dev",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [
                {
                    "name": v,
                    "served": True,
                    "storage": i == 0,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                    **({"subresources": subresources} if subresources else {}),
                }
                for i, v in enumerate(served)
            ],
        },
    }


async def make_cm(em: RealisticEmulator, name: str | None = "cm", **extra: Any) -> dict[str, Any]:
    meta = {"name": name, **extra} if name else extra
    status, body = await call(em, "POST", CMS, json={"metadata": meta, "data": {"k": "v"}})
    assert status == 201, body
    return dict(body)


async def watch(em: RealisticEmulator, path: str, query: str) -> tuple[str, list[dict[str, Any]]]:
    async with em.get(f"{path}?watch=true&{query}") as response:
        assert response.status == 200
        text = await response.text()
        return response.headers["Content-Type"], [
            json.loads(line) for line in text.splitlines() if line.strip()
        ]


async def test_create_assigns_server_metadata(em: RealisticEmulator) -> None:
    body = await make_cm(em, "a")
    meta = body["metadata"]
    assert meta["namespace"] == "default"  # from the URL
    assert len(meta["uid"]) == 36 and meta["generation"] == 1
    assert meta["creationTimestamp"].endswith("Z")
    assert body["kind"] == "ConfigMap" and body["apiVersion"] == "v1"
    second = await make_cm(em, "b")
    assert (
        int(second["metadata"]["resourceVersion"]) == int(meta["resourceVersion"]) + 1
    )  # one global counter
    assert second["metadata"]["uid"] != meta["uid"]
    generated = [await make_cm(em, None, generateName="cfg-") for _ in range(3)]
    names = {g["metadata"]["name"] for g in generated}
    assert len(names) == 3 and all(n.startswith("cfg-") and len(n) == 9 for n in names)
    assert em.objects["v1/configmaps", "default", "a"] >= {
        "metadata": {"uid": meta["uid"]},
        "data": {"k": "v"},
    }


async def test_create_errors_are_canonical_statuses(em: RealisticEmulator) -> None:
    await make_cm(em, "dup")
    status, body = await call(em, "POST", CMS, json={"metadata": {"name": "dup"}})
    assert (status, body["reason"], body["code"]) == (409, "AlreadyExists", 409)
    assert body["details"] == {"name": "dup", "group": "", "kind": "configmaps"}
    status, body = await call(em, "POST", CMS, json={"metadata": {}})
    assert (status, body["reason"]) == (422, "Invalid") and "generateName" in body["message"]
    status, body = await call(em, "POST", CMS, json={"metadata": {"name": "Bad_Name"}})
    assert (status, body["reason"]) == (422, "Invalid") and "RFC 1123" in body["message"]
    status, body = await call(
        em, "POST", "/apis/nope.dev/v1/namespaces/default/things", json={"metadata": {"name": "x"}}
    )
    assert (status, body["reason"]) == (404, "NotFound")
    status, body = await call(em, "GET", f"{CMS}/missing")
    assert (status, body["reason"], body["message"]) == (404, "NotFound", 'configmaps "missing" not found')
    status, body = await call(em, "POST", CMS, json={"metadata": {"name": "x", "namespace": "other"}})
    assert (status, body["reason"]) == (400, "BadRequest")
    status, body = await call(em, "POST", CMS, json={"kind": "Secret", "metadata": {"name": "x"}})
    assert (status, body["reason"]) == (400, "BadRequest")
    status, body = await call(
        em, "POST", CMS, data=b"\x0a\x02k8s", headers={"Content-Type": "application/vnd.kubernetes.protobuf"}
    )
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")
    kubectl_create = b"k8s\x00\n\x15\n\x07apps/v1\x12\nDeployment\x12\xab\x01"  # not UTF-8
    protobuf = {"Content-Type": "application/vnd.kubernetes.protobuf"}
    status, body = await call(em, "POST", DEPLOYS, data=kubectl_create, headers=protobuf)
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")


async def test_every_write_bumps_rv_and_stale_rv_conflicts(em: RealisticEmulator) -> None:
    created = await make_cm(em)
    rv1 = created["metadata"]["resourceVersion"]
    status, patched = await call(em, "PATCH", f"{CMS}/cm", json={"data": {"k": "w"}}, headers=MERGE)
    assert status == 200 and int(patched["metadata"]["resourceVersion"]) > int(rv1)
    stale = {"metadata": {"resourceVersion": rv1}, "data": {"k": "z"}}
    status, body = await call(em, "PATCH", f"{CMS}/cm", json=stale, headers=MERGE)
    assert (status, body["reason"]) == (409, "Conflict") and "has been modified" in body["message"]
    status, body = await call(em, "PUT", f"{CMS}/cm", json={**created, "data": {"k": "put"}})
    assert (status, body["reason"]) == (409, "Conflict")  # created carries the old resourceVersion
    fresh = {**patched, "data": {"k": "put"}}
    status, body = await call(em, "PUT", f"{CMS}/cm", json=fresh)
    assert status == 200 and body["data"] == {"k": "put"}
    assert body["metadata"]["uid"] == created["metadata"]["uid"]
    # A no-op write changes nothing, as on the real server.
    status, same = await call(em, "PATCH", f"{CMS}/cm", json={"data": {"k": "put"}}, headers=MERGE)
    assert same["metadata"]["resourceVersion"] == body["metadata"]["resourceVersion"]
    status, body = await call(em, "PUT", f"{CMS}/other", json={"metadata": {"name": "other"}})
    assert (status, body["reason"]) == (404, "NotFound")
    status, body = await call(em, "PUT", f"{CMS}/cm", json={"metadata": {"name": "renamed"}})
    assert (status, body["reason"]) == (400, "BadRequest")


async def test_json_patch_test_failure_is_422(em: RealisticEmulator) -> None:
    created = await make_cm(em)
    rv = created["metadata"]["resourceVersion"]
    ok = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/finalizers", "value": ["x"]},
    ]
    status, body = await call(em, "PATCH", f"{CMS}/cm", json=ok, headers=JSONPATCH)
    assert status == 200 and body["metadata"]["finalizers"] == ["x"]
    status, body = await call(em, "PATCH", f"{CMS}/cm", json=ok, headers=JSONPATCH)  # rv is stale now
    assert (status, body["reason"]) == (422, "Invalid")
    status, body = await call(em, "PATCH", f"{CMS}/cm", json={"op": "add"}, headers=JSONPATCH)
    assert (status, body["reason"]) == (400, "BadRequest")
    status, body = await call(
        em, "PATCH", f"{CMS}/cm", json={}, headers={"Content-Type": "application/apply-patch+yaml"}
    )
    assert status == 415


async def test_strategic_merge_keeps_image_and_sidecar_and_bumps_generation(em: RealisticEmulator) -> None:
    deployment = {
        "metadata": {"name": "app"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "x"}},
            "template": {
                "metadata": {"labels": {"app": "x"}},
                "spec": {
                    "containers": [
                        {"name": "engine", "image": "vllm:1", "args": ["--a"]},
                        {"name": "sidecar", "image": "proxy:1"},
                    ]
                },
            },
        },
        "status": {"replicas": 99},
    }
    status, created = await call(em, "POST", DEPLOYS, json=deployment)
    assert status == 201 and created["status"] == {}  # a status subresource: the struct, empty on create
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "engine", "args": ["--b"]}]}}}}
    status, body = await call(em, "PATCH", f"{DEPLOYS}/app", json=patch, headers=STRATEGIC)
    assert status == 200
    containers = body["spec"]["template"]["spec"]["containers"]
    assert containers == [
        {"name": "engine", "image": "vllm:1", "args": ["--b"]},
        {"name": "sidecar", "image": "proxy:1"},
    ]
    assert body["metadata"]["generation"] == 2
    # A merge patch replaces the list, exactly as the real server does.
    status, body = await call(em, "PATCH", f"{DEPLOYS}/app", json=patch, headers=MERGE)
    assert body["spec"]["template"]["spec"]["containers"] == [{"name": "engine", "args": ["--b"]}]
    assert body["metadata"]["generation"] == 3
    # Metadata-only changes do not bump the generation.
    status, body = await call(
        em, "PATCH", f"{DEPLOYS}/app", json={"metadata": {"labels": {"l": "1"}}}, headers=MERGE
    )
    assert body["metadata"]["generation"] == 3


async def test_status_subresource_is_isolated(em: RealisticEmulator) -> None:
    status, _ = await call(em, "POST", CRDS, json=widget_crd())
    assert status == 201
    status, created = await call(
        em, "POST", WIDGETS, json={"metadata": {"name": "w"}, "spec": {"size": 1}, "status": {"x": 1}}
    )
    assert status == 201 and "status" not in created
    status, body = await call(
        em,
        "PATCH",
        f"{WIDGETS}/w/status",
        json={"spec": {"size": 5}, "status": {"phase": "Up"}},
        headers=MERGE,
    )
    assert status == 200 and body["status"] == {"phase": "Up"} and body["spec"] == {"size": 1}
    assert body["metadata"]["generation"] == 1  # status writes never bump the generation
    status, body = await call(
        em, "PATCH", f"{WIDGETS}/w", json={"spec": {"size": 2}, "status": {"phase": "Down"}}, headers=MERGE
    )
    assert (
        body["status"] == {"phase": "Up"}
        and body["spec"] == {"size": 2}
        and body["metadata"]["generation"] == 2
    )
    status, body = await call(em, "PUT", f"{WIDGETS}/w/status", json={**body, "status": {"phase": "Put"}})
    assert status == 200 and body["status"] == {"phase": "Put"}
    status, body = await call(em, "GET", f"{WIDGETS}/w/status")
    assert status == 200 and body["status"] == {"phase": "Put"}
    # Strategic merge patch is not allowed on custom resources (the real server answers 415).
    status, body = await call(em, "PATCH", f"{WIDGETS}/w", json={"spec": {"size": 3}}, headers=STRATEGIC)
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")
    status, body = await call(em, "PATCH", f"{CMS}/x/scale", json={}, headers=MERGE)
    assert status == 404


async def test_scale_subresource_reads_the_paths_and_writes_only_spec_replicas(em: RealisticEmulator) -> None:
    """As apiextensions-apiserver's ScaleREST: an autoscaling/v1 Scale of the resource's metadata,
    spec replicas and status replicas/selector; a write changes the resource's spec replicas only
    (its generation too), the Scale's resourceVersion is a precondition."""
    status, _ = await call(em, "POST", CRDS, json=widget_crd(scale=SCALE_PATHS))
    assert status == 201
    status, listing = await call(em, "GET", "/apis/example.dev/v1")
    entry = {r["name"]: r for r in listing["resources"]}["widgets/scale"]
    assert (entry["kind"], entry["group"], entry["version"]) == ("Scale", "autoscaling", "v1")
    spec = {"replicas": 2, "size": 7}
    status, created = await call(em, "POST", WIDGETS, json={"metadata": {"name": "w"}, "spec": spec})
    assert status == 201
    status, _ = await call(
        em,
        "PATCH",
        f"{WIDGETS}/w/status",
        json={"status": {"replicas": 1, "selector": "app=w"}},
        headers=MERGE,
    )
    assert status == 200
    status, scale = await call(em, "GET", f"{WIDGETS}/w/scale")
    meta = created["metadata"]
    assert status == 200 and (scale["apiVersion"], scale["kind"]) == ("autoscaling/v1", "Scale")
    assert {k: scale["metadata"][k] for k in ("name", "namespace", "uid", "creationTimestamp")} == {
        k: meta[k] for k in ("name", "namespace", "uid", "creationTimestamp")
    }
    assert int(scale["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])  # the status write
    assert scale["spec"] == {"replicas": 2} and scale["status"] == {"replicas": 1, "selector": "app=w"}

    # A merge patch of the Scale: its status is ignored, the resource's other fields are kept.
    patch = {"spec": {"replicas": 5}, "status": {"replicas": 9}}
    status, scale = await call(em, "PATCH", f"{WIDGETS}/w/scale", json=patch, headers=MERGE)
    assert status == 200 and scale["spec"] == {"replicas": 5} and scale["status"]["replicas"] == 1
    status, widget = await call(em, "GET", f"{WIDGETS}/w")
    assert widget["spec"] == {"replicas": 5, "size": 7} and widget["metadata"]["generation"] == 2
    assert widget["status"] == {"replicas": 1, "selector": "app=w"}
    assert scale["metadata"]["resourceVersion"] == widget["metadata"]["resourceVersion"]

    # PUT (what an HPA sends): a stale resourceVersion conflicts, the current one succeeds.
    stale = {**scale, "metadata": {**scale["metadata"], "resourceVersion": meta["resourceVersion"]}}
    status, body = await call(em, "PUT", f"{WIDGETS}/w/scale", json={**stale, "spec": {"replicas": 1}})
    assert (status, body["reason"]) == (409, "Conflict")
    status, scale = await call(em, "PUT", f"{WIDGETS}/w/scale", json={**scale, "spec": {"replicas": 3}})
    assert status == 200 and scale["spec"] == {"replicas": 3}
    ops = [{"op": "replace", "path": "/spec/replicas", "value": 4}]
    status, scale = await call(em, "PATCH", f"{WIDGETS}/w/scale", json=ops, headers=JSONPATCH)
    assert status == 200 and scale["spec"] == {"replicas": 4}
    status, body = await call(em, "PUT", f"{WIDGETS}/w/scale", json={"kind": "Widget", "spec": {}})
    assert status == 400
    status, body = await call(em, "DELETE", f"{WIDGETS}/w/scale")
    assert status == 405
    status, widget = await call(em, "GET", f"{WIDGETS}/w")
    assert widget["spec"] == {"replicas": 4, "size": 7} and widget["metadata"]["generation"] == 4


async def test_scale_without_spec_replicas_or_without_the_subresource(em: RealisticEmulator) -> None:
    bad = widget_crd(scale={"specReplicasPath": ".status.replicas", "statusReplicasPath": ".status.r"})
    status, body = await call(em, "POST", CRDS, json=bad)
    assert (status, body["reason"]) == (422, "Invalid") and "specReplicasPath" in body["message"]
    status, _ = await call(em, "POST", CRDS, json=widget_crd(scale=SCALE_PATHS))
    assert status == 201
    status, _ = await call(em, "POST", WIDGETS, json={"metadata": {"name": "w"}, "spec": {"size": 1}})
    assert status == 201
    status, body = await call(em, "GET", f"{WIDGETS}/w/scale")  # no default without a schema
    assert (status, body["reason"]) == (500, "InternalError") and ".spec.replicas" in body["message"]
    labels = {"metadata": {"labels": {"a": "b"}}}
    status, body = await call(em, "PATCH", f"{WIDGETS}/w/scale", json=labels, headers=MERGE)
    assert status == 400 and "cannot be empty" in body["message"]
    status, scale = await call(
        em, "PATCH", f"{WIDGETS}/w/scale", json={"spec": {"replicas": 2}}, headers=MERGE
    )
    assert status == 200 and scale["spec"] == {"replicas": 2} and scale["status"] == {"replicas": 0}
    status, _ = await call(em, "PUT", f"{CRDS}/widgets.example.dev", json=widget_crd())
    assert status == 200
    status, body = await call(em, "GET", f"{WIDGETS}/w/scale")  # the CRD no longer declares it
    assert status == 404


async def test_finalizers_delay_deletion(em: RealisticEmulator) -> None:
    await make_cm(em, "f", finalizers=["example.dev/guard"])
    status, body = await call(em, "DELETE", f"{CMS}/f")
    assert status == 200 and body["metadata"]["deletionTimestamp"]
    status, body = await call(em, "GET", f"{CMS}/f")
    assert status == 200
    status, body = await call(
        em, "PATCH", f"{CMS}/f", json={"metadata": {"finalizers": ["a", "example.dev/guard"]}}, headers=MERGE
    )
    assert (status, body["reason"]) == (422, "Invalid") and "no new finalizers" in body["message"]
    status, body = await call(em, "PATCH", f"{CMS}/f", json={"metadata": {"finalizers": None}}, headers=MERGE)
    assert status == 200
    status, body = await call(em, "GET", f"{CMS}/f")
    assert status == 404
    assert em.objects["v1/configmaps", "default", "f"].deleted


async def test_delete_preconditions_and_status_success(em: RealisticEmulator) -> None:
    created = await make_cm(em)
    status, body = await call(em, "DELETE", f"{CMS}/cm", json={"preconditions": {"uid": "nope"}})
    assert (status, body["reason"]) == (409, "Conflict")
    status, body = await call(em, "DELETE", f"{CMS}/cm", json={"propagationPolicy": "Sideways"})
    assert status == 400 and "Orphan, Background, Foreground" in body["message"]
    status, body = await call(
        em, "DELETE", f"{CMS}/cm", json={"preconditions": {"uid": created["metadata"]["uid"]}}
    )
    assert status == 200 and body["kind"] == "Status" and body["status"] == "Success"
    status, body = await call(em, "DELETE", f"{CMS}/cm")
    assert (status, body["reason"]) == (404, "NotFound")


async def test_dry_run_changes_nothing(em: RealisticEmulator) -> None:
    status, body = await call(em, "POST", f"{CMS}?dryRun=All", json={"metadata": {"name": "dry"}})
    assert status == 201 and body["metadata"]["name"] == "dry"
    status, _ = await call(em, "GET", f"{CMS}/dry")
    assert status == 404
    created = await make_cm(em)
    status, body = await call(em, "PATCH", f"{CMS}/cm?dryRun=All", json={"data": {"k": "dry"}}, headers=MERGE)
    assert body["data"] == {"k": "dry"}
    status, body = await call(em, "GET", f"{CMS}/cm")
    assert body == created


async def test_list_selectors_kind_and_rv(em: RealisticEmulator) -> None:
    await make_cm(em, "a", labels={"app": "vllm", "tier": "gpu"})
    await make_cm(em, "b", labels={"app": "sglang"})
    assert (await call(em, "POST", "/api/v1/namespaces", json={"metadata": {"name": "other"}}))[0] == 201
    await call(
        em,
        "POST",
        "/api/v1/namespaces/other/configmaps",
        json={"metadata": {"name": "c", "labels": {"app": "vllm"}}},
    )

    async def names(query: str, path: str = CMS) -> list[str]:
        status, body = await call(em, "GET", f"{path}?{query}")
        assert status == 200, body
        return [item["metadata"]["name"] for item in body["items"]]

    status, body = await call(em, "GET", CMS)
    assert body["kind"] == "ConfigMapList" and body["apiVersion"] == "v1"
    assert body["metadata"]["resourceVersion"] == str(em.resource_version)
    assert await names("labelSelector=app%3Dvllm") == ["a"]
    assert await names("labelSelector=app%3Dvllm", "/api/v1/configmaps") == ["a", "c"]  # all namespaces
    assert await names("labelSelector=app%21%3Dvllm") == ["b"]
    assert await names("labelSelector=tier") == ["a"]
    assert await names("labelSelector=%21tier") == ["b"]
    assert await names("labelSelector=app+in+%28sglang%2Cx%29") == ["b"]
    assert await names("labelSelector=app+notin+%28sglang%29") == ["a"]
    assert await names("fieldSelector=metadata.name%3Db") == ["b"]
    assert await names("fieldSelector=metadata.namespace%3Dother", "/api/v1/configmaps") == ["c"]
    status, body = await call(em, "GET", f"{CMS}?labelSelector=app+in+%28x")
    assert (status, body["reason"]) == (400, "BadRequest") and "labelSelector" in body["message"]


async def test_watch_timeout_rv_and_content_type(em: RealisticEmulator) -> None:
    first = await make_cm(em, "a")
    second = await make_cm(em, "b")
    started = time.monotonic()
    ctype, events = await watch(em, CMS, "timeoutSeconds=0.3")
    assert 0.25 <= time.monotonic() - started < 2.0
    assert ctype == "application/json"
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a"), ("ADDED", "b")]
    # From a resourceVersion: only what happened after it, nothing older.
    await call(em, "PATCH", f"{CMS}/a", json={"data": {"k": "2"}}, headers=MERGE)
    _, events = await watch(
        em, CMS, f"timeoutSeconds=0.2&resourceVersion={second['metadata']['resourceVersion']}"
    )
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("MODIFIED", "a")]
    _, events = await watch(
        em, CMS, f"timeoutSeconds=0.2&resourceVersion={first['metadata']['resourceVersion']}"
    )
    assert [e["object"]["metadata"]["name"] for e in events] == ["b", "a"]


async def test_watch_initial_events_bookmark_and_live_events(em: RealisticEmulator) -> None:
    await make_cm(em, "a", labels={"app": "x"})

    async def writer() -> None:
        await asyncio.sleep(0.2)
        await make_cm(em, "b", labels={"app": "x"})
        await make_cm(em, "unlabelled")
        await call(em, "PATCH", f"{CMS}/a", json={"metadata": {"labels": {"app": "y"}}}, headers=MERGE)
        await call(
            em, "PATCH", f"{CMS}/unlabelled", json={"metadata": {"labels": {"app": "x"}}}, headers=MERGE
        )
        await call(em, "DELETE", f"{CMS}/b")

    task = asyncio.create_task(writer())
    query = (
        "timeoutSeconds=1&sendInitialEvents=true&allowWatchBookmarks=true"
        "&resourceVersionMatch=NotOlderThan&labelSelector=app%3Dx"
    )
    _, events = await watch(em, CMS, query)
    await task
    seen = [(e["type"], e["object"]["metadata"].get("name")) for e in events]
    assert seen == [
        ("ADDED", "a"),
        ("BOOKMARK", None),
        ("ADDED", "b"),
        ("DELETED", "a"),  # left the selector
        ("ADDED", "unlabelled"),  # entered the selector
        ("DELETED", "b"),
    ]
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_watch_too_old_rv_gives_410_error_event() -> None:
    async with serve_emulator(emulator=RealisticEmulator(watch_log_size=2)) as (em, _):
        for name in "abcd":
            await make_cm(em, name)
        _, events = await watch(em, CMS, "timeoutSeconds=1&resourceVersion=1")
        assert len(events) == 1 and events[0]["type"] == "ERROR"
        assert events[0]["object"]["code"] == 410 and events[0]["object"]["reason"] == "Expired"


async def test_crd_registration_and_removal(em: RealisticEmulator) -> None:
    status, body = await call(em, "GET", "/apis/example.dev/v1")
    assert status == 404
    status, crd = await call(em, "POST", CRDS, json=widget_crd(served=("v1", "v1beta1")))
    assert status == 201
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    assert crd["status"]["acceptedNames"]["kind"] == "Widget"
    status, group = await call(em, "GET", "/apis/example.dev")
    assert group["preferredVersion"]["version"] == "v1" and [v["version"] for v in group["versions"]] == [
        "v1",
        "v1beta1",
    ]
    status, listing = await call(em, "GET", "/apis/example.dev/v1")
    entries = {r["name"]: r for r in listing["resources"]}
    assert entries["widgets"]["kind"] == "Widget" and entries["widgets"]["namespaced"] is True
    assert entries["widgets"]["shortNames"] == ["wd"]
    assert (
        entries["widgets/status"]["verbs"] == ["get", "patch", "update"]
        and "shortNames" not in entries["widgets/status"]
    )
    status, _ = await call(em, "POST", WIDGETS, json={"metadata": {"name": "w"}, "spec": {}})
    assert status == 201
    bad = widget_crd()
    bad["metadata"]["name"] = "wrong.example.dev"
    status, body = await call(em, "POST", CRDS, json=bad)
    assert (status, body["reason"]) == (422, "Invalid")
    # Replacing the CRD with one version fewer removes the other from discovery.
    status, body = await call(
        em, "PUT", f"{CRDS}/widgets.example.dev", json={**widget_crd(), "metadata": crd["metadata"]}
    )
    assert status == 200
    status, group = await call(em, "GET", "/apis/example.dev")
    assert [v["version"] for v in group["versions"]] == ["v1"]
    status, _ = await call(em, "DELETE", f"{CRDS}/widgets.example.dev")
    assert status == 200
    status, _ = await call(em, "GET", f"{WIDGETS}/w")
    assert status == 404
    assert em.objects["example.dev/v1/widgets", "default", "w"].deleted


async def test_discovery_fixes(em: RealisticEmulator) -> None:
    status, body = await call(em, "GET", "/api/v1")
    assert body["groupVersion"] == "v1"
    assert {r["name"] for r in body["resources"]} >= {"configmaps", "pods", "pods/status", "events"}
    status, body = await call(em, "GET", "/apis/apps/v1")
    entries = {r["name"]: r for r in body["resources"]}
    assert (
        entries["deployments/scale"]["kind"] == "Scale"
        and entries["deployments/status"]["kind"] == "Deployment"
    )
    status, body = await call(em, "GET", "/version/")
    assert status == 200 and body["major"] == "1"
    status, body = await call(em, "GET", "/apis/autoscaling")
    assert body["preferredVersion"]["version"] == "v2"


async def test_owner_reference_garbage_collection_is_transitive(em: RealisticEmulator) -> None:
    owner = await make_cm(em, "owner")

    def ref(obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return {"apiVersion": "v1", "kind": "ConfigMap", "name": meta["name"], "uid": meta["uid"]}

    child = await make_cm(em, "child", ownerReferences=[ref(owner)])
    await make_cm(em, "grandchild", ownerReferences=[ref(child)])
    other = await make_cm(em, "other")
    await make_cm(em, "shared", ownerReferences=[ref(owner), ref(other)])
    await make_cm(em, "orphaned", ownerReferences=[ref(other)])
    await call(em, "DELETE", f"{CMS}/owner")
    await em.settle()
    _, listing = await call(em, "GET", CMS)
    remaining = {item["metadata"]["name"]: item for item in listing["items"]}
    assert set(remaining) == {"other", "shared", "orphaned"}
    assert [r["name"] for r in remaining["shared"]["metadata"]["ownerReferences"]] == ["other"]
    await call(em, "DELETE", f"{CMS}/other", json={"propagationPolicy": "Orphan"})
    await em.settle()
    _, listing = await call(em, "GET", CMS)
    assert {item["metadata"]["name"] for item in listing["items"]} == {"shared", "orphaned"}
    assert all("ownerReferences" not in item["metadata"] for item in listing["items"])


async def test_dependent_created_after_its_owner_is_gone_is_collected(em: RealisticEmulator) -> None:
    # a controller acting on a stale list creates a pod for a ReplicaSet that was just deleted
    owner = await make_cm(em, "owner")
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    await call(em, "DELETE", f"{CMS}/owner")
    await em.settle()
    await make_cm(em, "late", ownerReferences=[ref])
    other = await make_cm(em, "other")
    other_ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": other["metadata"]["uid"]}
    await make_cm(em, "one-owner-left", ownerReferences=[ref, other_ref])  # kept: an owner lives
    await em.settle()
    _, listing = await call(em, "GET", CMS)
    assert {item["metadata"]["name"] for item in listing["items"]} == {"other", "one-owner-left"}


async def test_a_dependent_that_dropped_its_owner_reference_outlives_it(em: RealisticEmulator) -> None:
    owner = await make_cm(em, "owner")
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    await make_cm(em, "released", ownerReferences=[ref])
    status, _ = await call(
        em, "PATCH", f"{CMS}/released", json={"metadata": {"ownerReferences": None}}, headers=MERGE
    )
    assert status == 200
    await call(em, "DELETE", f"{CMS}/owner")
    await em.settle()
    _, listing = await call(em, "GET", CMS)
    assert {item["metadata"]["name"] for item in listing["items"]} == {"released"}


async def test_an_owner_recreated_under_its_name_does_not_keep_the_old_ones_dependents(
    em: RealisticEmulator,
) -> None:
    first = await make_cm(em, "owner")
    await call(em, "DELETE", f"{CMS}/owner")
    await em.settle()
    await make_cm(em, "owner")  # the same name, a new uid
    old_ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": first["metadata"]["uid"]}
    await make_cm(em, "late", ownerReferences=[old_ref])
    await em.settle()
    _, listing = await call(em, "GET", CMS)
    assert {item["metadata"]["name"] for item in listing["items"]} == {"owner"}


async def test_events_with_generate_name_are_stored(em: RealisticEmulator) -> None:
    for path in ("/api/v1/namespaces/default/events", "/apis/events.k8s.io/v1/namespaces/default/events"):
        for _ in range(2):
            status, body = await call(
                em, "POST", path, json={"metadata": {"generateName": "kopf-event-"}, "reason": "R"}
            )
            assert status == 201, body
    stored = [key for key in em.objects if key[0].plural == "events" and not em.objects[key].deleted]
    assert len(stored) == 4


async def test_kubeconfig_points_at_the_url(tmp_path: Path) -> None:
    async with serve_emulator() as (_em, url):
        path = write_kubeconfig(tmp_path / "kubeconfig", url, "ns1")
        doc = yaml.safe_load(path.read_text())
        assert doc["clusters"][0]["cluster"]["server"] == url
        assert doc["contexts"][0]["context"]["namespace"] == "ns1"
        async with aiohttp.ClientSession() as session, session.get(f"{url}/version") as response:
            assert response.status == 200
    with pytest.raises(ValueError, match="url"):
        kubeconfig("localhost:80")
    with pytest.raises(ValueError, match="port"):
        serve_emulator(port=70000)


async def test_namespaces_are_served_as_objects(em: RealisticEmulator) -> None:
    status, body = await call(em, "GET", "/api/v1/namespaces")
    assert status == 200 and body["kind"] == "NamespaceList"
    assert [item["metadata"]["name"] for item in body["items"]] == ["default", "kube-public", "kube-system"]
    status, body = await call(em, "POST", "/api/v1/namespaces", json={"metadata": {"name": "team"}})
    assert status == 201 and body["status"] == {"phase": "Active"} and "namespace" not in body["metadata"]
    status, body = await call(em, "GET", "/api/v1/namespaces/team")
    assert status == 200 and body["kind"] == "Namespace"
    _, events = await watch(em, "/api/v1/namespaces", "timeoutSeconds=0.2&labelSelector=x")
    assert events == []
    status, body = await call(em, "DELETE", "/api/v1/namespaces/team")
    assert status == 200
    status, body = await call(em, "GET", "/api/v1/namespaces/team")
    assert (status, body["reason"]) == (404, "NotFound")


async def test_a_create_in_a_missing_namespace_is_refused_as_the_lifecycle_plugin_does(
    em: RealisticEmulator,
) -> None:
    before = em.resource_version
    status, body = await call(
        em, "POST", "/api/v1/namespaces/agents/configmaps", json={"metadata": {"name": "c"}}
    )
    assert (status, body["reason"], body["message"]) == (404, "NotFound", 'namespaces "agents" not found')
    assert body["details"] == {"name": "agents", "kind": "namespaces"}
    assert em.resource_version == before  # nothing stored
    dry = await call(
        em, "POST", "/api/v1/namespaces/agents/configmaps?dryRun=All", json={"metadata": {"name": "c"}}
    )
    assert dry[0] == 404
    assert (await call(em, "POST", "/api/v1/namespaces", json={"metadata": {"name": "agents"}}))[0] == 201
    status, body = await call(
        em, "POST", "/api/v1/namespaces/agents/configmaps", json={"metadata": {"name": "c"}}
    )
    assert status == 201 and body["metadata"]["namespace"] == "agents"


async def test_an_object_left_in_a_deleted_namespace_can_be_deleted_but_not_updated(
    em: RealisticEmulator,
) -> None:
    await call(em, "POST", "/api/v1/namespaces", json={"metadata": {"name": "gone"}})
    path = "/api/v1/namespaces/gone/configmaps"
    await call(em, "POST", path, json={"metadata": {"name": "c"}})
    assert (await call(em, "DELETE", "/api/v1/namespaces/gone"))[0] == 200
    status, body = await call(em, "PATCH", f"{path}/c", json={"data": {"k": "v"}}, headers=MERGE)
    assert (status, body["message"]) == (404, 'namespaces "gone" not found')
    assert (await call(em, "DELETE", f"{path}/c"))[0] == 200


async def test_a_create_in_a_terminating_namespace_is_forbidden(em: RealisticEmulator) -> None:
    ns = {"metadata": {"name": "closing", "finalizers": ["example.dev/hold"]}}
    await call(em, "POST", "/api/v1/namespaces", json=ns)
    assert (await call(em, "DELETE", "/api/v1/namespaces/closing"))[0] == 200  # held by its finalizer
    status, body = await call(
        em, "POST", "/api/v1/namespaces/closing/configmaps", json={"metadata": {"name": "c"}}
    )
    assert (status, body["reason"]) == (403, "Forbidden")
    assert body["message"] == (
        'configmaps "c" is forbidden: unable to create new content in namespace closing '
        "because it is being terminated"
    )
    assert body["details"]["causes"][0]["reason"] == "NamespaceTerminating"


async def test_the_examples_apply_in_file_order_with_their_namespaces(em: RealisticEmulator) -> None:
    """``kubectl apply -f examples/``: name order, each object's namespace created by a file before it."""
    from prefixtune.api.crd import build_crd

    assert (await call(em, "POST", CRDS, json=build_crd()))[0] == 201
    examples = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
    namespaces = set()
    for path in examples:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] == "Namespace":
                url = "/api/v1/namespaces"
                namespaces.add(doc["metadata"]["name"])
            else:
                ns = doc["metadata"]["namespace"]
                url = f"/apis/prefixtune.io/v1alpha1/namespaces/{ns}/servingdeployments"
            status, body = await call(em, "POST", url, json=doc)
            assert status == 201, f"{path.name}: {body}"
    assert "agents" in namespaces


async def test_a_fresh_built_in_object_has_its_empty_status_and_a_custom_resource_none(
    em: RealisticEmulator,
) -> None:
    deploy = {"metadata": {"name": "d"}, "spec": {"replicas": 1}, "status": {"replicas": 5}}
    status, created = await call(em, "POST", DEPLOYS, json=deploy)
    assert status == 201 and created["status"] == {}
    _, fetched = await call(em, "GET", f"{DEPLOYS}/d")
    assert fetched["status"] == {}
    guaranteed = {"limits": {"cpu": "1", "memory": "1Gi"}}
    for name, resources, qos in [
        ("best", {}, "BestEffort"),
        ("burst", {"requests": {"cpu": "100m"}}, "Burstable"),
        ("guar", guaranteed, "Guaranteed"),
    ]:
        pod = {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "resources": resources}]}}
        _, body = await call(em, "POST", "/api/v1/namespaces/default/pods", json=pod)
        assert body["status"] == {"phase": "Pending", "qosClass": qos}
    await call(em, "POST", CRDS, json=widget_crd(status=True))
    _, widget = await call(em, "POST", WIDGETS, json={"metadata": {"name": "w"}, "status": {"x": 1}})
    assert "status" not in widget
    _, cm = await call(em, "POST", CMS, json={"metadata": {"name": "plain"}})
    assert "status" not in cm  # no status subresource, no status struct


async def test_the_store_keeps_an_objects_current_version_only(em: RealisticEmulator) -> None:
    # kmock keeps every version written under the key; a fleet's status writes grew that without
    # bound (bench scale). The emulator keeps the last one, or the deletion's marker.
    created = await make_cm(em)
    for value in ("a", "b", "c"):
        status, _ = await call(em, "PATCH", f"{CMS}/cm", json={"data": {"k": value}}, headers=MERGE)
        assert status == 200
    key = next(k for k in em._store() if k[2] == "cm")
    history = em._store()[key].history
    assert len(history) == 1 and history[-1] is not None and history[-1]["data"] == {"k": "c"}
    status, body = await call(em, "GET", f"{CMS}/cm")
    assert status == 200 and body["metadata"]["uid"] == created["metadata"]["uid"]
    status, _ = await call(em, "DELETE", f"{CMS}/cm")
    assert status == 200 and len(history) == 1 and em._store()[key].deleted
    status, _ = await call(em, "GET", f"{CMS}/cm")
    assert status == 404
    await make_cm(em)  # created again under the same key
    assert len(em._store()[key].history) == 1 and not em._store()[key].deleted

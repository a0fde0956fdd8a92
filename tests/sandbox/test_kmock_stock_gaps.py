"""Characterisation of STOCK kmock 0.8 KubernetesEmulator: the gaps RealisticEmulator closes.

Each test asserts today's (wrong for Kubernetes) behaviour on purpose. When a kmock upgrade fixes a
gap, its test fails: that is the signal to drop the matching code from prefixtune.sandbox.emulator
(and to move the pin, kmock==0.8, in pyproject.toml).
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

CMS = "/api/v1/namespaces/default/configmaps"
DEPLOYS = "/apis/apps/v1/namespaces/default/deployments"


@pytest.fixture
async def stock() -> AsyncIterator[kmock.KubernetesEmulator]:
    emulator = kmock.KubernetesEmulator()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        emulator.resources.load_bundled()
    async with emulator, kmock.Server(emulator):
        yield emulator


async def call(em: kmock.KubernetesEmulator, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    async with em.request(method, path, **kwargs) as response:
        return response.status, await response.json(content_type=None)


def test_kmock_is_the_pinned_version() -> None:
    assert kmock.__version__ == "0.8"


async def test_no_server_metadata_on_create(stock: kmock.KubernetesEmulator) -> None:
    status, body = await call(stock, "POST", CMS, json={"metadata": {"name": "a"}, "data": {}})
    assert status == 200  # not 201
    assert body == {"metadata": {"name": "a"}, "data": {}}  # no uid, resourceVersion, namespace, generation


async def test_generate_name_is_not_supported(stock: kmock.KubernetesEmulator) -> None:
    status, body = await call(stock, "POST", CMS, json={"metadata": {"generateName": "x-"}})
    assert status == 200 and "name" not in body["metadata"]
    status, body = await call(stock, "POST", CMS, json={"metadata": {"generateName": "x-"}})
    assert status == 409


async def test_put_is_not_implemented(stock: kmock.KubernetesEmulator) -> None:
    await call(stock, "POST", CMS, json={"metadata": {"name": "a"}})
    status, body = await call(stock, "PUT", f"{CMS}/a", json={"metadata": {"name": "a"}, "data": {"k": "v"}})
    assert (status, body["reason"]) == (404, "Endpoint Not Found")


async def test_strategic_merge_patch_replaces_lists(stock: kmock.KubernetesEmulator) -> None:
    containers = [{"name": "engine", "image": "vllm:1"}, {"name": "sidecar", "image": "proxy:1"}]
    await call(stock, "POST", DEPLOYS, json={"metadata": {"name": "d"}, "spec": {"containers": containers}})
    patch = {"spec": {"containers": [{"name": "engine", "args": ["--x"]}]}}
    headers = {"Content-Type": "application/strategic-merge-patch+json"}
    status, body = await call(stock, "PATCH", f"{DEPLOYS}/d", json=patch, headers=headers)
    assert status == 200
    assert body["spec"]["containers"] == [{"name": "engine", "args": ["--x"]}]  # image and sidecar lost


async def test_failed_json_patch_test_is_500_and_rv_never_changes(stock: kmock.KubernetesEmulator) -> None:
    await call(stock, "POST", CMS, json={"metadata": {"name": "a", "resourceVersion": "7"}})
    patch = [{"op": "test", "path": "/metadata/resourceVersion", "value": "6"}]
    status, _ = await call(
        stock, "PATCH", f"{CMS}/a", json=patch, headers={"Content-Type": "application/json-patch+json"}
    )
    assert status == 500  # kopf expects 422
    status, body = await call(stock, "PATCH", f"{CMS}/a", json={"data": {"k": "v"}})
    assert body["metadata"]["resourceVersion"] == "7"  # writes do not bump it


async def test_status_is_not_isolated(stock: kmock.KubernetesEmulator) -> None:
    await call(
        stock, "POST", DEPLOYS, json={"metadata": {"name": "d"}, "spec": {"replicas": 1}, "status": {"x": 1}}
    )
    _, body = await call(stock, "PATCH", f"{DEPLOYS}/d/status", json={"spec": {"replicas": 5}})
    assert body["spec"] == {"replicas": 5} and body["status"] == {"x": 1}


async def test_selectors_are_ignored_and_lists_lack_kind(stock: kmock.KubernetesEmulator) -> None:
    await call(stock, "POST", CMS, json={"metadata": {"name": "a", "labels": {"app": "x"}}})
    _, body = await call(stock, "GET", f"{CMS}?labelSelector=app%3Dnope")
    assert [item["metadata"]["name"] for item in body["items"]] == ["a"]
    assert "kind" not in body and body["metadata"]["resourceVersion"] == "..."


async def test_discovery_quirks(stock: kmock.KubernetesEmulator) -> None:
    status, body = await call(stock, "GET", "/api/v1")
    assert body["groupVersion"] == "/v1"
    status, body = await call(stock, "GET", "/version/")
    assert status == 404
    status, body = await call(stock, "GET", "/api/v1/namespaces")
    assert status == 500  # kmock's URL parser cannot read the namespaces collection
    status, body = await call(stock, "GET", "/apis/apps/v1")
    scale = next(r for r in body["resources"] if r["name"] == "deployments/scale")
    assert scale["kind"] == "Deployment" and scale["shortNames"] == ["deploy"]  # copied from the parent


async def test_posted_crd_is_not_registered(stock: kmock.KubernetesEmulator) -> None:
    crd = {
        "metadata": {"name": "widgets.example.dev"},
        "spec": {
            "group": "example.dev",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget"},
            "versions": [{"name": "v1", "served": True, "storage": True}],
        },
    }
    status, body = await call(
        stock, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd
    )
    assert status == 200 and "status" not in body
    status, _ = await call(stock, "GET", "/apis/example.dev/v1")
    assert status == 404


async def test_watch_ignores_timeout_and_sends_octet_stream(stock: kmock.KubernetesEmulator) -> None:
    await call(stock, "POST", CMS, json={"metadata": {"name": "a"}})
    async with stock.get(f"{CMS}?watch=true&timeoutSeconds=0.1&resourceVersion=1") as response:
        assert response.headers["Content-Type"] == "application/octet-stream"
        first = await asyncio.wait_for(response.content.readline(), 2)
        assert b'"ADDED"' in first  # replayed although a resourceVersion was given
        with pytest.raises(TimeoutError):  # the stream does not end after timeoutSeconds
            await asyncio.wait_for(response.content.read(), 0.6)

"""kopf against RealisticEmulator: a tiny Widget operator runs in its own thread (KopfRunner).

The emulator lives in pytest's event loop; kopf runs in its own thread and loop, entered and exited
through asyncio.to_thread so that pytest's loop keeps serving (running kopf.operator() in pytest's
loop makes kopf treat the fixture's tasks as its own and stall or cancel them at exit).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import kmock
import kopf
import kopf.testing
import pytest
from kubernetes import client
from kubernetes.client import AppsV1Api, CoreV1Api  # imported eagerly: a lazy import takes seconds

from prefixtune.sandbox.emulator import RealisticEmulator, serve_emulator

GROUP, VERSION, PLURAL = "example.dev", "v1", "widgets"
WIDGETS = f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}"
CMS = "/api/v1/namespaces/default/configmaps"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MERGE = {"Content-Type": "application/merge-patch+json"}
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}

# The test operator. Its handlers use the sync kubernetes client, as the project's controller will.
registry = kopf.OperatorRegistry()
state: dict[str, Any] = {"url": "", "calls": collections.Counter()}
state_lock = threading.Lock()


def _count(handler: str) -> None:
    with state_lock:
        state["calls"][handler] += 1


def _api() -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = state["url"]
    return client.ApiClient(configuration)


@kopf.on.login(registry=registry)
def login(**_: Any) -> kopf.ConnectionInfo:
    return kopf.ConnectionInfo(server=state["url"], insecure=True, default_namespace="default")


@kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
def create_widget(
    body: kopf.Body, name: str, namespace: str, spec: kopf.Spec, patch: kopf.Patch, **_: Any
) -> None:
    _count("create")
    size = str(spec.get("size", 1))
    config_map: dict[str, Any] = {"metadata": {"name": f"{name}-cm"}, "data": {"size": size}}
    labels = {"app": name}
    pod_spec = {
        "containers": [
            {"name": "engine", "image": "vllm/vllm-openai:v0.6", "args": ["--size", size]},
            {"name": "sidecar", "image": "envoy:1"},
        ]
    }
    deployment: dict[str, Any] = {
        "metadata": {"name": f"{name}-app"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    kopf.adopt([config_map, deployment], owner=body)
    with _api() as api:
        CoreV1Api(api).create_namespaced_config_map(namespace, config_map)
        AppsV1Api(api).create_namespaced_deployment(namespace, deployment)
    kopf.info(body, reason="ChildrenCreated", message=f"created {name}-cm and {name}-app")
    patch.status["phase"] = "Created"


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec.size", registry=registry)
def resize_widget(name: str, namespace: str, new: Any, **_: Any) -> None:
    _count("update")
    rollout = {
        "spec": {"template": {"spec": {"containers": [{"name": "engine", "args": ["--size", str(new)]}]}}}
    }
    with _api() as api:
        AppsV1Api(api).patch_namespaced_deployment(f"{name}-app", namespace, rollout)  # strategic merge


@kopf.timer(GROUP, VERSION, PLURAL, interval=0.2, registry=registry)
def tick(status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
    patch.status["ticks"] = int(status.get("ticks") or 0) + 1


@kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
def delete_widget(**_: Any) -> None:
    _count("delete")


def settings(server_timeout: float | None = None) -> kopf.OperatorSettings:
    result = kopf.OperatorSettings()
    result.watching.server_timeout = server_timeout
    result.watching.connect_timeout = 2
    result.networking.error_backoffs = [0.1, 0.2]
    result.scanning.disabled = False
    return result


@pytest.fixture
async def cluster() -> AsyncIterator[RealisticEmulator]:
    async with serve_emulator() as (emulator, url):
        state["url"] = url
        state["calls"].clear()
        yield emulator


@contextlib.asynccontextmanager
async def operator(operator_settings: kopf.OperatorSettings) -> AsyncIterator[kopf.testing.KopfRunner]:
    runner = kopf.testing.KopfRunner(
        ["run", "--standalone", "--namespace", "default"],
        registry=registry,
        settings=operator_settings,
        timeout=15,
    )
    await asyncio.to_thread(runner.__enter__)
    try:
        yield runner
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)
    assert runner.exit_code == 0, runner.output


async def eventually(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for: {what}")
        await asyncio.sleep(0.05)


def live(emulator: RealisticEmulator, resource: str, name: str) -> dict[str, Any] | None:
    key = (kmock.resource(resource), "default", name)  # `in` does not parse string resources
    if key not in emulator.objects or emulator.objects[key].deleted:
        return None
    return dict(emulator.objects[key].raw)


def posts(emulator: RealisticEmulator, path: str) -> int:
    return sum(1 for request in emulator if request.method == "POST" and request.url.path == path)


async def test_widget_lifecycle(cluster: RealisticEmulator) -> None:
    async with cluster.post(CRDS, json=CRD) as response:
        assert response.status == 201
    async with operator(settings(server_timeout=0.5)):
        async with cluster.post(WIDGETS, json={"metadata": {"name": "w1"}, "spec": {"size": 1}}) as response:
            assert response.status == 201

        # Create: children exist, status patched through /status, the timer ticks, a finalizer is set.
        def created() -> bool:
            widget = live(cluster, "example.dev/v1/widgets", "w1") or {}
            return (
                widget.get("status", {}).get("phase") == "Created" and widget["status"].get("ticks", 0) >= 3
            )

        await eventually(created, "status.phase=Created and 3 timer ticks")
        widget = live(cluster, "example.dev/v1/widgets", "w1")
        assert widget is not None and widget["metadata"]["finalizers"]
        config_map = live(cluster, "v1/configmaps", "w1-cm")
        assert config_map is not None and config_map["data"] == {"size": "1"}
        assert config_map["metadata"]["ownerReferences"][0]["uid"] == widget["metadata"]["uid"]
        assert posts(cluster, CMS) == 1  # the create handler ran exactly once

        # kopf.info posted an Event (generateName) that the emulator stored.
        def event_stored() -> bool:
            return any(
                key[0].plural == "events" and not obj.deleted and obj.raw.get("reason") == "ChildrenCreated"
                for key, obj in cluster.objects.items()
            )

        await eventually(event_stored, "the ChildrenCreated event")

        # Update: the strategic merge patch changes the args and keeps the image and the sidecar.
        async with cluster.patch(f"{WIDGETS}/w1", json={"spec": {"size": 2}}, headers=MERGE) as response:
            assert response.status == 200

        def rolled_out() -> bool:
            deployment = live(cluster, "apps/v1/deployments", "w1-app") or {}
            containers = deployment.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
            return bool(containers) and containers[0].get("args") == ["--size", "2"]

        await eventually(rolled_out, "the Deployment rolled out with --size 2")
        deployment = live(cluster, "apps/v1/deployments", "w1-app")
        assert deployment is not None
        assert deployment["spec"]["template"]["spec"]["containers"] == [
            {"name": "engine", "image": "vllm/vllm-openai:v0.6", "args": ["--size", "2"]},
            {"name": "sidecar", "image": "envoy:1"},
        ]
        assert deployment["metadata"]["generation"] == 2

        # Several watch reconnects (server_timeout 0.5 s) happened, yet nothing was handled twice.
        def watches() -> list[Any]:
            return [r for r in cluster if r.url.path == WIDGETS and r.params.get("watch") == "true"]

        await eventually(lambda: len(watches()) >= 4, "3 watch reconnects")
        assert all(r.params.get("timeoutSeconds") == "0.5" for r in watches())
        assert posts(cluster, CMS) == 1
        assert state["calls"] == {"create": 1, "update": 1}

        # Delete: the finalizer holds the object until the delete handler ran, then it is gone.
        async with cluster.delete(f"{WIDGETS}/w1") as response:
            assert response.status == 200
        await eventually(
            lambda: live(cluster, "example.dev/v1/widgets", "w1") is None, "the widget to be deleted"
        )
        await cluster.settle()
        assert live(cluster, "v1/configmaps", "w1-cm") is None  # garbage-collected via ownerReferences
        assert live(cluster, "apps/v1/deployments", "w1-app") is None

    # Exactly once for create and update; kopf itself may re-run an on.delete handler when stopping
    # the object's timer delays the finalizer removal (it purges the handler progress meanwhile).
    assert (state["calls"]["create"], state["calls"]["update"]) == (1, 1)
    assert state["calls"]["delete"] >= 1


async def test_crd_installed_after_the_operator_started(cluster: RealisticEmulator) -> None:
    async with operator(settings()):
        await asyncio.sleep(0.3)  # the operator is up and finds no widgets resource yet
        async with cluster.post(CRDS, json=CRD) as response:
            assert response.status == 201
        async with cluster.post(
            WIDGETS, json={"metadata": {"name": "late"}, "spec": {"size": 3}}
        ) as response:
            assert response.status == 201
        await eventually(
            lambda: live(cluster, "v1/configmaps", "late-cm") is not None, "the late widget handled"
        )
        widget = live(cluster, "example.dev/v1/widgets", "late")
        await eventually(
            lambda: (
                (live(cluster, "example.dev/v1/widgets", "late") or {}).get("status", {}).get("phase")
                == "Created"
            ),
            "status.phase=Created",
        )
        assert widget is not None
    assert state["calls"]["create"] == 1
    assert posts(cluster, CMS) == 1

"""The official (sync) kubernetes client against RealisticEmulator, called from a worker thread."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client import AppsV1Api, CoreV1Api, VersionApi  # eagerly: a lazy import takes seconds

from prefixtune.sandbox.emulator import RealisticEmulator, serve_emulator


@pytest.fixture
async def api() -> AsyncIterator[tuple[RealisticEmulator, client.ApiClient]]:
    async with serve_emulator() as (emulator, url):
        configuration = client.Configuration()
        configuration.host = url
        with client.ApiClient(configuration) as api_client:
            yield emulator, api_client


def _deployment() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "engine", "labels": {"app": "engine"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "engine"}},
            "template": {
                "metadata": {"labels": {"app": "engine"}},
                "spec": {
                    "containers": [
                        {"name": "vllm", "image": "vllm/vllm-openai:v0.6", "args": ["--block-size", "16"]},
                        {"name": "sidecar", "image": "envoy:1"},
                    ]
                },
            },
        },
    }


async def test_crud_selectors_strategic_patch_replace_delete(
    api: tuple[RealisticEmulator, client.ApiClient],
) -> None:
    _, api_client = api
    apps = AppsV1Api(api_client)
    core = CoreV1Api(api_client)

    def scenario() -> None:
        assert VersionApi(api_client).get_code().major == "1"  # GET /version/
        created = apps.create_namespaced_deployment("default", _deployment())
        assert created.metadata.uid and created.metadata.resource_version and created.metadata.generation == 1
        assert [
            d.metadata.name
            for d in apps.list_namespaced_deployment("default", label_selector="app=engine").items
        ] == ["engine"]
        assert apps.list_namespaced_deployment("default", label_selector="app=nope").items == []
        patch = {
            "spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": ["--block-size", "32"]}]}}}
        }
        patched = apps.patch_namespaced_deployment("engine", "default", patch)  # dict body: strategic merge
        containers = patched.spec.template.spec.containers
        assert [(c.name, c.image, c.args) for c in containers] == [
            ("vllm", "vllm/vllm-openai:v0.6", ["--block-size", "32"]),
            ("sidecar", "envoy:1", None),
        ]
        assert patched.metadata.generation == 2
        status = apps.patch_namespaced_deployment_status(
            "engine", "default", {"status": {"readyReplicas": 1}}
        )
        assert status.status.ready_replicas == 1 and status.metadata.generation == 2
        current = apps.read_namespaced_deployment("engine", "default")
        current.spec.replicas = 3
        replaced = apps.replace_namespaced_deployment("engine", "default", current)
        assert replaced.spec.replicas == 3 and replaced.metadata.generation == 3
        with pytest.raises(client.ApiException) as conflict:
            apps.replace_namespaced_deployment("engine", "default", current)  # current's RV is stale now
        assert conflict.value.status == 409
        cm = core.create_namespaced_config_map(
            "default", {"metadata": {"generateName": "cfg-"}, "data": {"a": "1"}}
        )
        assert cm.metadata.name.startswith("cfg-") and len(cm.metadata.name) == 9
        apps.delete_namespaced_deployment("engine", "default")
        with pytest.raises(client.ApiException) as missing:
            apps.read_namespaced_deployment("engine", "default")
        assert missing.value.status == 404

    await asyncio.to_thread(scenario)


async def test_watch_with_timeout_delivers_events_and_ends(
    api: tuple[RealisticEmulator, client.ApiClient],
) -> None:
    emulator, api_client = api
    core = CoreV1Api(api_client)
    await asyncio.to_thread(core.create_namespaced_config_map, "default", {"metadata": {"name": "a"}})
    listing = await asyncio.to_thread(core.list_namespaced_config_map, "default")
    since = listing.metadata.resource_version

    def stream() -> tuple[list[tuple[str, str]], float]:
        started = time.monotonic()
        seen = [
            (event["type"], event["object"].metadata.name)
            for event in watch.Watch().stream(
                core.list_namespaced_config_map, "default", resource_version=since, timeout_seconds=1
            )
        ]
        return seen, time.monotonic() - started

    watcher = asyncio.create_task(asyncio.to_thread(stream))
    await asyncio.sleep(0.3)
    await emulator.patch(
        "/api/v1/namespaces/default/configmaps/a",
        json={"data": {"k": "v"}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    seen, elapsed = await watcher
    assert seen == [("MODIFIED", "a")]
    assert 0.9 <= elapsed < 5

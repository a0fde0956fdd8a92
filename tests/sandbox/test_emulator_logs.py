"""``pods/log`` (kubectl logs): the emulator reads a log source as kube-apiserver reads the kubelet."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from prefixtune.sandbox.emulator import RealisticEmulator, serve_emulator
from prefixtune.sandbox.podlogs import ContainerLogs

PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture
async def em() -> AsyncIterator[RealisticEmulator]:
    async with serve_emulator() as (emulator, _url):
        emulator.pod_logs = ContainerLogs(max_lines=5, max_line=20)
        yield emulator


async def make_pod(
    em: RealisticEmulator, name: str, *containers: str, node: str = "n", init: str = ""
) -> str:
    spec: dict[str, Any] = {"containers": [{"name": c, "image": "i"} for c in containers]}
    if node:
        spec["nodeName"] = node
    if init:
        spec["initContainers"] = [{"name": init, "image": "i"}]
    async with em.post(PODS, json={"metadata": {"name": name}, "spec": spec}) as resp:
        assert resp.status == 201
        return str((await resp.json())["metadata"]["uid"])


async def log(em: RealisticEmulator, pod: str, query: str = "") -> tuple[int, str, str]:
    async with em.get(f"{PODS}/{pod}/log{query}") as resp:
        return resp.status, resp.content_type, await resp.text()


def logs(em: RealisticEmulator) -> ContainerLogs:
    assert isinstance(em.pod_logs, ContainerLogs)
    return em.pod_logs


async def test_a_single_container_pod_log_is_plain_text_of_its_current_run(em: RealisticEmulator) -> None:
    uid = await make_pod(em, "p", "engine")
    logs(em).write(uid, "engine", "2026-01-01T00:00:00Z", "one\ntwo")
    assert await log(em, "p") == (200, "text/plain", "one\ntwo\n")
    _, _, text = await log(em, "p", "?timestamps=true")
    assert text == "2026-01-01T00:00:00Z one\n2026-01-01T00:00:00Z two\n"
    logs(em).write(uid, "engine", "t", "three")
    assert (await log(em, "p", "?tailLines=2"))[2] == "two\nthree\n"
    assert (await log(em, "p", "?tailLines=0"))[2] == ""
    assert (await log(em, "p", "?limitBytes=5"))[2] == "one\nt"


async def test_the_previous_run_and_bounded_lines(em: RealisticEmulator) -> None:
    uid = await make_pod(em, "p", "engine")
    logs(em).write(uid, "engine", "t", "first run")
    status, _, text = await log(em, "p", "?previous=true")
    assert status == 400 and 'previous terminated container \\"engine\\" in pod \\"p\\" not found' in text
    logs(em).start(uid, "engine")
    logs(em).write(uid, "engine", "t", "\n".join(f"line {i} " + "x" * 30 for i in range(7)))
    assert (await log(em, "p", "?previous=true"))[2] == "first run\n"
    current = (await log(em, "p"))[2].splitlines()
    assert len(current) == 5 and current[0].startswith("line 2") and all(len(x) == 20 for x in current)


async def test_which_container_as_the_server_chooses(em: RealisticEmulator) -> None:
    await make_pod(em, "two", "a", "b", init="setup")
    status, _, text = await log(em, "two")
    assert status == 400
    assert (
        "a container name must be specified for pod two, choose one of: [a b] "
        "or one of the init containers: [setup]" in text
    )
    status, _, text = await log(em, "two", "?container=c")
    assert status == 400 and "container c is not valid for pod two" in text
    status, _, text = await log(em, "two", "?container=b")
    assert (
        status == 400 and 'container \\"b\\" in pod \\"two\\" is waiting to start: ContainerCreating' in text
    )


async def test_an_unscheduled_pod_has_an_empty_log_and_a_missing_pod_is_not_found(
    em: RealisticEmulator,
) -> None:
    await make_pod(em, "pending", "engine", node="")
    assert await log(em, "pending") == (200, "text/plain", "")
    status, _, text = await log(em, "nope")
    assert status == 404 and 'pods \\"nope\\" not found' in text


@pytest.mark.parametrize(
    ("query", "code"), [("?tailLines=-1", 422), ("?limitBytes=0", 422), ("?tailLines=x", 400)]
)
async def test_bad_log_options_are_refused(em: RealisticEmulator, query: str, code: int) -> None:
    await make_pod(em, "p", "engine")
    assert (await log(em, "p", query))[0] == code


def test_a_pods_logs_are_forgotten_with_it() -> None:
    store = ContainerLogs()
    store.write("u1", "c", "t", "kept")
    store.write("u2", "c", "t", "gone")
    store.forget("u2")
    assert [line.text for line in store.read("u1", "c", False) or ()] == ["kept"]
    assert store.read("u2", "c", False) is None


async def test_a_log_leaves_the_next_json_answers_json(em: RealisticEmulator) -> None:
    uid = await make_pod(em, "p", "engine")
    logs(em).write(uid, "engine", "t", "line")
    assert (await log(em, "p"))[1] == "text/plain"
    async with em.get(f"{PODS}/p") as resp:
        assert resp.content_type == "application/json" and (await resp.json())["metadata"]["name"] == "p"
    headers = {"Content-Type": "application/merge-patch+json"}
    async with em.patch(f"{PODS}/p", json={"metadata": {"labels": {"a": "b"}}}, headers=headers) as resp:
        assert resp.status == 200 and resp.content_type == "application/json"

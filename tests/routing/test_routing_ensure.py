"""The operator's writes for the router, through the sandbox's API server: created owned with the
resource, re-rendered with a routing knob, deleted with kube-proxy; the Service switched by merge patch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench._reliability_tenant import APPS, CORE, MODEL, SDEP, harness, resource
from prefixtune.controller.execute import _apply
from prefixtune.controller.render import Owner
from prefixtune.routing.policy import DEFAULT_ROUTER_IMAGE, Router

RBAC = "/apis/rbac.authorization.k8s.io/v1"
ROUTER_OBJECTS = (
    f"{APPS}/namespaces/default/deployments/chat-router",
    f"{CORE}/namespaces/default/serviceaccounts/chat-router",
    f"{RBAC}/namespaces/default/roles/chat-router",
    f"{RBAC}/namespaces/default/rolebindings/chat-router",
)


async def test_a_routed_resource_gets_its_router_and_loses_it_with_kube_proxy() -> None:
    async with harness() as h:
        created = await h.apply(resource("chat", {"engine": "sglang", "model": MODEL, "replicas": 2}))
        await h.reconcile("chat")
        uid = created["metadata"]["uid"]
        for path in ROUTER_OBJECTS:
            obj = await h.get(path)
            assert obj is not None, path
            assert [r["uid"] for r in obj["metadata"]["ownerReferences"]] == [uid]
        service = await h.get(f"{CORE}/namespaces/default/services/chat")
        assert service is not None
        assert service["spec"]["selector"] == {"prefixtune.io/resource": "chat"}  # no router pod ready yet
        engine = await h.get(f"{APPS}/namespaces/default/deployments/chat")
        assert engine is not None
        before = engine["spec"]["template"]

        # A routing knob's change (here the baseline's, in spec.routing) re-renders the router only.
        path = f"{SDEP}/namespaces/default/servingdeployments/chat"
        await h.api.patch(path, {"spec": {"routing": {"policy": "round_robin", "cacheThreshold": 0.6}}})
        h.ctx.ensured.clear()
        await h.reconcile("chat")
        router = await h.get(ROUTER_OBJECTS[0])
        assert router is not None
        args = router["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--policy") + 1] == "round_robin"
        engine = await h.get(f"{APPS}/namespaces/default/deployments/chat")
        assert engine is not None and engine["spec"]["template"] == before

        await h.api.patch(path, {"spec": {"routing": {"policy": "kube-proxy"}}})
        h.ctx.ensured.clear()
        await h.reconcile("chat")
        for path in ROUTER_OBJECTS:
            assert await h.get(path) is None, path
        service = await h.get(f"{CORE}/namespaces/default/services/chat")
        assert service is not None and service["spec"]["selector"] == {"prefixtune.io/resource": "chat"}


async def test_a_trtllm_resource_naming_no_router_moves_to_sglang_router_and_its_engines_stay() -> None:
    """From a named vllm-router to the engine's default router (``ENGINE_ROUTER``: sglang-router, as
    an operator upgrade moves a TensorRT-LLM resource that names none): the router restarts only."""
    async with harness() as h:
        spec = {"engine": "trtllm", "model": MODEL, "replicas": 2, "routing": {"router": "vllm-router"}}
        await h.apply(resource("chat", spec))
        await h.reconcile("chat")
        router = await h.get(ROUTER_OBJECTS[0])
        engine = await h.get(f"{APPS}/namespaces/default/deployments/chat")
        assert router is not None and engine is not None
        assert router["spec"]["template"]["spec"]["containers"][0]["command"] == ["vllm-router"]
        before = engine["spec"]["template"]

        path = f"{SDEP}/namespaces/default/servingdeployments/chat"
        await h.api.patch(path, {"spec": {"routing": {"router": None}}})
        h.ctx.ensured.clear()
        await h.reconcile("chat")
        router = await h.get(ROUTER_OBJECTS[0])
        engine = await h.get(f"{APPS}/namespaces/default/deployments/chat")
        assert router is not None and engine is not None
        container = router["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["sglang-router", "launch"]
        assert container["image"] == DEFAULT_ROUTER_IMAGE[Router.SGLANG]
        assert engine["spec"]["template"] == before


async def test_no_router_runs_under_a_service_account_of_its_name_that_is_not_ours() -> None:
    async with harness() as h:
        spec = {"engine": "sglang", "model": MODEL, "replicas": 2}
        await h.api.create(
            f"{CORE}/namespaces/default/serviceaccounts", {"metadata": {"name": "chat-router"}}
        )
        await h.apply(resource("chat", spec))
        await h.reconcile("chat")
        assert await h.get(ROUTER_OBJECTS[0]) is None  # no Deployment naming that account
        service = await h.get(f"{CORE}/namespaces/default/services/chat")
        assert service is not None and service["spec"]["selector"] == {"prefixtune.io/resource": "chat"}
        ready = await h.ready("chat")
        assert (
            ready["reason"] == "ResourceExists" and "ServiceAccount default/chat-router" in ready["message"]
        )
        for kind in ("roles", "rolebindings"):  # nothing of ours grants that account anything
            assert await h.get(f"{RBAC}/namespaces/default/{kind}/chat-router") is None, kind


async def test_a_router_whose_account_was_replaced_by_someone_elses_is_removed() -> None:
    async with harness() as h:
        await h.apply(resource("chat", {"engine": "sglang", "model": MODEL, "replicas": 2}))
        await h.reconcile("chat")
        assert await h.get(ROUTER_OBJECTS[0]) is not None
        account = f"{CORE}/namespaces/default/serviceaccounts"
        await h.api.delete(f"{account}/chat-router")
        await h.api.create(account, {"metadata": {"name": "chat-router"}})
        h.ctx.ensured.clear()
        await h.reconcile("chat")
        assert await h.get(ROUTER_OBJECTS[0]) is None
        sa = await h.get(f"{account}/chat-router")
        assert sa is not None and not sa["metadata"].get("ownerReferences")  # theirs, left alone
        for kind in ("roles", "rolebindings"):  # nothing of ours grants that account anything
            assert await h.get(f"{RBAC}/namespaces/default/{kind}/chat-router") is None, kind


class _Recorder:
    """A client holding one live object: what the operator patches is recorded."""

    def __init__(self, live: dict[str, Any]) -> None:
        self.live = live
        self.patches: list[dict[str, Any]] = []

    async def get(self, path: str) -> dict[str, Any]:
        return self.live

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(patch)
        return self.live


def test_switching_the_service_to_the_router_removes_the_engine_selector_key() -> None:
    owner = Owner("default", "chat", "uid-1")
    live = {
        "metadata": {"name": "chat", "ownerReferences": [owner.reference()], "annotations": {}},
        "spec": {"selector": {"prefixtune.io/resource": "chat"}},
    }
    body = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "chat", "labels": {}},
        "spec": {"selector": {"prefixtune.io/router": "chat"}},
    }
    client = _Recorder(live)
    asyncio.run(_apply(client, f"{CORE}/namespaces/default/services", body, "", "services", owner))  # type: ignore[arg-type]
    (patch,) = client.patches
    assert patch["spec"]["selector"] == {"prefixtune.io/resource": None, "prefixtune.io/router": "chat"}


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
async def test_a_policy_the_router_lacks_shows_as_an_invalid_spec_condition(engine: str) -> None:
    async with harness() as h:
        spec = {"engine": engine, "model": MODEL, "replicas": 2, "routing": {"policy": "consistent_hash"}}
        await h.apply(resource("chat", spec))
        await h.reconcile("chat")
        ready = await h.ready("chat")
        assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
        assert "spec.routing.policy: sglang-router has no consistent_hash policy" in ready["message"]
        assert "consistent_hash needs routing.router vllm-router" in ready["message"]
        assert await h.get(ROUTER_OBJECTS[0]) is None


async def test_a_widened_router_role_or_an_added_subject_is_restored() -> None:
    async with harness() as h:
        await h.apply(resource("chat", {"engine": "sglang", "model": MODEL, "replicas": 2}))
        await h.reconcile("chat")
        role_path, binding_path = ROUTER_OBJECTS[2], ROUTER_OBJECTS[3]
        role = await h.get(role_path)
        binding = await h.get(binding_path)
        assert role is not None and binding is not None
        rules, subjects = role["rules"], binding["subjects"]
        secrets = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}
        await h.api.patch(role_path, {"rules": [*rules, secrets]})
        intruder = {"kind": "ServiceAccount", "name": "intruder", "namespace": "default"}
        await h.api.patch(binding_path, {"subjects": [*subjects, intruder]})
        h.ctx.ensured.clear()
        await h.reconcile("chat")
        role = await h.get(role_path)
        binding = await h.get(binding_path)
        assert role is not None and role["rules"] == rules
        assert binding is not None and binding["subjects"] == subjects

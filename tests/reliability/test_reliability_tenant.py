"""A hostile tenant (issue #17), through the sandbox: the emulated API server, its controllers and
the twin kubelet, with the operator's own ``reconcile`` run against it over HTTP (``bench/
_reliability_tenant.py``; ``prefixtune bench reliability`` reports the same cases).

Each test failed before its fix: the operator patched a foreign Service and deleted foreign canaries,
looped on names the API server refuses for its children, fetched any URL a spec named and showed the
answer, let slow metrics endpoints stall other tenants, counted a pod scraped by two jobs twice,
answered liveness from a thread that saw nothing, and passed control characters to the engine.
"""

from __future__ import annotations

from typing import Any

import pytest

from prefixtune.benchcli import load_bench

tenant = load_bench("_reliability_tenant")
APPS = "/apis/apps/v1/namespaces/default"


# --- 1. only what it owns ----------------------------------------------------------------------------


async def test_foreign_objects_named_like_children_are_left_untouched_and_reported() -> None:
    report = await tenant.foreign_objects(ticks=3)
    assert report["foreign_objects"] == 3
    assert report["foreign_changed"] == []  # the LoadBalancer, the canary Deployment and ConfigMap
    expected = {
        "payments": "Service default/payments",
        "web": "Deployment default/web-canary",
        "tr": "ConfigMap default/tr-canary-options",
    }
    for name, what in expected.items():
        ready = report["ready"][name]
        assert (ready["status"], ready["reason"]) == ("False", "ResourceExists"), ready
        assert what in ready["message"] and "not controlled by this ServingDeployment" in ready["message"]
        assert len(report["events"][name]) == 1 and what in report["events"][name][0]  # once, not per tick


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("70b-chat", "RFC 1035"),
        ("llama.3", "RFC 1035"),
        ("a" * 64, "at most 63"),
        ("llama-canary", "canary Deployment"),
    ],
)
async def test_names_whose_children_the_api_server_refuses_or_that_collide_are_refused(
    name: str, why: str
) -> None:
    async with tenant.harness() as h:
        await h.apply(tenant.resource(name))
        for _ in range(2):
            outcome = await h.reconcile(name)  # no traceback: an outcome, every time
            assert outcome is not None and outcome.invalid
        ready = await h.ready(name)
        assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
        assert "metadata.name" in ready["message"] and why in ready["message"], ready
        assert await h.get(f"{APPS}/deployments/{name}") is None
        invalid = [e for e in await h.events(name) if e["reason"] == "InvalidSpec"]
        assert len(invalid) == 1


async def test_two_resources_never_fight_over_one_deployment() -> None:
    """``llama`` and a resource whose baseline would be llama's canary: the second is refused by
    name, and even a foreign Deployment of a child name is never rewritten (no alternating
    updates, which each restart a GPU pod)."""
    async with tenant.harness() as h:
        await h.apply(tenant.resource("llama", {"engine": "vllm", "model": tenant.MODEL, "replicas": 2}))
        await h.apply(tenant.resource("llama-canary"))
        for _ in range(3):
            await h.reconcile("llama")
            await h.reconcile("llama-canary")
        dep = await h.get(f"{APPS}/deployments/llama")
        assert dep is not None and dep["metadata"]["generation"] == 1
        assert await h.get(f"{APPS}/deployments/llama-canary") is None
        assert (await h.ready("llama-canary"))["reason"] == "InvalidSpec"


async def test_an_orphan_with_our_markers_is_adopted() -> None:
    async with tenant.harness() as h:
        created = await h.apply(tenant.resource("solo"))
        await h.reconcile("solo")
        dep = await h.get(f"{APPS}/deployments/solo")
        assert dep is not None
        # Someone strips the owner reference (a restore from backup): ours by its labels, adopted.
        await h.api.patch(f"{APPS}/deployments/solo", {"metadata": {"ownerReferences": None}})
        h.ctx.ensured.clear()
        outcome = await h.reconcile("solo")
        assert any(c.startswith("adopted Deployment solo") for c in outcome.changes), outcome.changes
        dep = await h.get(f"{APPS}/deployments/solo")
        refs: list[dict[str, Any]] = dep["metadata"]["ownerReferences"]
        assert [r["uid"] for r in refs if r.get("controller")] == [created["metadata"]["uid"]]

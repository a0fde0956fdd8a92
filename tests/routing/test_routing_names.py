"""A resource named ``<x>-router`` would take resource ``x``'s router objects (``<x>-engines`` its
engines' Service): refused by name, as ``<x>-canary`` is, with an InvalidSpec condition and Event."""

from __future__ import annotations

from bench._reliability_tenant import APPS, MODEL, harness, resource
from prefixtune.controller.ownership import name_errors


def test_a_name_ending_in_router_is_refused_naming_the_resource_it_would_collide_with() -> None:
    (error,) = name_errors("chat-router")
    assert "ends in '-router'" in error and "of a resource 'chat'" in error


def test_a_name_ending_in_engines_is_refused() -> None:
    (error,) = name_errors("chat-engines")
    assert "ends in '-engines'" in error and "of a resource 'chat'" in error


async def test_a_resource_named_like_anothers_router_never_touches_that_router() -> None:
    async with harness() as h:
        await h.apply(resource("chat", {"engine": "sglang", "model": MODEL, "replicas": 2}))
        await h.apply(resource("chat-router", {"engine": "sglang", "model": MODEL}))
        for _ in range(2):
            await h.reconcile("chat")
            await h.reconcile("chat-router")
        router = await h.get(f"{APPS}/namespaces/default/deployments/chat-router")
        assert router is not None and router["metadata"]["generation"] == 1
        assert router["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "router"
        assert (await h.ready("chat-router"))["reason"] == "InvalidSpec"
        invalid = [e for e in await h.events("chat-router") if e["reason"] == "InvalidSpec"]
        assert len(invalid) == 1 and "ends in '-router'" in invalid[0]["message"]

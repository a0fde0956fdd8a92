"""No status patch when nothing changed (issue #21): a reconcile whose status equals the stored one
writes nothing, so a resource at rest makes no write, no new resourceVersion and no watch event per
tick. Through the sandbox (the emulated API server and the twin kubelet), the operator's own
``reconcile`` over HTTP (``bench/_reliability_tenant.py``'s harness)."""

from __future__ import annotations

import asyncio
from typing import Any

from bench import _reliability_tenant as tenant
from prefixtune.controller.status import patch_changes

SDEP = "/apis/prefixtune.io/v1alpha1/namespaces/default/servingdeployments"


def test_patch_changes_follows_merge_patch_semantics() -> None:
    stored: dict[str, Any] = {"phase": "Paused", "trials": [{"index": 1}], "best": {"score": 1.0, "x": 2}}
    assert not patch_changes(stored, {"phase": "Paused", "trials": [{"index": 1}], "best": {"score": 1.0}})
    assert not patch_changes(stored, {"diagnosis": None})  # null deletes: absent already
    assert patch_changes(stored, {"best": None})
    assert patch_changes(stored, {"phase": "Converged"})
    assert patch_changes(stored, {"trials": [{"index": 1}, {"index": 2}]})  # lists replace
    assert patch_changes(stored, {"best": {"score": 1.5}})
    assert patch_changes(stored, {"recommendation": {"config": {}}})  # a new key
    assert patch_changes({}, {"x": {}})


async def test_a_reconcile_that_changes_nothing_writes_no_status() -> None:
    async with tenant.harness() as h:
        await h.apply(
            tenant.resource("rest", {"engine": "vllm", "model": tenant.MODEL, "tuning": {"mode": "off"}})
        )
        patched: list[str] = []
        client = h.ctx.client
        original = client.merge_patch

        async def counting(path: str, body: Any) -> dict[str, Any]:
            patched.append(path)
            return await original(path, body)

        client.merge_patch = counting  # type: ignore[method-assign]
        outcome = await h.reconcile("rest")
        assert outcome is not None and outcome.status_patched and patched == [f"{SDEP}/rest/status"]
        # At rest (tuning off; nothing moves between two reconciles): the same status, no write.
        quiet = None
        for _ in range(40):
            before = await h.get(f"{SDEP}/rest")
            assert before is not None
            patched.clear()
            outcome = await h.reconcile("rest")
            after = await h.get(f"{SDEP}/rest")
            assert outcome is not None and after is not None
            if not outcome.status_patched:
                quiet = (before, after)
                break
            await asyncio.sleep(0.25)
        assert quiet is not None, "every reconcile patched the status"
        before, after = quiet
        assert not any(p.endswith("/status") for p in patched), patched
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert after["status"] == before["status"]

"""In the sandbox (emulated API server, twin kubelet, load): approving observe mode's recommendation
rolls it out once. The operator's own ``reconcile`` runs in this process against the sandbox over
HTTP (``bench/_reliability_tenant.py``'s harness), ticked by the test.

The workload (``qa``: unique queries behind a 12-token preamble, shorter than a KV block) has a hit
rate near zero, so observe mode recommends turning prefix caching off; the test approves that
recommendation as ``prefixtune approve`` does (the annotation set to its id) and follows the
Deployment to it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench import _reliability_tenant as tenant
from prefixtune.api.models import APPROVE_ANNOTATION
from prefixtune.controller.render import config_hash
from prefixtune.controller.status import policy_state_of
from prefixtune.sandbox.clock import HANG_GUARD_S
from prefixtune.sandbox.waiting import wait_until
from prefixtune.tuning.phases import Phase

SDEP = "/apis/prefixtune.io/v1alpha1/namespaces/default/servingdeployments"
HASH_LABEL = "prefixtune.io/config-hash"
pytestmark = pytest.mark.timeout(HANG_GUARD_S)


async def test_approving_the_recommendation_rolls_it_out_once() -> None:
    spec = {
        "engine": "vllm", "model": tenant.MODEL, "replicas": 1,
        "tuning": {"mode": "observe", "trial": {"warmup": "1s", "measure": "4s", "minRequests": 5}},
    }  # fmt: skip
    body = tenant.resource("watch", spec)
    body["metadata"]["annotations"] = {
        "prefixtune.io/sandbox-workload": "qa",
        "prefixtune.io/sandbox-rate": "1",
    }
    async with tenant.harness(sandbox_options={"load": True, "speedup": 10.0}) as h:
        await h.apply(body)
        clock = h.sb.clock.now

        async def ticked(check: Any) -> Any:
            await h.reconcile("watch")
            return await check()

        async def recommended() -> dict[str, Any] | None:
            rec = (await h.status("watch")).get("recommendation")
            return rec if isinstance(rec, dict) and rec.get("id") else None

        rec = await wait_until(lambda: ticked(recommended), 240, "a recommendation", 0.5, clock)
        assert rec["config"]["prefixCaching"] is False  # the cache holds memory for nothing
        state = policy_state_of(await h.status("watch"))
        assert state is not None and state.recommendation is not None
        before = await h.get("/apis/apps/v1/namespaces/default/deployments/watch")
        assert before is not None
        assert before["spec"]["template"]["metadata"]["labels"][HASH_LABEL] == config_hash(state.current)

        # A stale approval (another id) rolls nothing out and says so.
        await h.api.patch(f"{SDEP}/watch", {"metadata": {"annotations": {APPROVE_ANNOTATION: "0" * 12}}})
        await h.reconcile("watch")
        assert any(e.get("reason") == "ApprovalIgnored" for e in await h.events("watch"))
        same = await h.get("/apis/apps/v1/namespaces/default/deployments/watch")
        assert same is not None and same["spec"]["template"] == before["spec"]["template"]

        await h.api.patch(f"{SDEP}/watch", {"metadata": {"annotations": {APPROVE_ANNOTATION: rec["id"]}}})
        target = config_hash(state.recommendation)

        async def rolled_out() -> dict[str, Any] | None:
            status = await h.status("watch")
            current = status.get("currentConfig") or {}
            if status.get("phase") == Phase.OBSERVING and current.get("prefixCaching") is False:
                return status
            return None

        status = await wait_until(lambda: ticked(rolled_out), 240, "the approved config to run", 0.5, clock)
        dep = await h.get("/apis/apps/v1/namespaces/default/deployments/watch")
        assert dep is not None and dep["spec"]["template"]["metadata"]["labels"][HASH_LABEL] == target
        approved = [e for e in await h.events("watch") if e.get("reason") == "Approved"]
        assert len(approved) == 1 and rec["id"] in approved[0]["message"]
        assert status.get("recommendation") is None  # rolled out: nothing left to approve
        for _ in range(6):  # the annotation stays; it is not acted on again
            await h.reconcile("watch")
            await asyncio.sleep(0.3)
        assert len([e for e in await h.events("watch") if e.get("reason") == "Approved"]) == 1

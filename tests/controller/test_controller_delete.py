"""Deleting a ServingDeployment never waits for the operator (no finalizer), and its children go.

The sandbox's API emulator honours finalizers (a delete only marks an object that carries one) and
garbage-collects by ownerReferences, as kube-apiserver and kube-controller-manager do. The operator
runs as its own process (``prefixtune run``), as in a cluster.
"""

from __future__ import annotations

import asyncio
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import kopf

from prefixtune.api.crd import build_crd
from prefixtune.controller.handlers import build_registry
from prefixtune.controller.operator import operator_argv, spawn_operator, stop_operator
from prefixtune.sandbox import up
from prefixtune.sandbox.kubelet import KubeletConfig
from prefixtune.sandbox.waiting import wait_until

SDEPS = "/apis/prefixtune.io/v1alpha1/namespaces/default/servingdeployments"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
KOPF_FINALIZER = kopf.OperatorSettings().persistence.finalizer  # kopf.zalando.org/KopfFinalizerMarker


def test_the_operator_registers_no_handler_that_needs_a_finalizer() -> None:
    """kopf adds its finalizer to a resource when any handler of it says it needs one (a timer or a
    daemon always does, as registered by kopf's decorators): none of the operator's does."""
    registry = build_registry(1.0)
    spawning = registry._spawning.get_all_handlers()
    changing = registry._changing.get_all_handlers()
    assert [h.id for h in spawning] == ["tune"]  # the tuning loop's tick is there, as a daemon
    assert isinstance(spawning[0], kopf._core.intents.handlers.DaemonHandler)
    assert not [h.id for h in (*spawning, *changing) if h.requires_finalizer]


async def test_a_delete_completes_with_the_operator_running_or_stopped() -> None:
    """With the operator running, a deleted resource goes at once and the garbage collector removes
    its engine Deployment; with the operator stopped, a delete completes too (nothing holds it). A
    resource that carries kopf's finalizer from an earlier release is released by the operator."""
    cfg = KubeletConfig(startup_delay_s=1e9, dcgm_port=None, resync_s=2.0)  # pods never boot: cheap
    with tempfile.TemporaryDirectory(prefix="prefixtune-delete-") as tmp:
        async with up.sandbox(up.SandboxOptions(crds=[build_crd()], config=cfg, load=False)) as sb:
            api = sb.api
            # Deadlines on the sandbox's clock: a machine too busy for it to keep up extends them.
            until = partial(wait_until, every_s=0.5, clock=sb.clock.now)
            spec = {"engine": "vllm", "model": "m/x", "tuning": {"mode": "off"}}
            body = {"apiVersion": "prefixtune.io/v1alpha1", "kind": "ServingDeployment"}

            async def handled(name: str) -> dict[str, Any] | None:
                obj = await api.get(f"{SDEPS}/{name}")
                child = await api.get(f"{DEPLOYMENTS}/{name}")
                return obj if obj is not None and child is not None and obj.get("status") else None

            async def gone(path: str) -> bool:
                return await api.get(path) is None

            proc = spawn_operator(operator_argv(str(sb.kubeconfig), tick_s=1.0), str(Path(tmp) / "op.log"))
            try:
                for name in ("running", "stopped"):
                    await api.create(SDEPS, {**body, "metadata": {"name": name}, "spec": spec})
                legacy = {"name": "legacy", "finalizers": [KOPF_FINALIZER]}
                await api.create(SDEPS, {**body, "metadata": legacy, "spec": spec})
                for name in ("running", "stopped", "legacy"):
                    obj = await until(lambda n=name: handled(n), 60.0, f"the operator handled {name}")
                    assert not obj["metadata"].get("finalizers"), obj["metadata"]
                # Several ticks later (the tuning loop runs), still no finalizer.
                await asyncio.sleep(3.0)
                obj = await api.get(f"{SDEPS}/running")
                assert obj is not None and not obj["metadata"].get("finalizers")
                await api.delete(f"{SDEPS}/running")
                await until(lambda: gone(f"{SDEPS}/running"), 10.0, "the deleted resource is gone")
                await until(
                    lambda: gone(f"{DEPLOYMENTS}/running"), 60.0, "its engine Deployment is garbage-collected"
                )
            finally:
                stop_operator(proc, 15.0)
            log = (Path(tmp) / "op.log").read_text(errors="replace")
            assert proc.returncode is not None
            await api.delete(f"{SDEPS}/stopped")  # no operator any more
            await until(lambda: gone(f"{SDEPS}/stopped"), 10.0, "deleted without the operator")
            await until(lambda: gone(f"{DEPLOYMENTS}/stopped"), 60.0, "its child collected")
            await api.delete(f"{SDEPS}/legacy")  # its old finalizer was removed while the operator ran
            await until(lambda: gone(f"{SDEPS}/legacy"), 10.0, "the released resource deleted")
    assert "Traceback" not in log, log[-3000:]

"""An engine that cannot start says why in its resource's status, end to end: the operator as its
own process (``prefixtune run``), the twin kubelet running the rendered engine as the engines do."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from prefixtune.api.crd import build_crd
from prefixtune.controller.operator import operator_argv, spawn_operator, stop_operator
from prefixtune.sandbox import up
from prefixtune.sandbox.kubelet import KubeletConfig
from prefixtune.sandbox.waiting import wait_until

SDEPS = "/apis/prefixtune.io/v1alpha1/namespaces/default/servingdeployments"


async def test_an_engine_that_cannot_start_says_why_in_the_ready_condition() -> None:
    """The twin kubelet runs the rendered engine as the engines do: four GPUs per pod is a tensor
    parallel size the twin's catalog refuses (exit 1, CrashLoopBackOff). The resource's Ready
    condition names the pod and carries that exit message (issue 18: it was in the pod only)."""
    cfg = KubeletConfig(startup_delay_s=0.2, backoff_initial_s=0.5, dcgm_port=None, resync_s=1.0)
    with tempfile.TemporaryDirectory(prefix="prefixtune-failing-") as tmp:
        async with up.sandbox(up.SandboxOptions(crds=[build_crd()], config=cfg, load=False)) as sb:
            spec = {"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": {"count": 4}}
            body = {"apiVersion": "prefixtune.io/v1alpha1", "kind": "ServingDeployment"}
            log = Path(tmp) / "op.log"
            proc = spawn_operator(operator_argv(str(sb.kubeconfig), tick_s=1.0), str(log))
            try:
                await sb.api.create(SDEPS, {**body, "metadata": {"name": "tp4"}, "spec": spec})

                async def failing() -> dict[str, Any] | None:
                    obj = await sb.api.get(f"{SDEPS}/tp4")
                    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
                    ready = next((c for c in conditions if c["type"] == "Ready"), None)
                    return ready if ready is not None and ready["reason"] == "EngineFailing" else None

                ready = await wait_until(
                    failing, 90.0, "Ready=False EngineFailing", every_s=0.5, clock=sb.clock.now
                )
            finally:
                stop_operator(proc, 15.0)
    assert ready["status"] == "False"
    assert "tensor parallel size" in ready["message"] and "got 4" in ready["message"], ready
    assert "pod tp4-" in ready["message"] and "back-off" not in ready["message"], ready

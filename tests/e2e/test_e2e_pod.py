"""In the sandbox (issue #18, item 1): a resource with spec.pod overrides deploys and becomes ready
with them in its pod and no drift loop; one on a GPU the twin does not model gets the note in its
status from the operator's reconcile and its GPU feature discovery name as the node selector (the
sandbox's twin cannot run that GPU: its pod is not checked here).

Short on purpose: each check stops once it has seen what it checks. The waits follow the sandbox's
clock (``Cluster.wait_for``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.e2e.test_e2e_tuning import MODEL, Cluster, resource, running_cluster

from prefixtune.controller.drift import DRIFT_REASON
from prefixtune.sandbox.clock import HANG_GUARD_S
from prefixtune.sandbox.kubelet import KubeletConfig

pytestmark = pytest.mark.timeout(HANG_GUARD_S)
HF = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
POD: dict[str, Any] = {
    "env": [HF, {"name": "TOKENIZERS_PARALLELISM", "value": "false"}],
    "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "model-cache"}}],
    "volumeMounts": [{"name": "cache", "mountPath": "/root/.cache/huggingface"}],
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}],
    "labels": {"team.example.com/cost-center": "ml"},
}


@pytest.fixture
async def pod_cluster() -> AsyncIterator[Cluster]:
    cfg = KubeletConfig(startup_delay_s=10.0, probe_period_s=1.0, backoff_initial_s=10.0)
    async with running_cluster(cfg) as running:
        yield running


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


async def test_pod_overrides_deploy_ready_and_an_unknown_gpu_is_noted(pod_cluster: Cluster) -> None:
    cluster = pod_cluster
    spec = {"engine": "vllm", "model": MODEL, "gpu": {"type": "H200"}, "tuning": {"mode": "off"}, "pod": POD}
    await cluster.apply(resource("fitted", spec, "rag"))
    unknown = {"engine": "vllm", "model": MODEL, "gpu": {"type": "NVIDIA-B200"}, "tuning": {"mode": "off"}}
    await cluster.apply(resource("b200", unknown, "rag"))

    async def ready() -> dict[str, Any] | None:
        status = await cluster.status("fitted")
        return status if _condition(status, "Ready").get("status") == "True" else None

    await cluster.wait_for(ready, 120, "the resource with spec.pod Ready")
    pods = await cluster.sb.api.list("/api/v1/namespaces/default/pods")
    (pod,) = [
        p for p in pods if (p["metadata"].get("labels") or {}).get("prefixtune.io/resource") == "fitted"
    ]
    (container,) = pod["spec"]["containers"]
    assert container["env"][0] == HF  # by reference: no value in the pod spec
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "model-cache"}} in pod["spec"]["volumes"]
    assert pod["spec"]["tolerations"][-1] == POD["tolerations"][0]
    assert pod["metadata"]["labels"]["team.example.com/cost-center"] == "ml"
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    # The operator's re-applies of what it rendered never read as someone else's change.
    assert not [e for e in await cluster.events("fitted") if e.get("reason") == DRIFT_REASON]
    assert _condition(await cluster.status("fitted"), "Degraded").get("status") != "True"

    async def noted() -> list[str] | None:
        notes = ((await cluster.status("b200")).get("diagnosis") or {}).get("notes") or []
        return notes or None

    notes = await cluster.wait_for(noted, 120, "the note of a GPU the twin does not model")
    assert notes[0].startswith("no twin model for GPU 'NVIDIA-B200'")
    assert "tuning works from measurements only" in notes[0]
    dep = await cluster.deployment("b200")
    assert dep is not None
    assert dep["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-B200"}

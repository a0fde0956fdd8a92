"""The sandbox's load generators: which workload a Service gets, and spreading it over the pods."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prefixtune.engines import get_adapter
from prefixtune.sandbox.kubelet import KubeletConfig
from prefixtune.sandbox.load import (
    RATE_ANNOTATION,
    WORKLOAD_ANNOTATION,
    Declared,
    declared_workload,
    pick_target,
)
from prefixtune.sandbox.up import SandboxOptions, sandbox

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _svc(
    annotations: dict[str, str] | None = None, owners: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "rag", "namespace": "ml", "annotations": annotations or {}}
    if owners:
        meta["ownerReferences"] = owners
    return {"metadata": meta, "spec": {"selector": {"app": "rag"}}}


def _sdep(name: str, uid: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid, "annotations": annotations}}


def test_declared_workload_precedence_service_then_owner_then_same_name() -> None:
    owner = _sdep("other-name", "u1", {WORKLOAD_ANNOTATION: "agent"})
    same = _sdep("rag", "u2", {WORKLOAD_ANNOTATION: "chatbot", RATE_ANNOTATION: "3"})
    on_service = _svc(
        {WORKLOAD_ANNOTATION: "rag", RATE_ANNOTATION: "8"}, [{"kind": "ServingDeployment", "uid": "u1"}]
    )
    assert declared_workload(on_service, [owner, same]) == Declared("rag", 8.0, "Service ml/rag")
    owned = _svc(owners=[{"kind": "ServingDeployment", "uid": "u1"}])
    assert declared_workload(owned, [owner, same]) == Declared(
        "agent", None, "ServingDeployment ml/other-name", owner="other-name"
    )
    assert declared_workload(_svc(), [owner, same]) == Declared(
        "chatbot", 3.0, "ServingDeployment ml/rag", owner="rag"
    )
    assert declared_workload(_svc(), [owner]) is None


@pytest.mark.parametrize("rate", ["fast", "0", "-2"])
def test_a_bad_rate_annotation_is_an_error_naming_it(rate: str) -> None:
    with pytest.raises(ValueError, match=RATE_ANNOTATION):
        declared_workload(_svc({WORKLOAD_ANNOTATION: "qa", RATE_ANNOTATION: rate}), [])


def test_pick_target_is_uniform_per_request() -> None:
    rng = random.Random(7)
    picks = [pick_target(["a", "b"], rng) for _ in range(2000)]
    assert 900 < picks.count("a") < 1100
    assert pick_target([], rng) is None


def _deployment(name: str, replicas: int) -> dict[str, Any]:
    adapter = get_adapter("vllm")
    argv = list(adapter.render(MODEL, adapter.default_config()).argv)
    labels = {"app": name}
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {"name": "engine", "image": "vllm/vllm-openai", "command": argv[:2], "args": argv[2:]}
                    ]
                },
            },
        },
    }


async def test_load_through_a_service_spreads_over_both_pods() -> None:
    cfg = KubeletConfig(startup_delay_s=1.0, probe_period_s=1.0, resync_s=0.2)
    async with sandbox(SandboxOptions(speedup=10.0, config=cfg)) as sb:
        await sb.api.create("/apis/apps/v1/namespaces/default/deployments", _deployment("qa", 2))
        service = {
            "metadata": {"name": "qa", "annotations": {WORKLOAD_ANNOTATION: "qa", RATE_ANNOTATION: "2"}},
            "spec": {"selector": {"app": "qa"}, "ports": [{"port": 80, "targetPort": 8000}]},
        }
        await sb.api.create("/api/v1/namespaces/default/services", service)
        assert sb.load is not None
        deadline = time.monotonic() + 40
        while True:
            stats = sb.load.stats().get("default/qa", {})
            by_target = stats.get("by_target", {})
            if len(by_target) == 2 and min(by_target.values()) >= 5 and stats.get("ok", 0) >= 10:
                break
            assert time.monotonic() < deadline, f"load did not spread over 2 pods in time: {stats}"
            await asyncio.sleep(0.1)
        pods = await sb.api.list("/api/v1/namespaces/default/pods?labelSelector=app%3Dqa")
        assert {f"http://{p['status']['podIP']}:8000" for p in pods} == set(by_target)
        # Both engines really served the traffic: their own counters moved.
        async with aiohttp.ClientSession() as http:
            for target in by_target:
                async with http.get(f"{target}/metrics") as resp:
                    families = {f.name: f for f in text_string_to_metric_families(await resp.text())}
                finished = sum(
                    s.value for s in families["vllm:request_success"].samples if s.name.endswith("_total")
                )
                assert finished >= 1

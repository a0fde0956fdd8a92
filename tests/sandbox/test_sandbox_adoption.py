"""Adoption through the emulated API server, with the operator's own ``reconcile``: a Deployment that
does not opt in to this very resource is never written; one that does is taken without an
ownerReference, keeping everything the operator does not own."""

from __future__ import annotations

from typing import Any

import pytest

from bench import _reliability_tenant as tenant
from prefixtune.controller.adoption import ADOPT_ANNOTATION, REFUSED_REASON
from prefixtune.controller.render import LABEL_RESOURCE

APPS = "/apis/apps/v1/namespaces/default"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SPEC = {"engine": "vllm", "model": MODEL, "replicas": 2, "adopt": {"deployment": "llama"}}


def user_deployment(annotations: dict[str, str]) -> dict[str, Any]:
    """A vLLM Deployment as a team writes it by hand (its own labels, selector, env)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "llama",
            "namespace": "default",
            "labels": {"app": "llama"},
            "annotations": annotations,
        },
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "llama"}},
            "template": {
                "metadata": {"labels": {"app": "llama"}},
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.33.0",
                            "command": ["vllm", "serve"],
                            "args": [MODEL, "--gpu-memory-utilization", "0.85", "--max-model-len", "8192"],
                            "env": [{"name": "TEAM_SETTING", "value": "kept"}],
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                            "readinessProbe": {
                                "httpGet": {"path": "/health", "port": 8000},
                                "periodSeconds": 2,
                            },
                        }
                    ],
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                },
            },
        },
    }


@pytest.mark.parametrize(
    ("annotations", "why"),
    [({}, "does not opt in"), ({ADOPT_ANNOTATION: "someone-else"}, "opts in to another resource")],
)
async def test_a_deployment_that_does_not_opt_in_to_this_resource_is_never_written(
    annotations: dict[str, str], why: str
) -> None:
    async with tenant.harness() as h:
        created = await h.api.create(f"{APPS}/deployments", user_deployment(annotations))
        await h.apply(tenant.resource("chat", SPEC))
        for _ in range(3):
            outcome = await h.reconcile("chat")
            assert outcome is not None and outcome.invalid
        ready = await h.ready("chat")
        assert (ready["status"], ready["reason"]) == ("False", REFUSED_REASON)
        assert why in ready["message"] and "nothing was changed" in ready["message"]
        dep = await h.get(f"{APPS}/deployments/llama")
        assert dep is not None and dep["metadata"]["generation"] == created["metadata"]["generation"] == 1
        assert dep["spec"] == created["spec"] and dep["metadata"]["labels"] == {"app": "llama"}
        marks = {k for k in dep["metadata"]["annotations"] if k.startswith("prefixtune.io/")}
        assert marks == set(annotations)  # the operator wrote no mark of its own
        assert await h.get("/api/v1/namespaces/default/services/chat") is None  # no write at all
        assert await h.get(f"{APPS}/deployments/chat") is None
        warnings = [e for e in await h.events("chat") if e["reason"] == REFUSED_REASON]
        assert len(warnings) == 1 and warnings[0]["type"] == "Warning"  # once, not per tick


async def test_an_opted_in_deployment_is_taken_without_an_owner_reference_keeping_the_teams_fields() -> None:
    async with tenant.harness() as h:
        await h.api.create(f"{APPS}/deployments", user_deployment({ADOPT_ANNOTATION: "chat"}))
        await h.apply(tenant.resource("chat", SPEC))
        outcome = await h.reconcile("chat")
        assert outcome is not None and not outcome.invalid, outcome
        assert "updated Deployment llama" in outcome.changes, outcome.changes
        assert await h.get(f"{APPS}/deployments/chat") is None  # no Deployment of its own
        dep = await h.get(f"{APPS}/deployments/llama")
        assert dep is not None and not dep["metadata"].get("ownerReferences")
        assert dep["spec"]["selector"] == {"matchLabels": {"app": "llama"}}
        template = dep["spec"]["template"]
        assert template["metadata"]["labels"]["app"] == "llama"
        assert template["metadata"]["labels"][LABEL_RESOURCE] == "chat"
        (container,) = template["spec"]["containers"]
        assert container["env"] == [{"name": "TEAM_SETTING", "value": "kept"}]
        args = container["args"]
        assert args[args.index("--gpu-memory-utilization") + 1] == "0.85"  # the starting config
        assert "8192" in args
        service = await h.get("/api/v1/namespaces/default/services/chat")
        assert service is not None and service["metadata"]["ownerReferences"][0]["name"] == "chat"
        ready = await h.ready("chat")
        assert ready["reason"] != REFUSED_REASON
        # The annotation removed: the Deployment is the team's again, and the next ticks leave it.
        await h.api.patch(
            f"{APPS}/deployments/llama", {"metadata": {"annotations": {ADOPT_ANNOTATION: None}}}
        )
        await h.api.patch(f"{APPS}/deployments/llama", {"spec": {"replicas": 3}})  # the team scales it
        before = await h.get(f"{APPS}/deployments/llama") or {}
        h.ctx.ensured.clear()
        await h.reconcile("chat")
        assert (await h.ready("chat"))["reason"] == REFUSED_REASON
        after = await h.get(f"{APPS}/deployments/llama") or {}
        assert after["metadata"]["generation"] == before["metadata"]["generation"]
        assert after["spec"]["replicas"] == 3 and after["spec"] == before["spec"]


async def test_drift_in_the_adopted_deployment_is_restored_for_owned_fields_only() -> None:
    async with tenant.harness() as h:
        await h.api.create(f"{APPS}/deployments", user_deployment({ADOPT_ANNOTATION: "chat"}))
        await h.apply(tenant.resource("chat", SPEC))
        await h.reconcile("chat")
        path = f"{APPS}/deployments/llama"
        adopted = await h.get(path) or {}
        # The team changes a field it owns: an env var. Kept, and not reported as drift.
        container = dict(adopted["spec"]["template"]["spec"]["containers"][0])
        container["env"] = [*container["env"], {"name": "ANOTHER", "value": "1"}]
        await h.api.patch(path, {"spec": {"template": {"spec": {"containers": [container]}}}})
        h.ctx.ensured.clear()
        await h.reconcile("chat")
        (kept,) = (await h.get(path) or {})["spec"]["template"]["spec"]["containers"]
        assert {"name": "ANOTHER", "value": "1"} in kept["env"]
        assert not [e for e in await h.events("chat") if e["reason"] == "LiveDrift"]
        # Someone scales the adopted Deployment: a field the operator owns, restored and reported.
        await h.api.patch(path, {"spec": {"replicas": 5}})
        h.ctx.ensured.clear()
        outcome = await h.reconcile("chat")
        assert "restored Deployment llama" in outcome.changes, outcome.changes
        restored = await h.get(path) or {}
        assert restored["spec"]["replicas"] == 2
        assert {"name": "ANOTHER", "value": "1"} in restored["spec"]["template"]["spec"]["containers"][0][
            "env"
        ]
        drift = [e for e in await h.events("chat") if e["reason"] == "LiveDrift"]
        assert len(drift) == 1 and "Deployment llama: spec.replicas" in drift[0]["message"]

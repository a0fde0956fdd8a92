"""The sandbox's demo timings (``sandbox/profile.py``): what they change, and that the API server
admits ServingDeployments with them on create and on every later write, as a mutating webhook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from prefixtune.api.crd import build_crd
from prefixtune.api.models import ServingDeploymentSpec
from prefixtune.sandbox.load import RATE_ANNOTATION
from prefixtune.sandbox.profile import DEMO_TIMINGS, PROFILE_ANNOTATION, DemoTimings
from prefixtune.sandbox.up import SandboxOptions, sandbox

ROOT = Path(__file__).resolve().parents[2]
SDEPS = "/apis/prefixtune.io/v1alpha1/namespaces/default/servingdeployments"


def _example(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / name).read_text())
    assert isinstance(doc, dict)
    return doc


def test_demo_timings_shorten_the_examples_and_keep_what_they_mean() -> None:
    rag = _example("vllm-rag.yaml")
    out = DemoTimings().resource(rag)
    tuning = out["spec"]["tuning"]
    assert tuning["trial"] == {"warmup": "2s", "measure": "8s", "minRequests": 6}
    assert tuning["budget"]["maxTrials"] == 5 and tuning["rollout"]["minInterval"] == "0s"
    assert tuning["rollout"]["strategy"] == "canary"  # the rest of the example stays
    assert tuning["metrics"] == {"source": "scrape"}  # the sandbox has no operator Prometheus
    assert out["metadata"]["annotations"][PROFILE_ANNOTATION] == DEMO_TIMINGS
    assert out["metadata"]["annotations"][RATE_ANNOTATION] == "1"
    assert rag["spec"]["tuning"]["trial"]["measure"] == "10m"  # the example itself is untouched
    ServingDeploymentSpec.model_validate(out["spec"])  # still a valid spec
    chat = DemoTimings(rate=0.5).resource(_example("sglang-chatbot.yaml"))
    assert chat["spec"]["replicas"] == 2  # 3 in the example: fewer twins for 2 cores
    assert chat["spec"]["tuning"]["drift"] == {"threshold": 1.0}
    assert chat["metadata"]["annotations"][RATE_ANNOTATION] == "0.5"
    # An observe-mode example still only recommends; an object's own load rate is kept.
    qa = _example("vllm-observe-qa.yaml")
    qa["metadata"]["annotations"][RATE_ANNOTATION] = "3"
    admitted = DemoTimings().resource(qa)
    assert admitted["spec"]["tuning"]["mode"] == "observe"
    assert admitted["metadata"]["annotations"][RATE_ANNOTATION] == "3"
    with pytest.raises(ValueError, match="max_trials"):
        DemoTimings(max_trials=0)


async def test_the_api_server_admits_servingdeployments_with_demo_timings(tmp_path: Path) -> None:
    options = SandboxOptions(crds=[build_crd()], demo_timings=DemoTimings(), load=False)
    async with sandbox(options) as sb:
        created = await sb.api.create(SDEPS, _example("vllm-rag.yaml"))
        assert created["spec"]["tuning"]["trial"]["measure"] == "8s"
        assert created["metadata"]["annotations"][PROFILE_ANNOTATION] == DEMO_TIMINGS
        # A later write that brings the example's timings back (kubectl apply's three-way merge of
        # the file) is admitted the same way: the stored object always says what runs.
        patch = {"spec": {"tuning": {"trial": {"measure": "10m"}, "budget": {"maxTrials": 15}}}}
        patched = await sb.api.patch(f"{SDEPS}/rag-llama-8b", patch)
        assert patched is not None
        assert patched["spec"]["tuning"]["trial"]["measure"] == "8s"
        assert patched["spec"]["tuning"]["budget"]["maxTrials"] == 5
        # Other kinds pass unchanged.
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}}
        stored = await sb.api.create("/api/v1/namespaces/default/configmaps", cm)
        assert "annotations" not in stored["metadata"] and stored["data"] == {"k": "v"}
    async with sandbox(SandboxOptions(crds=[build_crd()], load=False)) as sb:
        plain = await sb.api.create(SDEPS, _example("vllm-rag.yaml"))
        assert plain["spec"]["tuning"]["trial"]["measure"] == "10m"  # off unless asked for

"""``prefixtune pause|resume|pin|rollback|approve`` against the sandbox's emulated API server (the
kubernetes client over HTTP, as against a cluster): what each writes, and its errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prefixtune import control
from prefixtune.api import validate_spec
from prefixtune.api.crd import build_crd
from prefixtune.api.models import APPROVE_ANNOTATION
from prefixtune.cli import main as cli_main
from prefixtune.report.cluster import ClusterError, patch_deployment
from prefixtune.sandbox.emulator import serve_emulator, write_kubeconfig

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
SDEPS = "/apis/prefixtune.io/v1alpha1/namespaces/default/servingdeployments"
MERGE = {"Content-Type": "application/merge-patch+json"}
SPEC = {"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "config": {"blockSize": 16}}
TRIAL_1 = {"memoryFraction": 0.85, "blockSize": 32, "prefixCaching": True, "schedulePolicy": "fcfs"}
TRIALS = [
    {"index": 0, "epoch": 0, "role": "baseline", "outcome": "ok", "reason": "",
     "config": {"memoryFraction": 0.92, "blockSize": 16, "prefixCaching": True, "schedulePolicy": "fcfs"}},
    {"index": 1, "epoch": 0, "role": "trial", "outcome": "ok", "reason": "", "config": TRIAL_1},
    {"index": 2, "epoch": 0, "role": "trial", "outcome": "infeasible", "reason": "oom_startup: out of memory",
     "config": {"memoryFraction": 0.98, "blockSize": 16, "prefixCaching": True, "schedulePolicy": "fcfs"}},
]  # fmt: skip


@dataclass
class Cluster:
    em: Any
    kubeconfig: Path

    async def create(self, name: str, spec: dict[str, Any], status: dict[str, Any] | None = None) -> None:
        async with self.em.post(SDEPS, json={"metadata": {"name": name}, "spec": spec}) as response:
            assert response.status == 201, await response.text()
        if status is not None:
            async with self.em.patch(f"{SDEPS}/{name}/status", json={"status": status}, headers=MERGE) as r:
                assert r.status == 200, await r.text()

    async def get(self, name: str) -> dict[str, Any]:
        async with self.em.get(f"{SDEPS}/{name}") as response:
            assert response.status == 200
            body: dict[str, Any] = await response.json()
            return body

    async def run(self, command: Callable[[Sequence[str]], int], *args: str) -> int:
        return await asyncio.to_thread(command, [*args, "--kubeconfig", str(self.kubeconfig)])


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with serve_emulator() as (em, url):
        async with em.post(CRDS, json=build_crd()) as response:
            assert response.status == 201
        yield Cluster(em, write_kubeconfig(tmp_path / "kubeconfig", url))


async def test_pause_and_resume_write_spec_tuning_paused(cluster: Cluster, capsys: Any) -> None:
    await cluster.create("chat", SPEC)
    assert await cluster.run(control.pause, "chat") == 0
    assert "paused" in capsys.readouterr().out
    paused = await cluster.get("chat")
    assert paused["spec"]["tuning"]["paused"] is True
    assert await cluster.run(control.pause, "chat") == 0  # already paused: nothing written
    assert "already paused" in capsys.readouterr().out
    assert (await cluster.get("chat"))["metadata"]["resourceVersion"] == paused["metadata"]["resourceVersion"]
    assert await cluster.run(control.resume, "chat") == 0
    assert "resumed" in capsys.readouterr().out
    resumed = await cluster.get("chat")
    assert "paused" not in resumed["spec"].get("tuning", {}) and resumed["spec"]["config"] == SPEC["config"]
    assert await cluster.run(control.resume, "chat") == 0
    assert "not paused" in capsys.readouterr().out


async def test_pin_a_trial_writes_its_config_and_turns_tuning_off(cluster: Cluster, capsys: Any) -> None:
    await cluster.create("chat", SPEC, {"trials": TRIALS})
    assert await cluster.run(control.pin, "chat", "--trial", "1") == 0
    assert "pinned trial 1's config" in capsys.readouterr().out
    spec = (await cluster.get("chat"))["spec"]
    assert spec["config"] == TRIAL_1 and spec["tuning"]["mode"] == "off"
    valid, errors = validate_spec(spec)
    assert not errors and valid is not None and valid.tuning.mode == "off"
    assert valid.knob_config().block_size == 32 and valid.knob_config().memory_fraction == 0.85


async def test_pin_refuses_a_trial_that_does_not_exist_or_did_not_measure(
    cluster: Cluster, capsys: Any
) -> None:
    await cluster.create("chat", SPEC, {"trials": TRIALS})
    before = await cluster.get("chat")
    assert await cluster.run(control.pin, "chat", "--trial", "7") == 1
    err = capsys.readouterr().err
    assert "no trial 7 in status.trials" in err and "0, 1, 2" in err
    assert await cluster.run(control.pin, "chat", "--trial", "2") == 1
    assert "outcome infeasible" in capsys.readouterr().err
    assert await cluster.run(control.pin, "chat", "--best") == 1  # no status.bestConfig yet
    assert "no best config yet" in capsys.readouterr().err
    assert (await cluster.get("chat"))["spec"] == before["spec"]  # nothing written


async def test_pin_the_best(cluster: Cluster) -> None:
    await cluster.create("chat", SPEC, {"trials": TRIALS, "bestConfig": {"config": TRIAL_1, "score": 1.0}})
    assert await cluster.run(control.pin, "chat", "--best") == 0
    spec = (await cluster.get("chat"))["spec"]
    assert spec["config"] == TRIAL_1 and spec["tuning"]["mode"] == "off"


async def test_rollback_turns_tuning_off_and_keeps_the_spec_config(cluster: Cluster, capsys: Any) -> None:
    await cluster.create("chat", SPEC, {"currentConfig": TRIAL_1})
    assert await cluster.run(control.rollback, "chat") == 0
    out = capsys.readouterr().out
    assert "rolled back to the spec's config" in out and "block 32" in out  # what ran before
    spec = (await cluster.get("chat"))["spec"]
    assert spec["tuning"]["mode"] == "off" and spec["config"] == SPEC["config"]


async def test_approve_names_the_current_recommendation(cluster: Cluster, capsys: Any) -> None:
    observe = {**SPEC, "tuning": {"mode": "observe"}}
    await cluster.create("none", observe, {"phase": "Observing"})
    assert await cluster.run(control.approve, "none") == 1
    err = capsys.readouterr().err
    assert "no recommendation to approve" in err and "tuning.mode observe" in err
    rec = {"id": "0123456789ab", "config": TRIAL_1, "reason": "twin what-if"}
    await cluster.create("chat", observe, {"phase": "Observing", "recommendation": rec})
    assert await cluster.run(control.approve, "chat") == 0
    assert "approved recommendation 0123456789ab" in capsys.readouterr().out
    body = await cluster.get("chat")
    assert body["metadata"]["annotations"][APPROVE_ANNOTATION] == "0123456789ab"
    assert body["spec"] == observe  # the spec is the user's: approve writes only the annotation
    assert await cluster.run(control.approve, "chat") == 1  # acted on once: say how to give it again
    err = capsys.readouterr().err
    assert "already approved" in err and "kubectl annotate sdep chat prefixtune.io/approve-" in err


async def test_a_missing_resource_is_a_clear_error(cluster: Cluster, capsys: Any) -> None:
    for command in (control.pause, control.resume, control.rollback, control.approve):
        assert await cluster.run(command, "nope", "-n", "default") == 1
        assert "ServingDeployment default/nope not found" in capsys.readouterr().err


async def test_the_commands_are_prefixtune_subcommands(cluster: Cluster, capsys: Any) -> None:
    await cluster.create("chat", SPEC)
    assert await asyncio.to_thread(cli_main, ["pause", "chat", "--kubeconfig", str(cluster.kubeconfig)]) == 0
    assert (await cluster.get("chat"))["spec"]["tuning"]["paused"] is True
    with pytest.raises(SystemExit):
        cli_main(["pin", "chat"])  # --trial N or --best is required
    assert "one of the arguments --trial --best is required" in capsys.readouterr().err


async def test_a_resource_changed_since_it_was_read_is_not_overwritten(cluster: Cluster) -> None:
    await cluster.create("chat", SPEC)
    stale = await cluster.get("chat")
    async with cluster.em.patch(f"{SDEPS}/chat", json={"spec": {"replicas": 2}}, headers=MERGE) as r:
        assert r.status == 200
    patch = control.pause_change(stale).patch
    assert patch is not None
    with pytest.raises(ClusterError, match="changed by someone else meanwhile"):
        await asyncio.to_thread(patch_deployment, "default", "chat", patch, str(cluster.kubeconfig))
    assert "tuning" not in (await cluster.get("chat"))["spec"]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_a_pinned_trial_config_parses_back_to_the_trials_config(engine: str) -> None:
    """The operator names the pinned trial in its Pinned Event by comparing the spec's knob config
    with the trials' configs: the pinned status config must parse back to the very same knobs, the
    engine's from spec.config and the router's from spec.routing."""
    from prefixtune.api import parse_spec
    from prefixtune.control import pin_change
    from prefixtune.engines import get_adapter
    from prefixtune.engines.knobs import to_api

    base = get_adapter(engine).default_config()
    routed = base.with_(routing_policy="round_robin", cache_threshold=0.5, balance_rel_threshold=2.0)
    for config in (base, base.with_(memory_fraction=0.8125), base.with_(prefix_caching=False), routed):
        spec = {"engine": engine, "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 2}
        resource = {
            "metadata": {"name": "chat", "namespace": "default", "resourceVersion": "7"},
            "spec": spec,
            "status": {"bestConfig": {"config": to_api(config)}},
        }
        patch = pin_change(resource, None).patch
        assert patch is not None
        pinned = {**spec, **{k: v for k, v in patch["spec"].items() if k != "tuning"}}
        assert parse_spec(pinned).knob_config() == config

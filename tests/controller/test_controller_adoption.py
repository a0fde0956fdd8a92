"""Adopting an existing engine Deployment: the opt-in, the parse into a starting config, what the
operator writes in it (and what it leaves the owner's), and what it keeps when the resource goes."""

from __future__ import annotations

import copy
from typing import Any

from prefixtune.api import validate_spec
from prefixtune.controller import execute
from prefixtune.controller.admin import AdminPolicy
from prefixtune.controller.adoption import (
    ADOPT_ANNOTATION,
    adopted_spec,
    claim_adopted,
    opt_in_problems,
    released_config,
    render_engine_deployment,
)
from prefixtune.controller.drift import owned_drift
from prefixtune.controller.ownership import Claim
from prefixtune.controller.reconcile import deployment_key
from prefixtune.controller.render import LABEL_CONFIG_HASH, LABEL_RESOURCE, Owner, config_hash
from prefixtune.engines.base import KnobConfig
from prefixtune.tuning.phases import Phase, Step
from prefixtune.tuning.policy import initial_state
from prefixtune.tuning.settings import TuningSettings
from prefixtune.tuning.state import Trial

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
RAW = {"engine": "vllm", "model": MODEL, "replicas": 2, "adopt": {"deployment": "llama"}}
OWNER = Owner("team", "chat", "sdep-1", adopted="llama")
COMMAND = ["vllm", "serve", MODEL, "--gpu-memory-utilization", "0.8", "--block-size", "32",
           "--max-model-len", "8192"]  # fmt: skip


def _deployment(annotations: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "llama", "namespace": "team", "uid": "d-1", "resourceVersion": "5",
            "labels": {"app": "llama"},
            "annotations": {ADOPT_ANNOTATION: "chat"} if annotations is None else annotations,
            **meta,
        },
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "llama"}},
            "strategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": {"app": "llama"}},
                "spec": {
                    "containers": [
                        {"name": "sidecar", "image": "busybox", "command": ["sleep", "inf"]},
                        {
                            "name": "vllm", "image": "vllm/vllm-openai:v0.33.0", "command": COMMAND[:2],
                            "args": COMMAND[2:], "env": [{"name": "HF_TOKEN", "valueFrom": {
                                "secretKeyRef": {"name": "hf", "key": "token"}}}],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                            "volumeMounts": [{"name": "cache", "mountPath": "/root/.cache"}],
                        },
                    ],
                    "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}],
                    "nodeSelector": {"cloud.example/gpu": "l40s"},
                },
            },
        },
    }  # fmt: skip


def _adopted(deployment: dict[str, Any] | None = None) -> Any:
    found, problems = adopted_spec(RAW, deployment or _deployment())
    assert found is not None, problems
    return found


# --- the opt-in ----------------------------------------------------------------------------------


def test_a_deployment_that_opts_in_to_this_resource_may_be_adopted() -> None:
    assert opt_in_problems(_deployment(), "team", "chat", "llama") == []


def test_a_deployment_without_the_annotation_is_not_adopted() -> None:
    (problem,) = opt_in_problems(_deployment(annotations={}), "team", "chat", "llama")
    assert "does not opt in" in problem and f"{ADOPT_ANNOTATION}=chat" in problem


def test_a_deployment_that_opts_in_to_another_resource_is_not_adopted() -> None:
    other = _deployment(annotations={ADOPT_ANNOTATION: "payments"})
    (problem,) = opt_in_problems(other, "team", "chat", "llama")
    assert "another resource" in problem and "payments" not in problem
    assert claim_adopted(other, Owner("team", "chat", "u", adopted="llama")) is Claim.FOREIGN


def test_a_deployment_of_another_namespace_is_not_adopted() -> None:
    (problem,) = opt_in_problems(_deployment(namespace="payments"), "team", "chat", "llama")
    assert "another namespace" in problem


def test_a_missing_or_controlled_deployment_is_not_adopted() -> None:
    assert "does not exist" in opt_in_problems(None, "team", "chat", "llama")[0]
    owned = _deployment(ownerReferences=[{"kind": "Rollout", "name": "r", "uid": "x", "controller": True}])
    assert "controlled by Rollout r" in opt_in_problems(owned, "team", "chat", "llama")[0]


def test_the_opted_in_deployment_is_ours_without_an_owner_reference() -> None:
    owner = Owner("team", "chat", "u", adopted="llama")
    assert claim_adopted(_deployment(), owner) is Claim.OURS
    assert claim_adopted(_deployment(annotations={}), owner) is Claim.FOREIGN
    assert claim_adopted(_deployment(), Owner("team", "chat", "u")) is Claim.FOREIGN


# --- the starting config -------------------------------------------------------------------------


def test_the_engine_command_is_the_starting_config_with_its_other_flags_kept() -> None:
    adopted = _adopted()
    spec = adopted.spec
    assert adopted.container == "vllm"
    assert spec.knob_config().memory_fraction == 0.8 and spec.knob_config().block_size == 32
    assert spec.extra_args == ["--max-model-len", "8192"]
    assert spec.image == "vllm/vllm-openai:v0.33.0" and spec.gpu.count == 1
    again, errors = validate_spec(adopted.raw)  # stored as the last valid spec: it validates as is
    assert again == spec and not errors


def test_the_gpus_per_pod_follow_the_commands_tensor_parallel_degree() -> None:
    tp = _deployment()
    tp["spec"]["template"]["spec"]["containers"][1]["args"] += ["--tensor-parallel-size", "2"]
    found, problems = adopted_spec({**RAW, "gpu": {"count": 1}}, tp)  # 1: the API server's default
    assert found is not None, problems
    assert found.spec.gpu.count == 2 and "--tensor-parallel-size" not in found.spec.extra_args


def test_an_sglang_command_is_adopted_and_a_trtllm_one_is_refused_with_why() -> None:
    sglang = _deployment()
    sglang["spec"]["template"]["spec"]["containers"][1].update(
        command=["python3", "-m", "sglang.launch_server"],
        args=["--model-path", MODEL, "--mem-fraction-static", "0.8", "--context-length", "8192"],
        image="lmsysorg/sglang:v0.5.23",
    )
    found, problems = adopted_spec({**RAW, "engine": "sglang"}, sglang)
    assert found is not None, problems
    assert found.spec.knob_config().memory_fraction == 0.8 and found.spec.extra_args == [
        "--context-length",
        "8192",
    ]
    trtllm = _deployment()
    trtllm["spec"]["template"]["spec"]["containers"][1].update(
        command=["trtllm-serve"], args=[MODEL], image="nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24"
    )
    found, problems = adopted_spec({**RAW, "engine": "trtllm"}, trtllm)
    assert found is None and "options from a file" in problems[0]


def test_the_admins_image_policy_applies_to_the_adopted_image() -> None:
    """The canary runs the adopted pod template: its image is checked as a spec's would be."""
    private = _deployment()
    private["spec"]["template"]["spec"]["containers"][1]["image"] = "ghcr.io/team/vllm:1"
    spec = _adopted(private).spec
    assert spec.image == "ghcr.io/team/vllm:1"
    assert AdminPolicy().spec_problems(spec)[0].startswith("spec.image:")
    assert AdminPolicy().spec_problems(_adopted().spec) == []


def test_once_tuning_began_the_start_is_the_policys_not_the_live_best() -> None:
    start = KnobConfig(0.8, 32, False, "fcfs")
    found, _ = adopted_spec(RAW, _deployment(), start)
    assert found is not None and found.spec.knob_config() == start


def test_the_command_the_operator_wrote_reads_back_as_the_same_deployment() -> None:
    """Every tick parses the live command again: once the operator rendered a config into it, the
    flags, image and GPUs read back the same (no new tuning epoch from its own write)."""
    live = _deployment()
    first = _adopted(live)
    best = KnobConfig(0.92, 16, True, "fcfs")
    written = render_engine_deployment(OWNER, first.spec, best, "baseline", 2, live)
    again, problems = adopted_spec(RAW, written, first.spec.knob_config())
    assert again is not None, problems
    assert deployment_key(again.spec) == deployment_key(first.spec) and again.spec == first.spec
    assert adopted_spec(RAW, written)[0].spec.knob_config() == best  # type: ignore[union-attr]


def test_a_command_the_parser_refuses_is_a_clear_problem() -> None:
    bad = _deployment()
    bad["spec"]["template"]["spec"]["containers"][1]["args"] = [MODEL, "--block-size", "seven"]
    found, problems = adopted_spec(RAW, bad)
    assert found is None and "does not parse" in problems[0] and "block" in problems[0]


def test_a_shell_wrapped_command_or_another_engine_or_model_is_refused() -> None:
    shell = _deployment()
    shell["spec"]["template"]["spec"]["containers"][1].update(
        command=["sh", "-c", " ".join(COMMAND)], args=[]
    )
    assert "no container's command" in adopted_spec(RAW, shell)[1][0]
    assert (
        "runs vllm, spec.engine is sglang" in adopted_spec({**RAW, "engine": "sglang"}, _deployment())[1][0]
    )
    other = adopted_spec({**RAW, "model": "Qwen/Qwen2.5-7B"}, _deployment())[1]
    assert "serves model" in other[0]


def test_what_the_command_sets_may_not_be_set_in_the_spec() -> None:
    _, problems = adopted_spec({**RAW, "config": {"blockSize": 16}, "extraArgs": ["--x"]}, _deployment())
    assert problems[:2] == [
        "spec.config: set by the adopted Deployment's command; omit it with spec.adopt",
        "spec.extraArgs: set by the adopted Deployment's command; omit it with spec.adopt",
    ]


def test_trials_must_run_beside_the_adopted_deployment() -> None:
    _, errors = validate_spec({**RAW, "replicas": 1})
    assert any("adopt: trials must run beside" in str(e) for e in errors)
    _, errors = validate_spec({**RAW, "replicas": 1, "tuning": {"mode": "observe"}})
    assert not errors
    subset = {"strategy": "rolling", "maxTrialReplicas": 1}
    assert not validate_spec({**RAW, "replicas": 3, "tuning": {"rollout": subset}})[1]


# --- what the operator writes in it --------------------------------------------------------------


def test_the_adopted_deployment_gets_the_tuned_command_and_keeps_everything_else() -> None:
    live = _deployment()
    spec = _adopted(live).spec
    config = KnobConfig(0.9, 16, True, "fcfs")
    body = render_engine_deployment(OWNER, spec, config, "baseline", 2, live)
    assert body["metadata"]["name"] == "llama" and "ownerReferences" not in body["metadata"]
    assert body["spec"]["selector"] == live["spec"]["selector"]  # immutable, the owner's
    assert body["spec"]["replicas"] == 2
    template = body["spec"]["template"]
    assert template["metadata"]["labels"]["app"] == "llama"
    assert template["metadata"]["labels"][LABEL_RESOURCE] == "chat"
    assert template["metadata"]["labels"][LABEL_CONFIG_HASH] == config_hash(config)
    sidecar, engine = template["spec"]["containers"]
    assert sidecar == live["spec"]["template"]["spec"]["containers"][0]
    assert engine["command"] + engine["args"] != COMMAND
    assert "--block-size" in engine["args"] and "16" in engine["args"] and "8192" in engine["args"]
    for key in ("env", "resources", "volumeMounts", "image"):
        assert engine[key] == live["spec"]["template"]["spec"]["containers"][1][key]
    assert template["spec"]["volumes"] == live["spec"]["template"]["spec"]["volumes"]
    assert template["spec"]["nodeSelector"] == {"cloud.example/gpu": "l40s"}


def test_the_canary_is_the_adopted_pod_with_the_trial_command_owned_by_the_resource() -> None:
    live = _deployment()
    spec = _adopted(live).spec
    trial = KnobConfig(0.85, 64, True, "fcfs")
    body = render_engine_deployment(OWNER, spec, trial, "canary", 1, live)
    assert body["metadata"]["name"] == "chat-canary"
    assert body["metadata"]["ownerReferences"][0]["uid"] == "sdep-1"
    assert body["spec"]["selector"]["matchLabels"] == {LABEL_RESOURCE: "chat", "prefixtune.io/role": "canary"}
    engine = body["spec"]["template"]["spec"]["containers"][1]
    assert engine["env"] == live["spec"]["template"]["spec"]["containers"][1]["env"]
    assert "64" in engine["args"]


def test_drift_is_the_owned_fields_only_in_the_adopted_deployment() -> None:
    live = _deployment()
    spec = _adopted(live).spec
    config = spec.knob_config()
    body, _ = execute.annotated(render_engine_deployment(OWNER, spec, config, "baseline", 2, live))
    served = copy.deepcopy(body)
    served["metadata"]["annotations"][ADOPT_ANNOTATION] = "chat"
    # The owner changes what it owns (an env var, the image): rendered over, so not drift.
    owners = copy.deepcopy(served)
    owners["spec"]["template"]["spec"]["containers"][1]["env"].append({"name": "X", "value": "1"})
    owners["spec"]["template"]["spec"]["containers"][1]["image"] = "vllm/vllm-openai:v0.34.0"
    again, _ = execute.annotated(render_engine_deployment(OWNER, spec, config, "baseline", 2, owners))
    assert execute.live_drift(again, owners) == ()
    # Someone changes what the operator owns (the replicas, the tuned flags): drift.
    ours = copy.deepcopy(served)
    ours["spec"]["replicas"] = 5
    ours["spec"]["template"]["spec"]["containers"][1]["args"].append("--enforce-eager")
    again, _ = execute.annotated(render_engine_deployment(OWNER, spec, config, "baseline", 2, ours))
    assert execute.live_drift(again, ours) == (
        "spec.replicas",
        "spec.template.spec.containers[vllm].args",
    )
    assert owned_drift(again, served) == ()


# --- release -------------------------------------------------------------------------------------


def test_on_release_the_adopted_deployment_holds_the_stable_config_never_a_canary_trials() -> None:
    start = KnobConfig(0.8, 32, True, "fcfs")
    trial_config = KnobConfig(0.92, 16, True, "fcfs")
    settings = TuningSettings(strategy="canary")
    state = initial_state("vllm", settings, start, 1, "key")
    assert released_config(state) == start
    trial = Trial(id=1, config=trial_config, role="trial", epoch=state.epoch, started_at=0.0)
    for step in (Step.ROLLING_OUT, Step.WARMING_UP, Step.MEASURING):
        in_flight = state.model_copy(
            update={"phase": Phase.EXPLORING, "step": step, "trials": [trial], "active": 1}
        )
        assert released_config(in_flight) == start  # the trial runs on the canary

"""Engine pods (issue #17, items 4 and 5): requests sized from the model, a restricted security
context, no service-account token, the API key from a Secret and never in extraArgs; rendered and
validated against the Kubernetes schema."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from prefixtune.api import parse_spec
from prefixtune.api.validation import validate_spec
from prefixtune.controller.engine_pod import requests, weight_bytes
from prefixtune.controller.render import Owner, render_deployment

OWNER = Owner("team-a", "llama", "uid-1")
KUBE = kubernetes_validate.utils.latest_version()


def _pod(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = parse_spec(raw)
    dep = render_deployment(OWNER, spec, spec.knob_config(), "baseline", 1)
    kubernetes_validate.validate(dep, KUBE, strict=True)
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_engine_pods_are_hardened_and_request_cpu_and_memory(engine: str) -> None:
    pod, container = _pod({"engine": engine, "model": "meta-llama/Llama-3.1-8B-Instruct"})
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    ctx = container["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False and ctx["privileged"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and "serviceAccountName" not in pod
    wanted = container["resources"]["requests"]
    assert wanted["cpu"] == "4" and wanted["memory"] == "20Gi"  # 8 + 4/GPU + half of 16.1 GB
    assert wanted["nvidia.com/gpu"] == "1"


def test_requests_grow_with_the_model_and_gpus_and_can_be_overridden() -> None:
    small = requests(parse_spec({"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct"}))
    big = requests(
        parse_spec({"engine": "vllm", "model": "meta-llama/Llama-3.3-70B-Instruct", "gpu": {"count": 4}})
    )
    assert int(big["memory"].removesuffix("Gi")) > int(small["memory"].removesuffix("Gi"))
    assert big["cpu"] == "10"
    assert weight_bytes("org/Some-32B-Chat") == 64e9 and weight_bytes("org/Some-32B-AWQ") == 16e9
    assert weight_bytes("unknown") == 16e9
    own = {"engine": "vllm", "model": "m/x", "resources": {"cpu": "7500m", "memory": "96Gi"}}
    assert requests(parse_spec(own)) == {"cpu": "7500m", "memory": "96Gi"}
    _, errors = validate_spec({"engine": "vllm", "model": "m/x", "resources": {"memory": "lots"}})
    assert [e.path for e in errors] == ["spec.resources.memory"]


@pytest.mark.parametrize(
    ("engine", "env", "args"),
    [("vllm", "VLLM_API_KEY", []), ("sglang", "ENGINE_API_KEY", ["--api-key", "$(ENGINE_API_KEY)"])],
)
def test_the_api_key_comes_from_a_secret_reference(engine: str, env: str, args: list[str]) -> None:
    raw = {"engine": engine, "model": "m/x", "apiKeySecret": {"name": "llama-key", "key": "token"}}
    _, container = _pod(raw)
    assert container["env"] == [
        {"name": env, "valueFrom": {"secretKeyRef": {"name": "llama-key", "key": "token"}}}
    ]
    assert container["args"][len(container["args"]) - len(args) :] == args
    _, errors = validate_spec({**raw, "engine": "trtllm"})
    assert [e.path for e in errors] == ["spec.apiKeySecret"]


@pytest.mark.parametrize(
    "args",
    [
        ["--api-key", "sk-live-abcdef123456"],
        ["--api-key=sk-live-abcdef123456"],
        ["--api_key", "hf_abcdef123456"],
    ],
)
def test_secrets_in_extra_args_are_refused_without_quoting_them(args: list[str]) -> None:
    _, errors = validate_spec({"engine": "vllm", "model": "m/x", "extraArgs": args})
    assert errors and errors[0].path == "spec.extraArgs[0]" and "apiKeySecret" in errors[0].message
    assert "abcdef123456" not in json.dumps([str(e) for e in errors])


def test_flags_that_only_mention_tokens_are_not_secrets() -> None:
    from prefixtune.api.secret_flags import is_secret_flag

    assert (
        is_secret_flag("--api-key") and is_secret_flag("--hf_token=x") and is_secret_flag("--admin-password")
    )
    for flag in (
        "--long-prefill-token-threshold",
        "--max-num-batched-tokens",
        "--tokenizer",
        "--ssl-keyfile",
    ):
        assert not is_secret_flag(flag), flag

"""What a real engine pod needs besides its command (issue 16): /dev/shm, a startupProbe sized to the
model, and probes on the endpoints each engine meant for them."""

from __future__ import annotations

from typing import Any

import pytest

from prefixtune.api import parse_spec
from prefixtune.controller import podspec
from prefixtune.controller import render as R
from prefixtune.controller.settings import ready_timeout_s

OWNER = R.Owner(namespace="team", name="rag", uid="uid-1")


def _spec(engine: str = "vllm", **extra: Any) -> Any:
    return parse_spec({"engine": engine, "model": "meta-llama/Llama-3.1-8B-Instruct", **extra})


def _pod(spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    dep = R.render_deployment(OWNER, spec, spec.knob_config(), "baseline", 1)
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def _shm(pod: dict[str, Any], container: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    volumes = [v for v in pod.get("volumes", []) if v["name"] == podspec.SHM_VOLUME]
    mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
    return volumes, mounts


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_tensor_parallel_pods_get_a_memory_backed_dev_shm(engine: str) -> None:
    pod, container = _pod(_spec(engine, gpu={"count": 2}))
    volumes, mounts = _shm(pod, container)
    assert volumes == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}]
    assert mounts == [{"name": "dshm", "mountPath": "/dev/shm"}]
    # vLLM's multi-GPU message queue alone needs 16 MiB x 10 chunks; Kubernetes' default is 64 MiB.
    assert podspec.shm_size_bytes(_spec(engine, gpu={"count": 2})) > 160 * 2**20


def test_single_gpu_pods_keep_the_default_shm_and_trt_keeps_its_options_mount() -> None:
    pod, container = _pod(_spec("vllm"))
    assert _shm(pod, container) == ([], [])
    pod, container = _pod(_spec("trtllm", gpu={"count": 4}))
    assert _shm(pod, container)[0][0]["emptyDir"]["sizeLimit"] == "4Gi"
    assert any(v["name"] == R.OPTIONS_VOLUME for v in pod["volumes"])


def test_vllm_native_cpu_offload_gets_dev_shm_but_lmcache_does_not() -> None:
    native = _spec("vllm", extraArgs=["--kv-offloading-size", "8"])
    assert _shm(*_pod(native))[0]
    lmcache = _spec("vllm", extraArgs=["--kv-offloading-size", "8", "--kv-offloading-backend", "lmcache"])
    assert _shm(*_pod(lmcache)) == ([], [])


def test_startup_probe_is_sized_from_the_weights_per_gpu() -> None:
    small = _spec("vllm")  # 8B: 16 GB of bf16 weights on one GPU
    big = parse_spec({"engine": "vllm", "model": "meta-llama/Llama-3.3-70B-Instruct", "gpu": {"count": 2}})
    _, c_small = _pod(small)
    _, c_big = _pod(big)
    budget_small = c_small["startupProbe"]["periodSeconds"] * c_small["startupProbe"]["failureThreshold"]
    budget_big = c_big["startupProbe"]["periodSeconds"] * c_big["startupProbe"]["failureThreshold"]
    # The old liveness probe killed anything still loading after 300 s + 6 x 10 s.
    assert budget_big > 360 and budget_big > budget_small
    assert budget_big >= podspec.STARTUP_OVERHEAD_S + 70e9 / podspec.LOAD_BYTES_PER_S
    # Liveness and readiness start after the startup probe: no initial delay for the load.
    assert "initialDelaySeconds" not in c_big["livenessProbe"]
    assert ready_timeout_s(big) >= budget_big - podspec.PROBE_PERIOD_S


def test_startup_timeout_overrides_and_unknown_models_get_a_generous_budget() -> None:
    spec = _spec("vllm", startupTimeout="45m")
    _, container = _pod(spec)
    assert container["startupProbe"]["failureThreshold"] * 10 == 2700
    unknown = parse_spec({"engine": "vllm", "model": "acme/house-model"})
    assert podspec.startup_budget_s(unknown) == podspec.UNKNOWN_MODEL_STARTUP_S
    named = parse_spec({"engine": "vllm", "model": "acme/house-model-32B"})
    assert podspec.weight_bytes(named.model) == 64e9


def test_bad_startup_timeout_is_refused_with_the_field() -> None:
    from prefixtune.api import validate_spec

    spec, errors = validate_spec(
        {"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "startupTimeout": "soon"}
    )
    assert spec is None and any("startupTimeout" in str(e) for e in errors)


def test_sglang_readiness_uses_ready_not_the_generating_health_endpoint() -> None:
    _, container = _pod(_spec("sglang"))
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    # /health generates a token and waits up to SGLANG_HEALTH_CHECK_TIMEOUT (20 s).
    assert container["livenessProbe"]["timeoutSeconds"] > 20
    for engine in ("vllm", "trtllm"):
        _, container = _pod(_spec(engine))
        assert container["readinessProbe"]["httpGet"]["path"] == "/health"


def test_ready_timeout_grows_with_the_replicas_that_load_in_sequence() -> None:

    def spec(replicas: int, model: str = "meta-llama/Llama-3.3-70B-Instruct") -> Any:
        return parse_spec({"engine": "vllm", "model": model, "replicas": replicas, "gpu": {"count": 4}})

    one, eight = spec(1), spec(8)
    per_pod = podspec.startup_budget_s(one)
    assert ready_timeout_s(eight) == pytest.approx(8 * per_pod)
    assert ready_timeout_s(eight) > 1800  # no 30-minute cap: 8 replicas x ~11 minutes of loading
    assert ready_timeout_s(one) >= 600

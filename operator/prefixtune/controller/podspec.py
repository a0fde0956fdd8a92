"""What an engine pod needs besides its command: shared memory, a startup probe sized to the model,
and probes on the endpoints each engine meant for them.

Pure functions of the validated spec; ``render.render_deployment`` applies them.

- ``/dev/shm``: Kubernetes gives a container 64 MiB. vLLM's multi-GPU executor puts its message
  queue there (VLLM_MQ_MAX_CHUNK_BYTES_MB 16 MiB x 10 chunks = 160 MiB, vllm/distributed/device_communicators/
  shm_broadcast.py; "Insufficient space in /dev/shm" otherwise), NCCL's shared-memory transport and
  TensorRT-LLM's MPI workers use it too, and vLLM's native CPU KV offload exchanges blocks through it.
  So a memory-backed emptyDir is mounted there whenever more than one GPU is used or native offload is on.
  Its size counts against the pod's memory.
- startupProbe: an engine loads its weights (and TensorRT-LLM autotunes) before /health answers; a
  liveness probe alone kills a 70B model still loading after minutes. The startup budget is a fixed
  overhead plus the weights per GPU at a conservative load rate, overridable with spec.startupTimeout.
- Probes: readiness on the engine's cheap endpoint (SGLang /ready; /health runs a generation there),
  liveness on /health with a timeout above SGLang's 20 s health-check generation timeout.
"""

from __future__ import annotations

import math
import re
from typing import Any

from prefixtune.api import owned
from prefixtune.api.models import ServingDeploymentSpec
from prefixtune.engines import get_adapter

GIB = 2**30
SHM_VOLUME = owned.SHM_VOLUME  # the operator's names (api/owned.py: spec.pod may not use them)
SHM_PATH = owned.SHM_PATH
SHM_MIN_BYTES = 2 * GIB  # well above vLLM's 160 MiB message queue, room for NCCL and MPI
SHM_PER_GPU_BYTES = 1 * GIB

STARTUP_OVERHEAD_S = 300.0  # CUDA graphs, TensorRT-LLM autotuning, tokenizer and server start
LOAD_BYTES_PER_S = 100e6  # per GPU: a first download or a slow volume, not a warm NVMe
UNKNOWN_MODEL_STARTUP_S = 1800.0  # a model whose size cannot be told from its name
BF16_BYTES_PER_PARAM = 2.0
PROBE_PERIOD_S = 10
LIVENESS_TIMEOUT_S = 30  # > SGLANG_HEALTH_CHECK_TIMEOUT (20 s): /health runs a generation on SGLang
READINESS_TIMEOUT_S = 5
_PARAMS = re.compile(r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?)[bB](?![a-zA-Z0-9])")


def needs_shm(spec: ServingDeploymentSpec) -> bool:
    """More than one GPU, or vLLM's native CPU KV offload (--kv-offloading-size, backend native)."""
    if spec.gpu.count > 1:
        return True
    adapter = get_adapter(spec.engine)
    rendered = adapter.render(spec.model, spec.knob_config(), spec.extra_args)
    options = adapter.parse(rendered.argv, rendered.files).options
    return bool(options.host_cache_bytes) and (options.host_cache_backend or "native") == "native"


def shm_size_bytes(spec: ServingDeploymentSpec) -> int:
    return max(SHM_MIN_BYTES, SHM_PER_GPU_BYTES * spec.gpu.count)


def shm_volume(spec: ServingDeploymentSpec) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(volume, volumeMount) of a memory-backed /dev/shm, or None when the pod needs none."""
    if not needs_shm(spec):
        return None
    size = f"{shm_size_bytes(spec) // GIB}Gi"
    volume = {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": size}}
    return volume, {"name": SHM_VOLUME, "mountPath": SHM_PATH}


def weight_bytes(model: str) -> float | None:
    """The model's weight bytes: the twin catalog's figure for a known model, else the parameter count
    in its name ("...-70B-...") at bf16 (4-bit ``awq``/``gptq``/``int4``: 0.5 B a parameter;
    ``fp8``/``int8``: 1 B); None when neither tells. The one estimate both the startup budget and
    the pod's memory request (``engine_pod.requests``) use."""
    from prefixtune.twin.catalog import get_model

    try:
        return float(get_model(model).weight_bytes)
    except (KeyError, ValueError):
        pass
    found = _PARAMS.findall(model.rsplit("/", 1)[-1])
    if not found:
        return None
    lower = model.lower()
    per = BF16_BYTES_PER_PARAM
    if any(w in lower for w in ("awq", "gptq", "int4", "4bit")):
        per = 0.5
    if any(w in lower for w in ("fp8", "int8", "8bit")):
        per = 1.0
    return float(found[-1]) * 1e9 * per


def startup_budget_s(spec: ServingDeploymentSpec) -> float:
    """How long the engine may take to start: spec.startupTimeout, else overhead + weights per GPU
    at LOAD_BYTES_PER_S (UNKNOWN_MODEL_STARTUP_S when the size is unknown)."""
    if spec.startup_timeout is not None:
        return float(spec.startup_timeout)
    weights = weight_bytes(spec.model)
    if weights is None:
        return UNKNOWN_MODEL_STARTUP_S
    return STARTUP_OVERHEAD_S + weights / spec.gpu.count / LOAD_BYTES_PER_S


def _http(path: str, port: str) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}}


def probes(spec: ServingDeploymentSpec, port: str) -> dict[str, dict[str, Any]]:
    """startupProbe, readinessProbe and livenessProbe of the engine container. Readiness and liveness
    start once the startup probe passed, so neither needs an initial delay for the weight load."""
    adapter = get_adapter(spec.engine)
    budget = startup_budget_s(spec)
    return {
        "startupProbe": {
            **_http(adapter.health_path, port),
            "periodSeconds": PROBE_PERIOD_S,
            "timeoutSeconds": LIVENESS_TIMEOUT_S,
            "failureThreshold": max(1, math.ceil(budget / PROBE_PERIOD_S)),
        },
        "readinessProbe": {
            **_http(adapter.ready_path, port),
            "periodSeconds": 5,
            "timeoutSeconds": READINESS_TIMEOUT_S,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            **_http(adapter.health_path, port),
            "periodSeconds": PROBE_PERIOD_S,
            "timeoutSeconds": LIVENESS_TIMEOUT_S,
            "failureThreshold": 6,
        },
    }

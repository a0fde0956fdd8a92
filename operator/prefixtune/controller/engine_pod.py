"""What every engine pod gets besides its command (issue #17): requests sized from the model, a
restricted security context where the engines allow it, no service-account token, and the API key
from a Secret. Pure functions; ``render.render_deployment`` applies them.

The engines' images run as root and write caches under their home directory and /tmp (Hugging Face
downloads, torch.compile and Triton caches, TensorRT-LLM engine builds): ``runAsNonRoot`` and
``readOnlyRootFilesystem`` would break vllm/vllm-openai, lmsysorg/sglang and NGC's tensorrt-llm
images as published, so they are not set. What every engine tolerates is set: no privilege
escalation, every capability dropped (the GPUs come from the device plugin, not from capabilities),
the runtime's default seccomp profile, no service links (a Service named ``vllm`` would set
``VLLM_PORT``, which vLLM reads as its own setting).
"""

from __future__ import annotations

import math
from typing import Any

from prefixtune.api import owned
from prefixtune.api.models import ServingDeploymentSpec
from prefixtune.controller import podspec

GIB = 1024**3
DEFAULT_WEIGHT_BYTES = 16e9  # an unknown model without a size in its name: an 8B model in BF16
# How each engine reads the key (see api/rules.py API_KEY_ENGINES): vLLM reads VLLM_API_KEY from its
# environment (vllm/envs.py); SGLang takes --api-key, given as $(ENGINE_API_KEY), which the kubelet
# expands from the container's environment (the value is never in the pod spec). The names are the
# operator's (api/owned.py): spec.pod.env may not set them.
API_KEY_ENV = owned.API_KEY_ENV  # the env var the Secret's value lands in
ENV_NAMES = owned.API_KEY_ENV_NAMES
ARG_FLAGS = {"sglang": "--api-key"}

CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
POD_SECURITY: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}


def weight_bytes(model: str) -> float:
    """The model's weights in bytes (``podspec.weight_bytes``), an 8B model's when its size cannot
    be told."""
    found = podspec.weight_bytes(model)
    return DEFAULT_WEIGHT_BYTES if found is None else found


def requests(spec: ServingDeploymentSpec) -> dict[str, str]:
    """CPU and memory requests of one engine pod (``spec.resources`` overrides each).

    Memory: 8 GiB (API server, tokenizer, Python) + 4 GiB per GPU (CUDA context, pinned buffers)
    + half the weights (the loader's resident part; the rest is reclaimable page cache). CPU: 2 +
    2 per GPU (the API server, the engine core's scheduling loop and one worker per GPU).
    Requests, so the scheduler places the pod where it fits and it is not the first evicted.
    """
    gpus = int(spec.gpu.count)
    memory = 8 + 4 * gpus + math.ceil(weight_bytes(spec.model) / GIB / 2)
    out = {"cpu": str(2 + 2 * gpus), "memory": f"{memory}Gi"}
    if spec.resources is not None:
        if spec.resources.cpu is not None:
            out["cpu"] = spec.resources.cpu
        if spec.resources.memory is not None:
            out["memory"] = spec.resources.memory
        if spec.resources.ephemeral_storage is not None:
            out["ephemeral-storage"] = spec.resources.ephemeral_storage
    return {**out, **huge_pages(spec)}


def huge_pages(spec: ServingDeploymentSpec) -> dict[str, str]:
    """Huge pages of the pod (``spec.resources.hugepages2Mi/1Gi``): Kubernetes wants them as a
    request and an equal limit."""
    res = spec.resources
    if res is None:
        return {}
    given = {"hugepages-2Mi": res.hugepages_2mi, "hugepages-1Gi": res.hugepages_1gi}
    return {name: value for name, value in given.items() if value is not None}


def secret_env(spec: ServingDeploymentSpec) -> list[dict[str, Any]]:
    """The API key from the Secret (``valueFrom.secretKeyRef``), in the variable the engine reads."""
    ref = spec.api_key_secret
    name = ENV_NAMES.get(str(spec.engine))
    if ref is None or name is None:
        return []
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def secret_args(spec: ServingDeploymentSpec) -> list[str]:
    """Arguments that name the key by reference (``$(VAR)``, expanded by the kubelet)."""
    flag = ARG_FLAGS.get(str(spec.engine))
    if spec.api_key_secret is None or flag is None:
        return []
    return [flag, f"$({ENV_NAMES[str(spec.engine)]})"]


def harden(container: dict[str, Any], pod_spec: dict[str, Any], spec: ServingDeploymentSpec) -> None:
    """Apply the requests, the security context, the token and the secret to a rendered pod (in place)."""
    resources = container.setdefault("resources", {})
    resources.setdefault("requests", {}).update(requests(spec))
    resources.setdefault("limits", {}).update(huge_pages(spec))
    container["securityContext"] = dict(CONTAINER_SECURITY)
    env = secret_env(spec)
    if env:
        container["env"] = [*container.get("env", []), *env]
    container["args"] = [*container.get("args", []), *secret_args(spec)]
    pod_spec["securityContext"] = dict(POD_SECURITY)
    pod_spec["automountServiceAccountToken"] = False
    pod_spec["enableServiceLinks"] = False

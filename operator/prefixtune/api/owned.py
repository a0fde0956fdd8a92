"""The names the operator owns in an engine pod: what ``spec.pod`` may not set.

The renderer (``controller.render``, ``controller.podspec``, ``controller.engine_pod``) writes these
names; the validation (``api.rules``) refuses a ``spec.pod`` override that would set one of them,
naming the field ("spec.pod.env[2].name: VLLM_API_KEY is set by the operator"). Both read them here,
so a name the operator starts to write is refused from the same change on.
"""

from __future__ import annotations

from typing import Final

# Pod and object labels (the selectors read LABEL_RESOURCE and LABEL_ROLE).
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_RESOURCE: Final = "prefixtune.io/resource"
LABEL_ROLE: Final = "prefixtune.io/role"
LABEL_CONFIG_HASH: Final = "prefixtune.io/config-hash"
OWNED_LABELS: Final = frozenset(
    {
        LABEL_NAME,
        LABEL_INSTANCE,
        LABEL_COMPONENT,
        LABEL_MANAGED_BY,
        LABEL_RESOURCE,
        LABEL_ROLE,
        LABEL_CONFIG_HASH,
    }
)

# Pod annotations: the config the pod runs, and the scrape hints Prometheus reads.
ANNOTATION_CONFIG: Final = "prefixtune.io/config"
PROMETHEUS_ANNOTATIONS: Final = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")
OWNED_ANNOTATIONS: Final = frozenset({ANNOTATION_CONFIG, *PROMETHEUS_ANNOTATIONS})
# Every label or annotation key under this prefix is the operator's (present or future).
OWNED_KEY_PREFIX: Final = "prefixtune.io/"

# The engine container's environment: the API key from spec.apiKeySecret lands in the variable the
# engine reads (vLLM reads VLLM_API_KEY, vllm/envs.py; SGLang gets --api-key $(ENGINE_API_KEY)).
API_KEY_ENV: Final = "ENGINE_API_KEY"
API_KEY_ENV_NAMES: Final = {"vllm": "VLLM_API_KEY", "sglang": API_KEY_ENV}
OWNED_ENV: Final = frozenset(API_KEY_ENV_NAMES.values())
OWNED_ENV_PREFIX: Final = "PREFIXTUNE_"

# Volumes and mounts the renderer adds (the engine's option files, a memory-backed /dev/shm).
OPTIONS_VOLUME: Final = "engine-options"
SHM_VOLUME: Final = "dshm"
SHM_PATH: Final = "/dev/shm"
OWNED_VOLUMES: Final = frozenset({OPTIONS_VOLUME, SHM_VOLUME})

# GPUs: the device plugin's resource and GPU feature discovery's node label (the sandbox reads it).
GPU_RESOURCE: Final = "nvidia.com/gpu"
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"


def owned_key(key: str, owned: frozenset[str]) -> bool:
    """Whether a label or annotation key is the operator's."""
    return key in owned or key.startswith(OWNED_KEY_PREFIX)


def owned_env(name: str) -> bool:
    """Whether an environment variable of the engine container is the operator's."""
    return name in OWNED_ENV or name.startswith(OWNED_ENV_PREFIX)

"""spec.pod (issue #18, item 1): the pod-template overrides' validation, each refusal by its message."""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema
import pytest

from prefixtune.api import parse_spec
from prefixtune.api.crd import build_crd
from prefixtune.api.schema import openapi_to_jsonschema
from prefixtune.api.validation import validate_spec

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SECRET_REF = {"secretKeyRef": {"name": "hf", "key": "token"}}
FULL_POD: dict[str, Any] = {
    "env": [
        {"name": "HF_TOKEN", "valueFrom": SECRET_REF},
        {"name": "TOKENIZERS_PARALLELISM", "value": "false"},
        {"name": "HF_TOKEN_PATH", "value": "/var/run/hf/token"},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
    ],
    "volumes": [
        {"name": "cache", "persistentVolumeClaim": {"claimName": "model-cache"}},
        {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
        {"name": "pages", "emptyDir": {"medium": "HugePages-2Mi"}},
        {"name": "conf", "configMap": {"name": "engine-conf"}},
        {"name": "creds", "secret": {"secretName": "creds"}},
    ],
    "volumeMounts": [
        {"name": "cache", "mountPath": "/root/.cache/huggingface"},
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "pages", "mountPath": "/hugepages"},
        {"name": "conf", "mountPath": "/etc/engine", "readOnly": True},
        {"name": "creds", "mountPath": "/var/run/creds", "subPath": "a/b"},
    ],
    "nodeSelector": {"cloud.example.com/pool": "gpu-a"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
                ]
            }
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 50,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": {"app": "llm"}},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        },
    },
    "imagePullSecrets": [{"name": "registry"}],
    "priorityClassName": "inference-high",
    "labels": {"team.example.com/cost-center": "ml"},
    "annotations": {"example.com/owner": "ml-platform"},
}
FULL_RESOURCES = {"hugepages2Mi": "1Gi", "ephemeralStorage": "100Gi"}


def _spec(pod: dict[str, Any], engine: str = "vllm", **extra: Any) -> dict[str, Any]:
    return {"engine": engine, "model": MODEL, "pod": pod, **extra}


def _errors(raw: dict[str, Any]) -> dict[str, str]:
    spec, errors = validate_spec(raw)
    assert spec is None and errors
    return {e.path: e.message for e in errors}


@cache
def _crd_schema() -> dict[str, Any]:
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return openapi_to_jsonschema(root["properties"]["spec"], forbid_unknown=True)


def test_a_full_override_is_accepted_by_the_models_and_the_crd_schema() -> None:
    raw = _spec(FULL_POD, resources=FULL_RESOURCES)
    spec = parse_spec(raw)
    assert spec.pod is not None
    assert spec.pod.to_dict()["env"] == FULL_POD["env"]
    assert spec.pod.to_dict()["affinity"] == FULL_POD["affinity"]
    jsonschema.Draft202012Validator(_crd_schema()).validate(raw)


# (case id, spec.pod, engine, resources, path, words the message must hold)
REFUSED: list[tuple[str, dict[str, Any], str, dict[str, Any] | None, str, tuple[str, ...]]] = [
    (
        "secret-literal",
        {"env": [{"name": "HF_TOKEN", "value": "hf_abcdefghijkl"}]},
        "vllm",
        None,
        "spec.pod.env[0]",
        ("HF_TOKEN looks like a secret", "use valueFrom.secretKeyRef"),
    ),
    (
        "password-literal",
        {"env": [{"name": "DB_PASSWORD", "value": "x"}]},
        "vllm",
        None,
        "spec.pod.env[0]",
        ("DB_PASSWORD looks like a secret",),
    ),
    (
        "value-and-valueFrom",
        {"env": [{"name": "A", "value": "1", "valueFrom": SECRET_REF}]},
        "vllm",
        None,
        "spec.pod.env[0]",
        ("set value or valueFrom, not both",),
    ),
    (
        "valueFrom-fieldRef",
        {"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
        "vllm",
        None,
        "spec.pod.env[0].valueFrom.fieldRef",
        ("unknown field 'fieldRef'", "configMapKeyRef, secretKeyRef"),
    ),
    (
        "valueFrom-empty",
        {"env": [{"name": "A", "valueFrom": {}}]},
        "vllm",
        None,
        "spec.pod.env[0].valueFrom",
        ("set exactly one of secretKeyRef, configMapKeyRef",),
    ),
    (
        "operator-env",
        {"env": [{"name": "VLLM_API_KEY", "valueFrom": SECRET_REF}]},
        "vllm",
        None,
        "spec.pod.env[0].name",
        ("VLLM_API_KEY is set by the operator", "spec.apiKeySecret"),
    ),
    (
        "operator-env-prefix",
        {
            "env": [
                {"name": "A", "value": "1"},
                {"name": "B", "value": "2"},
                {"name": "PREFIXTUNE_X", "value": "1"},
            ]
        },
        "vllm",
        None,
        "spec.pod.env[2].name",
        ("PREFIXTUNE_X is set by the operator",),
    ),
    (
        "env-twice",
        {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
        "vllm",
        None,
        "spec.pod.env[1].name",
        ("A is set twice",),
    ),
    (
        "two-sources",
        {"volumes": [{"name": "v", "emptyDir": {}, "hostPath": {"path": "/data"}}]},
        "vllm",
        None,
        "spec.pod.volumes[0]",
        (
            "set exactly one of persistentVolumeClaim, emptyDir, configMap, secret, hostPath",
            "emptyDir, hostPath",
        ),
    ),
    (
        "unsupported-source",
        {"volumes": [{"name": "v", "nfs": {"server": "x", "path": "/"}}]},
        "vllm",
        None,
        "spec.pod.volumes[0].nfs",
        ("unknown field 'nfs'",),
    ),
    (
        "operator-volume",
        {"volumes": [{"name": "dshm", "emptyDir": {}}]},
        "vllm",
        None,
        "spec.pod.volumes[0].name",
        ("dshm is a volume of the operator",),
    ),
    (
        "volume-twice",
        {"volumes": [{"name": "v", "emptyDir": {}}, {"name": "v", "emptyDir": {}}]},
        "vllm",
        None,
        "spec.pod.volumes[1].name",
        ("v is given twice",),
    ),
    (
        "hugepages-without-resources",
        {"volumes": [{"name": "p", "emptyDir": {"medium": "HugePages-1Gi"}}]},
        "vllm",
        {"hugepages2Mi": "1Gi"},
        "spec.pod.volumes[0].emptyDir.medium",
        ("HugePages-1Gi needs huge pages in the pod", "spec.resources.hugepages1Gi"),
    ),
    (
        "mount-of-no-volume",
        {"volumeMounts": [{"name": "cache", "mountPath": "/cache"}]},
        "vllm",
        None,
        "spec.pod.volumeMounts[0].name",
        ("no volume 'cache' in spec.pod.volumes",),
    ),
    (
        "mount-over-shm",
        {
            "volumes": [{"name": "v", "emptyDir": {}}],
            "volumeMounts": [{"name": "v", "mountPath": "/dev/shm"}],
        },
        "vllm",
        None,
        "spec.pod.volumeMounts[0].mountPath",
        ("/dev/shm overlaps /dev/shm, mounted by the operator",),
    ),
    (
        "mount-over-trtllm-options",
        {"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/etc"}]},
        "trtllm",
        None,
        "spec.pod.volumeMounts[0].mountPath",
        ("/etc overlaps /etc/prefixtune/llm_api_options.yaml, mounted by the operator",),
    ),
    (
        "mount-twice",
        {
            "volumes": [{"name": "v", "emptyDir": {}}],
            "volumeMounts": [{"name": "v", "mountPath": "/a"}, {"name": "v", "mountPath": "/a/"}],
        },
        "vllm",
        None,
        "spec.pod.volumeMounts[1].mountPath",
        ("/a/ is mounted twice",),
    ),
    (
        "mount-relative",
        {"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "cache"}]},
        "vllm",
        None,
        "spec.pod.volumeMounts[0].mountPath",
        ("'cache' does not match the required form",),
    ),
    (
        "subpath-escape",
        {
            "volumes": [{"name": "v", "emptyDir": {}}],
            "volumeMounts": [{"name": "v", "mountPath": "/a", "subPath": "x/../.."}],
        },
        "vllm",
        None,
        "spec.pod.volumeMounts[0].subPath",
        ("may not contain '..'",),
    ),
    (
        "operator-label",
        {"labels": {"prefixtune.io/role": "baseline"}},
        "vllm",
        None,
        "spec.pod.labels[prefixtune.io/role]",
        ("prefixtune.io/role is set by the operator",),
    ),
    (
        "operator-selector-label",
        {"labels": {"app.kubernetes.io/name": "x"}},
        "vllm",
        None,
        "spec.pod.labels[app.kubernetes.io/name]",
        ("app.kubernetes.io/name is set by the operator",),
    ),
    (
        "operator-annotation",
        {"annotations": {"prometheus.io/port": "9000"}},
        "vllm",
        None,
        "spec.pod.annotations[prometheus.io/port]",
        ("prometheus.io/port is set by the operator",),
    ),
    (
        "bad-label-key",
        {"labels": {"not a key": "x"}},
        "vllm",
        None,
        "spec.pod.labels",
        ("'not a key': the name must be 1-63 characters",),
    ),
    (
        "bad-label-value",
        {"labels": {"team": "a b"}},
        "vllm",
        None,
        "spec.pod.labels",
        ("team: the value must be at most 63 characters of letters",),
    ),
    (
        "system-priority-class",
        {"priorityClassName": "system-cluster-critical"},
        "vllm",
        None,
        "spec.pod.priorityClassName",
        ("the system- priority classes are Kubernetes' own",),
    ),
    (
        "toleration-effect",
        {"tolerations": [{"key": "k", "effect": "Sometimes"}]},
        "vllm",
        None,
        "spec.pod.tolerations[0].effect",
        ("'Sometimes' is not allowed", "NoSchedule"),
    ),
    (
        "toleration-exists-with-value",
        {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
        "vllm",
        None,
        "spec.pod.tolerations[0]",
        ("value must be empty with operator Exists",),
    ),
    (
        "toleration-seconds-without-no-execute",
        {"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 60}]},
        "vllm",
        None,
        "spec.pod.tolerations[0]",
        ("tolerationSeconds is only for effect NoExecute",),
    ),
    (
        "affinity-in-without-values",
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In"}]}]
                    }
                }
            }
        },
        "vllm",
        None,
        "spec.pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0]",
        ("operator In needs at least one value",),
    ),
    (
        "pod-affinity-exists-with-values",
        {
            "affinity": {
                "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {
                                "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
                            },
                            "topologyKey": "kubernetes.io/hostname",
                        }
                    ]
                }
            }
        },
        "vllm",
        None,
        "spec.pod.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
        ".labelSelector.matchExpressions[0]",
        ("operator Exists takes no values",),
    ),
    (
        "too-many-env",
        {"env": [{"name": f"V{i}", "value": "1"} for i in range(33)]},
        "vllm",
        None,
        "spec.pod.env",
        ("has 33 items",),
    ),
]


@pytest.mark.parametrize(
    ("pod", "engine", "resources", "path", "words"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_each_refusal_names_the_field_and_says_why(
    pod: dict[str, Any], engine: str, resources: dict[str, Any] | None, path: str, words: tuple[str, ...]
) -> None:
    extra = {} if resources is None else {"resources": resources}
    errors = _errors(_spec(pod, engine, **extra))
    assert path in errors, errors
    for word in words:
        assert word in errors[path], errors[path]


def test_a_refused_secret_literal_is_never_quoted() -> None:
    spec, errors = validate_spec(_spec({"env": [{"name": "HF_TOKEN", "value": "hf_abcdefghijkl"}]}))
    assert spec is None and errors
    assert all("hf_abcdefghijkl" not in str(e) for e in errors)


def test_the_gpu_label_may_be_overridden_and_other_keys_of_the_operator_are_allowed() -> None:
    pod = {
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-PCIe"},
        "labels": {"app.kubernetes.io/version": "1"},
    }
    assert parse_spec(_spec(pod)).pod is not None

"""spec.pod merged under the operator's own fields (issue #18, item 1): the rendered pod, the
operator's names winning, any GPU type's node selector and note, the admin's hostPath policy, and
the new fields as owned fields of the live-drift check."""

from __future__ import annotations

import asyncio
import copy
import io
from typing import Any

import kubernetes_validate

from prefixtune.api import parse_spec
from prefixtune.api.models import EnvVar, EnvVarSource, KeyRef
from prefixtune.controller import dryrun_cli, execute
from prefixtune.controller import render as R
from prefixtune.controller.admin import AdminPolicy
from prefixtune.controller.drift import owned_drift
from prefixtune.controller.dryrun import render_objects

OWNER = R.Owner(namespace="team", name="rag", uid="uid-1")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
KUBE = kubernetes_validate.utils.latest_version()
HF = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
POD: dict[str, Any] = {
    "env": [HF, {"name": "TOKENIZERS_PARALLELISM", "value": "false"}],
    "volumes": [
        {"name": "cache", "persistentVolumeClaim": {"claimName": "model-cache"}},
        {"name": "pages", "emptyDir": {"medium": "HugePages-2Mi"}},
    ],
    "volumeMounts": [
        {"name": "cache", "mountPath": "/root/.cache/huggingface"},
        {"name": "pages", "mountPath": "/hugepages"},
    ],
    "nodeSelector": {"pool": "gpu-a"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
    "imagePullSecrets": [{"name": "registry"}],
    "priorityClassName": "inference-high",
    "labels": {"team.example.com/cost-center": "ml"},
    "annotations": {"example.com/owner": "ml-platform"},
}
HUGE_PAGES = {"hugepages2Mi": "1Gi"}  # the pages volume needs them


def _spec(**extra: Any) -> Any:
    return parse_spec({"engine": "vllm", "model": MODEL, **extra})


def _deployment(spec: Any) -> dict[str, Any]:
    dep = R.render_deployment(OWNER, spec, spec.knob_config(), "baseline", 1)
    kubernetes_validate.validate(dep, KUBE, strict=True)
    return dep


def _pod(dep: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    template = dep["spec"]["template"]
    (container,) = template["spec"]["containers"]
    return template["metadata"], template["spec"], container


def test_the_overrides_are_merged_under_the_operators_fields() -> None:
    spec = _spec(
        gpu={"count": 2},  # the operator's /dev/shm volume beside the tenant's
        pod=POD,
        apiKeySecret={"name": "engine-key"},
        resources={"hugepages2Mi": "1Gi", "ephemeralStorage": "100Gi"},
    )
    meta, pod, container = _pod(_deployment(spec))
    names = [v["name"] for v in container["env"]]
    assert names == ["HF_TOKEN", "TOKENIZERS_PARALLELISM", "VLLM_API_KEY"]  # the operator's last
    assert container["env"][0] == HF
    assert [v["name"] for v in pod["volumes"]] == ["dshm", "cache", "pages"]
    assert [m["mountPath"] for m in container["volumeMounts"]] == [
        "/dev/shm",
        "/root/.cache/huggingface",
        "/hugepages",
    ]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "gpu-a"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        *POD["tolerations"],
    ]
    assert pod["affinity"] == POD["affinity"]
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["priorityClassName"] == "inference-high"
    assert meta["labels"]["team.example.com/cost-center"] == "ml"
    assert meta["labels"][R.LABEL_ROLE] == "baseline"
    assert meta["annotations"]["example.com/owner"] == "ml-platform"
    assert R.pod_config({"metadata": meta}) == spec.knob_config()
    resources = container["resources"]
    assert resources["requests"]["ephemeral-storage"] == "100Gi"
    assert resources["requests"]["hugepages-2Mi"] == resources["limits"]["hugepages-2Mi"] == "1Gi"
    assert resources["limits"]["nvidia.com/gpu"] == "2"
    assert container["command"] == ["vllm", "serve"] and "startupProbe" in container


def test_without_overrides_the_pod_is_as_before() -> None:
    meta, pod, container = _pod(_deployment(_spec()))
    assert "env" not in container and "volumes" not in pod and "affinity" not in pod
    assert "imagePullSecrets" not in pod and "priorityClassName" not in pod
    assert set(meta["labels"]) == set(R.common_labels(OWNER, _spec())) | {R.LABEL_ROLE, R.LABEL_CONFIG_HASH}


def test_the_operators_names_win_over_an_unvalidated_override() -> None:
    spec = _spec(pod={"env": [{"name": "A", "value": "1"}]}, apiKeySecret={"name": "engine-key"})
    assert spec.pod is not None
    # Past the validation (which refuses these): the merge still never writes over the operator's.
    stolen = EnvVarSource(secret_key_ref=KeyRef(name="theirs", key="k"))
    spec.pod.env.append(EnvVar(name="VLLM_API_KEY", value_from=stolen))
    spec.pod.labels = {R.LABEL_ROLE: "canary", R.LABEL_RESOURCE: "other"}
    spec.pod.annotations = {R.ANNOTATION_CONFIG: "{}"}
    dep = R.render_deployment(OWNER, spec, spec.knob_config(), "baseline", 1)
    meta, _, container = _pod(dep)
    key = [v for v in container["env"] if v["name"] == "VLLM_API_KEY"]
    assert key == [
        {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "engine-key", "key": "api-key"}}}
    ]
    assert meta["labels"][R.LABEL_ROLE] == "baseline" and meta["labels"][R.LABEL_RESOURCE] == "rag"
    assert R.pod_config({"metadata": meta}) == spec.knob_config()
    assert dep["spec"]["selector"]["matchLabels"] == {R.LABEL_RESOURCE: "rag", R.LABEL_ROLE: "baseline"}


def test_spec_pod_node_selector_overrides_the_gpu_label() -> None:
    spec = _spec(
        gpu={"type": "NVIDIA-H100-PCIe"}, pod={"nodeSelector": {"nvidia.com/gpu.product": "H100-PCIE"}}
    )
    _, pod, _ = _pod(_deployment(spec))
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100-PCIE"}


def _doc(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "prefixtune.io/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "rag", "namespace": "team"},
        "spec": {"engine": "vllm", "model": MODEL, **spec},
    }


def _render(argv: list[str], doc: dict[str, Any]) -> tuple[int, str, str]:
    import json

    out, err = io.StringIO(), io.StringIO()
    rc = dryrun_cli.run(argv, io.StringIO(json.dumps(doc)), out, err)
    return rc, out.getvalue(), err.getvalue()


HOST_PATH = {"volumes": [{"name": "models", "hostPath": {"path": "/mnt/models", "type": "Directory"}}]}


def test_host_path_volumes_are_refused_unless_the_admin_allows_them() -> None:
    spec = _spec(pod=HOST_PATH)
    (problem,) = AdminPolicy().spec_problems(spec)
    assert problem.startswith("spec.pod.volumes[0].hostPath: the admin does not allow hostPath volumes")
    assert "--allow-host-path-volumes" in problem
    assert AdminPolicy(allow_host_path=True).spec_problems(spec) == []
    assert AdminPolicy().spec_problems(_spec(pod=POD, resources=HUGE_PAGES)) == []
    objects, problems = render_objects(_doc(pod=HOST_PATH), AdminPolicy())
    assert objects == [] and problems == [problem]


def test_prefixtune_run_takes_the_host_path_flag_default_off() -> None:
    from prefixtune.controller.operator import options_from_args

    assert options_from_args([]).admin.allow_host_path is False
    assert options_from_args(["--allow-host-path-volumes"]).admin.allow_host_path is True


def test_render_takes_the_host_path_flag() -> None:
    rc, _, err = _render(["-f", "-", "--allowed-images", "docker.io/vllm/vllm-openai"], _doc(pod=HOST_PATH))
    assert rc == 1 and "the admin does not allow hostPath volumes" in err
    rc, out, err = _render(["-f", "-", "--allow-host-path-volumes"], _doc(pod=HOST_PATH))
    assert rc == 0 and "/mnt/models" in out, err


# --- the new fields as owned fields of the live objects ---------------------------------------


def _served(body: dict[str, Any]) -> dict[str, Any]:
    live = copy.deepcopy(body)
    live["metadata"].update(uid="u", resourceVersion="7", ownerReferences=[OWNER.reference()])
    live["spec"]["template"]["spec"].update(dnsPolicy="ClusterFirst", schedulerName="default-scheduler")
    return live


def _annotated(spec: Any) -> dict[str, Any]:
    body, _ = execute.annotated(R.render_deployment(OWNER, spec, spec.knob_config(), "baseline", 1))
    return body


def test_what_spec_pod_sets_is_owned_in_the_live_deployment() -> None:
    body = _annotated(_spec(pod=POD, resources=HUGE_PAGES))
    live = _served(body)
    assert owned_drift(body, live) == ()
    pod = live["spec"]["template"]["spec"]
    pod["affinity"] = {"nodeAffinity": {}}
    pod["nodeSelector"]["pool"] = "gpu-b"
    pod["tolerations"] = pod["tolerations"][:1]
    pod["priorityClassName"] = "other"
    live["spec"]["template"]["metadata"]["labels"]["team.example.com/cost-center"] = "x"
    assert set(owned_drift(body, live)) == {
        "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
        "spec.template.spec.nodeSelector.pool",
        "spec.template.spec.tolerations",
        "spec.template.spec.priorityClassName",
        "spec.template.metadata.labels.team.example.com/cost-center",
    }


def test_a_scheduling_field_someone_added_is_drift() -> None:
    body = _annotated(_spec())
    live = _served(body)
    pod = live["spec"]["template"]["spec"]
    pod["affinity"] = {"nodeAffinity": {}}
    pod["imagePullSecrets"] = [{"name": "x"}]
    pod["priorityClassName"] = "p"
    pod["nodeSelector"]["kubernetes.io/hostname"] = "node-7"
    assert owned_drift(body, live) == (
        "spec.template.spec.affinity",
        "spec.template.spec.imagePullSecrets",
        "spec.template.spec.priorityClassName",
        "spec.template.spec.nodeSelector (1 added)",
    )


class _Client:
    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.patches: list[dict[str, Any]] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        return self.obj

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(body)
        return self.obj


def test_what_a_changed_spec_pod_no_longer_renders_is_removed_from_the_live_deployment() -> None:
    before = _spec(pod=POD, resources=HUGE_PAGES)
    live = _served(_annotated(before))
    live["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] = "now"
    after = _spec(pod={"env": [HF]})  # no scheduling fields, labels or annotations any more
    plain = R.render_deployment(OWNER, after, after.knob_config(), "baseline", 1)
    client = _Client(live)
    path = "/apis/apps/v1/namespaces/team/deployments"
    change, drift = asyncio.run(execute._apply(client, path, plain, "apps", "deployments", OWNER))  # type: ignore[arg-type]
    assert change == "updated Deployment rag" and drift is None
    (patch,) = client.patches
    pod = patch["spec"]["template"]["spec"]
    assert pod["affinity"] is None and pod["imagePullSecrets"] is None and pod["priorityClassName"] is None
    assert pod["nodeSelector"] == {"pool": None, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    meta = patch["spec"]["template"]["metadata"]
    assert meta["labels"]["team.example.com/cost-center"] is None
    assert meta["annotations"]["example.com/owner"] is None
    assert "kubectl.kubernetes.io/restartedAt" not in meta["annotations"]  # not ours: left alone
    assert meta["labels"][R.LABEL_ROLE] == "baseline"
    assert patch["metadata"]["annotations"][R.POD_METADATA_KEYS] is None


def test_the_readmes_pod_override_example_renders_as_it_says() -> None:
    import re
    from pathlib import Path

    import yaml

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if "\n  pod:\n" in b]
    (block,) = blocks
    doc = yaml.safe_load(block)
    rc, out, err = _render(["-f", "-"], doc)
    assert rc == 0, err
    assert "note: no twin model for GPU 'NVIDIA-L40S'" in err
    (dep,) = [o for o in yaml.safe_load_all(out) if o and o["kind"] == "Deployment"]
    kubernetes_validate.validate(dep, KUBE, strict=True)
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}},
    } in container["env"]
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "model-cache"}} in pod["volumes"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L40S", "pool": "inference"}
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]

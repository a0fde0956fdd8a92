"""The generated CRD: equal to the committed file, valid for Kubernetes, structural, consistent
with the models, and the examples validate against both."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from prefixtune import cli
from prefixtune.api import crd
from prefixtune.api.models import SANDBOX_WORKLOAD_ANNOTATION
from prefixtune.api.schema import openapi_to_jsonschema
from prefixtune.api.validation import validate_resource
from prefixtune.engines import get_adapter
from prefixtune.engines.base import EngineName, KnobSpec

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / crd.CRD_FILE
EXAMPLES = sorted(
    p
    for p in (ROOT / "examples").glob("*.yaml")
    if yaml.safe_load(p.read_text()).get("kind") == "ServingDeployment"
)  # the ServingDeployments (a Namespace file sits beside them)
SANDBOX_WORKLOADS = {"rag", "chatbot", "agent", "qa"}


@cache
def _crd() -> dict[str, Any]:
    return crd.build_crd()


def _root_schema() -> dict[str, Any]:
    schema: dict[str, Any] = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@cache
def _validator() -> jsonschema.Draft202012Validator:
    schema = openapi_to_jsonschema(_root_schema(), forbid_unknown=True)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}.*")


def test_committed_crd_is_the_generated_one() -> None:
    assert CRD_PATH.read_text() == crd.render_crd(), "regenerate with `prefixtune crd -o crds/...`"


def test_generation_is_deterministic() -> None:
    assert crd.render_crd() == crd.render_crd()
    assert yaml.safe_load(crd.render_crd()) == crd.build_crd()


def test_main_prints_the_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert crd.main([]) == 0
    out = capsys.readouterr().out
    assert out == crd.render_crd()
    assert yaml.safe_load(out)["kind"] == "CustomResourceDefinition"


def test_dispatcher_runs_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["crd"]) == 0
    assert capsys.readouterr().out == crd.render_crd()


def test_main_output_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "crds" / "crd.yaml"
    assert crd.main(["-o", str(target)]) == 0
    assert target.read_text() == crd.render_crd()
    assert crd.main(["--check", str(target)]) == 0
    target.write_text(target.read_text() + "# edited\n")
    assert crd.main(["--check", str(target)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert crd.main(["--check", str(tmp_path / "missing.yaml")]) == 2


def test_kubernetes_validate_accepts_the_crd() -> None:
    version = latest_version()  # the newest Kubernetes the installed package has schemas for
    assert version.startswith(kubernetes_validate.validate(_crd(), version, strict=True))
    # Not vacuous: a misspelt schema keyword is refused.
    broken = copy.deepcopy(_crd())
    broken["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["maxItem"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def test_names_columns_and_subresources() -> None:
    spec = _crd()["spec"]
    assert _crd()["metadata"]["name"] == "servingdeployments.prefixtune.io"
    assert spec["group"] == "prefixtune.io" and spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "ServingDeployment",
        "listKind": "ServingDeploymentList",
        "plural": "servingdeployments",
        "singular": "servingdeployment",
        "shortNames": ["sdep"],
        "categories": ["prefixtune"],
    }
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"] if "priority" not in c}
    assert columns == {
        "Engine": ".spec.engine",
        "Phase": ".status.phase",
        "HitRate": ".status.diagnosis.hitRate",
        "BestScore": ".status.bestConfig.score",
        "Age": ".metadata.creationTimestamp",
    }


def test_schema_is_structural() -> None:
    preserved = []
    for path, node in _nodes(_root_schema()):
        for key in ("$ref", "anyOf", "oneOf", "allOf", "title", "const", "$defs"):
            assert key not in node, f"{path}: {key}"
        assert node.get("additionalProperties") is not False, path
        if node.get("x-kubernetes-preserve-unknown-fields"):
            preserved.append(path)
        else:
            assert "type" in node, f"{path} has no type"
        if node.get("nullable"):
            assert "default" not in node or node["default"] is not None
        if "properties" in node:
            assert "additionalProperties" not in node, path
            assert set(node.get("required", [])) <= set(node["properties"]), path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path
    assert sorted(preserved) == [".status.policy", ".status.trials[].signals"]


def test_defaults_are_valid_for_their_node() -> None:
    found = 0
    for _, node in _nodes(_root_schema()):
        if "default" in node:
            found += 1
            jsonschema.Draft202012Validator(openapi_to_jsonschema(node)).validate(node["default"])
    assert found > 15


def test_spec_schema_matches_the_models() -> None:
    spec = _root_schema()["properties"]["spec"]
    assert spec["required"] == ["engine", "model"]
    props = spec["properties"]
    assert props["engine"]["enum"] == [e.value for e in EngineName]
    assert (
        props["gpu"]["properties"]["count"]["minimum"],
        props["gpu"]["properties"]["count"]["maximum"],
    ) == (1, 8)
    gpu_type = props["gpu"]["properties"]["type"]
    assert "enum" not in gpu_type and gpu_type["default"] == "H100-80GB"  # any GPU type is accepted
    assert re.match(gpu_type["pattern"], "NVIDIA-B200") and not re.match(gpu_type["pattern"], "B200 ")
    fraction = props["config"]["properties"]["memoryFraction"]
    assert fraction == {
        "description": fraction["description"],
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 1,
    }
    assert props["tuning"]["properties"]["slo"]["properties"]["ttftP99"]["default"] == "2s"
    assert props["extraArgs"]["maxItems"] == 64 and props["extraArgs"]["items"]["maxLength"] == 1024
    status = _root_schema()["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == [
        "Pending",
        "Baseline",
        "Exploring",
        "Converged",
        "Observing",
        "Paused",
        "Failed",
    ]
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    assert status["bestConfig"]["properties"]["score"]["nullable"] is True


def _rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = _root_schema()["properties"]["spec"]["x-kubernetes-validations"]
    return rules


@pytest.mark.parametrize("engine", list(EngineName))
def test_cel_rules_come_from_the_adapters(engine: EngineName) -> None:
    adapter = get_adapter(engine)
    mine = [r for r in _rules() if f"self.engine != '{engine.value}'" in r["rule"]]
    for knob, field in (("block_size", "blockSize"), ("schedule_policy", "schedulePolicy")):
        choices = adapter.knobs()[knob].choices
        literal = ", ".join(repr(c) if isinstance(c, str) else str(c) for c in choices)
        config_rules = [r for r in mine if r.get("fieldPath") == f".config.{field}"]
        space_rules = [r for r in mine if r.get("fieldPath") == f".tuning.space.{field}"]
        assert len(config_rules) == 1 and f"self.config.{field} in [{literal}]" in config_rules[0]["rule"]
        assert len(space_rules) == 1 and f"all(v, v in [{literal}])" in space_rules[0]["rule"]
        for rule in config_rules + space_rules:
            assert ", ".join(str(c) for c in choices) in rule["message"]
    (args_rule,) = [r for r in mine if r.get("fieldPath") == ".extraArgs"]
    pattern = re.search(r"a\.matches\('([^']*)'\)", args_rule["rule"])
    assert pattern is not None
    regex = re.compile(pattern.group(1))  # RE2 syntax subset; Python's re reads it the same way
    for flag in adapter.tuned_flags():
        assert regex.match(flag) and regex.match(f"{flag}=1"), flag
    for harmless in ("--seed", "64", "--max-model-len=8192", "--trust-remote-code"):
        assert not regex.match(harmless), harmless


def test_canary_and_metrics_rules() -> None:
    (canary,) = [r for r in _rules() if r.get("fieldPath") == ".tuning.rollout.strategy"]
    assert "self.replicas >= 2" in canary["rule"]
    metrics = _root_schema()["properties"]["spec"]["properties"]["tuning"]["properties"]["metrics"]
    # No url is required: the operator's own Prometheus (--prometheus-url) is the default (issue #17).
    assert "x-kubernetes-validations" not in metrics


def test_range_rules_only_where_the_engine_narrows_the_range() -> None:
    wide = KnobSpec(name="memory_fraction", default=0.9, low=0.0, high=1.0, low_exclusive=True)
    assert crd._range_rules("vllm", "memory_fraction", wide) == []
    narrow = KnobSpec(name="memory_fraction", default=0.9, low=0.5, high=0.95)
    config_rule, space_rule = crd._range_rules("x", "memory_fraction", narrow)
    assert "self.config.memoryFraction >= 0.5 && self.config.memoryFraction <= 0.95" in config_rule["rule"]
    assert "self.tuning.space.memoryFraction.min >= 0.5" in space_rule["rule"]
    assert "[0.5, 0.95]" in config_rule["message"]


def test_there_are_examples_for_every_engine_and_observe_mode() -> None:
    docs = [yaml.safe_load(p.read_text()) for p in EXAMPLES]
    assert {d["spec"]["engine"] for d in docs} == {e.value for e in EngineName}
    assert any(d["spec"].get("tuning", {}).get("mode") == "observe" for d in docs)
    workloads = {d["metadata"]["annotations"][SANDBOX_WORKLOAD_ANNOTATION] for d in docs}
    assert workloads <= SANDBOX_WORKLOADS and len(workloads) >= 3


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_validates_against_models_and_crd(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    resource, errors = validate_resource(doc)
    assert errors == [] and resource is not None
    _validator().validate(doc)
    # What the operator stores back (defaults filled in) still fits the CRD.
    _validator().validate(resource.to_dict())


def test_status_fits_the_crd() -> None:
    config = {"memoryFraction": 0.9, "blockSize": 16, "prefixCaching": True, "schedulePolicy": "fcfs"}
    doc = {
        "apiVersion": "prefixtune.io/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "x"},
        "spec": {"engine": "vllm", "model": "m"},
        "status": {
            "phase": "Converged",
            "observedGeneration": 2,
            "conditions": [
                {
                    "type": "Tuning",
                    "status": "False",
                    "reason": "Converged",
                    "lastTransitionTime": "2025-03-01T12:00:00Z",
                }
            ],
            "currentConfig": config,
            "bestConfig": {"config": config, "score": None, "confidence": 0.9},
            "trials": [
                {
                    "index": 0,
                    "config": config,
                    "outcome": "ok",
                    "signals": {"hit_rate": 0.5, "gpu_util": None},
                    "score": 1.5,
                    "startedAt": "2025-03-01T12:00:00Z",
                    "finishedAt": None,
                }
            ],
            "diagnosis": {"bound": "decode", "hitRate": None, "notes": []},
            "recommendation": {"config": config, "reason": "keep"},
            "policy": {"anything": {"goes": [1, 2]}},
        },
    }
    resource, errors = validate_resource(doc)
    assert errors == [] and resource is not None
    _validator().validate(doc)
    _validator().validate(resource.to_dict())
    bad = {**doc, "status": {**doc["status"], "phase": "Running"}}
    assert list(_validator().iter_errors(bad))


def test_the_scale_paths_name_schema_fields_of_the_types_the_scale_needs() -> None:
    """An integer at both replicas paths (the API server reads them as int64) and a string selector
    (a serialized label selector, not a struct): what kubectl scale and an HPA read and write."""
    (version,) = _crd()["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    scale = version["subresources"]["scale"]

    def field(path: str) -> dict[str, Any]:
        node = schema
        for part in path.removeprefix(".").split("."):
            node = node["properties"][part]
        return dict(node)

    assert field(scale["specReplicasPath"])["type"] == "integer"
    assert field(scale["specReplicasPath"]).get("default") == 1  # so GET /scale never misses it
    assert field(scale["statusReplicasPath"])["type"] == "integer"
    assert field(scale["labelSelectorPath"])["type"] == "string"

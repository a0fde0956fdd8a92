"""The CRD's CEL rules, evaluated with cel-python (a test dependency), as the API server would."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from prefixtune.api.crd import build_crd
from prefixtune.api.validation import validate_resource, validate_spec

EXAMPLES = sorted(
    p
    for p in (Path(__file__).resolve().parents[2] / "examples").glob("*.yaml")
    if yaml.safe_load(p.read_text()).get("kind") == "ServingDeployment"
)  # the ServingDeployments (a Namespace file sits beside them)


def _rules(
    node: dict[str, Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    for rule in node.get("x-kubernetes-validations", []):
        yield path, rule
    for name, sub in node.get("properties", {}).items():
        yield from _rules(sub, (*path, name))


@cache
def _programs() -> list[tuple[tuple[str, ...], str, Any]]:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    env = celpy.Environment()
    return [(path, rule["message"], env.program(env.compile(rule["rule"]))) for path, rule in _rules(spec)]


def _failing(spec: dict[str, Any]) -> list[str]:
    messages = []
    for path, message, program in _programs():
        target: Any = spec
        for part in path:
            target = target.get(part) if isinstance(target, dict) else None
        if target is None:
            continue  # the rule's object is absent: the API server does not run it
        result = program.evaluate({"self": celpy.json_to_cel(target)})
        if isinstance(result, Exception) or not bool(result):
            messages.append(message)
    return messages


def test_every_rule_compiles() -> None:
    assert len(_programs()) >= 15


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_pass_every_rule(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    resource, errors = validate_resource(doc)
    assert errors == [] and resource is not None
    assert _failing(doc["spec"]) == []
    assert _failing(resource.to_dict()["spec"]) == []


BASE = {"engine": "vllm", "model": "m"}


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({**BASE, "config": {"blockSize": 17}}, "config.blockSize is not supported by vllm"),
        ({**BASE, "config": {"schedulePolicy": "lpm"}}, "config.schedulePolicy is not supported by vllm"),
        ({"engine": "sglang", "model": "m", "config": {"blockSize": 8}}, "not supported by sglang"),
        (
            {"engine": "trtllm", "model": "m", "tuning": {"space": {"blockSize": [16, 24]}}},
            "trtllm does not support",
        ),
        ({**BASE, "extraArgs": ["--seed", "1", "--block_size=32"]}, "owns on vllm"),
        ({**BASE, "extraArgs": ["-tp", "2"]}, "owns on vllm"),
        ({"engine": "trtllm", "model": "m", "extraArgs": ["--tp-size", "2"]}, "owns on trtllm"),
        (
            {**BASE, "replicas": 1, "tuning": {"rollout": {"strategy": "canary"}}},
            "canary needs replicas >= 2",
        ),
        ({**BASE, "tuning": {"slo": {"ttftP99": "0s"}}}, "positive duration"),
        (
            {**BASE, "tuning": {"space": {"memoryFraction": {"min": 0.9, "max": 0.5}}}},
            "min must be less than max",
        ),
    ],
)
def test_rules_refuse_what_the_models_refuse(spec: dict[str, Any], fragment: str) -> None:
    assert validate_spec(spec)[0] is None
    failing = _failing(spec)
    assert any(fragment in m for m in failing), failing


def test_valid_spec_passes() -> None:
    spec = {
        **BASE,
        "replicas": 2,
        "extraArgs": ["--seed", "1"],
        "tuning": {"rollout": {"strategy": "canary"}},
    }
    assert validate_spec(spec)[1] == []
    assert _failing(spec) == []

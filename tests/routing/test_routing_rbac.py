"""Issue #24's must-show: the router's objects validate (kubernetes-validate, strict), and the chart's
RBAC lets the operator create them without escalate or bind: it holds every rule it grants."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from tests.conftest import ROOT

from prefixtune.api import parse_spec
from prefixtune.controller import render as R
from prefixtune.routing import render as RR

KUBE_VERSION = kubernetes_validate.utils.latest_version()
OWNER = R.Owner(namespace="team-a", name="chat", uid="0b6f3d7e-4c1a-4e8a-9d55-2f1c3b7a9e01")
ROUTER_KINDS = {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"}


def _router_objects(engine: str) -> list[dict[str, Any]]:
    spec = parse_spec({"engine": engine, "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 4})
    settings = RR.settings_for(spec, spec.knob_config())
    return R.render_routed(OWNER, spec, settings, router_ready=True, monitoring=True)


@pytest.mark.parametrize("engine", ["sglang", "vllm", "trtllm"])
def test_the_routers_objects_validate_with_kubernetes_validate(engine: str) -> None:
    objects = _router_objects(engine)
    assert {o["kind"] for o in objects} == ROUTER_KINDS
    for obj in objects:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(ROOT / "charts" / "prefixtune") as loaded:
        yield loaded


def _triples(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


@pytest.mark.parametrize("scope", ["namespaces", "cluster"])
def test_the_charts_rbac_holds_every_rule_the_routers_role_grants_and_no_escalate_or_bind(
    chart: helm.Chart, scope: str
) -> None:
    values = {"watch": {"scope": scope, "namespaces": ["team-a"] if scope == "namespaces" else []}}
    out = chart.render(values, name="pt", namespace="prefixtune-system", is_install=True)
    docs = [
        d
        for path, text in out.items()
        if not path.endswith("NOTES.txt")
        for d in yaml.safe_load_all(text)
        if d
    ]
    roles = [d for d in docs if d["kind"] in {"Role", "ClusterRole"}]
    held = set().union(
        *(_triples(r.get("rules", [])) for r in roles if r["metadata"].get("namespace") in (None, "team-a"))
    )
    assert not {v for _, _, v in held} & {"escalate", "bind", "*"}
    (role,) = [o for o in _router_objects("sglang") if o["kind"] == "Role"]
    assert _triples(role["rules"]) <= held  # what it grants, it holds
    needed = {("", "serviceaccounts", "create"), ("rbac.authorization.k8s.io", "roles", "create")}
    needed |= {("rbac.authorization.k8s.io", "rolebindings", "create"), ("apps", "deployments", "create")}
    needed |= {("", "services", "create")}
    assert needed <= held  # and it may create each of the router's objects

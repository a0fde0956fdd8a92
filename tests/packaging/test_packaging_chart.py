"""The Helm chart, rendered and linted by Helm's own Go SDK (helm-python-sdk), checked against the code.

- every value set renders, lints clean (strict) and every manifest validates (kubernetes-validate, strict);
- the chart's CRDs are the repository's crds/;
- the RBAC rules are exactly the API calls in controller/api_calls.py (per scope, per monitoring switch);
- the rendered operator arguments are accepted by the operator's own argument parser;
- the dashboard's PromQL names only real metrics and parses (promtool).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from tests.conftest import ROOT, require_component

from prefixtune.controller.api_calls import API_CALLS
from prefixtune.controller.operator import options_from_args
from prefixtune.controller.selfmetrics import SelfMetrics
from prefixtune.engines.base import EngineName
from prefixtune.engines.registry import get_adapter
from prefixtune.routing.policy import Router

CHART = ROOT / "charts" / "prefixtune"
RELEASE = "pt"
RELEASE_NS = "prefixtune-system"
KUBE_VERSION = kubernetes_validate.utils.latest_version()

VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "cluster": {"watch": {"scope": "cluster", "namespaces": []}},
    "namespaced": {"watch": {"scope": "namespaces", "namespaces": ["team-a", "team-b"]}},
    "tenant-policy": {
        "enginePolicy": {
            "allowedImages": ["ghcr.io/acme/", "vllm/vllm-openai"],
            "allowHostPathVolumes": True,
        },
        "prometheus": {
            "url": "https://prometheus.monitoring:9090",
            "allowedHosts": ["thanos.monitoring:9090"],
            "caConfigMap": {"name": "prom-ca", "key": "ca.crt"},
        },
        "metrics": {"enabled": True, "port": 8080, "bindAddress": "0.0.0.0", "perResource": True},
    },
    "routing": {
        "routing": {
            "images": {"sglangRouter": "registry.acme.example/ml/sglang-router:0.3.2", "vllmRouter": ""},
            "auto": False,
        }
    },
    "ha": {"replicas": 2},
    "ha-namespaced": {"replicas": 2, "watch": {"scope": "namespaces", "namespaces": ["team-a"]}},
    "monitoring-servicemonitor": {"monitoring": {"enabled": True, "labels": {"release": "kps"}}},
    "monitoring-podmonitor": {
        "monitoring": {"enabled": True, "operatorMonitor": "PodMonitor"},
        "watch": {"scope": "namespaces", "namespaces": ["team-a"]},
    },
    "monitoring-no-operator-monitor": {"monitoring": {"enabled": True, "operatorMonitor": "none"}},
    "minimal": {
        "metrics": {"enabled": False},
        "dashboard": {"enabled": False},
        "serviceAccount": {"create": False, "name": "prefixtune-sa"},
        "peering": {"create": False, "name": "shared-peering"},
        "operator": {"tick": 2.5, "readyTimeout": 900, "verbose": True, "extraArgs": ["--priority=7"]},
    },
    "extras": {
        "image": {"tag": "0.1.0-rc1", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "podLabels": {"team": "ml"},
        "podAnnotations": {"example.com/a": "b"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
        "dashboard": {"namespace": "monitoring"},
        "operator": {"extraEnv": [{"name": "LOG_FORMAT", "value": "json"}]},
    },
}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: helm.Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    out = chart.render(values, name=RELEASE, namespace=RELEASE_NS, is_install=True)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def deployments(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return of_kind(docs, "Deployment")


def container(dep: dict[str, Any]) -> dict[str, Any]:
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return dict(c)


# --- render, lint, validate ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_chart_lints_clean(name: str) -> None:
    report = helm.lint(CHART, VALUE_SETS[name], strict=True, namespace=RELEASE_NS)
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); warnings (2) and errors (3) must not occur.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema of every CRD the chart installs."""
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd:
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schemas[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return schemas


def _check_monitor(doc: dict[str, Any]) -> None:
    """prometheus-operator's CRDs are not available here: check the fields the operator relies on."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    spec = doc["spec"]
    assert spec["selector"]["matchLabels"]
    endpoints = spec["endpoints"] if doc["kind"] == "ServiceMonitor" else spec["podMetricsEndpoints"]
    assert endpoints and all(e["port"] and e["path"] == "/metrics" for e in endpoints)


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_manifest_validates(chart: helm.Chart, name: str) -> None:
    docs = render(chart, VALUE_SETS[name])
    assert docs, "nothing rendered"
    crd_schemas = _crd_schemas()
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        if key in crd_schemas:  # kopf peering objects: validate against the chart's own CRD schema
            jsonschema.validate(doc, crd_schemas[key])
        elif doc["apiVersion"].startswith("monitoring.coreos.com/"):
            _check_monitor(doc)
        else:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        ns = doc["metadata"].get("namespace")
        assert ns is None or ns in {RELEASE_NS, "team-a", "team-b", "monitoring"}, doc["metadata"]


def test_chart_crds_validate() -> None:
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                assert doc["kind"] == "CustomResourceDefinition", f"{path.name}: Helm's crds/ takes CRDs only"
                kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_notes_render(chart: helm.Chart) -> None:
    for values in VALUE_SETS.values():
        notes = chart.render(values, name=RELEASE, namespace=RELEASE_NS, is_install=True)
        text = next(v for k, v in notes.items() if k.endswith("NOTES.txt"))
        assert "kubectl get sdep -A" in text
        assert "<no value>" not in text


# --- CRDs ---------------------------------------------------------------------------------------------


def _crd_documents(text: str) -> list[str]:
    """The raw text of each CustomResourceDefinition document of a multi-document YAML file."""
    docs = re.split(r"(?m)^---[ \t]*\n", text)
    return [d for d in docs if (yaml.safe_load(d) or {}).get("kind") == "CustomResourceDefinition"]


def test_chart_crds_equal_repository_crds() -> None:
    repo = {p.name: p.read_text() for p in sorted((ROOT / "crds").glob("*.yaml"))}
    chart_crds = {p.name: p.read_text() for p in sorted((CHART / "crds").glob("*.yaml"))}
    assert "servingdeployments.prefixtune.io.yaml" in repo
    assert set(chart_crds) == set(repo)
    for name, text in repo.items():
        crds = _crd_documents(text)
        if len(crds) == len([d for d in yaml.safe_load_all(text) if d]):
            assert chart_crds[name] == text, f"charts/prefixtune/crds/{name} differs from crds/{name}"
        else:
            # A file with non-CRD objects (kopf's peering object): Helm's crds/ may hold only CRDs (it
            # cannot map a kind whose CRD it is installing), so the chart holds the CRD documents verbatim
            # and creates the object from templates/peering.yaml.
            assert chart_crds[name] == "---\n".join(crds), (
                f"charts/prefixtune/crds/{name}: CRDs of crds/{name}"
            )


def test_chart_crd_names_match_the_operator(chart: helm.Chart) -> None:
    names = {d["metadata"]["name"] for c in chart.crds for d in yaml.safe_load_all(c["data"]) if d}
    assert {
        "servingdeployments.prefixtune.io",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    } <= names


# --- RBAC == api_calls.py -----------------------------------------------------------------------------

Triple = tuple[str, str, str]
ALL_CALLS: frozenset[Triple] = frozenset((c.group, c.resource, v) for c in API_CALLS for v in c.verbs)
CLUSTER_SCOPED = {("apiextensions.k8s.io", "customresourcedefinitions"), ("", "namespaces")}


def _not_needed(scope: str, monitoring: bool) -> set[tuple[str, str]]:
    """API calls of api_calls.py a configuration does not make (and so must not be granted)."""
    skip = set()
    if scope == "cluster":
        # The per-namespace peering flavour; kopf watches no namespaces when cluster-wide.
        skip |= {("kopf.dev", "kopfpeerings"), ("", "namespaces")}
    else:
        skip |= {("kopf.dev", "clusterkopfpeerings")}
    if not monitoring:
        skip.add(("monitoring.coreos.com", "servicemonitors"))
    return skip


def _rules(role: dict[str, Any]) -> set[Triple]:
    out: set[Triple] = set()
    for rule in role.get("rules", []):
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, res, verb), f"wildcard in {role['metadata']['name']}: {rule}"
                    out.add((group, res, verb))
    return out


def _bound_to_operator(docs: list[dict[str, Any]], sa: str) -> dict[tuple[str, str | None, str], set[Triple]]:
    """(kind, namespace, name) of each role bound to the operator's account -> its rules."""
    roles = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): _rules(d)
        for d in docs
        if d["kind"] in {"ClusterRole", "Role"}
    }
    bound: dict[tuple[str, str | None, str], set[Triple]] = {}
    for b in docs:
        if b["kind"] not in {"ClusterRoleBinding", "RoleBinding"}:
            continue
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": RELEASE_NS}]
        ref = b["roleRef"]
        ns = b["metadata"].get("namespace") if ref["kind"] == "Role" else None
        key = (ref["kind"], ns, ref["name"])
        assert key in roles, f"{b['kind']} {b['metadata']['name']} refers to a missing {key}"
        bound[key] = roles[key]
    assert set(bound) == set(roles), "a role is bound to nobody"
    return bound


@pytest.mark.parametrize(
    ("scope", "monitoring", "replicas"),
    [(s, m, r) for s in ("cluster", "namespaces") for m in (False, True) for r in (1, 2)],
)
def test_rbac_is_exactly_the_api_calls(
    chart: helm.Chart, scope: str, monitoring: bool, replicas: int
) -> None:
    watched = ["team-a", "team-b"] if scope == "namespaces" else []
    values = {
        "watch": {"scope": scope, "namespaces": watched},
        "monitoring": {"enabled": monitoring},
        "replicas": replicas,
    }
    docs = render(chart, values)
    bound = _bound_to_operator(docs, f"{RELEASE}-prefixtune")
    expected = {t for t in ALL_CALLS if (t[0], t[1]) not in _not_needed(scope, monitoring)}
    if scope == "cluster":
        assert [k[0] for k in bound] == ["ClusterRole"]
        granted = set().union(*bound.values())
        assert granted == expected
    else:
        cluster = set().union(*(r for k, r in bound.items() if k[0] == "ClusterRole"))
        # Cluster-wide, only cluster-scoped resources: nothing namespaced beyond the watched namespaces.
        assert {(g, r) for g, r, _ in cluster} <= CLUSTER_SCOPED
        assert {k[1] for k in bound if k[0] == "Role"} == set(watched)
        for key, rules in bound.items():
            if key[0] == "Role":
                assert rules | cluster == expected, f"Role in {key[1]}"
                assert not rules & cluster
    assert not any(r == "secrets" for _, r, _ in set().union(*bound.values()))


def test_rbac_create_false_renders_no_rbac(chart: helm.Chart) -> None:
    docs = render(chart, {"rbac": {"create": False}})
    assert not [d for d in docs if d["apiVersion"].startswith("rbac.authorization.k8s.io/")]


# --- the operator pods --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_operator_args_parse_with_the_operators_own_parser(chart: helm.Chart, name: str) -> None:
    values = VALUE_SETS[name]
    docs = render(chart, values)
    deps = deployments(docs)
    assert len(deps) == values.get("replicas", 1)
    watch = values.get("watch", {"scope": "namespaces", "namespaces": []})
    priorities = []
    for dep in deps:
        c = container(dep)
        assert "command" not in c, "the image's ENTRYPOINT (prefixtune run) must stay"
        opts = options_from_args(c["args"])
        assert opts.clusterwide == (watch["scope"] == "cluster")
        # scope namespaces with none listed: the release's own namespace (the default).
        want = [] if watch["scope"] == "cluster" else (watch["namespaces"] or [RELEASE_NS])
        assert opts.namespaces == want
        assert opts.peering == values.get("peering", {}).get("name", "prefixtune")
        assert not opts.standalone
        metrics = values.get("metrics", {}).get("enabled", True)
        assert opts.metrics_port == (8080 if metrics else None)
        host_path = values.get("enginePolicy", {}).get("allowHostPathVolumes", False)
        assert opts.admin.allow_host_path is host_path  # off unless the values turn it on
        routing = values.get("routing", {})
        assert opts.admin.auto_routing is routing.get("auto", True)
        images = routing.get("images", {})
        assert dict(opts.admin.router_images) == {
            router: image
            for router, image in (
                (Router.SGLANG, images.get("sglangRouter")),
                (Router.VLLM, images.get("vllmRouter")),
            )
            if image
        }
        priorities.append(opts.priority)
        env = {e["name"]: e for e in c["env"]}
        assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # kopf pauses every peer when two live peers share a priority: each pod must have its own.
    assert len(set(priorities)) == len(priorities)


def test_ha_runs_an_active_and_a_standby_pod(chart: helm.Chart) -> None:
    deps = deployments(render(chart, {"replicas": 2}))
    roles = {d["metadata"]["labels"]["prefixtune.io/peering-role"]: d for d in deps}
    assert set(roles) == {"active", "standby"}
    prio = {role: options_from_args(container(d)["args"]).priority for role, d in roles.items()}
    assert prio["active"] > prio["standby"]
    for d in deps:
        assert d["spec"]["replicas"] == 1
        assert d["spec"]["strategy"]["type"] == "Recreate"  # an upgraded pod never overlaps its old self
        anti = d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        assert anti["preferredDuringSchedulingIgnoredDuringExecution"]
    selectors = [json.dumps(d["spec"]["selector"], sort_keys=True) for d in deps]
    assert len(set(selectors)) == 2, "the two Deployments must not select each other's pods"


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_pod_security(chart: helm.Chart, name: str) -> None:
    for dep in deployments(render(chart, VALUE_SETS[name])):
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 65532
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = container(dep)["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        mounts = {m["mountPath"]: m["name"] for m in container(dep)["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]]
        assert all("secret" not in v for v in volumes.values())


def test_peering_objects_match_the_operator_args(chart: helm.Chart) -> None:
    docs = render(chart, VALUE_SETS["cluster"])
    (peering,) = of_kind(docs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == options_from_args(container(deployments(docs)[0])["args"]).peering
    (own,) = of_kind(render(chart, {}), "KopfPeering")  # the default: the release's namespace only
    assert own["metadata"]["namespace"] == RELEASE_NS
    docs = render(chart, VALUE_SETS["namespaced"])
    assert not of_kind(docs, "ClusterKopfPeering")
    assert {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in of_kind(docs, "KopfPeering")} == {
        ("team-a", "prefixtune"),
        ("team-b", "prefixtune"),
    }
    assert not of_kind(render(chart, {"peering": {"create": False, "name": "x"}}), "KopfPeering")


# --- monitoring and dashboard -------------------------------------------------------------------------


def test_monitoring_switch(chart: helm.Chart) -> None:
    off = render(chart, {})
    assert not [d for d in off if d["apiVersion"].startswith("monitoring.coreos.com/")]

    on = render(chart, VALUE_SETS["monitoring-servicemonitor"])
    (monitor,) = of_kind(on, "ServiceMonitor")
    (service,) = of_kind(on, "Service")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    labels = service["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    # The operator's series carry the ServingDeployment's namespace: keep it, not the target's.
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True

    pod_mon = render(chart, VALUE_SETS["monitoring-podmonitor"])
    (pm,) = of_kind(pod_mon, "PodMonitor")
    (dep,) = deployments(pod_mon)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in pm["spec"]["selector"]["matchLabels"].items())
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] in {p["name"] for p in container(dep)["ports"]}

    assert not of_kind(render(chart, VALUE_SETS["monitoring-no-operator-monitor"]), "ServiceMonitor")


def test_monitoring_without_metrics_fails_with_a_clear_message(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"metrics\.enabled"):
        render(chart, {"metrics": {"enabled": False}, "monitoring": {"enabled": True}})


def _dashboard(
    chart: helm.Chart, values: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    (cm,) = [
        d
        for d in of_kind(render(chart, values or {}), "ConfigMap")
        if d["metadata"]["name"].endswith("-dashboard")
    ]
    return cm, json.loads(cm["data"]["prefixtune.json"])


def test_dashboard_configmap(chart: helm.Chart) -> None:
    cm, dash = _dashboard(chart)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    titles = " | ".join(p["title"].lower() for p in dash["panels"])
    for wanted in ("hit rate", "ttft p50 / p99", "goodput", "trials", "score"):
        assert wanted in titles
    assert (
        _dashboard(chart, {"dashboard": {"namespace": "monitoring"}})[0]["metadata"]["namespace"]
        == "monitoring"
    )
    assert not [
        d
        for d in render(chart, {"dashboard": {"enabled": False}})
        if d["metadata"]["name"].endswith("-dashboard")
    ]


def _exprs(dash: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def _known_metric_names() -> set[str]:
    names: set[str] = set()
    for engine in EngineName:
        m = get_adapter(engine).metrics
        fields = [v for k, v in vars(m).items() if isinstance(v, str) and k != "hit_unit"]
        for name in [*fields, *m.extra.values()]:
            if name and re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name):
                names |= {name, f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}
    # Families without children have no samples yet; per-resource mode registers every family.
    for family in SelfMetrics(per_resource=True).registry.collect():
        names |= {family.name + suffix for suffix in suffixes[family.type]}
    return names


_PROMQL_WORDS = {
    "sum",
    "by",
    "rate",
    "increase",
    "histogram_quantile",
    "max",
    "le",
    "namespace",
    "service",
    "name",
}


def _metric_names_in(expr: str) -> set[str]:
    names = set()
    for alternatives in re.findall(r'__name__=~"([^"]+)"', expr):
        names |= set(alternatives.split("|"))
    stripped = re.sub(r'"[^"]*"', '""', expr)  # drop label values
    stripped = re.sub(r"\[[^\]]*\]", "", stripped)  # and ranges
    for word in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", stripped):
        if word in _PROMQL_WORDS or word in {"outcome", "phase", "mode", "__name__"}:
            continue
        names.add(word)
    return names


def test_dashboard_uses_only_real_metric_names(chart: helm.Chart) -> None:
    known = _known_metric_names()
    _, dash = _dashboard(chart)
    used = set().union(*(_metric_names_in(e) for e in _exprs(dash)))
    assert used, "no metric found in the dashboard"
    assert used <= known, f"unknown metric names: {sorted(used - known)}"
    for engine_prefix in ("vllm:", "sglang:", "trtllm_", "prefixtune_"):
        assert any(n.startswith(engine_prefix) for n in used)


def test_dashboard_promql_parses(chart: helm.Chart, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    require_component(promtool is not None, "promtool (Debian package prometheus)")
    assert promtool is not None
    _, dash = _dashboard(chart)
    grafana_vars = {
        "${ttft_slo}": "2.5",
        "$namespace": ".*",
        "$__rate_interval": "1m",
        "$__range": "1h",
    }
    rules = []
    for i, expr in enumerate(_exprs(dash)):
        for var, value in grafana_vars.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, expr
        rules.append({"record": f"prefixtune:dashboard_{i}", "expr": expr})
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- values.schema.json and the README ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicas": "two"}, r"/replicas"),
        ({"replicas": 3}, r"/replicas"),
        ({"watch": {"scope": "cluster", "namespaces": ["team-a"]}}, r"/watch/namespaces"),
        ({"watch": {"scope": "everywhere"}}, r"/watch/scope"),
        ({"watch": {"namespaces": ["Team_A"]}}, r"/watch/namespaces"),
        ({"prometheus": {"url": "http://10.0.0.1/admin?x="}}, r"/prometheus/url"),
        ({"enginePolicy": {"allowedImages": ["a b"]}}, r"/enginePolicy/allowedImages"),
        ({"metrics": {"port": 80}}, r"/metrics/port"),
        ({"monitoring": {"operatorMonitor": "Probe"}}, r"/monitoring/operatorMonitor"),
        ({"image": {"pullPolicy": "Sometimes"}}, r"/image/pullPolicy"),
        ({"operator": {"tick": 0}}, r"/operator/tick"),
        ({"replica": 2}, r"additional properties 'replica'"),
    ],
)
def test_schema_rejects_bad_values(chart: helm.Chart, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=message):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError):
        render(chart, values)


def _leaf_paths(values: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(values, dict) and values:
        for key, value in values.items():
            yield from _leaf_paths(value, f"{prefix}.{key}" if prefix else key)
    else:
        yield prefix


def test_every_value_is_in_the_schema_and_the_readme(chart: helm.Chart) -> None:
    chart.validate_schema(chart.values)
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    readme = (CHART / "README.md").read_text()
    for path in _leaf_paths(chart.values):
        node, described = schema, []
        for part in path.split("."):
            if node.get("additionalProperties") is False:
                assert part in node["properties"], f"{path}: no schema for {part!r}"
                node = node["properties"][part]
                described.append(part)
            else:  # a free-form map (labels, annotations, resource requests): described as a whole
                break
        name = ".".join(described)
        assert f"`{name}`" in readme, f"charts/prefixtune/README.md does not describe `{name}`"


# --- a shared cluster (issue #17) ------------------------------------------------------------------------


def test_the_default_install_watches_only_its_namespace_with_namespaced_rbac(chart: helm.Chart) -> None:
    docs = render(chart, {})
    assert not of_kind(docs, "ClusterRoleBinding") or all(
        {(g, r) for g, r, _ in _rules(role)} <= CLUSTER_SCOPED for role in of_kind(docs, "ClusterRole")
    )
    (role,) = of_kind(docs, "Role")
    assert role["metadata"]["namespace"] == RELEASE_NS
    opts = options_from_args(container(deployments(docs)[0])["args"])
    assert not opts.clusterwide and opts.namespaces == [RELEASE_NS]


def test_the_chart_readme_says_cluster_scope_is_cluster_admin_equivalent() -> None:
    text = (CHART / "README.md").read_text()
    assert "cluster-admin-equivalent" in text
    assert "scope: namespaces" in text and "kube-system" in text


def test_tenant_policy_values_become_operator_flags_and_the_probe_sees_the_loop(chart: helm.Chart) -> None:
    docs = render(chart, VALUE_SETS["tenant-policy"])
    dep = deployments(docs)[0]
    c = container(dep)
    opts = options_from_args(c["args"])
    assert opts.admin.allowed_images == ("ghcr.io/acme/", "vllm/vllm-openai")
    assert opts.admin.prometheus_url == "https://prometheus.monitoring:9090"
    assert opts.admin.prometheus_hosts == ("thanos.monitoring:9090",)
    assert opts.admin.prometheus_ca_file == "/etc/prefixtune/prometheus-ca/ca.crt"
    assert opts.admin.prometheus_operator_labels  # the chart's default: only the operator's series
    assert opts.metrics_address == "0.0.0.0" and opts.metrics_per_resource
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["prometheus-ca"]["mountPath"] == "/etc/prefixtune/prometheus-ca"
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["prometheus-ca"]["configMap"]["name"] == "prom-ca"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    default = options_from_args(container(deployments(render(chart, {}))[0])["args"])
    assert default.admin.allowed_images and default.admin.prometheus_url is None
    assert not default.metrics_per_resource and default.metrics_address == "0.0.0.0"
    dropped = render(chart, {"prometheus": {"operatorLabels": False}})
    assert not options_from_args(container(deployments(dropped)[0])["args"]).admin.prometheus_operator_labels


async def test_the_operators_own_rbac_entries_are_exactly_the_calls_it_makes() -> None:
    """Issue #17: the operator's calls, recorded through the sandbox (children created, patched,
    an owned canary deleted, a ServiceMonitor, an Event), equal api_calls.py's "operator" entries:
    no verb granted that it never uses, none used that is not granted."""
    from bench import _reliability_tenant

    seen = await _reliability_tenant.observed_calls()
    listed = {(c.group, c.resource, v) for c in API_CALLS if c.by == "operator" for v in c.verbs}
    assert seen == listed
    assert all(c.by in ("operator", "kopf", "grant") for c in API_CALLS)

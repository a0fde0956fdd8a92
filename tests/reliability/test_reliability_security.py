"""Security (issue #9): least privilege in the chart, a non-root image, no credentials in logs or
Events, loopback-only servers in the twin and the sandbox.

- the operator pod: non-root, no privilege escalation, read-only root filesystem, every capability
  dropped, seccomp RuntimeDefault (rendered with Helm's own SDK, every value set that matters);
- RBAC: no Secrets, no '*', no escalate/bind/impersonate, no cluster-admin, only the verbs the
  operator's API calls use (controller/api_calls.py);
- the Dockerfile runs as a numeric non-root user (the chart's runAsUser);
- credentials: a real ``prefixtune run --verbose`` with a bearer token in its kubeconfig never writes
  the token to its log, to an Event or to a status; the log redaction covers kopf's loggers (and
  kopf's Event poster), exception tracebacks, Authorization headers and kubeconfig fields;
- the twin's and the sandbox's HTTP servers bind 127.0.0.1 unless told otherwise.

What this cannot show: RBAC enforcement (no real API server), Pod Security admission, the runtime's
seccomp profile. The rules are checked as data.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import ipaddress
import logging
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from tests.conftest import ROOT

from prefixtune.api.crd import build_crd
from prefixtune.api.validation import validate_spec
from prefixtune.controller.api_calls import API_CALLS
from prefixtune.controller.kube import Connection
from prefixtune.controller.operator import operator_argv, spawn_operator, stop_operator
from prefixtune.controller.redaction import install_log_redaction, redact
from prefixtune.sandbox import cli as sandbox_cli
from prefixtune.sandbox import emulator, prometheus, up
from prefixtune.sandbox.emulator import kubeconfig
from prefixtune.sandbox.kubelet import AddressPool, KubeletConfig
from prefixtune.twin import serve as twin_serve

CHART = ROOT / "charts" / "prefixtune"
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": {"watch": {"scope": "namespaces", "namespaces": ["team-a", "team-b"]}},
    "ha": {"replicas": 2},
    "monitoring": {"monitoring": {"enabled": True}},
}
FORBIDDEN_VERBS = {"*", "escalate", "bind", "impersonate"}
SENSITIVE_RESOURCES = {
    "secrets",
    "*",
    "pods/exec",
    "pods/attach",
    "pods/portforward",
    "serviceaccounts/token",
}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def _render(chart: helm.Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    out = chart.render(values, name="pt", namespace="prefixtune-system", is_install=True)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if not path.endswith("NOTES.txt"):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


# --- the operator pod ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_operator_pod_is_non_root_read_only_and_unprivileged(chart: helm.Chart, name: str) -> None:
    deployments = [d for d in _render(chart, VALUE_SETS[name]) if d["kind"] == "Deployment"]
    assert deployments
    for dep in deployments:
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
        for container in pod["containers"] + pod.get("initContainers", []):
            ctx = container["securityContext"]
            assert ctx["runAsNonRoot"] is True and ctx.get("runAsUser", 1) != 0
            assert ctx["allowPrivilegeEscalation"] is False
            assert ctx["readOnlyRootFilesystem"] is True
            assert ctx.get("privileged", False) is False
            assert ctx["capabilities"]["drop"] == ["ALL"] and not ctx["capabilities"].get("add")
            assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
        # No hostPath volumes; the only writable mount is an emptyDir.
        assert all("hostPath" not in v for v in pod.get("volumes", []))


# --- RBAC ------------------------------------------------------------------------------------------


def _api_verbs() -> dict[tuple[str, str], set[str]]:
    verbs: dict[tuple[str, str], set[str]] = {}
    for call in API_CALLS:
        verbs.setdefault((call.group, call.resource), set()).update(call.verbs)
    return verbs


def rbac_violations(docs: list[dict[str, Any]]) -> list[str]:
    """Every way the rendered RBAC exceeds least privilege (empty: none)."""
    found: list[str] = []
    allowed = _api_verbs()
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    for role in roles:
        name = role["metadata"]["name"]
        if "aggregationRule" in role:
            found.append(f"{name}: aggregates other roles")
        for rule in role.get("rules", []):
            verbs = set(rule.get("verbs", []))
            if "nonResourceURLs" in rule:
                found.append(f"{name}: nonResourceURLs {rule['nonResourceURLs']}")
            if verbs & FORBIDDEN_VERBS:
                found.append(f"{name}: verbs {sorted(verbs & FORBIDDEN_VERBS)}")
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    where = f"{name}: {group or 'core'}/{resource}"
                    if group == "*" or resource in SENSITIVE_RESOURCES:
                        found.append(f"{where} is not the operator's business")
                        continue
                    used = allowed.get((group, resource))
                    if used is None:
                        found.append(f"{where}: the operator makes no such call")
                    elif verbs - used:
                        found.append(f"{where}: verbs {sorted(verbs - used)} are never used")
    role_names = {r["metadata"]["name"] for r in roles}
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        ref = binding["roleRef"]["name"]
        if ref in {"cluster-admin", "admin", "edit"} or ref not in role_names:
            found.append(f"{binding['metadata']['name']}: binds {ref}, not the chart's own role")
        found += [
            f"{binding['metadata']['name']}: binds a {s['kind']}"
            for s in binding["subjects"]
            if s["kind"] != "ServiceAccount"
        ]
    return found


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_rbac_is_least_privilege(chart: helm.Chart, name: str) -> None:
    docs = _render(chart, VALUE_SETS[name])
    assert [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    assert rbac_violations(docs) == []


def test_the_rbac_check_catches_excess_privilege(chart: helm.Chart) -> None:
    docs = _render(chart, {})
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    role["rules"] += [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["escalate"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]},
    ]
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    binding["roleRef"]["name"] = "cluster-admin"
    found = "\n".join(rbac_violations(docs))
    for word in ("core/secrets", "escalate", "'*'", "['delete'] are never used", "binds cluster-admin"):
        assert word in found, found


# --- the image -------------------------------------------------------------------------------------


def test_dockerfile_runs_as_a_numeric_non_root_user_matching_the_chart(chart: helm.Chart) -> None:
    lines = [ln.strip() for ln in (ROOT / "Dockerfile").read_text().splitlines()]
    runtime = lines[max(i for i, ln in enumerate(lines) if ln.upper().startswith("FROM ")) :]
    users = [ln.split(None, 1)[1] for ln in runtime if ln.upper().startswith("USER ")]
    assert users, "the runtime stage sets no USER"
    match = re.fullmatch(r"(\d+)(?::(\d+))?", users[-1])
    assert match, f"USER {users[-1]!r} is not numeric (Kubernetes' runAsNonRoot can only verify a uid)"
    uid = int(match.group(1))
    assert uid != 0 and (match.group(2) is None or int(match.group(2)) != 0)
    (dep, *_) = [d for d in _render(chart, {}) if d["kind"] == "Deployment"]
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid


# --- credentials in logs and Events ----------------------------------------------------------------

TOKEN = "sk-prefixtune-test-9f8e7d6c5b4a3210zyxw"


def test_redact_removes_tokens_headers_and_kubeconfig_credentials() -> None:
    install_log_redaction("registered-secret-0123456789")
    cases = {
        "Authorization: Bearer eyJhbGciOiJSUzI1NiJ9.payload.sig": "eyJhbGciOiJSUzI1NiJ9",
        "{'Authorization': 'Basic dXNlcjpwYXNzd29yZA=='}": "dXNlcjpwYXNzd29yZA",
        "headers={'authorization': 'abc123def456'}": "abc123def456",
        "user: {token: kube-token-abcdef, client-key-data: LS0tLS1CRUdJTiBSU0E}": "kube-token-abcdef",
        "client-key-data: LS0tLS1CRUdJTiBSU0E=": "LS0tLS1CRUdJTiBSU0E",
        "ConnectionInfo(server='https://k', token='tok-1234567890', password='hunter22')": "tok-1234567890",
        "the value registered-secret-0123456789 appears in a message": "registered-secret-0123456789",
        "sent Bearer abcdefgh12345678 to the server": "abcdefgh12345678",
    }
    for text, secret in cases.items():
        clean = redact(text)
        assert secret not in clean, clean
        assert "***" in clean
    assert "hunter22" not in redact(
        cases["ConnectionInfo(server='https://k', token='tok-1234567890', password='hunter22')"]
    )
    # Ordinary text is left alone.
    for text in ("token=None", "max_tokens=512 tokenizer=llama", "a bearer of good news", "prefix cache hit"):
        assert redact(text) == text


def test_log_records_are_redacted_for_every_handler_including_kopfs() -> None:
    install_log_redaction(TOKEN)
    seen: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(self.format(record))

    handler = Capture()
    loggers = [logging.getLogger(n) for n in ("kopf.objects", "kopf.clients.auth", "prefixtune.controller")]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    try:
        connection = Connection("https://kube:6443", token=TOKEN)
        loggers[0].warning("login with %r", connection)
        loggers[1].debug("headers: %s", {"Authorization": f"Bearer {TOKEN}"})
        try:
            raise RuntimeError(f"401 for Authorization: Bearer {TOKEN}")
        except RuntimeError:
            loggers[2].exception("a call failed")
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    assert len(seen) == 3
    text = "\n".join(seen)
    assert TOKEN not in text and "Traceback" in text and "***" in text


async def test_a_running_operator_never_logs_or_posts_its_token() -> None:
    """``prefixtune run --verbose`` (kopf at INFO, the operator at DEBUG) with a bearer token: after it
    handled a valid and an invalid resource, the token is nowhere in its log, the Events or statuses."""
    cfg = KubeletConfig(startup_delay_s=1e9, dcgm_port=None, resync_s=2.0)
    with tempfile.TemporaryDirectory(prefix="prefixtune-sec-") as tmp:
        async with up.sandbox(up.SandboxOptions(crds=[build_crd()], config=cfg, load=False)) as sb:
            config = kubeconfig(sb.url)
            config["users"][0]["user"]["token"] = TOKEN
            path = Path(tmp) / "kubeconfig"
            path.write_text(yaml.safe_dump(config))
            argv = [*operator_argv(str(path), tick_s=1.0), "--verbose"]
            log_path = Path(tmp) / "operator.log"
            proc = spawn_operator(argv, str(log_path))
            try:
                sdep = "/apis/prefixtune.io/v1alpha1/namespaces/default/servingdeployments"
                good = {"engine": "vllm", "model": "m/x", "tuning": {"mode": "off"}}
                bad = {"engine": "vllm", "model": "m/x", "extraArgs": ["--api-key", TOKEN + ";"]}
                for name, spec in (("good", good), ("bad", bad)):
                    body = {"apiVersion": "prefixtune.io/v1alpha1", "kind": "ServingDeployment"}
                    await sb.api.create(sdep, {**body, "metadata": {"name": name}, "spec": spec})
                deadline = time.monotonic() + 60
                events: list[dict[str, Any]] = []
                while time.monotonic() < deadline:
                    events = await sb.api.list("/api/v1/namespaces/default/events")
                    deployed = await sb.api.get("/apis/apps/v1/namespaces/default/deployments/good")
                    if deployed and any(e.get("reason") == "InvalidSpec" for e in events):
                        break
                    await asyncio.sleep(1.0)
                else:
                    raise AssertionError("the operator did not handle both resources in 60 s")
                statuses = [await sb.api.get(f"{sdep}/{n}") for n in ("good", "bad")]
            finally:
                stop_operator(proc, 15.0)
            log = log_path.read_text(errors="replace")
    assert "DEBUG" in log or "INFO" in log  # the log was written, verbosely
    assert TOKEN not in log
    assert all(TOKEN not in str(e) for e in events)
    bad_status = statuses[1]
    assert bad_status is not None
    ready = next(c for c in bad_status["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec" and "spec.extraArgs[1]" in ready["message"]
    assert TOKEN not in str(bad_status["status"])


def test_validation_messages_never_quote_secret_flag_values() -> None:
    secret = "sk-live-0123456789abcdef"
    for args in (
        ["--api-key", secret + ";"],
        [f"--api-key={secret}`"],
        ["--api-key", secret, "--bogus-flag"],
        ["--api_key", secret + "\x00"],
    ):
        spec, errors = validate_spec({"engine": "vllm", "model": "m", "extraArgs": args})
        assert spec is None and errors
        assert all(secret not in str(e) for e in errors), errors
        assert all(e.path.startswith("spec.extraArgs") for e in errors)


# --- HTTP servers bind loopback by default ---------------------------------------------------------


def _default(func: Any, name: str) -> object:
    return inspect.signature(func).parameters[name].default


def _parser_default(parser: argparse.ArgumentParser, dest: str) -> object:
    return next(a.default for a in parser._actions if a.dest == dest)


def test_twin_and_sandbox_servers_default_to_loopback() -> None:
    defaults = {
        "twin serve --host": _parser_default(twin_serve._parser(), "host"),
        "twin ServeOptions(host)": twin_serve.ServeOptions().host,
        "sandbox up --host": _parser_default(sandbox_cli._parser(), "host"),
        "SandboxOptions(host)": _default(up.SandboxOptions, "host"),
        "serve_emulator(host)": _default(emulator.serve_emulator, "host"),
        "PrometheusRunner(host)": _default(prometheus.PrometheusRunner.__init__, "host"),
    }
    for what, value in defaults.items():
        assert value == "127.0.0.1", f"{what} defaults to {value!r}"


async def test_the_emulator_a_twin_and_pod_addresses_are_loopback_when_started_with_defaults() -> None:
    async with emulator.serve_emulator() as (_, url):
        assert url.startswith("http://127.0.0.1:"), url
    async with twin_serve.serving("vllm", "meta-llama/Llama-3.1-8B-Instruct", "H100-80GB") as url:
        assert url.startswith("http://127.0.0.1:"), url
    pool = AddressPool(7)
    addresses = [pool.allocate() for _ in range(300)]
    assert all(ipaddress.ip_address(a).is_loopback and a != "127.0.0.1" for a in addresses)

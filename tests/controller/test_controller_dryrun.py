"""``prefixtune render`` (issue #18, item 3): the objects the operator would create for a spec's
starting config, from its own render functions, and the operator's messages for an invalid one."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from prefixtune import cli
from prefixtune.api import parse_spec
from prefixtune.api.validation import validate_spec
from prefixtune.controller import dryrun_cli
from prefixtune.controller.admin import AdminPolicy
from prefixtune.controller.dryrun import UID_PLACEHOLDER, render_objects
from prefixtune.controller.execute import RENDERED_HASH, ensure_children, rendered_hash
from prefixtune.controller.observe import desired, scale_plan
from prefixtune.controller.operator import options_from_args
from prefixtune.controller.reconcile import deployment_key
from prefixtune.controller.render import Owner
from prefixtune.controller.settings import tuning_settings
from prefixtune.engines import get_adapter
from prefixtune.routing.render import router_name, settings_for
from prefixtune.tuning.policy import initial_state

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(
    p
    for p in (ROOT / "examples").glob("*.yaml")
    if yaml.safe_load(p.read_text()).get("kind") == "ServingDeployment"
)  # the ServingDeployments (a Namespace file sits beside them)
KUBE = kubernetes_validate.utils.latest_version()
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _doc(name: str = "rag", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "prefixtune.io/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"engine": "vllm", "model": MODEL, **spec},
    }


def _render(argv: list[str], stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = dryrun_cli.run(argv, io.StringIO(stdin), out, err)
    return rc, out.getvalue(), err.getvalue()


def _by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = [o["kind"] for o in objects]
    assert len(kinds) == len(set(kinds)), kinds
    return {o["kind"]: o for o in objects}


def test_examples_exist() -> None:
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_renders_valid_objects_whose_deployment_runs_the_adapters_command(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli.main(["render", "-f", str(path)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert err == ""
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    spec = parse_spec(doc["spec"])
    rendered = list(yaml.safe_load_all(out))
    router = [o for o in rendered if o["metadata"]["name"] == router_name(doc["metadata"]["name"])]
    objects = _by_kind([o for o in rendered if o not in router])
    adapter = get_adapter(spec.engine)
    assert set(objects) == {"Deployment", "Service"} | ({"ConfigMap"} if spec.engine == "trtllm" else set())
    routed = settings_for(spec, spec.knob_config()).routed
    assert {o["kind"] for o in router} == (
        {"Deployment", "ServiceAccount", "Role", "RoleBinding"} if routed else set()
    )
    for body in [*objects.values(), *router]:
        kubernetes_validate.validate(body, KUBE, strict=True)
        meta = body["metadata"]
        assert meta["namespace"] == doc["metadata"]["namespace"]
        (ref,) = meta["ownerReferences"]
        assert ref["name"] == doc["metadata"]["name"] and ref["uid"] == UID_PLACEHOLDER
        assert ref["controller"] is True and ref["kind"] == "ServingDeployment"
        assert meta["annotations"][RENDERED_HASH] == rendered_hash(body)
    deployment = objects["Deployment"]
    assert deployment["spec"]["replicas"] == spec.replicas
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert adapter.starts([*container["command"], *container["args"]])
    files = {
        mount["mountPath"]: objects["ConfigMap"]["data"][mount["subPath"]]
        for mount in container.get("volumeMounts", [])
        if mount["name"] == "engine-options"
    }
    parsed = adapter.parse([*container["command"], *container["args"]], files)
    assert parsed.model == spec.model
    assert parsed.config == adapter.normalize(spec.knob_config())
    assert container["image"] == (spec.image or adapter.default_image)


def test_json_output_is_one_list_of_the_same_objects() -> None:
    text = yaml.safe_dump(_doc(engine="trtllm"))
    rc_yaml, as_yaml, _ = _render(["-f", "-"], text)
    rc_json, as_json, _ = _render(["-f", "-", "--output", "json"], text)
    assert rc_yaml == rc_json == 0
    listed = json.loads(as_json)
    assert listed["kind"] == "List" and listed["items"] == list(yaml.safe_load_all(as_yaml))
    assert [o["kind"] for o in listed["items"]] == ["ConfigMap", "Deployment", "Service"]


def test_an_invalid_document_prints_the_validators_messages_and_nothing_of_itself() -> None:
    bad = _doc("broken", config={"blockSize": 17})
    text = yaml.safe_dump_all([_doc("good"), bad])
    rc, out, err = _render(["-f", "-"], text)
    assert rc == 1
    _, errors = validate_spec(bad["spec"])
    assert errors
    assert err.splitlines() == [f"-: document 2 (ServingDeployment team/broken): {e}" for e in errors]
    names = {o["metadata"]["name"] for o in yaml.safe_load_all(out)}
    assert names == {"good"}


def test_mode_off_unquoted_in_a_file_fails_with_the_advice_to_quote_it(tmp_path: Path) -> None:
    path = tmp_path / "sdep.yaml"
    path.write_text(
        "apiVersion: prefixtune.io/v1alpha1\nkind: ServingDeployment\nmetadata: {name: rest}\n"
        f"spec: {{engine: vllm, model: {MODEL}, tuning: {{mode: off}}}}\n"
    )
    rc, out, err = _render(["-f", str(path)])
    assert rc == 1 and out == ""
    assert "spec.tuning.mode: false is not allowed" in err and 'write it quoted, mode: "off"' in err
    path.write_text(path.read_text().replace("mode: off", 'mode: "off"'))
    rc, out, _ = _render(["-f", str(path)])
    assert rc == 0 and "kind: Deployment" in out


def test_the_resource_name_is_checked_as_the_operator_checks_it() -> None:
    objects, problems = render_objects(_doc("llama-canary"))
    assert objects == [] and any("ends in '-canary'" in p for p in problems)
    objects, problems = render_objects({**_doc(), "metadata": {}})
    assert objects == [] and problems == [
        "metadata.name: required field is missing; allowed: an RFC 1035 label"
    ]


def test_a_wrong_version_or_kind_of_the_group_is_refused_and_other_groups_are_skipped() -> None:
    _, problems = render_objects({**_doc(), "apiVersion": "prefixtune.io/v1"})
    assert problems and problems[0].startswith("apiVersion: 'prefixtune.io/v1' is not served")
    _, problems = render_objects({**_doc(), "kind": "ServingDeploymnt"})
    assert problems and problems[0].startswith("kind: 'ServingDeploymnt'")
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "agents"}}
    assert render_objects(namespace) == ([], [])
    rc, out, err = _render(["-f", "-"], yaml.safe_dump_all([namespace, _doc()]))
    assert rc == 0 and "skipped" in err and "Namespace agents" in err
    assert {o["kind"] for o in yaml.safe_load_all(out)} == {"Deployment", "Service"}


def test_the_admin_policy_is_checked_only_when_given() -> None:
    doc = _doc(tuning={"metrics": {"source": "prometheus"}})
    objects, problems = render_objects(doc)
    assert objects and problems == []
    objects, problems = render_objects(doc, AdminPolicy())
    assert objects == [] and problems == AdminPolicy().spec_problems(parse_spec(doc["spec"]))
    assert problems
    text = yaml.safe_dump(doc)
    assert _render(["-f", "-", "--prometheus-url", "http://prometheus.monitoring:9090"], text)[0] == 0
    rc, _, err = _render(["-f", "-", "--allowed-images", "ghcr.io/acme/"], text)
    assert rc == 1 and "spec.image" in err and "spec.tuning.metrics.source" in err


def test_the_service_monitor_only_with_the_flag() -> None:
    objects, _ = render_objects(_doc(), monitoring=True)
    assert [o["kind"] for o in objects] == ["Deployment", "Service", "ServiceMonitor"]
    rc, out, _ = _render(["-f", "-", "--service-monitor"], yaml.safe_dump(_doc()))
    assert rc == 0 and "kind: ServiceMonitor" in out


def test_a_canary_spec_renders_only_the_baseline_at_full_replicas() -> None:
    objects, _ = render_objects(_doc(replicas=3, tuning={"rollout": {"strategy": "canary"}}))
    (deployment,) = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] != "rag-router"
    ]
    assert deployment["metadata"]["name"] == "rag" and deployment["spec"]["replicas"] == 3


def test_the_uid_of_the_document_is_kept() -> None:
    doc = _doc()
    doc["metadata"]["uid"] = "1f0c3f5e-0000-4000-8000-000000000001"
    objects, _ = render_objects(doc)
    assert {o["metadata"]["ownerReferences"][0]["uid"] for o in objects} == {doc["metadata"]["uid"]}


@pytest.mark.parametrize(
    ("argv", "stdin", "code", "said"),
    [
        (["-f", "/nonexistent/sdep.yaml"], "", 2, "cannot read it"),
        (["--output", "yaml"], "", 2, ""),
        (["-f", "-", "--output", "toml"], "", 2, ""),
        (["-f", "-", "--prometheus-url", "http://u:p@prom"], "", 2, "--prometheus-url"),
        (["-f", "-"], "a: [", 1, "not valid YAML"),
        (["-f", "-"], "", 1, "no ServingDeployment"),
        (["-f", "-"], "- 1\n- 2\n", 1, "must be an object"),
    ],
)
def test_usage_errors_exit_2_and_bad_input_exits_1(argv: list[str], stdin: str, code: int, said: str) -> None:
    rc, out, err = _render(argv, stdin)
    assert rc == code and out == ""
    assert said in err


def test_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    rc, _, err = _render(["-f", str(tmp_path)])
    assert rc == 2 and "is a directory" in err


def test_an_input_over_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dryrun_cli, "MAX_INPUT_BYTES", 64)
    rc, out, err = _render(["-f", "-"], yaml.safe_dump(_doc()))
    assert rc == 1 and out == "" and "more than 64 characters" in err


def test_render_is_a_registered_subcommand() -> None:
    assert cli.SUBCOMMANDS["render"][:2] == ("prefixtune.controller.dryrun_cli", "main")


def test_run_and_render_take_the_same_admin_flags_and_refuse_the_same_bad_url() -> None:
    flags = ["--allowed-images", "ghcr.io/acme/,vllm/vllm-openai", "--prometheus-allowed-hosts", "prom:9090"]
    admin = options_from_args([*flags, "--prometheus-url", "http://prom:9090"]).admin
    assert admin.allowed_images == ("ghcr.io/acme/", "vllm/vllm-openai")
    assert admin.prometheus_hosts == ("prom:9090",) and admin.prometheus_url == "http://prom:9090"
    with pytest.raises(SystemExit, match="prefixtune run: --prometheus-url must be an http"):
        options_from_args(["--prometheus-url", "http://prom/?q=1"])
    doc = yaml.safe_dump(_doc(image="ghcr.io/acme/vllm:1"))
    assert _render(["-f", "-", *flags], doc)[0] == 0
    assert _render(["-f", "-", "--allowed-images", "vllm/vllm-openai"], doc)[0] == 1


def test_odd_metadata_is_not_a_crash() -> None:
    doc = _doc()
    doc["metadata"] = {"name": "rag", "annotations": ["not", "a", "map"]}
    objects, problems = render_objects(doc)
    assert problems == [] and {o["metadata"]["namespace"] for o in objects} == {"default"}
    objects, problems = render_objects({**_doc(), "metadata": "rag"})
    assert objects == [] and problems[0].startswith("metadata.name: required")


class _EmptyCluster:
    """A cluster without any object of the resource's: every create is recorded."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        return None

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.created.append(dict(body))
        return dict(body)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_the_dry_run_prints_what_the_operators_first_ensure_creates(engine: str) -> None:
    doc = _doc(engine=engine, replicas=2)
    doc["metadata"]["uid"] = "1f0c3f5e-0000-4000-8000-000000000002"
    spec = parse_spec(doc["spec"])
    # As the first reconcile of a new resource does (reconcile._reconcile): the initial policy
    # state, its desired configs, the scale for no pods, then ensure_children.
    settings = tuning_settings(spec, "team", "rag")
    state = initial_state(engine, settings, spec.knob_config(), 1, deployment_key(spec))
    want = desired(state)
    client = _EmptyCluster()
    scale = scale_plan(spec, want, [], False)
    owner = Owner.of(doc)
    asyncio.run(ensure_children(client, owner, spec, want, scale, monitoring=True))  # type: ignore[arg-type]
    objects, problems = render_objects(doc, monitoring=True)
    assert problems == []
    assert objects == client.created


def test_an_adopting_spec_renders_no_deployment_of_its_own() -> None:
    """The baseline of an adopting resource is the existing Deployment (patched in place), which a
    dry run cannot read: it prints what the operator creates, never a Deployment of the resource's
    name that it would not."""
    objects, problems = render_objects(_doc(replicas=2, adopt={"deployment": "llama"}))
    assert not problems
    assert [o["kind"] for o in objects] == ["Service"]
    objects, _ = render_objects(_doc(replicas=2))
    assert "Deployment" in [o["kind"] for o in objects]

"""Pure patch and selector logic behind the emulator (no HTTP)."""

from __future__ import annotations

from typing import Any

import pytest

from prefixtune.sandbox import _patches, _selectors


def _deployment() -> dict[str, Any]:
    return {
        "metadata": {"name": "app", "finalizers": ["a"]},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm:1",
                            "args": ["--x"],
                            "env": [{"name": "A", "value": "1"}],
                        },
                        {"name": "sidecar", "image": "proxy:1"},
                    ],
                    "volumes": [{"name": "cache", "emptyDir": {}}],
                }
            }
        },
    }


def test_merge_patch_replaces_lists_and_null_deletes() -> None:
    target = {"a": {"b": 1, "c": 2}, "l": [1, 2], "keep": True}
    patched = _patches.merge_patch(target, {"a": {"b": None, "d": 3}, "l": [3]})
    assert patched == {"a": {"c": 2, "d": 3}, "l": [3], "keep": True}
    assert target == {"a": {"b": 1, "c": 2}, "l": [1, 2], "keep": True}  # not mutated


def test_strategic_merge_keeps_other_containers_and_fields() -> None:
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "engine", "args": ["--y"]}]}}}}
    patched = _patches.strategic_merge_patch(_deployment(), patch)
    containers = patched["spec"]["template"]["spec"]["containers"]
    assert containers[0] == {
        "name": "engine",
        "image": "vllm:1",
        "args": ["--y"],
        "env": [{"name": "A", "value": "1"}],
    }
    assert containers[1] == {"name": "sidecar", "image": "proxy:1"}


def test_strategic_merge_named_lists_env_volumes_and_directives() -> None:
    patch = {
        "metadata": {"finalizers": ["b", "a"]},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "engine", "env": [{"name": "B", "value": "2"}, {"name": "A", "value": "9"}]},
                        {"name": "sidecar", "$patch": "delete"},
                    ],
                    "volumes": [{"name": "models", "emptyDir": {}}],
                }
            }
        },
    }
    patched = _patches.strategic_merge_patch(_deployment(), patch)
    pod = patched["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["engine"]
    assert pod["containers"][0]["env"] == [{"name": "A", "value": "9"}, {"name": "B", "value": "2"}]
    assert [v["name"] for v in pod["volumes"]] == ["cache", "models"]
    assert patched["metadata"]["finalizers"] == ["a", "b"]  # merged as an ordered set
    removed = _patches.strategic_merge_patch(
        patched, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}
    )
    assert removed["metadata"]["finalizers"] == ["b"]
    replaced = _patches.strategic_merge_patch(patched, {"spec": {"$patch": "replace", "replicas": 1}})
    assert replaced["spec"] == {"replicas": 1}


def test_strategic_merge_ports_conditions_and_plain_lists() -> None:
    target = {
        "ports": [{"containerPort": 80, "name": "http"}],
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "Tuning", "status": "True"}],
        "args": ["--a", "--b"],
    }
    patch = {
        "ports": [{"containerPort": 9090, "name": "metrics"}],
        "conditions": [{"type": "Ready", "status": "True"}],
        "args": ["--c"],
    }
    patched = _patches.strategic_merge_patch(target, patch)
    assert [p["containerPort"] for p in patched["ports"]] == [80, 9090]
    assert patched["conditions"] == [
        {"type": "Ready", "status": "True"},
        {"type": "Tuning", "status": "True"},
    ]
    assert patched["args"] == ["--c"]


def test_strategic_merge_rejects_items_without_their_merge_key() -> None:
    with pytest.raises(_patches.PatchError, match="merge key"):
        _patches.strategic_merge_patch({"containers": [{"name": "a"}]}, {"containers": [{"image": "x"}]})
    with pytest.raises(_patches.PatchError, match=r"\$patch"):
        _patches.strategic_merge_patch({}, {"$patch": "explode"})


def test_json_patch_ops_and_failed_test() -> None:
    target = {"metadata": {"resourceVersion": "5"}, "spec": {"l": [1]}}
    patched = _patches.json_patch(
        target,
        [
            {"op": "test", "path": "/metadata/resourceVersion", "value": "5"},
            {"op": "add", "path": "/spec/l/-", "value": 2},
            {"op": "add", "path": "/spec/x", "value": 1},
        ],
    )
    assert patched["spec"] == {"l": [1, 2], "x": 1}
    with pytest.raises(_patches.PatchTestFailed):
        _patches.json_patch(target, [{"op": "test", "path": "/metadata/resourceVersion", "value": "4"}])
    with pytest.raises(_patches.PatchError):
        _patches.json_patch(target, [{"op": "remove", "path": "/spec/missing"}])
    with pytest.raises(_patches.PatchError, match="list of operation objects"):
        _patches.json_patch(target, ["nope"])


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("app=vllm", {"app": "vllm"}, True),
        ("app==vllm", {"app": "sglang"}, False),
        ("app!=vllm", {}, True),  # != also matches objects without the label
        ("app!=vllm", {"app": "vllm"}, False),
        ("app", {"app": ""}, True),
        ("!app", {"app": "x"}, False),
        ("!app", {}, True),
        ("tier in (gpu, cpu),app", {"tier": "gpu", "app": "x"}, True),
        ("tier in (gpu,cpu)", {"tier": "tpu"}, False),
        ("tier notin (gpu)", {}, True),
        ("tier notin (gpu),app=x", {"tier": "gpu", "app": "x"}, False),
        ("example.dev/role=a", {"example.dev/role": "a"}, True),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], expected: bool) -> None:
    select = _selectors.build_selector(selector, None)
    assert select({"metadata": {"labels": labels}}) is expected


def test_field_selectors() -> None:
    obj = {"metadata": {"name": "a", "namespace": "ns"}, "status": {"phase": "Running"}, "spec": {"ok": True}}
    assert _selectors.build_selector(None, "metadata.name=a,metadata.namespace==ns")(obj)
    assert not _selectors.build_selector(None, "status.phase!=Running")(obj)
    assert _selectors.build_selector(None, "status.missing=")(obj)
    assert _selectors.build_selector(None, "spec.ok=true")(obj)


@pytest.mark.parametrize("bad", ["a in (b", "a b c", "-bad=1", "a=b c", "a=" + "x" * 64])
def test_bad_label_selectors_name_the_parameter(bad: str) -> None:
    with pytest.raises(_selectors.SelectorError, match="labelSelector"):
        _selectors.build_selector(bad, None)


def test_bad_field_selector_names_the_parameter() -> None:
    with pytest.raises(_selectors.SelectorError, match="fieldSelector"):
        _selectors.build_selector(None, "metadata.name")

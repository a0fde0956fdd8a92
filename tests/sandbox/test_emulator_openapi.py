"""OpenAPI v3 (``kubectl apply`` validation, ``kubectl explain``) and ``fieldValidation=Strict``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from prefixtune.api.crd import build_crd
from prefixtune.sandbox.emulator import RealisticEmulator, serve_emulator
from prefixtune.sandbox.emulator.openapi import unknown_fields

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
SDEPS = "/apis/prefixtune.io/v1alpha1/namespaces/default/servingdeployments"
SDEP_GVK = {"group": "prefixtune.io", "version": "v1alpha1", "kind": "ServingDeployment"}


@pytest.fixture
async def em() -> AsyncIterator[RealisticEmulator]:
    async with serve_emulator() as (emulator, _url):
        async with emulator.post(CRDS, json=build_crd()) as resp:
            assert resp.status == 201
        yield emulator


async def get_json(em: RealisticEmulator, path: str) -> tuple[int, Any]:
    async with em.get(path, headers={"Accept": "application/json"}) as resp:
        return resp.status, await resp.json(content_type=None)


async def gv_document(em: RealisticEmulator, key: str) -> dict[str, Any]:
    """What client-go's openapi client does: the index, then the document's serverRelativeURL."""
    status, index = await get_json(em, "/openapi/v3")
    assert status == 200
    status, doc = await get_json(em, index["paths"][key]["serverRelativeURL"])
    assert status == 200
    return dict(doc)


def supports_field_validation(doc: dict[str, Any], gvk: dict[str, str]) -> bool:
    """cli-runtime's ``supportsQueryParamV3``: a PATCH of the GVK that declares ``fieldValidation``."""
    for path in doc["paths"].values():
        patch = path.get("patch")
        if patch is None or patch.get("x-kubernetes-group-version-kind") != gvk:
            continue
        return any(p.get("name") == "fieldValidation" for p in patch.get("parameters") or [])
    return False


def sdep(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "prefixtune.io/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "s"},
        "spec": {"engine": "vllm", "model": "m", **spec},
    }


async def test_the_index_lists_every_group_version_and_its_document(em: RealisticEmulator) -> None:
    _, index = await get_json(em, "/openapi/v3")
    assert {"api/v1", "apis/apps/v1", "apis/prefixtune.io/v1alpha1"} <= set(index["paths"])
    assert index["paths"]["api/v1"]["serverRelativeURL"].startswith("/openapi/v3/api/v1?hash=")


async def test_kubectl_finds_server_side_field_validation_for_crds_and_built_ins(
    em: RealisticEmulator,
) -> None:
    assert supports_field_validation(await gv_document(em, "apis/prefixtune.io/v1alpha1"), SDEP_GVK)
    apps = await gv_document(em, "apis/apps/v1")
    assert supports_field_validation(apps, {"group": "apps", "version": "v1", "kind": "Deployment"})
    core = await gv_document(em, "api/v1")
    assert supports_field_validation(core, {"group": "", "version": "v1", "kind": "Namespace"})


async def test_explain_finds_the_crd_schema_by_its_gvk(em: RealisticEmulator) -> None:
    doc = await gv_document(em, "apis/prefixtune.io/v1alpha1")
    path = doc["paths"]["/apis/prefixtune.io/v1alpha1/namespaces/{namespace}/servingdeployments"]
    assert path["get"]["x-kubernetes-group-version-kind"] == SDEP_GVK
    [schema] = [
        s for s in doc["components"]["schemas"].values() if SDEP_GVK in s["x-kubernetes-group-version-kind"]
    ]
    crd_schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["spec"] == crd_schema["properties"]["spec"]
    assert schema["description"] == crd_schema["description"]
    assert "APIVersion defines" in schema["properties"]["apiVersion"]["description"]


async def test_a_deleted_crd_leaves_the_openapi_index(em: RealisticEmulator) -> None:
    async with em.delete(f"{CRDS}/servingdeployments.prefixtune.io") as resp:
        assert resp.status == 200
    _, index = await get_json(em, "/openapi/v3")
    assert "apis/prefixtune.io/v1alpha1" not in index["paths"]
    assert (await get_json(em, "/openapi/v3/apis/prefixtune.io/v1alpha1"))[0] == 404
    status, body = await get_json(em, "/openapi/v2")
    assert status == 404 and "v3 only" in body["message"]


async def test_strict_field_validation_refuses_unknown_fields_of_a_custom_resource(
    em: RealisticEmulator,
) -> None:
    body = sdep(engien="typo", tuning={"mode": "auto", "budgett": 1})
    async with em.post(f"{SDEPS}?fieldValidation=Strict", json=body) as resp:
        assert resp.status == 400
        message = (await resp.json())["message"]
    assert (
        message == 'strict decoding error: unknown field "spec.engien", unknown field "spec.tuning.budgett"'
    )
    async with em.post(SDEPS, json=body) as resp:  # no fieldValidation: accepted (no pruning emulated)
        assert resp.status == 201
    async with em.delete(f"{SDEPS}/s") as resp:
        assert resp.status == 200
    async with em.post(f"{SDEPS}?fieldValidation=Strict", json=sdep()) as resp:
        assert resp.status == 201
    patch = {"spec": {"replicass": 2}}
    headers = {"Content-Type": "application/merge-patch+json"}
    async with em.patch(f"{SDEPS}/s?fieldValidation=Strict", json=patch, headers=headers) as resp:
        assert resp.status == 400 and "spec.replicass" in (await resp.json())["message"]
    async with em.patch(
        f"{SDEPS}/s?fieldValidation=Strict", json={"spec": {"replicas": 2}}, headers=headers
    ) as resp:
        assert resp.status == 200


def test_unknown_fields_follow_the_structural_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "items": {
                        "type": "array",
                        "items": {"type": "object", "properties": {"a": {"type": "integer"}}},
                    },
                },
            }
        },
    }
    obj = {
        "apiVersion": "x/v1",
        "kind": "K",
        "metadata": {"name": "n", "anything": 1},
        "spec": {
            "labels": {"any": "v"},
            "free": {"deep": {"x": 1}},
            "items": [{"a": 1}, {"b": 2}],
            "typo": 1,
        },
        "extra": True,
    }
    assert unknown_fields(obj, schema) == ["spec.items[1].b", "spec.typo", "extra"]

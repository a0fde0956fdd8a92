"""spec.routing.image is a tenant's choice of what runs in the namespace, next to a ServiceAccount
that may list pods: the admin's image policy holds it as it holds spec.image."""

from __future__ import annotations

from typing import Any

from prefixtune.api.validation import parse_spec
from prefixtune.controller.admin import AdminPolicy

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _spec(**routing: Any) -> Any:
    return parse_spec({"engine": "sglang", "model": MODEL, "replicas": 2, "routing": routing})


def test_a_router_image_outside_the_admins_policy_is_refused_with_the_field_named() -> None:
    (problem,) = AdminPolicy().spec_problems(_spec(policy="cache_aware", image="evil.example/miner:1"))
    assert problem.startswith("spec.routing.image: 'evil.example/miner:1' is not allowed")
    assert "--allowed-images" in problem


def test_a_router_image_the_admin_allowed_runs() -> None:
    admin = AdminPolicy(allowed_images=("docker.io/lmsysorg/sglang", "registry.acme.example/routers/"))
    assert admin.spec_problems(_spec(image="registry.acme.example/routers/sglang-router:0.3.2")) == []


def test_the_routers_default_images_are_in_the_default_policy() -> None:
    assert AdminPolicy().spec_problems(_spec(policy="cache_aware")) == []
    assert AdminPolicy().spec_problems(_spec(policy="auto", router="vllm-router")) == []


def test_a_tenants_router_image_is_held_whatever_the_policy_or_replicas() -> None:
    evil = "evil.example/miner:1"
    for spec in (
        _spec(policy="kube-proxy", image=evil),  # a listed space policy may still run it
        parse_spec({"engine": "sglang", "model": MODEL, "replicas": 1, "routing": {"image": evil}}),
    ):
        (problem,) = AdminPolicy().spec_problems(spec)
        assert problem.startswith("spec.routing.image: 'evil.example/miner:1' is not allowed")


def test_a_narrowed_policy_never_refuses_the_routers_default_image() -> None:
    admin = AdminPolicy(allowed_images=("docker.io/lmsysorg/sglang",))
    assert admin.spec_problems(_spec(policy="auto")) == []
    assert admin.spec_problems(_spec(policy="cache_aware")) == []

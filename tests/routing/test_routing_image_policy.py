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


def test_a_narrowed_policy_holds_the_default_router_image_only_where_a_router_may_run() -> None:
    admin = AdminPolicy(allowed_images=("docker.io/lmsysorg/sglang",))
    (problem,) = admin.spec_problems(_spec(policy="auto"))
    assert problem.startswith("spec.routing.image: 'ghcr.io/prefixtune/sglang-router:0.3.2' is not allowed")
    assert problem.endswith("or set spec.routing.policy: kube-proxy")
    assert admin.spec_problems(_spec(policy="kube-proxy")) == []
    one = parse_spec({"engine": "sglang", "model": MODEL, "replicas": 1})
    assert admin.spec_problems(one) == []

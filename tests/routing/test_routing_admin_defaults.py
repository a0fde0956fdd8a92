"""The admin's routing defaults (``prefixtune run --router-image``, ``--no-auto-routing``; the chart's
``routing.images`` and ``routing.auto``): where a router's image comes from when the tenant leaves it
out, and whether ``auto`` may add a router at all (an upgrade into a cluster with no router image)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import yaml

from prefixtune.api.validation import parse_spec
from prefixtune.controller import dryrun_cli
from prefixtune.controller.admin import AdminPolicy, parse_router_images
from prefixtune.controller.operator import options_from_args
from prefixtune.routing.policy import AUTO_POLICY, DEFAULT_ROUTER_IMAGE, Router

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MIRROR = "registry.acme.example/ml/sglang-router:0.3.2"
ADMIN = AdminPolicy(router_images=((Router.SGLANG, MIRROR),))


def _spec(replicas: int = 2, **routing: Any) -> Any:
    return parse_spec({"engine": "sglang", "model": MODEL, "replicas": replicas, "routing": routing})


def _rendered(argv: list[str], **routing: Any) -> list[dict[str, Any]]:
    doc = {
        "apiVersion": "prefixtune.io/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "chat", "namespace": "team"},
        "spec": {"engine": "sglang", "model": MODEL, "replicas": 2, "routing": routing},
    }
    out, err = io.StringIO(), io.StringIO()
    rc = dryrun_cli.run(["-f", "-", *argv], io.StringIO(json.dumps(doc)), out, err)
    assert rc == 0, err.getvalue()
    return [d for d in yaml.safe_load_all(out.getvalue()) if d]


def _router_images(docs: list[dict[str, Any]]) -> list[str]:
    return [
        c["image"]
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-router")
        for c in d["spec"]["template"]["spec"]["containers"]
    ]


def test_a_router_left_without_an_image_runs_the_admins_image() -> None:
    admitted = ADMIN.admitted(_spec(policy="cache_aware"))
    assert admitted.routing.image == MIRROR


def test_a_tenants_own_router_image_is_kept_over_the_admins_default() -> None:
    mine = "registry.acme.example/ml/my-router:1"
    assert ADMIN.admitted(_spec(image=mine)).routing.image == mine


def test_the_admins_router_image_is_for_its_router_only() -> None:
    spec = _spec(router="vllm-router")
    assert ADMIN.admitted(spec).routing.image == DEFAULT_ROUTER_IMAGE[Router.VLLM]


def test_admitting_leaves_the_spec_it_was_given_as_it_was() -> None:
    spec = _spec()
    ADMIN.admitted(spec)
    assert spec.routing.image == DEFAULT_ROUTER_IMAGE[Router.SGLANG]


def test_the_admins_router_image_always_runs_even_outside_the_allowed_images() -> None:
    admin = AdminPolicy(allowed_images=("docker.io/lmsysorg/sglang",), router_images=ADMIN.router_images)
    assert admin.spec_problems(_spec(image=MIRROR)) == []
    assert admin.spec_problems(_spec(image="registry.acme.example/ml/other:1")) != []


def test_without_auto_routing_auto_means_kube_proxy_and_a_named_policy_still_gets_a_router() -> None:
    admin = AdminPolicy(auto_routing=False)
    assert admin.admitted(_spec(policy=AUTO_POLICY)).routing.policy == "kube-proxy"
    assert admin.admitted(_spec(policy="cache_aware")).routing.policy == "cache_aware"


def test_render_with_the_admins_flags_renders_what_the_operator_would() -> None:
    assert _router_images(_rendered([])) == [DEFAULT_ROUTER_IMAGE[Router.SGLANG]]
    assert _router_images(_rendered([f"--router-image=sglang-router={MIRROR}"])) == [MIRROR]
    assert _router_images(_rendered(["--no-auto-routing"])) == []
    assert _router_images(_rendered(["--no-auto-routing"], policy="round_robin")) == [
        DEFAULT_ROUTER_IMAGE[Router.SGLANG]
    ]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["nginx=registry.acme.example/x:1"], "the router must be one of sglang-router, vllm-router"),
        (["sglang-router"], "expected ROUTER=IMAGE"),
        (["sglang-router="], "expected ROUTER=IMAGE"),
        (["sglang-router=http://registry.acme.example/x:1"], "sglang-router=http://"),
        (["sglang-router=a.example/x:1", "sglang-router=b.example/x:1"], "sglang-router is given twice"),
    ],
)
def test_a_bad_router_image_flag_is_refused_naming_it(values: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_router_images(values)


def test_the_operator_refuses_to_start_on_a_bad_router_image_flag() -> None:
    with pytest.raises(SystemExit, match="prefixtune run: --router-image 'nginx=x'"):
        options_from_args(["--router-image", "nginx=x"])


def test_the_operators_flags_set_the_admins_routing_defaults() -> None:
    opts = options_from_args([f"--router-image=sglang-router={MIRROR}", "--no-auto-routing"])
    assert opts.admin.router_image(Router.SGLANG) == MIRROR
    assert opts.admin.router_image(Router.VLLM) == DEFAULT_ROUTER_IMAGE[Router.VLLM]
    assert opts.admin.auto_routing is False

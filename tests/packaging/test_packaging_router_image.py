"""The router images (Dockerfile.router): hadolint clean, on the operator image's pinned base, non-root,
the routers' versions and the images' tags from routing/policy.py. No Docker engine here: not built."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.packaging.test_packaging_image import _hadolint

from prefixtune.routing.policy import (
    DEFAULT_ROUTER_IMAGE,
    ROUTER_METRICS_PORT,
    ROUTER_PORT,
    ROUTER_VERSION,
    Router,
    RoutingPolicy,
)
from prefixtune.routing.render import RouterOwner, render_deployment
from prefixtune.routing.settings import RoutingSettings

DOCKERFILE = ROOT / "Dockerfile.router"


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _args(path: Path) -> dict[str, str]:
    return dict(
        rest.partition("=")[::2] for word, rest in _instructions(path) if word == "ARG" and "=" in rest
    )


def test_the_router_dockerfile_passes_hadolint_without_any_finding() -> None:
    proc = subprocess.run(
        [_hadolint(), "--format", "json", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(proc.stdout or "[]") == [] and proc.returncode == 0, proc.stdout + proc.stderr


def test_the_router_versions_pinned_are_the_ones_the_operator_renders() -> None:
    args = _args(DOCKERFILE)
    assert {r: args[f"{r.name}_ROUTER_VERSION"] for r in Router} == ROUTER_VERSION
    for router in Router:  # each version ARG is the one the install picks for that router
        assert f'{router.value}) version="${{{router.name}_ROUTER_VERSION}}"' in DOCKERFILE.read_text()


def test_the_router_image_is_on_the_operator_images_pinned_base() -> None:
    assert _args(DOCKERFILE)["PYTHON_IMAGE"] == _args(ROOT / "Dockerfile")["PYTHON_IMAGE"]
    bases = [rest.split()[0] for word, rest in _instructions(DOCKERFILE) if word == "FROM"]
    assert bases == ["${PYTHON_IMAGE}"] * 2


def test_the_router_image_runs_as_the_user_and_ports_the_deployment_renders() -> None:
    ins = _instructions(DOCKERFILE)
    runtime = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM") :]
    settings = RoutingSettings(RoutingPolicy.CACHE_AWARE, Router.SGLANG, DEFAULT_ROUTER_IMAGE[Router.SGLANG])
    dep = render_deployment(RouterOwner("ns", "chat", {}), settings, {"a": "b"}, 8000, 2)
    uid = dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsUser"]
    assert [rest for word, rest in runtime if word == "USER"] == [f"{uid}:{uid}"]
    assert [rest for word, rest in runtime if word == "EXPOSE"] == [f"{ROUTER_PORT} {ROUTER_METRICS_PORT}"]
    assert not [word for word, _ in runtime if word in ("ENTRYPOINT", "CMD")]  # the Deployment's command


def test_make_router_images_tags_each_router_as_the_operator_renders_it() -> None:
    makefile = (ROOT / "Makefile").read_text()
    (line,) = [ln for ln in makefile.splitlines() if ln.startswith("ROUTER_IMAGES = $(shell $(BIN)/python ")]
    command = shlex.split(line.removeprefix("ROUTER_IMAGES = $(shell $(BIN)/python ").removesuffix(")"))
    out = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == [f"{r.value}={image}" for r, image in DEFAULT_ROUTER_IMAGE.items()]
    assert "docker build -f Dockerfile.router --build-arg ROUTER=$${pair%%=*} -t $${pair#*=} ." in makefile

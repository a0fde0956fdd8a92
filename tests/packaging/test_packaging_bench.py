"""``bench`` is a normal package: the tests import it, ``prefixtune bench`` runs its modules."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import bench
from prefixtune.benchcli import bench_dir, load_bench, main

ROOT = Path(__file__).resolve().parents[2]


def test_bench_is_the_checkouts_package_and_load_bench_is_a_plain_import() -> None:
    assert Path(bench.__file__).resolve() == ROOT / "bench" / "__init__.py" == bench_dir() / "__init__.py"
    tuner = importlib.import_module("bench.tuner")
    assert load_bench("tuner") is tuner and tuner.__name__ == "bench.tuner"


def test_bench_help_lists_the_benchmarks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    listed = capsys.readouterr().out.split("benchmarks: ")[1].strip().split(", ")
    # private modules (_*) are not listed
    assert listed == ["client", "day", "goodput", "reliability", "routing", "scale", "state", "tuner", "twin"]
    assert main(["nope"]) == 2
    assert "unknown benchmark 'nope'" in capsys.readouterr().err


def test_prefixtune_bench_runs_from_outside_the_checkout(tmp_path: Path) -> None:
    """The console script, from a directory where ``bench`` is not importable by itself."""
    script = Path(sys.executable).with_name("prefixtune")
    done = subprocess.run(
        [str(script), "bench", "reliability", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: prefixtune bench reliability" in done.stdout


def test_mypy_strict_covers_bench() -> None:
    import tomllib

    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["strict"] is True and {"prefixtune", "bench"} <= set(mypy["packages"])

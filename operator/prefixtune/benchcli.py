"""``prefixtune bench NAME ...``: run the benchmark ``bench/NAME.py`` from the source tree.

Benchmarks live in the ``bench`` package beside ``operator/`` (a source checkout's top level; they
are not installed); each module defines ``main(argv: list[str]) -> int`` and prints what it
measured as JSON, with its setup. ``bench`` is imported like any package: the checkout's top level
goes on ``sys.path`` (the tests and mypy see it from there too).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType


def bench_dir() -> Path:
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "bench"
        if (candidate / "__init__.py").is_file() and (parent / "pyproject.toml").exists():
            return candidate
    raise FileNotFoundError("bench/ not found: benchmarks run from a source checkout of prefixtune")


def available() -> list[str]:
    return sorted(p.stem for p in bench_dir().glob("*.py") if not p.stem.startswith("_"))


def load_bench(name: str) -> ModuleType:
    """The module ``bench.NAME``, imported from the source checkout this prefixtune runs from."""
    root = str(bench_dir().parent)
    if root not in sys.path:
        sys.path.append(root)  # after everything else: the checkout's top level shadows nothing
    return importlib.import_module(f"bench.{name}")


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    try:
        names = available()
    except FileNotFoundError as exc:
        print(f"prefixtune bench: {exc}", file=sys.stderr)
        return 2
    if not args or args[0] in {"-h", "--help"}:
        print("usage: prefixtune bench <name> [options]\n\nbenchmarks: " + ", ".join(names))
        return 0
    name = args[0]
    if name not in names:
        print(f"prefixtune bench: unknown benchmark {name!r}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    return int(load_bench(name).main(args[1:]) or 0)

"""``prefixtune bench NAME ...``: run ``bench/NAME.py`` from the source tree.

Benchmarks live in ``bench/`` beside the package (they are not installed); each module defines
``main(argv: list[str]) -> int`` and prints what it measured as JSON, with its setup.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType


def bench_dir() -> Path:
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "bench"
        if candidate.is_dir() and (parent / "pyproject.toml").exists():
            return candidate
    raise FileNotFoundError("bench/ not found: benchmarks run from a source checkout of prefixtune")


def available() -> list[str]:
    return sorted(p.stem for p in bench_dir().glob("*.py") if not p.stem.startswith("_"))


def load_bench(name: str) -> ModuleType:
    """The module ``bench/NAME.py`` (bench/ is not a package), loaded once per process."""
    module_name = f"prefixtune_bench_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = bench_dir() / f"{name}.py"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing")
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


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

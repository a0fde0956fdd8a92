"""The operator's production path does not depend on the local sandbox.

The controller, the API, the engine adapters, the tuning policy and the metrics run in users'
clusters; ``prefixtune.sandbox`` is a development tool. What both sides share (the clock file the
sandbox publishes for ``prefixtune run --clock-file``) lives in a module of its own
(``prefixtune.clockfile``), so that a change to the sandbox cannot break the operator.
"""

from __future__ import annotations

import ast
from pathlib import Path

import prefixtune

PACKAGE = Path(prefixtune.__file__).parent
PRODUCTION = ("controller", "api", "engines", "tuning", "metrics")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_production_module_imports_the_sandbox() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            m for m in imported_modules(path) if m.startswith("prefixtune.sandbox")
        )
        for part in PRODUCTION
        for path in sorted((PACKAGE / part).rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_check_sees_a_sandbox_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from prefixtune.sandbox.clock import SandboxClock\nimport prefixtune.sandbox.up\n")
    assert {"prefixtune.sandbox.clock", "prefixtune.sandbox.up"} <= imported_modules(module)

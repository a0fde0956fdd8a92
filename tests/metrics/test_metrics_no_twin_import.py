"""The dependency between metrics and the twin points inward: the twin provides its summary's figures
(``Summary.signals``), ``prefixtune.metrics`` only says what it reads (``RunFigures``) and never imports
``prefixtune.twin``."""

from __future__ import annotations

import subprocess
import sys

from prefixtune.metrics.twin_signals import signals_from_summary
from prefixtune.twin.run import SimOptions, simulate
from prefixtune.twin.workloads import generate

_CHECK = """
import importlib, pkgutil, sys
import prefixtune.metrics as pkg
for info in pkgutil.walk_packages(pkg.__path__, "prefixtune.metrics."):
    importlib.import_module(info.name)
twin = sorted(m for m in sys.modules if m.startswith("prefixtune.twin"))
print(",".join(twin))
"""


def test_no_metrics_module_imports_the_twin() -> None:
    out = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_twin_summary_provides_its_signals() -> None:
    reqs = generate("chatbot", rate=2.0, duration_s=20.0, seed=1)
    summary = simulate(
        "vllm", [], "H100-80GB", reqs, SimOptions(model="meta-llama/Llama-3.1-8B-Instruct", seed=1)
    )
    assert summary.signals(15.0, waiting_mean=0.5) == signals_from_summary(summary, 15.0, waiting_mean=0.5)
    assert summary.signals().window_s == summary.sim_seconds and summary.signals().requests > 0

"""The README's "The local sandbox" steps, run as the README has them, with the real kubectl.

The fenced bash block of that section is read from README.md (not copied here) and run by bash from
the repository root, changed only where a test must: a free port for 8443, a temporary directory for
``/tmp/``, a kubectl discovery cache of its own (``KUBECACHEDIR``), and the test's kubectl first on
PATH ($KUBECTL, else the one on PATH, else in CI ``scripts/get-kubectl.sh``'s; 1.27 or later, as the
README says: older ones cannot validate through the OpenAPI v3 the sandbox serves). The block starts
the sandbox in the background and ends in ``prefixtune run`` in the foreground; the test waits, on
the sandbox's clock and for as long as its tuning makes progress, until ``rag-llama-8b`` has
converged, re-applies its file, checks ``kubectl get sdep``'s printer columns, and stops the whole
process group it started (bash, the sandbox, the operator).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.conftest import ROOT, require_component
from tests.sandbox.test_sandbox_clients import _kubectl, _reads_openapi_v3

from prefixtune.api.crd import PRINTER_COLUMNS
from prefixtune.clockfile import FileClock
from prefixtune.controller.status import policy_state_of
from prefixtune.sandbox.clock import HANG_GUARD_S
from prefixtune.sandbox.waiting import tuning_progress, wait_until

pytestmark = pytest.mark.timeout(HANG_GUARD_S)  # the waits follow the sandbox: this only catches a hang

SECTION = "### The local sandbox"
PORT, TMP = "8443", "/tmp/"  # what the README's block uses, replaced by the test's own
WATCHED = "rag-llama-8b"  # the resource the README says the test waits for
STALL_S = 300.0  # sandbox seconds without progress of its tuning before the wait fails (4x in all)


def readme_block(readme: str, section: str = SECTION) -> str:
    """The first fenced bash block of ``section`` (before the next heading)."""
    text = "\n" + readme
    start = text.index(f"\n{section}\n") + len(section) + 2
    found = re.compile(r"^```bash\n(.*?)^```", re.S | re.M).search(text, start)
    if found is None or re.search(r"^#{1,3} ", text[start : found.start()], re.M):
        raise ValueError(f"no fenced bash block under {section!r}")
    return found.group(1)


def test_the_readme_block_is_found_and_kubectl_tables_are_read() -> None:
    block = readme_block((ROOT / "README.md").read_text())
    assert block.count(PORT) == 1 and "/tmp/sandbox.kubeconfig" in block and "/tmp/sandbox.clock" in block
    assert "prefixtune sandbox up" in block and "--demo-timings" in block
    assert "--validate=false" not in block  # kubectl apply validates through the sandbox's OpenAPI
    header, rows = _table("NAME   ENGINE   PHASE\nrag    vllm              \nchat   sglang   Tuning\n")
    assert header == ["NAME", "ENGINE", "PHASE"] and rows[0]["PHASE"] == "" and rows[1]["PHASE"] == "Tuning"
    with pytest.raises(ValueError, match="no fenced bash block"):
        readme_block("### The local sandbox\n\ntext only\n### Next\n```bash\nx\n```\n")


def _example_names() -> set[str]:
    docs = [yaml.safe_load(f.read_text()) for f in sorted((ROOT / "examples").glob("*.yaml"))]
    return {d["metadata"]["name"] for d in docs if d.get("kind") == "ServingDeployment"}


def _table(text: str) -> tuple[list[str], list[dict[str, str]]]:
    """kubectl's table: the header's names and each row's cells by name (cells may be blank, so a
    row is cut where the header's columns start)."""
    first, *lines = text.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", first)]
    names = first.split()
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    return names, [{n: line[a:b].strip() for n, (a, b) in zip(names, bounds, strict=True)} for line in lines]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _group(script: str, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """bash running ``script`` in a session of its own; everything in it stopped on the way out."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-e", "-c", script], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # the group of the session this test started
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        deadline = time.monotonic() + 60  # the sandbox stops its twins and Prometheus on SIGTERM
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


async def test_the_readme_sandbox_steps_tune_a_resource_to_convergence(tmp_path: Path) -> None:
    kubectl = _kubectl()
    require_component(kubectl is not None, "kubectl (scripts/get-kubectl.sh fetches one)")
    assert kubectl is not None
    # The README's steps need kubectl 1.27 or later, as it says (apply validates through OpenAPI v3).
    require_component(_reads_openapi_v3(kubectl), f"kubectl 1.27 or later ({kubectl} is older)")
    version = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True).stdout
    print(f"kubectl: {kubectl}: {version.splitlines()[0] if version else '?'}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(kubectl)
    work = tmp_path / "work"
    work.mkdir()
    block = readme_block((ROOT / "README.md").read_text())
    script = block.replace(PORT, str(_free_port())).replace(TMP, f"{work}/")
    path = f"{bin_dir}:{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, "KUBECACHEDIR": str(tmp_path / "kc")}
    kubeconfig, clock_file, log = work / "sandbox.kubeconfig", work / "sandbox.clock", tmp_path / "steps.log"

    async def run(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            kubectl, "--kubeconfig", str(kubeconfig), *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        out, err = await proc.communicate()
        assert proc.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}"
        return out.decode()

    with _group(script, env, log) as steps:

        def alive() -> None:
            code = steps.poll()
            assert code is None, f"the README's steps exited with {code}:\n{log.read_text()}"

        async def clock_up() -> bool:
            alive()
            return clock_file.is_file() and clock_file.stat().st_size > 0 and kubeconfig.is_file()

        await wait_until(clock_up, 300, "the sandbox's clock file", every_s=1.0)
        clock = FileClock(clock_file)

        async def operator_started() -> bool:
            alive()
            return "prefixtune operator: watching" in log.read_text()

        await wait_until(operator_started, 300, "the README's prefixtune run", every_s=1.0, clock=clock)
        watched: dict[str, Any] = {}

        async def status() -> dict[str, Any]:
            alive()
            text = await run("get", "sdep", WATCHED, "-n", "default", "-o", "json")
            watched.update(json.loads(text))
            return dict(watched.get("status") or {})

        async def converged() -> bool:
            return (await status()).get("phase") == "Converged"

        async def progress() -> object:
            return tuning_progress(policy_state_of(watched.get("status")))

        await wait_until(
            converged, STALL_S, f"{WATCHED} to converge", every_s=5.0, clock=clock, progress=progress
        )
        # kubectl apply of the file again: no --validate=false, and the admitted timings stay.
        await run("apply", "-f", "examples/vllm-rag.yaml")
        again = json.loads(await run("get", "sdep", WATCHED, "-n", "default", "-o", "json"))
        assert again["spec"]["tuning"]["trial"]["measure"] == "8s"
        assert again["metadata"]["annotations"]["prefixtune.io/sandbox-profile"] == "demo-timings"
        # kubectl get shows the CRD's printer columns (the API server answers its Table requests).
        table = await run("get", "sdep", "-A")
        header, rows = _table(table)
        shown = [str(c["name"]).upper() for c in PRINTER_COLUMNS if not c.get("priority")]
        assert header == ["NAMESPACE", "NAME", *shown]
        cells = {row["NAME"]: row for row in rows}
        assert set(cells) == _example_names()  # every example applied, none left out
        assert cells[WATCHED]["PHASE"] == "Converged" and cells[WATCHED]["ENGINE"] == "vllm"
        assert cells[WATCHED]["BESTSCORE"] not in ("", "<none>")  # its best config's score
        wide = (await run("get", "sdep", WATCHED, "-n", "default", "-o", "wide")).splitlines()[0].split()
        assert [str(c["name"]).upper() for c in PRINTER_COLUMNS if c.get("priority")] == [
            w for w in wide if w in ("MODEL", "MODE")
        ]
        print(f"{WATCHED} converged at sandbox pace; {table}")

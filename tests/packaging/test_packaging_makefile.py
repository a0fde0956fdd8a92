"""``make test`` / ``make demo`` and the machine (issue #17, item 10): scripts/sysdeps.sh installs
Debian's prometheus without starting its service (a policy-rc.d answering 101 while apt-get runs),
leaves the unit it enabled disabled, kills nobody's processes, and puts a policy-rc.d that was already
there back unchanged. Run with stand-ins for apt-get, dpkg-query and deb-systemd-helper on PATH that
record what they were asked (nothing is installed)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "sysdeps.sh"

APT_GET = """#!/bin/sh
echo "apt-get $*" >> "$LOG"
if [ "$1" = install ]; then
  if [ -x "$POLICY_RC_D" ]; then "$POLICY_RC_D" prometheus start; echo "policy-rc.d answers $?" >> "$LOG"; fi
  exit "${APT_EXIT:-0}"
fi
"""
DPKG_QUERY = "#!/bin/sh\nexit 1\n"  # the package is not installed
HELPER = '#!/bin/sh\necho "deb-systemd-helper $*" >> "$LOG"\n'


def _run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    for name, text in (("apt-get", APT_GET), ("dpkg-query", DPKG_QUERY), ("deb-systemd-helper", HELPER)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    log = tmp_path / "log"
    full = {
        "PATH": f"{fake}:/usr/bin:/bin",
        "LOG": str(log),
        "POLICY_RC_D": str(tmp_path / "policy-rc.d"),
        "PROMETHEUS": "prometheus-not-on-this-path",
        "SYSDEPS_UID": "0",
        **env,
    }
    proc = subprocess.run(["bash", str(SCRIPT)], env=full, capture_output=True, text=True, timeout=60)
    return proc, log.read_text().splitlines() if log.exists() else []


def test_install_starts_no_service_and_leaves_none_enabled(tmp_path: Path) -> None:
    proc, log = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    installs = [line for line in log if line.startswith("apt-get") and " install " in line]
    assert installs and "--no-install-recommends prometheus" in installs[0]
    assert "policy-rc.d answers 101" in log  # the maintainer scripts may not start the service
    assert "deb-systemd-helper disable prometheus.service" in log
    assert not (tmp_path / "policy-rc.d").exists()  # ours is gone


def test_an_existing_policy_rc_d_is_put_back_and_a_failed_install_cleans_up(tmp_path: Path) -> None:
    policy = tmp_path / "policy-rc.d"
    policy.write_text("#!/bin/sh\n# the admin's own\nexit 0\n")
    policy.chmod(0o700)
    proc, log = _run(tmp_path, APT_EXIT="100")
    assert proc.returncode != 0
    assert "policy-rc.d answers 101" in log
    assert policy.read_text() == "#!/bin/sh\n# the admin's own\nexit 0\n"
    assert oct(policy.stat().st_mode & 0o777) == "0o700"
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    proc, _ = _run(fresh, APT_EXIT="100")
    assert proc.returncode != 0 and not (fresh / "policy-rc.d").exists()


def test_nothing_happens_when_prometheus_is_there_or_we_are_not_root(tmp_path: Path) -> None:
    proc, log = _run(tmp_path, PROMETHEUS="sh")
    assert proc.returncode == 0 and log == []
    proc, log = _run(tmp_path, SYSDEPS_UID="1000")
    assert proc.returncode == 0 and log == [] and "cannot be installed here" in proc.stdout


def test_the_makefile_kills_nothing_and_the_readme_says_what_make_installs() -> None:
    for path in (ROOT / "Makefile", SCRIPT):
        text = path.read_text()
        assert not re.search(r"\b(pkill|killall|kill)\b", text), path
        assert "systemctl start" not in text and "service prometheus" not in text
    assert "bash scripts/sysdeps.sh" in (ROOT / "Makefile").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "scripts/sysdeps.sh" in readme and "policy-rc.d" in readme


def test_make_sysdeps_dry_run_calls_the_script() -> None:
    proc = subprocess.run(["make", "-n", "sysdeps"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "bash scripts/sysdeps.sh" in proc.stdout

#!/usr/bin/env bash
# The system package the integration tests use: a real Prometheus (Debian's `prometheus`), installed
# once by `make test` / `make demo` when the binary is missing and we are root on a Debian machine.
#
# The tests start their own Prometheus processes (sandbox/prometheus.py: their own port, config and
# data directory), so the Debian *service* is not wanted. Installed here without changing anything
# else on the machine:
#   - a policy-rc.d answering 101 ("action forbidden") while apt-get runs, so the package's maintainer
#     scripts never start the service (Debian's invoke-rc.d / deb-systemd-invoke honour it); a
#     policy-rc.d that was already there is put back unchanged, ours is removed even if apt-get fails;
#   - afterwards the unit the package enabled is disabled again (it was not installed before, so
#     disabling it takes nothing from anyone); nothing is stopped or killed (nothing was started).
# Nothing is done when `prometheus` is already on PATH or the package is already installed.
set -euo pipefail

PROMETHEUS=${PROMETHEUS:-prometheus}  # the binary looked for (tests point this elsewhere)
PACKAGE=${PACKAGE:-prometheus}
POLICY_RC_D=${POLICY_RC_D:-/usr/sbin/policy-rc.d}
UID_NOW=${SYSDEPS_UID:-$(id -u)}

if command -v "$PROMETHEUS" >/dev/null 2>&1; then
  exit 0
fi
if [ "$UID_NOW" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "prometheus is not installed and cannot be installed here (need root + apt-get);" \
       "the Prometheus tests are skipped (apt-get install --no-install-recommends prometheus)"
  exit 0
fi
if [ "$(dpkg-query -W -f='${Status}' "$PACKAGE" 2>/dev/null || true)" = "install ok installed" ]; then
  echo "the $PACKAGE package is installed but $PROMETHEUS is not on PATH; leaving it as it is"
  exit 0
fi

saved=""
if [ -e "$POLICY_RC_D" ]; then
  saved=$(mktemp)
  cp -p "$POLICY_RC_D" "$saved"
fi
restore() {
  if [ -n "$saved" ]; then
    cp -p "$saved" "$POLICY_RC_D" && rm -f "$saved"
  else
    rm -f "$POLICY_RC_D"
  fi
}
trap restore EXIT
printf '#!/bin/sh\n# prefixtune scripts/sysdeps.sh: no service starts while it installs packages\nexit 101\n' \
  > "$POLICY_RC_D"
chmod 755 "$POLICY_RC_D"

echo "installing $PACKAGE (Debian package; its service is not started and is left disabled)"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$PACKAGE" >/dev/null

# The package enabled its unit (deb-systemd-helper) and its init script links: disable both.
if command -v deb-systemd-helper >/dev/null 2>&1; then
  deb-systemd-helper disable "$PACKAGE.service" >/dev/null 2>&1 || true
fi
if command -v update-rc.d >/dev/null 2>&1 && [ -e "/etc/init.d/$PACKAGE" ]; then
  update-rc.d "$PACKAGE" disable >/dev/null 2>&1 || true
fi

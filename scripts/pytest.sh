#!/usr/bin/env bash
# Runs the test suite. pytest exits 5 when it collected no test: that is a failure here, never green.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"

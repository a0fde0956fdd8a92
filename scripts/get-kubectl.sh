#!/usr/bin/env bash
# Prints the path of a kubectl for the sandbox tests, fetching Debian's if none is on PATH.
#
#   KUBECTL=$(scripts/get-kubectl.sh) && "$KUBECTL" version --client
#   scripts/get-kubectl.sh --fetch    # ignore a kubectl on PATH: always use (and fetch) Debian's
#
# `apt-get install kubernetes-client` is not used: on some images it conflicts with a preinstalled
# kubectl package (google-cloud-cli's /usr/bin/kubectl). Instead the .deb is downloaded (no root
# needed) and unpacked into a cache directory: $KUBECTL_CACHE, default ~/.cache/prefixtune/kubectl.
# Exit status 1 (and a message on stderr) when no kubectl can be found or fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${KUBECTL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prefixtune/kubectl}"
unpacked="$cache/root/usr/bin/kubectl"

if [ -x "$unpacked" ]; then
  echo "$unpacked"
  exit 0
fi
if [ "${1:-}" != "--fetch" ] && command -v kubectl >/dev/null 2>&1 && kubectl version --client >/dev/null 2>&1; then
  command -v kubectl
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1; then
  echo "get-kubectl: no kubectl on PATH and no apt-get/dpkg to fetch Debian's kubernetes-client" >&2
  exit 1
fi
mkdir -p "$cache"
(
  # One fetch at a time: the test suite runs in parallel workers, each of which may call this.
  flock 9
  if [ -x "$unpacked" ]; then exit 0; fi
  cd "$cache"
  rm -f kubernetes-client_*.deb
  if ! apt-get download kubernetes-client >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then apt-get update -qq >/dev/null 2>&1 || true; fi
    apt-get download kubernetes-client >/dev/null
  fi
  dpkg -x kubernetes-client_*.deb root
) 9>"$cache/.lock"
if [ ! -x "$unpacked" ]; then
  echo "get-kubectl: kubernetes-client unpacked but $unpacked is missing" >&2
  exit 1
fi
echo "$unpacked"

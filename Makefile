# UAII developer commands. `make help` lists them.
SHELL := /bin/bash
export UV_PYTHON_DOWNLOADS := never
export UV_PYTHON_PREFERENCE := only-system
# uv: UV=... when given (`uv run` sets it for its children), else the one on PATH, else one that make installs itself
# with `pip install --target .venv-tools` — no root, no `python3 -m venv` (Debian ships it apart), and the system
# Python untouched, as PEP 668 asks. UV_DEP is that installed binary when it is the one used: a prerequisite of every
# target that runs uv.
UV_VERSION := 0.13.9
UV_TOOLS := .venv-tools
PYTHON3 ?= python3
ifeq ($(origin UV),undefined)
UV := $(or $(shell command -v uv 2>/dev/null),$(CURDIR)/$(UV_TOOLS)/bin/uv)
endif
UV_DEP := $(filter $(CURDIR)/$(UV_TOOLS)/bin/uv,$(UV))
PY := $(UV) run --no-sync python
# `make demo` runs in its own environment holding what a user installs, so it never undoes `make setup`'s .venv.
DEMO_VENV ?= .venv-demo
DEMO_UV := UV_PROJECT_ENVIRONMENT=$(DEMO_VENV) $(UV)
PACKAGES := ir runtime kernels backends loaders tokenizers planner storage capi
PYTEST_FLAGS ?= -q

# test-<pkg> and isolation-<pkg> are pattern rules, so they are not listed: make never looks for an implicit rule
# for a .PHONY target (`make test-ir` did nothing while they were). No file of those names exists.
.PHONY: help uv setup demo-env demo capi test lint typecheck pytest pytest-rest isolation gen gen-check wheels bench bench-kernels \
        bench-generate bench-storage bench-kv bench-accuracy bench-gpu check-cuda check-cuda-model bench-serve bench-scale bench-ray clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_%-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

uv: $(UV_DEP) ## the uv that make uses (installs uv with pip into .venv-tools when none is on PATH)
	@echo "$(UV): $$($(UV) --version)"

$(CURDIR)/$(UV_TOOLS)/bin/uv:
	@echo "[make] no uv on PATH: installing uv $(UV_VERSION) into $(UV_TOOLS)/ with $(PYTHON3) -m pip"
	PIP_ROOT_USER_ACTION=ignore $(PYTHON3) -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
	  --target $(UV_TOOLS) uv==$(UV_VERSION)

setup: $(UV_DEP) ## create .venv with every workspace package (editable), the dev tools and the test references (torch, transformers)
	$(UV) sync --all-packages --group reference

demo-env: $(UV_DEP) ## create .venv-demo with what a user installs: uaii-runtime and uaii-loaders[gguf], no dev tools, no test references
	$(DEMO_UV) sync --package uaii-runtime --package uaii-loaders --extra gguf --no-default-groups

DEMO_PROMPT ?= What is the capital of France, and what is it famous for?

demo: demo-env ## SmolLM2-135M answers a question on the CPU, streaming, then its tokens/s (fetches the model once)
	@model=$$($(DEMO_UV) run --no-sync python scripts/models.py smollm2 --quiet) && \
	  $(DEMO_UV) run --no-sync uaii run "$$model" --chat -p "$(DEMO_PROMPT)" -n 128

capi: setup ## build libuaii and the C examples/tests (native/build/; run them with `make test-capi`)
	$(MAKE) -C native PYTHON='$(PY)'

test: setup lint gen-check isolation pytest-rest check-cuda-model ## everything CI checks: lint, types, generated code, each package's tests in a venv of that package alone, then the slow and cross-package tests

lint: setup ## ruff + mypy over every package, and the import graph against pyproject (scripts/check_deps.py)
	$(UV) run --no-sync ruff check packages tests bench scripts
	$(UV) run --no-sync mypy
	$(PY) scripts/check_deps.py

pytest: setup ## pytest over all packages in .venv, slow tests included (fails when no test ran)
	$(PY) -m pytest $(PYTEST_FLAGS) tests

# What `make isolation` does not run: the slow tests of every package and the cross-package tests of
# tests/integration, in .venv. With isolation that is every test once (`make pytest` runs them all in .venv).
pytest-rest: setup ## the slow tests and tests/integration in .venv (the rest of `make test` after isolation)
	$(PY) -m pytest $(PYTEST_FLAGS) -m slow tests
	$(PY) -m pytest $(PYTEST_FLAGS) -m "not slow" tests/integration

test-%: setup ## tests of one package, e.g. make test-ir
	$(PY) -m pytest $(PYTEST_FLAGS) tests/$*

isolation: $(addprefix isolation-,$(PACKAGES)) ## every package's tests, each in a venv holding that package and its declared dependencies only

# .venv-iso-<pkg>: uaii-<pkg> + what its pyproject declares (transitively) + the root's test-<pkg> group, nothing
# else; check_isolated.py compares the installed uaii-* with that set. uv's cache makes the venvs cheap to sync.
# It is where `make test` runs every test that is not `slow`, once (each test-<pkg> group holds every reference its
# tests use, so nothing skips here that runs in .venv). The `slow` tests (real models against transformers,
# valgrind, wheel builds, the 100k-file fuzz) prove nothing more about what a package needs; they run in .venv
# (`make pytest-rest`).
ISOLATION_PYTEST_FLAGS ?= $(PYTEST_FLAGS) -m "not slow"
isolation-%: $(UV_DEP) ## tests/<pkg> in .venv-iso-<pkg> (that package and its declared dependencies), e.g. make isolation-ir
	UV_PROJECT_ENVIRONMENT=.venv-iso-$* $(UV) sync --package uaii-$* --no-default-groups --group test-$*
	UV_PROJECT_ENVIRONMENT=.venv-iso-$* $(UV) run --no-sync python scripts/check_isolated.py uaii-$*
	UV_PROJECT_ENVIRONMENT=.venv-iso-$* $(UV) run --no-sync python -m pytest $(ISOLATION_PYTEST_FLAGS) -p no:cacheprovider tests/$*

gen: setup ## regenerate generated code (FlatBuffers Python from schemas/uaii_ir.fbs, the ONNX op table)
	$(PY) scripts/gen.py
	$(PY) scripts/gen_onnx_ops.py

gen-check: setup ## fail when generated code is stale
	$(PY) scripts/gen.py --check
	$(PY) scripts/gen_onnx_ops.py --check

wheels: $(UV_DEP) ## a wheel and an sdist of every distribution into dist/, each built alone; native wheels tagged manylinux
	rm -rf dist
	UV_PROJECT_ENVIRONMENT=.venv-wheels $(UV) sync --only-group wheels
	UV_PROJECT_ENVIRONMENT=.venv-wheels $(UV) run --no-sync python scripts/dists.py --out dist $(PACKAGES)

bench-kernels: setup ## GEMV/GEMM throughput per weight type against numpy and the memory bandwidth
	$(PY) bench/bench_kernels.py

bench-generate: setup ## prefill/decode tok/s and RSS on SmolLM2 and Gemma-3 vs llama.cpp measured live (built once into .venv-llama-cpp) and transformers (GENERATE_ARGS=--quick)
	$(PY) bench/bench_generate.py $(GENERATE_ARGS)

bench-storage: setup ## budgets 100-10 %, synthetic 4 GB llama/MoE, KV window: tok/s, RSS, bytes/token, then bench-kv (STORAGE_ARGS=--quick)
	$(PY) bench/bench_storage.py $(STORAGE_ARGS)
	$(if $(findstring --only,$(STORAGE_ARGS)),,$(PY) bench/bench_kv_positions.py $(filter --quick,$(STORAGE_ARGS)))

bench-kv: setup ## KV window perplexity: absolute vs StreamingLLM cache positions, with/without sinks (KV_ARGS=--quick)
	$(PY) bench/bench_kv_positions.py $(KV_ARGS)

bench-accuracy: setup ## KL of the default GEMM from the exact one vs llama.cpp's, prefill and decode (builds llama-cpp-python once)
	$(PY) bench/bench_accuracy.py $(ACCURACY_ARGS)

bench-gpu: setup ## WebGPU on whatever adapter exists: GEMV GB/s per type vs its copy bandwidth, tok/s vs the CPU (GPU_ARGS=--quick)
	$(PY) bench/bench_gpu.py $(GPU_ARGS)

CUDA_TESTS = tests/backends/test_cuda_kernels.py tests/backends/test_cuda_reference.py tests/backends/test_cuda_conformance.py \
	tests/backends/test_cuda_packed.py tests/backends/test_cuda_ew.py tests/runtime/test_cuda_executable.py \
	tests/runtime/test_cuda_parity.py tests/runtime/test_cuda_graphs.py

bench-cuda-host: setup ## the CUDA executor's own host time per SmolLM2 decode step (device stubbed out): replayed as a CUDA graph vs each kernel launched
	$(PY) bench/bench_cuda_host.py $(CUDA_HOST_ARGS)

check-cuda: setup ## on a machine with an NVIDIA GPU: the CUDA tests, none skipped for want of a device, then the CUDA part of bench-gpu
	$(PY) -m pytest -q -rs -p no:cacheprovider $(CUDA_TESTS) 2>&1 | tee /tmp/uaii-check-cuda.log; \
	  test $${PIPESTATUS[0]} -eq 0 && ! grep -q "no CUDA device" /tmp/uaii-check-cuda.log
	$(PY) bench/bench_gpu.py --cuda-only $(GPU_ARGS)

# The same tests without a GPU: CudaDevice itself, through cuda-bindings, on a model of the CUDA driver that runs the
# work on the host model of a device (tests/cuda_driver_model.py). What the GPU run would otherwise find first — a
# call's arguments, kernel parameters packed wrong, a handle used after its end, a limit a launch breaks — fails here.
check-cuda-model: setup ## the CUDA tests on CudaDevice over a model of the CUDA driver (no GPU): none skipped for want of a device, nothing refused or leaked
	UAII_CUDA_DRIVER_MODEL=compiled $(PY) -m pytest -q -rs -p no:cacheprovider -k "not host and not compiled" \
	  $(CUDA_TESTS) 2>&1 | tee /tmp/uaii-check-cuda-model.log; \
	  test $${PIPESTATUS[0]} -eq 0 && ! grep -q "no CUDA device" /tmp/uaii-check-cuda-model.log && \
	  grep -q " 0 refused, 0 contexts released with leaks" /tmp/uaii-check-cuda-model.log

bench-serve: setup ## uaii serve on SmolLM2: aggregate decode tok/s of 4 concurrent streaming clients vs 1 (goal >= 2.5x)
	$(PY) bench/bench_serve.py $(SERVE_ARGS)

bench-scale: setup ## a 32B-shape dense model (18.4 GB) and a 480B-shape MoE slice (2 x 14 GB), written once, in an 8 GiB memory cgroup: uaii vs llama.cpp, disk-bound (root; ~15 min; SCALE_ARGS=--models moe)
	$(PY) bench/bench_scale.py $(SCALE_ARGS)

bench-ray: setup ## the synthetic 4 GB llama: 1 process streaming under 1 GiB vs 4 pipeline stages of 1.2 GiB on a local Ray cluster (tok/s, ratio, bytes crossing, the Ray hop's cost; root for the memory cgroup; ~5 min)
	$(PY) bench/bench_ray.py $(RAY_ARGS)

bench: bench-kernels bench-generate ## all benchmarks

clean: ## remove build outputs and the venvs
	rm -rf dist build .venv .venv-ir .venv-iso-* $(DEMO_VENV) .venv-wheels $(UV_TOOLS)

#!/usr/bin/env bash
# The CUDA device check of issue #18, as one command on a lent GPU machine that reaches no package registry:
#
#   device run, carry [".device-wheels"], command "bash scripts/cuda_device_check.sh", timeout_s 540
#
# It uses the machine's own python3 (its image holds numpy, cuda-bindings, the NVRTC wheel, pytest, torch and
# transformers) with the workspace's sources on PYTHONPATH, builds uaii-kernels' C extension there (cffi from
# .device-wheels when the image lacks it, and gguf for the synthetic model: `pip download --only-binary=:all:
# --python-version 3.12 -d .device-wheels cffi pycparser gguf==0.17.1 pyyaml tqdm` here, the folder
# git-ignored), then runs the CUDA tests that need no model file (kernels, references, conformance, the tiny
# architectures against transformers, graph replay on a synthetic llama) — failing if any skipped for want of a
# device — and bench_gpu's CUDA part without the GGUF models (the kernels, and a 1 GB synthetic llama written there
# streaming under a quarter of its bytes, and decoding with and without CUDA graphs). Logs and JSON go to $OUT (the device tool brings them back).
# The real-model tests and figures (SmolLM2, Gemma-3: larger than what a call may carry) need the models carried in
# parts first (scripts/device_models.py: `split` here, one `receive` call per part there); then
#
#   device run, carry [".device-wheels"], command "MODELS=1 bash scripts/cuda_device_check.sh", timeout_s 540
#
# runs the executor's tests on them (tests/runtime/test_cuda_executable.py: both models against the CPU's exact
# path, the int8 GEMM, streaming under a device budget, batched rows, the f16 window) and bench_gpu's model rows.
set -uo pipefail
OUT=${OUT:-/tmp/uaii-cuda-check}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH="$(ls -d "$PWD"/packages/*/src | paste -sd:):$PWD/tests/loaders:$PWD/tests" PYTHONUNBUFFERED=1
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  $PY -c "import cffi" 2>/dev/null || $PY -m pip install -q --no-index --find-links .device-wheels cffi pycparser
  $PY -c "import gguf" 2>/dev/null || $PY -m pip install -q --no-index --find-links .device-wheels gguf
  $PY packages/uaii-kernels/build_kernels.py
} 2>&1 | tee "$OUT/setup.log"
# the host-model variants ([host], [compiled]) and the SASS counts (nvdisasm, a development wheel the image lacks)
# run in CI: device minutes go to the device's
if [ "${MODELS:-0}" = 1 ]; then
  $PY scripts/device_models.py receive --all 2>&1 | tee -a "$OUT/setup.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1  # the tests would try to fetch a missing model, with no registry
  TESTS=(tests/runtime/test_cuda_executable.py)
  BENCH=(--no-gemv --models smollm2,gemma3)
else
  TESTS=(tests/backends/test_cuda_kernels.py tests/backends/test_cuda_reference.py
         tests/backends/test_cuda_conformance.py tests/backends/test_cuda_packed.py tests/backends/test_cuda_ew.py
         tests/runtime/test_cuda_parity.py tests/runtime/test_cuda_graphs.py::test_decode_replays_one_graph_per_step)
  BENCH=(--no-models)
fi
$PY -m pytest -q -rs -p no:cacheprovider -k "not host and not compiled and not costs" "${TESTS[@]}" 2>&1 |
  tee "$OUT/tests.log"
tests=${PIPESTATUS[0]}
skipped_for_device=$(grep -c "no CUDA device" "$OUT/tests.log" || true)
$PY bench/bench_gpu.py --cuda-only "${BENCH[@]}" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
bench=${PIPESTATUS[0]}
echo "tests exit $tests, skipped for want of a device: $skipped_for_device, bench exit $bench" | tee -a "$OUT/tests.log"
[ "$tests" -eq 0 ] && [ "$skipped_for_device" -eq 0 ] && [ "$bench" -eq 0 ]

"""The C library itself: instruction sets, the thread pool, the GIL, status codes."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

import uaii.kernels as K
from uaii.ir.dtype import DType
from uaii.kernels import native
from uaii.kernels.testing import random_weight


def test_isas_listed_scalar_first() -> None:
    isas = K.available_isas()
    assert isas[0] == "scalar"
    assert K.best_isa() in isas
    assert K.get_isa() == K.best_isa()


def test_force_isa_and_restore() -> None:
    best = K.get_isa()
    with K.use_isa("scalar"):
        assert K.get_isa() == "scalar"
    assert K.get_isa() == best
    with pytest.raises(K.KernelError, match="unknown ISA"):
        K.set_isa("sse9")
    missing = [i for i in native.ISAS if i not in K.available_isas()]
    if missing:
        with pytest.raises(K.KernelError, match="not available"):
            K.set_isa(missing[0])


def test_native_is_public_and_its_lib_is_exactly_the_header_cdef() -> None:
    """uaii.kernels.native is the public module backends bind kernels from (it was the private _native); its
    contract is the cdef of csrc/uaii_kernels.h: every function declared there is in ``lib``, and nothing else."""
    header = (Path(__file__).resolve().parents[2] / "packages" / "uaii-kernels" / "csrc" / "uaii_kernels.h").read_text()
    cdef = header[header.index("/* CDEF BEGIN */"):header.index("/* CDEF END */")]
    declared = set(re.findall(r"\b(uk_\w+)\s*\(", cdef))
    functions = {n for n in dir(native.lib) if callable(getattr(native.lib, n))}
    assert declared and functions == declared
    assert native.ffi.typeof(native.lib.uk_gemm).result.cname == "int"
    doc = native.__doc__ or ""
    assert all(word in doc for word in ("``ffi``", "``lib``", "CDEF", "Stability", "Threads", "GIL"))


def test_block_sizes_match_the_ir_table() -> None:
    for dt in K.DEQUANT_TYPES:
        assert native.lib.uk_type_block_elems(dt.gguf_id) == dt.block_size, dt
        assert native.lib.uk_type_block_bytes(dt.gguf_id) == dt.type_size, dt


def _gemm_case(seed: int = 0) -> tuple[K.PackedWeight, np.ndarray, np.ndarray]:
    w = K.PackedWeight.from_raw(random_weight(DType.Q4_0, 300, 512, seed), "q4_0", (300, 512))
    x = np.random.default_rng(seed).standard_normal((9, 512)).astype(np.float32)
    return w, x, K.matmul(x, w)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_pool_sizes_give_the_same_result(n: int) -> None:
    """1 thread, 2, and more threads than this machine has cores (the pool oversubscribes gracefully)."""
    w, x, ref = _gemm_case()
    ref1 = K.matmul(x[:1], w)                      # decode rows use the GEMV kernels (another summation order)
    with K.num_threads(n):
        assert K.get_num_threads() == n
        for _ in range(3):
            np.testing.assert_array_equal(K.matmul(x, w), ref)
            np.testing.assert_array_equal(K.matmul(x[:1], w), ref1)


def test_pool_threads_are_created_once() -> None:
    w, x, _ = _gemm_case()
    with K.num_threads(3):
        K.matmul(x, w)
        started = native.lib.uk_pool_workers_started()
        for _ in range(50):
            K.matmul(x, w)
            K.matmul(x[:1], w)
        assert native.lib.uk_pool_workers_started() == started


def test_concurrent_python_threads() -> None:
    """Calls release the GIL and serialize on the pool: concurrent callers get correct results."""
    w, x, ref = _gemm_case()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                np.testing.assert_array_equal(K.matmul(x, w), ref)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_status_codes_become_errors() -> None:
    with pytest.raises(K.KernelError, match="invalid arguments"):
        native.check(-2, "op")
    with pytest.raises(K.KernelError, match="unsupported type"):
        native.check(-1, "op")


CSRC = Path(__file__).resolve().parents[2] / "packages" / "uaii-kernels" / "csrc"
HARNESS = Path(__file__).resolve().parent / "native" / "isa_check.c"
CFLAGS = ["-O2", "-std=c11", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
          "-fno-tree-loop-distribute-patterns", "-pthread", f"-I{CSRC}"]


def _build_and_run(cc: str, runner: list[str], tmp_path: Path) -> str:
    exe = tmp_path / "isa_check"
    sources = [str(p) for p in sorted(CSRC.glob("*.c"))] + [str(HARNESS)]
    subprocess.run([cc, *CFLAGS, *sources, "-o", str(exe), "-lm"], check=True, capture_output=True, text=True)
    run = subprocess.run([*runner, str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_c_library_alone_every_isa_against_scalar(tmp_path: Path) -> None:
    """The C API without Python: the library builds from csrc/ alone and its SIMD paths match scalar."""
    assert "0 failure(s)" in _build_and_run("cc", [], tmp_path)


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None or shutil.which("qemu-aarch64") is None,
                    reason="needs aarch64-linux-gnu-gcc and qemu-user (Debian: gcc-aarch64-linux-gnu qemu-user)")
def test_neon_against_scalar_under_qemu(tmp_path: Path) -> None:
    out = _build_and_run("aarch64-linux-gnu-gcc", ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"], tmp_path)
    assert "1 SIMD ISA(s) against scalar, 0 failure(s)" in out


def test_calls_release_the_gil() -> None:
    """A long kernel call in one thread does not stop Python code in another."""
    import time

    w = K.PackedWeight.from_raw(random_weight(DType.Q8_0, 4096, 2048, 1), "q8_0", (4096, 2048))
    x = np.random.default_rng(0).standard_normal((256, 2048)).astype(np.float32)
    with K.num_threads(1):
        t0 = time.perf_counter()
        K.matmul(x, w)
        single = time.perf_counter() - t0
        reps = max(1, int(0.3 / single))
        done = threading.Event()

        def work() -> None:
            for _ in range(reps):
                K.matmul(x, w)
            done.set()

        th = threading.Thread(target=work)
        th.start()
        gaps, last = [], time.perf_counter()
        while not done.is_set():
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
        th.join()
    assert len(gaps) > 100
    assert max(gaps) < max(0.1, single / 2), (max(gaps), single)

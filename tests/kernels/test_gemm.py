"""IGemm providers against the f64 reference on the dequantized weight; every SIMD path against scalar."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import uaii.kernels as K
from uaii.ir.dtype import DType
from uaii.ir.errors import UnsupportedDType
from uaii.kernels.testing import random_weight

TYPES = sorted(K.DEQUANT_TYPES, key=lambda d: d.value)
PLAIN = {DType.F32, DType.F16, DType.BF16}
# c-q8dot quantizes the activations to 8 bits: relative error (Frobenius) against the f64 reference
TOL = {"c-q8dot": 2e-2, "c-f32": 1e-5, "numpy-dequant": 1e-5}


def _weight(dt: DType, n: int, k: int, seed: int = 0) -> K.PackedWeight:
    return K.PackedWeight.from_raw(random_weight(dt, n, k, seed), dt, (n, k))


def _rel(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def test_providers_listed() -> None:
    names = K.gemm_providers()
    assert names[0] == "c-q8dot"
    assert {"c-q8dot", "c-f32", "numpy-dequant"} <= set(names)
    for name in names:
        assert isinstance(K.get_gemm(name), K.IGemm)
    with pytest.raises(K.KernelError, match="unknown gemm provider"):
        K.get_gemm("cublas")


@pytest.mark.parametrize("dt", TYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("provider", ["c-q8dot", "c-f32", "numpy-dequant"])
def test_against_reference(dt: DType, provider: str, rng: np.random.Generator) -> None:
    k = 512
    w = _weight(dt, 45, k)
    wd = w.dequantize().astype(np.float64)
    g = K.get_gemm(provider)
    tol = 1e-5 if dt in PLAIN and provider == "c-q8dot" else TOL[provider]
    for m in (1, 2, 3, 4, 11):
        x = rng.standard_normal((m, k)).astype(np.float32)
        ref = x.astype(np.float64) @ wd.T
        y = g.gemm(x, w) if m > 1 else g.gemv(x[0], w)[None, :]
        assert _rel(y, ref) < tol, (m, _rel(y, ref))


@pytest.mark.parametrize("dt", TYPES, ids=lambda d: d.value)
def test_simd_matches_scalar(dt: DType, isa: str, rng: np.random.Generator) -> None:
    k = 768 if dt.block_size == 32 else 1024
    w = _weight(dt, 37, k, seed=5)
    x = rng.standard_normal((9, k)).astype(np.float32)
    with K.use_isa("scalar"):
        expected = [K.matmul(x[:m], w) for m in (1, 3, 9)]
        expected_f32 = K.get_gemm("c-f32").gemm(x, w)
    for m, e in zip((1, 3, 9), expected, strict=True):
        np.testing.assert_allclose(K.matmul(x[:m], w), e, rtol=2e-5, atol=2e-5 * np.abs(e).max())
    np.testing.assert_allclose(K.get_gemm("c-f32").gemm(x, w), expected_f32, rtol=2e-5,
                               atol=2e-5 * np.abs(expected_f32).max())


# Decode shapes of the types with a wide GEMV kernel (x86_gemv512.inc), and Q8_0 (the 256-bit kernel): row lengths
# with 0-3 blocks past the last group of 4 (masked loads), row counts around the 4-row unrolling, 1-3 activation rows
WIDE_K = {DType.Q4_0: (32, 64, 96, 128, 160, 576, 1056), DType.Q4_1: (32, 96, 224, 576, 2080),
          DType.Q4_K: (256, 512, 1536), DType.Q8_0: (32, 64, 96, 128, 160, 576, 2080),
          DType.Q5_0: (32, 64, 96, 128, 160, 640, 2080)}


@pytest.mark.parametrize("dt", list(WIDE_K), ids=lambda d: d.value)
def test_decode_rows_match_scalar(dt: DType, isa: str, rng: np.random.Generator) -> None:
    for k in WIDE_K[dt]:
        for n in (1, 3, 4, 9):
            w = _weight(dt, n, k, seed=k + n)
            x = rng.standard_normal((3, k)).astype(np.float32)
            # the size of the terms, not of their sum: a single output may nearly cancel
            scale = float((np.abs(x) @ np.abs(w.dequantize()).T).max())
            for m in (1, 2, 3):
                with K.use_isa("scalar"):
                    expected = K.matmul(x[:m], w)
                np.testing.assert_allclose(K.matmul(x[:m], w), expected, rtol=2e-5, atol=2e-6 * scale,
                                           err_msg=f"k={k} n={n} m={m}")


GUARDED_GEMV = """
import ctypes, mmap, sys
import numpy as np
import uaii.kernels as K
from uaii.ir.dtype import DType
from uaii.kernels.testing import random_weight

libc, page = ctypes.CDLL(None), mmap.PAGESIZE
dt, k, isa, m = DType.parse(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
raw = random_weight(dt, 5, k, 3)
size = (raw.nbytes + page - 1) // page * page
region = mmap.mmap(-1, size + page)
addr = ctypes.addressof(ctypes.c_char.from_buffer(region))
assert libc.mprotect(ctypes.c_void_p(addr + size), page, 0) == 0        # PROT_NONE right after the weight
buf = np.frombuffer(region, np.uint8, count=size)[size - raw.nbytes:]
buf[:] = raw
w = K.PackedWeight.from_raw(buf, dt, (5, k))
x = np.random.default_rng(0).standard_normal((m, k)).astype(np.float32)
with K.use_isa("scalar"):
    expected = K.matmul(x, w)
with K.use_isa(isa):
    got = K.matmul(x, w)
np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())
"""


@pytest.mark.parametrize("m", [1, 20], ids=["decode", "batch"])
@pytest.mark.parametrize("dt", list(WIDE_K), ids=lambda d: d.value)
def test_reads_nothing_past_the_weight(dt: DType, m: int, isa: str) -> None:
    """The last row ends where an unreadable page begins (in a child process, so that a fault fails this test
    alone): a kernel that reads past the row, e.g. a full 64-byte load on the 1-3 blocks after the last group of
    4, crashes the child. 20 rows: the batch kernels, which pack the weight rows (Q4_0/Q5_0: the row-lane form)."""
    k = 576 if dt.block_size == 32 else 256
    proc = subprocess.run([sys.executable, "-c", GUARDED_GEMV, dt.value, str(k), isa, str(m)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"


def test_layouts_out_and_strides(rng: np.random.Generator) -> None:
    w = _weight(DType.Q4_K, 64, 256)
    x = rng.standard_normal((2, 3, 512)).astype(np.float32)[:, :, ::2]      # strided columns: copied
    ref = K.matmul(np.ascontiguousarray(x), w)
    assert ref.shape == (2, 3, 64)
    np.testing.assert_array_equal(K.matmul(x, w), ref)
    rows = rng.standard_normal((8, 300)).astype(np.float32)[:, :256]        # strided rows: used in place
    out = np.empty((8, 64), np.float32)
    assert K.matmul(rows, w, out=out) is out
    np.testing.assert_array_equal(out, K.matmul(np.ascontiguousarray(rows), w))
    with pytest.raises(K.KernelError, match="out must be"):
        K.matmul(rows, w, out=np.empty((8, 63), np.float32))
    with pytest.raises(K.KernelError, match="columns"):
        K.matmul(np.zeros((1, 128), np.float32), w)
    with pytest.raises(K.KernelError, match="float32"):
        K.matmul(np.zeros((1, 256), np.float64), w)


def test_weight_checks() -> None:
    with pytest.raises(K.KernelError, match="multiple of the q4_k block"):
        K.PackedWeight.from_raw(b"\0" * 4096, "q4_k", (4, 128))
    with pytest.raises(K.KernelError, match="needs 288 bytes"):
        K.PackedWeight.from_raw(b"\0" * 100, "q4_k", (2, 256))
    with pytest.raises(UnsupportedDType, match="iq2_xs"):
        K.PackedWeight.from_raw(b"\0" * 4096, "iq2_xs", (1, 256))
    w = K.PackedWeight.from_array(np.eye(4, dtype=np.float16))
    assert w.dtype is DType.F16 and (w.n, w.k) == (4, 4)
    np.testing.assert_array_equal(K.matmul(np.arange(4, dtype=np.float32)[None], w), [[0, 1, 2, 3]])


def test_paths() -> None:
    assert K.gemm_path("q4_0") == "int8-dot"
    assert K.gemm_path("q4_k") == "int8-dot"
    assert K.gemm_path("q2_k") == "int8-dot"          # batches too: they must sum as the decode rows do
    assert K.gemm_path("f16") == "float"
    assert K.FAST_TYPES == K.DEQUANT_TYPES
    with pytest.raises(UnsupportedDType):
        K.gemm_path("iq1_s")


def test_large_batch_threads(rng: np.random.Generator) -> None:
    w = _weight(DType.Q4_1, 200, 576)
    x = rng.standard_normal((70, 576)).astype(np.float32)
    with K.num_threads(1):
        ref = K.matmul(x, w)
    for n in (2, 3):
        with K.num_threads(n):
            np.testing.assert_array_equal(K.matmul(x, w), ref)


def test_register_provider() -> None:
    class Twice:
        name = "test-twice"

        def supports(self, dtype: DType) -> bool:
            return True

        def gemv(self, x: np.ndarray, w: K.PackedWeight, out: np.ndarray | None = None) -> np.ndarray:
            return 2 * K.matmul(x, w, out=out)

        gemm = gemv

    K.register_gemm_provider(Twice())
    assert "test-twice" in K.gemm_providers()
    with pytest.raises(K.KernelError, match="does not implement"):
        K.register_gemm_provider(object())  # type: ignore[arg-type]


def test_decode_step_allocates_nothing(rng: np.random.Generator) -> None:
    """With out= buffers, a decode step (GEMV, norm, rope, attention, SwiGLU) allocates no array memory."""
    import tracemalloc

    k, n = 576, 1536
    w_up = _weight(DType.Q4_1, n, k)
    w_down = _weight(DType.Q8_0, k, n)
    x = rng.standard_normal((1, k)).astype(np.float32)
    norm_w = np.ones(k, np.float32)
    h, up, act, y = (np.empty((1, k), np.float32), np.empty((1, n), np.float32), np.empty((1, n), np.float32),
                     np.empty((1, k), np.float32))
    q = rng.standard_normal((1, 9, 64)).astype(np.float32)
    kc = rng.standard_normal((64, 3, 64)).astype(np.float32)
    att = np.empty((1, 9, 64), np.float32)
    pos = np.array([63], np.int32)
    inv = K.rope_inv_freq(64)

    def step() -> None:
        K.rms_norm(x, norm_w, out=h)
        K.matmul(h, w_up, out=up)
        K.swiglu(up, up, out=act)
        K.matmul(act, w_down, out=y)
        K.rope(q, pos, inv, out=q)
        K.attention(q, kc, kc, q_pos=pos, out=att)

    for _ in range(3):
        step()
    tracemalloc.start()
    try:
        for _ in range(20):
            step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024, peak          # a few small Python objects, no arrays

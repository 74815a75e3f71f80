"""ONNX MatMulNBits weights through IGemm: the C integer path and the C float path (c-f32: f32 activations, the
weight dequantized in registers for decode rows, by chunks for batches) on every ISA against their scalar
references (same bits), batches against decode rows and 1 against 2 threads (same bits), every path against the
NumPy dequantization, and that dequantization against the contrib-op spec written out here element by element."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import uaii.kernels as K
from uaii.kernels.native import ffi, lib

X86_AND_ARM = ["avx2", "avxvnni", "avx512", "neon"]
ZP_KINDS = ("none", "u8", "f32", "f16")
Q8_TOL = 3e-2
"""Normalized max error (max|y - ref| / max|ref|) of the int8-activation path against the f32 dequantization:
measured <= 1.1% with normal activations and <= 2.4% with 20x outliers in 1% of the positions (bits 4/8, blocks
16..128, k 64..4096); the conformance cases use the same bound (Q8_ACT)."""
F32_TOL = 1e-5
"""The float path against the float64 product of the same dequantized weight: f32 rounding only."""
FUSED_M = 2
"""Up to this many activation rows the float path dequantizes in registers; more: by chunks then the f32 tile kernel
(nbits.c NBF_FUSED_M). The tests run both sides of it."""


def nbits_arrays(n: int, k: int, bits: int, bs: int, zp: str, seed: int = 0,
                 scale_dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Random B bytes, scales and zero points of a [n, k] weight in ONNX's layout."""
    rng = np.random.default_rng(seed)
    kb = -(-k // bs)
    b = rng.integers(0, 256, n * kb * bs * bits // 8, dtype=np.uint8)
    scales = rng.uniform(0.005, 0.05, n * kb).astype(scale_dtype)
    z: np.ndarray | None = None
    if zp == "u8":
        z = rng.integers(0, 256, n * -(-kb * bits // 8), dtype=np.uint8)
    elif zp in ("f32", "f16"):
        z = rng.uniform(0, 2**bits - 1, n * kb).astype(np.float32 if zp == "f32" else np.float16)
    return b, scales, z


def nbits_weight(n: int, k: int, bits: int, bs: int, zp: str, seed: int = 0,
                 scale_dtype: type = np.float32) -> K.PackedWeight:
    b, s, z = nbits_arrays(n, k, bits, bs, zp, seed, scale_dtype)
    return K.PackedWeight.from_nbits(b, s, z, n=n, k=k, bits=bits, block_size=bs)


def spec_dequant(b: np.ndarray, s: np.ndarray, z: np.ndarray | None, n: int, k: int, bits: int,
                 bs: int) -> np.ndarray:
    """The contrib-op spec, one value at a time in float64: (q - zero_point) * scale."""
    kb = -(-k // bs)
    blob = bs * bits // 8
    zrow = -(-kb * bits // 8)
    w = np.zeros((n, k))
    for r in range(n):
        for j in range(k):
            blk, e = divmod(j, bs)
            byte = b[r * kb * blob + blk * blob + (e * bits) // 8]
            q = int(byte) if bits == 8 else (int(byte) >> (4 * (e % 2))) & 15
            if z is None:
                zp = float(2 ** (bits - 1))
            elif z.dtype == np.uint8:
                zb = int(z[r * zrow + (blk * bits) // 8])
                zp = float(zb if bits == 8 else (zb >> (4 * (blk % 2))) & 15)
            else:
                zp = float(z[r * kb + blk])
            w[r, j] = (q - zp) * float(s[r * kb + blk])
    return w


def _nerr(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(y - ref)) / max(float(np.max(np.abs(ref))), 1e-6))


# --- the layout and its dequantization --------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zp", ZP_KINDS)
@pytest.mark.parametrize("bs,k", [(16, 48), (16, 40), (32, 70), (64, 64), (128, 100), (256, 300)])
def test_dequantize_follows_the_spec(bits: int, zp: str, bs: int, k: int) -> None:
    n = 5
    b, s, z = nbits_arrays(n, k, bits, bs, zp, seed=bits + bs + k)
    w = K.PackedWeight.from_nbits(b, s, z, n=n, k=k, bits=bits, block_size=bs)
    got = w.dequantize()
    assert got.shape == (n, k) and got.dtype == np.float32
    np.testing.assert_allclose(got, spec_dequant(b, s, z, n, k, bits, bs), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zp", ZP_KINDS)
@pytest.mark.parametrize("bs,k", [(16, 200), (32, 300), (256, 700), (64, 37)])
def test_c_dequantize_has_numpys_bits(bits: int, zp: str, bs: int, k: int, isa: str) -> None:
    w = nbits_weight(7, k, bits, bs, zp, seed=3, scale_dtype=np.float16 if zp == "none" else np.float32)
    out = np.empty((w.n, w.k), np.float32)
    assert lib.uk_nbits_dequantize(*K.nbits_call(w), ffi.cast("float *", ffi.from_buffer(out))) == 0
    assert np.array_equal(out, w.dequantize())


def test_bf16_scales_are_uint16_words() -> None:
    n, k = 3, 64
    b, s, z = nbits_arrays(n, k, 4, 32, "u8")
    words = (s.view(np.uint32) >> 16).astype(np.uint16)
    w = K.PackedWeight.from_nbits(b, words, z, n=n, k=k, bits=4, block_size=32, scale_dtype="bf16")
    exact = (words.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_allclose(w.dequantize(), spec_dequant(b, exact, z, n, k, 4, 32), rtol=1e-6)
    x = np.random.default_rng(0).standard_normal((2, k)).astype(np.float32)
    assert _nerr(K.get_gemm("c-q8dot").gemm(x, w), x @ w.dequantize().T) < Q8_TOL
    assert _nerr(K.get_gemm("c-f32").gemm(x, w), x.astype(np.float64) @ spec_dequant(b, exact, z, n, k, 4, 32).T) \
        < F32_TOL


# --- the integer path: the same bits everywhere -------------------------------------------------------------------
def _all_paths(w: K.PackedWeight, x: np.ndarray) -> dict[str, np.ndarray]:
    c = K.get_gemm("c-q8dot")
    out = {}
    for threads in (1, 2):
        with K.num_threads(threads):
            out[f"batch/{threads}"] = c.gemm(x, w)
            out[f"rows/{threads}"] = np.concatenate([c.gemv(x[i], w)[None] for i in range(x.shape[0])])
    return out


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("bs", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("zp", ZP_KINDS)
def test_integer_path_same_bits_on_every_isa_batch_and_thread_count(bits: int, bs: int, zp: str, isa: str) -> None:
    """Scalar reference = every SIMD path, and a row's bits do not depend on the batch (1 to 9 rows, the kernel
    takes 4 at a time) or the threads. K not a multiple of the block (ORT pads the last block) and, for blocks of 16,
    an odd block count (a half group at the row's end)."""
    k = 3 * bs + 16 + 5
    w = nbits_weight(67, k, bits, bs, zp, seed=bs, scale_dtype=np.float16 if bits == 8 else np.float32)
    x = np.random.default_rng(bs + bits).standard_normal((9, k)).astype(np.float32)
    with K.use_isa("scalar"):
        want = K.get_gemm("c-q8dot").gemm(x, w)
    for name, y in _all_paths(w, x).items():
        assert np.array_equal(y, want), (isa, name)
    assert _nerr(want, x.astype(np.float64) @ w.dequantize().astype(np.float64).T) < Q8_TOL


# --- the float path: the same bits everywhere too ---------------------------------------------------------------
def _float_paths(w: K.PackedWeight, x: np.ndarray) -> dict[str, np.ndarray]:
    c = K.get_gemm("c-f32")
    out = {}
    for threads in (1, 2):
        with K.num_threads(threads):
            for m in sorted({1, 2, 3, FUSED_M, FUSED_M + 1, x.shape[0]}):
                out[f"batch{m}/{threads}"] = c.gemm(x[:m], w)
            out[f"rows/{threads}"] = np.concatenate([c.gemv(x[i], w)[None] for i in range(x.shape[0])])
    return out


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("bs", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("zp", ZP_KINDS)
def test_float_path_same_bits_on_every_isa_batch_and_thread_count(bits: int, bs: int, zp: str, isa: str) -> None:
    """The scalar reference (each row dequantized once, one 8-lane f32 chain per output) = the SIMD paths, for decode
    rows (dequantized in registers) and batches (a chunk dequantized, then the f32 tile kernel), 1 and 2 threads. K
    not a multiple of 8 (a scalar tail) nor of the block; N not a multiple of the 4 rows a pass takes."""
    k = 3 * bs + 16 + 5
    w = nbits_weight(67, k, bits, bs, zp, seed=bs + 1, scale_dtype=np.float16 if bits == 8 else np.float32)
    x = np.random.default_rng(bs + bits + 1).standard_normal((11, k)).astype(np.float32)
    with K.use_isa("scalar"):
        want = K.get_gemm("c-f32").gemm(x, w)
    for name, y in _float_paths(w, x).items():
        assert np.array_equal(y, want[: y.shape[0]]), (isa, name)
    assert _nerr(want, x.astype(np.float64) @ w.dequantize().astype(np.float64).T) < F32_TOL


@pytest.mark.parametrize("k", [1, 7, 8, 31, 33, 1000])
def test_float_path_short_and_odd_rows(k: int, isa: str) -> None:
    """K shorter than a vector, than a block, and every remainder of 8: the same bits as the scalar reference."""
    for bits, bs in ((4, 16), (8, 32)):
        w = nbits_weight(9, k, bits, bs, "u8", seed=k)
        x = np.random.default_rng(k).standard_normal((6, k)).astype(np.float32)
        with K.use_isa("scalar"):
            want = K.get_gemm("c-f32").gemm(x, w)
        for name, y in _float_paths(w, x).items():
            assert np.array_equal(y, want[: y.shape[0]]), (k, bits, name)
        np.testing.assert_allclose(want, x.astype(np.float64) @ w.dequantize().astype(np.float64).T, rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("isa_name", X86_AND_ARM)
def test_simd_isa_is_available_or_skipped(isa_name: str) -> None:
    """States in the test report which SIMD paths this machine checked (the others are compiled, not run)."""
    if isa_name not in K.available_isas():
        pytest.skip(f"{isa_name} is not available on this CPU: its MatMulNBits path was not run here")
    w = nbits_weight(33, 1000, 4, 32, "u8")
    x = np.random.default_rng(2).standard_normal((5, 1000)).astype(np.float32)
    for provider in ("c-q8dot", "c-f32"):
        with K.use_isa("scalar"):
            want = K.get_gemm(provider).gemm(x, w)
        with K.use_isa(isa_name):
            assert np.array_equal(K.get_gemm(provider).gemm(x, w), want), provider


@pytest.mark.parametrize("bits,bs,zp", [(4, 32, "u8"), (4, 128, "none"), (8, 64, "f32"), (8, 16, "u8")])
def test_large_k_and_many_rows(bits: int, bs: int, zp: str) -> None:
    n, k = 300, 4096 + bs // 2
    w = nbits_weight(n, k, bits, bs, zp, seed=11)
    x = np.random.default_rng(3).standard_normal((13, k)).astype(np.float32)
    ref = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    paths = _all_paths(w, x)
    for y in paths.values():
        assert np.array_equal(y, paths["batch/1"])
    assert _nerr(paths["batch/1"], ref) < Q8_TOL
    assert _nerr(K.get_gemm("c-f32").gemm(x, w), ref) < 1e-5


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k", [230, 240, 1000])
def test_blocks_of_16_with_a_half_group_inside_the_last_8(bits: int, k: int) -> None:
    """kb = 15 blocks of 16: 8 groups of 32 values, the last one half present, inside a full run of 8 groups."""
    w = nbits_weight(21, k, bits, 16, "u8", seed=k)
    x = np.random.default_rng(k).standard_normal((6, k)).astype(np.float32)
    with K.use_isa("scalar"):
        want = K.get_gemm("c-q8dot").gemm(x, w)
    for y in _all_paths(w, x).values():
        assert np.array_equal(y, want)
    assert _nerr(want, x.astype(np.float64) @ w.dequantize().astype(np.float64).T) < Q8_TOL


def _guarded(arr: np.ndarray) -> np.ndarray:
    """A copy of ``arr`` whose last byte is the last byte before an unreadable page (PROT_NONE)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    size = (arr.nbytes + page - 1) // page * page
    buf = mmap.mmap(-1, size + page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(ctypes.c_void_p(base + size), page, 0) == 0
    out = np.frombuffer(buf, np.uint8, arr.nbytes, size - arr.nbytes).view(arr.dtype)
    out[...] = arr.reshape(-1)
    _GUARDS.append(buf)          # unmapped at exit only: a freed mapping under a live array would be worse
    return out


_GUARDS: list[object] = []


@pytest.mark.skipif(sys.platform != "linux", reason="guard pages through libc's mprotect")
@pytest.mark.parametrize("bits,bs,k,zp", [(4, 16, 230, "u8"), (8, 16, 69, "u8"), (4, 32, 70, "f16"),
                                          (4, 256, 300, "u8"), (8, 128, 129, "none")])
def test_no_read_past_the_arrays(bits: int, bs: int, k: int, zp: str, isa: str) -> None:
    """B, scales, zero points and the activations each end at an unreadable page: a kernel that reads past any of
    them crashes the test (blocks of 16 with an odd count end in half a group of 32)."""
    n = 5
    b, s, z = nbits_arrays(n, k, bits, bs, zp, seed=1, scale_dtype=np.float16)
    w = K.PackedWeight.from_nbits(_guarded(b), _guarded(s), None if z is None else _guarded(z), n=n, k=k,
                                  bits=bits, block_size=bs)
    x = _guarded(np.random.default_rng(0).standard_normal((FUSED_M + 2, k)).astype(np.float32)).reshape(-1, k)
    want = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    rows = x.shape[0]
    for provider in ("c-q8dot", "c-f32"):
        for m in (1, 3, rows):
            assert _nerr(K.get_gemm(provider).gemm(x[rows - m:], w), want[rows - m:]) < Q8_TOL


# --- every provider against the dequantized weight ------------------------------------------------------------------
@pytest.mark.parametrize("provider,tol", [("c-q8dot", Q8_TOL), ("c-precise", Q8_TOL), ("c-f32", 1e-5),
                                          ("numpy-dequant", 1e-5)])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zp", ZP_KINDS)
def test_providers_against_the_f64_product(provider: str, tol: float, bits: int, zp: str) -> None:
    k = 200
    b, s, z = nbits_arrays(29, k, bits, 32, zp, seed=bits)
    w = K.PackedWeight.from_nbits(b, s, z, n=29, k=k, bits=bits, block_size=32)
    ref_w = spec_dequant(b, s, z, 29, k, bits, 32)
    g = K.get_gemm(provider)
    for m in (1, 6):
        x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
        y = g.gemm(x, w)
        assert y.shape == (m, 29) and y.dtype == np.float32
        assert _nerr(y, x.astype(np.float64) @ ref_w.T) < tol, (provider, m)


def test_precise_mode_is_the_integer_path() -> None:
    w = nbits_weight(40, 256, 8, 32, "u8")
    x = np.random.default_rng(4).standard_normal((3, 256)).astype(np.float32)
    assert np.array_equal(K.get_gemm("c-precise").gemm(x, w), K.get_gemm("c-q8dot").gemm(x, w))


@pytest.mark.parametrize("provider", ["c-q8dot", "c-f32"])
def test_leading_dims_strided_rows_and_out(provider: str) -> None:
    w = nbits_weight(24, 96, 4, 32, "u8")
    big = np.random.default_rng(5).standard_normal((6, 128)).astype(np.float32)
    x = big[:, :96]                                     # rows 128 floats apart
    c = K.get_gemm(provider)
    want = c.gemm(np.ascontiguousarray(x), w)
    assert np.array_equal(c.gemm(x, w), want)
    assert np.array_equal(c.gemm(x[:2], w), want[:2])   # decode rows, strided
    out = np.empty((2, 3, 24), np.float32)
    assert c.gemm(np.ascontiguousarray(x).reshape(2, 3, 96), w, out) is out
    assert np.array_equal(out.reshape(6, 24), want)


@pytest.mark.parametrize("mode", [0, 1])
def test_bias_is_added_after_the_product(mode: int) -> None:
    w = nbits_weight(50, 160, 4, 16, "f32")
    x = np.random.default_rng(6).standard_normal((5, 160)).astype(np.float32)
    bias = np.random.default_rng(7).standard_normal(50).astype(np.float32)
    y = np.empty((5, 50), np.float32)
    fp = ffi.cast("float *", ffi.from_buffer(x))
    assert lib.uk_nbits_gemm(*K.nbits_call(w), ffi.cast("float *", ffi.from_buffer(bias)), fp, 5, 160,
                             ffi.cast("float *", ffi.from_buffer(y)), 50, mode) == 0
    plain = K.get_gemm("c-f32" if mode else "c-q8dot").gemm(x, w)
    assert np.array_equal(y, plain + bias)


def test_empty_products() -> None:
    w = nbits_weight(0, 64, 4, 32, "none")
    assert K.get_gemm("c-q8dot").gemm(np.ones((3, 64), np.float32), w).shape == (3, 0)
    w = nbits_weight(8, 64, 4, 32, "none")
    assert K.get_gemm("c-q8dot").gemm(np.ones((0, 64), np.float32), w).shape == (0, 8)


# --- errors ----------------------------------------------------------------------------------------------------------
def test_layout_errors_name_what_does_not_fit() -> None:
    b, s, z = nbits_arrays(4, 64, 4, 32, "u8")
    make = K.PackedWeight.from_nbits
    with pytest.raises(K.KernelError, match="bits = 3"):
        make(b, s, z, n=4, k=64, bits=3, block_size=32)
    with pytest.raises(K.KernelError, match="block_size = 24"):
        make(b, s, z, n=4, k=64, bits=4, block_size=24)
    with pytest.raises(K.KernelError, match="B must be 128 uint8 bytes"):
        make(b[:-1], s, z, n=4, k=64, bits=4, block_size=32)
    with pytest.raises(K.KernelError, match="scales must hold n \\* k_blocks = 8"):
        make(b, s[:7], z, n=4, k=64, bits=4, block_size=32)
    with pytest.raises(K.KernelError, match="u8 zero_points must hold 4"):
        make(b, s, z[:3], n=4, k=64, bits=4, block_size=32)
    with pytest.raises(K.KernelError, match="f32 zero_points must hold 8"):
        make(b, s, np.zeros(5, np.float32), n=4, k=64, bits=4, block_size=32)
    with pytest.raises(K.KernelError, match="scales must be float32, float16 or bfloat16"):
        make(b, s.astype(np.float64), z, n=4, k=64, bits=4, block_size=32)
    with pytest.raises(K.KernelError, match="x has 63 columns"):
        K.get_gemm("c-q8dot").gemm(np.ones((1, 63), np.float32), make(b, s, z, n=4, k=64, bits=4, block_size=32))


def test_c_entry_points_refuse_bad_arguments() -> None:
    w = nbits_weight(4, 64, 4, 32, "u8")
    bits, bs, bp, n, k, sp, st, zp, zt = K.nbits_call(w)
    x = np.ones((1, 64), np.float32)
    y = np.empty((1, 4), np.float32)
    xp, yp = ffi.cast("float *", ffi.from_buffer(x)), ffi.cast("float *", ffi.from_buffer(y))

    def call(**kw: int) -> int:
        a = {"bits": bits, "bs": bs, "st": st, "zt": zt, "ldx": 64, "mode": 0, **kw}
        return int(lib.uk_nbits_gemm(a["bits"], a["bs"], bp, n, k, sp, a["st"], zp, a["zt"], ffi.NULL, xp, 1,
                                     a["ldx"], yp, 4, a["mode"]))

    assert call() == 0
    assert call(bits=2) == lib.UK_E_TYPE
    assert call(bs=48) == lib.UK_E_ARG and call(bs=512) == lib.UK_E_ARG and call(bs=8) == lib.UK_E_ARG
    assert call(st=lib.UK_NB_U8) == lib.UK_E_TYPE
    assert call(zt=9) == lib.UK_E_TYPE
    assert call(ldx=63) == lib.UK_E_ARG
    assert call(mode=3) == lib.UK_E_ARG

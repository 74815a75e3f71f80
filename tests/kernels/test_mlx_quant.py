"""MLX-quantized weights (mlx.core.quantize's layout) in uaii.kernels: the C dequantization on every ISA against the
NumPy reference uaii.ir.reference.quantized.dequantize (bit for bit, exhaustively over the codes of the fp modes) and,
when mlx is installed, against mlx.core.dequantize; the C product (uk_mlx_gemm) on every ISA, batch size and thread
count against the scalar path (same bits), the scalar path against the summation order it documents, and every
provider against the float64 product of the reference dequantization; the errors of bad layouts and arguments."""

from __future__ import annotations

import ctypes
import mmap
import sys
from typing import Any

import numpy as np
import pytest

import uaii.kernels as K
from uaii.ir.ops.quantized import QUANT_MODES
from uaii.ir.reference.quantized import dequantize as ref_dequantize
from uaii.ir.reference.quantized import unpack
from uaii.kernels.native import KernelError, ffi, lib

AFFINE_BITS = (1, 2, 3, 4, 5, 6, 8)
GROUPS = (32, 64, 128)
SCALE_TYPES = ("f32", "f16", "bf16")
FP_MODES = ("mxfp4", "mxfp8", "nvfp4")
M_SIZES = (1, 2, 3, 5, 17)
"""Activation rows: decode rows (1, 2: dequantized in registers, mlxq.c MQ_FUSED_M) and batches (chunks of rows
dequantized, then the f32 tile kernel)."""
F32_TOL = 1e-5
"""The product against the float64 product of the same dequantized weight, relative to max|y|: f32 rounding only."""


# --- building weights ---------------------------------------------------------------------------------------------
def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Values q [n, k] (0 .. 2^bits - 1) as MLX's packed uint32 rows: one LSB-first bit stream per row."""
    n, k = q.shape
    stream = ((q[..., None].astype(np.uint32) >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8)
    return np.packbits(stream.reshape(n, k * bits), axis=1, bitorder="little").view("<u4").astype(np.uint32)


def to_type(v: np.ndarray, st: str) -> np.ndarray:
    """float32 values in the scales' type: float32, float16, or bf16 as uint16 words (truncated: any word will do)."""
    v = np.asarray(v, np.float32)
    if st == "bf16":
        return (v.view(np.uint32) >> 16).astype(np.uint16)
    with np.errstate(over="ignore"):
        return v.astype(np.float16 if st == "f16" else np.float32)


def wild_floats(rng: np.random.Generator, shape: tuple[int, ...], st: str) -> np.ndarray:
    """Random signed magnitudes over the type's whole range (subnormals, overflow of s * q and of the sum to inf),
    and 5% raw random words (every code: zeros, infinities, NaNs)."""
    lo, hi = (-8.0, 4.8) if st == "f16" else (-40.0, 38.5)
    v = (10.0 ** rng.uniform(lo, hi, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)
    out = to_type(v, st)
    raw = rng.random(shape) < 0.05
    width = np.uint32 if st == "f32" else np.uint16
    words = rng.integers(0, np.iinfo(width).max, shape, dtype=np.uint64, endpoint=True).astype(width)
    out.view(width)[raw] = words[raw]
    return out


def affine_arrays(n: int, k: int, bits: int, gs: int, st: str, seed: int,
                  wild: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Packed words, scales and biases of an affine weight: random codes; scales and biases as a quantizer makes
    them (bias ~ -scale 2^(bits-1)) or, ``wild``, anything (wild_floats)."""
    rng = np.random.default_rng(seed)
    w = pack(rng.integers(0, 1 << bits, (n, k)), bits)
    shape = (n, k // gs)
    if wild:
        return w, wild_floats(rng, shape, st), wild_floats(rng, shape, st)
    s = rng.uniform(0.002, 0.05, shape) * rng.choice([-1.0, 1.0], shape)
    b = -s * (1 << (bits - 1)) + rng.normal(0.0, 0.01, shape)
    return w, to_type(s, st), to_type(b, st)


def fp_arrays(n: int, k: int, mode: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Packed words and uint8 scale codes of an fp-mode weight with finite values of moderate size."""
    m = QUANT_MODES[mode]
    bits, gs = m.bits[0], m.group_sizes[0]
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 1 << bits, (n, k))
    if bits == 8:
        q[(q & 0x7F) == 0x7F] = 0x3C                 # no E4M3 NaN codes
    if m.scale == "e8m0":
        codes = rng.integers(120, 131, (n, k // gs))
    else:
        codes = rng.integers(0x28, 0x48, (n, k // gs)) | (rng.integers(0, 2, (n, k // gs)) << 7)   # E4M3, signed
    return pack(q, bits), codes.astype(np.uint8)


def mlx_weight(mode: str, bits: int, gs: int, st: str, n: int, k: int, seed: int) -> K.PackedWeight:
    if mode == "affine":
        w, s, b = affine_arrays(n, k, bits, gs, st, seed)
        return K.PackedWeight.from_mlx(w, s, b, n=n, k=k, mode=mode, bits=bits, group_size=gs,
                                       scale_dtype="bf16" if st == "bf16" else None)
    w, codes = fp_arrays(n, k, mode, seed)
    return K.PackedWeight.from_mlx(w, codes, n=n, k=k, mode=mode, bits=bits, group_size=gs)


def reference(pw: K.PackedWeight) -> np.ndarray:
    lay = pw.mlx
    assert lay is not None
    w = pw.data.reshape(pw.n, -1)
    s = lay.scales.reshape(pw.n, -1)
    b = None if lay.biases is None else lay.biases.reshape(pw.n, -1)
    with np.errstate(invalid="ignore"):                  # NaN scales of the wild tests
        return ref_dequantize(w, s, b, mode=lay.mode, bits=lay.bits, group_size=lay.group_size, k=pw.k)


def assert_same_bits(got: np.ndarray, want: np.ndarray, what: object = "") -> None:
    """Equal bits, except that any NaN equals any NaN (payloads are not specified)."""
    assert got.shape == want.shape, what
    gn, wn = np.isnan(got), np.isnan(want)
    assert np.array_equal(gn, wn), (what, "NaN positions differ")
    diff = np.flatnonzero(got.view(np.uint32)[~gn] != want.view(np.uint32)[~wn])
    assert diff.size == 0, (what, f"{diff.size} values differ", got[~gn][diff[:4]], want[~wn][diff[:4]])


def c_dequantize(pw: K.PackedWeight, row0: int = 0, rows: int | None = None) -> np.ndarray:
    rows = pw.n - row0 if rows is None else rows
    out = np.full((rows, pw.k), np.nan, np.float32)
    mode, bits, gs, w, n, k, s, b, st = K.mlx_call(pw)
    rc = lib.uk_mlx_dequantize(mode, bits, gs, w, n, k, s, b, st, row0, rows, ffi.cast("float *", ffi.from_buffer(out)))
    assert rc == 0
    return out


# --- the packing helper against the reference's unpacking ---------------------------------------------------------
@pytest.mark.parametrize("bits", AFFINE_BITS)
def test_pack_is_the_layout_the_reference_reads(bits: int) -> None:
    q = np.random.default_rng(bits).integers(0, 1 << bits, (3, 96))
    w = pack(q, bits)
    assert w.shape == (3, 96 * bits // 32) and w.dtype == np.uint32
    assert np.array_equal(unpack(w, bits, 96), q)
    if bits == 4:                                    # value j in bits 4j .. 4j + 3 of the little-endian words
        assert int(w[0, 0]) & 15 == q[0, 0] and (int(w[0, 0]) >> 28) == q[0, 7]


# --- dequantization: bit-exact with the reference -------------------------------------------------------------
@pytest.mark.parametrize("st", SCALE_TYPES)
@pytest.mark.parametrize("gs", GROUPS)
@pytest.mark.parametrize("bits", AFFINE_BITS)
def test_affine_dequantize_has_the_references_bits(bits: int, gs: int, st: str, isa: str) -> None:
    """Random codes, scales and biases over the type's range (negative, subnormal, huge: s * q and the sum overflow
    to inf; raw words: inf and NaN scales); the whole weight and row ranges (the last row alone: a padded copy on
    the SIMD paths)."""
    n, k = 9, 2 * 128 + gs
    w, s, b = affine_arrays(n, k, bits, gs, st, seed=bits * 1000 + gs + len(st), wild=True)
    pw = K.PackedWeight.from_mlx(w, s, b, n=n, k=k, mode="affine", bits=bits, group_size=gs,
                                 scale_dtype="bf16" if st == "bf16" else None)
    want = reference(pw)
    assert_same_bits(c_dequantize(pw), want, (isa, "all"))
    assert_same_bits(pw.dequantize(), want, (isa, "PackedWeight.dequantize"))
    for r0, r1 in ((2, 7), (n - 1, n), (0, 1), (4, 4)):
        assert_same_bits(c_dequantize(pw, r0, r1 - r0), want[r0:r1], (isa, r0, r1))
        got = K.dequantize_mlx(w, s, b, n=n, k=k, mode="affine", bits=bits, group_size=gs,
                               scale_dtype="bf16" if st == "bf16" else None, rows=(r0, r1))
        assert_same_bits(got, want[r0:r1], (isa, "dequantize_mlx", r0, r1))


@pytest.mark.parametrize("st", SCALE_TYPES)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_affine_data_tells_the_roundings_apart(bits: int, st: str) -> None:
    """The data of the test above distinguishes mlx's two roundings from one fused multiply-add (f32) and from a
    single rounding of the f32 sum (f16, bf16): a kernel that skipped or fused one would fail it."""
    w, s, b = affine_arrays(9, 320, bits, 64, st, seed=bits * 1000 + 64 + len(st), wild=True)
    want = ref_dequantize(w, s, b, mode="affine", bits=bits, group_size=64)
    q = unpack(w, bits, 320).astype(np.float64)
    s64, b64 = (np.repeat(as_f32(a, st), 64, axis=1).astype(np.float64) for a in (s, b))
    with np.errstate(all="ignore"):
        # f32: one rounding, fma(s, q, b); f16 / bf16: the product not rounded to T
        other = (s64 * q + b64).astype(np.float32) if st == "f32" else round_to(s64 * q + b64, st)
    fin = np.isfinite(want) & np.isfinite(other)
    assert np.count_nonzero(want[fin] != other[fin]) > 0


def as_f32(a: np.ndarray, st: str) -> np.ndarray:
    return (a.astype(np.uint32) << 16).view(np.float32) if st == "bf16" else a.astype(np.float32)


def round_to(v: np.ndarray, st: str) -> np.ndarray:
    """v rounded to f32, then to nearest even in T (f16, bf16), as float32."""
    v32 = np.asarray(v, np.float32)
    if st == "f16":
        return v32.astype(np.float16).astype(np.float32)
    bits = v32.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def fp_exhaustive(mode: str) -> tuple[np.ndarray, np.ndarray, int]:
    """A weight in which every scale code meets every element code: one row per scale code c; group g of every
    row holds the element codes g * gs .. (cycling through all codes), its scale code (c + 37 g) mod 256."""
    m = QUANT_MODES[mode]
    bits, gs = m.bits[0], m.group_sizes[0]
    codes = 1 << bits
    groups = max(2, codes // gs)
    k = groups * gs
    q = np.tile(np.arange(k) % codes, (256, 1))
    q = (q + np.arange(256)[:, None] * (codes == 16)) % codes      # fp4: vary the positions too
    scales = ((np.arange(256)[:, None] + 37 * np.arange(groups)[None, :]) % 256).astype(np.uint8)
    return pack(q, bits), scales, k


@pytest.mark.parametrize("mode", FP_MODES)
def test_fp_modes_exhaustively(mode: str, isa: str) -> None:
    """All 256 scale codes x all element codes (E2M1: 16, E4M3: 256, NaN codes included), NaN == NaN."""
    w, scales, k = fp_exhaustive(mode)
    m = QUANT_MODES[mode]
    bits, gs = m.bits[0], m.group_sizes[0]
    want = ref_dequantize(w, scales, None, mode=mode, bits=bits, group_size=gs)
    pairs = {(int(c), int(e)) for c, e in zip(np.repeat(scales, gs, axis=1).ravel(), unpack(w, bits, k).ravel(),
                                              strict=True)}
    assert len(pairs) == 256 * (1 << bits)           # every (scale, element) pair occurs
    assert np.isnan(want).any() and (want.view(np.uint32) == 0x80000000).any()
    assert np.isinf(want).any() == (mode != "nvfp4")     # E8M0 code 255 is inf; E4M3 has none
    pw = K.PackedWeight.from_mlx(w, scales, n=256, k=k, mode=mode, bits=bits, group_size=gs)
    assert_same_bits(c_dequantize(pw), want, isa)
    assert_same_bits(c_dequantize(pw, 255, 1), want[255:], isa)
    assert_same_bits(K.dequantize_mlx(w, scales, n=256, k=k, mode=mode, bits=bits, group_size=gs, rows=(3, 70)),
                     want[3:70], isa)


def test_dequantize_accepts_bytes_and_flat_words() -> None:
    """The packed words as [n, words], flat, bytes or uint8; scales and biases as raw bytes with their type given."""
    w, s, b = affine_arrays(4, 64, 4, 32, "f16", seed=5)
    want = ref_dequantize(w, s, b, mode="affine", bits=4, group_size=32)
    for form in (w, w.reshape(-1), w.tobytes(), w.view(np.uint8)):
        got = K.dequantize_mlx(form, s, b, n=4, k=64, mode="affine", bits=4, group_size=32)
        assert_same_bits(got, want, type(form))
    raw = K.dequantize_mlx(w.tobytes(), s.view(np.uint8), b.view(np.uint8), n=4, k=64, mode="affine", bits=4,
                           group_size=32, scale_dtype="f16")          # raw bytes of every array, the type given
    assert_same_bits(raw, want, "raw")


# --- against mlx itself -------------------------------------------------------------------------------------------
def _mx_to_f32(mx: Any, a: Any) -> np.ndarray:
    if a.dtype == mx.bfloat16:
        return (np.array(a.view(mx.uint16)).astype(np.uint32) << 16).view(np.float32)
    return np.array(a).astype(np.float32)


def test_dequantize_matches_mlx() -> None:
    """mx.quantize'd random matrices of every mode, bits, group size and (affine) float type: dequantize_mlx gives
    mx.dequantize's bits (the fp modes with dtype=float32)."""
    mx = pytest.importorskip("mlx.core")
    rng = np.random.default_rng(7)
    n, k = 24, 512
    dtypes = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}
    checked = 0
    for mode, m in QUANT_MODES.items():
        for bits in m.bits:
            for gs in m.group_sizes:
                for st in SCALE_TYPES if mode == "affine" else ("f32",):
                    for mag in (1e-3, 1.0, 300.0):
                        x = mx.array((rng.standard_normal((n, k)) * mag).astype(np.float32)).astype(dtypes[st])
                        wq, scales, *rest = mx.quantize(x, group_size=gs, bits=bits, mode=mode)
                        biases = rest[0] if rest else None
                        fp = mode != "affine"
                        want = mx.dequantize(wq, scales, biases, group_size=gs, bits=bits, mode=mode,
                                             dtype=mx.float32 if fp else None)
                        sc = np.array(scales.view(mx.uint16)) if st == "bf16" else np.array(scales)
                        bs = None if biases is None else (
                            np.array(biases.view(mx.uint16)) if st == "bf16" else np.array(biases))
                        got = K.dequantize_mlx(np.array(wq), sc, bs, n=n, k=k, mode=mode, bits=bits, group_size=gs,
                                               scale_dtype="bf16" if st == "bf16" else None)
                        assert_same_bits(got, _mx_to_f32(mx, want), (mode, bits, gs, st, mag))
                        checked += 1
    assert checked == (7 * 3 * 3 + 3) * 3


# --- the product: the same bits everywhere ------------------------------------------------------------------------
GEMM_CASES = ([("affine", b, 64, st) for b in AFFINE_BITS for st in SCALE_TYPES]
              + [("affine", 4, 32, "f32"), ("affine", 3, 128, "f16"), ("affine", 8, 128, "bf16")]
              + [(mode, QUANT_MODES[mode].bits[0], QUANT_MODES[mode].group_sizes[0], "u8") for mode in FP_MODES])


def _all_paths(pw: K.PackedWeight, x: np.ndarray) -> dict[str, np.ndarray]:
    c = K.get_gemm("c-f32")
    out = {}
    for threads in (1, 2):
        with K.num_threads(threads):
            for m in M_SIZES:
                out[f"batch{m}/{threads}"] = c.gemm(x[:m], pw)
            out[f"rows/{threads}"] = np.concatenate([c.gemv(x[i], pw)[None] for i in range(x.shape[0])])
    return out


def _nerr(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(y - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


@pytest.mark.parametrize("mode,bits,gs,st", GEMM_CASES)
def test_gemm_same_bits_on_every_isa_batch_and_thread_count(mode: str, bits: int, gs: int, st: str,
                                                            isa: str) -> None:
    """The scalar path = every SIMD path, for decode rows (1, 2: in registers) and batches (3, 5, 17: chunks then
    tilef), and a row's bits depend neither on the batch nor on the threads. N = 67: not a multiple of the 4 rows a
    pass takes, the last row through the padded copy."""
    n, k = 67, 4 * gs + 128
    pw = mlx_weight(mode, bits, gs, st, n, k, seed=bits * 7 + gs)
    x = np.random.default_rng(bits + gs).standard_normal((max(M_SIZES), k)).astype(np.float32)
    with K.use_isa("scalar"):
        want = K.get_gemm("c-f32").gemm(x, pw)
    for name, y in _all_paths(pw, x).items():
        assert np.array_equal(y, want[: y.shape[0]]), (isa, name)
    ref = x.astype(np.float64) @ reference(pw).astype(np.float64).T
    assert _nerr(want, ref) < F32_TOL


@pytest.mark.parametrize("st", SCALE_TYPES)
@pytest.mark.parametrize("bits", [2, 4, 6, 8])
def test_gemm_with_wild_scales_same_bits(bits: int, st: str, isa: str) -> None:
    """Scales and biases over the type's whole range, inf and NaN among them (the kernels' NaN-safe roundings; bf16
    skips the NaN case only for groups whose scales and biases are all finite): the scalar path's bits, NaN == NaN."""
    n, k = 21, 256
    w, s, b = affine_arrays(n, k, bits, 64, st, seed=bits + 40, wild=True)
    pw = K.PackedWeight.from_mlx(w, s, b, n=n, k=k, mode="affine", bits=bits, group_size=64,
                                 scale_dtype="bf16" if st == "bf16" else None)
    x = np.random.default_rng(bits).standard_normal((5, k)).astype(np.float32)
    with K.use_isa("scalar"), np.errstate(all="ignore"):
        want = K.get_gemm("c-f32").gemm(x, pw)
    assert np.isnan(want).any() and np.isfinite(want).any()
    for name, y in _all_paths(pw, x).items():
        assert_same_bits(y, want[: y.shape[0]], (isa, name))


@pytest.mark.parametrize("n", [1, 3, 4, 8, 17])
def test_gemm_any_row_count(n: int, isa: str) -> None:
    """N of any size: fewer rows than a pass, exactly one or two passes (the last row then leaves its pass)."""
    for mode, bits, gs, st in (("affine", 4, 64, "f16"), ("affine", 6, 32, "f32"), ("mxfp8", 8, 32, "u8"),
                               ("nvfp4", 4, 16, "u8")):
        pw = mlx_weight(mode, bits, gs, st, n, 256, seed=n)
        x = np.random.default_rng(n).standard_normal((5, 256)).astype(np.float32)
        with K.use_isa("scalar"):
            want = K.get_gemm("c-f32").gemm(x, pw)
        for name, y in _all_paths(pw, x).items():
            assert np.array_equal(y, want[: y.shape[0]]), (isa, mode, bits, name)


def test_providers_agree() -> None:
    """The three C providers run one path (the same bits); numpy-dequant multiplies the reference dequantization."""
    pw = mlx_weight("affine", 4, 64, "bf16", 40, 512, seed=1)
    x = np.random.default_rng(1).standard_normal((6, 512)).astype(np.float32)
    ys = {p: K.get_gemm(p).gemm(x, pw) for p in ("c-q8dot", "c-f32", "c-precise", "numpy-dequant")}
    assert np.array_equal(ys["c-q8dot"], ys["c-f32"]) and np.array_equal(ys["c-precise"], ys["c-f32"])
    ref = x.astype(np.float64) @ reference(pw).astype(np.float64).T
    for p, y in ys.items():
        assert _nerr(y, ref) < F32_TOL, p
    assert pw.mlx is not None and pw.mlx.biases is not None
    assert pw.nbytes == pw.data.nbytes + pw.mlx.scales.nbytes + pw.mlx.biases.nbytes == 40 * 512 // 2 + 4 * 40 * 8
    assert_same_bits(pw.dequantize(), reference(pw))


def _documented_order(w: np.ndarray, x: np.ndarray, fused: bool = True) -> np.ndarray:
    """mlxq.c's order in NumPy: lane l sums e = l, l + 8, ... by fma (emulated in float64: a*b is exact there, the
    sum rounded once to f32), then ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)). fused=False: mul, then add."""
    m, k = x.shape
    acc = np.zeros((m, w.shape[0], 8), np.float32)
    for e in range(0, k, 8):
        p = x[:, None, e:e + 8].astype(np.float64) * w[None, :, e:e + 8].astype(np.float64)
        acc = (p + acc).astype(np.float32) if fused else p.astype(np.float32) + acc
    a = acc
    return ((a[..., 0] + a[..., 4]) + (a[..., 2] + a[..., 6])) + ((a[..., 1] + a[..., 5]) + (a[..., 3] + a[..., 7]))


@pytest.mark.parametrize("mode,bits,gs,st", [("affine", 4, 64, "f32"), ("affine", 5, 32, "bf16"),
                                             ("mxfp4", 4, 32, "u8")])
def test_scalar_path_sums_in_the_documented_order(mode: str, bits: int, gs: int, st: str) -> None:
    """The reference order itself (every ISA is compared with it above), and that the data tells it apart from
    another order (mul then add; numpy's own matmul): a kernel summing otherwise would fail these tests."""
    pw = mlx_weight(mode, bits, gs, st, 33, 512, seed=3)
    x = np.random.default_rng(3).standard_normal((4, 512)).astype(np.float32)
    wf = reference(pw)
    with K.use_isa("scalar"):
        y = K.get_gemm("c-f32").gemm(x, pw)
    assert np.array_equal(y, _documented_order(wf, x))
    assert not np.array_equal(y, _documented_order(wf, x, fused=False))
    assert not np.array_equal(y, x @ wf.T)


def test_bias_and_strides(isa: str) -> None:
    """uk_mlx_gemm with a bias and strided x (ldx > k) and y (ldy > n): y = x . W^T + bias, the rows' bits those of
    the contiguous call without bias, plus the bias."""
    n, k, ldx, ldy = 13, 192, 200, 16
    pw = mlx_weight("affine", 3, 64, "f16", n, k, seed=9)
    bias = np.random.default_rng(8).standard_normal(n).astype(np.float32)
    for m in (1, 2, 6):
        xs = np.random.default_rng(m).standard_normal((m, ldx)).astype(np.float32)
        x = np.ascontiguousarray(xs[:, :k])
        y = np.full((m, ldy), -7.0, np.float32)
        fp = ffi.cast("float *", ffi.from_buffer(xs))
        rc = lib.uk_mlx_gemm(*K.mlx_call(pw), ffi.cast("float *", ffi.from_buffer(bias)), fp, m, ldx,
                             ffi.cast("float *", ffi.from_buffer(y)), ldy)
        assert rc == 0
        plain = K.get_gemm("c-f32").gemm(x, pw)
        assert np.array_equal(y[:, :n], plain + bias), m
        assert np.all(y[:, n:] == -7.0)
        assert np.array_equal(K.get_gemm("c-f32").gemm(xs[:, :k], pw), plain)    # a strided view through IGemm


# --- reads stay inside the arrays -------------------------------------------------------------------------------
_GUARDS: list[object] = []


def _guarded(arr: np.ndarray) -> np.ndarray:
    """A copy of ``arr`` whose last byte is the last byte before an unreadable page (PROT_NONE)."""
    page = mmap.PAGESIZE
    size = (arr.nbytes + page - 1) // page * page
    buf = mmap.mmap(-1, size + page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(ctypes.c_void_p(base + size), page, 0) == 0
    out = np.frombuffer(buf, np.uint8, arr.nbytes, size - arr.nbytes).view(arr.dtype).reshape(arr.shape)
    out[...] = arr
    _GUARDS.append(buf)          # unmapped at exit only: a freed mapping under a live array would be worse
    return out


@pytest.mark.skipif(sys.platform != "linux", reason="guard pages through libc's mprotect")
@pytest.mark.parametrize("bits,gs,st", [(1, 32, "f32"), (3, 32, "bf16"), (5, 64, "f16"), (6, 32, "f32"),
                                        (4, 128, "f16"), (8, 32, "f32")])
def test_no_read_past_the_arrays(bits: int, gs: int, st: str, isa: str) -> None:
    """The packed words, scales, biases and activations each end at an unreadable page: a kernel that loads past the
    last row's bytes (8 values at a time) crashes the test."""
    for n in (5, 8):
        w, s, b = affine_arrays(n, gs, bits, gs, st, seed=bits)
        pw = K.PackedWeight.from_mlx(_guarded(w), _guarded(s), _guarded(b), n=n, k=gs, mode="affine", bits=bits,
                                     group_size=gs, scale_dtype="bf16" if st == "bf16" else None)
        x = _guarded(np.random.default_rng(0).standard_normal((4, gs)).astype(np.float32))
        want = x.astype(np.float64) @ reference(pw).astype(np.float64).T
        for m in (1, 2, 4):
            assert _nerr(K.get_gemm("c-f32").gemm(x[4 - m:], pw), want[4 - m:]) < F32_TOL
        assert_same_bits(pw.dequantize(), reference(pw))
    w8, c8 = fp_arrays(3, 32, "mxfp8", seed=1)
    pw = K.PackedWeight.from_mlx(_guarded(w8), _guarded(c8), n=3, k=32, mode="mxfp8", bits=8, group_size=32)
    assert_same_bits(pw.dequantize(), reference(pw))


# --- errors ---------------------------------------------------------------------------------------------------------
def test_layout_errors_name_what_does_not_fit() -> None:
    w, s, b = affine_arrays(4, 128, 4, 64, "f32", seed=0)
    ok: dict[str, Any] = {"n": 4, "k": 128, "mode": "affine", "bits": 4, "group_size": 64}
    cases: list[tuple[tuple[Any, ...], dict[str, Any], str]] = [
        ((w, s, b), {"mode": "int4"}, "mode 'int4'"),
        ((w, s, b), {"bits": 7}, "bits"),
        ((w, s, b), {"group_size": 16}, "group sizes"),
        ((w, s, b), {"k": 100}, "whole number of groups"),
        ((w, s, b), {"k": 0}, "k = 0"),
        ((w, s, b), {"n": -1}, "invalid weight shape"),
        ((w[:3], s, b), {}, "uint32 [4, 16]"),
        ((w.astype(np.int64), s, b), {}, "found int64"),
        ((w, s.astype(np.float64), b.astype(np.float64)), {}, "float32, float16 or bfloat16"),
        ((w, s[:3], b), {}, "found 6"),
        ((w, s, None), {}, "needs biases"),
        ((w, s, b.astype(np.float16)), {}, "scales' type"),
        ((w, s.view(np.uint32), b), {"scale_dtype": "bf16"}, "declared bf16"),
        ((w, s, b), {"mode": "mxfp4", "group_size": 32}, "uint8 codes"),
        ((w, s.view(np.uint8).reshape(-1)[:16], b), {"mode": "mxfp4", "group_size": 32}, "has no biases"),
        ((w, s, b), {"mode": "nvfp4", "group_size": 32}, "group sizes 16"),
        ((w, s, b), {"mode": "mxfp8", "bits": 4, "group_size": 32}, "bits 8"),
    ]
    for args, change, needle in cases:
        with pytest.raises(KernelError, match="mlx quantized") as exc:
            K.PackedWeight.from_mlx(*args, **{**ok, **change})
        assert needle in str(exc.value), (change, str(exc.value))
    with pytest.raises(KernelError, match=r"rows \[2, 9\)"):
        K.dequantize_mlx(w, s, b, **ok, rows=(2, 9))
    pw = K.PackedWeight.from_mlx(w, s, b, **ok)
    with pytest.raises(KernelError, match="columns"):
        K.get_gemm("c-f32").gemm(np.zeros((2, 64), np.float32), pw)


def test_c_entry_points_return_status_codes() -> None:
    """Bad arguments give UK_E_TYPE / UK_E_ARG and touch nothing (NULL pointers included): no crash."""
    n, k = 4, 128
    w, s, b = affine_arrays(n, k, 4, 64, "f32", seed=0)
    x = np.ones((2, k), np.float32)
    y, d = np.zeros((2, n), np.float32), np.zeros((n, k), np.float32)
    P = lambda a: ffi.cast("void *", ffi.from_buffer(a))             # noqa: E731
    F = lambda a: ffi.cast("float *", ffi.from_buffer(a))            # noqa: E731
    W, S, B, X, Y, D = ffi.cast("uint32_t *", ffi.from_buffer(w)), P(s), P(b), F(x), F(y), F(d)
    NULL = ffi.NULL
    good = dict(mode=lib.UK_MLX_AFFINE, bits=4, gs=64, w=W, n=n, k=k, s=S, b=B, st=lib.UK_NB_F32)

    def gemm(**kw: Any) -> int:
        a = {**good, "bias": NULL, "x": X, "m": 2, "ldx": k, "y": Y, "ldy": n, **kw}
        return int(lib.uk_mlx_gemm(a["mode"], a["bits"], a["gs"], a["w"], a["n"], a["k"], a["s"], a["b"], a["st"],
                                   a["bias"], a["x"], a["m"], a["ldx"], a["y"], a["ldy"]))

    def deq(row0: int = 0, rows: int = 1, dst: Any = D, **kw: Any) -> int:
        a = {**good, **kw}
        return int(lib.uk_mlx_dequantize(a["mode"], a["bits"], a["gs"], a["w"], a["n"], a["k"], a["s"], a["b"],
                                         a["st"], row0, rows, dst))

    assert gemm() == lib.UK_OK and deq(0, n) == lib.UK_OK
    assert np.array_equal(d, ref_dequantize(w, s, b, mode="affine", bits=4, group_size=64))
    d[...] = -1.0
    y[...] = -1.0
    E_TYPE, E_ARG = lib.UK_E_TYPE, lib.UK_E_ARG
    for kw, code in [({"mode": 4}, E_TYPE), ({"mode": -1}, E_TYPE), ({"bits": 7}, E_TYPE), ({"bits": 0}, E_TYPE),
                     ({"bits": 33}, E_TYPE), ({"st": lib.UK_NB_U8}, E_TYPE), ({"st": 9}, E_TYPE),
                     ({"mode": lib.UK_MLX_MXFP4, "gs": 32, "b": NULL}, E_TYPE),          # f32 scales for mxfp4
                     ({"mode": lib.UK_MLX_MXFP4, "gs": 32, "st": lib.UK_NB_U8}, E_ARG),  # biases for mxfp4
                     ({"gs": 16}, E_ARG), ({"gs": 48}, E_ARG), ({"gs": 0}, E_ARG), ({"gs": -64}, E_ARG),
                     ({"k": 100}, E_ARG), ({"k": 0}, E_ARG), ({"k": -64}, E_ARG), ({"n": -1}, E_ARG),
                     ({"w": NULL}, E_ARG), ({"s": NULL}, E_ARG), ({"b": NULL}, E_ARG)]:
        assert gemm(**kw) == code, kw
        assert deq(**kw) == code, kw
    for kw in ({"m": -1}, {"ldx": k - 1}, {"ldy": n - 1}, {"x": NULL}, {"y": NULL}):
        assert gemm(**kw) == E_ARG, kw
    assert gemm(m=0, x=NULL, y=NULL) == lib.UK_OK
    for row0, rows, dst in ((-1, 1, D), (0, -1, D), (3, 2, D), (0, 1, NULL), (n + 1, 0, D)):
        assert deq(row0, rows, dst) == E_ARG, (row0, rows)
    assert deq(n, 0, NULL) == lib.UK_OK
    assert np.all(y == -1.0) and np.all(d == -1.0)                    # the rejected calls wrote nothing

"""References of MLX's quantized layout (QuantizedMatMul, QuantizedEmbedding) and the one NumPy dequantization that
uaii's C kernels are tested against, bit for bit, as mlx.core.dequantize computes it (mlx 0.32):

* affine: ``w = T(T(scale * q) + bias)`` with T the scales' type: the product is rounded to T, then the sum (no
  fused multiply-add; in float32 for f16/bf16 scales, whose product with q <= 255 is exact there);
* mxfp4 / nvfp4 / mxfp8: ``w = value * scale`` with value an E2M1 (fp4) or E4M3 (fp8) code and scale an E8M0
  (``2^(c - 127)``; mlx computes it in float32, so code 255 is infinity where the OCP spec says NaN) or E4M3
  code; the product is exact in float32.

Values are returned as float32 (each one exactly the T value mlx produces for affine weights).
"""

from __future__ import annotations

import numpy as np

from uaii.ir.ops.quantized import BANK_SLOTS, BANKS, QUANT_MODES, check_layout, packed_words
from uaii.ir.reference._common import BF16, Array, RefFn, bf16_to_f32, check_index, f32_to_bf16, f64, fail, to_dtype
from uaii.ir.reference.moe import moe_experts

E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
"""The 16 E2M1 (fp4) codes: sign bit 3, two exponent bits (bias 1), one mantissa bit."""


def e4m3_values() -> Array:
    """The 256 E4M3 (fp8, OCP "fn": no infinities, S.1111.111 = NaN) codes as float32."""
    c = np.arange(256, dtype=np.int64)
    exp, man = (c >> 3) & 15, c & 7
    mag = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    mag = np.where((exp == 15) & (man == 7), np.nan, mag)
    return np.where(c & 0x80, -mag, mag).astype(np.float32)


def e8m0_values() -> Array:
    """The 256 E8M0 scale codes as float32 as mlx reads them: 2^(c - 127) (2^-127 is a float32 subnormal; 255
    overflows to infinity, mlx's value, not the NaN of the OCP spec)."""
    c = np.arange(256, dtype=np.int64)
    with np.errstate(over="ignore"):
        return np.ldexp(1.0, c - 127).astype(np.float32)


def unpack(w: Array, bits: int, k: int) -> Array:
    """Unsigned values [rows, k] of packed uint32 rows [rows, k * bits / 32] (LSB-first bit streams)."""
    w = np.ascontiguousarray(w, np.uint32)
    rows = w.shape[0]
    stream = np.unpackbits(w.astype("<u4").view(np.uint8).reshape(rows, -1), axis=1, bitorder="little")
    weights = (1 << np.arange(bits)).astype(np.int64)
    return stream[:, : k * bits].reshape(rows, k, bits).astype(np.int64) @ weights


def _round_to(x: Array, dtype: np.dtype) -> Array:
    """float32 ``x`` rounded to ``dtype`` (f32, f16 or bf16 words) and back to float32."""
    if dtype == BF16:
        return bf16_to_f32(f32_to_bf16(x))
    return x.astype(dtype).astype(np.float32)


def dequantize(w: Array, scales: Array, biases: Array | None, *, mode: str, bits: int, group_size: int,
               k: int | None = None) -> Array:
    """W [rows, k] as float32, bit-exact with mlx.core.dequantize (``dtype=float32`` for the fp modes; the scales'
    type for affine, whose values float32 holds exactly)."""
    w, scales = np.asarray(w), np.asarray(scales)
    if w.ndim != 2 or w.dtype != np.uint32:
        fail("dequantize", f"the packed weight must be 2-D uint32, found {w.dtype} {list(w.shape)}")
    rows = w.shape[0]
    k = w.shape[1] * 32 // bits if k is None else k
    problem = check_layout(mode, bits, group_size, k)
    if problem:
        fail("dequantize", problem)
    if w.shape[1] != packed_words(k, bits):
        fail("dequantize", f"{k} {bits}-bit values per row need {packed_words(k, bits)} words, found {w.shape[1]}")
    groups = k // group_size
    if scales.shape != (rows, groups):
        fail("dequantize", f"scales must have shape [{rows}, {groups}], found {list(scales.shape)}")
    m = QUANT_MODES[mode]
    q = unpack(w, bits, k)
    if m.scale != "float":
        if scales.dtype != np.uint8 or biases is not None:
            fail("dequantize", f"{mode} takes uint8 scale codes and no biases")
        table = E2M1_VALUES if m.element == "e2m1" else e4m3_values()
        scale = (e8m0_values() if m.scale == "e8m0" else e4m3_values())[scales]
        with np.errstate(invalid="ignore", over="ignore"):
            return table[q] * np.repeat(scale, group_size, axis=1)
    if biases is None or biases.shape != scales.shape or biases.dtype != scales.dtype:
        return fail("dequantize", "affine mode needs biases of the scales' shape and type")
    if scales.dtype not in (np.dtype(np.float32), np.dtype(np.float16), BF16):
        fail("dequantize", f"affine scales must be float32, float16 or bfloat16 words, found {scales.dtype}")
    s = np.repeat(f64(scales).astype(np.float32), group_size, axis=1)
    b = np.repeat(f64(biases).astype(np.float32), group_size, axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        prod = _round_to(s * q.astype(np.float32), scales.dtype)
        return _round_to(prod + b, scales.dtype)


def quantized_matmul(a: Array, w: Array, scales: Array, biases: Array | None = None, bias: Array | None = None, *,
                     K: int, N: int, mode: str, bits: int, group_size: int) -> Array:
    """Y = A @ W^T (+ bias) in float64 over the dequantized W, rounded once to float32."""
    if a.shape[-1:] != (K,):
        fail("QuantizedMatMul", f"A {list(a.shape)} must end in K = {K}")
    wf = dequantize(w, scales, biases, mode=mode, bits=bits, group_size=group_size, k=K)
    if wf.shape[0] != N:
        fail("QuantizedMatMul", f"W has {wf.shape[0]} rows; attribute N is {N}")
    y = f64(a) @ wf.astype(np.float64).T
    if bias is not None:
        if bias.shape != (N,):
            fail("QuantizedMatMul", f"bias must have shape [{N}], found {list(bias.shape)}")
        y = y + f64(bias)
    return to_dtype(y, np.dtype(np.float32))


def quantized_embedding(indices: Array, w: Array, scales: Array, biases: Array | None = None, *, dim: int,
                        mode: str, bits: int, group_size: int) -> Array:
    """The looked-up rows, dequantized (only those rows are unpacked). An id outside [0, vocab) is an error: as for
    Embedding, a token id is never relative."""
    if np.any(np.asarray(indices) < 0):
        fail("QuantizedEmbedding", f"negative token id {int(np.min(indices))}")
    idx = check_index("QuantizedEmbedding", indices, w.shape[0], "token ids")
    flat = idx.reshape(-1)
    rows = dequantize(w[flat], scales[flat], None if biases is None else biases[flat], mode=mode, bits=bits,
                      group_size=group_size, k=dim)
    return rows.reshape(*idx.shape, dim)


def dequantize_bank(w: Array, scales: Array, biases: Array | None, *, mode: str, bits: int, group_size: int) -> Array:
    """An expert bank [n_experts, rows, cols] as float32 (each expert dequantized as :func:`dequantize` does)."""
    if w.ndim != 3 or scales.ndim != 3:
        fail("QuantizedMoEExperts", f"banks are 3-D, found packed {list(w.shape)} and scales {list(scales.shape)}")
    e, rows = w.shape[:2]
    flat = dequantize(w.reshape(e * rows, -1), scales.reshape(e * rows, -1),
                      None if biases is None else biases.reshape(e * rows, -1), mode=mode, bits=bits,
                      group_size=group_size)
    return flat.reshape(e, rows, -1)


def quantized_moe_experts(x: Array, weights: Array, indices: Array, *banks: Array | None, n_experts: int, top_k: int,
                          activation: str = "silu", mode: str, bits: tuple[int, ...],
                          group_sizes: tuple[int, ...]) -> Array:
    """MoEExperts' reference over the banks dequantized (inputs in BANK_SLOTS order: values and scales of gate, up,
    down, then their biases)."""
    banks = (*banks, None, None, None)[:9]
    if len(bits) != 3 or len(group_sizes) != 3:
        fail("QuantizedMoEExperts", "bits and group_sizes hold one value per bank (gate, up, down)")
    dense = []
    for i, bank in enumerate(BANKS):
        w, s, b = (banks[slot - 3] for slot in BANK_SLOTS[bank])
        if w is None or s is None:
            return fail("QuantizedMoEExperts", f"the {bank} bank needs packed values and scales")
        dense.append(dequantize_bank(w, s, b, mode=mode, bits=int(bits[i]), group_size=int(group_sizes[i])))
    return moe_experts(x, weights, indices, *dense, n_experts=n_experts, top_k=top_k, activation=activation)


REFS: dict[str, RefFn] = {"QuantizedMatMul": quantized_matmul, "QuantizedEmbedding": quantized_embedding,
                          "QuantizedMoEExperts": quantized_moe_experts}

"""MatMulNBits reference: the weight dequantized in float64 from ONNX's block-quantized layout, then A @ W^T + bias,
rounded once to float32.

Zero points travel as they are stored: a uint8 array is the packed form (4 bits: two per byte, low nibble first,
each row padded to whole bytes), a float array (bf16 as uint16 words, the IR's convention) holds one per block.
"""

from __future__ import annotations

import numpy as np

from uaii.ir.reference._common import Array, RefFn, f64, fail, is_floatlike, to_dtype


def _values(b: Array, n: int, kb: int, bits: int, block_size: int) -> Array:
    """The quantized values [n, kb * block_size] of B [n, kb, block_size * bits / 8]."""
    blob = block_size * bits // 8
    if b.dtype != np.uint8 or b.size != n * kb * blob:
        fail("MatMulNBits", f"B must be {n * kb * blob} uint8 bytes ([{n}, {kb}, {blob}]), found {b.size} {b.dtype}")
    raw = b.reshape(n, kb * blob).astype(np.int64)
    if bits == 8:
        return raw
    return np.stack([raw & 15, raw >> 4], axis=-1).reshape(n, kb * block_size)


def _zero_points(z: Array | None, n: int, kb: int, bits: int) -> Array:
    """Per-block zero points [n, kb] in float64."""
    if z is None:
        return np.full((n, kb), float(2 ** (bits - 1)))
    if z.dtype == np.uint8:
        row = -(-kb * bits // 8)
        if z.size != n * row:
            fail("MatMulNBits", f"packed zero_points must hold {n * row} bytes, found {z.size}")
        packed = z.reshape(n, row).astype(np.int64)
        vals = packed if bits == 8 else np.stack([packed & 15, packed >> 4], axis=-1).reshape(n, 2 * row)
        return vals[:, :kb].astype(np.float64)
    if not is_floatlike(z) or z.size != n * kb:
        fail("MatMulNBits", f"float zero_points must hold {n * kb} values, found {z.size} {z.dtype}")
    return f64(z).reshape(n, kb)


def dequantize(b: Array, scales: Array, zero_points: Array | None, *, K: int, N: int, bits: int,
               block_size: int) -> Array:
    """W [N, K] in float64: (q - zero_point) * scale of the block holding each value."""
    kb = -(-K // block_size)
    if not is_floatlike(scales) or scales.size != N * kb:
        fail("MatMulNBits", f"scales must hold N * k_blocks = {N * kb} floats, found {scales.size} {scales.dtype}")
    q = _values(np.asarray(b), N, kb, bits, block_size)
    zp = np.repeat(_zero_points(zero_points, N, kb, bits), block_size, axis=1)
    scale = np.repeat(f64(scales).reshape(N, kb), block_size, axis=1)
    return ((q - zp) * scale)[:, :K]


def matmul_nbits(a: Array, b: Array, scales: Array, zero_points: Array | None = None, bias: Array | None = None, *,
                 K: int, N: int, bits: int = 4, block_size: int, accuracy_level: int = 0) -> Array:
    """Y = A @ W^T (+ bias), float32 [..., N]. ``accuracy_level`` allows a backend less exact arithmetic; the
    reference is exact at every level (it is what that arithmetic is measured against)."""
    del accuracy_level
    if a.shape[-1:] != (K,):
        fail("MatMulNBits", f"A {list(a.shape)} must end in K = {K}")
    y = f64(a) @ dequantize(b, scales, zero_points, K=K, N=N, bits=bits, block_size=block_size).T
    if bias is not None:
        if bias.shape != (N,):
            fail("MatMulNBits", f"bias must have shape [{N}], found {list(bias.shape)}")
        y = y + f64(bias)
    return to_dtype(y, np.dtype(np.float32))


REFS: dict[str, RefFn] = {"MatMulNBits": matmul_nbits}

"""ONNX's MatMulNBits weights (the com.microsoft contrib op): the block-quantized layout, checked once, and its
NumPy dequantization — the reference the C kernels (csrc/nbits.c) are tested against.

The layout, as onnxruntime's contrib-op spec defines it, for a weight W [n, k] quantized along k in blocks of
``block_size`` values (``k_blocks = ceil(k / block_size)``, the last block padded):

* ``B`` uint8 [n, k_blocks, block_size * bits / 8]; with 4 bits value 2i is the low nibble of byte i, 2i + 1 its
  high nibble;
* ``scales`` [n * k_blocks] (or [n, k_blocks]) float32, float16 or bfloat16 (raw uint16 words, as uaii carries bf16);
* ``zero_points``: absent (the default 2^(bits-1)), uint8 packed like B ([n * ceil(k_blocks * bits / 8)], each row
  padded to whole bytes), or floats [n * k_blocks];
* ``W[i, j] = (q - zero_point) * scale`` of the block holding j.

The weight stays in these bytes: :class:`uaii.kernels.PackedWeight` (``from_nbits``) wraps them without a copy and
every IGemm provider runs it (the C ones on the packed bytes, ``numpy-dequant`` through :func:`dequantize_nbits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from uaii.ir.dtype import DType
from uaii.kernels.native import KernelError, lib

NBITS = (4, 8)
BLOCK_SIZES = (16, 32, 64, 128, 256)
FLOAT_CODES: dict[DType, int] = {DType.F32: lib.UK_NB_F32, DType.F16: lib.UK_NB_F16, DType.BF16: lib.UK_NB_BF16}
"""The C codes of the scale and float zero-point types (uaii_kernels.h, UK_NB_*)."""
_FROM_NUMPY = {np.dtype(np.float32): DType.F32, np.dtype(np.float16): DType.F16, np.dtype(np.uint16): DType.BF16}


@dataclass(frozen=True)
class NBitsLayout:
    """How a MatMulNBits weight's bytes are to be read: bit width, block size, scales and zero points (the arrays
    are flat, C-contiguous, and kept as given: float32, float16, or bf16 as uint16 words)."""

    bits: int
    block_size: int
    k_blocks: int
    scales: np.ndarray
    scale_dtype: DType
    zero_points: np.ndarray | None = None
    zp_dtype: DType | None = None  # DType.U8 (packed) or the float type of float zero points

    @property
    def blob(self) -> int:
        """Bytes of one block."""
        return self.block_size * self.bits // 8

    @property
    def nbytes(self) -> int:
        """Bytes of the scales and zero points."""
        return int(self.scales.nbytes + (self.zero_points.nbytes if self.zero_points is not None else 0))

    @property
    def codes(self) -> tuple[int, int]:
        """(scale type, zero-point type) as uk_nbits_gemm takes them."""
        zt = lib.UK_NB_NONE if self.zp_dtype is None else (
            lib.UK_NB_U8 if self.zp_dtype is DType.U8 else FLOAT_CODES[self.zp_dtype])
        return FLOAT_CODES[self.scale_dtype], zt


def _float_dtype(arr: np.ndarray, given: DType | str | None, what: str) -> DType:
    dt = DType.parse(given) if given is not None else _FROM_NUMPY.get(arr.dtype)
    if dt not in FLOAT_CODES or arr.dtype != np.dtype(dt.numpy):
        raise KernelError(f"[kernels] MatMulNBits: {what} must be float32, float16 or bfloat16 (uint16 words), "
                          f"found {arr.dtype}" + (f" declared {given}" if given is not None else ""))
    return dt


def _flat(arr: Any, what: str) -> np.ndarray:
    a = np.asarray(arr)
    if not a.flags.c_contiguous:
        raise KernelError(f"[kernels] MatMulNBits: {what} must be C-contiguous")
    return a.reshape(-1)


def nbits_layout(b: Any, scales: Any, zero_points: Any = None, *, n: int, k: int, bits: int, block_size: int,
                 scale_dtype: DType | str | None = None, zp_dtype: DType | str | None = None,
                 ) -> tuple[np.ndarray, NBitsLayout]:
    """B as flat uint8 bytes and the checked layout of a [n, k] MatMulNBits weight (no copy). ``scale_dtype`` /
    ``zp_dtype``: the types when the arrays' numpy types do not say (bf16 travels as uint16 words); a uint8 zero-point
    array is the packed form. Raises KernelError naming what does not fit the layout."""
    if bits not in NBITS:
        raise KernelError(f"[kernels] MatMulNBits: bits = {bits}; supported: 4 and 8")
    if block_size not in BLOCK_SIZES:
        raise KernelError(f"[kernels] MatMulNBits: block_size = {block_size}; expected a power of two in 16..256")
    if n < 0 or k <= 0:
        raise KernelError(f"[kernels] MatMulNBits: invalid weight shape [{n}, {k}]")
    kb = -(-k // block_size)
    raw = _flat(b, "B")
    if raw.dtype != np.uint8 or raw.size != n * kb * block_size * bits // 8:
        raise KernelError(f"[kernels] MatMulNBits: B must be {n * kb * block_size * bits // 8} uint8 bytes "
                          f"([{n}, {kb}, {block_size * bits // 8}]), found {raw.size} {raw.dtype}")
    sc = _flat(scales, "scales")
    st = _float_dtype(sc, scale_dtype, "scales")
    if sc.size != n * kb:
        raise KernelError(f"[kernels] MatMulNBits: scales must hold n * k_blocks = {n * kb} values, found {sc.size}")
    zp, zt = None, None
    if zero_points is not None:
        zp = _flat(zero_points, "zero_points")
        if zp.dtype == np.uint8 and (zp_dtype is None or DType.parse(zp_dtype) is DType.U8):
            zt, need = DType.U8, n * -(-kb * bits // 8)
        else:
            zt, need = _float_dtype(zp, zp_dtype, "float zero_points"), n * kb
        if zp.size != need:
            raise KernelError(f"[kernels] MatMulNBits: {zt.value} zero_points must hold {need} values for "
                              f"[{n}, {k}] in blocks of {block_size}, found {zp.size}")
    return raw, NBitsLayout(bits, block_size, kb, sc, st, zp, zt)


def _as_f32(arr: np.ndarray, dt: DType) -> np.ndarray:
    if dt is DType.BF16:
        return (arr.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return arr.astype(np.float32)


def dequantize_nbits(b: np.ndarray, layout: NBitsLayout, n: int, k: int) -> np.ndarray:
    """W [n, k] float32: ``(float32(q - zp)) * scale`` (integer zero points) or ``(float32(q) - zp) * scale`` (float
    ones), in float32 as onnxruntime's spec writes it; the C dequantization gives the same bits."""
    kb, bs = layout.k_blocks, layout.block_size
    raw = b.reshape(n, kb * layout.blob)
    if layout.bits == 4:
        q = np.empty((n, kb * bs), np.uint8)
        q[:, 0::2], q[:, 1::2] = raw & 15, raw >> 4
    else:
        q = raw
    q = q[:, :k]
    scale = np.repeat(_as_f32(layout.scales, layout.scale_dtype).reshape(n, kb), bs, axis=1)[:, :k]
    if layout.zero_points is None or layout.zp_dtype is DType.U8:
        if layout.zero_points is None:
            zp = np.full((n, kb), 1 << (layout.bits - 1), np.int32)
        elif layout.bits == 4:
            packed = layout.zero_points.reshape(n, -1)
            zp = np.stack([packed & 15, packed >> 4], axis=-1).reshape(n, -1)[:, :kb].astype(np.int32)
        else:
            zp = layout.zero_points.reshape(n, kb).astype(np.int32)
        return (q.astype(np.int32) - np.repeat(zp, bs, axis=1)[:, :k]).astype(np.float32) * scale
    assert layout.zp_dtype is not None
    zf = np.repeat(_as_f32(layout.zero_points, layout.zp_dtype).reshape(n, kb), bs, axis=1)[:, :k]
    return (q.astype(np.float32) - zf) * scale


__all__ = ["BLOCK_SIZES", "FLOAT_CODES", "NBITS", "NBitsLayout", "dequantize_nbits", "nbits_layout"]

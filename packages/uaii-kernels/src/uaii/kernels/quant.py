"""Dequantize and quantize GGUF tensors, and gather embedding rows, in C.

``qtype`` is a :class:`uaii.ir.dtype.DType` or its lower-case GGUF name (``"q4_k"``). Dequantization is bit-exact
with ``gguf.quants.dequantize`` for every type in :data:`DEQUANT_TYPES`; any other type raises
:class:`~uaii.ir.errors.UnsupportedDType` — never wrong numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from uaii.ir.dtype import DType
from uaii.ir.errors import UnsupportedDType
from uaii.kernels.native import KernelError, check, f32, ffi, lib, ptr

DEQUANT_TYPES: frozenset[DType] = frozenset({
    DType.F32, DType.F16, DType.BF16, DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.Q8_0, DType.Q2_K,
    DType.Q3_K, DType.Q4_K, DType.Q5_K, DType.Q6_K, DType.IQ4_NL, DType.IQ4_XS, DType.MXFP4,
})
"""Types :func:`dequantize` and :func:`get_rows` accept."""

QUANT_TYPES: frozenset[DType] = frozenset({
    DType.F32, DType.F16, DType.BF16, DType.Q8_0, DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.Q4_K,
    DType.Q6_K,
})
"""Types :func:`quantize` produces."""


def as_dtype(qtype: DType | str, what: str, allowed: frozenset[DType]) -> DType:
    """Parse a qtype and check that ``what`` supports it."""
    dt = DType.parse(qtype)
    if dt not in allowed:
        raise UnsupportedDType(dt, what)
    return dt


def _type_id(dt: DType) -> int:
    assert dt.gguf_id is not None
    return dt.gguf_id


def as_bytes(raw: Any) -> np.ndarray:
    """A flat uint8 view of bytes, a buffer or a contiguous numpy array (no copy)."""
    if isinstance(raw, np.ndarray):
        if not raw.flags.c_contiguous:
            raise KernelError("[kernels] packed data must be C-contiguous")
        return raw.reshape(-1).view(np.uint8)
    return np.frombuffer(raw, dtype=np.uint8)


def _checked_out(out: np.ndarray | None, shape: tuple[int, ...], dtype: type, what: str) -> np.ndarray:
    if out is None:
        return np.empty(shape, dtype=dtype)
    if out.dtype != dtype or out.shape != shape or not out.flags.c_contiguous or not out.flags.writeable:
        raise KernelError(f"[kernels] {what}: out must be a writable C-contiguous {np.dtype(dtype).name} array of "
                          f"shape {shape}, got {out.dtype} {out.shape}")
    return out


def dequantize(raw: Any, qtype: DType | str, n_elements: int, *, out: np.ndarray | None = None) -> np.ndarray:
    """Decode ``n_elements`` values of type ``qtype`` from packed bytes into a float32 array."""
    dt = as_dtype(qtype, "dequantize", DEQUANT_TYPES)
    data = as_bytes(raw)
    need = dt.nbytes(int(n_elements))
    if data.size < need:
        raise KernelError(f"[kernels] dequantize: {n_elements} {dt.value} values need {need} bytes, got {data.size}")
    y = _checked_out(out, (int(n_elements),), np.float32, "dequantize")
    check(lib.uk_dequantize(_type_id(dt), ptr(data), f32(y), int(n_elements)), f"dequantize {dt.value}")
    return y


def _bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, nearest-even, NaN kept quiet (as ggml and gguf-py)."""
    n = x.view(np.uint32)
    n = np.where((n & 0x7FFFFFFF) > 0x7F800000, (n & np.uint32(0xFFFF0000)) | np.uint32(64 << 16), n)
    return ((n.astype(np.uint64) + (0x7FFF + ((n >> 16) & 1))) >> 16).astype(np.uint16)


def quantize(x: np.ndarray, qtype: DType | str, *, out: np.ndarray | None = None) -> np.ndarray:
    """Encode float32 values (any shape, size a whole number of blocks) into packed bytes of ``qtype``."""
    dt = as_dtype(qtype, "quantize", QUANT_TYPES)
    src = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    nbytes = dt.nbytes(src.size)
    y = _checked_out(out, (nbytes,), np.uint8, "quantize")
    if dt is DType.F32:
        y[:] = src.view(np.uint8)
    elif dt is DType.F16:
        y[:] = src.astype(np.float16).view(np.uint8)
    elif dt is DType.BF16:
        y[:] = _bf16_round(src).view(np.uint8)
    else:
        check(lib.uk_quantize(_type_id(dt), f32(src), ptr(y), src.size), f"quantize {dt.value}")
    return y


def get_rows(table: Any, qtype: DType | str, n_cols: int, ids: Any, *, out: np.ndarray | None = None) -> np.ndarray:
    """Embedding lookup: rows ``ids`` of a packed [n_rows, n_cols] table, dequantized (only those rows)."""
    dt = as_dtype(qtype, "get_rows", DEQUANT_TYPES)
    data = as_bytes(table)
    row_bytes = dt.nbytes(int(n_cols))
    n_rows = data.size // row_bytes
    idx = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    y = _checked_out(out, (idx.size, int(n_cols)), np.float32, "get_rows")
    rc = lib.uk_get_rows(_type_id(dt), ptr(data), n_rows, int(n_cols), ffi.cast("int64_t *", ffi.from_buffer(idx)),
                         idx.size, f32(y))
    if rc == -2 and idx.size and (idx.min() < 0 or idx.max() >= n_rows):
        raise KernelError(f"[kernels] get_rows: ids must lie in [0, {n_rows}), found {idx.min()}..{idx.max()}")
    check(rc, f"get_rows {dt.value}")
    return y


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The activation format of the integer GEMM path (for tests and tools): per 32 values int8 q, the scale d and
    s = d * sum(q). Returns (q int8 [k], d float32 [k/32], s float32 [k/32])."""
    src = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if src.size % 32:
        raise KernelError(f"[kernels] quantize_activations: size must be a multiple of 32, got {src.size}")
    q = np.empty(src.size, np.int8)
    d = np.empty(src.size // 32, np.float32)
    s = np.empty(src.size // 32, np.float32)
    check(lib.uk_quantize_act(f32(src), src.size, ffi.cast("int8_t *", ffi.from_buffer(q)), f32(d), f32(s)),
          "quantize_activations")
    return q, d, s


def quantize_activations16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The activation format of c-precise (uk_gemm mode 2) for Q8_0 weights (for tests and tools): per 32 values int16
    q = round-half-even(x * 32767 / amax) and the scale d = amax / 32767. Returns (q int16 [k], d float32 [k/32])."""
    src = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if src.size % 32:
        raise KernelError(f"[kernels] quantize_activations16: size must be a multiple of 32, got {src.size}")
    q = np.empty(src.size, np.int16)
    d = np.empty(src.size // 32, np.float32)
    check(lib.uk_quantize_act16(f32(src), src.size, ffi.cast("int16_t *", ffi.from_buffer(q)), f32(d)),
          "quantize_activations16")
    return q, d

"""Weights in MLX's quantized layout (``mlx.core.quantize``, mlx 0.32): the arrays checked once against the mode
table of :mod:`uaii.ir.ops.quantized`, and their dequantization by the C kernels (csrc/mlxq.c), bit-exact with
``mlx.core.dequantize`` and with the NumPy reference :func:`uaii.ir.reference.quantized.dequantize`.

A weight W [n, k] is three arrays: the packed values, uint32 [n, k * bits / 32] (each row one LSB-first bit stream),
per-group scales [n, k / group_size] and, in affine mode, biases of the scales' shape and type. Affine scales are
float32, float16 or bfloat16 (raw uint16 words, as uaii carries bf16); the fp modes (mxfp4, mxfp8, nvfp4) take uint8
scale codes and no biases.

The weight stays in these arrays: :meth:`uaii.kernels.PackedWeight.from_mlx` wraps them without a copy and every
IGemm provider runs it (the C ones through ``uk_mlx_gemm`` on the packed words, ``numpy-dequant`` through
:func:`dequantize_mlx`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from uaii.ir.dtype import DType
from uaii.ir.ops.quantized import QUANT_MODES, check_layout, packed_words
from uaii.kernels.native import KernelError, check, f32, lib, ptr

MLX_MODES: dict[str, int] = {"affine": lib.UK_MLX_AFFINE, "mxfp4": lib.UK_MLX_MXFP4, "mxfp8": lib.UK_MLX_MXFP8,
                             "nvfp4": lib.UK_MLX_NVFP4}
"""The C codes of the modes (uaii_kernels.h, UK_MLX_*)."""
SCALE_CODES: dict[DType, int] = {DType.F32: lib.UK_NB_F32, DType.F16: lib.UK_NB_F16, DType.BF16: lib.UK_NB_BF16,
                                 DType.U8: lib.UK_NB_U8}
"""The C codes of the scale types: the affine float types, uint8 codes of the fp modes."""
_FROM_NUMPY = {np.dtype(np.float32): DType.F32, np.dtype(np.float16): DType.F16, np.dtype(np.uint16): DType.BF16,
               np.dtype(np.uint8): DType.U8}
assert set(MLX_MODES) == set(QUANT_MODES), "the C modes and uaii.ir's table of modes differ"


@dataclass(frozen=True)
class MlxLayout:
    """How an MLX-quantized weight's packed words are to be read: mode, bits, group size, scales and biases (flat,
    C-contiguous, kept as given: float32, float16, bf16 as uint16 words, or uint8 codes)."""

    mode: str
    bits: int
    group_size: int
    scales: np.ndarray
    scale_dtype: DType
    biases: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the scales and biases."""
        return int(self.scales.nbytes + (self.biases.nbytes if self.biases is not None else 0))

    @property
    def codes(self) -> tuple[int, int]:
        """(mode, scale type) as uk_mlx_gemm takes them."""
        return MLX_MODES[self.mode], SCALE_CODES[self.scale_dtype]


def _fail(detail: str) -> KernelError:
    return KernelError(f"[kernels] mlx quantized: {detail}")


def _flat(arr: Any, what: str) -> np.ndarray:
    a = np.frombuffer(arr, np.uint8) if isinstance(arr, bytes | bytearray | memoryview) else np.asarray(arr)
    if not a.flags.c_contiguous:
        raise _fail(f"{what} must be C-contiguous")
    return a.reshape(-1)


def _packed(w: Any, n: int, k: int, bits: int) -> np.ndarray:
    """The packed words as a flat uint32 array over the caller's memory."""
    words = n * packed_words(k, bits)
    a = _flat(w, "the packed weight")
    if a.dtype == np.uint8 and a.size == 4 * words:
        return a.view(np.uint32)
    shape = list(np.shape(w)) if not isinstance(w, bytes | bytearray | memoryview) else [a.size]
    if a.dtype != np.uint32 or a.size != words or len(shape) not in (1, 2) or (len(shape) == 2 and shape[0] != n):
        raise _fail(f"the packed weight of [{n}, {k}] {bits}-bit values must be uint32 [{n}, {packed_words(k, bits)}]"
                    f" (or {4 * words} bytes), found {a.dtype} {shape}")
    return a


def _typed(arr: np.ndarray, given: DType | str | None, mode: str, what: str) -> tuple[np.ndarray, DType]:
    """The flat scales (or biases) and their type: the array's numpy type or ``given`` (then raw bytes are viewed as
    that type, no copy)."""
    codes = QUANT_MODES[mode].scale != "float"
    dt = DType.parse(given) if given is not None else _FROM_NUMPY.get(arr.dtype)
    ok = dt is DType.U8 if codes else dt in (DType.F32, DType.F16, DType.BF16)
    if ok and dt is not None and arr.dtype == np.uint8 and dt is not DType.U8 and arr.size % dt.numpy.itemsize == 0:
        arr = arr.view(dt.numpy)
    if not ok or dt is None or arr.dtype != np.dtype(dt.numpy):
        want = "uint8 codes" if codes else "float32, float16 or bfloat16 (uint16 words)"
        raise _fail(f"{mode} {what} must be {want}, found {arr.dtype}"
                    + (f" declared {DType.parse(given).value}" if given is not None else ""))
    return arr, dt


def mlx_layout(w: Any, scales: Any, biases: Any = None, *, n: int, k: int, mode: str, bits: int, group_size: int,
               scale_dtype: DType | str | None = None) -> tuple[np.ndarray, MlxLayout]:
    """The packed words as flat uint32 and the checked layout of a [n, k] weight (no copy). ``w``: uint32 [n,
    k * bits / 32] (or flat), or its raw bytes; ``scale_dtype`` where the scales' numpy type does not say (bf16 as
    uint16 words). Raises KernelError naming what does not fit."""
    if mode not in QUANT_MODES:
        raise _fail(f"mode {mode!r} is not one of {', '.join(QUANT_MODES)}")
    problem = check_layout(mode, bits, group_size, k) if k > 0 else f"k = {k} values per row"
    if problem or n < 0:
        raise _fail(problem or f"invalid weight shape [{n}, {k}]")
    packed = _packed(w, n, k, bits)
    groups = n * (k // group_size)
    sc, st = _typed(_flat(scales, "scales"), scale_dtype, mode, "scales")
    if sc.size != groups:
        raise _fail(f"scales of [{n}, {k}] in groups of {group_size} must hold [{n}, {k // group_size}] = {groups} "
                    f"values, found {sc.size}")
    bs = None
    if QUANT_MODES[mode].has_biases:
        if biases is None:
            raise _fail(f"{mode} needs biases [{n}, {k // group_size}] of the scales' type")
        bs = _flat(biases, "biases")
        if bs.dtype == np.uint8 and bs.size % sc.itemsize == 0:          # raw bytes: the scales' type
            bs = bs.view(sc.dtype)
        if bs.dtype != sc.dtype or bs.size != groups:
            raise _fail(f"biases must be {groups} values of the scales' type {sc.dtype}, found {bs.size} {bs.dtype}")
    elif biases is not None:
        raise _fail(f"{mode} has no biases")
    return packed, MlxLayout(mode, bits, group_size, sc, st, bs)


def dequantize_mlx(w: Any, scales: Any, biases: Any = None, *, n: int, k: int, mode: str, bits: int,
                   group_size: int, scale_dtype: DType | str | None = None,
                   rows: tuple[int, int] | None = None) -> np.ndarray:
    """W [n, k] (or rows ``rows[0]`` to ``rows[1]`` - 1) as float32, bit-exact with mlx.core.dequantize: affine
    values are exactly the scales' type's (mlx's output dtype), the fp modes those of ``dtype=float32``."""
    packed, layout = mlx_layout(w, scales, biases, n=n, k=k, mode=mode, bits=bits, group_size=group_size,
                                scale_dtype=scale_dtype)
    r0, r1 = (0, n) if rows is None else (int(rows[0]), int(rows[1]))
    if not 0 <= r0 <= r1 <= n:
        raise _fail(f"rows [{r0}, {r1}) are not within the weight's {n} rows")
    out = np.empty((r1 - r0, k), np.float32)
    code, st = layout.codes
    check(lib.uk_mlx_dequantize(code, bits, group_size, ptr(packed, "uint32_t *"), n, k, ptr(layout.scales),
                                ptr(layout.biases), st, r0, r1 - r0, f32(out)),
          f"mlx dequantize {mode} {bits}-bit, groups of {group_size}, [{n}, {k}]")
    return out


__all__ = ["MLX_MODES", "SCALE_CODES", "MlxLayout", "dequantize_mlx", "mlx_layout"]

"""Element types of UAII IR: plain numeric types and every GGUF block-quantized type.

One table holds each type's block size, bytes per block and GGUF type id (``ggml_type``), so that loaders,
kernels and planners agree on how many bytes a tensor occupies without special cases. Block types are the
lower-case GGUF names (``q4_k``); the ids and sizes follow ggml.h / gguf-py's ``GGML_QUANT_SIZES``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from uaii.ir.errors import UaiiError

QK_K = 256  # super-block size of the k-quants and most i-quants


class _Layout(NamedTuple):
    block_size: int  # elements per block (1 for plain types)
    type_size: int  # bytes per block
    gguf_id: int | None  # ggml_type number, None where GGUF has no such type
    numpy: str | None  # numpy dtype string for plain types


class DType(enum.Enum):
    """An element type. The value is the canonical lower-case name used in files and on the command line."""

    # plain types
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    F64 = "f64"
    I8 = "i8"
    I16 = "i16"
    I32 = "i32"
    I64 = "i64"
    U8 = "u8"
    U32 = "u32"
    BOOL = "bool"
    # GGUF legacy block types
    Q4_0 = "q4_0"
    Q4_1 = "q4_1"
    Q5_0 = "q5_0"
    Q5_1 = "q5_1"
    Q8_0 = "q8_0"
    Q8_1 = "q8_1"
    # k-quants
    Q2_K = "q2_k"
    Q3_K = "q3_k"
    Q4_K = "q4_k"
    Q5_K = "q5_k"
    Q6_K = "q6_k"
    Q8_K = "q8_k"
    # i-quants
    IQ2_XXS = "iq2_xxs"
    IQ2_XS = "iq2_xs"
    IQ3_XXS = "iq3_xxs"
    IQ1_S = "iq1_s"
    IQ4_NL = "iq4_nl"
    IQ3_S = "iq3_s"
    IQ2_S = "iq2_s"
    IQ4_XS = "iq4_xs"
    IQ1_M = "iq1_m"
    # ternary and micro-scaling
    TQ1_0 = "tq1_0"
    TQ2_0 = "tq2_0"
    MXFP4 = "mxfp4"

    # --- table lookups -------------------------------------------------------------------------------------
    @property
    def layout(self) -> _Layout:
        return _LAYOUT[self]

    @property
    def block_size(self) -> int:
        """Elements per block; 1 for plain types."""
        return _LAYOUT[self].block_size

    @property
    def type_size(self) -> int:
        """Bytes per block (bytes per element for plain types)."""
        return _LAYOUT[self].type_size

    @property
    def gguf_id(self) -> int | None:
        return _LAYOUT[self].gguf_id

    @property
    def is_quantized(self) -> bool:
        """True for block types, whose elements cannot be addressed one by one."""
        return _LAYOUT[self].numpy is None

    @property
    def is_float(self) -> bool:
        return self in FLOAT_TYPES

    @property
    def is_integer(self) -> bool:
        return self in INTEGER_TYPES

    @property
    def numpy(self) -> np.dtype:
        """The little-endian numpy dtype of a plain type; raises for block types."""
        spec = _LAYOUT[self].numpy
        if spec is None:
            raise UaiiError(f"[dtype] {self.value} is block-quantized and has no numpy element type")
        return np.dtype(spec)

    def nbytes(self, n_elements: int) -> int:
        """Bytes needed for ``n_elements`` of this type; the count must fill whole blocks."""
        bs = self.block_size
        if n_elements < 0 or n_elements % bs:
            raise UaiiError(
                f"[dtype] {self.value} stores blocks of {bs} elements; {n_elements} elements is not a whole "
                "number of blocks")
        return n_elements // bs * self.type_size

    # --- parsing ---------------------------------------------------------------------------------------------
    @classmethod
    def parse(cls, name: str | DType) -> DType:
        """Accept a canonical name (any case) or common aliases (``float32``, ``Q4_K``, ``int64``)."""
        if isinstance(name, DType):
            return name
        key = str(name).strip().lower()
        key = _ALIASES.get(key, key)
        try:
            return cls(key)
        except ValueError:
            known = ", ".join(d.value for d in cls)
            raise UaiiError(f"[dtype] unknown dtype {name!r}; expected one of: {known}") from None

    @classmethod
    def from_gguf_id(cls, type_id: int) -> DType:
        try:
            return _BY_GGUF_ID[type_id]
        except KeyError:
            raise UaiiError(f"[dtype] unknown GGUF tensor type id {type_id}") from None

    @classmethod
    def from_numpy(cls, dtype: np.dtype | type) -> DType:
        dt = np.dtype(dtype)
        for d, lay in _LAYOUT.items():
            if lay.numpy is not None and np.dtype(lay.numpy) == dt.newbyteorder("<"):
                return d
        raise UaiiError(f"[dtype] numpy dtype {dt} has no UAII equivalent")


_LAYOUT: dict[DType, _Layout] = {
    DType.F32: _Layout(1, 4, 0, "<f4"),
    DType.F16: _Layout(1, 2, 1, "<f2"),
    DType.BF16: _Layout(1, 2, 30, "<u2"),  # numpy has no bfloat16: raw 16-bit words
    DType.F64: _Layout(1, 8, 28, "<f8"),
    DType.I8: _Layout(1, 1, 24, "i1"),
    DType.I16: _Layout(1, 2, 25, "<i2"),
    DType.I32: _Layout(1, 4, 26, "<i4"),
    DType.I64: _Layout(1, 8, 27, "<i8"),
    DType.U8: _Layout(1, 1, None, "u1"),
    DType.U32: _Layout(1, 4, None, "<u4"),
    DType.BOOL: _Layout(1, 1, None, "?"),
    DType.Q4_0: _Layout(32, 2 + 16, 2, None),
    DType.Q4_1: _Layout(32, 2 + 2 + 16, 3, None),
    DType.Q5_0: _Layout(32, 2 + 4 + 16, 6, None),
    DType.Q5_1: _Layout(32, 2 + 2 + 4 + 16, 7, None),
    DType.Q8_0: _Layout(32, 2 + 32, 8, None),
    # ggml's block_q8_1 is {half d; half s; int8 qs[32]} = 36 bytes; gguf-py's table says 40 (never stored in files).
    DType.Q8_1: _Layout(32, 2 + 2 + 32, 9, None),
    DType.Q2_K: _Layout(QK_K, 2 + 2 + QK_K // 16 + QK_K // 4, 10, None),
    DType.Q3_K: _Layout(QK_K, 2 + QK_K // 4 + QK_K // 8 + 12, 11, None),
    DType.Q4_K: _Layout(QK_K, 2 + 2 + QK_K // 2 + 12, 12, None),
    DType.Q5_K: _Layout(QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12, 13, None),
    DType.Q6_K: _Layout(QK_K, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16, 14, None),
    DType.Q8_K: _Layout(QK_K, 4 + QK_K + QK_K // 8, 15, None),
    DType.IQ2_XXS: _Layout(QK_K, 2 + QK_K // 4, 16, None),
    DType.IQ2_XS: _Layout(QK_K, 2 + QK_K // 4 + QK_K // 32, 17, None),
    DType.IQ3_XXS: _Layout(QK_K, 2 + QK_K // 4 + QK_K // 8, 18, None),
    DType.IQ1_S: _Layout(QK_K, 2 + QK_K // 8 + QK_K // 16, 19, None),
    DType.IQ4_NL: _Layout(32, 2 + 16, 20, None),
    DType.IQ3_S: _Layout(QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4, 21, None),
    DType.IQ2_S: _Layout(QK_K, 2 + QK_K // 4 + QK_K // 16, 22, None),
    DType.IQ4_XS: _Layout(QK_K, 2 + 2 + QK_K // 2 + QK_K // 64, 23, None),
    DType.IQ1_M: _Layout(QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32, 29, None),
    DType.TQ1_0: _Layout(QK_K, 2 + 4 * 13, 34, None),
    DType.TQ2_0: _Layout(QK_K, 2 + 64, 35, None),
    DType.MXFP4: _Layout(32, 1 + 16, 39, None),
}
assert set(_LAYOUT) == set(DType), "every DType needs a layout row"

_BY_GGUF_ID = {lay.gguf_id: d for d, lay in _LAYOUT.items() if lay.gguf_id is not None}

_ALIASES = {
    "float32": "f32", "float": "f32", "fp32": "f32", "float16": "f16", "half": "f16", "fp16": "f16",
    "bfloat16": "bf16", "float64": "f64", "double": "f64", "int8": "i8", "int16": "i16", "int32": "i32",
    "int64": "i64", "uint8": "u8", "uint32": "u32", "bool_": "bool",
}

FLOAT_TYPES = frozenset({DType.F32, DType.F16, DType.BF16, DType.F64})
INTEGER_TYPES = frozenset({DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U32})
PLAIN_TYPES = frozenset(d for d in DType if not d.is_quantized)
QUANTIZED_TYPES = frozenset(d for d in DType if d.is_quantized)

Dim = int | str
"""A dimension: a non-negative int, or a symbolic name such as ``"seq"`` or ``"past"``."""


def is_symbolic(shape: Sequence[Dim]) -> bool:
    return any(isinstance(d, str) for d in shape)


def num_elements(shape: Sequence[Dim]) -> int:
    """Element count of a fully static shape."""
    if is_symbolic(shape):
        raise UaiiError(f"[dtype] shape {list(shape)} has symbolic dimensions; its size is not known")
    return math.prod(int(d) for d in shape)


def tensor_nbytes(dtype: DType, shape: Sequence[Dim]) -> int:
    """Bytes of a static tensor; block types need the innermost dimension to be a whole number of blocks."""
    if dtype.is_quantized and shape:
        inner = shape[-1]
        if isinstance(inner, int) and inner % dtype.block_size:
            raise UaiiError(
                f"[dtype] {dtype.value} needs the innermost dimension to be a multiple of {dtype.block_size}, "
                f"found {inner}")
    return dtype.nbytes(num_elements(shape))

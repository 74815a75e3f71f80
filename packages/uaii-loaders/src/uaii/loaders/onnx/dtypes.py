"""ONNX element types (``TensorProto.DataType``) <-> :class:`uaii.ir.DType` and numpy: one table.

Each row says how ONNX stores a type — its bits per element in ``raw_data``, the typed field that holds it
otherwise and the range that field's entries may take — and what UAII makes of it. Types UAII has no element
type for are handled in one of two ways:

- ``uint16`` / ``uint64`` have numpy types: small ones are materialized (``OnnxFile.inline``), none is a weight.
- ``int4`` / ``uint4`` stay packed (two values per byte, low nibble first, as ONNX stores them) and are indexed as
  ``u8`` bytes of shape ``[nbytes]``; :func:`unpack` gives the values (int8 / uint8) in their logical shape.

Strings, complex numbers and the 8/6/4/2-bit float and 2-bit integer types are refused with their name.
The numbers are onnx.proto's (fixed by the standard); tests check them against the installed ``onnx``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from uaii.ir import DType

from .proto import (
    DOUBLE_DATA,
    FLOAT_DATA,
    INT32_DATA,
    INT64_DATA,
    TYPED_FIELDS,
    UINT64_DATA,
    count_varints,
    decode_varints,
)


@dataclass(frozen=True, slots=True)
class OnnxType:
    code: int
    name: str  # onnx.proto's enum name, lower case
    dtype: DType | None  # UAII type of the stored bytes (u8 for packed 4-bit); None: no UAII type
    numpy: str | None  # numpy type of the stored elements; None: unsupported
    field: int | None  # typed field that holds the values when raw_data is not used
    bits: int  # bits per element in raw_data
    lo: int = 0  # range of the typed field's entries (integer-held types)
    hi: int = 0
    refused: str = ""  # why UAII does not read it

    @property
    def packed(self) -> bool:
        """Two elements per byte (int4 / uint4)."""
        return self.bits == 4

    @property
    def supported(self) -> bool:
        return not self.refused


_B8, _B16, _B32 = (-(1 << 7), (1 << 8) - 1), (-(1 << 15), (1 << 16) - 1), (-(1 << 31), (1 << 31) - 1)
_NO_FLOAT8 = "8-bit floats have no UAII element type"

TABLE: dict[int, OnnxType] = {t.code: t for t in (
    OnnxType(0, "undefined", None, None, None, 0, refused="the element type is UNDEFINED"),
    OnnxType(1, "float", DType.F32, "<f4", FLOAT_DATA, 32),
    OnnxType(2, "uint8", DType.U8, "u1", INT32_DATA, 8, *_B8),
    OnnxType(3, "int8", DType.I8, "i1", INT32_DATA, 8, *_B8),
    OnnxType(4, "uint16", None, "<u2", INT32_DATA, 16, *_B16),
    OnnxType(5, "int16", DType.I16, "<i2", INT32_DATA, 16, *_B16),
    OnnxType(6, "int32", DType.I32, "<i4", INT32_DATA, 32, *_B32),
    OnnxType(7, "int64", DType.I64, "<i8", INT64_DATA, 64),
    OnnxType(8, "string", None, None, None, 0, refused="string tensors are not supported"),
    OnnxType(9, "bool", DType.BOOL, "?", INT32_DATA, 8, 0, 1),
    OnnxType(10, "float16", DType.F16, "<f2", INT32_DATA, 16, *_B16),
    OnnxType(11, "double", DType.F64, "<f8", DOUBLE_DATA, 64),
    OnnxType(12, "uint32", DType.U32, "<u4", UINT64_DATA, 32, 0, (1 << 32) - 1),
    OnnxType(13, "uint64", None, "<u8", UINT64_DATA, 64, 0, (1 << 64) - 1),
    OnnxType(14, "complex64", None, None, None, 64, refused="complex tensors are not supported"),
    OnnxType(15, "complex128", None, None, None, 128, refused="complex tensors are not supported"),
    OnnxType(16, "bfloat16", DType.BF16, "<u2", INT32_DATA, 16, *_B16),  # raw 16-bit words, as DType.BF16
    OnnxType(17, "float8e4m3fn", None, None, None, 8, refused=_NO_FLOAT8),
    OnnxType(18, "float8e4m3fnuz", None, None, None, 8, refused=_NO_FLOAT8),
    OnnxType(19, "float8e5m2", None, None, None, 8, refused=_NO_FLOAT8),
    OnnxType(20, "float8e5m2fnuz", None, None, None, 8, refused=_NO_FLOAT8),
    OnnxType(21, "uint4", DType.U8, "u1", INT32_DATA, 4, *_B8),  # typed: one packed byte per int32 entry
    OnnxType(22, "int4", DType.U8, "u1", INT32_DATA, 4, *_B8),
    OnnxType(23, "float4e2m1", None, None, None, 4, refused="4-bit floats have no UAII element type"),
    OnnxType(24, "float8e8m0", None, None, None, 8, refused=_NO_FLOAT8),
    OnnxType(25, "uint2", None, None, None, 2, refused="2-bit integers have no UAII element type"),
    OnnxType(26, "int2", None, None, None, 2, refused="2-bit integers have no UAII element type"),
    OnnxType(27, "float6e2m3", None, None, None, 6, refused="6-bit floats have no UAII element type"),
    OnnxType(28, "float6e3m2", None, None, None, 6, refused="6-bit floats have no UAII element type"),
)}
INT4, UINT4 = 22, 21
_BY_DTYPE = {t.dtype: t.code for t in TABLE.values() if t.dtype is not None and not t.packed}


def onnx_type(code: int) -> OnnxType | None:
    """The row of an ONNX element type number; None for a number onnx.proto does not define."""
    return TABLE.get(code)


def to_onnx(dtype: DType) -> int:
    """The ONNX element type number of a UAII element type (ValueError for block types, which ONNX lacks)."""
    code = _BY_DTYPE.get(dtype)
    if code is None:
        raise ValueError(f"ONNX has no element type for {dtype.value}")
    return code


def elements(dims: Iterable[int]) -> int:
    return math.prod(dims)


def stored_nbytes(t: OnnxType, n: int) -> int:
    """Bytes of ``n`` elements in raw_data (int4: two per byte, the last byte half used when ``n`` is odd)."""
    return (n * t.bits + 7) // 8


def stored_shape(t: OnnxType, dims: Sequence[int], nbytes: int) -> tuple[int, ...]:
    """The shape UAII indexes the stored bytes with: the dims, or ``[nbytes]`` for packed 4-bit tensors."""
    return (nbytes,) if t.packed else tuple(dims)


def decode_raw(t: OnnxType, data: bytes, dims: Sequence[int]) -> np.ndarray:
    """raw_data bytes (already checked to be ``stored_nbytes`` long) as the stored array (read-only view)."""
    assert t.numpy is not None
    if t.packed:
        return np.frombuffer(data, dtype=np.uint8)
    if t.code == 9 and data and int(np.frombuffer(data, dtype=np.uint8).max()) > 1:
        raise ValueError("a bool tensor holds a byte other than 0 and 1")
    return np.frombuffer(data, dtype=np.dtype(t.numpy)).reshape(tuple(dims))


def decode_typed(t: OnnxType, number: int, data: bytes, dims: Sequence[int]) -> np.ndarray:
    """The concatenated bytes of a typed field (packed form) as the stored array; ValueError when they lie."""
    assert t.numpy is not None
    name = TYPED_FIELDS[number]
    if number != t.field:
        want = TYPED_FIELDS[t.field] if t.field is not None else "raw_data"
        raise ValueError(f"its values are in {name}; a {t.name} tensor keeps them in {want}")
    n = elements(dims)
    want_count = stored_nbytes(t, n) if t.packed else n
    if number in (FLOAT_DATA, DOUBLE_DATA):
        width = 4 if number == FLOAT_DATA else 8
        count = len(data) // width
        if len(data) % width:
            raise ValueError(f"{name} is {len(data)} bytes, not a whole number of {width}-byte values")
    else:
        count = count_varints(data)
    if count != want_count:
        raise ValueError(f"{name} holds {count} values; a {t.name} tensor of shape {list(dims)} needs "
                         f"{want_count}")
    if number in (FLOAT_DATA, DOUBLE_DATA):
        out = np.frombuffer(data, dtype="<f4" if number == FLOAT_DATA else "<f8")
    elif number == INT64_DATA:
        out = decode_varints(data).view(np.int64)
    elif number == UINT64_DATA:
        raw = decode_varints(data)
        if raw.size and int(raw.max()) > t.hi:
            raise ValueError(f"{name} holds {int(raw.max())}, outside the range of {t.name}")
        out = raw.astype(np.dtype(t.numpy))
    else:  # int32_data: protobuf keeps the low 32 bits of each varint
        v = (decode_varints(data) & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)
        if v.size and (int(v.min()) < t.lo or int(v.max()) > t.hi):
            bad = int(v.min()) if int(v.min()) < t.lo else int(v.max())
            raise ValueError(f"{name} holds {bad}, outside [{t.lo}, {t.hi}] for {t.name}")
        if t.bits == 32:
            out = v.astype("<i4")
        elif t.bits == 16:
            out = (v & 0xFFFF).astype("<u2").view(np.dtype(t.numpy))
        else:
            out = (v & 0xFF).astype(np.uint8).view(np.dtype(t.numpy))
    return out.reshape(stored_shape(t, dims, stored_nbytes(t, n)))


def unpack(t: OnnxType, stored: np.ndarray, dims: Sequence[int]) -> np.ndarray:
    """The values of a tensor from its stored array: int4 / uint4 become int8 / uint8 of the logical shape."""
    if not t.packed:
        return stored.reshape(tuple(dims))
    n = elements(dims)
    b = stored.reshape(-1)
    out = np.empty(b.size * 2, dtype=np.uint8)
    out[0::2] = b & 0x0F
    out[1::2] = b >> 4
    out = out[:n]
    if t.code == INT4:
        return ((out.astype(np.int8) ^ 8) - 8).astype(np.int8).reshape(tuple(dims))
    return out.reshape(tuple(dims))


__all__ = ["INT4", "TABLE", "UINT4", "OnnxType", "decode_raw", "decode_typed", "elements", "onnx_type",
           "stored_nbytes", "stored_shape", "to_onnx", "unpack"]

"""Floats that JSON cannot spell: how the canonical JSON writes non-finite values, bit-exactly.

JSON has no NaN or infinity, so a non-finite float is written as a string where a number is
expected: ``"inf"``, ``"-inf"``, ``"nan"`` (the default quiet NaN, bits 0x7ff8000000000000) and
``"nan:0x<16 hex digits>"`` for any other NaN, which keeps its sign and payload. Finite floats are
JSON numbers in Python's shortest round-trip form (``repr``), which reads back to the same bits, ``-0.0`` and
subnormals included.
"""

from __future__ import annotations

import math
import re
import struct

_DEFAULT_NAN_BITS = 0x7FF8000000000000
_NAN_BITS = re.compile(r"nan:0x([0-9a-f]{16})")


def float_bits(x: float) -> int:
    return int.from_bytes(struct.pack("<d", x), "little")


def float_from_bits(bits: int) -> float:
    return float(struct.unpack("<d", bits.to_bytes(8, "little"))[0])


def float_text(x: float) -> str:
    """The string that stands for a non-finite float."""
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    bits = float_bits(x)
    return "nan" if bits == _DEFAULT_NAN_BITS else f"nan:0x{bits:016x}"


def parse_float_text(s: str) -> float | None:
    """The float a non-finite spelling stands for, or None when ``s`` is not one."""
    if s in ("inf", "+inf"):
        return math.inf
    if s == "-inf":
        return -math.inf
    if s == "nan":
        return float_from_bits(_DEFAULT_NAN_BITS)
    m = _NAN_BITS.fullmatch(s)
    if m is None:
        return None
    x = float_from_bits(int(m.group(1), 16))
    return x if math.isnan(x) else None

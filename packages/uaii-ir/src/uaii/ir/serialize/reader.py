"""Bounds-checked reading of untrusted bytes, and the 16-byte ``.uaii`` header.

Every read checks the bytes that remain first; every count is checked against the bytes that remain (times the
smallest size one item can take) before anything is allocated for it, so a lying count fails at once instead
of allocating. Failures are :class:`FormatError` with the byte offset of the field that could not be read.
"""

from __future__ import annotations

import struct
from typing import NamedTuple, NoReturn

from uaii.ir.errors import FormatError

MAGIC = b"UAIR"
HEADER = struct.Struct("<4sIII")
"""magic, codec version, IR major, IR minor."""

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_ITEM_SIZE = {"B": 1, "I": 4, "Q": 8, "q": 8, "d": 8}


class Header(NamedTuple):
    codec: int
    ir_major: int
    ir_minor: int


def read_header(data: bytes, path: str | None, component: str = "uaii") -> Header:
    if len(data) < HEADER.size:
        raise FormatError(f"file is {len(data)} bytes, shorter than the {HEADER.size}-byte .uaii header",
                          path=path, offset=len(data), component=component)
    magic, codec, major, minor = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise FormatError(f"not a .uaii file: starts with {magic!r}, expected {MAGIC!r}", path=path, offset=0,
                          component=component)
    return Header(codec, major, minor)


def pack_header(codec: int, ir_major: int, ir_minor: int) -> bytes:
    return HEADER.pack(MAGIC, codec, ir_major, ir_minor)


class ByteReader:
    """A cursor over little-endian bytes; each method names what it reads for the error message."""

    __slots__ = ("component", "data", "path", "pos")

    def __init__(self, data: bytes, *, path: str | None, component: str, pos: int = 0) -> None:
        self.data = data
        self.path = path
        self.component = component
        self.pos = pos

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def fail(self, message: str, offset: int | None = None) -> NoReturn:
        raise FormatError(message, path=self.path, offset=self.pos if offset is None else offset,
                          component=self.component)

    def take(self, n: int, what: str) -> int:
        """Reserve ``n`` bytes; returns their start offset."""
        if n > self.remaining:
            self.fail(f"truncated: {what} needs {n} bytes, only {self.remaining} left")
        start = self.pos
        self.pos += n
        return start

    def _unpack(self, st: struct.Struct, what: str) -> int:
        value: int = st.unpack_from(self.data, self.take(st.size, what))[0]
        return value

    def u8(self, what: str) -> int:
        return self._unpack(_U8, what)

    def u32(self, what: str) -> int:
        return self._unpack(_U32, what)

    def u64(self, what: str) -> int:
        return self._unpack(_U64, what)

    def i64(self, what: str) -> int:
        return self._unpack(_I64, what)

    def f64(self, what: str) -> float:
        value: float = _F64.unpack_from(self.data, self.take(8, what))[0]
        return value

    def count(self, what: str, min_item_size: int) -> int:
        """A u32 count, rejected unless that many items (each at least ``min_item_size`` bytes) can follow."""
        start = self.pos
        n = self.u32(f"count of {what}")
        if n * min_item_size > self.remaining:
            self.fail(f"count of {what} is {n}, but only {self.remaining} bytes follow (each needs at least "
                      f"{min_item_size})", start)
        return n

    def string(self, what: str) -> str:
        """A u32 length + UTF-8 bytes."""
        start = self.pos
        n = self.count(f"bytes in {what}", 1)
        begin = self.take(n, what)
        try:
            return self.data[begin:begin + n].decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(f"{what} is not valid UTF-8 ({e.reason})", begin + e.start if n else start)

    def array(self, code: str, what: str) -> list[int] | list[float]:
        """A u32 count followed by that many little-endian items of struct type ``code``."""
        size = _ITEM_SIZE[code]
        n = self.count(what, size)
        begin = self.take(n * size, what)
        return list(struct.unpack_from(f"<{n}{code}", self.data, begin))


class Locations:
    """Document path → byte offset, recorded while a binary reader builds its document (for error messages).

    An entry may carry a stride: then it marks the first item of a vector and item ``j`` of it lies at
    ``offset + j * stride``. A path without an entry resolves to its nearest recorded ancestor.
    """

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at: dict[tuple[str | int, ...], tuple[int, int]] = {}

    def mark(self, where: tuple[str | int, ...], offset: int, stride: int = 0) -> None:
        self.at[where] = (offset, stride)

    def locate(self, where: tuple[str | int, ...]) -> int | None:
        while True:
            hit = self.at.get(where)
            if hit is not None:
                return hit[0]
            if where and isinstance(where[-1], int):
                vec = self.at.get(where[:-1])
                if vec is not None and vec[1]:
                    return vec[0] + vec[1] * where[-1]
            if not where:
                return None
            where = where[:-1]

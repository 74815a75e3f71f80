"""A verifying FlatBuffers decoder for untrusted codec-2 files.

The Python flatbuffers runtime trusts every offset it reads. This module walks the buffer the way
FlatBuffers' C++ ``Verifier`` does (table, vtable, fields, strings, vectors), checking each offset, vtable
size, field extent, vector length and string terminator against the buffer before reading it, and returns
plain records. A work budget proportional to the buffer size stops buffers whose offsets share objects many
times over (a DAG that would expand to a huge tree). Alignment is not checked: Python reads unaligned values.

:data:`SCHEMA` mirrors ``schemas/uaii_ir.fbs`` field by field (slot order);
``tests/ir/test_serialize_binary.py`` checks that the two agree.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple, NoReturn

from uaii.ir.errors import FormatError

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_SIZE = {"B": 1, "?": 1, "q": 8, "Q": 8, "d": 8}


class Field(NamedTuple):
    name: str
    kind: str  # "scalar" | "string" | "vector" (of scalars) | "tables" (vector of tables)
    arg: str = ""  # struct code of a scalar or of a vector's items; the table name for "tables"

    @property
    def size(self) -> int:
        """Bytes the field takes inside its table."""
        return _SIZE[self.arg] if self.kind == "scalar" else 4


def _f(name: str, kind: str, arg: str = "") -> Field:
    return Field(name, kind, arg)


SCHEMA: dict[str, tuple[Field, ...]] = {
    "Dim": (_f("size", "scalar", "q"), _f("symbol", "string")),
    "Tensor": (_f("id", "scalar", "Q"), _f("name", "string"), _f("dtype", "scalar", "B"),
               _f("shape", "tables", "Dim"), _f("storage_hint", "scalar", "B"),
               _f("is_weight", "scalar", "?"), _f("weight_ref", "string"), _f("data", "vector", "B")),
    "Attribute": (_f("key", "string"), _f("type", "scalar", "B"), _f("s", "string"), _f("i", "scalar", "q"),
                  _f("f", "scalar", "d"), _f("b", "scalar", "?"), _f("ints", "vector", "q"),
                  _f("floats", "vector", "d")),
    "Node": (_f("id", "scalar", "Q"), _f("name", "string"), _f("op_name", "string"),
             _f("op_version", "string"), _f("inputs", "vector", "Q"), _f("outputs", "vector", "Q"),
             _f("attributes", "tables", "Attribute")),
    "MetadataEntry": (_f("key", "string"), _f("value", "string")),
    "Graph": (_f("name", "string"), _f("producer", "string"), _f("domain", "string"),
              _f("tensors", "tables", "Tensor"), _f("nodes", "tables", "Node"), _f("inputs", "vector", "Q"),
              _f("outputs", "vector", "Q"), _f("metadata", "tables", "MetadataEntry")),
}
ROOT = "Graph"


class Record(NamedTuple):
    """A decoded table: field values (absent fields are missing) and where each value starts."""

    pos: int
    values: dict[str, Any]
    at: dict[str, int]


class FlatReader:
    """Decodes one FlatBuffer. Offsets in errors are ``base`` + position in the buffer."""

    def __init__(self, buf: bytes, *, base: int, path: str | None, component: str) -> None:
        self.buf = buf
        self.n = len(buf)
        self.base = base
        self.path = path
        self.component = component
        self.budget = 4 * self.n + 4096

    def fail(self, message: str, pos: int) -> NoReturn:
        raise FormatError(message, path=self.path, offset=self.base + pos, component=self.component)

    def _need(self, pos: int, size: int, what: str) -> None:
        if pos < 0 or pos + size > self.n:
            self.fail(f"{what} at {self.base + pos:#x} (+{size} bytes) lies outside the buffer "
                      f"({self.base + self.n:#x} bytes)", max(0, min(pos, self.n)))

    def _spend(self, amount: int, pos: int) -> None:
        self.budget -= amount
        if self.budget < 0:
            self.fail("FlatBuffer references the same objects too many times (work budget exhausted)", pos)

    def root(self) -> Record:
        self._need(0, 4, "root offset")
        return self.table(ROOT, _U32.unpack_from(self.buf, 0)[0])

    def table(self, name: str, pos: int) -> Record:
        self._need(pos, 4, f"{name} table")
        vt = pos - _I32.unpack_from(self.buf, pos)[0]
        self._need(vt, 4, f"vtable of {name} table")
        vt_size, t_size = _U16.unpack_from(self.buf, vt)[0], _U16.unpack_from(self.buf, vt + 2)[0]
        if vt_size < 4 or vt_size % 2:
            self.fail(f"vtable of {name} table has invalid size {vt_size}", vt)
        self._need(vt, vt_size, f"vtable of {name} table")
        if t_size < 4:
            self.fail(f"{name} table has invalid size {t_size}", vt + 2)
        self._need(pos, t_size, f"{name} table")
        self._spend(t_size, pos)
        values: dict[str, Any] = {}
        at: dict[str, int] = {}
        for i, field in enumerate(SCHEMA[name][: (vt_size - 4) // 2]):
            fo = _U16.unpack_from(self.buf, vt + 4 + 2 * i)[0]
            if not fo:
                continue
            if fo < 4 or fo + field.size > t_size:
                self.fail(f"field {name}.{field.name} at table offset {fo} lies outside its "
                          f"{t_size}-byte table", vt + 4 + 2 * i)
            values[field.name], at[field.name] = self._field(field, pos + fo)
        return Record(pos, values, at)

    def _field(self, field: Field, fpos: int) -> tuple[Any, int]:
        if field.kind == "scalar":
            return struct.unpack_from("<" + field.arg, self.buf, fpos)[0], fpos
        target = fpos + _U32.unpack_from(self.buf, fpos)[0]
        if field.kind == "string":
            return self.string(target), target + 4
        if field.kind == "vector":
            return self.vector(field.arg, target), target + 4
        return self.tables(field.arg, target), target + 4

    def _count(self, pos: int, item_size: int, what: str) -> int:
        self._need(pos, 4, f"length of {what}")
        count: int = _U32.unpack_from(self.buf, pos)[0]
        if pos + 4 + count * item_size > self.n:
            self.fail(f"{what} claims {count} items of {item_size} bytes, but only {self.n - pos - 4} bytes "
                      "follow", pos)
        self._spend(4 + count * item_size, pos)
        return count

    def string(self, pos: int) -> str:
        length = self._count(pos, 1, "string")
        end = pos + 4 + length
        self._need(end, 1, "string terminator")
        if self.buf[end] != 0:
            self.fail("string is not zero-terminated", end)
        try:
            return self.buf[pos + 4:end].decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(f"string is not valid UTF-8 ({e.reason})", pos + 4 + e.start)

    def vector(self, code: str, pos: int) -> bytes | list[Any]:
        count = self._count(pos, _SIZE[code], "vector")
        if code == "B":
            return bytes(self.buf[pos + 4:pos + 4 + count])
        return list(struct.unpack_from(f"<{count}{code}", self.buf, pos + 4))

    def tables(self, name: str, pos: int) -> list[Record]:
        count = self._count(pos, 4, f"vector of {name}")
        items = pos + 4
        return [self.table(name, items + 4 * j + _U32.unpack_from(self.buf, items + 4 * j)[0])
                for j in range(count)]

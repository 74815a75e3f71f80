"""A bounded walker over the protobuf wire format of a raw ``.onnx`` file.

Why walk the bytes ourselves: ``onnx.load`` would parse every initializer's ``raw_data`` into memory (and refuse
files over protobuf's 2 GiB limit), and its external-data loader follows any path a file names. The walker reads
the file once (through mmap), checks every tag, length and nesting level against the bytes that remain, checks
that every ``string`` field is UTF-8 (upb hands invalid ones back as ``bytes``, which would surprise the importer)
and every closed enum holds a declared value, and meanwhile

- records each initializer's metadata (name, dims, element type, external-data entries) and the *byte ranges*
  of its data — ``raw_data`` and the typed fields (``float_data``, ``int32_data``...) — without copying them;
- emits a *stripped* serialization: the same model with every initializer's data fields, ``external_data`` and
  ``data_location`` removed (and ``training_info`` dropped), small enough for ``onnx`` to parse in full.

The message schema comes from the descriptors of the installed ``onnx`` (so fields a newer onnx adds are
checked too); fields it does not know are kept verbatim once their wire format is checked. Protobuf's merge rules
hold: a repeated occurrence of a singular scalar replaces the earlier one, of a singular message merges into it.
Nested graphs (If/Loop/Scan bodies) are walked like the main graph; their initializers are recorded as well.

Work is linear: each field is read once per nesting level and nesting is capped at :data:`MAX_DEPTH`, so a
hostile length can neither allocate nor loop; :class:`WorkCounter` counts the steps for the fuzz tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from uaii.ir import FormatError

MAX_DEPTH = 64
"""Message nesting the walker accepts (upb, onnx's parser, stops at 100). A graph costs 3 levels
(graph -> node -> attribute), so this allows subgraphs about 20 deep."""
MAX_RANK = 64
"""Dimensions an initializer may declare; no ONNX operator reads tensors of more than a handful."""

# protobuf wire types and FieldDescriptor.type numbers (stable across protobuf versions)
_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5
_TYPE_WIRE = {1: _I64, 2: _I32, 3: _VARINT, 4: _VARINT, 5: _VARINT, 6: _I64, 7: _I32, 8: _VARINT, 9: _LEN,
              11: _LEN, 12: _LEN, 13: _VARINT, 14: _VARINT, 15: _I32, 16: _I64, 17: _VARINT, 18: _VARINT}
_T_STRING, _T_MESSAGE, _T_ENUM = 9, 11, 14

# TensorProto fields the walker reads itself (numbers from onnx.proto)
TENSOR_DIMS, TENSOR_TYPE, TENSOR_SEGMENT, TENSOR_NAME, TENSOR_RAW = 1, 2, 3, 8, 9
TENSOR_EXTERNAL, TENSOR_LOCATION, TENSOR_STRINGS = 13, 14, 6
FLOAT_DATA, INT32_DATA, INT64_DATA, DOUBLE_DATA, UINT64_DATA = 4, 5, 7, 10, 11
TYPED_FIELDS = {FLOAT_DATA: "float_data", INT32_DATA: "int32_data", INT64_DATA: "int64_data",
                DOUBLE_DATA: "double_data", UINT64_DATA: "uint64_data"}
_TYPED_WIRE = {FLOAT_DATA: _I32, DOUBLE_DATA: _I64, INT32_DATA: _VARINT, INT64_DATA: _VARINT,
               UINT64_DATA: _VARINT}
_STRIPPED = frozenset({*TYPED_FIELDS, TENSOR_RAW, TENSOR_EXTERNAL, TENSOR_LOCATION, TENSOR_STRINGS})

# hooks: where the walker leaves the generic path
_DROP, _INITIALIZER, _SPARSE = 1, 2, 3
_HOOKS = {("onnx.ModelProto", 20): _DROP,  # training_info: graphs (and weights) inference never runs
          ("onnx.GraphProto", 5): _INITIALIZER, ("onnx.GraphProto", 15): _SPARSE}


class WorkLimitExceeded(RuntimeError):
    """A :class:`WorkCounter` with a limit ran past it: a bound the tests assert, not a user-facing error."""


@dataclass
class WorkCounter:
    """Deterministic work units (fields read, tensors placed, bytes scanned / 4096) of one or more opens."""

    limit: int | None = None
    steps: int = 0

    def tick(self, n: int = 1) -> None:
        self.steps += n
        if self.limit is not None and self.steps > self.limit:
            raise WorkLimitExceeded(f"work counter passed its limit of {self.limit} steps")


@dataclass(slots=True)
class TensorRecord:
    """One TensorProto as the wire has it; data fields are byte ranges ``[start, end)`` into the file."""

    offset: int  # first byte of the TensorProto's content
    name: str = ""
    data_type: int = 0
    dims: list[int] = field(default_factory=list)
    location: int = 0  # 0 DEFAULT, 1 EXTERNAL
    external: list[tuple[str, str, int]] = field(default_factory=list)  # (key, value, entry offset)
    raw: tuple[int, int] | None = None
    typed: list[tuple[int, int, int]] = field(default_factory=list)  # (field number, start, end)
    strings: bool = False
    segment: bool = False


@dataclass(slots=True)
class SparseRecord:
    offset: int
    values: TensorRecord | None = None
    indices: TensorRecord | None = None
    dims: list[int] = field(default_factory=list)


@dataclass
class Layout:
    """What the walk found: the stripped model bytes and every (sparse) initializer, in file order."""

    stripped: bytes
    initializers: list[TensorRecord]
    sparse: list[SparseRecord]
    external_attributes: bool  # some tensor in a node attribute keeps its data in an external file


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    wire: int
    packable: bool
    kind: int  # FieldDescriptor.type
    sub: str | None  # message full name
    enum: frozenset[int] | None
    hook: int


_SCHEMAS: dict[str, dict[str, dict[int, _Field]]] = {}


def _schema(root: Any) -> dict[str, dict[int, _Field]]:
    """Every message type reachable from ``root`` (a protobuf Descriptor): field number -> what it holds."""
    cached = _SCHEMAS.get(root.full_name)
    if cached is not None:
        return cached
    out: dict[str, dict[int, _Field]] = {}
    todo = [root]
    while todo:
        desc = todo.pop()
        if desc.full_name in out:
            continue
        fields: dict[int, _Field] = {}
        for fd in desc.fields:
            if fd.type not in _TYPE_WIRE:  # groups: not in onnx.proto; unknown to us, so refused on sight
                continue
            sub = fd.message_type
            if sub is not None:
                todo.append(sub)
            enum = frozenset(fd.enum_type.values_by_number) if fd.type == _T_ENUM else None
            fields[fd.number] = _Field(fd.name, _TYPE_WIRE[fd.type],
                                       fd.is_repeated and fd.type not in (_T_STRING, 12, _T_MESSAGE), fd.type,
                                       sub.full_name if sub is not None else None, enum,
                                       _HOOKS.get((desc.full_name, fd.number), 0))
        out[desc.full_name] = fields
    _SCHEMAS[root.full_name] = out
    return out


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def decode_varints(data: bytes) -> np.ndarray:
    """A packed stream of varints as uint64 (vectorized; ValueError when the stream is malformed)."""
    b = np.frombuffer(data, dtype=np.uint8)
    if not b.size:
        return np.zeros(0, dtype=np.uint64)
    ends = np.flatnonzero(b < 0x80)
    if not ends.size or ends[-1] != b.size - 1:
        raise ValueError("the last varint of the stream is cut off")
    if ends.size == b.size:
        return b.astype(np.uint64)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lens = ends - starts + 1
    if int(lens.max()) > 10:
        raise ValueError("a varint is longer than 10 bytes")
    tenth = b[ends[lens == 10]]
    if tenth.size and int(tenth.max()) > 1:
        raise ValueError("a varint does not fit in 64 bits")
    pos = np.arange(b.size, dtype=np.int64) - np.repeat(starts, lens)
    vals = (b & 0x7F).astype(np.uint64) << (pos.astype(np.uint64) * np.uint64(7))
    return np.bitwise_or.reduceat(vals, starts)


def count_varints(data: bytes) -> int:
    return int(np.count_nonzero(np.frombuffer(data, dtype=np.uint8) < 0x80))


class _Walker:
    def __init__(self, buf: Any, size: int, path: str, schema: dict[str, dict[int, _Field]],
                 counter: WorkCounter | None) -> None:
        self.buf, self.size, self.path, self.schema, self.counter = buf, size, path, schema, counter
        self.steps = 0  # fields read; handed to the counter message by message
        self.initializers: list[TensorRecord] = []
        self.sparse: list[SparseRecord] = []
        self.external_attributes = False  # a tensor outside the initializers has data_location EXTERNAL

    def fail(self, message: str, offset: int) -> NoReturn:
        raise FormatError(message, path=self.path, offset=offset, component="onnx")

    def flush(self) -> None:
        if self.counter is not None:
            steps, self.steps = self.steps, 0
            self.counter.tick(steps)

    # --- wire primitives ------------------------------------------------------------------------------------
    def varint(self, pos: int, end: int, what: str) -> tuple[int, int]:
        buf, start, result, shift = self.buf, pos, 0, 0
        while True:
            if pos >= end:
                self.fail(f"{what}: a varint is cut off by the end of its message", start)
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            if shift > 63:
                self.fail(f"{what}: a varint is longer than 10 bytes", start)
        if shift == 63 and b > 1:
            self.fail(f"{what}: a varint does not fit in 64 bits", start)
        return result, pos

    def fields(self, start: int, end: int, what: str) -> Iterator[tuple[int, int, int, int, int, int]]:
        """(number, wire type, tag offset, value start, value end, varint value) of each field in [start, end).

        One-byte tags, lengths and values (nearly all of them) take the fast path."""
        buf, pos = self.buf, start
        while pos < end:
            self.steps += 1
            tag_at = pos
            tag = buf[pos]
            if tag < 0x80:
                pos += 1
            else:
                tag, pos = self.varint(pos, end, what)
            number, wire = tag >> 3, tag & 7
            if wire == _LEN:
                if pos < end and buf[pos] < 0x80:
                    n, vstart = buf[pos], pos + 1
                else:
                    n, vstart = self.varint(pos, end, what)
                if n > end - vstart:
                    self.fail(f"{what}: field {number} says it is {n} bytes long but only {end - vstart} bytes "
                              f"remain in its message (file size {self.size:#x})", tag_at)
                pos = vstart + n
                value = 0
            elif wire == _VARINT:
                vstart = pos
                if pos < end and buf[pos] < 0x80:
                    value, pos = buf[pos], pos + 1
                else:
                    value, pos = self.varint(pos, end, what)
            elif wire in (_I64, _I32):
                vstart, value = pos, 0
                pos += 8 if wire == _I64 else 4
                if pos > end:
                    self.fail(f"{what}: field {number} needs {pos - vstart} bytes, {end - vstart} remain", tag_at)
            else:
                self.fail(f"{what}: field {number} has wire type {wire}; ONNX files use only types 0, 1, 2 "
                          "and 5 (groups are not part of onnx.proto)", tag_at)
            if not 0 < number < 1 << 29:
                self.fail(f"{what}: field number {number} is not a valid protobuf field number", tag_at)
            yield number, wire, tag_at, vstart, pos, value

    def text(self, start: int, end: int, what: str) -> str:
        try:
            return str(self.buf[start:end], "utf-8")
        except UnicodeDecodeError as exc:
            self.fail(f"{what} is not valid UTF-8 ({exc.reason})", start + exc.start)

    def wrap(self, number: int, content: bytes) -> bytes:
        return encode_varint(number << 3 | _LEN) + encode_varint(len(content)) + content

    # --- generic messages -----------------------------------------------------------------------------------
    def message(self, type_name: str, start: int, end: int, depth: int) -> list[bytes] | None:
        """Check one message; its replacement content when something inside was stripped, else None."""
        if depth > MAX_DEPTH:
            self.fail(f"messages are nested more than {MAX_DEPTH} deep ({type_name})", start)
        self.flush()
        fields = self.schema[type_name]
        out: list[bytes] | None = None
        last = start
        buf = self.buf
        for number, wire, tag_at, vs, ve, value in self.fields(start, end, type_name):
            f = fields.get(number)
            if f is None:
                continue  # unknown to this onnx: kept verbatim, as upb does
            if f.kind == _T_STRING and wire == _LEN:  # the common case, inline
                try:
                    str(buf[vs:ve], "utf-8")
                except UnicodeDecodeError:
                    self.text(vs, ve, f"{type_name}.{f.name}")
                continue
            new = self.field(type_name, f, number, wire, tag_at, vs, ve, value, depth)
            if new is not None:
                if out is None:
                    out = []
                out.append(buf[last:tag_at])
                out.append(new)
                last = ve
        if out is not None:
            out.append(buf[last:end])
        return out

    def field(self, type_name: str, f: _Field, number: int, wire: int, tag_at: int, vs: int, ve: int,
              value: int, depth: int) -> bytes | None:
        """Check one known field; its replacement bytes (tag included) when it changed, else None."""
        if wire != f.wire and not (wire == _LEN and f.packable):
            self.fail(f"{type_name}.{f.name} has wire type {wire}, expected {f.wire}", tag_at)
        if wire == _LEN and f.packable:
            self.packed(f, vs, ve, f"{type_name}.{f.name}")
        if f.kind == _T_STRING:
            self.text(vs, ve, f"{type_name}.{f.name}")
        elif f.kind == _T_ENUM and f.enum is not None:
            values = [value] if wire == _VARINT else self.packed_varints(vs, ve, f"{type_name}.{f.name}")
            for v in values:
                if _signed64(v) not in f.enum:
                    self.fail(f"{type_name}.{f.name} is {_signed64(v)}, which is not one of its enum values "
                              f"{sorted(f.enum)}", vs)
            if type_name == "onnx.TensorProto" and number == TENSOR_LOCATION and value == 1:
                self.external_attributes = True
        elif f.kind == _T_MESSAGE and f.sub is not None:
            if f.hook == _DROP:
                return b""
            if f.hook == _INITIALIZER:
                rec, content = self.tensor(vs, ve, depth + 1)
                self.initializers.append(rec)
                return self.wrap(number, content)
            if f.hook == _SPARSE:
                return self.wrap(number, self.sparse_tensor(vs, ve, depth + 1))
            sub = self.message(f.sub, vs, ve, depth + 1)
            if sub is not None:
                return self.wrap(number, b"".join(sub))
        return None

    def packed(self, f: _Field, start: int, end: int, what: str) -> None:
        """A packed repeated scalar must hold whole values: whole fixed-width ones, or varints not cut off."""
        if f.wire in (_I32, _I64):
            width = 4 if f.wire == _I32 else 8
            if (end - start) % width:
                self.fail(f"{what} is packed into {end - start} bytes, not a whole number of {width}-byte values",
                          start)
        elif end > start and self.buf[end - 1] >= 0x80:
            self.fail(f"{what}: the last packed varint is cut off", end - 1)

    def packed_varints(self, start: int, end: int, what: str) -> list[int]:
        out, pos = [], start
        while pos < end:
            self.steps += 1
            v, pos = self.varint(pos, end, what)
            out.append(v)
        return out

    # --- initializers ---------------------------------------------------------------------------------------
    def tensor(self, start: int, end: int, depth: int) -> tuple[TensorRecord, bytes]:
        """An initializer's TensorProto: its record, and its content without data fields."""
        if depth > MAX_DEPTH:
            self.fail(f"messages are nested more than {MAX_DEPTH} deep (onnx.TensorProto)", start)
        rec = TensorRecord(offset=start)
        fields = self.schema["onnx.TensorProto"]
        keep: list[bytes] = []
        what = "an initializer"  # named once the name field is read
        for number, wire, tag_at, vs, ve, value in self.fields(start, end, "onnx.TensorProto"):
            if number in TYPED_FIELDS:
                if wire != _TYPED_WIRE[number] and wire != _LEN:
                    self.fail(f"{what}: {TYPED_FIELDS[number]} has wire type {wire}", tag_at)
                rec.typed.append((number, vs, ve))
                continue
            if number == TENSOR_RAW:
                self.expect(wire, _LEN, what, "raw_data", tag_at)
                rec.raw = (vs, ve)
            elif number == TENSOR_STRINGS:
                rec.strings = True
            elif number == TENSOR_SEGMENT:
                rec.segment = True
            elif number == TENSOR_DIMS:
                if wire not in (_VARINT, _LEN):
                    self.fail(f"{what}: dims has wire type {wire}, expected 0 or 2 (packed)", tag_at)
                dims = [value] if wire == _VARINT else self.packed_varints(vs, ve, f"{what}: dims")
                for d in dims:
                    if d >= 1 << 63:
                        self.fail(f"{what}: dimension {_signed64(d)} is negative", vs)
                    rec.dims.append(d)
                if len(rec.dims) > MAX_RANK:
                    self.fail(f"{what} has more than {MAX_RANK} dimensions", vs)
            elif number == TENSOR_TYPE:
                self.expect(wire, _VARINT, what, "data_type", tag_at)
                rec.data_type = _signed64(value)
            elif number == TENSOR_NAME:
                self.expect(wire, _LEN, what, "name", tag_at)
                rec.name = self.text(vs, ve, f"{what}: name")
                what = f"initializer {rec.name!r}"
            elif number == TENSOR_LOCATION:
                self.expect(wire, _VARINT, what, "data_location", tag_at)
                if value not in (0, 1):
                    self.fail(f"{what}: data_location is {_signed64(value)}, expected 0 (DEFAULT) or 1 "
                              "(EXTERNAL)", vs)
                rec.location = value
            elif number == TENSOR_EXTERNAL:
                self.expect(wire, _LEN, what, "external_data", tag_at)
                rec.external.append(self.entry(vs, ve, f"{what}: external_data"))
            else:
                f = fields.get(number)
                new = None if f is None else self.field("onnx.TensorProto", f, number, wire, tag_at, vs, ve,
                                                        value, depth)
                keep.append(self.buf[tag_at:ve] if new is None else new)
                continue
            if number not in _STRIPPED:
                keep.append(self.buf[tag_at:ve])
        if not rec.name:
            self.fail("an initializer has no name", start)
        return rec, b"".join(keep)

    def expect(self, wire: int, want: int, what: str, name: str, at: int) -> None:
        if wire != want:
            self.fail(f"{what}: {name} has wire type {wire}, expected {want}", at)

    def entry(self, start: int, end: int, what: str) -> tuple[str, str, int]:
        """A StringStringEntryProto (key 1, value 2; the last occurrence of each wins)."""
        key = value = ""
        for number, wire, tag_at, vs, ve, _ in self.fields(start, end, what):
            if number in (1, 2):
                self.expect(wire, _LEN, what, "key" if number == 1 else "value", tag_at)
                s = self.text(vs, ve, what)
                key, value = (s, value) if number == 1 else (key, s)
        return key, value, start

    def sparse_tensor(self, start: int, end: int, depth: int) -> bytes:
        """A sparse initializer (values 1, indices 2, dims 3): recorded, data stripped like an initializer's."""
        rec = SparseRecord(offset=start)
        keep: list[bytes] = []
        for number, wire, tag_at, vs, ve, value in self.fields(start, end, "onnx.SparseTensorProto"):
            if number in (1, 2):
                self.expect(wire, _LEN, "a sparse initializer", "values" if number == 1 else "indices", tag_at)
                if (rec.values if number == 1 else rec.indices) is not None:  # protobuf would merge the two
                    self.fail(f"a sparse initializer gives its {'values' if number == 1 else 'indices'} twice", tag_at)
                t, content = self.tensor(vs, ve, depth + 1)
                if number == 1:
                    rec.values = t
                else:
                    rec.indices = t
                keep.append(self.wrap(number, content))
                continue
            if number == 3:
                if wire not in (_VARINT, _LEN):
                    self.fail(f"a sparse initializer's dims has wire type {wire}, expected 0 or 2", tag_at)
                dims = [value] if wire == _VARINT else self.packed_varints(vs, ve, "sparse initializer dims")
                rec.dims.extend(_signed64(d) for d in dims)
                if len(rec.dims) > MAX_RANK:
                    self.fail(f"a sparse initializer has more than {MAX_RANK} dimensions", vs)
            keep.append(self.buf[tag_at:ve])
        self.sparse.append(rec)
        return b"".join(keep)


def walk_model(buf: Any, size: int, path: str, model_descriptor: Any,
               counter: WorkCounter | None = None) -> Layout:
    """Walk a whole ``.onnx`` file (``buf``: bytes or an mmap of ``size`` bytes). Raises FormatError."""
    walker = _Walker(buf, size, path, _schema(model_descriptor), counter)
    content = walker.message(model_descriptor.full_name, 0, size, 0)
    walker.flush()
    stripped = bytes(buf[0:size]) if content is None else b"".join(content)
    return Layout(stripped, walker.initializers, walker.sparse, walker.external_attributes)


__all__ = ["MAX_DEPTH", "MAX_RANK", "TYPED_FIELDS", "Layout", "SparseRecord", "TensorRecord", "WorkCounter",
           "WorkLimitExceeded", "count_varints", "decode_varints", "encode_varint", "walk_model"]

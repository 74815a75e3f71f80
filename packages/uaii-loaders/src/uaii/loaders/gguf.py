"""GGUF reader: metadata, tensor infos and exact byte locations, with every count checked against the file.

The header is walked by a bounded parser: each length, count and offset is compared with the bytes that remain
before anything is allocated, so a file that lies (2^63 tensors, a 2^40-byte string, an offset past the end)
fails with a :class:`~uaii.ir.FormatError` naming the path and byte offset instead of a MemoryError, a hang or
a foreign exception. Tensor data is never read; a tensor becomes a :class:`~uaii.loaders.index.TensorInfo`.
String arrays (a vocabulary of 262,144 tokens, a merge list) become a compact
:class:`~uaii.tokenizers.string_table.StringTable` (one blob + offsets, ~3 MiB for Gemma 3) rather than a list of
``str`` (~20 MiB); numeric arrays become numpy arrays.

Versions 2 and 3, ``general.alignment`` (default 32), and split models (``name-00001-of-00003.gguf`` with the
``split.*`` keys). The ``gguf`` package (extra ``[gguf]``) is the reference: :func:`cross_check` compares this
reader with ``gguf.GGUFReader`` (the test-suite runs it on every file it writes), but the runtime path does
not need it — GGUFReader builds a numpy view per vocabulary entry (seconds for a 262k-token vocabulary) and
trusts the counts it reads.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from uaii.ir import DType, FormatError, UaiiError
from uaii.tokenizers import StringTable, release_mapped_pages, scan_gguf_strings

from .errors import require
from .index import TensorInfo

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_KEY_BYTES = 1 << 16
MAX_ALIGNMENT = 1 << 20

SUPPORTED_DTYPES = frozenset({
    DType.F32, DType.F16, DType.BF16, DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.Q8_0,
    DType.Q2_K, DType.Q3_K, DType.Q4_K, DType.Q5_K, DType.Q6_K, DType.IQ4_NL, DType.IQ4_XS, DType.MXFP4,
})
"""Tensor types the kernels implement; others are parsed (for ``inspect``) but refused by "
  ":func:`load_model`."""

# GGUF value types: id → (name, struct format, size). 8 = string, 9 = array.
_T_STRING, _T_ARRAY = 8, 9
_SCALARS: dict[int, tuple[str, str, int]] = {
    0: ("u8", "<B", 1), 1: ("i8", "<b", 1), 2: ("u16", "<H", 2), 3: ("i16", "<h", 2), 4: ("u32", "<I", 4),
    5: ("i32", "<i", 4), 6: ("f32", "<f", 4), 7: ("bool", "<B", 1), 10: ("u64", "<Q", 8),
    11: ("i64", "<q", 8), 12: ("f64", "<d", 8),
}
_NP = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
       12: "<f8"}
_SPLIT_NAME = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def _type_name(t: int) -> str:
    return _SCALARS[t][0] if t in _SCALARS else {8: "string", 9: "array"}.get(t, f"type {t}")


class _Cursor:
    """A position in a read-only buffer; every read is bounds-checked and fails with the offset."""

    def __init__(self, buf: Any, size: int, path: str) -> None:
        self.buf, self.size, self.path, self.pos = buf, size, path, 0

    def fail(self, message: str, offset: int | None = None) -> NoReturn:
        raise FormatError(message, path=self.path, offset=self.pos if offset is None else offset,
                          component="gguf")

    @property
    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.left:
            self.fail(f"{what} needs {n} bytes but only {self.left} remain (file size {self.size:#x})")

    def unpack(self, fmt: str, size: int, what: str) -> Any:
        self.need(size, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def u32(self, what: str) -> int:
        return int(self.unpack("<I", 4, what))

    def u64(self, what: str) -> int:
        return int(self.unpack("<Q", 8, what))

    def raw_string(self, what: str, limit: int | None = None) -> bytes:
        start = self.pos
        n = self.u64(f"length of {what}")
        if limit is not None and n > limit:
            self.fail(f"{what} is {n} bytes long, more than the limit of {limit}", start)
        self.need(n, what)
        data = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return data

    def text(self, what: str, limit: int | None = None) -> str:
        start = self.pos
        data = self.raw_string(what, limit)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not valid UTF-8", start)


@dataclass
class GGUFFile:
    """A parsed GGUF model (all shards of a split model). ``metadata`` comes from the first shard."""

    path: Path
    version: int
    alignment: int
    metadata: dict[str, Any]
    value_types: dict[str, str]
    tensors: dict[str, TensorInfo]
    shards: tuple[Path, ...] = ()
    data_offsets: dict[str, int] = field(default_factory=dict)  # shard path → start of its data section

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise FormatError("no 'general.architecture' string in the metadata", path=str(self.path),
                              component="gguf")
        return arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def unsupported_tensors(self) -> list[TensorInfo]:
        return [t for t in self.tensors.values() if t.dtype not in SUPPORTED_DTYPES]

    def check_supported(self) -> None:
        """Fail on the first tensor whose type the kernels do not implement, naming tensor and type."""
        bad = self.unsupported_tensors()
        if bad:
            t = bad[0]
            names = ", ".join(sorted(d.value.upper() for d in SUPPORTED_DTYPES))
            more = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
            raise FormatError(f"tensor {t.name!r} has type {t.dtype.value.upper()}, which the kernels do not "
                              f"support{more}; supported: {names}", path=str(self.path), offset=t.offset,
                              component="gguf")


# --- one file -----------------------------------------------------------------------------------------------
def _read_value(cur: _Cursor, vtype: int, key: str) -> Any:
    if vtype in _SCALARS:
        name, fmt, size = _SCALARS[vtype]
        v = cur.unpack(fmt, size, f"value of {key!r}")
        if name == "f32":  # the shortest decimal that is the same f32: 1e-06, not 9.999999974752427e-07
            return float(str(np.float32(v)))
        return bool(v) if name == "bool" else v
    if vtype == _T_STRING:
        return cur.raw_string(f"string value of {key!r}").decode("utf-8", "surrogateescape")
    if vtype == _T_ARRAY:
        start = cur.pos
        itype = cur.u32(f"item type of array {key!r}")
        count = cur.u64(f"length of array {key!r}")
        if itype in _SCALARS:
            size = _SCALARS[itype][2]
            if count > cur.left // size:
                cur.fail(f"array {key!r} claims {count} items of {size} bytes; only {cur.left} bytes remain",
                         start)
            arr = np.frombuffer(cur.buf, dtype=_NP[itype], count=count, offset=cur.pos).copy()
            release_mapped_pages(cur.buf, cur.pos, cur.pos + count * size)
            cur.pos += count * size
            return arr.astype(bool) if itype == 7 else arr
        if itype == _T_STRING:
            if count > cur.left // 8:
                cur.fail(f"array {key!r} claims {count} strings; only {cur.left} bytes remain", start)
            return _read_strings(cur, count, key)
        cur.fail(f"array {key!r} has item type {_type_name(itype)}; only arrays of scalars or strings are "
                 "supported", start)
    cur.fail(f"metadata key {key!r} has unknown value type {vtype}", cur.pos - 4)


def _read_strings(cur: _Cursor, count: int, key: str) -> StringTable:
    size = cur.size

    def fail(i: int, at: int, n: int | None) -> NoReturn:
        if n is None:
            cur.fail(f"array {key!r}: string {i} of {count} starts past the end of the file", at)
        cur.fail(f"array {key!r}: string {i} claims {n} bytes; only {size - at - 8} remain", at)

    table, cur.pos = scan_gguf_strings(cur.buf, cur.pos, count, size, fail)
    return table


def _read_header(cur: _Cursor) -> tuple[int, int, int]:
    if cur.size < 4 or bytes(cur.buf[:4]) != MAGIC:
        found = bytes(cur.buf[:4]) if cur.size else b""
        cur.fail(f"not a GGUF file: expected magic b'GGUF', found {found!r}", 0)
    cur.pos = 4
    version = cur.u32("version")
    if version not in (2, 3):
        if version & 0xFFFF == 0 and version:
            cur.fail("big-endian GGUF files are not supported", 4)
        cur.fail(f"GGUF version {version} is not supported; expected 2 or 3", 4)
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    # Smallest possible records: a KV is 8 (key length) + 4 (type) + 1 (u8 value); a tensor info is
    # 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset). Lying counts fail here, before any loop runs.
    if n_kv > cur.left // 13:
        cur.fail(f"metadata count {n_kv} cannot fit in the {cur.left} bytes that remain", 16)
    if n_tensors > (cur.left - 13 * n_kv) // 24:
        cur.fail(f"tensor count {n_tensors} cannot fit in the {cur.left} bytes that remain", 8)
    return version, n_tensors, n_kv


def _read_metadata(cur: _Cursor, n_kv: int) -> tuple[dict[str, Any], dict[str, str]]:
    meta: dict[str, Any] = {}
    types: dict[str, str] = {}
    for _ in range(n_kv):
        start = cur.pos
        key = cur.text("metadata key", MAX_KEY_BYTES)
        if key in meta:
            cur.fail(f"duplicate metadata key {key!r}", start)
        vtype = cur.u32(f"value type of {key!r}")
        meta[key] = _read_value(cur, vtype, key)
        types[key] = _type_name(vtype)
    return meta, types


def _alignment(cur: _Cursor, meta: dict[str, Any]) -> int:
    align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1) \
            or align > MAX_ALIGNMENT:
        cur.fail(f"general.alignment must be a power of two up to {MAX_ALIGNMENT}, found {align!r}", 0)
    return align


def _read_tensor_infos(cur: _Cursor, n_tensors: int) -> list[tuple[str, tuple[int, ...], DType, int, int]]:
    infos = []
    seen: set[str] = set()
    for _ in range(n_tensors):
        start = cur.pos
        name = cur.text("tensor name", MAX_KEY_BYTES)
        if name in seen:
            cur.fail(f"duplicate tensor name {name!r}", start)
        seen.add(name)
        n_dims = cur.u32(f"dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            cur.fail(f"tensor {name!r} has {n_dims} dimensions; expected 1 to {MAX_DIMS}", cur.pos - 4)
        ne = tuple(cur.u64(f"dimensions of {name!r}") for _ in range(n_dims))
        type_id = cur.u32(f"type of {name!r}")
        try:
            dtype = DType.from_gguf_id(type_id)
        except UaiiError:
            cur.fail(f"tensor {name!r} has unknown GGML type id {type_id}", cur.pos - 4)
        rel = cur.u64(f"data offset of {name!r}")
        infos.append((name, ne, dtype, rel, start))
    return infos


def _locate(cur: _Cursor, infos: list[tuple[str, tuple[int, ...], DType, int, int]], data_start: int,
            align: int) -> dict[str, TensorInfo]:
    if infos and data_start > cur.size:
        cur.fail(f"data section starts at {data_start:#x}, past the end of the file (size {cur.size:#x})",
                 data_start)
    out: dict[str, TensorInfo] = {}
    for name, ne, dtype, rel, where in infos:
        if ne[0] % dtype.block_size:
            cur.fail(f"tensor {name!r}: innermost dimension {ne[0]} is not a multiple of the "
                     f"{dtype.value} block size {dtype.block_size}", where)
        n_elements = 1
        for d in ne:
            n_elements *= d
        nbytes = n_elements // dtype.block_size * dtype.type_size
        if rel % align:
            cur.fail(f"tensor {name!r}: data offset {rel:#x} is not a multiple of the alignment {align}",
                     where)
        offset = data_start + rel
        if nbytes > cur.size or offset > cur.size - nbytes:
            cur.fail(f"tensor {name!r} ({nbytes:#x} bytes at offset {offset:#x}) runs past the end of the "
                     "file "
                     f"(size {cur.size:#x})", offset if offset < cur.size else where)
        out[name] = TensorInfo(name, dtype, tuple(reversed(ne)), cur.path, offset, nbytes)
    if out:
        _check_tiling(cur, out.values(), data_start, align)
    return out


def _describe(t: TensorInfo) -> str:
    return f"tensor {t.name!r} (type {t.dtype.value.upper()}, shape {list(t.shape)})"


def _check_tiling(cur: _Cursor, tensors: Iterable[TensorInfo], data_start: int, align: int) -> None:
    """Sorted by offset, the tensors must tile the data section as both writers lay it out.

    llama.cpp (gguf.cpp, llama-quantize) and gguf-py's GGUFWriter write each tensor at the next aligned offset
    and pad it with zero bytes up to the alignment, the last one included. GGUF has no checksums, so this is
    the only cross-check of the table: a tensor's extent follows from its declared type and shape, and a
    flipped type id or dimension (a Q4_1 tensor declared Q4_0 claims 18 bytes a block instead of 20) leaves a
    gap, an overlap or a tail here instead of loading and generating garbage. Gaps must be zeros too, which
    also catches a declared size that shrank by less than the alignment. Empty tensors hold no bytes and are
    skipped.
    """
    prev: TensorInfo | None = None
    pos = data_start
    for t in sorted((t for t in tensors if t.nbytes), key=lambda t: t.offset):
        if prev is not None and t.offset < pos:
            cur.fail(f"tensors {prev.name!r} and {t.name!r} overlap: {_describe(prev)} at offset "
                     f"{prev.offset:#x} is {prev.nbytes} bytes and ends at {prev.end:#x}, but {t.name!r} starts "
                     f"at {t.offset:#x}: the declared type or shape of one of them does not match the data",
                     t.offset)
        _check_gap(cur, prev, pos, t, align)
        prev, pos = t, t.end
    _check_gap(cur, prev, pos, None, align)


def _check_gap(cur: _Cursor, prev: TensorInfo | None, start: int, nxt: TensorInfo | None, align: int) -> None:
    """The bytes between ``prev`` (or the start of the data section) and ``nxt`` (or the end of the file)."""
    end = cur.size if nxt is None else nxt.offset
    gap = end - start
    if gap < align and not any(bytes(cur.buf[start:end])):
        return
    why = f"more than the {align - 1} bytes of padding" if gap >= align else "padding is zeros, these are not"
    if prev is None:
        assert nxt is not None
        cur.fail(f"the data section starts at {start:#x} but the first tensor, {_describe(nxt)}, starts at "
                 f"{nxt.offset:#x} ({gap} bytes later; {why}): the tensor table does not match the data", start)
    head = f"{_describe(prev)} at offset {prev.offset:#x} is {prev.nbytes} bytes"
    if nxt is None:
        cur.fail(f"{head} and ends at {start:#x}, but the file goes on for {gap} more bytes (size {cur.size:#x}; "
                 f"{why}): the declared type or shape does not match the data", start)
    cur.fail(f"{head}, but the next tensor, {nxt.name!r}, starts at {nxt.offset:#x} ({gap} bytes after its end; "
             f"{why}): the declared type or shape does not match the data", start)


@dataclass
class _Parsed:
    version: int
    alignment: int
    metadata: dict[str, Any]
    types: dict[str, str]
    tensors: dict[str, TensorInfo]
    data_start: int


def parse_file(path: str | os.PathLike[str]) -> _Parsed:
    """Parse one GGUF file (one shard). Raises FormatError on anything malformed."""
    p = str(Path(path).resolve())
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise FormatError("empty file; expected a GGUF header", path=p, offset=0, component="gguf")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return _parse(_Cursor(mm, size, p))
    except UaiiError:
        raise
    except OSError as exc:
        raise FormatError(f"cannot read: {exc.strerror or exc}", path=p, component="gguf") from None
    except (struct.error, ValueError, OverflowError, MemoryError, RecursionError) as exc:  # defence in depth
        raise FormatError(f"malformed GGUF file: {exc}", path=p, component="gguf") from None


def parse_bytes(data: bytes, path: str = "<bytes>") -> _Parsed:
    """Parse a GGUF image held in memory (tests, fuzzing); tensor offsets are relative to ``data``."""
    try:
        if not data:
            raise FormatError("empty file; expected a GGUF header", path=path, offset=0, component="gguf")
        return _parse(_Cursor(data, len(data), path))
    except UaiiError:
        raise
    except (struct.error, ValueError, OverflowError, MemoryError, RecursionError) as exc:
        raise FormatError(f"malformed GGUF file: {exc}", path=path, component="gguf") from None


def _parse(cur: _Cursor) -> _Parsed:

    version, n_tensors, n_kv = _read_header(cur)
    meta, types = _read_metadata(cur, n_kv)
    align = _alignment(cur, meta)
    infos = _read_tensor_infos(cur, n_tensors)
    data_start = -(-cur.pos // align) * align
    tensors = _locate(cur, infos, data_start, align)
    return _Parsed(version, align, meta, types, tensors, data_start)


# --- split models -------------------------------------------------------------------------------------------
def shard_paths(path: Path, count: int) -> list[Path]:
    m = _SPLIT_NAME.match(path.name)
    if m is None:
        raise FormatError(f"metadata says the model is split in {count} files, but the file name does not "
                          "follow '<name>-00001-of-0000N.gguf'", path=str(path), component="gguf")
    if int(m.group("count")) != count:  # checked before a list of `count` names is built
        raise FormatError(f"split.count is {count}, but the file name says {int(m.group('count'))} shards",
                          path=str(path), component="gguf")
    stem = m.group("stem")
    return [path.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _split_int(parsed: _Parsed, key: str, path: Path) -> int | None:
    v = parsed.metadata.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise FormatError(f"{key} must be a non-negative integer, found {v!r}", path=str(path),
                          component="gguf")
    return int(v)


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Open a GGUF model; for a split model any shard may be named, and all shards are opened."""
    first = Path(path).resolve()
    parsed = parse_file(first)
    count = _split_int(parsed, "split.count", first) or 1
    if count <= 1:
        return GGUFFile(first, parsed.version, parsed.alignment, parsed.metadata, parsed.types,
                        parsed.tensors, (first,), {str(first): parsed.data_start})
    paths = shard_paths(first, count)
    if paths[0] != first:
        parsed = parse_file(paths[0]) if paths[0].exists() else parsed
        first = paths[0]
    tensors: dict[str, TensorInfo] = {}
    data_offsets: dict[str, int] = {}
    expected_total = _split_int(parsed, "split.tensors.count", first)
    for i, shard in enumerate(paths):
        if not shard.is_file():
            raise FormatError(f"shard {i + 1} of {count} is missing: {shard.name}", path=str(first),
                              component="gguf")
        part = parsed if shard == first else parse_file(shard)
        no, cnt = _split_int(part, "split.no", shard), _split_int(part, "split.count", shard)
        if no != i or cnt != count:
            raise FormatError(f"shard metadata says split.no={no}, split.count={cnt}; its name says {i} of "
                              f"{count}", path=str(shard), component="gguf")
        for name, info in part.tensors.items():
            if name in tensors:
                raise FormatError(f"tensor {name!r} appears in two shards", path=str(shard),
                                  offset=info.offset, component="gguf")
            tensors[name] = info
        data_offsets[str(shard)] = part.data_start
    if expected_total is not None and expected_total != len(tensors):
        raise FormatError(f"split.tensors.count says {expected_total} tensors; the shards hold "
                          f"{len(tensors)}",
                          path=str(first), component="gguf")
    return GGUFFile(first, parsed.version, parsed.alignment, parsed.metadata, parsed.types, tensors,
                    tuple(paths), data_offsets)


def is_gguf(path: str | os.PathLike[str]) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


# --- reference check ----------------------------------------------------------------------------------------
def cross_check(path: str | os.PathLike[str]) -> list[str]:
    """Compare this reader with ``gguf.GGUFReader`` on one (already validated) file; returns the differences.

    Needs the ``[gguf]`` extra. Use it on files that :func:`open_gguf` accepted: GGUFReader itself has no
    guards.

    """
    gguf = require("gguf", "gguf", "cross-checking GGUF files")
    ours = parse_file(path)
    ref = gguf.GGUFReader(str(path))
    diffs: list[str] = []
    note: Callable[[str], None] = diffs.append
    if ref.data_offset != ours.data_start:
        note(f"data offset {ours.data_start} != {ref.data_offset}")
    for key, fld in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        if key not in ours.metadata:
            note(f"missing key {key}")
            continue
        mine, theirs = ours.metadata[key], fld.contents()
        if isinstance(mine, np.ndarray | StringTable):
            mine = mine.tolist()
        if mine != theirs and not (isinstance(theirs, float) and np.float32(theirs) == np.float32(mine)):
            note(f"key {key}: {str(mine)[:60]} != {str(theirs)[:60]}")
    for t in ref.tensors:
        info = ours.tensors.get(t.name)
        if info is None:
            note(f"missing tensor {t.name}")
        elif (info.offset, info.nbytes, info.dtype.gguf_id, info.shape) != (
                t.data_offset, t.n_bytes, int(t.tensor_type), tuple(reversed(t.shape.tolist()))):
            note(f"tensor {t.name}: {info} differs from offset={t.data_offset} nbytes={t.n_bytes}")
    if len(ref.tensors) != len(ours.tensors):
        note(f"{len(ours.tensors)} tensors != {len(ref.tensors)}")
    return diffs


__all__ = ["DEFAULT_ALIGNMENT", "SUPPORTED_DTYPES", "GGUFFile", "cross_check", "is_gguf", "open_gguf",
           "parse_bytes", "parse_file", "shard_paths"]


"""Read the key/value metadata of a GGUF file, fast, and stop before the tensor table.

`gguf.GGUFReader` maps every field of every tensor and takes seconds on a 262k-token vocabulary; a tokenizer only
needs the key/value section, so this reader walks it once with `struct` (and numpy for numeric arrays) and reports a
truncated or corrupt file as a `TokenizerFormatError` with the byte offset where decoding failed. String arrays
(tokens, merges) become compact `StringTable`s, never lists of `str`. The value-type numbers are GGUF's own; the
`gguf` package is not imported: importing it alone costs ~5 MiB of RSS.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any, Literal, NoReturn

import numpy as np

from uaii.tokenizers.errors import TokenizerError, TokenizerFormatError
from uaii.tokenizers.string_table import StringTable, release_mapped_pages, scan_gguf_strings

GGUF_MAGIC = 0x46554747    # b"GGUF" read as a little-endian u32
_STRING, _ARRAY = 8, 9     # GGUF value types; the others are the scalars below
_SCALAR: dict[int, tuple[str, type[np.generic]]] = {
    0: ("B", np.uint8), 1: ("b", np.int8), 2: ("H", np.uint16), 3: ("h", np.int16), 4: ("I", np.uint32),
    5: ("i", np.int32), 6: ("f", np.float32), 7: ("?", np.bool_), 10: ("Q", np.uint64), 11: ("q", np.int64),
    12: ("d", np.float64),
}
_MAX_KV = 1 << 20          # a sane upper bound: real files have tens of keys
_MAX_ARRAY = 1 << 28       # elements in one array


class _Cursor:
    """A bounds-checked reader over the mapped file; every failure names the path and the offset."""

    def __init__(self, buf: mmap.mmap | bytes, path: str, endian: Literal["<", ">"]) -> None:
        self.buf, self.path, self.end, self.pos = buf, path, len(buf), 0
        self.e: Literal["<", ">"] = endian

    def fail(self, what: str, at: int | None = None) -> TokenizerFormatError:
        return TokenizerFormatError(what, path=self.path, offset=self.pos if at is None else at)

    def take(self, n: int, what: str) -> int:
        at = self.pos
        if n < 0 or at + n > self.end:
            raise self.fail(f"{what} needs {n} bytes but the file ends at {self.end:#x}; truncated GGUF", at)
        self.pos = at + n
        return at

    def scalar(self, fmt: str, what: str) -> Any:
        size = struct.calcsize(fmt)
        at = self.take(size, what)
        return struct.unpack_from(self.e + fmt, self.buf, at)[0]

    def string(self, what: str) -> str:
        n = self.scalar("Q", f"length of {what}")
        at = self.take(n, what)
        return _text(bytes(self.buf[at:at + n]))

    def string_array(self, count: int, what: str) -> StringTable:
        e = self.end

        def fail(i: int, at: int, n: int | None) -> NoReturn:
            if n is None:
                raise self.fail(f"{what}[{i}] length runs past end of file (size {e:#x}); truncated GGUF", at)
            raise self.fail(f"{what}[{i}] of {n} bytes runs past end of file (size {e:#x}); truncated GGUF", at)

        if count > (e - self.pos) // 8:
            raise self.fail(f"{what} claims {count} strings; only {e - self.pos} bytes remain; truncated GGUF")
        table, self.pos = scan_gguf_strings(self.buf, self.pos, count, e, fail, self.e)
        return table


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        # Keep the bytes (a vocabulary may hold partial UTF-8); surrogateescape round-trips them.
        return raw.decode("utf-8", errors="surrogateescape")


def _value(cur: _Cursor, vtype: int, key: str) -> Any:
    if vtype == _STRING:
        return cur.string(f"value of '{key}'")
    if vtype == _ARRAY:
        at = cur.pos
        etype = cur.scalar("I", f"element type of '{key}'")
        count = cur.scalar("Q", f"length of '{key}'")
        if count > _MAX_ARRAY:
            raise cur.fail(f"array '{key}' claims {count} elements; corrupt GGUF", at)
        if etype == _STRING:
            return cur.string_array(count, f"'{key}'")
        if etype in _SCALAR:
            dtype = np.dtype(_SCALAR[etype][1]).newbyteorder(cur.e)
            start = cur.take(count * dtype.itemsize, f"array '{key}'")
            arr = np.frombuffer(cur.buf, dtype=dtype, count=count, offset=start).astype(dtype.newbyteorder("="))
            release_mapped_pages(cur.buf, start, cur.pos)
            return arr
        if etype == _ARRAY:
            return [_value(cur, _ARRAY, f"{key}[{i}]") for i in range(count)]
        raise cur.fail(f"array '{key}' has unknown element type {etype}", at)
    if vtype in _SCALAR:
        return cur.scalar(_SCALAR[vtype][0], f"value of '{key}'")
    raise cur.fail(f"key '{key}' has unknown value type {vtype}; corrupt GGUF", cur.pos - 4)


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Return the key/value metadata of the GGUF file at `path` (strings, numbers, numpy arrays, string tables)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise TokenizerFormatError(f"file of {size} bytes is too small for a GGUF header", path=path,
                                           offset=0)
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(buf, path)
    except FileNotFoundError:
        raise TokenizerError(f"{path}: no such file") from None
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read ({exc.strerror})") from None


def _parse(buf: mmap.mmap, path: str) -> dict[str, Any]:
    (magic,) = struct.unpack_from("<I", buf, 0)
    if magic != GGUF_MAGIC:
        raise TokenizerFormatError(f"not a GGUF file (magic {bytes(buf[:4])!r}, expected b'GGUF')",
                                   path=path, offset=0)
    (version,) = struct.unpack_from("<I", buf, 4)
    endian: Literal["<", ">"] = "<"
    if version & 0xFFFF == 0 and version != 0:          # a big-endian file reads as 0x03000000
        endian, version = ">", struct.unpack_from(">I", buf, 4)[0]
    if version not in (2, 3):
        raise TokenizerFormatError(f"GGUF version {version} is not supported (expected 2 or 3)", path=path, offset=4)
    cur = _Cursor(buf, path, endian)
    cur.pos = 8
    cur.scalar("Q", "tensor count")
    n_kv = cur.scalar("Q", "key/value count")
    if n_kv > _MAX_KV:
        raise cur.fail(f"key/value count {n_kv} is implausible; corrupt GGUF", 16)
    meta: dict[str, Any] = {"GGUF.version": version}
    for _ in range(n_kv):
        key = cur.string("key")
        vtype = cur.scalar("I", f"value type of '{key}'")
        meta[key] = _value(cur, vtype, key)
    return meta

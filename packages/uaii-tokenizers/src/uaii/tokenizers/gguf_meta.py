"""Read the key/value metadata of a GGUF file, fast, and stop before the tensor table.

`gguf.GGUFReader` maps every field of every tensor and takes seconds on a 262k-token vocabulary; a tokenizer only
needs the key/value section, so this reader walks it once with `struct` (and numpy for numeric arrays) and reports a
truncated or corrupt file as a `TokenizerFormatError` with the byte offset where decoding failed. The value-type
numbers and key names come from the `gguf` package.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any, Literal

import numpy as np
from gguf.constants import GGUF_MAGIC, GGUFValueType

from uaii.tokenizers.errors import TokenizerError, TokenizerFormatError

_SCALAR = {
    GGUFValueType.UINT8: ("B", np.uint8), GGUFValueType.INT8: ("b", np.int8),
    GGUFValueType.UINT16: ("H", np.uint16), GGUFValueType.INT16: ("h", np.int16),
    GGUFValueType.UINT32: ("I", np.uint32), GGUFValueType.INT32: ("i", np.int32),
    GGUFValueType.FLOAT32: ("f", np.float32), GGUFValueType.BOOL: ("?", np.bool_),
    GGUFValueType.UINT64: ("Q", np.uint64), GGUFValueType.INT64: ("q", np.int64),
    GGUFValueType.FLOAT64: ("d", np.float64),
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

    def string_array(self, count: int, what: str) -> list[str]:
        buf, unpack, e = self.buf, struct.Struct(self.e + "Q").unpack_from, self.end
        pos, out = self.pos, list[str]()
        append = out.append
        for i in range(count):
            if pos + 8 > e:
                raise self.fail(f"{what}[{i}] length runs past end of file (size {e:#x}); truncated GGUF", pos)
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > e:
                raise self.fail(f"{what}[{i}] of {n} bytes runs past end of file (size {e:#x}); truncated GGUF",
                                pos - 8)
            append(_text(buf[pos:pos + n]))
            pos += n
        self.pos = pos
        return out


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        # Keep the bytes (a vocabulary may hold partial UTF-8); surrogateescape round-trips them.
        return raw.decode("utf-8", errors="surrogateescape")


def _value(cur: _Cursor, vtype: int, key: str) -> Any:
    if vtype == GGUFValueType.STRING:
        return cur.string(f"value of '{key}'")
    if vtype == GGUFValueType.ARRAY:
        at = cur.pos
        etype = cur.scalar("I", f"element type of '{key}'")
        count = cur.scalar("Q", f"length of '{key}'")
        if count > _MAX_ARRAY:
            raise cur.fail(f"array '{key}' claims {count} elements; corrupt GGUF", at)
        if etype == GGUFValueType.STRING:
            return cur.string_array(count, f"'{key}'")
        if etype in _SCALAR:
            dtype = np.dtype(_SCALAR[GGUFValueType(etype)][1]).newbyteorder(cur.e)
            start = cur.take(count * dtype.itemsize, f"array '{key}'")
            return np.frombuffer(cur.buf, dtype=dtype, count=count, offset=start).astype(dtype.newbyteorder("="))
        if etype == GGUFValueType.ARRAY:
            return [_value(cur, GGUFValueType.ARRAY, f"{key}[{i}]") for i in range(count)]
        raise cur.fail(f"array '{key}' has unknown element type {etype}", at)
    if vtype in _SCALAR:
        return cur.scalar(_SCALAR[GGUFValueType(vtype)][0], f"value of '{key}'")
    raise cur.fail(f"key '{key}' has unknown value type {vtype}; corrupt GGUF", cur.pos - 4)


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Return the key/value metadata of the GGUF file at `path` (strings, numbers, numpy arrays, lists)."""
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

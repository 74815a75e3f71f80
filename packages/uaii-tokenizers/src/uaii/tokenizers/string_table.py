"""`StringTable`: many short strings (a vocabulary, a merge list) as one UTF-8 blob and an offset array.

A 262,144-piece vocabulary (Gemma 3) held as a list of `str` costs ~20 MiB of Python objects and a `dict` from
piece to id ~25 MiB more; the blob is 2.2 MiB, its offsets 1 MiB, and the lookup index (`find`) 2 MiB. A string
is decoded only when it is asked for. Pieces are stored as the file holds them, so a piece that is not valid UTF-8
round-trips through ``surrogateescape``.

`find` uses an open-addressing hash table of ``index + 1`` (0: empty) in a power-of-two array at most 2/3 full,
slots chosen by Python's own ``hash()`` of the bytes (stable within a process; the table is never stored), linear
probing, bytes compared to confirm; it is built on first use. Strings are placed last index first, so a text that
occurs twice is found at its last index, as llama.cpp's ``token_to_id`` map does (``find(..., first=True)`` looks
through the whole probe run instead, for llama.cpp's ``emplace`` maps).

`scan_gguf_strings` walks a GGUF string array (``u64 length + bytes`` records) and builds the table from the
mapped file without making a Python object per string; both GGUF readers (uaii-loaders' and this package's) use it.
"""

from __future__ import annotations

import mmap
import struct
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NoReturn, overload

import numpy as np

_CHUNK = 1 << 16          # strings compacted per numpy pass: bounds the scratch memory of a large table


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class StringTable(Sequence[str]):
    """An immutable sequence of strings held as one blob (module docstring); ``find`` maps a string to its index."""

    __slots__ = ("_blob", "_offsets", "_offsets_np", "_table")

    def __init__(self, blob: bytes, offsets: np.ndarray) -> None:
        """`offsets` has one entry more than there are strings: string i is ``blob[offsets[i]:offsets[i + 1]]``."""
        if offsets.ndim != 1 or len(offsets) < 1 or int(offsets[0]) != 0 or int(offsets[-1]) != len(blob):
            raise ValueError("offsets must start at 0 and end at the length of the blob")
        self._blob = blob
        self._offsets_np = np.ascontiguousarray(offsets, dtype=np.uint32 if len(blob) < 1 << 32 else np.int64)
        self._offsets = self._offsets_np.data  # a memoryview: item access gives a Python int, ~4x faster than numpy's
        self._table: memoryview | None = None

    @classmethod
    def from_strings(cls, items: Iterable[str]) -> StringTable:
        encoded = [_utf8(s) for s in items]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
        return cls(b"".join(encoded), offsets)

    # ------------------------------------------------------------------------------------------------ sequence
    def __len__(self) -> int:
        return len(self._offsets) - 1

    def raw(self, index: int) -> bytes:
        """The stored bytes of string `index`."""
        off = self._offsets
        return self._blob[off[index]:off[index + 1]]

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        i = index.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"string table index {index} out of range ({n} strings)")
        return self.raw(i).decode("utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        blob, off = self._blob, self._offsets
        for i in range(len(self)):
            yield blob[off[i]:off[i + 1]].decode("utf-8", "surrogateescape")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringTable):
            return self._blob == other._blob and np.array_equal(self._offsets_np, other._offsets_np)
        if isinstance(other, list | tuple):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __reduce__(self) -> tuple[type[StringTable], tuple[bytes, np.ndarray]]:
        return StringTable, (self._blob, self._offsets_np)     # the lookup table is per process (hash seeds differ)

    def tolist(self) -> list[str]:
        return list(self)

    @property
    def nbytes(self) -> int:
        """Bytes held: blob, offsets and, once built, the lookup index."""
        index = 0 if self._table is None else self._table.nbytes
        return len(self._blob) + self._offsets.nbytes + index

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:3])
        return f"StringTable([{head}{', ...' if len(self) > 3 else ''}], {len(self)} strings)"

    # ------------------------------------------------------------------------------------------------ lookups
    def _index(self) -> memoryview:
        if self._table is None:
            self._table = _hash_table(self._blob, self._offsets)
        return self._table

    def find(self, key: str | bytes, *, first: bool = False) -> int | None:
        """The index of `key` (its last occurrence, or its first one when asked), or None."""
        raw = key if isinstance(key, bytes) else _utf8(key)
        table = self._table if self._table is not None else self._index()
        blob, off, mask = self._blob, self._offsets, len(table) - 1
        slot = hash(raw) & mask
        found = None
        while j := table[slot]:
            j -= 1
            if blob[off[j]:off[j + 1]] == raw:
                if not first:
                    return j
                found = j if found is None else min(found, j)
            slot = (slot + 1) & mask
        return found

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str | bytes) and self.find(key) is not None

    def index_of(self, key: str) -> int:
        """Like `find`, but a missing key raises `KeyError`."""
        found = self.find(key)
        if found is None:
            raise KeyError(key)
        return found


def _hash_table(blob: bytes, off: memoryview) -> memoryview:
    """The `find` table of the strings ``blob[off[i]:off[i + 1]]`` (module docstring).

    A plain loop (~0.15 s for 262k strings): numpy's sorts and fancy indexing would be about as fast and need
    several times the table's size in temporaries, which count in the peak RSS this table exists to keep down.
    """
    n = len(off) - 1
    if n >= (1 << 32) - 1:
        raise ValueError(f"a string table of {n} strings is too large to index")
    mask = (1 << max(3, (n + n // 2).bit_length())) - 1
    table = np.zeros(mask + 1, dtype=np.uint32).data
    for i in range(n - 1, -1, -1):      # last index first: it comes first in the probe run of equal strings
        slot = hash(blob[off[i]:off[i + 1]]) & mask
        while table[slot]:
            slot = (slot + 1) & mask
        table[slot] = i + 1
    return table


# ---------------------------------------------------------------------------------------------------- GGUF arrays
ScanError = Callable[[int, int, int | None], NoReturn]
"""Called by `scan_gguf_strings` on a record that does not fit: (string number, its offset, claimed length or
None when the length field itself is cut off). It raises the reader's own error."""


def scan_gguf_strings(buf: Any, pos: int, count: int, end: int, fail: ScanError,
                      endian: str = "<") -> tuple[StringTable, int]:
    """The `count` strings of a GGUF string array whose first record starts at `pos`; returns them and the end.

    `buf` is the mapped file (or bytes) and `end` its size. Only the walk over the length fields is a Python loop
    (each record's position depends on the previous length); the bytes are gathered with numpy, a chunk of strings
    at a time, and the file pages already read are handed back (`release_mapped_pages`): Gemma 3's vocabulary is
    4 MiB of file that would otherwise count in the peak RSS.
    """
    unpack = struct.Struct(endian + "Q").unpack_from
    offsets = np.zeros(count + 1, dtype=np.uint32 if end < 1 << 32 else np.int64)   # the blob is smaller than the file
    lengths = array("Q", bytes(8 * min(count, _CHUNK)))
    parts: list[bytes] = []
    for done in range(0, count, _CHUNK):
        m = min(_CHUNK, count - done)
        first = pos
        for i in range(m):
            if pos + 8 > end:
                fail(done + i, pos, None)
            (n,) = unpack(buf, pos)
            pos += 8
            if n > end - pos:
                fail(done + i, pos - 8, n)
            lengths[i] = n
            pos += n
        relative = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(lengths, dtype=np.uint64, count=m), out=relative[1:])
        offsets[done + 1:done + m + 1] = relative[1:] + int(offsets[done])
        parts.append(_compact(buf, first, pos, relative))
        release_mapped_pages(buf, first, pos)
    blob = b"".join(parts)
    del parts
    if offsets.dtype != np.uint32 and len(blob) < 1 << 32:
        offsets = offsets.astype(np.uint32)
    return StringTable(blob, offsets), pos


def _compact(buf: Any, first: int, end: int, offsets: np.ndarray) -> bytes:
    """The strings of the records in ``buf[first:end]`` without their 8-byte length fields."""
    keep = np.ones(end - first, dtype=bool)
    fields = offsets[:-1] + 8 * np.arange(len(offsets) - 1, dtype=np.int64)   # where each length field starts
    for k in range(8):
        keep[fields + k] = False
    region = np.frombuffer(buf, dtype=np.uint8, count=end - first, offset=first)
    out = region[keep].tobytes()
    del region                                # a view of a mapped file must not outlive this call
    return out


def release_mapped_pages(buf: Any, start: int, end: int) -> None:
    """Drop the pages of ``buf[start:end]`` from this process's RSS when `buf` is a mapped file.

    A read-only file mapping is backed by the page cache: the pages stay cached and come back on the next access,
    but until the mapping is closed every page touched counts in RSS (and so in the peak that a memory budget
    must cover). Readers call this behind themselves over large arrays.
    """
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if not isinstance(buf, mmap.mmap) or advice is None:
        return
    page = mmap.PAGESIZE
    lo, hi = -(-start // page) * page, end // page * page
    if hi > lo:
        buf.madvise(advice, lo, hi - lo)


__all__ = ["ScanError", "StringTable", "release_mapped_pages", "scan_gguf_strings"]

"""mmap mode (no memory budget): read-only numpy views over a shared mapping of each weight file, zero copy.

The kernel pages weights in on first touch and may keep them cached; this mode is for models that fit in RAM.
``prefetch`` advises MADV_WILLNEED over each range; ``release`` has nothing to give back.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from uaii.ir import WeightRef
from uaii.storage.errors import StorageError
from uaii.storage.location import LocationIndex, WeightLocation, lookup
from uaii.storage.pinned import PinnedSet
from uaii.storage.telemetry import StorageTelemetry
from uaii.storage.tensor_view import as_tensor

Ref = str | WeightRef


class _Mapped:
    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.size = os.fstat(fd).st_size
            self.map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if self.size else None
        finally:
            os.close(fd)
        self.array = (np.frombuffer(self.map, dtype=np.uint8) if self.map is not None
                      else np.empty(0, dtype=np.uint8))


class MmapStore:
    """The same API as :class:`~uaii.storage.StreamingStore`, served from memory maps."""

    mode = "mmap"

    def __init__(self, index: LocationIndex, *, pin_budget_bytes: int | None = None) -> None:
        self.index = index
        self._maps: dict[str, _Mapped] = {}
        self._lock = threading.Lock()
        self.pinned = PinnedSet(pin_budget_bytes)
        self.telemetry = StorageTelemetry("mmap")
        self._closed = False

    def location(self, ref: Ref) -> WeightLocation:
        return lookup(self.index, ref)

    def prefetch(self, refs: Iterable[Ref]) -> None:
        for r in refs:
            key = str(r)
            if key in self.pinned:
                continue
            loc, m = self._locate(key)
            if m.map is not None and loc.nbytes:
                start = loc.offset // mmap.PAGESIZE * mmap.PAGESIZE
                m.map.madvise(mmap.MADV_WILLNEED, start, loc.end - start)

    def acquire(self, ref: Ref, form: str | None = None) -> np.ndarray:
        """``form``: the held form a pinned tensor was rewritten into (PinnedSet.reform); None: the file's layout."""
        key = str(ref)
        arr = self.pinned.get(key, form)
        if arr is not None:
            self.telemetry.add(acquires=1, pinned_hits=1, bytes_served=arr.nbytes)
            return arr
        loc, m = self._locate(key)
        self.telemetry.add(acquires=1, bytes_served=loc.nbytes)
        return as_tensor(m.array[loc.offset:loc.end], loc)

    def release(self, ref: Ref) -> None:
        """Nothing to give back: views stay valid while the store is open."""

    def pin(self, refs: Iterable[Ref]) -> None:
        """Copies ``refs`` into resident memory (anonymous, not file-backed pages)."""
        for r in refs:
            key = str(r)
            if key in self.pinned:
                continue
            loc, m = self._locate(key)
            self.pinned.check_room(key, loc.nbytes)
            copy = m.array[loc.offset:loc.end].copy()  # consumers get a read-only view of it (PinnedSet.reform writes)
            self.pinned.add(key, as_tensor(copy[:], loc), loc.nbytes)

    def unpin(self, refs: Iterable[Ref]) -> None:
        for r in refs:
            self.pinned.remove(str(r))

    def read_many_into(self, items: Sequence[tuple[Ref, Any]]) -> list[np.ndarray]:
        """Copies each ref into its buffer (an AlignedBuffer or anything with ``view(offset, nbytes)``)."""
        out = []
        t0 = time.perf_counter_ns()
        for r, buf in items:
            loc, m = self._locate(str(r))
            view = buf.view(0, loc.nbytes)
            view[...] = m.array[loc.offset:loc.end]
            out.append(view)
        self.telemetry.add(stall_ns=time.perf_counter_ns() - t0)
        return out

    def buffer_bytes(self, ref: Ref) -> int:
        return max(self.location(ref).nbytes, 1)

    def io_mode(self, path: str) -> str:
        return "mmap"

    def stats(self) -> dict[str, Any]:
        return self.telemetry.as_dict()

    def begin_token(self) -> None:
        self.telemetry.begin_token()

    def end_token(self) -> dict[str, int]:
        return self.telemetry.end_token()

    def close(self) -> None:
        """Drops the maps; a mapping still viewed by an array is unmapped when the last view goes."""
        with self._lock:
            self._closed = True
            self._maps.clear()
            self.pinned.clear()

    def __enter__(self) -> MmapStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _locate(self, key: str) -> tuple[WeightLocation, _Mapped]:
        if self._closed:
            raise StorageError("the mmap store is closed")
        loc = lookup(self.index, key)
        with self._lock:
            m = self._maps.get(loc.path)
            if m is None:
                try:
                    m = _Mapped(loc.path)
                except OSError as exc:
                    raise StorageError(f"cannot open weight file {loc.path}: {exc.strerror} "
                                       f"(reading {key!r})", path=loc.path) from None
                self._maps[loc.path] = m
        if loc.end > m.size:
            raise StorageError(f"{loc.path}: tensor {key!r} at offset {loc.offset:#x} with {loc.nbytes} "
                               f"bytes runs past the end of the file (size {m.size:#x})",
                               path=loc.path, offset=loc.offset, nbytes=loc.nbytes)
        return loc, m

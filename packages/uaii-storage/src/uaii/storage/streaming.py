"""Streaming mode: weights are read with pread into a fixed staging pool, ahead of compute, by C I/O threads.

Life of a streamed tensor::

    prefetch([ref, ...])   queued in plan order; submitted while staging space and the read-ahead depth allow
    acquire(ref)           moves its read to the front of the queue, waits in C (GIL released), returns a view
    release(ref)           returns the staging extent; the next queued prefetches are submitted

A view returned by ``acquire`` is valid until the matching ``release``: the extent is reused afterwards.
The pool is sized once by the caller; a tensor whose read window is larger than the whole pool is rejected
(with its name and size) when it is prefetched or acquired, never split or allocated on the side. When every
byte of the pool is held by acquired tensors, ``acquire`` raises :class:`StagingError` instead of waiting for
a release that a single-threaded caller could never make. Prefetched tensors that were not acquired yet are
cancelled (newest first) and queued again when an acquire needs their space.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from uaii.ir import DType, WeightRef
from uaii.storage import config
from uaii.storage._native import PAGE, AlignedBuffer, IoPool, NativeFile, io_error_text, round_up
from uaii.storage.errors import StagingError, StorageError
from uaii.storage.location import LocationIndex, WeightLocation, lookup, parse_rows_ref, row_range
from uaii.storage.pinned import PinnedSet
from uaii.storage.staging import StagingPool
from uaii.storage.telemetry import StorageTelemetry
from uaii.storage.tensor_view import as_tensor

Ref = str | WeightRef
_ReadItem = tuple[str, WeightLocation, NativeFile, AlignedBuffer]


@dataclass(eq=False)
class _Staged:
    """A tensor with a staging extent: its read queued, running, done, or held by callers."""

    ref: str
    loc: WeightLocation
    seq: int
    extent: int
    window: int
    job: Any
    view: np.ndarray
    holders: int = 0
    waiters: int = 0
    ready: bool = False


PIN_GAP = 4096
"""Tensors at most this many bytes apart in a file are pinned with one read into one buffer."""


@dataclass(eq=False)
class _PinRun:
    """Adjacent tensors of one file pinned with one read: ``[start, start + nbytes)`` into ``buf``."""

    file: NativeFile
    start: int
    nbytes: int
    members: list[tuple[str, WeightLocation]]
    buf: Any = None

    @property
    def label(self) -> str:
        more = len(self.members) - 1
        return self.members[0][0] + (f" (+{more} adjacent tensors read with it)" if more else "")

    def location(self) -> WeightLocation:
        return WeightLocation(self.file.path, self.start, self.nbytes, DType.U8, (self.nbytes,))


def _pin_runs(located: Sequence[tuple[str, WeightLocation, NativeFile]]) -> list[_PinRun]:
    """``located`` grouped into runs of tensors of one file at most PIN_GAP bytes apart, in file order."""
    runs: list[_PinRun] = []
    for key, loc, f in sorted(located, key=lambda t: (t[1].path, t[1].offset, t[1].nbytes)):
        last = runs[-1] if runs else None
        if last is not None and last.file is f and loc.offset - (last.start + last.nbytes) <= PIN_GAP:
            last.nbytes = max(last.nbytes, loc.end - last.start)
            last.members.append((key, loc))
        else:
            runs.append(_PinRun(f, loc.offset, loc.nbytes, [(key, loc)]))
    return runs


def _shutdown(pool: IoPool, *keep_alive: object) -> None:
    """Stops the I/O threads before the files, buffers and jobs they use can be freed."""
    pool.close()


class StreamingStore:
    """Reads weights through ``staging_bytes`` of staging memory; at most ``max_inflight`` reads run ahead."""

    mode = "streaming"

    def __init__(self, index: LocationIndex, staging_bytes: int, *, max_inflight: int = 8,
                 io_threads: int | None = None, chunk_bytes: int | None = None, direct: bool | None = None,
                 drop_cache: bool = True, pin_budget_bytes: int | None = None) -> None:
        if max_inflight < 1:
            raise StorageError(f"max_inflight must be >= 1, found {max_inflight}")
        self.index = index
        self.max_inflight = max_inflight
        self._direct = config.use_direct() if direct is None else direct
        self._drop_cache = drop_cache
        self._pool = IoPool(io_threads or config.io_threads(), chunk_bytes or config.chunk_bytes())
        self._staging = StagingPool(staging_bytes)
        self._files: dict[str, NativeFile] = {}
        self._staged: dict[str, _Staged] = {}
        self._pending: OrderedDict[str, None] = OrderedDict()
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self.pinned = PinnedSet(pin_budget_bytes)
        self.telemetry = StorageTelemetry("streaming", self._pool.counters)
        self.telemetry.attach("staging", self._staging_stats)
        self._finalizer = weakref.finalize(self, _shutdown, self._pool, self._files, self._staging,
                                           self._staged)

    # --- the public API ---------------------------------------------------------------------------
    def location(self, ref: Ref) -> WeightLocation:
        return lookup(self.index, ref)

    def prefetch(self, refs: Iterable[Ref]) -> None:
        """Queues reads in the given (plan) order; errors in a reference are raised here, not later."""
        with self._lock:
            self._check_open()
            for r in refs:
                key = str(r)
                if key in self.pinned or key in self._staged or key in self._pending:
                    continue
                self._locate(key)
                self._pending[key] = None
            self._pump()

    def acquire(self, ref: Ref, form: str | None = None) -> np.ndarray:
        """The tensor's bytes, waiting only for its own read; valid until ``release(ref)``. ``form``: the held form
        a pinned tensor was rewritten into (PinnedSet.reform); a streamed one is always in the file's layout."""
        key = str(ref)
        arr = self.pinned.get(key, form)
        if arr is None and form is None:
            arr = self._pinned_rows(key)
        if arr is not None:
            self.telemetry.add(acquires=1, pinned_hits=1, bytes_served=arr.nbytes)
            return arr
        with self._lock:
            self._check_open()
            st = self._staged.get(key)
            if st is None:
                st = self._stage_now(key)
            st.waiters += 1
        rc, stall = 0, 0
        if not st.ready:
            self._pool.boost(st.job)
            t0 = time.perf_counter_ns()
            rc = self._pool.wait(st.job)
            stall = time.perf_counter_ns() - t0
        with self._lock:
            st.waiters -= 1
            if rc != 0:
                if self._staged.get(key) is st and st.waiters == 0 and st.holders == 0:
                    self._drop(st)
                raise self._read_error(st.ref, st.loc, rc)
            st.ready = True
            st.holders += 1
            self._pump()
        self.telemetry.add(acquires=1, bytes_served=st.loc.nbytes, stall_ns=stall)
        return st.view

    def _pinned_rows(self, key: str) -> np.ndarray | None:
        """Rows ``A:B`` of a pinned tensor held in the file's layout (``ref@rows=A:B``): a view of its resident
        bytes, as a device backend streaming a pinned weight in row pieces asks — never a staged read of bytes
        already in memory. None when ``key`` is no such reference."""
        rows = parse_rows_ref(key)
        if rows is None or rows[0] not in self.pinned or self.pinned.form_of(rows[0]) is not None:
            return None
        whole = self.pinned.get(rows[0])
        if whole is None:
            return None
        base = self.location(rows[0])
        part = row_range(base, rows[1], rows[2])
        raw = whole.reshape(-1).view(np.uint8)
        return as_tensor(raw[part.offset - base.offset:part.end - base.offset], part)

    def release(self, ref: Ref) -> None:
        """Ends one ``acquire`` (or drops a prefetch that was never acquired); pinned weights ignore it."""
        key = str(ref)
        with self._lock:
            st = self._staged.get(key)
            if st is None:
                if key in self._pending:
                    del self._pending[key]
                    return
                rows = parse_rows_ref(key)
                if key in self.pinned or (rows is not None and rows[0] in self.pinned):
                    return
                raise StorageError(f"release of {key!r}, which is neither acquired nor prefetched")
            if st.holders > 0:
                st.holders -= 1
            if st.holders == 0 and st.waiters == 0:
                self._drop(st)
            self._pump()

    def pin(self, refs: Iterable[Ref]) -> None:
        """Reads ``refs`` once into resident memory; ``acquire`` serves them from there from now on.

        Tensors that lie next to each other in a file (at most ``PIN_GAP`` bytes apart: a pinned layer's weights,
        GGUF's alignment padding between them) are read as one range into one buffer: one read instead of one per
        tensor, and no page of padding per tensor (a pinned 2 KiB norm scale alone holds a 4-8 KiB buffer)."""
        runs: list[_PinRun] = []
        with self._lock:
            self._check_open()
            seen: set[str] = set()
            located: list[tuple[str, WeightLocation, NativeFile]] = []
            for r in refs:
                key = str(r)
                if key in self.pinned or key in seen:
                    continue
                seen.add(key)
                loc, f = self._locate(key, check_staging=False)
                located.append((key, loc, f))
            extra = 0
            for run in _pin_runs(located):
                size = round_up(max(run.file.window_bytes(run.start, run.nbytes), 1), PAGE)
                self.pinned.check_room(run.members[0][0], extra + size)
                extra += size
                runs.append(run)
            for run in runs:
                run.buf = AlignedBuffer(round_up(max(run.file.window_bytes(run.start, run.nbytes), 1), PAGE))
        views = self._read_into([(run.label, run.location(), run.file, run.buf) for run in runs])
        for run, view in zip(runs, views, strict=True):
            held, covered = [], run.start  # each tensor holds the bytes it adds to the run (tensors may overlap)
            for _, loc in run.members:
                held.append(max(loc.end - max(covered, loc.offset), 0))
                covered = max(covered, loc.end)
            held[-1] += run.buf.nbytes - sum(held)  # gaps and page slack of a run count once, on its last tensor
            for (key, loc), nbytes in zip(run.members, held, strict=True):
                part = view[loc.offset - run.start:loc.offset - run.start + loc.nbytes]
                self.pinned.add(key, as_tensor(part, loc), nbytes)
        with self._lock:  # staged copies nobody holds are no longer needed
            for key in (k for run in runs for k, _ in run.members):
                self._pending.pop(key, None)
                st = self._staged.get(key)
                if st is not None and st.holders == 0 and st.waiters == 0:
                    self._drop(st)
            self._pump()

    def unpin(self, refs: Iterable[Ref]) -> None:
        for r in refs:
            self.pinned.remove(str(r))

    def read_many_into(self, items: Sequence[tuple[Ref, AlignedBuffer]]) -> list[np.ndarray]:
        """Reads each ref into its own buffer, in parallel and ahead of queued prefetches; returns views."""
        with self._lock:
            self._check_open()
            located = [(str(r), *self._locate(str(r), check_staging=False), buf) for r, buf in items]
        return self._read_into(located)

    def buffer_bytes(self, ref: Ref) -> int:
        """Size of an AlignedBuffer that ``read_many_into`` accepts for ``ref``."""
        with self._lock:
            loc, f = self._locate(str(ref), check_staging=False)
        return round_up(max(f.window_bytes(loc.offset, loc.nbytes), 1), PAGE)

    @property
    def staging_capacity(self) -> int:
        """Bytes of the staging pool."""
        return int(self._staging.capacity)

    def window_bytes(self, ref: Ref) -> int:
        """Bytes of staging that reading ``ref`` takes (its read window, page-rounded)."""
        with self._lock:
            loc, f = self._locate(str(ref), check_staging=False)
        return int(self._staging.extents.size_for(f.window_bytes(loc.offset, loc.nbytes)))

    def io_mode(self, path: str) -> str:
        """``"direct"`` when reads of ``path`` use O_DIRECT, else ``"buffered"`` (pread + DONTNEED)."""
        f = self._files.get(path)
        return "direct" if f is not None and f.is_direct else "buffered"

    def stats(self) -> dict[str, Any]:
        return self.telemetry.as_dict()

    def begin_token(self) -> None:
        self.telemetry.begin_token()

    def end_token(self) -> dict[str, int]:
        return self.telemetry.end_token()

    def close(self) -> None:
        """Cancels queued reads, waits for running ones and stops the I/O threads. Views stay readable."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._pending.clear()
        self._finalizer()
        with self._lock:
            self._staged.clear()
            self._files.clear()
            self.pinned.clear()

    def __enter__(self) -> StreamingStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals (self._lock held) --------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("the streaming store is closed")

    def _locate(self, key: str, check_staging: bool = True) -> tuple[WeightLocation, NativeFile]:
        loc = lookup(self.index, key)
        f = self._files.get(loc.path)
        if f is None:
            try:
                f = NativeFile(loc.path, direct=self._direct, drop_cache=self._drop_cache)
            except StorageError as exc:
                raise StorageError(f"{str(exc).removeprefix('[storage] ')} (reading {key!r})",
                                   path=loc.path) from None
            self._files[loc.path] = f
        if loc.end > f.size:
            raise StorageError(f"{loc.path}: tensor {key!r} at offset {loc.offset:#x} with {loc.nbytes} "
                               f"bytes runs past the end of the file (size {f.size:#x})",
                               path=loc.path, offset=loc.offset, nbytes=loc.nbytes)
        if check_staging:
            window = f.window_bytes(loc.offset, loc.nbytes)
            if not self._staging.fits(window):
                raise StagingError(f"tensor {key!r} ({loc.nbytes} bytes, {window} with read alignment) is "
                                   f"larger than the whole staging pool ({self._staging.capacity} bytes); "
                                   "raise staging_bytes or pin it",
                                   path=loc.path, offset=loc.offset, nbytes=loc.nbytes)
        return loc, f

    def _pump(self) -> None:
        """Submits queued prefetches in order while staging space and the read-ahead depth allow."""
        ahead = sum(1 for s in self._staged.values() if s.holders == 0)
        while self._pending and ahead < self.max_inflight and not self._closed:
            key = next(iter(self._pending))
            loc, f = self._locate(key)
            if self._try_stage(key, loc, f) is None:
                break
            del self._pending[key]
            ahead += 1

    def _try_stage(self, key: str, loc: WeightLocation, f: NativeFile) -> _Staged | None:
        window = f.window_bytes(loc.offset, loc.nbytes)
        extent = self._staging.alloc(window)
        if extent is None:
            return None
        job = self._pool.job()
        try:
            data_off = self._pool.submit(job, f, loc.offset, loc.nbytes, self._staging.buffer, extent,
                                         self._staging.extents.size_for(window))
        except StorageError:
            self._staging.free(extent, window)
            self._pool.recycle(job)
            raise
        view = as_tensor(self._staging.buffer.view(extent + data_off, loc.nbytes), loc)
        st = _Staged(key, loc, next(self._seq), extent, window, job, view)
        self._staged[key] = st
        return st

    def _stage_now(self, key: str) -> _Staged:
        """Stages ``key`` for an acquire, cancelling not-yet-acquired prefetches (newest first) for room."""
        self._pending.pop(key, None)
        loc, f = self._locate(key)
        while True:
            st = self._try_stage(key, loc, f)
            if st is not None:
                return st
            idle = [s for s in self._staged.values() if s.holders == 0 and s.waiters == 0]
            if not idle:
                held = sorted(self._staged.values(), key=lambda s: s.seq)
                names = ", ".join(f"{s.ref!r} ({s.window} B)" for s in held[:4])
                names += ", ..." if len(held) > 4 else ""
                raise StagingError(
                    f"staging pool exhausted: {key!r} needs {f.window_bytes(loc.offset, loc.nbytes)} bytes "
                    f"but {self._staging.used} of {self._staging.capacity} bytes are held by {len(held)} "
                    f"acquired tensors ({names}); release tensors before acquiring more", nbytes=loc.nbytes)
            victim = max(idle, key=lambda s: s.seq)
            self._drop(victim)
            self._pending[victim.ref] = None
            self._pending.move_to_end(victim.ref, last=False)

    def _drop(self, st: _Staged) -> None:
        """Cancels or finishes the read of ``st`` and returns its extent and job."""
        self._pool.cancel(st.job)
        self._staging.free(st.extent, st.window)
        self._pool.recycle(st.job)
        del self._staged[st.ref]

    def _read_into(self, items: Sequence[_ReadItem]) -> list[np.ndarray]:
        """Reads each item into its buffer in parallel, ahead of the queue; waits for all of them."""
        submitted: list[tuple[Any, int]] = []
        failure: StorageError | None = None
        t0 = time.perf_counter_ns()
        try:
            for key, loc, f, buf in items:
                window = f.window_bytes(loc.offset, loc.nbytes)
                if window > buf.nbytes:
                    raise StorageError(f"a buffer of {buf.nbytes} bytes cannot hold the {window}-byte read "
                                       f"window of {key!r}",
                                       path=loc.path, offset=loc.offset, nbytes=loc.nbytes)
                job = self._pool.job()
                try:
                    data_off = self._pool.submit(job, f, loc.offset, loc.nbytes, buf, 0, buf.nbytes)
                except StorageError:
                    self._pool.recycle(job)
                    raise
                submitted.append((job, data_off))
            for job, _ in reversed(submitted):
                self._pool.boost(job)
        finally:
            for (job, _), (key, loc, _, _) in zip(submitted, items, strict=False):
                rc = self._pool.wait(job)
                self._pool.recycle(job)
                if rc != 0 and failure is None:
                    failure = self._read_error(key, loc, rc)
        self.telemetry.add(stall_ns=time.perf_counter_ns() - t0)
        if failure is not None:
            raise failure
        pairs = zip(submitted, items, strict=True)
        return [buf.view(data_off, loc.nbytes) for (_, data_off), (_, loc, _, buf) in pairs]

    def _read_error(self, key: str, loc: WeightLocation, rc: int) -> StorageError:
        return StorageError(f"{loc.path}: reading {key!r} ({loc.nbytes} bytes at offset {loc.offset:#x}) "
                            f"failed: {io_error_text(rc)}",
                            path=loc.path, offset=loc.offset, nbytes=loc.nbytes)

    def _staging_stats(self) -> dict[str, int]:
        with self._lock:
            held = sum(1 for s in self._staged.values() if s.holders > 0)
            return {"capacity": self._staging.capacity, "used": self._staging.used,
                    "peak": self._staging.peak, "staged": len(self._staged), "held": held,
                    "queued": len(self._pending),
                    "pinned_bytes": self.pinned.nbytes, "pinned": len(self.pinned)}

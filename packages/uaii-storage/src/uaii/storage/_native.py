"""Thin Python wrappers over the C I/O engine (``uaii.storage._storage_cffi``, built from csrc/ by cffi).

Every call into C goes through cffi's API mode, which releases the GIL for the duration of the call: waiting
for a read happens in C with the GIL released, and the I/O threads never touch Python.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from uaii.storage.errors import NativeUnavailable, StorageError

PAGE = 4096  # memory alignment of every buffer handed to the engine (UAII_IO_DEFAULT_ALIGN)


@functools.cache
def native() -> tuple[Any, Any]:
    """``(ffi, lib)`` of the compiled engine; a clear error when the package was installed without it."""
    try:
        from uaii.storage import _storage_cffi  # type: ignore[attr-defined]
    except ImportError as exc:
        raise NativeUnavailable(
            f"the C I/O engine uaii.storage._storage_cffi is not built ({exc}); reinstall uaii-storage from "
            "source with a C compiler (`uv sync --all-packages` in the repository), or use mmap mode "
            "(no staging budget)") from None
    return _storage_cffi.ffi, _storage_cffi.lib


def io_error_text(rc: int) -> str:
    """Text of a negative status code returned by the engine."""
    _, lib = native()
    if rc == lib.UAII_IO_EEOF:
        return "the file ended before the requested range did (short read)"
    return os.strerror(-rc)


def round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


class AlignedBuffer:
    """``nbytes`` of page-aligned memory from posix_memalign, freed when no view of it is left."""

    def __init__(self, nbytes: int) -> None:
        ffi, lib = native()
        if nbytes < 0:
            raise StorageError(f"buffer size must be >= 0, found {nbytes}")
        ptr = lib.uaii_aligned_alloc(PAGE, nbytes)
        if ptr == ffi.NULL:
            raise StorageError(f"cannot allocate {nbytes} bytes of aligned memory")
        self._ptr = ffi.gc(ffi.cast("uint8_t *", ptr), lib.uaii_aligned_free, size=nbytes)
        self.nbytes = nbytes
        # ffi.buffer keeps the owning cdata alive, so numpy views never outlive the memory.
        self._array = (np.frombuffer(ffi.buffer(self._ptr, nbytes), dtype=np.uint8) if nbytes
                       else np.empty(0, dtype=np.uint8))

    def pointer(self, offset: int = 0) -> Any:
        return self._ptr + offset

    def view(self, offset: int, nbytes: int) -> np.ndarray:
        """uint8 view of ``[offset, offset + nbytes)`` (writable; stores hand out read-only derivations)."""
        return self._array[offset:offset + nbytes]


class NativeFile:
    """One open weight file: a buffered fd and, where the file system admits it, an O_DIRECT fd."""

    def __init__(self, path: str, *, direct: bool, drop_cache: bool) -> None:
        ffi, lib = native()
        self.path = path
        err = ffi.new("int *")
        handle = lib.uaii_file_open(os.fsencode(path), int(direct), int(drop_cache), err)
        if handle == ffi.NULL:
            raise StorageError(f"cannot open weight file {path}: {os.strerror(-err[0])}", path=path)
        self.handle = ffi.gc(handle, lib.uaii_file_close)
        self.size: int = lib.uaii_file_size(handle)
        self.align: int = lib.uaii_file_align(handle)

    @property
    def is_direct(self) -> bool:
        return bool(native()[1].uaii_file_is_direct(self.handle))

    def window_bytes(self, offset: int, nbytes: int) -> int:
        return int(native()[1].uaii_window_bytes(self.handle, offset, nbytes))


class IoPool:
    """The I/O threads of one store, plus a free list of reusable job records (no allocation per read)."""

    def __init__(self, threads: int, chunk_bytes: int) -> None:
        ffi, lib = native()
        self._ffi, self._lib = ffi, lib
        err = ffi.new("int *")
        pool = lib.uaii_io_create(threads, chunk_bytes, err)
        if pool == ffi.NULL:
            raise StorageError(f"cannot start {threads} I/O threads: {os.strerror(-err[0])}")
        self._pool: Any = pool
        self.threads = threads
        self.chunk_bytes: int = lib.uaii_io_chunk_bytes(pool)
        self._free_jobs: list[Any] = []

    # jobs -----------------------------------------------------------------------------------------
    def job(self) -> Any:
        if self._free_jobs:
            return self._free_jobs.pop()
        job = self._lib.uaii_job_new()
        if job == self._ffi.NULL:
            raise StorageError("cannot allocate a read job")
        return self._ffi.gc(job, self._lib.uaii_job_free)

    def recycle(self, job: Any) -> None:
        self._free_jobs.append(job)

    # reads ----------------------------------------------------------------------------------------
    def submit(self, job: Any, file: NativeFile, offset: int, nbytes: int, buf: AlignedBuffer,
               buf_offset: int, cap: int) -> int:
        """Queues the read into ``buf[buf_offset:]``; returns where the data starts inside that window."""
        rc = self._lib.uaii_io_submit(self._pool, job, file.handle, offset, nbytes, buf.pointer(buf_offset),
                                      cap)
        if rc != 0:
            raise StorageError(f"cannot queue a read of {nbytes} bytes at offset {offset:#x} of {file.path}: "
                               f"{os.strerror(-rc)}", path=file.path, offset=offset, nbytes=nbytes)
        return int(self._lib.uaii_job_data_offset(job))

    def wait(self, job: Any) -> int:
        return int(self._lib.uaii_io_wait(self._pool, job))

    def done(self, job: Any) -> bool:
        return bool(self._lib.uaii_io_done(self._pool, job))

    def done_seq(self, job: Any) -> int:
        """Completion order of ``job`` within this pool (1-based), 0 while it has not completed."""
        return int(self._lib.uaii_job_done_seq(job))

    def boost(self, job: Any) -> None:
        self._lib.uaii_io_boost(self._pool, job)

    def cancel(self, job: Any) -> None:
        self._lib.uaii_io_cancel(self._pool, job)

    def counters(self) -> dict[str, int]:
        c = self._ffi.new("uaii_io_counters *")
        self._lib.uaii_io_get_counters(self._pool, c)
        return {name: int(getattr(c, name)) for name in (
            "bytes_read", "bytes_direct", "bytes_buffered", "jobs_done", "chunks_done", "short_reads",
            "eintr_retries", "direct_fallbacks", "errors", "busy_ns")}

    def inject_fault(self, kind: str, count: int) -> None:
        """Test hook: the next ``count`` preads fail with EINTR (``"eintr"``) or return half (``"short"``)."""
        code = {"eintr": self._lib.UAII_IO_FAULT_EINTR, "short": self._lib.UAII_IO_FAULT_SHORT}[kind]
        self._lib.uaii_io_inject_fault(self._pool, code, count)

    def close(self) -> None:
        if self._pool is not None:
            self._lib.uaii_io_destroy(self._pool)
            self._pool = None


def resident_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of ``path`` now in the page cache (mmap + mincore; the mapping itself faults nothing in)."""
    _, lib = native()
    rc = int(lib.uaii_resident_bytes(os.fsencode(os.fspath(path))))
    if rc < 0:
        raise StorageError(f"cannot measure page-cache residency of {os.fspath(path)}: {os.strerror(-rc)}",
                           path=os.fspath(path))
    return rc


def drop_page_cache(path: str | os.PathLike[str]) -> None:
    """Flush ``path`` and advise the kernel to drop its cached pages (may be a no-op on tmpfs)."""
    _, lib = native()
    rc = int(lib.uaii_drop_page_cache(os.fsencode(os.fspath(path))))
    if rc < 0:
        raise StorageError(f"cannot drop the page cache of {os.fspath(path)}: {os.strerror(-rc)}",
                           path=os.fspath(path))


def now_ns() -> int:
    return int(native()[1].uaii_now_ns())

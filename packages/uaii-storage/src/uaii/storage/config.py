"""The knobs of uaii-storage (environment variables ``UAII_*``), read when a store is created."""

from __future__ import annotations

import os

from uaii.storage.errors import StorageError

MiB = 1 << 20

#: I/O threads per streaming store (each has at most one pread in flight).
IO_THREADS_ENV = "UAII_IO_THREADS"
DEFAULT_IO_THREADS = 4
#: Bytes per chunk: a read larger than this is split so that several threads read it in parallel.
IO_CHUNK_ENV = "UAII_IO_CHUNK_BYTES"
DEFAULT_CHUNK_BYTES = 2 * MiB
#: 0 disables O_DIRECT (buffered pread + POSIX_FADV_DONTNEED instead).
IO_DIRECT_ENV = "UAII_IO_DIRECT"


def _env_int(name: str, default: int, lo: int, hi: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw, 0)
    except ValueError:
        raise StorageError(f"{name} must be an integer, found {raw!r}") from None
    if not lo <= value <= hi:
        raise StorageError(f"{name} must be in [{lo}, {hi}], found {value}")
    return value


def io_threads() -> int:
    return _env_int(IO_THREADS_ENV, DEFAULT_IO_THREADS, 1, 64)


def chunk_bytes() -> int:
    return _env_int(IO_CHUNK_ENV, DEFAULT_CHUNK_BYTES, 4096, 1 << 30)


def use_direct() -> bool:
    return _env_int(IO_DIRECT_ENV, 1, 0, 1) == 1

"""Errors of uaii-storage: each is a :class:`StorageError` (a ``UaiiError``) naming file, offset and size."""

from __future__ import annotations

from uaii.ir.errors import UaiiError


class StorageError(UaiiError):
    """A weight could not be located, opened or read. Says which reference, file, byte offset and size."""

    component = "storage"

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None,
                 nbytes: int | None = None) -> None:
        self.path = path
        self.offset = offset
        self.nbytes = nbytes
        super().__init__(message)


class StagingError(StorageError):
    """The staging pool cannot hold what was asked: one tensor larger than the pool, or every byte held."""


class NativeUnavailable(StorageError):
    """The C I/O engine was not built; streaming mode needs it, mmap mode does not."""

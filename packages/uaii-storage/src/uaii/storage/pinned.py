"""Pinned weights: read once into resident memory and served from there without I/O or staging."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np

from uaii.storage.errors import StorageError


class PinnedSet:
    """ref → resident read-only array. ``nbytes`` counts the memory held (alignment padding included)."""

    def __init__(self, budget_bytes: int | None = None) -> None:
        self.budget_bytes = budget_bytes
        self._arrays: dict[str, np.ndarray] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()
        self.nbytes = 0

    def get(self, ref: str) -> np.ndarray | None:
        return self._arrays.get(ref)

    def check_room(self, ref: str, held: int) -> None:
        """Raises when pinning ``held`` more bytes for ``ref`` would exceed the budget."""
        if self.budget_bytes is not None and self.nbytes + held > self.budget_bytes:
            raise StorageError(f"pinning {ref!r} ({held} bytes) would exceed the pin budget of "
                               f"{self.budget_bytes} bytes ({self.nbytes} already pinned)", nbytes=held)

    def add(self, ref: str, array: np.ndarray, held: int) -> None:
        with self._lock:
            if ref in self._arrays:
                return
            self._arrays[ref] = array
            self._held[ref] = held
            self.nbytes += held

    def remove(self, ref: str) -> bool:
        with self._lock:
            if ref not in self._arrays:
                return False
            del self._arrays[ref]
            self.nbytes -= self._held.pop(ref)
            return True

    def clear(self) -> None:
        with self._lock:
            self._arrays.clear()
            self._held.clear()
            self.nbytes = 0

    def __contains__(self, ref: object) -> bool:
        return str(ref) in self._arrays

    def __len__(self) -> int:
        return len(self._arrays)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._arrays))

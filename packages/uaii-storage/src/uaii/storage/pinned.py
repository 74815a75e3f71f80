"""Pinned weights: read once into resident memory and served from there without I/O or staging.

A pinned tensor may be rewritten once, in place, into a *held form* a backend's kernels read faster (the same bytes
in another order, see uaii.kernels.held): the backend asks with :meth:`PinnedSet.reform` before it first acquires
the tensor, and acquires it naming that form from then on. A consumer that asks for another layout than the one
held gets a StorageError instead of bytes it would misread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np

from uaii.storage.errors import StorageError


class PinnedSet:
    """ref → resident read-only array. ``nbytes`` counts the memory held (alignment padding included)."""

    def __init__(self, budget_bytes: int | None = None) -> None:
        self.budget_bytes = budget_bytes
        self._arrays: dict[str, np.ndarray] = {}
        self._held: dict[str, int] = {}
        self._forms: dict[str, str] = {}  # ref -> the held form its bytes are in (absent: the file's layout)
        self._served: set[str] = set()  # refs handed out in the file's layout (no longer rewritable)
        self._spans: dict[str, tuple[int, int]] = {}  # ref -> its bytes' first and past-last address (reform)
        self._lock = threading.Lock()
        self.nbytes = 0

    def get(self, ref: str, form: str | None = None) -> np.ndarray | None:
        """The resident array of ``ref`` in ``form`` (None: the file's layout); None when it is not pinned and no
        form is asked for. StorageError when it is held in another form, or a form is asked of a tensor not pinned
        (only a pinned tensor is ever rewritten). Under the lock: a reform in progress is never handed out half
        rewritten, and a tensor handed out as it is is never rewritten after."""
        with self._lock:
            arr = self._arrays.get(ref)
            if arr is None:
                if form is not None:
                    raise StorageError(f"weight {ref!r} is not pinned: only a pinned tensor is held in a form "
                                       f"({form!r})")
                return None
            held = self._forms.get(ref)
            if held != form:
                raise StorageError(f"pinned weight {ref!r} is held in {_layout(held)}, not in {_layout(form)}")
            if form is None:
                self._served.add(ref)
            return arr

    def form_of(self, ref: str) -> str | None:
        return self._forms.get(ref)

    def reform(self, ref: str, form: str, rewrite: Callable[[np.ndarray], None]) -> bool:
        """Rewrite the pinned tensor ``ref`` in place into ``form``: ``rewrite(buf)`` gets its resident bytes,
        writable, and leaves them in that form (no second copy). True when ``ref`` is held in ``form`` (now or
        already); False when it is not pinned, was already handed out in the file's layout, shares bytes with
        another pinned tensor (entries of a file that overlap), or is held in another form (then nothing changes).
        If ``rewrite`` raises, its bytes may be half rewritten: ``ref`` is unpinned (a later acquire reads the file
        again, as for any tensor not pinned) and the error propagates."""
        with self._lock:
            arr = self._arrays.get(ref)
            if arr is None or ref in self._served:
                return False
            held = self._forms.get(ref)
            if held is not None:
                return held == form
            start, end = self._spans[ref]
            if any(s < end and start < e for r, (s, e) in self._spans.items() if r != ref):
                return False
            buf = arr.view()
            buf.flags.writeable = True  # the store's own buffer: read-only only to its consumers
            try:
                rewrite(buf)
            except BaseException:
                self._drop(ref)
                raise
            self._forms[ref] = form
            return True

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
            self._spans[ref] = _span(array)
            self._held[ref] = held
            self.nbytes += held

    def remove(self, ref: str) -> bool:
        with self._lock:
            if ref not in self._arrays:
                return False
            self._drop(ref)
            return True

    def _drop(self, ref: str) -> None:
        """Forget a pinned ``ref`` (the caller holds the lock)."""
        del self._arrays[ref]
        del self._spans[ref]
        self._forms.pop(ref, None)
        self._served.discard(ref)
        self.nbytes -= self._held.pop(ref)

    def clear(self) -> None:
        with self._lock:
            self._arrays.clear()
            self._held.clear()
            self._forms.clear()
            self._served.clear()
            self._spans.clear()
            self.nbytes = 0

    def __contains__(self, ref: object) -> bool:
        return str(ref) in self._arrays

    def __len__(self) -> int:
        return len(self._arrays)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._arrays))


def _layout(form: str | None) -> str:
    return f"the held form {form!r}" if form else "the file's layout"


def _span(a: np.ndarray) -> tuple[int, int]:
    """The first and past-last address of a contiguous array's bytes."""
    start = a.__array_interface__["data"][0]
    return start, start + a.nbytes

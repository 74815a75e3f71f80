"""One call at a time per Session, and a close() that never pulls memory from under a forward pass.

A Session owns native memory (the compiled steps' pointers, the KV cache, mapped or staged weights) that a forward
pass reads from C without the GIL. Two threads generating on one Session would interleave their passes over one
arena and one KV cache (wrong tokens, then a segfault), and ``close()`` during a pass unmaps what a kernel is
reading. :class:`SessionGuard` serializes instead of failing:

* every public call that runs the model (generate, stream, chat, forward, run, reset) *holds* the guard for its
  whole duration; a second thread waits for it. A ``stream()`` holds it from its first piece to its end (the
  cache is the stream's until then), and is *suspended* while the caller has a piece;
* a call from the thread that already holds it (generate from ``on_token``, or while a ``stream()`` this thread
  started is not finished) would wait for itself forever, so it raises :class:`SessionError` instead;
* ``close()`` marks the session as closing, so that a generation in flight stops before its next forward pass, and
  frees once no pass can be running: the holder has left, or is a stream suspended at a piece (it raises
  SessionError when resumed). Called by the holder itself (from ``on_token``), it frees when that call ends.

Reentrancy is told apart by thread: the guard records the thread that holds it, updated when a suspended stream is
resumed (a generator may be resumed from another thread than the one that started it).

Waiters are served first come, first served (a ticket each): a thread that calls in a loop — the serving engine,
one decode step per hold — would otherwise take the guard back before a woken waiter got to run, and an embedding
request would wait for the whole of a chat stream instead of for one step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from uaii.runtime.errors import SessionError


class SessionGuard:
    """The per-session lock. ``free`` releases the session's native resources (called once, under the lock)."""

    def __init__(self, free: Callable[[], None]) -> None:
        self.cv = threading.Condition(threading.Lock())  # also held by short readers (storage stats) against close
        self._free = free
        self._owner: int | None = None  # thread that holds the guard
        self._what = ""  # what it holds it for
        self._running = False  # False while the holder is a stream suspended at a piece
        self.closing = False  # close() was asked: a generation stops before its next forward pass
        self.closed = False
        self._tickets = 0  # handed out to callers of hold(), in arrival order
        self._serving = 0  # the ticket whose turn it is
        self._abandoned: set[int] = set()  # tickets whose waiter left (interrupted): skipped when their turn comes

    @contextmanager
    def hold(self, what: str) -> Iterator[None]:
        """The guard for the whole of one call (``what`` names it in errors); waits while another thread has it."""
        me = threading.get_ident()
        with self.cv:
            if self._owner == me:
                raise SessionError(f"[runtime] cannot {what}: this thread is already using the session for "
                                   f"{self._what} (a call from its on_token callback, or a stream() that is not "
                                   "finished); a Session runs one call at a time: finish or close() the stream first")
            ticket = self._tickets
            self._tickets += 1
            try:
                while self._owner is not None or self._serving != ticket:
                    self.cv.wait()
            except BaseException:  # interrupted while waiting: its turn must not block the ones behind it
                self._abandoned.add(ticket)
                self._skip_abandoned()
                self.cv.notify_all()
                raise
            self._owner, self._what, self._running = me, what, True
            self._serving += 1
            self._skip_abandoned()
        try:
            yield
        finally:
            with self.cv:
                self._owner, self._running = None, False
                if self.closing:
                    self._close_now()  # close() was asked during the call (from its own thread, or interrupted)
                self.cv.notify_all()

    def _skip_abandoned(self) -> None:
        while self._serving in self._abandoned:
            self._abandoned.discard(self._serving)
            self._serving += 1

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """Around a stream's ``yield``: the caller has a piece and no pass runs, so close() may free meanwhile;
        on resumption the stream raises SessionError if it did."""
        with self.cv:
            self._running = False
            self.cv.notify_all()
        try:
            yield
        finally:
            with self.cv:  # waits for a close() that is freeing right now
                self._owner, self._running = threading.get_ident(), True
        if self.closed:
            raise SessionError("[runtime] cannot continue the stream: the session was closed while it was "
                               "suspended")

    def check_open(self) -> None:
        """Before a forward pass: stop a generation whose session is being closed."""
        if self.closing:
            raise SessionError("[runtime] generation stopped: the session is being closed (close() was called "
                               "during the call)")

    def close(self) -> None:
        """Free now if no pass can be running, after the pass in flight otherwise (see the module docstring)."""
        me = threading.get_ident()
        with self.cv:
            self.closing = True
            if self._owner == me and self._running:
                return  # called by the holder (its on_token): the call stops at its next pass and frees on exit
            while self._owner is not None and self._running:
                self.cv.wait()
            self._close_now()

    def _close_now(self) -> None:
        if not self.closed:
            self.closed = True
            self._free()


__all__ = ["SessionGuard"]

"""Storage telemetry: bytes read (total and per token), effective read bandwidth, stalls, cache hit rates.

Counters come from two places: the C engine (bytes that reached memory, O_DIRECT vs buffered, retries, the
wall time during which at least one read was running) and the store itself (acquires, time callers waited).
``as_dict()`` is what Session stats and ``uaii bench`` show.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

GB = 1e9

Counters = dict[str, int]


class StorageTelemetry:
    """Counters of one store. ``begin_token()``/``end_token()`` bracket a token to measure its bytes."""

    def __init__(self, mode: str, io_counters: Callable[[], Counters] | None = None,
                 history: int = 4096) -> None:
        self.mode = mode
        self._io_counters = io_counters
        self._lock = threading.Lock()
        self._own: Counters = {"acquires": 0, "pinned_hits": 0, "bytes_served": 0, "stall_ns": 0}
        self._sections: dict[str, Callable[[], dict[str, Any]]] = {}
        self._token_start: Counters | None = None
        self._token_t0 = 0.0
        self._token_bytes: deque[int] = deque(maxlen=history)
        self._token_seconds: deque[float] = deque(maxlen=history)
        self.tokens = 0

    # recording (called by the stores) -------------------------------------------------------------
    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                self._own[name] = self._own.get(name, 0) + value

    def attach(self, name: str, section: Callable[[], dict[str, Any]]) -> None:
        """Adds a named sub-dict (e.g. the expert cache's) to ``as_dict()``."""
        self._sections[name] = section

    # snapshots ------------------------------------------------------------------------------------
    def snapshot(self) -> Counters:
        """Every counter now, as plain ints; subtract two snapshots to measure an interval."""
        with self._lock:
            snap = dict(self._own)
        if self._io_counters is not None:
            snap.update(self._io_counters())
        return snap

    @staticmethod
    def delta(before: Counters, after: Counters) -> Counters:
        return {k: after[k] - before.get(k, 0) for k in after}

    def begin_token(self) -> None:
        self._token_start = self.snapshot()
        self._token_t0 = time.perf_counter()

    def end_token(self) -> Counters:
        """Closes the token opened by ``begin_token()``; returns the counters of that token."""
        if self._token_start is None:
            return {}
        d = self.delta(self._token_start, self.snapshot())
        self._token_start = None
        self.tokens += 1
        self._token_bytes.append(d.get("bytes_read", d.get("bytes_served", 0)))
        self._token_seconds.append(time.perf_counter() - self._token_t0)
        return d

    # report ---------------------------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        s = self.snapshot()
        out: dict[str, Any] = {"mode": self.mode, **{k: v for k, v in s.items() if not k.endswith("_ns")}}
        stall_s = s.get("stall_ns", 0) / 1e9
        out["stall_s"] = stall_s
        if "busy_ns" in s:
            busy_s = s["busy_ns"] / 1e9
            out["io_busy_s"] = busy_s
            out["read_gbps"] = s["bytes_read"] / busy_s / GB if busy_s > 0 else 0.0
        out["tokens"] = self.tokens
        if self._token_bytes:
            out["bytes_per_token_last"] = self._token_bytes[-1]
            out["bytes_per_token_mean"] = sum(self._token_bytes) / len(self._token_bytes)
            secs = sum(self._token_seconds)
            out["token_read_gbps"] = sum(self._token_bytes) / secs / GB if secs > 0 else 0.0
        for name, section in self._sections.items():
            out[name] = section()
        return out

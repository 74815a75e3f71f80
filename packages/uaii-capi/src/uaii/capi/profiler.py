"""The session profiler behind ``enable_profiler``: timed spans, a text summary and a Chrome trace.

A span is one call or phase (create, run, prefill, decode, ...). ``summary()`` aggregates them per name;
``chrome_trace()`` is the Trace Event Format (complete events, ``"ph": "X"``, microseconds) that chrome://tracing
and Perfetto open.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Span:
    name: str
    category: str
    start_ns: int
    duration_ns: int
    thread: int
    args: dict[str, Any] = field(default_factory=dict)


class Profiler:
    """Records spans while enabled; a disabled profiler costs one attribute check per span."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.spans: list[Span] = []
        self._origin_ns = time.perf_counter_ns()

    @contextmanager
    def span(self, name: str, category: str = "session", **args: Any) -> Iterator[dict[str, Any]]:
        """Time the body; the yielded dict can receive more args (e.g. token counts) before the span closes."""
        extra: dict[str, Any] = dict(args)
        if not self.enabled:
            yield extra
            return
        start = time.perf_counter_ns()
        try:
            yield extra
        finally:
            self.add(name, category, start, time.perf_counter_ns() - start, **extra)

    @staticmethod
    def now_ns() -> int:
        return time.perf_counter_ns()

    def add(self, name: str, category: str, start_ns: int, duration_ns: int, **args: Any) -> None:
        if self.enabled:
            self.spans.append(Span(name, category, start_ns, max(0, duration_ns), threading.get_ident(), args))

    def summary(self) -> str:
        """Per span name: count, total, mean and max milliseconds, sorted by total time."""
        totals: dict[str, list[float]] = {}
        for s in self.spans:
            totals.setdefault(s.name, []).append(s.duration_ns / 1e6)
        lines = [f"uaii profile: {len(self.spans)} spans",
                 f"{'name':<24} {'count':>7} {'total ms':>11} {'mean ms':>10} {'max ms':>10}"]
        for name, ms in sorted(totals.items(), key=lambda kv: -sum(kv[1])):
            lines.append(f"{name:<24} {len(ms):>7} {sum(ms):>11.3f} {sum(ms) / len(ms):>10.3f} {max(ms):>10.3f}")
        return "\n".join(lines) + "\n"

    def chrome_trace(self) -> dict[str, Any]:
        pid = os.getpid()
        events = [{"name": s.name, "cat": s.category, "ph": "X", "pid": pid, "tid": s.thread,
                   "ts": (s.start_ns - self._origin_ns) / 1e3, "dur": s.duration_ns / 1e3, "args": s.args}
                  for s in self.spans]
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"producer": "uaii-capi"}}

    def write_trace(self, path: str) -> None:
        """Write the trace atomically: a temporary file in the same directory, fsync, rename."""
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".uaii-trace-", suffix=".json", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(self.chrome_trace(), fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

"""Request counters and the ``/metrics`` page in Prometheus' text exposition format (version 0.0.4).

:class:`MetricsMiddleware` counts every HTTP request by route template (``/v1/chat/completions``, never the raw
path: an unknown path is ``other``, so a scan of random URLs cannot grow the table) and status. :func:`render`
adds the loaded model's engine figures (tokens, decode tok/s, batch sizes, bytes read per token, read GB/s,
expert-cache hits, active/queued sequences) and the process's resident memory.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """Thread-safe request counters: (route, status) -> count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[tuple[str, int]] = Counter()

    def count(self, route: str, status: int) -> None:
        with self._lock:
            self._requests[route, status] += 1

    def requests(self) -> dict[tuple[str, int], int]:
        with self._lock:
            return dict(self._requests)


class MetricsMiddleware:
    """Counts each HTTP request once its response starts (a stream counts when its first byte goes out)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        counted = False

        async def counting_send(message: Message) -> None:
            nonlocal counted
            if message["type"] == "http.response.start" and not counted:
                counted = True
                self.metrics.count(route_label(scope), int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            if not counted:  # failed before any response: the error middleware outside us answers 500
                self.metrics.count(route_label(scope), 500)


def route_label(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None) if isinstance(route, BaseRoute) else None
    return str(path) if path else "other"


def process_rss_bytes() -> int:
    """The resident set of this process now (VmRSS), 0 where /proc is missing."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Page:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_text: str, samples: list[tuple[dict[str, Any], float]]) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for labels, value in samples:
            inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{inner}}} {float(value)!r}" if inner else f"{name} {float(value)!r}")


def render(state: Any) -> str:
    """The /metrics page of ``state`` (a ServerState)."""
    page = _Page()
    page.metric("uaii_http_requests_total", "counter", "HTTP requests by route template and status",
                [({"route": r, "status": s}, n) for (r, s), n in sorted(state.metrics.requests().items())])
    loaded = state.loaded
    page.metric("uaii_model_loaded", "gauge", "1 for the model loaded now",
                [({"model": loaded.name}, 1)] if loaded is not None else [])
    stats = loaded.stats() if loaded is not None else {}  # empty for an encoder (no engine)
    _engine_metrics(page, stats)
    page.metric("uaii_process_resident_memory_bytes", "gauge", "resident set of the server process (VmRSS)",
                [({}, process_rss_bytes())])
    return "\n".join(page.lines) + "\n"


# (metric, kind, engine stats key, help)
ENGINE_METRICS = (
    ("uaii_requests_total", "counter", "requests_total", "generation requests the engine accepted"),
    ("uaii_sequences_active", "gauge", "requests_active", "sequences being decoded now"),
    ("uaii_sequences_queued", "gauge", "requests_queued", "requests waiting for a free sequence slot or memory"),
    ("uaii_batched_decode", "gauge", "batched_decode",
     "1 when a decode step is one pass over every sequence, 0 when it runs one pass per sequence (the backend "
     "cannot batch, or the batched executable does not fit the memory budget)"),
    ("uaii_prompt_tokens_total", "counter", "prompt_tokens_total", "prompt tokens prefilled"),
    ("uaii_completion_tokens_total", "counter", "completion_tokens_total", "tokens generated"),
    ("uaii_decode_tokens_per_second", "gauge", "decode_tok_s", "aggregate decode tokens/s over the recent steps"),
    ("uaii_bytes_read_per_token", "gauge", "bytes_read_per_token", "weight bytes read from storage per forward pass"),
    ("uaii_read_gigabytes_per_second", "gauge", "read_gb_s", "weight read throughput (GB/s of I/O busy time)"),
    ("uaii_expert_cache_hits_total", "counter", "expert_cache_hits", "MoE expert cache hits"),
    ("uaii_expert_cache_misses_total", "counter", "expert_cache_misses", "MoE expert cache misses"),
)


def _engine_metrics(page: _Page, stats: dict[str, Any]) -> None:
    for name, kind, key, help_text in ENGINE_METRICS:
        value = stats.get(key)
        page.metric(name, kind, help_text, [({}, float(value))] if isinstance(value, int | float) else [])
    hist = stats.get("batch_size_histogram") or {}
    page.metric("uaii_decode_steps_total", "counter", "batched decode steps by batch size (sequences per step)",
                [({"batch_size": int(k)}, v) for k, v in sorted(hist.items(), key=lambda kv: int(kv[0]))])


__all__ = ["CONTENT_TYPE", "Metrics", "MetricsMiddleware", "process_rss_bytes", "render", "route_label"]

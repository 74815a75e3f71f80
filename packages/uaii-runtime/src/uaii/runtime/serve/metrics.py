"""Request counters and the ``/metrics`` page in Prometheus' text exposition format (version 0.0.4).

:class:`MetricsMiddleware` counts every HTTP request by route template (``/v1/chat/completions``, never the raw
path: an unknown path is ``other``, so a scan of random URLs cannot grow the table) and status. :func:`render`
adds the loaded model's engine figures (tokens, decode tok/s, batch sizes, bytes read per token, read GB/s,
expert-cache hits, active/queued sequences) and the process's resident memory. :func:`render_replicas` is the
page of several servers at once (``uaii serve --ray``: one per Ray replica), from each one's :func:`snapshot`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
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


Snapshot = dict[str, Any]  # what /metrics shows of one server, as plain data (see :func:`snapshot`)


def snapshot(state: Any) -> Snapshot:
    """The figures of ``state`` (a ServerState) that /metrics renders, as picklable data: request counts, the
    loaded model, the engine's stats (empty for an encoder, which has no engine) and the resident memory. A Ray
    replica sends this to the metrics board (serve/ray_replicas.py) so that one scrape can sum every replica."""
    loaded = state.loaded
    return {"requests": state.metrics.requests(), "models": {loaded.name: 1} if loaded is not None else {},
            "stats": loaded.stats() if loaded is not None else {}, "rss": process_rss_bytes()}


def render(state: Any) -> str:
    """The /metrics page of ``state`` (a ServerState)."""
    page = _Page()
    for name, kind, help_text, samples in _families(snapshot(state)):
        page.metric(name, kind, help_text, samples)
    return "\n".join(page.lines) + "\n"


REPLICA_PREFIX = "uaii_replica_"


def render_replicas(snapshots: dict[str, Snapshot]) -> str:
    """The /metrics page of a set of replicas (``snapshots``: replica id -> :func:`snapshot`): every family under
    the plain server's name holds the figures combined over the replicas (counters summed, gauges as
    ENGINE_METRICS says), so what watches one server reads N of them the same way; then ``uaii_replicas`` and
    each family again as ``uaii_replica_*`` with a ``replica`` label, one series per replica."""
    page = _Page()
    ids = sorted(snapshots)
    for name, kind, help_text, samples in _families(combine([snapshots[i] for i in ids])):
        page.metric(name, kind, f"{help_text}, over all replicas", samples)
    page.metric("uaii_replicas", "gauge", "replicas whose figures this page holds", [({}, len(ids))])
    per_replica = {i: _families(snapshots[i]) for i in ids}
    for k, (name, kind, help_text, _) in enumerate(_families(combine([]))):
        samples = [({"replica": i, **labels}, v) for i in ids for labels, v in per_replica[i][k][3]]
        page.metric(REPLICA_PREFIX + name.removeprefix("uaii_"), kind, f"{help_text}, per replica", samples)
    return "\n".join(page.lines) + "\n"


def combine(snapshots: list[Snapshot]) -> Snapshot:
    """One snapshot of several: request counts, loaded models (how many replicas hold each), memory and the
    engine's counters summed; the engine figures that are not additive combined as ENGINE_METRICS says."""
    requests: Counter[tuple[str, int]] = Counter()
    models: Counter[str] = Counter()
    hist: Counter[int] = Counter()
    stats: dict[str, Any] = {}
    for snap in snapshots:
        requests.update(snap["requests"])
        models.update(snap["models"])
        hist.update({int(k): v for k, v in (snap["stats"].get("batch_size_histogram") or {}).items()})
    for _, _, key, how, _ in ENGINE_METRICS:
        values = [float(v) for s in snapshots if isinstance(v := s["stats"].get(key), int | float)]
        if values:
            stats[key] = COMBINE[how](values)
    if hist:
        stats["batch_size_histogram"] = dict(hist)
    return {"requests": dict(requests), "models": dict(models), "stats": stats,
            "rss": sum(int(s["rss"]) for s in snapshots)}


Family = tuple[str, str, str, list[tuple[dict[str, Any], float]]]  # name, kind, help, samples


def _families(snap: Snapshot) -> list[Family]:
    """Every metric family of one snapshot, always the same names in the same order (empty families included)."""
    stats = snap["stats"]
    out: list[Family] = [
        ("uaii_http_requests_total", "counter", "HTTP requests by route template and status",
         [({"route": r, "status": s}, n) for (r, s), n in sorted(snap["requests"].items())]),
        ("uaii_model_loaded", "gauge", "1 for the model loaded now",
         [({"model": m}, n) for m, n in sorted(snap["models"].items())]),
    ]
    for name, kind, key, _, help_text in ENGINE_METRICS:
        value = stats.get(key)
        out.append((name, kind, help_text, [({}, float(value))] if isinstance(value, int | float) else []))
    hist = stats.get("batch_size_histogram") or {}
    out.append(("uaii_decode_steps_total", "counter", "batched decode steps by batch size (sequences per step)",
                [({"batch_size": int(k)}, v) for k, v in sorted(hist.items(), key=lambda kv: int(kv[0]))]))
    out.append(("uaii_process_resident_memory_bytes", "gauge", "resident set of the server process (VmRSS)",
                [({}, snap["rss"])]))
    return out


# how replicas' values of a figure combine: counters and additive gauges sum; a per-token ratio is their mean; a
# flag that holds only when it holds everywhere is their minimum
COMBINE: dict[str, Callable[[list[float]], float]] = {"sum": sum, "mean": lambda v: sum(v) / len(v), "min": min}

# (metric, kind, engine stats key, combined over replicas by, help)
ENGINE_METRICS = (
    ("uaii_requests_total", "counter", "requests_total", "sum", "generation requests the engine accepted"),
    ("uaii_sequences_active", "gauge", "requests_active", "sum", "sequences being decoded now"),
    ("uaii_sequences_queued", "gauge", "requests_queued", "sum",
     "requests waiting for a free sequence slot or memory"),
    ("uaii_batched_decode", "gauge", "batched_decode", "min",
     "1 when a decode step is one pass over every sequence, 0 when it runs one pass per sequence (the backend "
     "cannot batch, or the batched executable does not fit the memory budget)"),
    ("uaii_prompt_tokens_total", "counter", "prompt_tokens_total", "sum", "prompt tokens prefilled"),
    ("uaii_completion_tokens_total", "counter", "completion_tokens_total", "sum", "tokens generated"),
    ("uaii_decode_tokens_per_second", "gauge", "decode_tok_s", "sum",
     "aggregate decode tokens/s over the recent steps"),
    ("uaii_bytes_read_per_token", "gauge", "bytes_read_per_token", "mean",
     "weight bytes read from storage per forward pass"),
    ("uaii_read_gigabytes_per_second", "gauge", "read_gb_s", "sum", "weight read throughput (GB/s of I/O busy time)"),
    ("uaii_expert_cache_hits_total", "counter", "expert_cache_hits", "sum", "MoE expert cache hits"),
    ("uaii_expert_cache_misses_total", "counter", "expert_cache_misses", "sum", "MoE expert cache misses"),
)


__all__ = ["CONTENT_TYPE", "ENGINE_METRICS", "Metrics", "MetricsMiddleware", "Snapshot", "combine",
           "process_rss_bytes", "render", "render_replicas", "route_label", "snapshot"]

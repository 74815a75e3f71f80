"""The storage side of a Session under a memory budget: the streaming store the plan asks for (pinned set read
once, staging, the MoE expert cache), its telemetry, and the byte counts the planner and the stats need.

Without a budget the session maps every weight (``MmapStore``); with one, weights the plan marks ``streamed`` are
read through a :class:`~uaii.storage.StreamingStore` around the steps that use them (see docs/runtime.md,
"Streaming under a budget").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from uaii.runtime.errors import SessionError
from uaii.runtime.model import ModelBundle, _nbytes
from uaii.runtime.options import SessionOptions

log = logging.getLogger("uaii.runtime")


def streaming_setup(plan: Any, graph: Any, bundle: ModelBundle, options: SessionOptions,
                    backend: Any) -> tuple[Any, dict[str, Any]]:
    """Under a budget: a StreamingStore with the plan's staging bytes, the pinned set read once, and what the
    backend needs to acquire the streamed weights around the steps that read them: (store, compile options; the
    MoE expert cache is one of them). (None, {}) when the session maps its weights after all (no plan, or a
    backend that cannot stream), which is warned about."""
    from uaii.storage import StreamingStore

    o, b = options, bundle
    storage = getattr(plan, "storage", None)
    if storage is None or not storage.budget_bytes:
        log.warning("[runtime] budget_bytes=%d: no storage plan (planning failed), so every weight is "
                    "memory-mapped and the budget is not enforced", o.budget_bytes)
        return None, {}
    if backend.name != "cpu":
        log.warning("[runtime] budget_bytes=%d: the %s backend cannot stream weights yet; every weight is "
                    "memory-mapped and the budget is not enforced", o.budget_bytes, backend.name)
        return None, {}
    streamed = [w.ref for w in storage.weights if w.mode == "streamed"]
    refs = {str(t.weight) for t in graph.weights if t.weight is not None}
    pinned = [w.ref for w in storage.weights if w.mode == "pinned" and w.ref in refs]
    staging = sum(storage.staging_buffers)
    store = StreamingStore(b.locations, max(staging, 4096), max_inflight=o.stream_read_ahead)
    try:
        return _with_pins(store, storage, graph, o, streamed, pinned)
    except BaseException:
        store.close()  # the session never saw it: nobody else would close it
        raise


def _with_pins(store: Any, storage: Any, graph: Any, o: SessionOptions, streamed: list[str],
               pinned: list[str]) -> tuple[Any, dict[str, Any]]:
    from uaii.storage import ExpertCache

    if pinned:
        store.pin(pinned)
    cache = None
    banks = _moe_banks(graph, set(streamed))
    if banks:
        # one expert of each bank of a node (a read window may straddle one more page than the first expert's)
        one = max(sum(store.buffer_bytes(str(t.weight.with_expert(0))) + 4096 for t in ts)
                  for ts in banks.values())
        if 0 < o.expert_cache_bytes < one:
            log.warning("[runtime] expert_cache_bytes=%d cannot hold one expert's gate, up and down "
                        "weights (%d bytes); the cache holds one", o.expert_cache_bytes, one)
        # the plan counts the cache in the budget (at least one expert of each bank; experts are never staged)
        budget = max(storage.expert_cache_bytes, o.expert_cache_bytes, one)
        cache = ExpertCache(store, budget)
    return store, {"streamed": streamed, "prefetch_order": storage.prefetch_order, "expert_cache": cache,
                   "chunk_bytes": max(storage.staging_buffers, default=0)}


def storage_stats(store: Any, plan: Any, exe: Any) -> dict[str, Any]:
    """The storage telemetry of a session: ``mode`` (``"mmap"`` or ``"streaming"``), ``bytes_read`` (total file
    bytes read), ``bytes_read_per_token`` (mean over the forward passes measured), ``read_gb_s`` (bytes read / I/O
    busy time), ``staging``, ``expert_cache`` (hits, misses, per layer) and the plan's figures."""
    if store is None:
        raise SessionError("[runtime] cannot read storage stats: the session is closed")
    st = dict(store.stats())
    st["mode"] = store.mode
    st.setdefault("bytes_read", 0)
    st["bytes_read_per_token"] = float(st.get("bytes_per_token_mean", 0.0))
    st["read_gb_s"] = float(st.get("read_gbps", 0.0))
    storage = getattr(plan, "storage", None)
    if storage is not None:
        st["budget_bytes"] = storage.budget_bytes
        st["plan_streamed_bytes_per_token"] = storage.streamed_bytes_per_token
        st["pinned_bytes"] = storage.pinned_bytes
        st["staging_bytes"] = storage.staging_bytes
    streaming = getattr(exe, "streaming", None)
    if streaming is not None:
        st["relowered"] = streaming.relowered
    return st


def kv_cache_bytes(graph: Any, slots: int, dtype: str = "f32") -> int:
    """Bytes of a KV cache of ``slots`` tokens (``dtype`` f32 or f16): every past_k.N / past_v.N input is
    [past, heads, dim]."""
    item = 2 if dtype == "f16" else 4
    total = 0
    for name in graph.inputs:
        if name.startswith(("past_k.", "past_v.")):
            shape = graph.tensor(name).shape
            per = 1
            for d in shape[1:]:
                per *= int(d) if isinstance(d, int) else 0
            total += per * item * slots
    return total


def _moe_banks(graph: Any, streamed: set[str]) -> dict[str, list[Any]]:
    """MoE nodes whose expert banks stream: node name → its gate, up and down bank tensors."""
    out: dict[str, list[Any]] = {}
    for n in graph.nodes:
        if n.op in ("MoEExperts", "MoEExpertsSwiGLU"):
            ts = [graph.tensor(x) for x in n.inputs[3:6]]
            if any(t.weight is not None and str(t.weight) in streamed for t in ts):
                out[n.name] = ts
    return out


def bytes_per_token(graph: Any, locations: Mapping[str, Any], plan: Any) -> int:
    """Weight bytes one decode step reads: every weight once, one row of a table only looked up, and top_k of the
    experts of a bank."""
    consumers: dict[str, list[Any]] = {}
    for n in graph.nodes:
        for x in n.inputs:
            consumers.setdefault(x, []).append(n)
    total = 0
    for t in graph.weights:
        size = _nbytes(locations, t)
        users = consumers.get(t.name, [])
        ops = {n.op for n in users}
        if ops and ops <= {"Embedding", "Gather"} and t.shape:
            size //= max(int(t.shape[0]), 1)
        elif ops and ops <= {"MoEExperts", "MoEExpertsSwiGLU"}:
            k, e = int(users[0].get("top_k", 1)), max(int(users[0].get("n_experts", 1)), 1)
            size = size * min(k, e) // e
        total += size
    return total


__all__ = ["bytes_per_token", "kv_cache_bytes", "storage_stats", "streaming_setup"]

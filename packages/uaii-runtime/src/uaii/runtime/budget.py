"""The storage side of a Session under a memory budget: the streaming store the plan asks for (pinned set read
once, staging, the MoE expert cache), its telemetry, and the byte counts the planner and the stats need.

Without a budget the session maps every weight (``MmapStore``); with one, weights the plan marks ``streamed`` are
read through a :class:`~uaii.storage.StreamingStore` around the steps that use them (see docs/runtime.md,
"Streaming under a budget"). After compile, what the executable reports it allocates is held to the budget
(:func:`check_memory`), and the KV cache the plan counts is that of the cached Attention layers the backends bind
(:func:`kv_cache_bytes`, through :func:`uaii.ir.kvcache.kv_layers`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from uaii.ir import Graph
from uaii.ir.kvcache import kv_layers
from uaii.ir.ops import WeightAccess
from uaii.ir.registry import find_schema
from uaii.runtime.errors import SessionError
from uaii.runtime.model import ModelBundle, _nbytes
from uaii.runtime.options import SessionOptions

if TYPE_CHECKING:
    from uaii.backends.base import Backend, Executable, ExecutableMemory, KVStateLike
    from uaii.ir.plan import ExecutionPlan

log = logging.getLogger("uaii.runtime")


def streaming_setup(plan: Any, graph: Any, bundle: ModelBundle,
                    options: SessionOptions) -> tuple[Any, dict[str, Any]]:
    """Under a budget, for a backend that streams weights (the Session checked ``capabilities.streams_weights``): a
    StreamingStore with the plan's staging bytes, the pinned set read once, and the plan's storage plan as the
    backend's streaming compile options — the streamed references, the plan's ``prefetch_order`` (the order the
    backend queues reads in), the MoE expert cache, one staging buffer's bytes: (store, options). (None, {}) when
    the session maps its weights after all (no storage plan: planning failed), which is warned about."""
    from uaii.storage import StreamingStore

    o, b = options, bundle
    storage = getattr(plan, "storage", None)
    if storage is None or not storage.budget_bytes:
        log.warning("[runtime] budget_bytes=%d: no storage plan (planning failed), so every weight is "
                    "memory-mapped and the budget is not enforced", o.budget_bytes)
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
        cache = ExpertCache(store, budget, min_bytes=one)
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


def kv_layer_bytes(graph: Graph, slots: int, dtype: str = "f32") -> list[int]:
    """Bytes of a KV cache of ``slots`` tokens (``dtype`` f32 or f16) in each cached Attention layer of ``graph``
    (:func:`uaii.ir.kvcache.kv_layers`, the analysis the backends bind their KV states with)."""
    width = 2 if dtype == "f16" else 4
    return [layer.elements_per_token() * width * slots for layer in kv_layers(graph)]


def kv_cache_bytes(graph: Graph, slots: int, dtype: str = "f32") -> int:
    """Bytes of a KV cache of ``slots`` tokens (``dtype`` f32 or f16) over the cached Attention layers of ``graph``:
    the sum of :func:`kv_layer_bytes`."""
    return sum(kv_layer_bytes(graph, slots, dtype))


def check_memory(backend: Backend, exe: Executable, kv: KVStateLike | None, options: SessionOptions,
                 plan: ExecutionPlan | None, *, enforced: bool, final: bool = False) -> int:
    """After compile: what the executable reports it allocates (``exe.memory()``) plus the KV state's ``nbytes``,
    held to the budget as the planner holds its plan — with the backend's own numbers instead of the planner's
    estimate (the backend's arena, not the planner's; the streaming buffers it allocates, row buffers included).

    A host executable is checked against ``budget_bytes`` when the budget is ``enforced`` (the store streams;
    without a storage plan every weight is mapped, as warned); a device executable against
    ``capabilities.device_memory`` (when the backend knows it). Within the limit: 0. Over it, on the host, the
    first time (not ``final``): the bytes the executable allocates beyond the plan's estimate, for the Session to
    plan once more with that much less (the planner then pins less, as it would have had it known). Otherwise a
    BudgetError that names every part, as the planner's does."""
    from uaii.planner import BudgetError

    mem = exe.memory()
    kv_bytes = int(kv.nbytes) if kv is not None else 0
    parts = {"arena": mem.arena_bytes, "weights": mem.weight_bytes, "staging": mem.staging_bytes,
             "kv_cache": kv_bytes}
    total = sum(parts.values())
    if mem.device == "host":
        limit, what = (options.budget_bytes if enforced else 0), "memory budget"
    else:
        limit, what = backend.capabilities.device_memory, f"{backend.name} device memory"
    if not limit or total <= limit:
        return 0
    estimate = plan.planned_bytes if plan is not None and mem.device == "host" else 0
    if not final and 0 < estimate < total:
        return total - estimate
    detail = " + ".join(f"{k.replace('_', ' ')} {v}" for k, v in parts.items())
    raise BudgetError(f"[runtime] {what} of {limit} bytes is too small: the {backend.name} executable allocates "
                      f"{detail} = {total} bytes (the plan estimated {estimate}); raise the budget or lower "
                      "max_batch / max_context", budget_bytes=limit, required_bytes=total, parts=parts)


def executable_extra(main: ExecutableMemory, other: ExecutableMemory, shared_staging: int) -> int:
    """Bytes a second executable of the same graph's weights (the batched decode one, the embedding one) allocates
    beyond the session's ``main`` one, by :func:`check_memory`'s rule: its whole arena; its staging beyond what
    every executable of the session shares (``shared_staging``: the store's staging pool and the expert cache),
    i.e. its own row buffers; and its weight bytes beyond main's — both bind the same weights from the same store,
    so those are views of one buffer, and only what it holds besides (converted copies) is new. A device
    executable's bytes are the device's, not the host budget's: 0."""
    if other.device != "host":
        return 0
    staging = max(other.staging_bytes - shared_staging, 0) if other.staging_bytes else 0
    return other.arena_bytes + staging + max(other.weight_bytes - main.weight_bytes, 0)


def _moe_banks(graph: Any, streamed: set[str]) -> dict[str, list[Any]]:
    """Nodes whose expert banks stream: node name → the bank tensors it reads by expert (its schema's EXPERTS
    inputs: gate, up and down for MoEExperts)."""
    out: dict[str, list[Any]] = {}
    weights = {t.name for t in graph.weights}
    for n in graph.nodes:
        schema = find_schema(n.op, n.version)
        reads = schema.weight_inputs(n, weights, access=WeightAccess.EXPERTS) if schema is not None else []
        ts = [graph.tensor(w.name) for w in reads]
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


__all__ = ["bytes_per_token", "check_memory", "executable_extra", "kv_cache_bytes", "kv_layer_bytes", "storage_stats",
           "streaming_setup"]

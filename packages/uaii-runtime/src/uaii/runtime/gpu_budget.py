"""Storage-first on a device: which weights stay resident in a backend's device memory and which stream from the
host store through staging buffers before each use, under a device-memory budget (``gpu_budget_bytes``,
``--gpu-budget``).

Why a second budget: a backend with device memory (``Capabilities.device_memory > 0``, the WebGPU backend) holds
its weights, activations and KV cache there, not in host RAM; the host budget (``budget_bytes``) still decides what
the host store keeps. A model larger than the device must still run, so what does not fit streams.

The rule is the planner's, not a second one: :func:`uaii.planner.storage_for_uses` with the device budget —
small vectors (norm scales, biases) first, then the globals, the embeddings, lm_head and the first ``pin_layers``
trunk layers, then (``fill_pins``) further layers while the budget holds — over the arena and KV cache the device
holds. Without a host budget the streamed weights the host keeps are also named ``host_resident``: a backend may
hold them in page-locked host memory (the host-pinned tier) and copy them to the device from there each use. Two
differences, both of how a GPU streams: the backend's ``Capabilities.staging_buffers`` staging buffers
(WebGPU: one, refilled after the work that read it was submitted; CUDA: two, one filled on a copy stream while
kernels read the other), and every streamed weight passes through it
in chunks of whole rows (``chunk_bytes``: a matrix's output features, a table's rows, a bank's experts) — no
embedding rows looked up on the host, no host expert cache. A backend that gathers a streamed bank's chosen experts
into a buffer of their own (``Capabilities.expert_staging``: CUDA) gets one more staging buffer counted once a bank
streams, and what the budget then leaves (up to the streamed banks' bytes) as a device expert cache
(``expert_cache_bytes``, a compile option it declares) that keeps recently chosen experts between steps. A weight
the host budget streams also streams on the device: the
host does not keep it, so the device reads it from the host store each time (acquire, upload, release).

Default budget: :data:`DEVICE_FRACTION` of the device memory the backend reports (the driver, the display and other
programs need the rest).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from uaii.runtime.errors import SessionError
from uaii.runtime.options import SessionOptions
from uaii.runtime.presets import format_bytes

if TYPE_CHECKING:
    from uaii.backends.base import Backend
    from uaii.ir import Graph

log = logging.getLogger("uaii.runtime")

DEVICE_FRACTION = 0.8
"""The share of a device's memory the default device budget takes."""


@dataclass(frozen=True)
class DeviceResidency:
    """Where every weight lives on the device: ``resident`` references are uploaded once, ``streamed`` ones before
    every step that reads them. The byte counts are the planner's estimate under ``budget_bytes``."""

    backend: str
    device_memory: int
    budget_bytes: int
    resident: tuple[str, ...] = ()
    streamed: tuple[str, ...] = ()
    resident_bytes: int = 0
    streamed_bytes: int = 0
    staging_bytes: int = 0
    arena_bytes: int = 0
    kv_cache_bytes: int = 0
    staging_buffers: int = 1
    expert_cache_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.resident_bytes + self.staging_bytes + self.arena_bytes + self.kv_cache_bytes + \
            self.expert_cache_bytes

    def describe(self) -> str:
        """``webgpu: 30 of 272 weights stream (1.2 GiB), 0.4 GiB resident; budget 1.6 GiB of 2.0 GiB``."""
        n = len(self.resident) + len(self.streamed)
        cache = f", expert cache {format_bytes(self.expert_cache_bytes)}" if self.expert_cache_bytes else ""
        return (f"{self.backend}: {len(self.streamed)} of {n} weights stream ({format_bytes(self.streamed_bytes)}), "
                f"{format_bytes(self.resident_bytes)} resident, staging {format_bytes(self.staging_bytes)} "
                f"({self.staging_buffers} buffers)"
                f"{cache}; device "
                f"budget {format_bytes(self.budget_bytes)} of {format_bytes(self.device_memory)}")


def device_budget(device_memory: int, requested: int = 0) -> int:
    """The device budget: ``requested`` when given (> 0), else :data:`DEVICE_FRACTION` of ``device_memory``."""
    if requested:
        return int(requested)
    return int(device_memory * DEVICE_FRACTION)


def plan_residency(graph: Graph, order: Any, *, backend: str, device_memory: int, budget_bytes: int,
                   arena_bytes: int = 0, kv_cache_bytes: int = 0, pin_layers: int | None = None,
                   host_streamed: frozenset[str] = frozenset(), staging_buffers: int = 1,
                   expert_staging: bool = False) -> DeviceResidency:
    """The residency of the weights ``order`` (the nodes in execution order) reads, under ``budget_bytes`` (see the
    module doc). ``host_streamed``: references the host store does not keep, which stream on the device too.
    ``expert_staging`` (Capabilities.expert_staging): when an expert bank streams, one more staging buffer's bytes
    hold its chosen experts — planned again with that buffer when the first plan streams a bank."""
    from uaii.ir.plan import ArenaLayout
    from uaii.planner import BudgetError, PlannerOptions, storage_for_uses, weight_uses

    # a GPU reads a streamed weight through its staging buffer in chunks of rows (a table's rows, a bank's experts,
    # a matrix's output features): no row lookups from the host, no expert cache
    found = weight_uses(graph, list(order)).values()
    banks = {u.ref for u in found if u.expert}
    uses = [replace(u, chunk_row=u.chunk_row or u.expert, expert=0, staged=dict.fromkeys(u.staged, u.nbytes))
            for u in found]

    def plan(buffers: int) -> Any:
        kw: dict[str, Any] = {"budget_bytes": budget_bytes, "kv_cache_bytes": kv_cache_bytes,
                              "staging_buffers": buffers, "fill_pins": True}
        if pin_layers is not None:
            kw["pin_layers"] = pin_layers
        try:
            return storage_for_uses(uses, ArenaLayout(arena_bytes, 64, 1), PlannerOptions(**kw))
        except BudgetError as exc:
            why = str(exc).removeprefix("[planner] ")
            raise SessionError(f"[runtime] the {backend} device budget (gpu_budget_bytes) of {budget_bytes} bytes "
                               f"cannot hold the smallest device plan: {why}; raise --gpu-budget or lower max_batch "
                               "/ max_context") from None

    def streams(w: Any) -> bool:
        return bool(w.mode == "streamed" or w.ref in host_streamed)

    buffers = max(1, staging_buffers)
    storage = plan(buffers)
    if expert_staging and any(streams(w) for w in storage.weights if w.ref in banks):
        buffers += 1  # the expert area: one more buffer of a staging buffer's bytes
        storage = plan(buffers)
    resident, streamed = [], []
    resident_bytes = streamed_bytes = 0
    for w in storage.weights:
        if streams(w):
            streamed.append(w.ref)
            streamed_bytes += w.nbytes
        else:
            resident.append(w.ref)
            resident_bytes += w.nbytes
    staging = storage.staging_bytes if streamed else 0
    used = resident_bytes + staging + arena_bytes + kv_cache_bytes
    # what the budget leaves keeps streamed banks' recent experts on the device (a backend gathering them)
    banks_bytes = sum(w.nbytes for w in storage.weights if w.ref in banks and streams(w))
    cache = min(max(budget_bytes - used, 0), banks_bytes) if expert_staging else 0
    return DeviceResidency(backend, device_memory, budget_bytes, tuple(resident), tuple(streamed), resident_bytes,
                           streamed_bytes, staging, arena_bytes, kv_cache_bytes, buffers, cache)


def device_streaming(backend: Backend, graph: Graph, plan: Any, options: SessionOptions,
                     streaming: dict[str, Any], kv_cache_bytes: int) -> tuple[DeviceResidency | None, dict[str, Any]]:
    """For the Session: the residency on ``backend``'s device and the streaming compile options that carry it
    (``streaming``, the host's, with ``streamed`` replaced by the device's list). A host backend
    (``device_memory == 0``) gets ``(None, streaming)`` unchanged (``gpu_budget_bytes`` given for it was refused
    or warned about before planning: :func:`uaii.runtime.capabilities.check_backend`)."""
    caps = backend.capabilities
    o = options
    if not caps.device_memory:
        return None, streaming
    from uaii.backends.base import plan_graph

    steps = plan_graph(graph, plan) if plan is not None else graph  # the nodes in the order they run
    arena = int(plan.arena.size) if plan is not None else 0
    host_streamed = frozenset(streaming.get("streamed", ()))
    residency = plan_residency(steps, steps.nodes, backend=backend.name,
                               device_memory=caps.device_memory,
                               budget_bytes=device_budget(caps.device_memory, o.gpu_budget_bytes),
                               arena_bytes=arena, kv_cache_bytes=kv_cache_bytes, pin_layers=o.pin_layers,
                               host_streamed=host_streamed, staging_buffers=caps.staging_buffers,
                               expert_staging=caps.expert_staging)
    if residency.streamed and not caps.streams_weights:
        raise SessionError(f"[runtime] {residency.describe()}, but the {backend.name} backend does not stream "
                           "weights (capabilities.streams_weights is False); raise --gpu-budget")
    log.info("[runtime] %s", residency.describe())
    kw = {k: v for k, v in streaming.items() if k not in ("expert_cache", "chunk_bytes", "streamed")}
    chunk = residency.staging_bytes // residency.staging_buffers  # one buffer's bytes: the largest piece
    # without a host budget, host memory may hold a second copy of what the device streams (the host-pinned tier:
    # page-locked, copied to the device without passing through a staging buffer); under one, it may not
    host_resident = [r for r in residency.streamed if r not in host_streamed] if not o.budget_bytes else []
    extra = {"expert_cache_bytes": residency.expert_cache_bytes} if "expert_cache_bytes" in caps.compile_options \
        and residency.expert_cache_bytes else {}
    return residency, {**kw, "streamed": list(residency.streamed), "chunk_bytes": chunk,
                       "host_resident": host_resident, **extra}


__all__ = ["DEVICE_FRACTION", "DeviceResidency", "device_budget", "device_streaming", "plan_residency"]

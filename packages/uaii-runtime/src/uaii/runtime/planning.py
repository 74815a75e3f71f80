"""How a Session plans: the planner's options from the session's, and what happens when planning fails.

Under a budget the planner is told the real KV cache size (:func:`uaii.runtime.budget.kv_cache_bytes` of the slots
the session will allocate) and the expert cache, and spends what the budget holds beyond the minimum on pinning
more layers (``fill_pins``). A graph the planner cannot plan (a symbolic dim without a bound) runs in its own order,
with a warning; a budget that cannot hold the minimum is the caller's to fix (the planner's BudgetError).

The arena is the backend's (:func:`arena_policy`): the planner asks ``backend.plan_arena`` for the fused graph in
step order, so the plan's arena — which the budget counts — is what the executable allocates, and the backend's
rule keys the plan (a CPU plan is never served to WebGPU).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from uaii.ir import Graph, UaiiError
from uaii.ir.plan import PLANNER_ARENA
from uaii.runtime.budget import kv_cache_bytes
from uaii.runtime.errors import SessionError
from uaii.runtime.model import ModelBundle
from uaii.runtime.options import SessionOptions

if TYPE_CHECKING:
    from uaii.backends.base import Backend
    from uaii.ir.graph import Node
    from uaii.ir.plan import ArenaLayout, ExecutionPlan
    from uaii.planner import ArenaPolicy, PlannerOptions

log = logging.getLogger("uaii.runtime")

READ_AHEAD = 1 / 16
"""The planner's ``read_ahead`` under a budget: a disk reads at most 1/16 of what the memory-bound products read in
the same time (NVMe 3-7 GB/s against 50-120 GB/s of memory on laptops and desktops; a SATA disk or a virtual one
less), so the staging pool never grows past 1/16 of the pinned run it reads through."""


def windowed(options: SessionOptions, context: int) -> bool:
    """Whether the KV state is a resident window: a window is set and, with absolute positions, smaller than the
    context. Positions stop at the context, so a larger window never slides: the state is then the context's, in
    fewer slots (``--max-context 256`` under the auto preset's 2048-token window allocated 8x the bytes)."""
    o = options
    return bool(o.kv_window) and (o.kv_positions == "cache" or o.kv_window + o.kv_sinks < context)


def kv_slots(options: SessionOptions, context: int) -> int:
    """Slots of the session's KV state: the window plus sinks (:func:`windowed`), or the whole context."""
    o = options
    return o.kv_window + o.kv_sinks if windowed(o, context) else context


def arena_policy(backend: Backend) -> ArenaPolicy | None:
    """The planner's :class:`~uaii.planner.ArenaPolicy` for ``backend``: its rule (``capabilities.arena``) laying
    out the fused graph in the planner's order with ``backend.plan_arena``; None for a backend that declares it
    consumes the planner's generic layout. A backend that declares no rule is refused: the plan's arena would be
    an estimate of memory nobody allocates."""
    from uaii.planner import ArenaPolicy

    rule = backend.capabilities.arena
    if rule == PLANNER_ARENA:
        return None
    if not rule:
        raise SessionError(f"[runtime] backend {backend.name!r} declares no arena rule (Capabilities.arena): "
                           "declare its own (and implement plan_arena) or 'planner' to run the planner's layout")

    def layout(fused: Graph, order: Sequence[Node], options: PlannerOptions) -> ArenaLayout:
        return backend.plan_arena(replace(fused, nodes=tuple(order)), options.max_tokens,
                                  memory_reuse=options.enable_memory_reuse)

    return ArenaPolicy(rule, layout)


def session_plan(graph: Graph, bundle: ModelBundle, options: SessionOptions, *, backend: Backend, context: int,
                 budget: int, cached: bool | None = None) -> tuple[ExecutionPlan | None, bool]:
    """(plan, cache hit) of ``graph`` for a session on ``backend`` holding ``context`` tokens, planned for
    ``budget`` bytes (the session's budget, or less when the backend allocates what the plan does not count; see
    :func:`uaii.runtime.budget.check_memory`), with the backend's arena (:func:`arena_policy`). (None, False) when
    the planner is missing or cannot plan it. ``cached``: whether ``graph`` keeps a KV cache of ``context`` tokens
    (default: the bundle is a decoder LM; a pipeline stage's graph has cached layers without being one)."""
    cached = bundle.generative if cached is None else cached
    try:
        from uaii.planner import BudgetError, PlannerOptions, plan
    except ImportError:  # the planner is optional: the backend then follows the graph's own order
        return None, False
    o = options
    policy = arena_policy(backend)
    kw: dict[str, Any] = dict(enable_fusion=o.enable_fusion, enable_memory_reuse=o.enable_memory_reuse,
                              max_tokens=o.max_batch, budget_bytes=budget, device=backend.name)
    if budget:
        kw["kv_cache_bytes"] = kv_cache_bytes(graph, kv_slots(o, context), o.kv_dtype) if cached else 0
        kw["expert_cache_bytes"] = o.expert_cache_bytes
        kw["fill_pins"] = True  # what the budget holds beyond the minimum is spent on pinning more layers
        kw["read_ahead"] = READ_AHEAD  # the disk keeps reading while a pinned lm_head computes
    if o.pin_layers is not None:
        kw["pin_layers"] = o.pin_layers
    bounds = {d: o.max_batch for name in graph.inputs for d in graph.tensor(name).shape
              if isinstance(d, str) and d != "seq"}
    if cached:
        bounds["past"] = context
    kw["dim_bounds"] = bounds
    try:
        return plan(graph, PlannerOptions(**kw), cache=o.plan_cache, arena=policy)
    except UaiiError as exc:  # e.g. a symbolic dim without a bound: run the graph in its own order
        if isinstance(exc, SessionError | BudgetError):
            raise  # a budget that cannot hold the minimum is the caller's to fix
        log.warning("[runtime] planning %s failed (%s); executing the graph in its own order", bundle.path.name, exc)
        return None, False


def replan(graph: Graph, bundle: ModelBundle, options: SessionOptions, *, backend: Backend, context: int,
           unplanned: int) -> tuple[ExecutionPlan | None, bool]:
    """The plan for the budget less the ``unplanned`` bytes the backend allocates beyond the first plan's estimate
    (logged); a BudgetError naming both when even the smallest plan does not fit what is left."""
    from uaii.planner import BudgetError

    budget, device = options.budget_bytes, backend.name
    log.info("[runtime] the %s executable allocates %d bytes more than the plan counts; planning for %d of the "
             "%d-byte budget", device, unplanned, budget - unplanned, budget)
    try:
        if budget <= unplanned:
            raise BudgetError(f"nothing is left of it (needs {unplanned})", budget_bytes=budget,
                              required_bytes=unplanned, parts={"unplanned": unplanned})
        return session_plan(graph, bundle, options, backend=backend, context=context, budget=budget - unplanned)
    except BudgetError as exc:
        raise BudgetError(f"[runtime] memory budget of {budget} bytes is too small: the {device} executable "
                          f"allocates {unplanned} bytes beyond what the plan counts, and for the rest {exc}",
                          budget_bytes=budget, required_bytes=exc.required_bytes + unplanned,
                          parts={**exc.parts, "unplanned": unplanned}) from None


__all__ = ["arena_policy", "kv_slots", "replan", "session_plan", "windowed"]

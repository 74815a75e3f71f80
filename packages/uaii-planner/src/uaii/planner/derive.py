"""What planning derives from the fused graph before it chooses anything, computed once per :func:`plan` call.

The budget ceiling (:func:`uaii.planner.planner.budget_ceiling`), the check of a cached plan
(:mod:`uaii.planner.check`) and the builder of a plan on a miss all start from the same deterministic facts: the
execution order, the weights the steps read and the arena values with their lifetimes. ``plan()`` derives them once
and hands the record to each rather than each deriving them again (on Gemma-3 270M that saves ~3 ms of a ~40 ms
cache hit, and the fusion and derivation of ~5 ms of a miss; docs/planner.md).

None of them depends on the budget, so the record serves the caller's options and the options the plan is keyed by
(:func:`uaii.planner.planner.keyed_options`: the same but for ``budget_bytes``) alike. With a backend's arena policy
(:class:`uaii.planner.memory.ArenaPolicy`) the record holds the backend's arena too: the build of a miss uses it,
the budget ceiling counts its size, and the check of a hit compares the cached arena with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from uaii.ir.graph import Graph, Node
from uaii.ir.plan import ArenaLayout, BufferSlot
from uaii.ir.registry import Registry
from uaii.planner.liveness import execution_order
from uaii.planner.memory import ArenaPolicy, arena_values
from uaii.planner.options import PlannerOptions
from uaii.planner.storage import WeightUse, weight_uses


@dataclass(frozen=True)
class Derived:
    """The fused graph, its execution order, its weight uses (:func:`uaii.planner.storage.weight_uses`, in first-use
    order) and either its unplaced arena slots (:func:`uaii.planner.memory.arena_values`, which the planner lays
    out) or, with an arena policy, the backend's arena (``slots`` is then empty: the generic values are neither
    needed nor always derivable — a backend may bound dims the generic rule cannot). Read-only: it is shared."""

    fused: Graph
    order: tuple[Node, ...]
    uses: Mapping[str, WeightUse]
    slots: tuple[BufferSlot, ...]
    arena: ArenaLayout | None = None


def derive(fused: Graph, options: PlannerOptions, registry: Registry | None = None,
           arena: ArenaPolicy | None = None) -> Derived:
    """The record of ``fused`` (the graph after the options' fusion passes, :func:`uaii.planner.fuse`); ``arena``:
    the backend's arena policy, asked once here (and then the generic arena values are not derived)."""
    order = tuple(execution_order(fused))
    uses = weight_uses(fused, order, registry)
    if arena is not None:
        return Derived(fused, order, uses, (), arena(fused, order, options))
    return Derived(fused, order, uses, tuple(arena_values(fused, order, options, registry)))


__all__ = ["Derived", "derive"]

"""What planning derives from the fused graph before it chooses anything, computed once per :func:`plan` call.

The budget ceiling (:func:`uaii.planner.planner.budget_ceiling`), the check of a cached plan
(:mod:`uaii.planner.check`) and the builder of a plan on a miss all start from the same deterministic facts: the
execution order, the weights the steps read and the arena values with their lifetimes. ``plan()`` derives them once
and hands the record to each rather than each deriving them again (on Gemma-3 270M that saves ~3 ms of a ~40 ms
cache hit, and the fusion and derivation of ~5 ms of a miss; docs/planner.md).

None of them depends on the budget, so the record serves the caller's options and the options the plan is keyed by
(:func:`uaii.planner.planner.keyed_options`: the same but for ``budget_bytes``) alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from uaii.ir.graph import Graph, Node
from uaii.ir.plan import BufferSlot
from uaii.ir.registry import Registry
from uaii.planner.liveness import execution_order
from uaii.planner.memory import arena_values
from uaii.planner.options import PlannerOptions
from uaii.planner.storage import WeightUse, weight_uses


@dataclass(frozen=True)
class Derived:
    """The fused graph, its execution order, its weight uses (:func:`uaii.planner.storage.weight_uses`, in first-use
    order) and its unplaced arena slots (:func:`uaii.planner.memory.arena_values`). Read-only: it is shared."""

    fused: Graph
    order: tuple[Node, ...]
    uses: Mapping[str, WeightUse]
    slots: tuple[BufferSlot, ...]


def derive(fused: Graph, options: PlannerOptions, registry: Registry | None = None) -> Derived:
    """The record of ``fused`` (the graph after the options' fusion passes, :func:`uaii.planner.fuse`)."""
    order = tuple(execution_order(fused))
    return Derived(fused, order, weight_uses(fused, order, registry),
                   tuple(arena_values(fused, order, options, registry)))


__all__ = ["Derived", "derive"]

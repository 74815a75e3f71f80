"""A backend's arena policy: the public plan check takes the policy the plan was made with, and derivation asks the
policy alone for the arena (the generic arena values are not computed, so a dim only the backend can bound is no
error)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from planner_helpers import Builder, llama

from uaii.ir import Graph
from uaii.ir.graph import Node
from uaii.ir.plan import ArenaLayout, BufferSlot
from uaii.planner import ArenaPolicy, PlannerError, PlannerOptions, fuse, plan, plan_problems
from uaii.planner.check import first_problem
from uaii.planner.memory import arena_layout, arena_values

OPTS = PlannerOptions(max_tokens=8)


def _generic_as(rule: str) -> ArenaPolicy:
    """A policy that lays the arena out as the planner does, under its own rule name."""
    def layout(fused: Graph, order: Sequence[Node], options: PlannerOptions) -> ArenaLayout:
        return replace(arena_layout(arena_values(fused, order, options), options), rule=rule)
    return ArenaPolicy(rule, layout)


def test_plan_problems_checks_a_backend_arena_against_its_policy() -> None:
    graph, policy = llama(1), _generic_as("test/1")
    p, _ = plan(graph, OPTS, cache=False, arena=policy)
    fused = fuse(graph, OPTS)
    assert list(plan_problems(p, graph, fused, OPTS, arena=policy)) == []
    assert first_problem(p, graph, fused, OPTS, arena=policy) is None
    # without the policy the generic rule is expected, and the backend's arena is reported
    assert "'test/1' rule, expected the planner's" in (first_problem(p, graph, fused, OPTS) or "")
    moved = replace(p, arena=replace(p.arena, slots=(replace(p.arena.slots[0], offset=64), *p.arena.slots[1:])))
    assert "has offset 64" in (first_problem(moved, graph, fused, OPTS, arena=policy) or "")


def _batched() -> Graph:
    b = Builder()
    x = b.input("x", "f32", ["batch", 8])
    b.op("Relu", [x], [("h", "f32", ["batch", 8])])
    b.outputs.append(b.op("Relu", ["h"], [("y", "f32", ["batch", 8])]))
    return b.build()


def test_a_policy_arena_is_not_derived_generically_too() -> None:
    """The generic rule cannot bound ``batch``; a backend that lays out its own arena can, and planning with its
    policy must not fail on the generic rule's values."""
    graph = _batched()
    with pytest.raises(PlannerError, match="'batch'"):
        plan(graph, OPTS, cache=False)

    def layout(fused: Graph, order: Sequence[Node], options: PlannerOptions) -> ArenaLayout:
        slot = BufferSlot("h", 0, 2 * 8 * 4, "f32", 0, 1)
        return ArenaLayout(size=64, alignment=options.alignment, max_tokens=options.max_tokens, slots=(slot,),
                           rule="batch/1")

    p, _ = plan(graph, OPTS, cache=False, arena=ArenaPolicy("batch/1", layout))
    assert p.arena.rule == "batch/1" and p.arena.size == 64

"""Execution order and liveness: when each value is produced and when it is read for the last time."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from uaii.ir.graph import Graph, Node, topological_order
from uaii.planner.errors import PlannerError


def execution_order(graph: Graph) -> tuple[Node, ...]:
    """``graph.nodes`` when already in topological order (builders and passes keep it so), else Kahn's order with
    ties broken by position, so the result is deterministic."""
    producers = graph.producers()
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    deps: list[set[int]] = []
    in_order = True
    for i, n in enumerate(graph.nodes):
        d = {position[producers[v].name] for v in n.inputs if v in producers}
        in_order = in_order and all(j < i for j in d)
        deps.append(d)
    if in_order:
        return graph.nodes
    order = topological_order(dict(enumerate(deps)))
    if len(order) != len(graph.nodes):
        done = set(order)
        stuck = [graph.nodes[i].name for i in range(len(graph.nodes)) if i not in done]
        raise PlannerError(f"graph {graph.name!r} has a cycle through node(s) {', '.join(stuck[:5])}")
    return tuple(graph.nodes[i] for i in order)


@dataclass(frozen=True)
class Interval:
    """A value is live from the step that produces it to the last step that reads it (inclusive)."""

    value: str
    first: int
    last: int

    def overlaps(self, other: Interval) -> bool:
        return self.first <= other.last and other.first <= self.last


def live_intervals(order: Sequence[Node]) -> dict[str, Interval]:
    """Every value produced by a node in ``order``; a value nobody reads dies at its producer."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for step, node in enumerate(order):
        for v in node.inputs:
            if v in first:
                last[v] = step
        for v in node.outputs:
            if v:
                first[v] = step
                last[v] = step
    return {v: Interval(v, first[v], last[v]) for v in first}


__all__ = ["Interval", "execution_order", "live_intervals"]

"""Plan steps: one kernel invocation per node of the (fused) graph, in execution order, with its device.

A step carries the node's op and version: what a backend runs (``uaii.backends.plan_graph`` rebuilds the node from
them). The kernel id beside them is for display only, never parsed: ``op/version/dtype``, where dtype is the weight
dtype of the node (``MatMul/1/q4_k``; several weight dtypes, as MoE banks may have, are joined with ``+``) or, for
nodes without weights, the dtype of the first input (``Add/1/f32``). Step attributes are the node's attributes with
the schema's defaults filled in, so a backend needs no schema to run a step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from uaii.ir.graph import Graph, Node
from uaii.ir.plan import Step
from uaii.ir.registry import Registry, default_registry

Placement = Callable[[Step], str]
"""Chooses the device of a step (a DeviceScheduler's decision); returns a device name such as ``"cpu"``."""


def kernel_id(graph: Graph, node: Node) -> str:
    tensors = [graph.tensor_map.get(v) for v in node.inputs if v]
    weights = list(dict.fromkeys(t.dtype.value for t in tensors if t is not None and t.is_weight))
    if weights:
        dtype = "+".join(weights)
    else:
        first = next((t for t in tensors if t is not None), None)
        if first is None:
            first = next((graph.tensor_map[v] for v in node.outputs if v in graph.tensor_map), None)
        dtype = first.dtype.value if first is not None else "none"
    return f"{node.op}/{node.version}/{dtype}"


def make_steps(graph: Graph, order: Sequence[Node], device: str = "cpu",
               registry: Registry | None = None) -> tuple[Step, ...]:
    reg = registry if registry is not None else default_registry()
    steps = []
    for node in order:
        schema = reg.find(node.op, node.version)
        if schema is not None:
            values, _ = schema.resolve_attrs(node)
            attrs = tuple(sorted(values.items()))
        else:
            attrs = tuple((k, a.value) for k, a in node.attributes)
        steps.append(Step(kernel_id(graph, node), node.name, node.inputs, node.outputs, device, attrs,
                          op=node.op, version=node.version))
    return tuple(steps)


def place(steps: Sequence[Step], placement: Placement | None) -> tuple[Step, ...]:
    """``steps`` with each device chosen by ``placement`` (unchanged without one)."""
    if placement is None:
        return tuple(steps)
    return tuple(replace(s, device=str(placement(s))) for s in steps)


__all__ = ["Placement", "kernel_id", "make_steps", "place"]

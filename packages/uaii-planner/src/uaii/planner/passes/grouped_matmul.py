"""Grouped MatMul: MatMuls that share one input → one ``GroupedMatMul`` (Q/K/V, gate/up).

Candidates are MatMuls with ``transpose_b`` whose B is a weight (the GGUF layout ``[N, K]``). Candidates that
read the same A and whose weights have the same dtype form a group; a group of two or more becomes one node with
inputs ``(A, W_1, ..., W_n)`` and the MatMuls' outputs in order. The weights stay separate weight references —
nothing is concatenated — and the kernel runs them as one grouped GEMV: A is read (and quantized for block
weights) once and the threads share the rows of all weights. The fused node takes the first member's position.
"""

from __future__ import annotations

from uaii.ir.graph import Graph, Node, attr
from uaii.ir.ops import Op
from uaii.ir.ops.fused import GROUPED_MATMUL_OP
from uaii.ir.registry import Registry
from uaii.planner.passes.rewrite import Rewrite


def fuse_grouped_matmul(graph: Graph, registry: Registry | None = None) -> Graph:
    """Group MatMuls sharing an input; see the module doc."""
    rw = Rewrite(graph, registry)
    groups: dict[tuple[str, str], list[Node]] = {}
    for node in graph.nodes:
        if not rw.fusible(node, Op.MATMUL) or not node.get("transpose_b", False) or len(node.inputs) != 2:
            continue
        w = rw.tensor(node.inputs[1])
        if w is None or not w.is_weight or w.rank != 2:
            continue
        groups.setdefault((node.inputs[0], w.dtype.value), []).append(node)
    for (a, _), members in groups.items():
        if len(members) < 2:
            continue
        first = members[0]
        fused = Node(rw.fresh_name(f"{first.outputs[0]}/{GROUPED_MATMUL_OP}"), GROUPED_MATMUL_OP,
                     (a, *(m.inputs[1] for m in members)), tuple(m.outputs[0] for m in members),
                     (("transpose_b", attr(True)),))
        rw.replace(members, fused, at=first)
    return rw.build()


__all__ = ["fuse_grouped_matmul"]

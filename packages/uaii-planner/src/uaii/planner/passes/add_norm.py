"""Residual add + norm: ``RMSNorm(Add(a, b))`` → ``AddRMSNorm(a, b)`` with two outputs.

In a pre-norm transformer every residual add feeds the next block's norm; the fused op computes the sum once and
normalizes it in the same pass over the data. Its outputs are the normalized value (the norm's output) and the
sum (the Add's output), which continues the residual stream; the sum output is omitted when the norm was its only
reader. The fused node takes the Add's position, so the norm's weight must be available there (it is a weight in
every model we build). ``a``, ``b`` and the sum must have one dtype and shape (no broadcasting). When several
norms read one sum, the first one in graph order is fused.
"""

from __future__ import annotations

from uaii.ir.graph import Graph, Node
from uaii.ir.ops import Op
from uaii.ir.ops.fused import ADD_RMS_NORM_OP
from uaii.ir.registry import Registry
from uaii.planner.passes.rewrite import Rewrite

NORM_OF_ADD: dict[str, str] = {str(Op.RMS_NORM): ADD_RMS_NORM_OP}
"""Norm op → its fused add+norm op (the attributes carry over unchanged). Extend for LayerNorm when a kernel
exists."""


def fuse_add_norm(graph: Graph, registry: Registry | None = None) -> Graph:
    """``Norm(Add(a, b), w)`` → ``AddNorm(a, b, w)``; see the module doc."""
    rw = Rewrite(graph, registry)
    for norm in graph.nodes:
        if norm.op not in NORM_OF_ADD or not rw.fusible(norm, norm.op) or len(norm.inputs) != 2:
            continue
        total = norm.inputs[0]
        add = rw.producers.get(total)
        if add is None or not rw.fusible(add, Op.ADD) or len(add.inputs) != 2:
            continue
        a, b = add.inputs
        if not rw.same_type(a, b, total) or not rw.defined_before(norm.inputs[1], add):
            continue
        keep_sum = rw.used_elsewhere(total, norm)
        outputs = (norm.outputs[0], total) if keep_sum else (norm.outputs[0],)
        fused = Node(rw.fresh_name(f"{norm.outputs[0]}/{NORM_OF_ADD[norm.op]}"), NORM_OF_ADD[norm.op],
                     (a, b, norm.inputs[1]), outputs, norm.attributes)
        rw.replace((add, norm), fused, at=add, drop=() if keep_sum else (total,))
    return rw.build()


__all__ = ["NORM_OF_ADD", "fuse_add_norm"]

"""Gated linear units: ``Mul(Silu(a), b)`` → ``SwiGLU(a, b)`` and ``Mul(Gelu(a), b)`` → ``GeGLU(a, b)``.

One pass over the graph; the activation's output must have no reader but the Mul (and not be a graph output),
and ``a``, ``b`` and the product must have one dtype and shape (the GLU ops do not broadcast). The fused node
takes the Mul's position and output, so every reader of the product is untouched. Loaders that know the model
emit SwiGLU/GeGLU themselves; this pass catches graphs translated op by op (ONNX).
"""

from __future__ import annotations

from uaii.ir.graph import Graph, Node
from uaii.ir.ops import Op
from uaii.ir.registry import Registry
from uaii.planner.passes.rewrite import Rewrite

GLU_OF_ACTIVATION: dict[str, tuple[str, tuple[str, ...]]] = {
    str(Op.SILU): (str(Op.SWIGLU), ()),
    str(Op.GELU): (str(Op.GEGLU), ("approximate",)),
}
"""Activation op → (GLU op, the activation's attributes the GLU op takes over). Extend for new GLU kinds."""


def fuse_glu(graph: Graph, registry: Registry | None = None) -> Graph:
    """``Mul(act(a), b)`` (either operand order) → the gated op of ``act``; see the module doc."""
    rw = Rewrite(graph, registry)
    for mul in graph.nodes:
        if not rw.fusible(mul, Op.MUL) or len(mul.inputs) != 2:
            continue
        for slot in (0, 1):
            act = rw.producers.get(mul.inputs[slot])
            if act is None or act.op not in GLU_OF_ACTIVATION or not rw.fusible(act, act.op):
                continue
            gate, up = act.inputs[0], mul.inputs[1 - slot]
            if not rw.only_consumer(act.outputs[0], mul) or not rw.same_type(gate, up, mul.outputs[0]):
                continue
            op, carried = GLU_OF_ACTIVATION[act.op]
            attrs = tuple((k, a) for k, a in act.attributes if k in carried)
            fused = Node(rw.fresh_name(f"{mul.outputs[0]}/{op}"), op, (gate, up), mul.outputs, attrs)
            rw.replace((act, mul), fused, at=mul, drop=act.outputs)
            break
    return rw.build()


__all__ = ["GLU_OF_ACTIVATION", "fuse_glu"]

"""Graph rewrites the Session applies before planning.

``last_token_logits``: generation needs the logits of the last token only, but a decoder graph computes the lm_head
for every row of the batch — for Gemma-3 a 262144 x 640 product per prompt token. The rewrite inserts a
``Slice(starts=[-1], axes=[0])`` on the lm_head's input (through row-wise ops such as the final Softcap), so the
head runs on one row; the slice is a view (free) on the CPU backend. It is a legal IR rewrite: the result validates
and the reference evaluator gives the last row of the original logits.

``hidden_state_output``: a decoder LM's embedding (``Session.embed``, :mod:`uaii.runtime.embedding`) is the mean of
its final hidden states — the rows the lm_head multiplies, after the final norm. The rewrite removes the head (and
the row-wise ops after it) and makes its input the graph output ``hidden_states``, so an embedding pass never
computes a vocabulary-wide product it would throw away.
"""

from __future__ import annotations

from dataclasses import replace

from uaii.ir import Graph, Node, Tensor, attr
from uaii.runtime.errors import SessionError

ROW_WISE = frozenset({"Softcap", "Cast", "Identity", "Tanh", "Relu", "Neg"})
HEAD_OPS = frozenset({"MatMul", "MatMulNBits", "QuantizedMatMul"})
"""Ops an lm_head may be: a MatMul, ONNX's block-quantized MatMulNBits (onnxruntime-genai int4 models), or MLX's
QuantizedMatMul (mlx-lm checkpoints)."""
TO_END = 1 << 31  # Slice: an end >= 2^31 means "to the end"


def _lm_head(graph: Graph, output: str) -> tuple[Node, list[Node]] | None:
    """The MatMul that computes ``output`` (through row-wise ops: the chain, from ``output`` back) when nothing but
    that chain reads its intermediate values; None otherwise."""
    producers = graph.producers()
    consumers = graph.consumers()
    node = producers.get(output)
    chain: list[Node] = []
    while node is not None and node.op in ROW_WISE:
        chain.append(node)
        node = producers.get(node.inputs[0])
    if node is None or node.op not in HEAD_OPS or len(graph.tensor(node.inputs[0]).shape) != 2:
        return None
    inner = [node.outputs[0], *(n.outputs[0] for n in chain[1:])]
    if any(len(consumers.get(v, [])) != 1 or v in graph.outputs for v in inner if v != output):
        return None  # another reader needs every row
    return node, chain


def last_token_logits(graph: Graph, output: str = "logits") -> Graph:
    """``graph`` with ``output`` computed for the last row only (unchanged when the pattern is not found)."""
    found = _lm_head(graph, output)
    if found is None:
        return graph
    node, chain = found
    x = node.inputs[0]
    xt = graph.tensor(x)
    rows = f"{output}.last_row"
    if rows in graph.tensor_map:
        return graph
    slice_node = Node(f"{rows}/Slice", "Slice", (x,), (rows,),
                      (("starts", attr((-1,))), ("ends", attr((TO_END,))), ("axes", attr((0,)))))
    head = replace(node, inputs=(rows, *node.inputs[1:]))
    changed = {node.outputs[0], *(n.outputs[0] for n in chain)}
    tensors = [Tensor(t.name, t.dtype, (1, *t.shape[1:])) if t.name in changed else t for t in graph.tensors]
    tensors.append(Tensor(rows, xt.dtype, (1, *xt.shape[1:])))
    nodes: list[Node] = []
    for n in graph.nodes:
        if n is node:
            nodes += [slice_node, head]
        else:
            nodes.append(n)
    return replace(graph, nodes=tuple(nodes), tensors=tuple(tensors))


def hidden_state_output(graph: Graph, output: str = "logits", name: str = "hidden_states") -> Graph:
    """``graph`` without the lm_head that computes ``output``: its input (the final hidden states, ``[seq, d]``)
    becomes the first output ``name``; the other outputs (a decoder's ``present_k.N``/``present_v.N``) stay.
    Raises SessionError when ``output`` is not a MatMul over 2-D rows (through row-wise ops)."""
    found = _lm_head(graph, output) if output in graph.outputs else None
    if found is None:
        raise SessionError(f"[runtime] graph {graph.name!r}: no lm_head found (expected '{output}' to be a MatMul "
                           "of the final hidden states, through row-wise ops); cannot expose the hidden states")
    head, chain = found
    if name in graph.tensor_map:
        raise SessionError(f"[runtime] graph {graph.name!r} already has a value named {name!r}")
    x = graph.tensor(head.inputs[0])
    dropped = {id(head), *(id(n) for n in chain)}
    gone = {head.outputs[0], *(n.outputs[0] for n in chain)}
    expose = Node(f"{name}/Identity", "Identity", (x.name,), (name,))
    nodes = (*(n for n in graph.nodes if id(n) not in dropped), expose)
    used = {v for n in nodes for v in n.inputs}
    tensors = [t for t in graph.tensors if t.name not in gone and (not t.is_weight or t.name in used)]
    tensors.append(Tensor(name, x.dtype, x.shape))
    outputs = (name, *(o for o in graph.outputs if o != output))
    return replace(graph, nodes=nodes, tensors=tuple(tensors), outputs=outputs)


__all__ = ["hidden_state_output", "last_token_logits"]

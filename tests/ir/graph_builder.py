"""A few lines per node: the graph builder the uaii-ir and uaii-planner tests share (on pytest's pythonpath)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from uaii.ir import DType, Graph, Node, Tensor, WeightRef, make_graph

OutSpec = tuple[str, str, Sequence[int | str]]
NodeNamer = Callable[[str, str, int], str]
"""(op, first output, node index) → the name of a node the test did not name itself."""


def name_by_output(op: str, output: str, index: int) -> str:
    return output


class GraphBuilder:
    """Declares each output with its dtype and shape as the node is added; ``build()`` returns the Graph."""

    def __init__(self, name: str = "g", node_name: NodeNamer = name_by_output) -> None:
        self.name = name
        self.node_name = node_name
        self.tensors: dict[str, Tensor] = {}
        self.nodes: list[Node] = []
        self.inputs: list[str] = []
        self.outputs: list[str] = []

    def tensor(self, name: str, dtype: str, shape: Sequence[int | str], **kw: Any) -> str:
        self.tensors[name] = Tensor(name, DType.parse(dtype), tuple(shape), **kw)
        return name

    def input(self, name: str, dtype: str, shape: Sequence[int | str]) -> str:
        self.inputs.append(self.tensor(name, dtype, shape))
        return name

    def weight(self, name: str, dtype: str, shape: Sequence[int | str], path: str = "model.gguf") -> str:
        """A weight ``path#name``; declaring the same weight again (a tied or shared one) keeps the first."""
        if name not in self.tensors:
            self.tensor(name, dtype, shape, weight=WeightRef(path, name))
        return name

    def op(self, op: str, inputs: Sequence[str], outputs: Sequence[OutSpec], name: str = "", **attrs: Any) -> str:
        for out in outputs:
            self.tensor(*out)
        node = name or self.node_name(op, outputs[0][0], len(self.nodes))
        self.nodes.append(Node(node, op, tuple(inputs), tuple(o[0] for o in outputs), attrs))
        return outputs[0][0]

    def build(self) -> Graph:
        return make_graph(self.name, self.nodes, self.tensors.values(), self.inputs, self.outputs)

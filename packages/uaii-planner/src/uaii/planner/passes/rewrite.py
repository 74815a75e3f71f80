"""What every fusion pass needs: a read-only view of the graph and a list of replacements that builds a new one.

A pass looks for a pattern, then calls :meth:`Rewrite.replace` with the nodes it consumes, the fused node and the
node whose position the fused node takes. Nothing is mutated: :meth:`Rewrite.build` returns a new graph (the same
object when nothing matched), without the consumed nodes and without the values only they produced and used.
A pass must put the fused node where all its inputs are already defined and before every consumer of its outputs;
:meth:`Rewrite.defined_before` helps it check.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from uaii.ir.graph import Graph, Node, Tensor
from uaii.ir.ops.schema import OpSchema
from uaii.ir.registry import Registry, default_registry


class Rewrite:
    """Indexes of one graph plus the replacements one pass has decided on."""

    def __init__(self, graph: Graph, registry: Registry | None = None) -> None:
        self.graph = graph
        self.registry = registry if registry is not None else default_registry()
        self.producers = graph.producers()
        self.consumers = graph.consumers()
        self.position = {n.name: i for i, n in enumerate(graph.nodes)}
        self.graph_outputs = frozenset(graph.outputs)
        self._names = set(self.position)
        self._new: dict[str, Node] = {}  # anchor node name -> fused node taking its position
        self._removed: set[str] = set()
        self._dropped: set[str] = set()

    # --- queries ------------------------------------------------------------------------------------------
    def schema(self, node: Node) -> OpSchema | None:
        return self.registry.find(node.op, node.version)

    def fusible(self, node: Node, op: str) -> bool:
        """``node`` is an untouched ``op`` (version 1) whose schema allows fusion."""
        if node.op != op or node.version != 1 or self.touched(node):
            return False
        schema = self.schema(node)
        return schema is not None and schema.fusible

    def touched(self, node: Node) -> bool:
        return node.name in self._removed

    def tensor(self, name: str) -> Tensor | None:
        return self.graph.tensor_map.get(name)

    def only_consumer(self, value: str, node: Node) -> bool:
        """``node`` is the sole reader of ``value``, which is not a graph output either."""
        readers = self.consumers.get(value, [])
        return value not in self.graph_outputs and len(readers) == 1 and readers[0].name == node.name

    def used_elsewhere(self, value: str, node: Node) -> bool:
        """Something other than ``node`` reads ``value`` (another node, or the caller as a graph output)."""
        return value in self.graph_outputs or any(c.name != node.name for c in self.consumers.get(value, []))

    def defined_before(self, value: str, node: Node) -> bool:
        """``value`` is available at ``node``'s position: stored, a graph input or produced by an earlier node."""
        t = self.tensor(value)
        if not value or (t is not None and (t.is_weight or t.is_constant)) or value in self.graph.inputs:
            return True
        p = self.producers.get(value)
        return p is not None and self.position[p.name] < self.position[node.name]

    def same_type(self, *values: str) -> bool:
        """All values are declared with one dtype and one shape."""
        ts = [self.tensor(v) for v in values]
        if any(t is None for t in ts):
            return False
        first = ts[0]
        return all(t is not None and first is not None and (t.dtype, t.shape) == (first.dtype, first.shape)
                   for t in ts)

    def fresh_name(self, stem: str) -> str:
        name, k = stem, 1
        while name in self._names:
            k += 1
            name = f"{stem}.{k}"
        self._names.add(name)
        return name

    # --- edits --------------------------------------------------------------------------------------------
    def replace(self, consumed: Sequence[Node], fused: Node, at: Node, drop: Iterable[str] = ()) -> None:
        """Replace ``consumed`` (which includes ``at``) by ``fused`` at ``at``'s position; ``drop`` names the
        values that disappear with them (declarations are removed from the graph)."""
        assert at in consumed and not any(self.touched(n) for n in consumed)
        self._removed.update(n.name for n in consumed)
        self._new[at.name] = fused
        self._dropped.update(drop)

    @property
    def changed(self) -> bool:
        return bool(self._new)

    def build(self) -> Graph:
        if not self.changed:
            return self.graph
        nodes: list[Node] = []
        for n in self.graph.nodes:
            if n.name in self._new:
                nodes.append(self._new[n.name])
            elif n.name not in self._removed:
                nodes.append(n)
        tensors = tuple(t for t in self.graph.tensors if t.name not in self._dropped)
        return replace(self.graph, nodes=tuple(nodes), tensors=tensors)


__all__ = ["Rewrite"]

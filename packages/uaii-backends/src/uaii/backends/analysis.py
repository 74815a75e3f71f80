"""What every backend derives from a graph before it binds it: nodes in a topological order with their schemas and
resolved attributes (:class:`NodeInfo`), and the concrete dtype and shape of every value for given feed shapes
(:func:`infer_types`, the schemas' own shape functions). Shared so that two backends never disagree on a shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from uaii.backends.base import BackendError
from uaii.ir import DType, Graph, Node, Tensor
from uaii.ir.graph import topological_order
from uaii.ir.kvcache import KVLayer, kv_layers
from uaii.ir.ops import InferCtx, InferError, OpSchema, TensorType
from uaii.ir.registry import Registry, default_registry
from uaii.ir.shapes import ShapeError


class VType(NamedTuple):
    """A value's concrete type: dtype and int shape (what the shape functions inferred for one binding)."""

    dtype: DType
    shape: tuple[int, ...]


@dataclass
class NodeInfo:
    """A node with its schema and resolved attributes (defaults filled in), computed once per compile."""

    index: int
    node: Node
    schema: OpSchema
    attrs: dict[str, Any]
    consts: dict[int, np.ndarray] = field(default_factory=dict)


def node_infos(graph: Graph, registry: Registry | None = None) -> list[NodeInfo]:
    """The nodes in a topological order (the graph's own order when it is one), with schemas and attributes."""
    reg = registry or default_registry()
    tmap = graph.tensor_map
    out = []
    for i, node in enumerate(topological(graph)):
        schema = reg.get(node.op, node.version)
        attrs, problems = schema.resolve_attrs(node)
        if problems:
            raise BackendError(f"[backend] node {node.name!r} ({node.op}): {problems[0][1]}")
        consts = {}
        for slot, name in enumerate(node.inputs):
            t = tmap.get(name) if name else None
            if t is not None and t.is_constant and not t.dtype.is_quantized:
                consts[slot] = t.numpy()
        out.append(NodeInfo(i, node, schema, attrs, consts))
    return out


def topological(graph: Graph) -> list[Node]:
    """Kahn's order, stable: a node comes as early as its inputs allow, ties in graph order."""
    producer = graph.producers()
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    deps = {i: {index[id(producer[x])] for x in n.inputs if x and x in producer} for i, n in enumerate(graph.nodes)}
    order = topological_order(deps)
    if len(order) != len(graph.nodes):
        raise BackendError(f"[backend] graph {graph.name!r} has a cycle")
    return [graph.nodes[i] for i in order]


# --- concrete shapes ---------------------------------------------------------------------------------------
def infer_types(graph: Graph, infos: Sequence[NodeInfo], inputs: Mapping[str, VType]) -> dict[str, VType]:
    """Concrete dtype and shape of every value, from the input types (weights and constants as declared)."""
    types: dict[str, VType] = {}
    for t in graph.tensors:
        if t.is_weight or t.is_constant:
            types[t.name] = VType(t.dtype, tuple(int(d) for d in t.shape))
    types.update(inputs)
    tmap = graph.tensor_map
    for info in infos:
        node = info.node
        ins = [TensorType(*types[n]) if n else None for n in node.inputs]
        ctx = InferCtx(node, info.schema, ins, info.attrs, info.consts)
        try:
            shapes = list(info.schema.infer(ctx)) if info.schema.infer is not None else []
            dtypes = list(info.schema.dtypes(ctx)) if info.schema.dtypes is not None else []
        except (InferError, ShapeError) as exc:
            raise BackendError(f"[backend] node {node.name!r} ({node.op}): {exc}") from None
        for slot, name in enumerate(node.outputs):
            if not name:
                continue
            shape = shapes[slot] if slot < len(shapes) else None
            if shape is None or any(not isinstance(d, int) for d in shape):
                raise BackendError(f"[backend] node {node.name!r} ({node.op}): output {name!r} has no concrete "
                                   f"shape for inputs {[list(t.shape) for t in ins if t]} (got {shape})")
            decl = tmap.get(name)
            dt = (dtypes[slot] if slot < len(dtypes) else None) or (decl.dtype if decl else None)
            if dt is None:
                dt = _bound_dtype(info.schema, slot, ins)
            types[name] = VType(dt, tuple(int(d) for d in shape))
    return types


def _bound_dtype(schema: OpSchema, slot: int, ins: Sequence[TensorType | None]) -> DType:
    p = schema.param_at(schema.outputs, slot)
    if p is not None and not isinstance(p.types, str) and len(p.types) == 1:
        return next(iter(p.types))
    for k, t in enumerate(ins):
        q = schema.param_at(schema.inputs, k)
        if t is not None and q is not None and p is not None and q.types == p.types:
            return t.dtype
    return DType.F32


def nbytes_of(t: VType) -> int:
    return t.dtype.nbytes(int(np.prod(t.shape, dtype=np.int64)))


# --- the KV state and the feeds a binding is made for -----------------------------------------------------------
@dataclass(frozen=True)
class KvLayout:
    """The cached Attention layers of a graph (:func:`uaii.ir.kvcache.kv_layers`) as a backend binds them to a KV
    state: node name → layer index, per layer (kv heads, k dim, v dim), and the graph values the state holds
    instead of the arena (past/present K and V). Built from the IR's analysis by parameter name, never by slot."""

    layers: tuple[KVLayer, ...] = ()

    @cached_property
    def layer(self) -> dict[str, int]:
        return {x.node: i for i, x in enumerate(self.layers)}

    @cached_property
    def dims(self) -> list[tuple[int, int, int]]:
        return [(x.n_kv_heads, x.k_dim, x.v_dim) for x in self.layers]

    @cached_property
    def values(self) -> frozenset[str]:
        return frozenset(v for x in self.layers for v in (x.past_k, x.past_v, x.present_k, x.present_v) if v)

    def past_types(self, tmap: Mapping[str, Tensor]) -> dict[str, VType]:
        """The past K/V inputs (``tmap``: the graph's tensors by name) as a binding types them: empty (0 rows),
        since the state holds the rows."""
        return {v: VType(tmap[v].dtype, (0, *(int(d) for d in tmap[v].shape[1:])))
                for x in self.layers for v in (x.past_k, x.past_v)}


def kv_layout(graph: Graph) -> KvLayout:
    """The cached Attention layers of ``graph`` (empty when it has none)."""
    return KvLayout(tuple(kv_layers(graph)))


def feed_types(graph: Graph, feeds: Sequence[str], shapes: Mapping[str, Sequence[int]],
               kv: KvLayout | None) -> dict[str, VType]:
    """Types of the ``feeds`` at ``shapes``, and of the past inputs ``kv`` binds to its state (empty)."""
    tmap = graph.tensor_map
    types = {n: VType(tmap[n].dtype, tuple(int(d) for d in shapes[n])) for n in feeds}
    if kv is not None:
        types.update(kv.past_types(tmap))
    return types


def token_shapes(graph: Graph, feeds: Sequence[str], tokens: int, *,
                 batched_only: bool) -> dict[str, tuple[int, ...]] | None:
    """The feed shapes with every symbolic dim at ``tokens``: what an executable binds at compile time and what a
    backend's ``plan_arena`` lays the arena out at — one function, so the two never differ. ``batched_only``
    (compiling without a plan): None when a feed has a symbolic dim other than ``seq`` (a graph that is not
    token-batched has no shapes to prepare for); with a plan every symbolic dim is ``tokens``, as its arena."""
    tmap = graph.tensor_map
    shapes = {}
    for n in feeds:
        dims = tmap[n].shape
        if batched_only and any(isinstance(d, str) and d != "seq" for d in dims):
            return None
        shapes[n] = tuple(tokens if isinstance(d, str) else int(d) for d in dims)
    return shapes


@dataclass(frozen=True)
class ArenaInputs:
    """What a backend's ``plan_arena`` lays out: the graph's feeds (the inputs its KV state does not provide), the
    values the state holds, and every value's type with each symbolic feed dim at ``tokens``."""

    tokens: int
    feeds: list[str]
    stateful: frozenset[str]
    types: dict[str, VType]


def arena_inputs(graph: Graph, infos: Sequence[NodeInfo], max_tokens: int) -> ArenaInputs:
    """The types an executable of ``graph`` with its KV state bound has at ``max_tokens`` tokens — the binding it
    prepares at compile time with a plan, so the arena is laid out at exactly the shapes that binding has."""
    tokens = max(int(max_tokens), 1)
    kv = kv_layout(graph)
    feeds = [n for n in graph.inputs if n not in kv.values]
    shapes = token_shapes(graph, feeds, tokens, batched_only=False)
    assert shapes is not None
    return ArenaInputs(tokens, feeds, frozenset(kv.values),
                       infer_types(graph, list(infos), feed_types(graph, feeds, shapes, kv)))


__all__ = ["ArenaInputs", "KvLayout", "NodeInfo", "VType", "arena_inputs", "feed_types", "infer_types", "kv_layout",
           "nbytes_of", "node_infos", "token_shapes", "topological"]

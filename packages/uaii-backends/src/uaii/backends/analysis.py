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
from uaii.ir import DType, Graph, Node, Tensor, UaiiError
from uaii.ir.graph import topological_order
from uaii.ir.kvcache import KVLayer, kv_layers
from uaii.ir.ops import InferCtx, InferError, OpSchema, TensorType
from uaii.ir.reference import run_node
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


# --- values that shapes depend on ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShapeValues:
    """The values whose *data* some shape of the graph depends on: what the schemas' ``value_inputs`` read (a
    Reshape's target, a Range's bounds, a Fill's shape), traced back through their producers to constants, graph
    inputs, and ``from_shape`` ops (Shape), whose outputs follow from shapes alone. A binding computes them with the
    reference evaluator while it infers its shapes (:func:`infer_types`), so that a graph whose shapes are computed
    from its feeds' shapes binds each feed shape to exact shapes, as a Reshape to a constant target does.

    ``feeds``: the graph inputs among them. Their data, not only their shapes, decides a binding's shapes, so a
    backend passes their values to :func:`infer_types` and binds per value as well as per shape."""

    values: frozenset[str] = frozenset()
    feeds: tuple[str, ...] = ()


def shape_values(graph: Graph, infos: Sequence[NodeInfo]) -> ShapeValues:
    """The :class:`ShapeValues` of ``graph`` (empty for a graph whose shapes follow from shapes alone)."""
    producer = {o: info for info in infos for o in info.node.outputs if o}
    stack = [info.node.inputs[slot] for info in infos for slot in info.schema.value_inputs
             if slot < len(info.node.inputs) and info.node.inputs[slot]]
    needed: set[str] = set()
    while stack:
        v = stack.pop()
        if v in needed:
            continue
        needed.add(v)
        p = producer.get(v)
        if p is not None and not p.schema.from_shape:
            stack += [x for x in p.node.inputs if x]
    return ShapeValues(frozenset(needed), tuple(n for n in graph.inputs if n in needed))


def _fold(info: NodeInfo, types: Mapping[str, VType], known: dict[str, np.ndarray]) -> None:
    """Compute ``info``'s outputs into ``known`` when everything it reads is known: for a ``from_shape`` op only the
    inputs' shapes (zero-stride stand-ins, no memory), else their values. Leaves them unknown otherwise (a value
    that depends on a weight or on a feed's data not given): the shapes depending on them then stay symbolic."""
    node = info.node
    args: list[np.ndarray | None] = []
    for slot, name in enumerate(node.inputs):
        if not name:
            args.append(None)
        elif info.schema.from_shape:
            t = types[name]
            args.append(np.broadcast_to(np.zeros((), t.dtype.numpy), t.shape))
        elif name in known or slot in info.consts:
            args.append(known[name] if name in known else info.consts[slot])
        else:
            return
    try:
        outs = run_node(node, args)
    except UaiiError as exc:
        raise BackendError(f"[backend] node {node.name!r} ({node.op}): computing a value that shapes depend on "
                           f"failed: {exc}") from None
    for name, arr in zip(node.outputs, outs, strict=True):
        if name:
            known[name] = np.asarray(arr).astype(types[name].dtype.numpy, copy=False)


# --- concrete shapes ---------------------------------------------------------------------------------------
def infer_types(graph: Graph, infos: Sequence[NodeInfo], inputs: Mapping[str, VType],
                values: Mapping[str, np.ndarray] | None = None, deps: ShapeValues | None = None) -> dict[str, VType]:
    """Concrete dtype and shape of every value, from the input types (weights and constants as declared).

    Values that shapes depend on (:class:`ShapeValues`; ``deps``, computed here when not given) are computed on the
    way and given to the shape functions as constants; ``values``: those of the feeds among them."""
    deps = deps if deps is not None else shape_values(graph, infos)
    known: dict[str, np.ndarray] = {n: np.asarray(values[n]) for n in deps.feeds if values and n in values}
    types: dict[str, VType] = {}
    for t in graph.tensors:
        if t.is_weight or t.is_constant:
            types[t.name] = VType(t.dtype, tuple(int(d) for d in t.shape))
    types.update(inputs)
    tmap = graph.tensor_map
    for info in infos:
        node = info.node
        ins = [TensorType(*types[n]) if n else None for n in node.inputs]
        consts = {**info.consts, **{i: known[n] for i, n in enumerate(node.inputs) if n in known}}
        ctx = InferCtx(node, info.schema, ins, info.attrs, consts)
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
                                   f"shape for inputs {[list(t.shape) for t in ins if t]} (got {shape})"
                                   f"{_unknown_values(info, known, deps, values)}")
            decl = tmap.get(name)
            dt = (dtypes[slot] if slot < len(dtypes) else None) or (decl.dtype if decl else None)
            if dt is None:
                dt = _bound_dtype(info.schema, slot, ins)
            types[name] = VType(dt, tuple(int(d) for d in shape))
        if any(o in deps.values for o in node.outputs if o):
            _fold(info, types, known)
    return types


def _unknown_values(info: NodeInfo, known: Mapping[str, np.ndarray], deps: ShapeValues,
                    values: Mapping[str, np.ndarray] | None) -> str:
    """Why a shape that depends on values stayed unknown, for the error message ("" when it does not)."""
    unknown = [info.node.inputs[i] for i in info.schema.value_inputs
               if i < len(info.node.inputs) and info.node.inputs[i] and info.node.inputs[i] not in known
               and i not in info.consts]
    if not unknown:
        return ""
    missing = [f for f in deps.feeds if not values or f not in values]
    why = (f"the values of the graph inputs {missing} decide it, and this binding was not given them" if missing
           else "they depend on a weight or on data no binding knows ahead")
    return f": it depends on the values of {unknown}, and {why}"


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


__all__ = ["ArenaInputs", "KvLayout", "NodeInfo", "ShapeValues", "VType", "arena_inputs", "feed_types", "infer_types",
           "kv_layout", "nbytes_of", "node_infos", "shape_values", "token_shapes", "topological"]

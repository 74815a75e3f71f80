"""The graph validator: every problem of a graph, as a list of diagnostics with stable codes.

:func:`validate` never stops at the first problem; :func:`check` raises :class:`ValidationError` carrying them
all. The checks are a table of rules (``GRAPH_RULES``), each a function that reads the graph through a
:class:`_Checker` and reports. Node checks come last and run in topological order: op known at that version,
arity, attributes, dtypes, then shape inference compared with the declared output shapes. Declared types are
authoritative downstream, so one wrong node does not cascade into its consumers.

Messages name the node by its 0-based position in ``graph.nodes``::

    [validate] node 17 'blk.0.attn_q' (MatMul) in graph 'llama': inner dimensions differ: ...
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from uaii.ir.dtype import DType
from uaii.ir.errors import UaiiError, WeightRefError
from uaii.ir.graph import Graph, Node, Tensor, topological_order
from uaii.ir.ops.schema import InferCtx, InferError, OpSchema, TensorType
from uaii.ir.registry import Registry, default_registry
from uaii.ir.shapes import ShapeError, fmt_shape, shapes_compatible
from uaii.ir.weightref import WeightRef


class Code(enum.StrEnum):
    """Diagnostic codes. The strings are stable: tools and tests match on them."""

    UNKNOWN_OP = "unknown-op"  # no schema for (op, version)
    ARITY = "arity"  # wrong number of inputs/outputs, or a required one left empty
    ATTR_TYPE = "attr-type"  # attribute of the wrong type
    ATTR_RANGE = "attr-range"  # attribute value outside its range or choices, or inconsistent with the inputs
    ATTR_UNKNOWN = "attr-unknown"  # attribute the schema does not define
    ATTR_MISSING = "attr-missing"  # required attribute absent
    DTYPE = "dtype"  # dtype outside the op's constraints, or a block type on a misaligned shape
    SHAPE = "shape"  # shapes that provably do not fit, or declared vs inferred mismatch
    UNDEFINED_VALUE = "undefined-value"  # node input that nothing defines
    UNDECLARED = "undeclared"  # value used or produced but missing from graph.tensors
    MULTIPLE_PRODUCERS = "multiple-producers"  # value produced twice, or a constant that a node produces
    CYCLE = "cycle"  # nodes that depend on themselves
    OUTPUT_NOT_PRODUCED = "output-not-produced"  # graph output that nothing defines
    DUPLICATE_NAME = "duplicate-name"  # tensor, node, graph input or graph output named twice
    EMPTY_NAME = "empty-name"  # tensor with an empty name
    WEIGHT_REF = "weight-ref"  # malformed or inconsistent weight, or a weight that a node produces
    GRAPH_INPUT = "graph-input"  # graph input undeclared, empty, a weight/constant, or produced by a node
    INFER_ERROR = "infer-error"  # a shape function crashed (a bug in that op's schema, usually a plugin's)


@dataclass(frozen=True)
class Diagnostic:
    """One problem. ``message`` is complete and self-contained; the other fields are for tools."""

    code: str
    message: str
    graph: str
    node: str | None = None
    op: str | None = None
    index: int | None = None
    tensor: str | None = None

    def __str__(self) -> str:
        return self.message


class ValidationError(UaiiError):
    """A graph failed validation; ``diagnostics`` holds every problem found.

    The message is one header line (the file when known, the graph, the count) and one indented line per
    diagnostic — its code, node and op, without the prefix and graph name the header already gives — capped at
    ``MAX_LISTED`` lines and ``... and K more``: a broken builder produces hundreds of diagnostics, and a
    reader needs the first few, not 3 KB on one line.
    """

    component = "validate"
    MAX_LISTED = 10

    def __init__(self, graph: str, diagnostics: Sequence[Diagnostic], source: str | None = None) -> None:
        self.graph = graph
        self.diagnostics = tuple(diagnostics)
        self.source = source
        n = len(self.diagnostics)
        where = f"{source}: " if source else ""
        lines = [f"{where}graph {graph!r} failed validation with {n} problem{'s' if n != 1 else ''}:"]
        lines += [f"  {_listed(d)}" for d in self.diagnostics[: self.MAX_LISTED]]
        if n > self.MAX_LISTED:
            lines.append(f"  ... and {n - self.MAX_LISTED} more")
        super().__init__("\n".join(lines))

    @property
    def codes(self) -> set[str]:
        return {d.code for d in self.diagnostics}


def _listed(d: Diagnostic) -> str:
    """``[shape] node 6 'blk.0.k' (Reshape): ...`` — the message without what the error's header says."""
    text = d.message.removeprefix(f"[{ValidationError.component}] ").replace(f" in graph {d.graph!r}", "", 1)
    return f"[{d.code}] {text}"


class _Checker:
    """Indexes of one graph plus the diagnostics collected so far."""

    def __init__(self, graph: Graph, registry: Registry) -> None:
        self.g = graph
        self.reg = registry
        self.diags: list[Diagnostic] = []
        self.declared = graph.tensor_map
        self.producers: dict[str, list[int]] = {}
        for i, n in enumerate(graph.nodes):
            for o in n.outputs:
                if o:
                    self.producers.setdefault(o, []).append(i)
        self.types: dict[str, TensorType] = {t.name: TensorType(t.dtype, t.shape) for t in graph.tensors}

    def stored(self, name: str) -> bool:
        """A weight or an inline constant: defined without a producer."""
        t = self.declared.get(name)
        return t is not None and (t.is_weight or t.is_constant)

    def defined(self, name: str) -> bool:
        return name in self.producers or name in self.g.inputs or self.stored(name)

    def at_node(self, index: int, code: Code, detail: str) -> None:
        n = self.g.nodes[index]
        msg = f"[validate] node {index} {n.name!r} ({n.op}) in graph {self.g.name!r}: {detail}"
        self.diags.append(Diagnostic(str(code), msg, self.g.name, n.name, n.op, index))

    def at_graph(self, code: Code, detail: str, tensor: str | None = None) -> None:
        where = f"graph {self.g.name!r}" if tensor is None else f"tensor {tensor!r} in graph {self.g.name!r}"
        self.diags.append(Diagnostic(str(code), f"[validate] {where}: {detail}", self.g.name, tensor=tensor))


# --- graph-level rules ------------------------------------------------------------------------------------
def _rule_names(c: _Checker) -> None:
    for name, count in Counter(t.name for t in c.g.tensors).items():
        if count > 1:
            c.at_graph(Code.DUPLICATE_NAME, f"declared {count} times in graph.tensors", name)
    for t in c.g.tensors:
        if not t.name and not t.is_weight:
            c.at_graph(Code.EMPTY_NAME, f"a {t.dtype.value} {fmt_shape(t.shape)} tensor has an empty name")
    first: dict[str, int] = {}
    for i, n in enumerate(c.g.nodes):
        if n.name and first.setdefault(n.name, i) != i:
            c.at_node(i, Code.DUPLICATE_NAME, f"node name {n.name!r} is also used by node {first[n.name]}")
    for what, names in (("input", c.g.inputs), ("output", c.g.outputs)):
        for name, count in Counter(names).items():
            if count > 1:
                c.at_graph(Code.DUPLICATE_NAME, f"listed {count} times as a graph {what}", name)


def _rule_dtypes(c: _Checker) -> None:
    for t in c.g.tensors:
        if not t.dtype.is_quantized:
            continue
        inner = t.shape[-1] if t.shape else None
        dt = t.dtype.value
        if inner is None:
            c.at_graph(Code.DTYPE, f"{dt} is a block type and needs at least one dimension", t.name)
        elif isinstance(inner, int) and inner % t.dtype.block_size:
            c.at_graph(Code.DTYPE, f"{dt} stores blocks of {t.dtype.block_size} along the innermost "
                                   f"dimension; shape {fmt_shape(t.shape)} does not fill whole blocks",
                       t.name)


def _rule_weights(c: _Checker) -> None:
    by_ref: dict[str, Tensor] = {}
    for t in c.g.weights:
        ref = "" if t.weight is None else str(t.weight)
        if not t.name:
            c.at_graph(Code.WEIGHT_REF, f"a weight tensor (reference {ref!r}) has an empty name")
        bad = _bad_ref(t.weight) if t.weight is not None else None
        if bad:
            c.at_graph(Code.WEIGHT_REF, f"weight reference {ref!r} is malformed: {bad}", t.name)
        if any(isinstance(d, str) for d in t.shape):
            c.at_graph(Code.WEIGHT_REF, f"a weight needs a static shape, found {fmt_shape(t.shape)}", t.name)
        for i in c.producers.get(t.name, []):
            c.at_node(i, Code.WEIGHT_REF, f"produces {t.name!r}, which is a weight (stored, never computed)")
        other = by_ref.setdefault(ref, t) if ref else t
        if other is not t and (other.dtype, other.shape) != (t.dtype, t.shape):
            c.at_graph(Code.WEIGHT_REF, f"shares reference {ref!r} with {other.name!r} but is "
                                        f"{t.dtype.value} {fmt_shape(t.shape)}, not {other.dtype.value} "
                                        f"{fmt_shape(other.shape)}", t.name)


def _bad_ref(ref: WeightRef) -> str | None:
    try:
        return None if WeightRef.parse(str(ref)) == ref else "it does not survive a round trip through text"
    except WeightRefError as exc:
        return str(exc)


def _rule_graph_io(c: _Checker) -> None:
    for name in dict.fromkeys(c.g.inputs):
        t = c.declared.get(name)
        if not name:
            c.at_graph(Code.GRAPH_INPUT, "a graph input has an empty name")
        elif t is None:
            c.at_graph(Code.GRAPH_INPUT, "is a graph input but is not declared in graph.tensors", name)
        elif t.is_weight or t.is_constant:
            kind = "a weight" if t.is_weight else "an inline constant"
            c.at_graph(Code.GRAPH_INPUT, f"is a graph input and also {kind}; inputs are fed at run time",
                       name)
        for i in c.producers.get(name, []):
            c.at_node(i, Code.GRAPH_INPUT, f"produces {name!r}, which is a graph input")
    for name in dict.fromkeys(c.g.outputs):
        if name and name not in c.declared:
            c.at_graph(Code.UNDECLARED, "is a graph output but is not declared in graph.tensors", name)
        if not name or not c.defined(name):
            c.at_graph(Code.OUTPUT_NOT_PRODUCED, "is a graph output but no node produces it and it is not an "
                                                 "input, weight or constant", name)


def _rule_values(c: _Checker) -> None:
    for name, idxs in c.producers.items():
        t = c.declared.get(name)
        if t is not None and t.is_constant and not t.is_weight:
            for i in idxs:
                c.at_node(i, Code.MULTIPLE_PRODUCERS, f"produces {name!r}, which is an inline constant")
        for i in idxs[1:]:
            c.at_node(i, Code.MULTIPLE_PRODUCERS,
                      f"lists output {name!r} twice" if i == idxs[0] else
                      f"produces {name!r}, which node {idxs[0]} {c.g.nodes[idxs[0]].name!r} also produces")
    for i, n in enumerate(c.g.nodes):
        for slot, name in enumerate(n.inputs):
            if name and not c.defined(name):
                why = ("is declared but is not a graph input, a weight, a constant or any node's output"
                       if name in c.declared else "is not declared, produced, a graph input or a weight")
                c.at_node(i, Code.UNDEFINED_VALUE, f"input #{slot} {name!r} {why}")
        for name in n.outputs:
            if name and name not in c.declared:
                c.at_node(i, Code.UNDECLARED, f"output {name!r} is not declared in graph.tensors")


def _edges(c: _Checker) -> list[list[int]]:
    """Node index → indices of the nodes that consume its outputs."""
    out: list[list[int]] = [[] for _ in c.g.nodes]
    for i, n in enumerate(c.g.nodes):
        for name in n.inputs:
            for p in c.producers.get(name, []) if name else []:
                out[p].append(i)
    return out


def _cycles(succ: list[list[int]]) -> list[list[int]]:
    """Strongly connected components that contain a cycle (Tarjan, iterative)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    found: list[list[int]] = []
    for root in range(len(succ)):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, k = work.pop()
            if k == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            if k < len(succ[v]):
                work.append((v, k + 1))
                w = succ[v][k]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in succ[v]:
                    found.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return found


def _rule_cycles(c: _Checker) -> None:
    for comp in _cycles(_edges(c)):
        names = ", ".join(f"{i} {c.g.nodes[i].name!r}" for i in comp)
        c.at_node(comp[0], Code.CYCLE, f"is on a cycle of {len(comp)} node(s): {names}")


def _topo_order(c: _Checker) -> list[int]:
    """Kahn's order, ties by position; nodes on cycles follow in position order."""
    preds: dict[int, set[int]] = {i: set() for i in range(len(c.g.nodes))}
    for p, targets in enumerate(_edges(c)):
        for t in targets:
            preds[t].add(p)
    order = topological_order(preds)
    done = set(order)
    return order + [i for i in range(len(c.g.nodes)) if i not in done]


# --- node rules -------------------------------------------------------------------------------------------
def _rule_nodes(c: _Checker) -> None:
    for i in _topo_order(c):
        _check_node(c, i, c.g.nodes[i])


def _check_node(c: _Checker, i: int, node: Node) -> None:
    schema = c.reg.find(node.op, node.version)
    if schema is None:
        known = c.reg.versions(node.op)
        hint = f"; registered versions: {', '.join(map(str, known))}" if known else ""
        c.at_node(i, Code.UNKNOWN_OP, f"op {node.op!r} version {node.version} is not registered{hint}")
        return
    arity = schema.check_arity(node)
    for detail in arity:
        c.at_node(i, Code.ARITY, detail)
    if arity:
        return
    attrs, problems = schema.resolve_attrs(node)
    for code, detail in problems:
        c.at_node(i, Code(code), detail)
    ins = [c.types.get(n) if n else None for n in node.inputs]
    outs = [c.declared.get(n) if n else None for n in node.outputs]
    for detail in schema.check_dtypes([t.dtype if t else None for t in ins],
                                      [t.dtype if t else None for t in outs]):
        c.at_node(i, Code.DTYPE, detail)
    missing = any(n and t is None for n, t in zip(node.inputs, ins, strict=True))
    if problems or missing or schema.infer is None:
        return
    _infer_node(c, i, node, schema, InferCtx(node, schema, ins, attrs, _constants(c, node)))


def _constants(c: _Checker, node: Node) -> dict[int, np.ndarray]:
    out: dict[int, np.ndarray] = {}
    for slot, name in enumerate(node.inputs):
        t = c.declared.get(name) if name else None
        if t is not None and t.is_constant and not t.dtype.is_quantized:
            out[slot] = t.numpy()
    return out


def _infer_node(c: _Checker, i: int, node: Node, schema: OpSchema, ctx: InferCtx) -> None:
    try:
        dtypes = list(schema.dtypes(ctx)) if schema.dtypes is not None else []
        shapes = list(schema.infer(ctx)) if schema.infer is not None else []
    except InferError as exc:
        c.at_node(i, _code(exc.code), exc.detail)
        return
    except ShapeError as exc:
        c.at_node(i, Code.SHAPE, str(exc).removeprefix("[shape] "))
        return
    except Exception as exc:  # a bug in a shape function must not hide the graph's other problems
        c.at_node(i, Code.INFER_ERROR, f"shape inference failed: {type(exc).__name__}: {exc}")
        return
    for slot, name in enumerate(node.outputs):
        shape = shapes[slot] if slot < len(shapes) else None
        want = dtypes[slot] if slot < len(dtypes) else None
        decl = c.declared.get(name) if name else None
        if decl is None:
            dtype = want or _bound_dtype(schema, slot, ctx)
            if name and dtype is not None and shape is not None:
                c.types.setdefault(name, TensorType(dtype, shape))
            continue
        if want is not None and decl.dtype is not want:
            c.at_node(i, Code.DTYPE, f"output #{slot} {name!r} is declared {decl.dtype.value}; the op "
                                     f"produces {want.value}")
        if shape is not None and not shapes_compatible(decl.shape, shape):
            c.at_node(i, Code.SHAPE, f"output #{slot} {name!r} is declared {fmt_shape(decl.shape)}; inferred "
                                     f"{fmt_shape(shape)} from the inputs")


def _code(text: str) -> Code:
    try:
        return Code(text)
    except ValueError:
        return Code.SHAPE


def _bound_dtype(schema: OpSchema, slot: int, ctx: InferCtx) -> DType | None:
    """The dtype of output ``slot`` implied by the type constraints and the input dtypes."""
    p = schema.param_at(schema.outputs, slot)
    if p is None:
        return None
    if not isinstance(p.types, str):
        return next(iter(p.types)) if len(p.types) == 1 else None
    for k, t in enumerate(ctx.inputs):
        q = schema.param_at(schema.inputs, k)
        if t is not None and q is not None and q.types == p.types:
            return t.dtype
    return None


GRAPH_RULES: tuple[Callable[[_Checker], None], ...] = (
    _rule_names, _rule_dtypes, _rule_weights, _rule_graph_io, _rule_values, _rule_cycles, _rule_nodes,
)


def validate(graph: Graph, registry: Registry | None = None) -> list[Diagnostic]:
    """Every problem of ``graph``; an empty list means it is valid.

    Checks against ``registry`` (default: the process-wide one). A broken op plugin is not a problem of the
    graph: its :class:`~uaii.ir.registry.PluginError` propagates.
    """
    c = _Checker(graph, registry if registry is not None else default_registry())
    for rule in GRAPH_RULES:
        rule(c)
    return c.diags


def check(graph: Graph, registry: Registry | None = None, source: str | None = None) -> Graph:
    """``graph`` itself when valid; raises :class:`ValidationError` with every diagnostic otherwise.

    ``source``: the file or directory the graph came from, named in the error's header — the graph alone does not
    know it, so the caller that opened the file passes it.
    """
    diags = validate(graph, registry)
    if diags:
        raise ValidationError(graph.name, diags, source)
    return graph


__all__ = ["GRAPH_RULES", "Code", "Diagnostic", "ValidationError", "check", "validate"]

"""The IR graph under construction: nodes, declared tensors, unique names, and where each symbol can be read.

Handlers never touch this directly; they go through :class:`~.context.NodeContext`. Two jobs live here because
they need the whole graph: *emission* (a node whose inputs are all folded constants is evaluated with uaii.ir's
reference instead — the one numpy implementation of each op — otherwise it is appended with the output types the
op's schema infers) and *materialization* (a constant becomes an inline IR constant, a symbolic vector becomes
runtime IR that reads each symbol off the tensor it first appeared in: ``Shape(x, start=a, end=a+1)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from uaii.ir import (
    Dim,
    DType,
    Graph,
    InferCtx,
    Node,
    Registry,
    Tensor,
    TensorType,
    UaiiError,
    WeightRef,
    attr,
    restricted,
)
from uaii.ir.graph import MAX_INLINE_BYTES
from uaii.ir.reference import REFERENCE_OPS, run_node

from .dispatch import OnnxImportError
from .values import Value

FOLD_LIMIT = MAX_INLINE_BYTES
"""A node whose inputs are all constants is folded only when each result fits an inline IR constant; a larger
result (a [2048, 2048] causal mask) stays a runtime node so that the graph never holds big data."""


class GraphBuilder:
    """Nodes and tensors of one IR graph being built; see the module doc."""

    def __init__(self, where: str, registry: Registry, reserved: Iterable[str] = ()) -> None:
        self.where = where
        self.reg = registry
        self.nodes: list[Node] = []
        self.tensors: dict[str, Tensor] = {}
        self.reserved = set(reserved)  # every ONNX value name: generated names never take one
        self.node_start = 0  # index in self.nodes of the first IR node of the ONNX node being translated
        self.hint = "v"
        self.sym_source: dict[str, tuple[str, int]] = {}  # symbol -> (IR tensor, axis) to read it at run time
        self.sym_expr: dict[str, tuple[str, Dim, Dim]] = {}  # composite symbol -> (IR op, a, b)
        self._counter = 0
        self._placed: dict[int, tuple[Value, str]] = {}  # id(value) -> (value, IR name) of materialized values
        self._dim_tensors: dict[Dim, str] = {}

    # --- names and declarations ----------------------------------------------------------------------------
    def unique(self, base: str) -> str:
        """A fresh IR name ``base_N`` that is no ONNX name and no name already in use (a node's result gets its
        ONNX name afterwards: :meth:`adopt`)."""
        while True:
            self._counter += 1
            name = f"{base}_{self._counter}"
            if name not in self.reserved and name not in self.tensors:
                return name

    def fresh_symbol(self, hint: str = "d") -> str:
        base = hint if hint.isidentifier() else "d"
        while True:
            self._counter += 1
            name = f"{base}_{self._counter}"
            if name not in self.sym_source and name not in self.sym_expr:
                return name

    def declare(self, tensor: Tensor) -> Tensor:
        if tensor.name in self.tensors:
            raise OnnxImportError(f"{self.where}: IR value {tensor.name!r} is declared twice")
        self.tensors[tensor.name] = tensor
        for axis, d in enumerate(tensor.shape):
            if isinstance(d, str):
                self.sym_source.setdefault(d, (tensor.name, axis))
        return tensor

    def weight(self, name: str, dtype: DType, shape: tuple[int, ...], ref: WeightRef) -> Value:
        self.declare(Tensor(name, dtype, shape, weight=ref))
        return Value(name, dtype, shape, weight=True)

    def graph_input(self, name: str, dtype: DType, shape: tuple[Dim, ...]) -> Value:
        self.declare(Tensor(name, dtype, shape))
        return Value(name, dtype, shape)

    # --- emission ------------------------------------------------------------------------------------------
    def emit(self, op: str, inputs: Sequence[Value | None], attrs: Mapping[str, Any] | None, n_outputs: int,
             version: int, dtypes: Sequence[DType | None] | None, shapes: Sequence[Sequence[Dim] | None] | None,
             where: str) -> list[Value]:
        schema = self.reg.find(op, version)
        if schema is None:
            raise OnnxImportError(f"{where}: the IR op {op} (version {version}) is not registered in this "
                                  "installation")
        attributes = tuple((k, attr(v)) for k, v in (attrs or {}).items() if v is not None)
        self._counter += 1
        node_name = f"{op.lower()}_{self._counter}"
        probe = Node(node_name, op, tuple("" if v is None else f"in{i}" for i, v in enumerate(inputs)),
                     tuple(f"out{i}" for i in range(n_outputs)), attributes, version)
        resolved, problems = schema.resolve_attrs(probe)
        problems += [("arity", p) for p in schema.check_arity(probe)]
        if problems:
            raise OnnxImportError(f"{where}: IR {op}: " + "; ".join(msg for _, msg in problems))
        types = self._infer(probe, schema, inputs, resolved, where)
        present = [v for v in inputs if v is not None]
        if present and all(v.const is not None for v in present) and (op, version) in REFERENCE_OPS and \
                fold_fits(types, dtypes, inputs):
            return self._fold(probe, inputs, types, dtypes, where)
        names = [self.place(v, where) if v is not None else "" for v in inputs]
        outs: list[Value] = []
        out_names: list[str] = []
        for slot in range(n_outputs):
            dt = (dtypes[slot] if dtypes and slot < len(dtypes) else None) or types[slot][0]
            shape = (shapes[slot] if shapes and slot < len(shapes) else None)
            shape = tuple(shape) if shape is not None else types[slot][1]
            if dt is None or shape is None:
                raise OnnxImportError(f"{where}: cannot infer the {'dtype' if dt is None else 'shape'} of output "
                                      f"#{slot} of the IR {op} it translates to")
            if any(isinstance(d, int) and d < 0 for d in shape):
                raise OnnxImportError(f"{where}: the IR {op} it translates to would have the shape {list(shape)}: "
                                      "a negative size")
            name = self.unique(self.hint)
            self.declare(Tensor(name, dt, shape))
            out_names.append(name)
            outs.append(Value(name, dt, tuple(shape)))
        self.nodes.append(Node(node_name, op, tuple(names), tuple(out_names), attributes, version))
        return outs

    def _infer(self, probe: Node, schema: Any, inputs: Sequence[Value | None], resolved: Mapping[str, Any],
               where: str) -> list[tuple[DType | None, tuple[Dim, ...] | None]]:
        ins = [None if v is None else TensorType(v.dtype, tuple(v.shape)) for v in inputs]
        consts = {i: v.const for i, v in enumerate(inputs) if v is not None and v.const is not None}
        for i, v in enumerate(inputs):
            if v is not None and v.sym is not None and all(isinstance(d, int) for d in v.sym):
                consts[i] = np.asarray(v.sym, np.int64).astype(v.dtype.numpy).reshape(tuple(int(d) for d in v.shape))
        dt_problems = schema.check_dtypes([v.dtype if v is not None else None for v in inputs], [])
        if dt_problems:
            raise OnnxImportError(f"{where}: IR {probe.op}: " + "; ".join(dt_problems))
        ctx = InferCtx(probe, schema, ins, resolved, consts)
        try:
            want = list(schema.dtypes(ctx)) if schema.dtypes is not None else []
            shapes = list(schema.infer(ctx)) if schema.infer is not None else []
        except UaiiError as exc:
            raise OnnxImportError(f"{where}: IR {probe.op}: {exc}") from None
        out: list[tuple[DType | None, tuple[Dim, ...] | None]] = []
        for slot in range(len(probe.outputs)):
            dt = want[slot] if slot < len(want) else None
            shape = shapes[slot] if slot < len(shapes) else None
            out.append((dt or _bound_dtype(schema, slot, inputs), None if shape is None else tuple(shape)))
        return out

    def _fold(self, probe: Node, inputs: Sequence[Value | None], types: list[tuple[DType | None, Any]],
              dtypes: Sequence[DType | None] | None, where: str) -> list[Value]:
        """The node evaluated with uaii.ir's reference (only called once :func:`fold_fits` bounded its outputs)."""
        arrays = [None if v is None else v.const for v in inputs]
        try:
            results = run_node(probe, arrays, self.reg)
        except UaiiError as exc:
            raise OnnxImportError(f"{where}: folding IR {probe.op} on constant inputs: {exc}") from None
        out: list[Value] = []
        for slot, arr in enumerate(results):
            dt = (dtypes[slot] if dtypes and slot < len(dtypes) else None) or types[slot][0]
            if dt is not None and arr.dtype != dt.numpy:
                raise OnnxImportError(f"{where}: internal error: IR {probe.op} folded to {arr.dtype}, but the "
                                      f"importer declared {dt.value}")
            out.append(Value.of_array(arr))
        return out

    # --- materialization -----------------------------------------------------------------------------------
    def place(self, value: Value, where: str) -> str:
        """The IR name holding ``value`` at run time (constants and symbolic vectors placed on first use)."""
        if value.name and value.transposed is None:
            return value.name
        hit = self._placed.get(id(value))
        if hit is not None:
            return hit[1]
        if value.transposed is not None:
            name = self.emit("Transpose", [value.transposed], {"perm": (1, 0)}, 1, 1, None, None, where)[0].name
        elif value.const is not None:
            name = self.constant(value.const, where)
        elif value.sym is not None:
            name = self._sym_vector(value, where)
        else:
            raise OnnxImportError(f"{where}: internal error: value has no IR name and no known contents")
        self._placed[id(value)] = (value, name)
        return name

    def constant(self, array: np.ndarray, where: str) -> str:
        arr = np.asarray(array)  # (np.ascontiguousarray would make a scalar 1-D)
        if arr.nbytes > MAX_INLINE_BYTES:
            raise OnnxImportError(f"{where}: a constant computed at load time has {arr.nbytes} bytes "
                                  f"(shape {list(arr.shape)}); the IR inlines at most {MAX_INLINE_BYTES}")
        try:
            t = Tensor.constant(self.unique("const"), arr)
        except UaiiError as exc:
            raise OnnxImportError(f"{where}: constant of dtype {arr.dtype}: {exc}") from None
        self.declare(t)
        return t.name

    def _sym_vector(self, value: Value, where: str) -> str:
        """Runtime IR for a symbolic vector: each symbol read with Shape, ints as constants, joined by Concat."""
        assert value.sym is not None
        parts: list[Value] = []
        for d in value.sym:
            if isinstance(d, int):
                parts.append(Value.of_array(np.asarray([d], np.int64)))
            else:
                t = self.dim_tensor(d, where)
                parts.append(Value(t, DType.I64, (1,)))
        joined = parts[0] if len(parts) == 1 else self.emit("Concat", parts, {"axis": 0}, 1, 1, None,
                                                             [(len(parts),)], where)[0]
        out = joined
        if value.shape == ():
            out = self.emit("Reshape", [joined], {"shape": ()}, 1, 1, None, [()], where)[0]
        if value.dtype is not DType.I64:
            out = self.emit("Cast", [out], {"to": value.dtype.value}, 1, 1, None, None, where)[0]
        return self.place(out, where)

    def dim_tensor(self, d: str, where: str) -> str:
        """A [1] int64 IR value that holds symbol ``d`` at run time."""
        hit = self._dim_tensors.get(d)
        if hit is not None:
            return hit
        if d in self.sym_source:
            src, axis = self.sym_source[d]
            src_t = self.tensors[src]
            name = self.emit("Shape", [Value(src, src_t.dtype, src_t.shape)], {"start": axis, "end": axis + 1},
                             1, 1, [DType.I64], [(1,)], where)[0].name
        elif d in self.sym_expr:
            op, a, b = self.sym_expr[d]
            va = self._dim_value(a, where)
            vb = self._dim_value(b, where)
            name = self.emit(op, [va, vb], None, 1, 1, [DType.I64], [(1,)], where)[0].name
        else:
            raise OnnxImportError(f"{where}: the size {d!r} is needed at run time but no tensor carries it")
        self._dim_tensors[d] = name
        return name

    def _dim_value(self, d: Dim, where: str) -> Value:
        if isinstance(d, int):
            return Value.of_array(np.asarray([d], np.int64))
        return Value(self.dim_tensor(d, where), DType.I64, (1,))

    def adopt(self, value: Value, onnx_name: str) -> Value:
        """``value`` under the ONNX name of the node output it is, when the current node produced it and nothing
        else refers to it by its generated name yet (then the IR reads like the ONNX graph); else unchanged."""
        old = value.name
        if not old or old == onnx_name or onnx_name in self.tensors or value.transposed is not None:
            return value
        mine = self.nodes[self.node_start:]
        if not any(old in n.outputs for n in mine):
            return value
        if any(old in n.inputs for n in mine) or old in self._dim_tensors.values() or any(
                name == old for _, name in self._placed.values()):
            return value
        k = next(i for i in range(len(self.nodes) - 1, self.node_start - 1, -1) if old in self.nodes[i].outputs)
        n = self.nodes[k]
        self.nodes[k] = Node(n.name, n.op, n.inputs, tuple(onnx_name if o == old else o for o in n.outputs),
                             n.attributes, n.version)
        t = self.tensors.pop(old)
        self.tensors[onnx_name] = Tensor(onnx_name, t.dtype, t.shape)
        for sym, (src, axis) in list(self.sym_source.items()):
            if src == old:
                self.sym_source[sym] = (onnx_name, axis)
        return Value(onnx_name, value.dtype, value.shape)

    # --- the result ----------------------------------------------------------------------------------------
    def build(self, name: str, inputs: Sequence[str], outputs: Sequence[str], metadata: Mapping[str, str]) -> Graph:
        """The graph restricted to what the outputs need (nodes that only fed folded shape arithmetic go)."""
        return restricted(Graph(name=name, inputs=tuple(inputs), outputs=tuple(outputs), nodes=tuple(self.nodes),
                                tensors=tuple(self.tensors.values()), metadata=tuple(metadata.items()),
                                producer="uaii.loaders.onnx"), outputs)


def fold_fits(types: Sequence[tuple[DType | None, tuple[Dim, ...] | None]],
              dtypes: Sequence[DType | None] | None = None, inputs: Sequence[Value | None] = ()) -> bool:
    """Whether a node may be folded: every output, as its schema inferred it from the constant inputs, fits an
    inline constant (:data:`FOLD_LIMIT` bytes) and no dim of an output or input exceeds :data:`FOLD_LIMIT`
    elements. Decided from the types BEFORE anything is evaluated: a hostile constant (Range to 2^40,
    ConstantOfShape of [2^20, 2^20]) must never be computed at load time, and neither may the work a reference
    does per dim of an empty tensor (Trilu of [2^40, 0] builds a mask row of 2^40). Such a node stays a runtime
    node, whose size the planner then judges."""
    for v in inputs:
        if v is not None and v.const is not None and any(d > FOLD_LIMIT for d in v.const.shape):
            return False
    for slot, (inferred, shape) in enumerate(types):
        dt = (dtypes[slot] if dtypes and slot < len(dtypes) else None) or inferred
        if dt is None or dt.is_quantized or shape is None or not all(isinstance(d, int) for d in shape):
            return False
        n = 1
        for d in shape:
            if int(d) > FOLD_LIMIT:
                return False
            n *= int(d)
        if n * dt.numpy.itemsize > FOLD_LIMIT:
            return False
    return True


def _bound_dtype(schema: Any, slot: int, inputs: Sequence[Value | None]) -> DType | None:
    """The output dtype the schema's type variables imply from the input dtypes."""
    p = schema.param_at(schema.outputs, slot)
    if p is None:
        return None
    if not isinstance(p.types, str):
        return next(iter(p.types)) if len(p.types) == 1 else None
    for k, v in enumerate(inputs):
        q = schema.param_at(schema.inputs, k)
        if v is not None and q is not None and q.types == p.types:
            return v.dtype
    return None


__all__ = ["FOLD_LIMIT", "GraphBuilder", "fold_fits"]

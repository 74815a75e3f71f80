"""Load-time arithmetic on sizes: the part of the importer that keeps the IR plannable.

Exporters compute shapes at run time (``Shape -> Gather -> Concat -> Reshape``). Where the input shapes decide
the result, the importer does that arithmetic here on *dims* — ints and IR symbols — so the Reshape gets a target
attribute and no runtime shape ops remain.

Why there is arithmetic here at all, beside uaii.ir's references: a symbol is not a number. ``seq + 1`` cannot be
evaluated at load time; it becomes the symbol ``seq_plus_1`` (uaii.ir.shapes' naming, the same names the IR's own
shape inference gives), and the builder records how each such symbol is computed so that it can still produce it
at run time when a runtime op needs the number itself (:meth:`~.builder.GraphBuilder.dim_tensor` emits the very IR
op). Two symbols compare equal only when they are the same name (same origin: :func:`~.values.sanitize_symbol`
keeps dim_params apart from generated names); anything else about symbols is unknown and stays a runtime op.
Plain numbers are never computed here: a pair of ints in a vector that also holds symbols is evaluated with the
IR op's reference (:func:`int_pair`: int64/int32 wrap-around, C-style Div, exactly as at run time), and a vector
of ints only is a constant that :meth:`~.builder.GraphBuilder.emit` folds through that reference. Sizes (numel,
Range and Slice lengths) are dims: uaii.ir.shapes' arithmetic, exact like the shapes it infers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from uaii.ir import Dim, DType, Node, UaiiError
from uaii.ir.reference import run_node
from uaii.ir.shapes import ShapeError, dim_add, dim_div, dim_mul, dim_sub, quotient

from .context import NodeContext
from .values import Value

INT_TYPES = frozenset({DType.I64, DType.I32})
_SIZE_OPS = {"Add": dim_add, "Sub": dim_sub, "Mul": dim_mul, "Div": dim_div}


def _record(ctx: NodeContext, result: Dim, op: str, a: Dim, b: Dim) -> Dim:
    """``result`` (a generated symbol for ``a op b``) noted as computed that way; a name that already stands for a
    different computation (uaii.ir.shapes' names are not unique: ``a_minus_b_minus_c`` is (a - b) - c and
    a - (b - c)) gets a fresh symbol instead, so that two different values never share a name."""
    b_ = ctx.builder
    if not isinstance(result, str):
        return result
    known = b_.sym_expr.get(result)
    if known is not None and known != (op, a, b) and not (op in ("Add", "Mul", "Max", "Min")
                                                         and known == (op, b, a)):
        result = b_.fresh_symbol(op.lower())
    if result not in b_.sym_source and result not in b_.sym_expr:
        b_.sym_expr[result] = (op, a, b)
    return result


def int_pair(ctx: NodeContext, op: str, a: int, b: int, dtype: DType = DType.I64) -> int | bool | None:
    """``a op b`` for two ints of ``dtype``, computed by the IR op's reference (the one definition of what the op
    does to numbers: wrap-around, C-style Div, bool comparisons); None where it raises (a Div by 0: left to run
    time) or the operands do not fit ``dtype``."""
    np_dt = dtype.numpy
    info = np.iinfo(np_dt)
    if not (info.min <= a <= info.max and info.min <= b <= info.max):
        return None
    node = Node("fold", op, ("a", "b"), ("y",))
    try:
        (y,) = run_node(node, [np.asarray(a, np_dt), np.asarray(b, np_dt)], ctx.builder.reg)
    except UaiiError:
        return None
    value = np.asarray(y).reshape(())
    return bool(value) if value.dtype == np.bool_ else int(value)


def dim_binary(ctx: NodeContext, op: str, a: Dim, b: Dim) -> Dim | None:
    """``a op b`` for op in Add/Sub/Mul/Div on *sizes* (uaii.ir.shapes' rules: exact, Div only where it divides,
    no negative result), symbols recorded for run time; None where the result is not a size."""
    if (isinstance(a, int) and a < 0) or (isinstance(b, int) and b < 0):
        return None
    try:
        return _record(ctx, _SIZE_OPS[op](a, b), op, a, b)
    except ShapeError:
        return None


def dim_minmax(ctx: NodeContext, op: str, a: Dim, b: Dim, dtype: DType = DType.I64) -> Dim:
    """``Max``/``Min`` of two dims: ints through the reference, the common symbol, a symbol against an int <= 0
    (sizes are never negative), or a new symbol computed by that IR op at run time."""
    if isinstance(a, int) and isinstance(b, int):
        got = int_pair(ctx, op, a, b, dtype)
        return int(got) if got is not None else (max(a, b) if op == "Max" else min(a, b))
    if a == b:
        return a
    sym, other = (a, b) if isinstance(a, str) else (b, a)
    if isinstance(other, int) and other <= 0:
        return sym if op == "Max" else other
    x, y = sorted((a, b), key=lambda d: (isinstance(d, int), str(d)))
    return _record(ctx, f"{x}_{op.lower()}_{y}", op, x, y)  # (an identifier: a symbol, then a symbol or an int > 0)


def broadcast_pairs(a: Sequence[Dim], b: Sequence[Dim]) -> list[tuple[Dim, Dim]] | None:
    """Elementwise pairs of two int vectors/scalars under broadcasting (length 1 repeats); None if they differ."""
    if len(a) == len(b):
        return list(zip(a, b, strict=True))
    if len(a) == 1:
        return [(a[0], y) for y in b]
    if len(b) == 1:
        return [(x, b[0]) for x in a]
    return None


def dim_pairs(x: Value, y: Value) -> list[tuple[Dim, Dim]] | None:
    """The element pairs of two size vectors (rank 0 or 1) known as dims, broadcast; None when either is not."""
    if x.rank > 1 or y.rank > 1:
        return None
    a, b = x.dims(), y.dims()
    return None if a is None or b is None else broadcast_pairs(a, b)


def sym_binary(ctx: NodeContext, op: str, x: Value, y: Value) -> Value | None:
    """Add/Sub/Mul/Div of two integer values known as dims, at least one symbolic; None when not foldable. Int
    pairs go through the reference (:func:`int_pair`); a symbol takes part only where the result is a size."""
    if x.dtype not in INT_TYPES or y.dtype is not x.dtype or not (x.is_sym or y.is_sym):
        return None
    pairs = dim_pairs(x, y)
    if pairs is None:
        return None
    out: list[Dim] = []
    for p, q in pairs:
        r = int_pair(ctx, op, p, q, x.dtype) if isinstance(p, int) and isinstance(q, int) else \
            dim_binary(ctx, op, p, q)
        if r is None:
            return None
        out.append(int(r) if isinstance(r, bool) else r)
    return like(out, x if x.rank >= y.rank else y, x.dtype)


def like(dims: Sequence[Dim], shape_of: Value, dtype: DType) -> Value:
    """``dims`` as a known vector of ``dtype`` with ``shape_of``'s rank (0 or 1): what a fold of a size vector
    gives back (an int32 vector stays int32)."""
    v = Value.of_dims(list(dims), dtype=dtype)
    return reshape_known(v, ()) if shape_of.rank == 0 else v


def reshape_known(v: Value, shape: tuple[int, ...]) -> Value:
    """A constant or symbolic vector with a new rank-0/1 shape (same elements)."""
    if v.const is not None:
        return Value.of_array(v.const.reshape(shape))
    return Value("", v.dtype, shape, sym=v.sym)


def compare_dims(ctx: NodeContext, op: str, a: Dim, b: Dim, dtype: DType = DType.I64) -> bool | None:
    """A comparison of two dims decided at load time, or None: two ints through the reference, one symbol with
    itself (equal), anything else unknown."""
    if isinstance(a, int) and isinstance(b, int):
        got = int_pair(ctx, op, a, b, dtype)
        return None if got is None else bool(got)
    if a == b:
        return op in ("Equal", "LessOrEqual", "GreaterOrEqual")
    return None


def sym_compare(ctx: NodeContext, op: str, x: Value, y: Value) -> Value | None:
    if not (x.is_sym or y.is_sym) or x.dtype is not y.dtype:
        return None
    pairs = dim_pairs(x, y)
    if pairs is None:
        return None
    res = [compare_dims(ctx, op, p, q, x.dtype) for p, q in pairs]
    if any(r is None for r in res):
        return None
    shape = (len(res),) if max(x.rank, y.rank) == 1 else ()
    return Value.of_array(np.asarray(res, np.bool_).reshape(shape))


# --- reshapes ---------------------------------------------------------------------------------------------
def onnx_target(ctx: NodeContext, x: Value, target: Sequence[Dim], allowzero: bool) -> list[Dim]:
    """Complete output dims of an ONNX Reshape target (0 copies unless ``allowzero``, one -1 inferred)."""
    out: list[Dim | None] = []
    for i, t in enumerate(target):
        if isinstance(t, int) and t == 0 and not allowzero:
            if i >= x.rank:
                ctx.fail(f"target {list(target)}: 0 at position {i} copies a dim the rank-{x.rank} input lacks")
            out.append(x.shape[i])
        elif isinstance(t, int) and t == -1:
            out.append(None)
        elif isinstance(t, int) and t < -1:
            ctx.fail(f"target {list(target)} has the negative size {t}")
        else:
            out.append(t)
    holes = [i for i, d in enumerate(out) if d is None]
    if len(holes) > 1:
        ctx.fail(f"target {list(target)} has more than one -1")
    if holes:
        known = [d for d in out if d is not None]
        try:
            out[holes[0]] = quotient(list(x.shape), known)
        except ShapeError as exc:
            ctx.fail(f"cannot reshape {list(x.shape)} to {list(target)}: {exc}")
    return [d for d in out if d is not None]


def reshape_to(ctx: NodeContext, x: Value, dims: Sequence[Dim]) -> Value:
    """``x`` reshaped to the complete ``dims`` (ints and symbols): an IR Reshape with a target attribute when the
    symbols can be expressed by position (0 = same dim at the same position, one -1 inferred), else a runtime
    Reshape whose target the builder computes from the symbols."""
    dims = list(dims)
    if tuple(dims) == tuple(x.shape) and x.name:
        return x
    if all(isinstance(d, int) for d in (*dims, *x.shape)):
        have, want = math.prod(int(d) for d in x.shape), math.prod(int(d) for d in dims)
        if have != want:
            ctx.fail(f"cannot reshape {list(x.shape)} ({have} elements) to {dims} ({want} elements)")
    if (x.const is not None or x.sym is not None) and len(dims) <= 1 and x.rank <= 1 and all(
            isinstance(d, int) for d in dims):
        return reshape_known(x, tuple(int(d) for d in dims))
    attr: list[int] = []
    pending: list[int] = []
    for i, d in enumerate(dims):
        if isinstance(d, int):
            if d == 0 and not (i < x.rank and x.shape[i] == 0):
                ctx.fail(f"reshape to {dims}: a zero-size dimension is not supported")
            attr.append(d)
        elif i < x.rank and x.shape[i] == d:
            attr.append(0)
        else:
            attr.append(-1)
            pending.append(i)
    if len(pending) <= 1:
        return ctx.emit("Reshape", [x], {"shape": tuple(attr)}, shape=tuple(dims))
    # several sizes move: a runtime target, the builder computes them; one that no tensor carries is the -1
    b = ctx.builder
    unknown = [i for i in pending if dims[i] not in b.sym_source and dims[i] not in b.sym_expr]
    if len(unknown) > 1:
        ctx.fail(f"reshape to {dims}: the sizes {[dims[i] for i in unknown]} cannot be computed at run time")
    infer = unknown[0] if unknown else pending[-1]
    target: list[Dim] = [0 if a == 0 else (-1 if i == infer else dims[i]) for i, a in enumerate(attr)]
    return ctx.emit("Reshape", [x, ctx.symbolic(target)], shape=tuple(dims))


def numel(ctx: NodeContext, shape: Sequence[Dim]) -> Dim:
    """The product of ``shape``, each symbolic step recorded so that the builder can compute it at run time."""
    out: Dim = 1
    for d in shape:
        nxt = dim_binary(ctx, "Mul", out, d)
        if nxt is None:
            ctx.fail(f"cannot multiply the sizes {list(shape)}")
        out = nxt
    return out


def int_list(arr: np.ndarray | None) -> list[int] | None:
    return None if arr is None else [int(v) for v in np.asarray(arr).reshape(-1)]


def clamp_i64(v: int) -> int:
    return max(-(1 << 63), min((1 << 63) - 1, v))


def prod(xs: Sequence[int]) -> int:
    return math.prod(xs)


__all__ = [
    "broadcast_pairs",
    "compare_dims",
    "dim_binary",
    "dim_minmax",
    "int_list",
    "int_pair",
    "like",
    "numel",
    "onnx_target",
    "reshape_known",
    "reshape_to",
    "sym_binary",
    "sym_compare",
]

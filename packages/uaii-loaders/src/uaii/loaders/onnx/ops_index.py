"""ai.onnx data-movement and indexing ops: Concat, Split, Slice, Transpose, Gather, GatherND, Trilu, CumSum.

Each first tries the load-time answer on symbolic size vectors (Concat of dims, Gather of one dim, a Slice of a
shape) and otherwise maps onto the IR op; a weight table gathered by token ids becomes an IR Embedding (read by
rows, so it streams), and a transposed 2-D weight is kept lazy for MatMul's ``transpose_b``.
"""

from __future__ import annotations

import numpy as np

from uaii.ir import Dim, DType
from uaii.ir.shapes import ShapeError, normalize_axis

from .context import NodeContext
from .dispatch import AI_ONNX, onnx_op
from .fold import clamp_i64, dim_binary, dim_minmax, numel, reshape_known, reshape_to
from .values import Value

_BIG = 1 << 62


def _axis(ctx: NodeContext, axis: int, rank: int) -> int:
    try:
        return normalize_axis(axis, rank)
    except ShapeError as exc:
        ctx.fail(str(exc))


@onnx_op(AI_ONNX, "Concat", 13)
def concat(ctx: NodeContext) -> Value:
    """Concat (folded for size vectors)"""
    vals = [v for v in ctx.inputs if v is not None]
    if not vals:
        ctx.fail("needs at least one input")
    axis = _axis(ctx, int(ctx.need_attr("axis")), vals[0].rank)
    if any(v.rank != vals[0].rank for v in vals):
        ctx.fail(f"inputs have different ranks {[v.rank for v in vals]}")
    if any(v.dtype is not vals[0].dtype for v in vals):
        ctx.fail(f"inputs have different types: {sorted({v.dtype.value for v in vals})}")
    if all(v.rank == 1 and v.dims() is not None for v in vals) and any(v.is_sym for v in vals):
        return Value.of_dims([d for v in vals for d in v.dims() or ()], dtype=vals[0].dtype)
    nonempty = [v for v in vals if v.shape[axis] != 0]
    if len(nonempty) == 1 and nonempty[0].name:
        return nonempty[0]
    return ctx.emit("Concat", nonempty or vals[:1], {"axis": axis})


@onnx_op(AI_ONNX, "Split", 13, 18)
def split(ctx: NodeContext) -> list[Value]:
    """Split"""
    x = ctx.input(0)
    axis = _axis(ctx, ctx.attr("axis", 0), x.rank)
    n = ctx.n_outputs
    sizes = None
    if ctx.optional(1) is not None:
        sizes = tuple(int(s) for s in ctx.need_const(1, "split").reshape(-1))
    elif ctx.version >= 18:
        num = ctx.attr("num_outputs")
        if num is not None and int(num) != n:
            ctx.fail(f"num_outputs={num} but the node has {n} outputs")
        dim = x.shape[axis]
        if isinstance(dim, int) and dim % n:  # ONNX 18: the last chunk is smaller
            chunk = -(-dim // n)
            sizes = tuple([chunk] * (n - 1) + [dim - chunk * (n - 1)])
    if sizes is not None:
        if len(sizes) != n or any(s < 0 for s in sizes):
            ctx.fail(f"split sizes {list(sizes)} must be {n} non-negative numbers, one per output")
        if isinstance(x.shape[axis], int) and sum(sizes) != x.shape[axis]:
            ctx.fail(f"split sizes {list(sizes)} do not add up to the axis' {x.shape[axis]}")
    if x.is_sym and x.rank == 1 and x.dims() is not None and sizes is not None:
        dims, out, at = x.dims() or (), [], 0
        for s in sizes:
            out.append(Value.of_dims(list(dims[at:at + s]), dtype=x.dtype))
            at += s
        return out
    return ctx.emit_n("Split", [x], {"axis": axis, "split": sizes}, outputs=n)


def _slice_params(ctx: NodeContext, rank: int) -> tuple[list[Dim], list[Dim], list[int], list[int]]:
    starts = ctx.dims(1)
    ends = ctx.dims(2)
    if starts is None or ends is None:
        ctx.fail("starts and ends must be known at load time (constants or sizes of tensors)")
    n = len(starts)
    if n == 0:
        ctx.fail("starts is empty: no axis to slice")
    axes = list(range(n)) if ctx.optional(3) is None else [int(a) for a in ctx.need_const(3, "axes").reshape(-1)]
    steps = [1] * n if ctx.optional(4) is None else [int(s) for s in ctx.need_const(4, "steps").reshape(-1)]
    if not len(ends) == len(axes) == len(steps) == n:
        ctx.fail("starts, ends, axes and steps must have one entry per sliced axis")
    if 0 in steps:
        ctx.fail("steps must not be 0")
    return list(starts), list(ends), [_axis(ctx, a, rank) for a in axes], steps


@onnx_op(AI_ONNX, "Slice", 13)
def slice_(ctx: NodeContext) -> Value:
    """Slice (bounds as attributes; a bound that is a run-time size becomes Gather of a Range)"""
    x = ctx.input(0)
    starts, ends, axes, steps = _slice_params(ctx, x.rank)
    if x.rank == 1 and x.dims() is not None and x.is_sym and all(isinstance(v, int) for v in (*starts, *ends)):
        dims = list(x.dims() or ())
        return Value.of_dims(dims[slice(int(starts[0]), int(ends[0]), steps[0])], dtype=x.dtype)
    static: list[tuple[int, int, int, int]] = []
    dynamic: list[tuple[int, Dim, Dim]] = []
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        dim = x.shape[a]
        if isinstance(e, str) and e == dim:
            e = _BIG
        if isinstance(s, int) and isinstance(e, int):
            static.append((a, clamp_i64(s), clamp_i64(e), st))
        elif st == 1 and not (isinstance(s, int) and s < 0) and not (isinstance(e, int) and e < 0):
            # ONNX clamps both bounds to [0, dim] (they are >= 0 here). A constant end clamps to the axis (an
            # INT_MAX-style "to the end" directly; a traced length as Min(end, dim)). A run-time end is taken to
            # lie within the axis, as it does in every valid run: clamping it too would give the slice a length
            # unrelated to the sizes it is combined with (x[:seq] of a 16-row table added to x [seq, ...]), which
            # the backends' layout for the largest sizes cannot bind; a run where it does not fails in the Gather
            # (index out of range) instead of returning the shorter slice. The start then clamps to the end, so
            # that the length e - s is never negative (a start past the end: an empty slice).
            if isinstance(e, int):
                e = dim if e >= 1 << 31 else dim_minmax(ctx, "Min", e, dim)
            dynamic.append((a, dim_minmax(ctx, "Min", s, e), e))
        else:
            ctx.fail(f"slice bounds {s}:{e}:{st} on axis {a} depend on run-time sizes in a way the IR cannot express")
    out = x
    if static:
        out = ctx.emit("Slice", [out], {"starts": tuple(s for _, s, _, _ in static),
                                        "ends": tuple(e for _, _, e, _ in static),
                                        "axes": tuple(a for a, _, _, _ in static),
                                        "steps": tuple(st for *_, st in static)})
    for a, s, e in dynamic:
        length = dim_binary(ctx, "Sub", e, s)
        start = Value.of_dims([s])
        idx = ctx.emit("Range", [reshape_known(start, ()), reshape_known(Value.of_dims([e]), ()),
                                 Value.of_array(np.asarray(1, np.int64))],
                       shape=None if length is None else (length,))
        out = ctx.emit("Gather", [out, idx], {"axis": a})
    return out


@onnx_op(AI_ONNX, "Transpose", 13, 21, 23, 24, 25)
def transpose(ctx: NodeContext) -> Value:
    """Transpose (a 2-D weight's transpose stays lazy for MatMul transpose_b)"""
    x = ctx.input(0)
    perm = ctx.attr("perm")
    perm = tuple(range(x.rank))[::-1] if perm is None else tuple(int(p) for p in perm)
    if sorted(perm) != list(range(x.rank)):
        ctx.fail(f"perm {list(perm)} is not a permutation of the {x.rank} axes")
    if perm == tuple(range(x.rank)):
        return x
    if x.weight and x.rank == 2 and x.transposed is None:
        return Value("", x.dtype, (x.shape[1], x.shape[0]), transposed=x)
    if x.transposed is not None and perm == (1, 0):
        return x.transposed
    return ctx.emit("Transpose", [x], {"perm": perm})


@onnx_op(AI_ONNX, "Gather", 13)
def gather(ctx: NodeContext) -> Value:
    """Embedding (a 2-D weight table by ids on axis 0; negative ids counted from the end first) or Gather"""
    data, idx = ctx.input(0), ctx.input(1)
    axis = _axis(ctx, ctx.attr("axis", 0), data.rank)
    if idx.dtype not in (DType.I64, DType.I32):
        ctx.fail(f"indices must be int32 or int64, found {idx.dtype.value}")
    dims = data.dims()
    ids = ctx.const(1)
    if dims is not None and data.is_sym and ids is not None and ids.ndim <= 1:
        if not all(-len(dims) <= int(i) < len(dims) for i in ids.reshape(-1)):
            ctx.fail(f"indices {ids.reshape(-1).tolist()} are out of range for the {len(dims)} sizes gathered")
        picked = [dims[int(i)] for i in ids.reshape(-1)]  # negative ids count from the end, as in ONNX
        return reshape_known(Value.of_dims(picked, dtype=data.dtype), tuple(ids.shape))
    if data.weight and data.transposed is None and data.rank == 2 and axis == 0:
        return ctx.emit("Embedding", [_from_the_end(ctx, idx, data.shape[0]), data])
    return ctx.emit("Gather", [data, idx], {"axis": axis})


def _from_the_end(ctx: NodeContext, idx: Value, n: Dim) -> Value:
    """Indices with ONNX's negative ones (counting from the end of an axis of ``n``) made non-negative: IR
    Embedding looks token ids up and refuses negative ones. ``Where(idx < 0, idx + n, idx)``, folded for constant
    indices, left out where they are all >= 0."""
    known = ctx.const(1)
    if known is not None and not np.any(known < 0):
        return idx
    zero = Value.scalar(0, idx.dtype)
    size = reshape_known(Value.of_dims([n], dtype=idx.dtype), ())
    return ctx.emit("Where", [ctx.emit("Less", [idx, zero]), ctx.emit("Add", [idx, size]), idx])


@onnx_op(AI_ONNX, "GatherND", 13)
def gather_nd(ctx: NodeContext) -> Value:
    """Gather (of the data flattened over the batch and indexed axes, at a computed flat index)"""
    data, idx = ctx.input(0), ctx.input(1)
    b = int(ctx.attr("batch_dims", 0))
    k = idx.shape[-1] if idx.rank else None
    if not 0 <= b < min(data.rank, idx.rank):
        ctx.fail(f"batch_dims={b} must be below the ranks of data ({data.rank}) and indices ({idx.rank})")
    if not isinstance(k, int) or not 1 <= k <= data.rank - b:
        ctx.fail(f"the last axis of the indices must be a constant between 1 and {data.rank - b}, found {k}")
    if idx.dtype is not DType.I64:
        idx = ctx.emit("Cast", [idx], {"to": "i64"})
    lead = data.shape[b:b + k]
    strides = [numel(ctx, lead[j + 1:]) for j in range(k)]
    flat_idx: Value | None = None
    for j in range(k):
        col = ctx.emit("Gather", [idx, Value.of_array(np.asarray(j, np.int64))], {"axis": idx.rank - 1})
        dim = reshape_known(Value.of_dims([lead[j]]), ())
        negative = ctx.emit("Less", [col, Value.of_array(np.asarray(0, np.int64))])
        col = ctx.emit("Where", [negative, ctx.emit("Add", [col, dim]), col])
        if strides[j] != 1:
            col = ctx.emit("Mul", [col, reshape_known(Value.of_dims([strides[j]]), ())])
        flat_idx = col if flat_idx is None else ctx.emit("Add", [flat_idx, col])
    assert flat_idx is not None
    if b:  # each batch position addresses its own block of numel(lead) rows
        n_batch = numel(ctx, data.shape[:b])
        pos = ctx.emit("Range", [Value.of_array(np.asarray(0, np.int64)), reshape_known(Value.of_dims([n_batch]), ()),
                                 Value.of_array(np.asarray(1, np.int64))], shape=(n_batch,))
        pos = reshape_to(ctx, pos, [*data.shape[:b], *([1] * (flat_idx.rank - b))])
        block = reshape_known(Value.of_dims([numel(ctx, lead)]), ())
        flat_idx = ctx.emit("Add", [flat_idx, ctx.emit("Mul", [pos, block])])
    flat = reshape_to(ctx, data, [numel(ctx, data.shape[:b + k]), *data.shape[b + k:]])
    out = ctx.emit("Gather", [flat, flat_idx], {"axis": 0})
    return out


def _one_int(ctx: NodeContext, i: int, what: str) -> int:
    """Input ``i``: a load-time constant holding one integer."""
    arr = ctx.need_const(i, what)
    if arr.size != 1 or arr.dtype.kind not in "iu":
        ctx.fail(f"input #{i} ({what}) must hold one integer, found {arr.dtype} {list(arr.shape)}")
    return int(arr.reshape(-1)[0])


@onnx_op(AI_ONNX, "Trilu", 14)
def trilu(ctx: NodeContext) -> Value:
    """Trilu"""
    k = 0
    if ctx.optional(1) is not None:
        k = _one_int(ctx, 1, "k")
    return ctx.emit("Trilu", [ctx.input(0)], {"upper": bool(ctx.attr("upper", 1)), "k": k})


@onnx_op(AI_ONNX, "CumSum", 11, 14)
def cumsum(ctx: NodeContext) -> Value:
    """CumSum"""
    x = ctx.input(0)
    axis = _axis(ctx, _one_int(ctx, 1, "axis"), x.rank)
    return ctx.emit("CumSum", [x], {"axis": axis, "exclusive": bool(ctx.attr("exclusive", 0)),
                                    "reverse": bool(ctx.attr("reverse", 0))})


__all__ = ["concat", "cumsum", "gather", "gather_nd", "slice_", "split", "transpose", "trilu"]

"""ai.onnx shape ops: Shape/Size, Constant, ConstantOfShape, Range, Expand, Reshape, Flatten, Squeeze, Unsqueeze.

These are where exporters spend most of their nodes on arithmetic about sizes. Each handler first tries to answer
at load time (a constant, or a symbolic vector of dims, see :mod:`.fold`); only what really depends on run-time
values becomes IR (the Shape/Range/Fill/Expand ops, and a Reshape whose target the builder computes).
"""

from __future__ import annotations

import numpy as np

from uaii.ir import Dim, DType
from uaii.ir.ops.shape_ops import shape_dims
from uaii.ir.shapes import ShapeError, broadcast_shapes, normalize_axis

from .context import NodeContext
from .dispatch import AI_ONNX, onnx_op
from .fold import dim_binary, numel, onnx_target, reshape_known, reshape_to
from .values import Value

_ALL = (13, 15, 19, 21, 23, 24, 25)


@onnx_op(AI_ONNX, "Shape", *_ALL)
def shape(ctx: NodeContext) -> Value:
    """(folded: a vector of the input's dims, symbolic where they are)"""
    x = ctx.input(0)
    picked = shape_dims(x.rank, int(ctx.attr("start", 0)), ctx.attr("end", None))  # the IR Shape's own rule
    return Value.of_dims([x.shape[i] for i in picked])


@onnx_op(AI_ONNX, "Size", 13, 19, 21, 23, 24, 25)
def size(ctx: NodeContext) -> Value:
    """(folded: the element count, symbolic where the shape is)"""
    return reshape_known(Value.of_dims([numel(ctx, ctx.input(0).shape)]), ())


@onnx_op(AI_ONNX, "Constant", 13, 19, 21, 23, 24, 25)
def constant(ctx: NodeContext) -> Value:
    """(folded constant)"""
    a = ctx.attrs
    if "value" in a:
        return Value.of_array(a["value"])
    if "value_float" in a:
        return Value.of_array(np.asarray(a["value_float"], np.float32))
    if "value_floats" in a:
        return Value.of_array(np.asarray(a["value_floats"], np.float32))
    if "value_int" in a:
        return Value.of_array(np.asarray(a["value_int"], np.int64))
    if "value_ints" in a:
        return Value.of_array(np.asarray(a["value_ints"], np.int64))
    ctx.fail(f"only tensor, float(s) and int(s) constants are supported (found {sorted(a)})")


@onnx_op(AI_ONNX, "ConstantOfShape", 9, 20, 21, 23, 24, 25)
def constant_of_shape(ctx: NodeContext) -> Value:
    """Fill (folded through its reference when the shape is known and the result small)"""
    value = ctx.attr("value")
    fill = np.zeros((), np.float32) if value is None else np.asarray(value)
    if fill.size != 1:
        ctx.fail(f"value must hold one element, found {fill.size}")
    dims = ctx.dims(0)
    target = ctx.input(0) if dims is None else ctx.symbolic(dims)
    return ctx.emit("Fill", [target, Value.of_array(fill.reshape(()))], shape=None if dims is None else dims)


@onnx_op(AI_ONNX, "Range", 11, 27)
def range_(ctx: NodeContext) -> Value:
    """Range (or a folded constant)"""
    start, limit, delta = ctx.input(0), ctx.input(1), ctx.input(2)
    if not start.dtype is limit.dtype is delta.dtype:
        ctx.fail("start, limit and delta must have one type")
    length: Dim | None = None
    s, lim, d = start.dims(), limit.dims(), delta.dims()
    if s is not None and lim is not None and d == (1,) and start.dtype in (DType.I64, DType.I32):
        length = dim_binary(ctx, "Sub", lim[0], s[0])
        if isinstance(length, int) and length < 0:
            length = 0
    out = ctx.emit("Range", [start, limit, delta], shape=None if length is None else (length,))
    return out


@onnx_op(AI_ONNX, "Expand", 13)
def expand(ctx: NodeContext) -> Value:
    """Expand (removed when it changes nothing)"""
    x = ctx.input(0)
    dims = ctx.dims(1)
    if dims is None:
        return ctx.emit("Expand", [x, ctx.input(1)])
    try:
        out = broadcast_shapes(x.shape, dims)
    except ShapeError as exc:
        ctx.fail(str(exc))
    if tuple(out) == tuple(x.shape) and x.name:
        return x
    return ctx.emit("Expand", [x, ctx.symbolic(dims)], shape=out)


@onnx_op(AI_ONNX, "Reshape", 13, 14, 19, 21, 23, 24, 25)
def reshape(ctx: NodeContext) -> Value:
    """Reshape (target as the `shape` attribute where expressible)"""
    x = ctx.input(0)
    target = ctx.dims(1)
    allowzero = bool(ctx.attr("allowzero", 0))
    if target is None:
        if allowzero:
            ctx.fail("allowzero=1 with a target computed at run time is not supported")
        return ctx.emit("Reshape", [x, ctx.input(1)])
    return reshape_to(ctx, x, onnx_target(ctx, x, target, allowzero))


@onnx_op(AI_ONNX, "Flatten", 13, 21, 23, 24, 25)
def flatten(ctx: NodeContext) -> Value:
    """Reshape (to 2-D)"""
    x = ctx.input(0)
    axis = ctx.attr("axis", 1)
    axis = axis + x.rank if axis < 0 else axis
    if not 0 <= axis <= x.rank:
        ctx.fail(f"axis {ctx.attr('axis', 1)} is out of range for rank {x.rank}")
    return reshape_to(ctx, x, [numel(ctx, x.shape[:axis]), numel(ctx, x.shape[axis:])])


def _axes(ctx: NodeContext, rank: int, slot: int = 1) -> list[int] | None:
    axes = ctx.attr("axes") if ctx.version < 13 else None
    if axes is None and ctx.optional(slot) is not None:
        arr = ctx.need_const(slot, "axes")
        axes = [int(a) for a in arr.reshape(-1)]
    if axes is None:
        return None
    try:
        return sorted({normalize_axis(int(a), rank) for a in axes})
    except ShapeError as exc:
        ctx.fail(str(exc))


@onnx_op(AI_ONNX, "Squeeze", 13, 21, 23, 24, 25)
def squeeze(ctx: NodeContext) -> Value:
    """Reshape (dropping size-1 axes)"""
    x = ctx.input(0)
    axes = _axes(ctx, x.rank)
    if axes is None:
        unknown = [d for d in x.shape if isinstance(d, str)]
        if unknown:  # onnxruntime drops every dim that is 1 at run time: the output rank would depend on sizes
            ctx.fail(f"Squeeze without axes of a tensor with the symbolic dims {unknown}: which axes go depends "
                     "on run-time sizes; the IR needs a rank known at load time (export with explicit axes)")
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    for a in axes:
        if isinstance(x.shape[a], int) and x.shape[a] != 1:
            ctx.fail(f"axis {a} has size {x.shape[a]}, not 1")
    return reshape_to(ctx, x, [d for i, d in enumerate(x.shape) if i not in axes])


@onnx_op(AI_ONNX, "Unsqueeze", 13, 21, 23, 24, 25)
def unsqueeze(ctx: NodeContext) -> Value:
    """Reshape (inserting size-1 axes)"""
    x = ctx.input(0)
    arr = ctx.need_const(1, "axes")
    rank = x.rank + arr.size
    try:
        axes = sorted({normalize_axis(int(a), rank) for a in arr.reshape(-1)})
    except ShapeError as exc:
        ctx.fail(str(exc))
    if len(axes) != arr.size:
        ctx.fail(f"axes {arr.tolist()} repeat an axis")
    it = iter(x.shape)
    dims = [1 if i in axes else next(it) for i in range(rank)]
    return reshape_to(ctx, x, dims)


__all__ = ["constant", "constant_of_shape", "expand", "flatten", "range_", "reshape", "shape", "size", "squeeze",
           "unsqueeze"]

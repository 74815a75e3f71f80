"""ai.onnx normalizations and reductions: Softmax, LayerNormalization, RMSNormalization, Reduce*, ArgMax, TopK."""

from __future__ import annotations

from uaii.ir.shapes import ShapeError, normalize_axis

from .context import NodeContext
from .dispatch import AI_ONNX, Handler, onnx_op
from .values import Value


def _axis(ctx: NodeContext, axis: int, rank: int) -> int:
    try:
        return normalize_axis(axis, rank)
    except ShapeError as exc:
        ctx.fail(str(exc))


def _no_extra_outputs(ctx: NodeContext, what: str) -> None:
    if any(ctx.output_used(i) for i in range(1, ctx.n_outputs)):
        ctx.fail(f"the {what} outputs are not supported (inference graphs do not use them)")


@onnx_op(AI_ONNX, "Softmax", 13)
def softmax(ctx: NodeContext) -> Value:
    """Softmax"""
    x = ctx.input(0)
    return ctx.emit("Softmax", [x], {"axis": _axis(ctx, ctx.attr("axis", -1), x.rank)})


@onnx_op(AI_ONNX, "LayerNormalization", 17)
def layer_normalization(ctx: NodeContext) -> Value:
    """LayerNorm"""
    x = ctx.input(0)
    _no_extra_outputs(ctx, "Mean / InvStdDev")
    axis = _axis(ctx, ctx.attr("axis", -1), x.rank)
    return ctx.emit("LayerNorm", [x, ctx.input(1), ctx.optional(2)],
                    {"eps": float(ctx.attr("epsilon", 1e-5)), "axis": axis})


@onnx_op(AI_ONNX, "RMSNormalization", 23)
def rms_normalization(ctx: NodeContext) -> Value:
    """RMSNorm (last axis)"""
    x = ctx.input(0)
    axis = _axis(ctx, ctx.attr("axis", -1), x.rank)
    if axis != x.rank - 1:
        ctx.fail(f"axis {ctx.attr('axis')} normalizes several axes; only the last axis is supported")
    return ctx.emit("RMSNorm", [x, ctx.input(1)], {"eps": float(ctx.attr("epsilon", 1e-5))})


def _reduce(ir_op: str, axes_input: bool) -> Handler:
    def handler(ctx: NodeContext) -> Value:
        x = ctx.input(0)
        if axes_input:
            axes = None if ctx.optional(1) is None else ctx.need_const(1, "axes").reshape(-1).tolist()
        else:
            axes = ctx.attr("axes")
        if not axes:
            if ctx.attr("noop_with_empty_axes", 0):
                return x
            axes = list(range(x.rank))
        norm = tuple(sorted({_axis(ctx, int(a), x.rank) for a in axes}))
        return ctx.emit(ir_op, [x], {"axes": norm, "keepdims": bool(ctx.attr("keepdims", 1))})

    handler.__doc__ = ir_op
    return handler


onnx_op(AI_ONNX, "ReduceMean", 13)(_reduce("ReduceMean", False))
onnx_op(AI_ONNX, "ReduceMean", 18)(_reduce("ReduceMean", True))
onnx_op(AI_ONNX, "ReduceSum", 13)(_reduce("ReduceSum", True))
for _name in ("ReduceMax", "ReduceMin"):
    onnx_op(AI_ONNX, _name, 13)(_reduce(_name, False))
    onnx_op(AI_ONNX, _name, 18, 20)(_reduce(_name, True))


@onnx_op(AI_ONNX, "ArgMax", 13)
def argmax(ctx: NodeContext) -> Value:
    """ArgMax"""
    x = ctx.input(0)
    if ctx.attr("select_last_index", 0):
        ctx.fail("select_last_index=1 is not supported")
    return ctx.emit("ArgMax", [x], {"axis": _axis(ctx, ctx.attr("axis", 0), x.rank),
                                    "keepdims": bool(ctx.attr("keepdims", 1))})


@onnx_op(AI_ONNX, "TopK", 11, 24)
def topk(ctx: NodeContext) -> list[Value]:
    """TopK"""
    x = ctx.input(0)
    k = int(ctx.need_const(1, "K").reshape(-1)[0])
    if not ctx.attr("sorted", 1):
        ctx.warn("sorted=0: the values are returned sorted anyway")
    return ctx.emit_n("TopK", [x], {"k": k, "axis": _axis(ctx, ctx.attr("axis", -1), x.rank),
                                    "largest": bool(ctx.attr("largest", 1))}, outputs=2)


__all__ = ["argmax", "layer_normalization", "rms_normalization", "softmax", "topk"]

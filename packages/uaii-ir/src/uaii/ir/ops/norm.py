"""Normalizations: Softmax, LayerNorm and RMSNorm."""

from __future__ import annotations

from collections.abc import Sequence

from uaii.ir.dtype import FLOAT_TYPES
from uaii.ir.ops.opset import Op
from uaii.ir.ops.schema import Cost, InferCtx, OpKind, OpSchema, Param, bool_attr, float_attr, int_attr
from uaii.ir.shapes import Shape, fmt_shape, shapes_unify


def softmax_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    x = ctx.rank(0, 1)
    ctx.axis(int(ctx.attr("axis")), len(x))
    return [x]


SOFTMAX = OpSchema(
    Op.SOFTMAX, 1, "Y = exp(X - max(X)) / sum(exp(X - max(X))) along `axis`.",
    inputs=(Param("X", "T", "input"),), outputs=(Param("Y", "T", "same shape as X"),),
    attrs=(int_attr("axis", -1, "the normalized axis; negative counts from the end"),),
    types={"T": FLOAT_TYPES}, infer=softmax_shape, kind=OpKind.NORM, fusible=True, inplace=((0, 0),),
    cost=Cost.MEDIUM)


def _param_shape(ctx: InferCtx, i: int, want: Shape, what: str) -> None:
    """Input ``i`` (a norm weight or bias) must have shape ``want``."""
    got = ctx.shape(i)
    if not shapes_unify(got, want):
        ctx.fail(f"{what} has shape {fmt_shape(got)}; expected {fmt_shape(want)} (the normalized dims of X)")


def layernorm_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    x = ctx.rank(0, 1)
    axis = ctx.axis(int(ctx.attr("axis")), len(x))
    _param_shape(ctx, 1, x[axis:], "weight")
    if ctx.has(2):
        _param_shape(ctx, 2, x[axis:], "bias")
    return [x]


EPS_DOC = "added to the variance before the square root; >= 0"

LAYER_NORM = OpSchema(
    Op.LAYER_NORM, 1,
    "Y = (X - mean) / sqrt(var + eps) * weight + bias, mean and (biased) variance over the dims from `axis` "
    "to the last. weight and bias have the shape of those dims; their dtype may differ from X (f32 norm "
    "weights with f16 activations).",
    inputs=(Param("X", "T", "input"), Param("weight", "W", "scale, shape X.shape[axis:]"),
            Param("bias", "W", "shift, shape X.shape[axis:]", optional=True)),
    outputs=(Param("Y", "T", "same shape as X"),),
    attrs=(float_attr("eps", 1e-5, EPS_DOC, min=0.0),
           int_attr("axis", -1, "first normalized axis; negative counts from the end")),
    types={"T": FLOAT_TYPES, "W": FLOAT_TYPES}, infer=layernorm_shape, kind=OpKind.NORM, fusible=True,
    inplace=((0, 0),), cost=Cost.MEDIUM)


def rmsnorm_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    x = ctx.rank(0, 1)
    _param_shape(ctx, 1, x[-1:], "weight")
    return [x]


RMS_NORM = OpSchema(
    Op.RMS_NORM, 1,
    "Y = X / sqrt(mean(X^2) + eps) * w over the last dim, where w = weight, or (1 + weight) with "
    "add_unit_offset (gemma). Applied to [..., heads, head_dim] it normalizes each head (qwen3 q/k norms).",
    inputs=(Param("X", "T", "input [..., D]"), Param("weight", "W", "scale [D]")),
    outputs=(Param("Y", "T", "same shape as X"),),
    attrs=(float_attr("eps", 1e-6, EPS_DOC, min=0.0),
           bool_attr("add_unit_offset", False, "scale by (1 + weight) instead of weight (gemma)")),
    types={"T": FLOAT_TYPES, "W": FLOAT_TYPES}, infer=rmsnorm_shape, kind=OpKind.NORM, fusible=True,
    inplace=((0, 0),), cost=Cost.MEDIUM)

SCHEMAS = (SOFTMAX, LAYER_NORM, RMS_NORM)

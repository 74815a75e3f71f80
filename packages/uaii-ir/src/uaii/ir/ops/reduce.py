"""Reductions: TopK, ArgMax, ReduceMean/Sum/Max/Min, and the running sum CumSum."""

from __future__ import annotations

from collections.abc import Sequence

from uaii.ir.dtype import DType
from uaii.ir.ops.opset import Op
from uaii.ir.ops.schema import (
    FLOATS,
    NUMERIC,
    Cost,
    InferCtx,
    OpKind,
    OpSchema,
    Param,
    bool_attr,
    int_attr,
    ints_attr,
)
from uaii.ir.shapes import Shape

I64 = frozenset({DType.I64})


def topk_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    x = ctx.rank(0, 1)
    axis = ctx.axis(int(ctx.attr("axis")), len(x))
    k, dim = int(ctx.attr("k")), x[axis]
    if isinstance(dim, int) and k > dim:
        ctx.fail(f"k = {k} exceeds the size {dim} of axis {axis}")
    out = (*x[:axis], k, *x[axis + 1:])
    return [out, out][: ctx.n_outputs]


TOPK = OpSchema(
    Op.TOPK, 1,
    "The k largest (or smallest) values along `axis`, sorted, with their indices; ties keep the lower index.",
    inputs=(Param("X", "T", "input"),),
    outputs=(Param("values", "T", "X's shape with k on axis"), Param("indices", I64, "positions in X")),
    attrs=(int_attr("k", None, "how many; >= 1", required=True, min=1),
           int_attr("axis", -1, "the searched axis"), bool_attr("largest", True, "largest (else smallest)")),
    types={"T": NUMERIC}, infer=topk_shape, kind=OpKind.REDUCE, cost=Cost.MEDIUM)


def argmax_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    x = ctx.rank(0, 1)
    axis = ctx.axis(int(ctx.attr("axis")), len(x))
    return [(*x[:axis], 1, *x[axis + 1:]) if ctx.attr("keepdims") else (*x[:axis], *x[axis + 1:])]


ARGMAX = OpSchema(
    Op.ARGMAX, 1, "Index of the largest value along `axis` (the first on ties), i64.",
    inputs=(Param("X", "T", "input"),), outputs=(Param("Y", I64, "indices"),),
    attrs=(int_attr("axis", -1, "the reduced axis (default last, unlike ONNX)"),
           bool_attr("keepdims", True, "keep the reduced axis with size 1")),
    types={"T": NUMERIC}, infer=argmax_shape, kind=OpKind.REDUCE, cost=Cost.MEDIUM)


def reduced_axes(ctx: InferCtx, rank: int) -> tuple[int, ...]:
    """The normalized ``axes`` of a reduction; absent or empty means every axis, as in ONNX."""
    axes = ctx.attr("axes") or tuple(range(rank))
    out = tuple(ctx.axis(int(a), rank, "axes entry") for a in axes)
    if len(set(out)) != len(out):
        ctx.fail(f"axes {list(axes)} name an axis twice", "attr-range")
    return out


def reduce_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    x = ctx.shape(0)
    axes = reduced_axes(ctx, len(x))
    if ctx.attr("keepdims"):
        return [tuple(1 if i in axes else d for i, d in enumerate(x))]
    return [tuple(d for i, d in enumerate(x) if i not in axes)]


REDUCE_MEAN = OpSchema(
    Op.REDUCE_MEAN, 1,
    "Mean of X over `axes` (ONNX ReduceMean with `axes` as an attribute): without `axes`, or with an empty "
    "list, over every axis. Floats only: an integer mean would need a rounding rule no model asks for.",
    inputs=(Param("X", "T", "input"),), outputs=(Param("Y", "T", "X with the reduced axes of size 1 or removed"),),
    attrs=(ints_attr("axes", None, "the reduced axes, negative from the end, each at most once; default all"),
           bool_attr("keepdims", True, "keep the reduced axes with size 1 (an int 0/1 is accepted)")),
    types={"T": FLOATS}, infer=reduce_shape, kind=OpKind.REDUCE, cost=Cost.MEDIUM)



def _reduce(op: str, doc: str, types: frozenset[DType]) -> OpSchema:
    return OpSchema(
        op, 1, f"{doc} over `axes` (ONNX {op} with `axes` as an attribute, as ReduceMean): without `axes`, or with "
        "an empty list, over every axis.",
        inputs=(Param("X", "T", "input"),), outputs=(Param("Y", "T", "X with the reduced axes of size 1 or removed"),),
        attrs=(ints_attr("axes", None, "the reduced axes, negative from the end, each at most once; default all"),
               bool_attr("keepdims", True, "keep the reduced axes with size 1 (an int 0/1 is accepted)")),
        types={"T": types}, infer=reduce_shape, kind=OpKind.REDUCE, cost=Cost.MEDIUM)


REDUCE_SUM = _reduce(Op.REDUCE_SUM, "Sum of X (floats summed in double precision, rounded once; integers wrap; "
                     "an empty reduction gives 0)", NUMERIC)
REDUCE_MAX = _reduce(Op.REDUCE_MAX, "Largest value of X (NaN if any reduced value is NaN; an empty reduction gives "
                     "-inf, or the type's minimum for integers)", NUMERIC)
REDUCE_MIN = _reduce(Op.REDUCE_MIN, "Smallest value of X (NaN if any reduced value is NaN; an empty reduction gives "
                     "+inf, or the type's maximum for integers)", NUMERIC)


def cumsum_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    x = ctx.rank(0, 1)
    ctx.axis(int(ctx.attr("axis")), len(x))
    return [x]


CUMSUM = OpSchema(
    Op.CUMSUM, 1,
    "Running sum of X along `axis` (ONNX CumSum, axis as an attribute): Y[i] = X[0] + ... + X[i]; `exclusive` "
    "leaves X[i] out (Y[0] = 0), `reverse` sums from the end. Floats accumulate in double precision and round "
    "each result once; integers wrap. Position ids from attention masks are its main use.",
    inputs=(Param("X", "T", "input, rank >= 1"),), outputs=(Param("Y", "T", "same shape as X"),),
    attrs=(int_attr("axis", None, "the summed axis; negative counts from the end", required=True),
           bool_attr("exclusive", False, "leave each element out of its own sum"),
           bool_attr("reverse", False, "sum from the last element toward the first")),
    types={"T": NUMERIC}, infer=cumsum_shape, kind=OpKind.REDUCE, cost=Cost.MEDIUM)

SCHEMAS = (TOPK, ARGMAX, REDUCE_MEAN, REDUCE_SUM, REDUCE_MAX, REDUCE_MIN, CUMSUM)

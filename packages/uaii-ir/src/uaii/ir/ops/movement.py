"""Movement ops: Identity, Reshape, Transpose, Concat, Split, Slice: shape and layout, never values."""

from __future__ import annotations

from collections.abc import Sequence

from uaii.ir.dtype import PLAIN_TYPES, Dim
from uaii.ir.ops.access import WeightAccess
from uaii.ir.ops.elementwise import same_shape
from uaii.ir.ops.opset import Op
from uaii.ir.ops.schema import (
    ANY_TYPE,
    INDEX_TYPES,
    Cost,
    InferCtx,
    OpKind,
    OpSchema,
    Param,
    int_attr,
    ints_attr,
)
from uaii.ir.shapes import Shape, ShapeError, dim_add, dim_div, fmt_shape, reshape_shape, unify

WHOLE = {0: WeightAccess.WHOLE}
"""A moved weight (a packed one included) is read whole: the backend holds it for the step."""

IDENTITY = OpSchema(
    Op.IDENTITY, 1, "Y = X (any dtype, block-quantized included).",
    inputs=(Param("X", "T", "input"),), outputs=(Param("Y", "T", "X"),), types={"T": ANY_TYPE},
    infer=same_shape, kind=OpKind.MOVEMENT, inplace=((0, 0),), cost=Cost.FREE, weight_access=WHOLE)


def reshape_out(ctx: InferCtx) -> Sequence[Shape | None]:
    x, target = ctx.shape(0), ctx.attr("shape")
    if ctx.has(1):
        if target is not None:
            ctx.fail("the target shape comes from the attribute 'shape' or from input #1, not both", "arity")
        s = ctx.rank(1, 1, 1)
        const = ctx.const(1)
        if const is not None:
            target = tuple(int(v) for v in const.reshape(-1))
        elif isinstance(s[0], int):
            return [tuple(ctx.fresh("reshape") for _ in range(s[0]))]
        else:
            return [None]
    if target is None:
        ctx.fail("Reshape needs a target shape: the attribute 'shape' or input #1", "attr-missing")
    return [reshape_shape(x, target)]


RESHAPE = OpSchema(
    Op.RESHAPE, 1,
    "Y = X with a new shape and the same elements in the same order. The target comes from the attribute "
    "`shape` or from input #1 (a 1-D i64/i32 tensor), not both. In the target, 0 copies the input dim at the "
    "same position and -1 (at most one) is inferred from the element count.",
    inputs=(Param("X", "T", "input"), Param("shape", "S", "target shape, 1-D", optional=True)),
    outputs=(Param("Y", "T", "reshaped X"),),
    attrs=(ints_attr("shape", None, "target shape; 0 = copy, -1 = infer", min=-1),),
    types={"T": ANY_TYPE, "S": INDEX_TYPES}, infer=reshape_out, kind=OpKind.MOVEMENT, inplace=((0, 0),),
    cost=Cost.FREE, weight_access=WHOLE, value_inputs=(1,))


def transpose_out(ctx: InferCtx) -> Sequence[Shape | None]:
    x = ctx.shape(0)
    perm = ctx.attr("perm")
    perm = tuple(range(len(x)))[::-1] if perm is None else perm
    if sorted(perm) != list(range(len(x))):
        ctx.fail(f"perm {list(perm)} is not a permutation of the {len(x)} axes of X", "attr-range")
    return [tuple(x[p] for p in perm)]


TRANSPOSE = OpSchema(
    Op.TRANSPOSE, 1, "Y = X with axes permuted: Y.shape[i] = X.shape[perm[i]]. Without perm, axes reverse.",
    inputs=(Param("X", "T", "input (plain dtype)"),), outputs=(Param("Y", "T", "permuted X"),),
    attrs=(ints_attr("perm", None, "axis permutation; default reverses", min=0),),
    types={"T": PLAIN_TYPES}, infer=transpose_out, kind=OpKind.MOVEMENT, cost=Cost.LOW)


def concat_out(ctx: InferCtx) -> Sequence[Shape | None]:
    shapes = [ctx.shape(i) for i in range(len(ctx.inputs))]
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        ctx.fail(f"inputs have different ranks: {', '.join(fmt_shape(s) for s in shapes)}")
    axis = ctx.axis(int(ctx.attr("axis")), rank)
    out = list(shapes[0])
    for i, s in enumerate(shapes[1:], 1):
        for d in range(rank):
            if d == axis:
                out[d] = dim_add(out[d], s[d])
                continue
            try:
                out[d] = unify(out[d], s[d])
            except ShapeError:
                ctx.fail(f"input #{i} {fmt_shape(s)} differs from {fmt_shape(shapes[0])} on axis {d}, which "
                         f"is not the concatenation axis {axis}")
    return [tuple(out)]


CONCAT = OpSchema(
    Op.CONCAT, 1,
    "Y = the inputs joined along `axis`; every other dim must match. Block-quantized inputs concatenate "
    "along an outer axis (fused QKV or gate|up weights).",
    inputs=(Param("inputs", "T", "one or more tensors of one rank", variadic=True),),
    outputs=(Param("Y", "T", "sum of the sizes along axis"),),
    attrs=(int_attr("axis", None, "the joined axis; negative counts from the end", required=True),),
    types={"T": ANY_TYPE}, infer=concat_out, kind=OpKind.MOVEMENT, cost=Cost.LOW, weight_access=WHOLE)


def split_out(ctx: InferCtx) -> Sequence[Shape | None]:
    x = ctx.rank(0, 1)
    axis = ctx.axis(int(ctx.attr("axis")), len(x))
    n, sizes = ctx.n_outputs, ctx.attr("split")
    dim = x[axis]
    if sizes is None:
        try:
            part: Dim = dim_div(dim, n)
        except ShapeError:
            ctx.fail(f"axis {axis} of size {dim} does not split evenly into {n} outputs")
        sizes = (part,) * n
    elif len(sizes) != n:
        ctx.fail(f"split has {len(sizes)} sizes for {n} outputs", "attr-range")
    elif isinstance(dim, int) and sum(sizes) != dim:
        ctx.fail(f"split sizes {list(sizes)} add up to {sum(sizes)}, not to the size {dim} of axis {axis}")
    return [(*x[:axis], s, *x[axis + 1:]) for s in sizes]


SPLIT = OpSchema(
    Op.SPLIT, 1,
    "Splits X along `axis` into as many outputs as the node has: sizes from `split`, or equal parts.",
    inputs=(Param("X", "T", "input"),),
    outputs=(Param("outputs", "T", "one or more parts", variadic=True),),
    attrs=(int_attr("axis", 0, "the split axis; negative counts from the end"),
           ints_attr("split", None, "size of each output; default equal parts", min=0)),
    types={"T": ANY_TYPE}, infer=split_out, kind=OpKind.MOVEMENT, cost=Cost.LOW, weight_access=WHOLE)


def _slice_dim(ctx: InferCtx, dim: Dim, start: int, end: int, step: int) -> Dim:
    if isinstance(dim, int):
        return len(range(*slice(start, end, step).indices(dim)))
    if start == 0 and step == 1 and end >= (1 << 31):
        return dim
    return ctx.fresh("slice")


def slice_out(ctx: InferCtx) -> Sequence[Shape | None]:
    x = ctx.shape(0)
    starts, ends = ctx.attr("starts"), ctx.attr("ends")
    axes = ctx.attr("axes") or tuple(range(len(starts)))
    steps = ctx.attr("steps") or (1,) * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        ctx.fail("starts, ends, axes and steps must have one entry per sliced axis", "attr-range")
    if 0 in steps:
        ctx.fail("steps must not be 0", "attr-range")
    norm = [ctx.axis(a, len(x), "axes entry") for a in axes]
    if len(set(norm)) != len(norm):
        ctx.fail(f"axes {list(axes)} repeat an axis", "attr-range")
    out = list(x)
    for a, s, e, st in zip(norm, starts, ends, steps, strict=True):
        out[a] = _slice_dim(ctx, x[a], s, e, st)
    return [tuple(out)]


SLICE = OpSchema(
    Op.SLICE, 1,
    "Y = X[starts:ends:steps] on the listed axes (Python slice semantics: negative indices count from the "
    "end, out-of-range bounds clamp; an end >= 2^31 means 'to the end').",
    inputs=(Param("X", "T", "input"),), outputs=(Param("Y", "T", "the slice"),),
    attrs=(ints_attr("starts", None, "first index per axis", required=True),
           ints_attr("ends", None, "end index (exclusive) per axis", required=True),
           ints_attr("axes", None, "sliced axes; default 0..len(starts)-1"),
           ints_attr("steps", None, "stride per axis, non-zero; default 1")),
    types={"T": ANY_TYPE}, infer=slice_out, kind=OpKind.MOVEMENT, cost=Cost.LOW, weight_access=WHOLE)

SCHEMAS = (IDENTITY, RESHAPE, TRANSPOSE, CONCAT, SPLIT, SLICE)

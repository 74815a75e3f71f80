"""Fused ops that the planner's passes produce: GroupedMatMul and AddRMSNorm.

Loaders never emit them; the fusion passes of uaii-planner rewrite plain graphs into them (see docs/planner.md).
They are registered with the built-ins so that a fused graph validates like any other, but they are not members
of :class:`~uaii.ir.ops.opset.Op`: the built-in op set stays what loaders and files may contain.
"""

from __future__ import annotations

from collections.abc import Sequence

from uaii.ir.dtype import FLOAT_TYPES
from uaii.ir.ops.access import WeightAccess
from uaii.ir.ops.linalg import matmul_shape
from uaii.ir.ops.norm import EPS_DOC, rmsnorm_shape
from uaii.ir.ops.schema import (
    FLOATS,
    WEIGHT_TYPES,
    Cost,
    InferCtx,
    InferError,
    OpKind,
    OpSchema,
    Param,
    bool_attr,
    float_attr,
)
from uaii.ir.shapes import Shape, ShapeError, broadcast_shapes, fmt_shape

GROUPED_MATMUL_OP = "GroupedMatMul"
ADD_RMS_NORM_OP = "AddRMSNorm"


def grouped_matmul_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    """One MatMul shape per weight; the i-th output belongs to the i-th weight."""
    n_weights = len(ctx.inputs) - 1
    if ctx.n_outputs != n_weights:
        ctx.fail(f"has {n_weights} weights but {ctx.n_outputs} outputs; each weight needs one output", "arity")
    out: list[Shape | None] = []
    for i in range(1, len(ctx.inputs)):
        sub = InferCtx(ctx.node, ctx.schema, (ctx.inputs[0], ctx.inputs[i]), ctx.attrs)
        try:
            out.extend(matmul_shape(sub))
        except InferError as exc:
            ctx.fail(f"weight #{i - 1}: {exc.detail}", exc.code)
        except ShapeError as exc:
            ctx.fail(f"weight #{i - 1}: {str(exc).removeprefix('[shape] ')}")
    return out


GROUPED_MATMUL = OpSchema(
    GROUPED_MATMUL_OP, 1,
    "Y_i = A @ B_i (A @ B_i^T with transpose_b) for every weight B_i: several MatMuls that share one input, run "
    "as one grouped GEMM/GEMV so the input is read (and quantized, for block-quantized weights) once and the "
    "threads split the rows of all weights together. The weights stay separate weight references, all of one "
    "dtype; output i has the shape MatMul(A, B_i) would have. Produced by the planner (Q/K/V, gate/up).",
    inputs=(Param("A", "T", "activations [..., M, K]"),
            Param("B", "W", "weights [..., N_i, K] (transpose_b) or [..., K, N_i]; one dtype", variadic=True,
                  min_count=2)),
    outputs=(Param("Y", "T", "one output [..., M, N_i] per weight, in weight order", variadic=True,
                   min_count=2),),
    attrs=(bool_attr("transpose_b", False, "every B_i is stored [..., N_i, K]"),),
    types={"T": FLOATS, "W": WEIGHT_TYPES}, infer=grouped_matmul_shape, kind=OpKind.LINALG, cost=Cost.HIGH,
    weight_access={1: WeightAccess.WHOLE})
# The weights are read whole and together: one pass over the input for all of them is what the fusion is for, so a
# step holds every B_i at once (the planner sizes staging for their sum).


def add_rmsnorm_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    a, b = ctx.rank(0, 1), ctx.rank(1, 1)
    try:
        total = broadcast_shapes(a, b)
    except ShapeError:
        ctx.fail(f"A {fmt_shape(a)} and B {fmt_shape(b)} do not broadcast")
    sub = InferCtx(ctx.node, ctx.schema, (ctx.type(0)._replace(shape=total), ctx.inputs[2]), ctx.attrs)
    rmsnorm_shape(sub)
    return [total, total]


ADD_RMS_NORM = OpSchema(
    ADD_RMS_NORM_OP, 1,
    "sum = A + B (NumPy broadcasting); Y = RMSNorm(sum) over the last dim, as RMSNorm with the same eps and "
    "add_unit_offset. The residual add and the next norm in one pass: sum continues the residual stream, Y "
    "feeds the next block. Produced by the planner.",
    inputs=(Param("A", "T", "residual stream [..., D]"), Param("B", "T", "the block's output, [..., D]"),
            Param("weight", "W", "scale [D]")),
    outputs=(Param("Y", "T", "RMSNorm(A + B)"),
             Param("sum", "T", "A + B; omit when only the normalized value is used", optional=True)),
    attrs=(float_attr("eps", 1e-6, EPS_DOC, min=0.0),
           bool_attr("add_unit_offset", False, "scale by (1 + weight) instead of weight (gemma)")),
    types={"T": FLOAT_TYPES, "W": FLOAT_TYPES}, infer=add_rmsnorm_shape, kind=OpKind.NORM,
    inplace=((0, 1), (1, 1)), cost=Cost.MEDIUM)

SCHEMAS = (GROUPED_MATMUL, ADD_RMS_NORM)
FUSED_OPS = frozenset(s.op for s in SCHEMAS)

__all__ = ["ADD_RMS_NORM", "ADD_RMS_NORM_OP", "FUSED_OPS", "GROUPED_MATMUL", "GROUPED_MATMUL_OP", "SCHEMAS",
           "add_rmsnorm_shape", "grouped_matmul_shape"]

"""Matrix products: MatMul (with a possibly block-quantized weight), the fused MatMulRelu, and Gemm."""

from __future__ import annotations

from collections.abc import Sequence

from uaii.ir.dtype import Dim
from uaii.ir.ops.access import AccessIf, WeightAccess
from uaii.ir.ops.opset import Op
from uaii.ir.ops.schema import (
    FLOATS,
    WEIGHT_TYPES,
    Cost,
    InferCtx,
    OpKind,
    OpSchema,
    Param,
    bool_attr,
    float_attr,
)
from uaii.ir.shapes import Shape, ShapeError, broadcast_shapes, fmt_shape, unify


def _inner(ctx: InferCtx, k_a: Dim, k_b: Dim, detail: str) -> None:
    try:
        unify(k_a, k_b)
    except ShapeError:
        ctx.fail(f"inner dimensions differ: {detail}")


def matmul_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    a, b = ctx.rank(0, 1), ctx.rank(1, 2)
    tb = bool(ctx.attr("transpose_b"))
    k_b, n = (b[-1], b[-2]) if tb else (b[-2], b[-1])
    _inner(ctx, a[-1], k_b, f"A {fmt_shape(a)} has K={a[-1]}, B {fmt_shape(b)} (transpose_b={tb}) "
                            f"has K={k_b}")
    batch = broadcast_shapes(a[:-2], b[:-2])
    return [(*batch, n)] if len(a) == 1 else [(*batch, a[-2], n)]


_MATMUL_DOC = (
    "Y = A @ B (A @ B^T with transpose_b), NumPy matmul semantics: A [..., M, K] (or [K]), B [..., K, N] "
    "(or [..., N, K] with transpose_b); batch dims broadcast. B is usually a weight and may be "
    "block-quantized (any GGUF block type, kept packed); its blocks run along its innermost dim, so a "
    "quantized B is normally stored [N, K] with transpose_b=true (the GGUF layout).")


B_ROW_CHUNKS = AccessIf("transpose_b", True, WeightAccess.ROW_CHUNKS)
"""B stored [N, K] holds one output feature per row, so it can stream in chunks of rows; stored [K, N] it cannot."""


def _matmul(op: str, extra: str, fusible: bool) -> OpSchema:
    return OpSchema(
        op, 1, _MATMUL_DOC + extra,
        inputs=(Param("A", "T", "activations [..., M, K]"),
                Param("B", "W", "weight [..., K, N] or [..., N, K]")),
        outputs=(Param("Y", "T", "[..., M, N]"),),
        attrs=(bool_attr("transpose_b", False, "B is stored [..., N, K]"),),
        types={"T": FLOATS, "W": WEIGHT_TYPES}, infer=matmul_shape, kind=OpKind.LINALG, fusible=fusible,
        cost=Cost.HIGH, weight_access={1: B_ROW_CHUNKS})


MATMUL = _matmul(Op.MATMUL, "", True)
MATMUL_RELU = _matmul(Op.MATMUL_RELU, " Then Y = max(Y, 0) (the C++ runtime's fused form).", False)


def gemm_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    a, b = ctx.rank(0, 2, 2), ctx.rank(1, 2, 2)
    ta, tb = bool(ctx.attr("transA")), bool(ctx.attr("transB"))
    m, k_a = (a[1], a[0]) if ta else (a[0], a[1])
    k_b, n = (b[1], b[0]) if tb else (b[0], b[1])
    _inner(ctx, k_a, k_b, f"A {fmt_shape(a)} (transA={ta}) has K={k_a}, B {fmt_shape(b)} (transB={tb}) "
                          f"has K={k_b}")
    if ctx.has(2):
        c = ctx.rank(2, 0, 2)
        try:
            broadcast_shapes((m, n), c)
        except ShapeError:
            ctx.fail(f"C {fmt_shape(c)} does not broadcast to [M, N] = {fmt_shape((m, n))}")
    return [(m, n)]


GEMM = OpSchema(
    Op.GEMM, 1,
    "Y = alpha * op(A) @ op(B) + beta * C, op(X) = X^T when its trans flag is set (ONNX Gemm). A and B are "
    "2-D; C is optional and broadcasts to [M, N]. B may be block-quantized as for MatMul.",
    inputs=(Param("A", "T", "[M, K] or [K, M]"), Param("B", "W", "[K, N] or [N, K]"),
            Param("C", "T", "bias, broadcastable to [M, N]", optional=True)),
    outputs=(Param("Y", "T", "[M, N]"),),
    attrs=(float_attr("alpha", 1.0, "scale of the product"), float_attr("beta", 1.0, "scale of C"),
           bool_attr("transA", False, "A is stored [K, M]"),
           bool_attr("transB", False, "B is stored [N, K]")),
    types={"T": FLOATS, "W": WEIGHT_TYPES}, infer=gemm_shape, kind=OpKind.LINALG, fusible=True,
    cost=Cost.HIGH, weight_access={1: WeightAccess.WHOLE})
# B is read whole: alpha, beta and C apply to the whole product, and no backend streams a Gemm by rows yet (an ONNX
# linear layer that should stream is a MatMul with transpose_b).

SCHEMAS = (MATMUL, MATMUL_RELU, GEMM)

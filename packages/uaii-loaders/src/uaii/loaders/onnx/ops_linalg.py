"""ai.onnx MatMul and Gemm -> IR MatMul (+ Add / Mul for Gemm's bias and scales).

A weight B stays a weight reference. ONNX stores B as [K, N]; the IR's MatMul streams B by rows when it is
[N, K] with ``transpose_b``, which is what a Transpose of a stored [N, K] initializer (TorchScript's pattern) or
Gemm's ``transB=1`` give — those become ``transpose_b`` instead of an IR Transpose. A [K, N] weight is used as
stored (never copied or transposed at load).
"""

from __future__ import annotations

from .context import NodeContext
from .dispatch import AI_ONNX, onnx_op
from .values import Value


def _matmul(ctx: NodeContext, a: Value, b: Value) -> Value:
    if a.rank < 1 or b.rank < 1:
        ctx.fail("MatMul of scalars is not defined")
    if b.transposed is not None:
        return ctx.emit("MatMul", [a, b.transposed], {"transpose_b": True})
    squeeze_a = a.rank == 1
    squeeze_b = b.rank == 1
    if squeeze_a:
        a = ctx.emit("Reshape", [a], {"shape": (1, -1)}, shape=(1, a.shape[0]))
    if squeeze_b:
        b = ctx.emit("Reshape", [b], {"shape": (-1, 1)}, shape=(b.shape[0], 1))
    y = ctx.emit("MatMul", [a, b])
    if squeeze_a or squeeze_b:
        dims = list(y.shape)
        if squeeze_b:
            dims.pop(-1)
        if squeeze_a:
            dims.pop(-1 if squeeze_b else -2)
        from .fold import reshape_to

        y = reshape_to(ctx, y, dims)
    return y


@onnx_op(AI_ONNX, "MatMul", 13)
def matmul(ctx: NodeContext) -> Value:
    """MatMul (transpose_b for a transposed weight)"""
    a, b = ctx.input(0), ctx.input(1)
    if not a.dtype.is_float:
        ctx.fail(f"only float MatMul is supported, found {a.dtype.value}")
    return _matmul(ctx, a, b)


@onnx_op(AI_ONNX, "Gemm", 13)
def gemm(ctx: NodeContext) -> Value:
    """MatMul (transpose_b for transB) + Mul (alpha, beta) + Add (C)"""
    a, b, c = ctx.input(0), ctx.input(1), ctx.optional(2)
    if a.rank != 2 or b.rank != 2:
        ctx.fail(f"A and B must be 2-D, found ranks {a.rank} and {b.rank}")
    if ctx.attr("transA", 0):
        a = ctx.emit("Transpose", [a], {"perm": (1, 0)})
    if ctx.attr("transB", 0):
        b = b.transposed if b.transposed is not None else (
            Value("", b.dtype, (b.shape[1], b.shape[0]), transposed=b) if b.weight else
            ctx.emit("Transpose", [b], {"perm": (1, 0)}))
    y = _matmul(ctx, a, b)
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    if alpha != 1.0:
        y = ctx.emit("Mul", [y, Value.scalar(alpha, y.dtype)])
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = ctx.emit("Mul", [c, Value.scalar(beta, c.dtype)])
        y = ctx.emit("Add", [y, c])
    return y


__all__ = ["gemm", "matmul"]

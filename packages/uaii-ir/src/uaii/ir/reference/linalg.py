"""Matrix-product references: MatMul, MatMulRelu and Gemm, in float64, rounded to A's dtype.

B is usually a weight; a block-quantized B reaches the reference dequantized (float32), so B's dtype may
differ from A's. The result always has A's (activation) dtype.
"""

from __future__ import annotations

import numpy as np

from uaii.ir.reference._common import Array, RefFn, f64, fail, float_out


def _product(op: str, a: Array, b: Array, transpose_b: bool) -> Array:
    if b.ndim < 2:
        fail(op, f"B must have at least 2 dims, found shape {list(b.shape)}")
    bf = np.swapaxes(f64(b), -1, -2) if transpose_b else f64(b)
    if a.shape[-1] != bf.shape[-2]:
        fail(op, f"A {list(a.shape)} has K={a.shape[-1]} but B {list(b.shape)} (transpose_b={transpose_b}) "
                 f"has K={bf.shape[-2]}")
    return np.matmul(f64(a), bf)


def matmul(a: Array, b: Array, *, transpose_b: bool = False) -> Array:
    """Y = A @ B, or A @ B^T (swap of B's last two axes) with transpose_b; NumPy matmul broadcasting."""
    return float_out(_product("MatMul", a, b, transpose_b), a)


def matmul_relu(a: Array, b: Array, *, transpose_b: bool = False) -> Array:
    """Y = max(A @ B, 0), B transposed as for MatMul."""
    return float_out(np.maximum(_product("MatMulRelu", a, b, transpose_b), 0.0), a)


def gemm(a: Array, b: Array, c: Array | None = None, *, alpha: float = 1.0, beta: float = 1.0,
         transA: bool = False, transB: bool = False) -> Array:
    """Y = alpha * op(A) @ op(B) + beta * C, op(X) = X^T when its flag is set; C broadcasts to [M, N]."""
    if a.ndim != 2 or b.ndim != 2:
        fail("Gemm", f"A and B must be 2-D, found {list(a.shape)} and {list(b.shape)}")
    af = f64(a).T if transA else f64(a)
    bf = f64(b).T if transB else f64(b)
    if af.shape[1] != bf.shape[0]:
        fail("Gemm", f"op(A) {list(af.shape)} and op(B) {list(bf.shape)} differ in K")
    y = alpha * (af @ bf)
    if c is not None:
        y = y + beta * f64(c)
        if y.shape != (af.shape[0], bf.shape[1]):
            fail("Gemm", f"C {list(c.shape)} does not broadcast to [M, N] = {[af.shape[0], bf.shape[1]]}")
    return float_out(y, a)


REFS: dict[str, RefFn] = {"MatMul": matmul, "MatMulRelu": matmul_relu, "Gemm": gemm}

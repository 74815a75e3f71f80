"""References of the fused ops the planner produces (mirrors uaii.ir.ops.fused): each is defined as the plain
ops it replaces, so a fused graph evaluates exactly like the graph it came from."""

from __future__ import annotations

from uaii.ir.reference._common import Array, RefFn
from uaii.ir.reference.elementwise import add
from uaii.ir.reference.linalg import matmul
from uaii.ir.reference.norm import rms_norm


def grouped_matmul(a: Array, *weights: Array, transpose_b: bool = False) -> tuple[Array, ...]:
    """Y_i = MatMul(A, B_i) for each weight B_i, in weight order."""
    return tuple(matmul(a, b, transpose_b=transpose_b) for b in weights)


def add_rms_norm(a: Array, b: Array, weight: Array, *, eps: float = 1e-6,
                 add_unit_offset: bool = False) -> tuple[Array, Array]:
    """sum = Add(A, B), rounded to A's dtype as the unfused Add would; Y = RMSNorm(sum). Returns (Y, sum)."""
    total = add(a, b)
    return rms_norm(total, weight, eps=eps, add_unit_offset=add_unit_offset), total


REFS: dict[str, RefFn] = {"GroupedMatMul": grouped_matmul, "AddRMSNorm": add_rms_norm}

"""REFERENCE_OPS: (op, version) → NumPy reference function, one family module per op family of uaii.ir.ops."""

from __future__ import annotations

import inspect
from functools import cache

from uaii.ir.reference import (
    attention,
    elementwise,
    fused,
    index,
    linalg,
    logic,
    moe,
    movement,
    nbits,
    norm,
    quantized,
    reduce,
    shape_ops,
)
from uaii.ir.reference._common import EvaluationError, RefFn

REFERENCE_OPS: dict[tuple[str, int], RefFn] = {
    (op, 1): fn
    for family in (elementwise, linalg, norm, reduce, movement, index, attention, moe, fused, logic, shape_ops, nbits,
                   quantized)
    for op, fn in family.REFS.items()
}
"""Every built-in op and fused op, at version 1. A reference takes the node's inputs positionally (None where
an optional input is omitted), the resolved attributes (defaults filled in) as keywords, and ``num_outputs``
when it declares that keyword; it returns one array or a tuple with one array per output slot."""


def register_reference(op: str, fn: RefFn, version: int = 1, *, replace: bool = False) -> RefFn:
    """Add the reference of a plugin op (or replace one with ``replace``). Returns ``fn``."""
    key = (str(op), version)
    if key in REFERENCE_OPS and REFERENCE_OPS[key] is not fn and not replace:
        raise EvaluationError(f"[reference] {op} version {version} already has a reference")
    REFERENCE_OPS[key] = fn
    return fn


@cache
def wants_output_count(fn: RefFn) -> bool:
    """Does ``fn`` take the node's output count (Split with equal parts)?"""
    try:
        return "num_outputs" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False

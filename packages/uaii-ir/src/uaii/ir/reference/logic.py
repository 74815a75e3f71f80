"""Logic references: comparisons (-> bool), Not/And/Or/Xor, Where and Trilu. Selections keep their values' bits."""

from __future__ import annotations

import numpy as np

from uaii.ir.reference._common import Array, RefFn, fail, order_key, same_dtype


def _bool(op: str, *xs: Array) -> None:
    for x in xs:
        if x.dtype != np.bool_:
            fail(op, f"expected bool operands, found {x.dtype}")


def not_(x: Array) -> Array:
    """Y = not X."""
    _bool("Not", x)
    return np.logical_not(x)


def _compare(op: str, a: Array, b: Array, fn: RefFn) -> Array:
    same_dtype(op, a, b)
    with np.errstate(invalid="ignore"):
        return np.asarray(fn(order_key(a), order_key(b)), dtype=np.bool_)


def equal(a: Array, b: Array) -> Array:
    """C = (A == B); NaN equals nothing."""
    return _compare("Equal", a, b, np.equal)


def less(a: Array, b: Array) -> Array:
    """C = (A < B)."""
    return _compare("Less", a, b, np.less)


def greater(a: Array, b: Array) -> Array:
    """C = (A > B)."""
    return _compare("Greater", a, b, np.greater)


def less_or_equal(a: Array, b: Array) -> Array:
    """C = (A <= B)."""
    return _compare("LessOrEqual", a, b, np.less_equal)


def greater_or_equal(a: Array, b: Array) -> Array:
    """C = (A >= B)."""
    return _compare("GreaterOrEqual", a, b, np.greater_equal)


def _logic(op: str, a: Array, b: Array, fn: RefFn) -> Array:
    _bool(op, a, b)
    return np.asarray(fn(a, b), dtype=np.bool_)


def and_(a: Array, b: Array) -> Array:
    """C = A and B."""
    return _logic("And", a, b, np.logical_and)


def or_(a: Array, b: Array) -> Array:
    """C = A or B."""
    return _logic("Or", a, b, np.logical_or)


def xor(a: Array, b: Array) -> Array:
    """C = A xor B."""
    return _logic("Xor", a, b, np.logical_xor)


def where(condition: Array, x: Array, y: Array) -> Array:
    """output = X where condition else Y, the three broadcast together."""
    _bool("Where", condition)
    same_dtype("Where", x, y, "XY")
    return np.where(condition, x, y).astype(x.dtype, copy=False)


def trilu(x: Array, *, upper: bool = True, k: int = 0) -> Array:
    """Y = X with the elements of column - row >= k (upper) or <= k (lower) of the last two axes kept, the rest 0."""
    if x.ndim < 2:
        return fail("Trilu", f"X must have rank >= 2, found shape {list(x.shape)}")
    return np.triu(x, k) if upper else np.tril(x, k)


REFS: dict[str, RefFn] = {
    "Not": not_, "Equal": equal, "Less": less, "Greater": greater, "LessOrEqual": less_or_equal,
    "GreaterOrEqual": greater_or_equal, "And": and_, "Or": or_, "Xor": xor, "Where": where, "Trilu": trilu,
}

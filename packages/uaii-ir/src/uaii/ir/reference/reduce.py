"""Reduction references: TopK, ArgMax, ReduceMean/Sum/Max/Min and the running sum CumSum. Values keep their dtype;
indices are int64; means and float sums are taken in float64 and rounded once to X's dtype."""

from __future__ import annotations

import math

import numpy as np

from uaii.ir.reference._common import Array, RefFn, f64, fail, float_out, is_floatlike, order_key, sorted_indices


def topk(x: Array, *, k: int, axis: int = -1, largest: bool = True) -> tuple[Array, Array]:
    """The k largest (smallest) values along ``axis``, sorted, and their indices; ties keep the lower index."""
    xm = np.moveaxis(x, axis, -1)
    if k > xm.shape[-1]:
        fail("TopK", f"k = {k} exceeds the size {xm.shape[-1]} of axis {axis}")
    idx = sorted_indices(xm, largest)[..., :k]
    vals = np.take_along_axis(xm, idx, axis=-1)
    return np.moveaxis(vals, -1, axis), np.moveaxis(idx.astype(np.int64), -1, axis)


def argmax(x: Array, *, axis: int = -1, keepdims: bool = True) -> Array:
    """Index of the largest value along ``axis``, the first one on ties (NumPy argmax), int64."""
    return np.argmax(order_key(x), axis=axis, keepdims=keepdims).astype(np.int64)


def _axes(op: str, axes: tuple[int, ...] | None, rank: int) -> tuple[int, ...]:
    """The reduced axes, non-negative; none listed means every axis."""
    dims = tuple(range(rank)) if not axes else tuple(a + rank if a < 0 else a for a in axes)
    if any(not 0 <= a < rank for a in dims) or len(set(dims)) != len(dims):
        fail(op, f"axes {list(axes or ())} do not name distinct axes of a rank-{rank} input")
    return dims


def reduce_mean(x: Array, *, axes: tuple[int, ...] | None = None, keepdims: bool = True) -> Array:
    """Y = sum(X over ``axes``) / (their element count); no ``axes`` (or none listed) means every axis."""
    dims = _axes("ReduceMean", axes, x.ndim)
    count = math.prod(x.shape[a] for a in dims)
    with np.errstate(invalid="ignore"):  # an empty axis gives 0 / 0 = NaN, as in ONNX
        return float_out(np.sum(f64(x), axis=dims, keepdims=keepdims) / count, x)


def reduce_sum(x: Array, *, axes: tuple[int, ...] | None = None, keepdims: bool = True) -> Array:
    """Y = sum(X over ``axes``): floats in double precision rounded once, integers wrapping; empty gives 0."""
    dims = _axes("ReduceSum", axes, x.ndim)
    if is_floatlike(x):
        return float_out(np.sum(f64(x), axis=dims, keepdims=keepdims), x)
    return np.sum(x, axis=dims, keepdims=keepdims, dtype=x.dtype)


def _extreme(op: str, x: Array, axes: tuple[int, ...] | None, keepdims: bool, largest: bool) -> Array:
    dims = _axes(op, axes, x.ndim)
    fn = np.max if largest else np.min
    if is_floatlike(x):  # NaN propagates; an empty reduction gives -inf (max) or +inf (min)
        return float_out(fn(f64(x), axis=dims, keepdims=keepdims, initial=-np.inf if largest else np.inf), x)
    info = np.iinfo(x.dtype)
    return fn(x, axis=dims, keepdims=keepdims, initial=info.min if largest else info.max).astype(x.dtype)


def reduce_max(x: Array, *, axes: tuple[int, ...] | None = None, keepdims: bool = True) -> Array:
    """Y = max(X over ``axes``); an empty reduction gives -inf (the type's minimum for integers)."""
    return _extreme("ReduceMax", x, axes, keepdims, True)


def reduce_min(x: Array, *, axes: tuple[int, ...] | None = None, keepdims: bool = True) -> Array:
    """Y = min(X over ``axes``); an empty reduction gives +inf (the type's maximum for integers)."""
    return _extreme("ReduceMin", x, axes, keepdims, False)


def cumsum(x: Array, *, axis: int, exclusive: bool = False, reverse: bool = False) -> Array:
    """Y[i] = X[0] + ... + X[i] along ``axis`` (``exclusive``: without X[i]; ``reverse``: from the end). Floats
    accumulate in double precision and round each result once; integers wrap."""
    if not -x.ndim <= axis < x.ndim:
        return fail("CumSum", f"axis {axis} is out of range for a rank-{x.ndim} input")
    a = axis % x.ndim
    v = f64(x) if is_floatlike(x) else x.astype(np.uint64 if x.dtype.kind == "u" else np.int64)
    if reverse:
        v = np.flip(v, a)
    c = np.cumsum(v, axis=a)
    if exclusive:
        shifted = np.zeros_like(c)
        head, tail = [slice(None)] * x.ndim, [slice(None)] * x.ndim
        head[a], tail[a] = slice(1, None), slice(None, -1)
        shifted[tuple(head)] = c[tuple(tail)]
        c = shifted
    if reverse:
        c = np.flip(c, a)
    with np.errstate(over="ignore"):
        return float_out(c, x) if is_floatlike(x) else c.astype(x.dtype)


REFS: dict[str, RefFn] = {
    "TopK": topk, "ArgMax": argmax, "ReduceMean": reduce_mean, "ReduceSum": reduce_sum, "ReduceMax": reduce_max,
    "ReduceMin": reduce_min, "CumSum": cumsum,
}

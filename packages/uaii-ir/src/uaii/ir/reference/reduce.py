"""Reduction references: TopK, ArgMax and ReduceMean. Values keep their dtype; indices are int64; means are taken
in float64 and rounded once to X's dtype."""

from __future__ import annotations

import math

import numpy as np

from uaii.ir.reference._common import Array, RefFn, f64, fail, float_out, order_key, sorted_indices


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


def reduce_mean(x: Array, *, axes: tuple[int, ...] | None = None, keepdims: bool = True) -> Array:
    """Y = sum(X over ``axes``) / (their element count); no ``axes`` (or none listed) means every axis."""
    rank = x.ndim
    dims = tuple(range(rank)) if not axes else tuple(a + rank if a < 0 else a for a in axes)
    if any(not 0 <= a < rank for a in dims) or len(set(dims)) != len(dims):
        fail("ReduceMean", f"axes {list(axes or ())} do not name distinct axes of a rank-{rank} input")
    count = math.prod(x.shape[a] for a in dims)
    with np.errstate(invalid="ignore"):  # an empty axis gives 0 / 0 = NaN, as in ONNX
        return float_out(np.sum(f64(x), axis=dims, keepdims=keepdims) / count, x)


REFS: dict[str, RefFn] = {"TopK": topk, "ArgMax": argmax, "ReduceMean": reduce_mean}

"""Reduction references: TopK and ArgMax. Values keep their dtype; indices are int64."""

from __future__ import annotations

import numpy as np

from uaii.ir.reference._common import Array, RefFn, fail, order_key, sorted_indices


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


REFS: dict[str, RefFn] = {"TopK": topk, "ArgMax": argmax}

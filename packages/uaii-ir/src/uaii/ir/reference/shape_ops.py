"""References of the ops with data-dependent shapes: Shape, Range, Fill (ONNX ConstantOfShape) and Expand."""

from __future__ import annotations

import numpy as np

from uaii.ir.ops.shape_ops import range_length
from uaii.ir.reference._common import Array, RefFn, fail, to_dtype


def shape(x: Array, *, start: int = 0, end: int | None = None) -> Array:
    """Y = X.shape[start:end] as int64 (negative bounds count from the back; both clamp to [0, rank])."""
    return np.asarray(x.shape[slice(start, end)], dtype=np.int64).reshape(-1)


def _scalar(name: str, v: Array) -> Array:
    v = np.asarray(v)
    if v.size != 1 or v.ndim > 1:
        fail("Range", f"{name} must be a scalar, found shape {list(v.shape)}")
    return v.reshape(())


def range_(start: Array, limit: Array, delta: Array) -> Array:
    """Y[i] = start + i * delta for i < max(ceil((limit - start) / delta), 0); floats in double, rounded once."""
    s, lim, d = _scalar("start", start), _scalar("limit", limit), _scalar("delta", delta)
    if not s.dtype == lim.dtype == d.dtype:
        return fail("Range", f"start, limit and delta have dtypes {s.dtype}, {lim.dtype}, {d.dtype}; one is needed")
    try:
        n = range_length(s, lim, d)
    except ValueError as exc:
        return fail("Range", str(exc))
    if s.dtype.kind in "iu":
        return (int(s) + int(d) * np.arange(n, dtype=np.int64)).astype(s.dtype)
    return to_dtype(float(s) + float(d) * np.arange(n, dtype=np.float64), s.dtype)


def _dims(op: str, values: Array) -> tuple[int, ...]:
    v = np.asarray(values)
    if v.ndim != 1 or v.dtype.kind not in "iu":
        fail(op, f"the shape input must be a 1-D integer tensor, found {v.dtype} {list(v.shape)}")
    return tuple(int(d) for d in v)


def fill(shape: Array, value: Array) -> Array:
    """Y = a tensor of shape ``shape``, every element the one element of ``value``, in value's dtype (bits copied)."""
    dims = _dims("Fill", shape)
    if any(d < 0 for d in dims):
        return fail("Fill", f"shape {list(dims)} has a negative dim")
    v = np.asarray(value)
    if v.size != 1 or v.ndim > 1:
        return fail("Fill", f"value must hold one element, found shape {list(v.shape)}")
    return np.full(dims, v.reshape(()), dtype=v.dtype)


def expand(x: Array, shape: Array) -> Array:
    """Y = X broadcast with ``shape`` both ways (NumPy rules): a 1 in ``shape`` keeps X's dim."""
    dims = _dims("Expand", shape)
    if any(d < 0 for d in dims):
        return fail("Expand", f"shape {list(dims)} has a negative dim")
    try:
        out = np.broadcast_shapes(x.shape, dims)
    except ValueError:
        return fail("Expand", f"X {list(x.shape)} and shape {list(dims)} do not broadcast")
    return np.ascontiguousarray(np.broadcast_to(x, out))


REFS: dict[str, RefFn] = {"Shape": shape, "Range": range_, "Fill": fill, "Expand": expand}

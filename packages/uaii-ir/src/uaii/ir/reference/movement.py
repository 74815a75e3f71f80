"""Movement references: Identity, Reshape, Transpose, Concat, Split, Slice. They never change values or dtypes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from uaii.ir.reference._common import Array, RefFn, fail


def identity(x: Array) -> Array:
    """Y = X."""
    return x


def reshape(x: Array, target: Array | None = None, *, shape: Sequence[int] | None = None) -> Array:
    """Y = X with the target shape (attribute ``shape`` or input #1, not both), elements in row-major order.

    A 0 in the target copies X's dim at that position; one -1 is inferred from the element count.
    """
    if (target is None) == (shape is None):
        fail("Reshape", "the target shape comes from the attribute 'shape' or from input #1 (exactly one)")
    want = [int(v) for v in (shape if shape is not None else np.asarray(target).reshape(-1))]
    if any(d == 0 and i >= x.ndim for i, d in enumerate(want)):
        fail("Reshape", f"target {want} copies (0) a dim that X {list(x.shape)} does not have")
    dims = [x.shape[i] if d == 0 else d for i, d in enumerate(want)]
    try:
        return x.reshape(dims)
    except ValueError:
        return fail("Reshape", f"cannot reshape X {list(x.shape)} ({x.size} elements) to {want}")


def transpose(x: Array, *, perm: Sequence[int] | None = None) -> Array:
    """Y = X with axes permuted, Y.shape[i] = X.shape[perm[i]]; without perm the axes reverse."""
    axes = tuple(range(x.ndim))[::-1] if perm is None else tuple(perm)
    if sorted(axes) != list(range(x.ndim)):
        fail("Transpose", f"perm {list(axes)} is not a permutation of the {x.ndim} axes of X")
    return np.ascontiguousarray(np.transpose(x, axes))


def concat(*inputs: Array, axis: int) -> Array:
    """Y = the inputs joined along ``axis``; all other dims must match."""
    if len({a.dtype for a in inputs}) > 1:
        fail("Concat", f"inputs have different dtypes: {[str(a.dtype) for a in inputs]}")
    try:
        return np.concatenate(inputs, axis=axis)
    except ValueError as exc:
        return fail("Concat", f"shapes {[list(a.shape) for a in inputs]} along axis {axis}: {exc}")


def split(x: Array, *, axis: int = 0, split: Sequence[int] | None = None,
          num_outputs: int = 1) -> tuple[Array, ...]:
    """X cut along ``axis`` into ``num_outputs`` parts: sizes from ``split``, or equal parts."""
    dim = x.shape[axis]
    if split is None:
        if dim % num_outputs:
            fail("Split", f"axis {axis} of size {dim} does not split evenly into {num_outputs} outputs")
        split = [dim // num_outputs] * num_outputs
    if len(split) != num_outputs or sum(split) != dim:
        fail("Split", f"sizes {list(split)} for {num_outputs} outputs do not add up to the size {dim} of axis "
                      f"{axis}")
    return tuple(np.split(x, np.cumsum(split)[:-1], axis=axis))


def slice_(x: Array, *, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int] | None = None,
           steps: Sequence[int] | None = None) -> Array:
    """Y = X[starts:ends:steps] on the listed axes (default 0..len(starts)-1), Python slice semantics:
    negative indices count from the end, out-of-range bounds clamp (so an end >= 2^31 reaches the end)."""
    axes = tuple(range(len(starts))) if not axes else tuple(axes)
    steps = (1,) * len(starts) if not steps else tuple(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps) or 0 in steps:
        fail("Slice", "starts, ends, axes and steps need one entry per sliced axis, and steps must not be 0")
    index: list[slice] = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        index[a % x.ndim] = slice(s, e, st)
    return x[tuple(index)]


REFS: dict[str, RefFn] = {
    "Identity": identity, "Reshape": reshape, "Transpose": transpose, "Concat": concat, "Split": split,
    "Slice": slice_,
}

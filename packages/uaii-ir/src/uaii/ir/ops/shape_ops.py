"""Ops whose output shape follows from input *values*: Range, Fill (ONNX ConstantOfShape) and Expand; and Shape,
whose output values follow from an input's shape. Exported graphs compute sequence lengths, masks and position ids
with them (Shape -> Gather -> Range / ConstantOfShape / Expand).

Their shape functions give exact shapes where the deciding inputs are constants (``ctx.const``) and fresh symbolic
dims otherwise, as Reshape with a shape input does. The schemas declare those inputs (``value_inputs``) and Shape's
nature (``from_shape``), so a backend knows what it must compute before it can bind the node: the CPU backend folds
them per feed shapes (``uaii.backends.analysis.infer_types``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from uaii.ir.dtype import PLAIN_TYPES, Dim, DType
from uaii.ir.ops.opset import Op
from uaii.ir.ops.schema import (
    Cost,
    InferCtx,
    OpKind,
    OpSchema,
    Param,
    int_attr,
)
from uaii.ir.shapes import Shape, ShapeError, broadcast_shapes

I64 = frozenset({DType.I64})
RANGE_TYPES = frozenset({DType.F32, DType.F64, DType.I16, DType.I32, DType.I64})
"""ONNX Range's types."""


# --- Shape --------------------------------------------------------------------------------------------------------
def shape_dims(rank: int, start: int, end: int | None) -> range:
    """The dim positions ONNX Shape-15 returns: ``start``/``end`` count from the back when negative and clamp to
    [0, rank]; ``end`` None means rank."""
    return range(rank)[slice(start, end)]


def shape_out(ctx: InferCtx) -> Sequence[Shape | None]:
    x = ctx.shape(0)
    return [(len(shape_dims(len(x), int(ctx.attr("start")), ctx.attr("end"))),)]


SHAPE = OpSchema(
    Op.SHAPE, 1,
    "Y = the shape of X as a 1-D i64 tensor (ONNX Shape-15): dims[start:end], negative bounds counting from the "
    "back, both clamped to [0, rank]. Only X's shape is read, never its values. X has a plain dtype: a block-"
    "quantized tensor is a weight, whose static shape a loader folds.",
    inputs=(Param("X", "T", "any plain tensor"),), outputs=(Param("Y", I64, "[len(dims[start:end])]"),),
    attrs=(int_attr("start", 0, "first dim returned; negative counts from the back"),
           int_attr("end", None, "one past the last dim returned; negative counts from the back; default the rank")),
    types={"T": PLAIN_TYPES}, infer=shape_out, kind=OpKind.SHAPE, cost=Cost.FREE, from_shape=True)


# --- Range --------------------------------------------------------------------------------------------------------
def range_length(start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> int:
    """ONNX Range's element count max(ceil((limit - start) / delta), 0) of three scalars of one dtype: exact for
    integers; for floats limit - start is taken in their type and the division in double precision, as onnxruntime
    computes it. Raises ValueError for delta 0."""
    start, limit, delta = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    if delta == 0:
        raise ValueError("delta is 0: the sequence would never reach its limit")
    if start.dtype.kind in "iu":
        s, lim, d = int(start), int(limit), int(delta)
        return max(-((s - lim) // d), 0)
    with np.errstate(over="ignore", invalid="ignore"):
        diff = float(np.subtract(limit, start, dtype=start.dtype))
    n = diff / float(delta)
    if not math.isfinite(n):
        raise ValueError(f"(limit - start) / delta is {n}: no finite length")
    return max(math.ceil(n), 0)


def _scalar(ctx: InferCtx, i: int) -> None:
    s = ctx.rank(i, 0, 1)
    if len(s) == 1 and isinstance(s[0], int) and s[0] != 1:
        ctx.fail(f"input #{i} must be a scalar (or hold one element), found shape {list(s)}")


def range_out(ctx: InferCtx) -> Sequence[Shape | None]:
    for i in range(3):
        _scalar(ctx, i)
    consts = [ctx.const(i) for i in range(3)]
    if any(c is None for c in consts):
        return [(ctx.fresh("range"),)]
    try:
        return [(range_length(*consts),)]  # type: ignore[arg-type]
    except ValueError as exc:
        ctx.fail(str(exc))


RANGE = OpSchema(
    Op.RANGE, 1,
    "Y[i] = start + i * delta for i < max(ceil((limit - start) / delta), 0) (ONNX Range); the length depends on "
    "the values, so without constant inputs the output dim is a fresh symbol. delta = 0 is an error. Floats "
    "compute each element in double precision and round once.",
    inputs=(Param("start", "T", "first value, a scalar"), Param("limit", "T", "exclusive bound, a scalar"),
            Param("delta", "T", "step, a non-zero scalar")),
    outputs=(Param("Y", "T", "[n]"),),
    types={"T": RANGE_TYPES}, infer=range_out, kind=OpKind.SHAPE, cost=Cost.LOW, value_inputs=(0, 1, 2))


# --- Fill (ConstantOfShape) ---------------------------------------------------------------------------------------
def dims_from_values(ctx: InferCtx, i: int, what: str) -> Shape | None:
    """The dims held by 1-D input ``i``: exact from a constant, fresh symbols for a known length, else None."""
    s = ctx.rank(i, 1, 1)
    const = ctx.const(i)
    if const is not None:
        dims = tuple(int(v) for v in np.asarray(const).reshape(-1))
        if any(d < 0 for d in dims):
            ctx.fail(f"{what} {list(dims)} has a negative dim")
        return dims
    if isinstance(s[0], int):
        return tuple(ctx.fresh(what) for _ in range(s[0]))
    return None


def fill_out(ctx: InferCtx) -> Sequence[Shape | None]:
    v = ctx.rank(1, 0, 1)
    if len(v) == 1 and isinstance(v[0], int) and v[0] != 1:
        ctx.fail(f"value must hold one element, found shape {list(v)}")
    return [dims_from_values(ctx, 0, "fill")]


FILL = OpSchema(
    Op.FILL, 1,
    "Y = a tensor of the shape held by `shape`, every element the one element of `value` (ONNX ConstantOfShape, "
    "whose `value` attribute is a one-element tensor too; an empty shape gives a scalar, a 0 dim an empty tensor). "
    "Y has value's dtype and its exact bits: an i64 beyond 2^53 or a bf16 word is copied, never rounded through a "
    "float.",
    inputs=(Param("shape", I64, "the output shape, 1-D, non-negative"),
            Param("value", "T", "the fill value: a scalar or a one-element 1-D tensor")),
    outputs=(Param("Y", "T", "the filled tensor"),),
    types={"T": PLAIN_TYPES}, infer=fill_out, kind=OpKind.SHAPE, cost=Cost.LOW, value_inputs=(0,))


# --- Expand -------------------------------------------------------------------------------------------------------
def expand_shape(x: Sequence[Dim], target: Sequence[int]) -> Shape:
    """ONNX Expand's output: X's shape and ``target`` broadcast together, both ways (NumPy rules)."""
    return broadcast_shapes(tuple(x), tuple(int(d) for d in target))


def expand_out(ctx: InferCtx) -> Sequence[Shape | None]:
    x = ctx.shape(0)
    target = dims_from_values(ctx, 1, "expand")
    if target is None:
        return [None]
    if all(isinstance(d, int) for d in target):
        try:
            return [expand_shape(x, [int(d) for d in target])]
        except ShapeError as exc:
            ctx.fail(f"X {list(x)} cannot expand to {list(target)}: {exc}")
    rank = max(len(x), len(target))
    xs = (1,) * (rank - len(x)) + tuple(x)
    ts: tuple[Dim | None, ...] = (None,) * (rank - len(target)) + tuple(target)
    # where the target has no dim, X's dim stays; a known dim of X other than 1 is the output's (the target holds 1
    # or that dim there); anywhere else the target's (fresh) dim is the output's
    return [tuple(d if t is None or (isinstance(d, int) and d != 1) else t for d, t in zip(xs, ts, strict=True))]


EXPAND = OpSchema(
    Op.EXPAND, 1,
    "Y = X broadcast with the shape held by `shape` (ONNX Expand): both shapes broadcast together, NumPy style, so "
    "a 1 in `shape` keeps X's dim and the output rank is the larger of the two.",
    inputs=(Param("X", "T", "input"), Param("shape", I64, "the target shape, 1-D")),
    outputs=(Param("Y", "T", "the broadcast of X.shape and shape"),),
    types={"T": PLAIN_TYPES}, infer=expand_out, kind=OpKind.SHAPE, cost=Cost.LOW, value_inputs=(1,))

SCHEMAS = (SHAPE, RANGE, FILL, EXPAND)

__all__ = ["EXPAND", "FILL", "RANGE", "RANGE_TYPES", "SCHEMAS", "SHAPE", "expand_shape", "range_length",
           "shape_dims"]

"""Indexing ops: Embedding (a dequantizing row lookup) and Gather (ONNX Gather, dtype-preserving)."""

from __future__ import annotations

from collections.abc import Sequence

from uaii.ir.dtype import DType
from uaii.ir.ops.access import AccessIf, WeightAccess
from uaii.ir.ops.opset import Op
from uaii.ir.ops.schema import (
    ANY_TYPE,
    FLOATS,
    INDEX_TYPES,
    WEIGHT_TYPES,
    Cost,
    InferCtx,
    OpKind,
    OpSchema,
    Param,
    int_attr,
)
from uaii.ir.shapes import Shape


def embedding_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    idx, table = ctx.shape(0), ctx.rank(1, 2, 2)
    return [(*idx, table[1])]


def embedding_dtype(ctx: InferCtx) -> Sequence[DType | None]:
    table = ctx.dtype(1)
    return [None if table.is_quantized else table]


EMBEDDING = OpSchema(
    Op.EMBEDDING, 1,
    "Y[..., :] = table[indices[...], :], rows dequantized when the table is block-quantized (the output is "
    "then any activation type; otherwise the table's type). Input order follows the C++ runtime: indices "
    "first. Indices may be f32 holding whole numbers (the C++ runtime declares its token input f32).",
    inputs=(Param("indices", "I", "token ids, any shape"), Param("table", "W", "[vocab, dim]")),
    outputs=(Param("Y", "T", "[*indices.shape, dim]"),),
    types={"I": INDEX_TYPES | frozenset({DType.F32}), "W": WEIGHT_TYPES, "T": FLOATS},
    infer=embedding_shape, dtypes=embedding_dtype, kind=OpKind.INDEX, cost=Cost.MEDIUM,
    weight_access={1: WeightAccess.ROWS})


def gather_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    data, idx = ctx.rank(0, 1), ctx.shape(1)
    axis = ctx.axis(int(ctx.attr("axis")), len(data))
    if ctx.dtype(0).is_quantized and axis == len(data) - 1:
        ctx.fail(f"{ctx.dtype(0).value} data cannot be gathered along its innermost axis, which holds its "
                 "blocks", "dtype")
    return [(*data[:axis], *idx, *data[axis + 1:])]


GATHER = OpSchema(
    Op.GATHER, 1,
    "Y = take(data, indices, axis) (ONNX Gather): Y.shape = data.shape[:axis] + indices.shape + "
    "data.shape[axis+1:]. The dtype is kept: gathering rows of a block-quantized tensor (any axis but the "
    "innermost) yields packed rows.",
    inputs=(Param("data", "T", "input"), Param("indices", "I", "indices, negative counts from the end")),
    outputs=(Param("Y", "T", "gathered values"),),
    attrs=(int_attr("axis", 0, "the indexed axis; negative counts from the end"),),
    types={"T": ANY_TYPE, "I": INDEX_TYPES}, infer=gather_shape, kind=OpKind.INDEX, cost=Cost.MEDIUM,
    weight_access={0: AccessIf("axis", 0, WeightAccess.ROWS)})

SCHEMAS = (EMBEDDING, GATHER)

"""Comparisons, boolean logic and selection: what attention masks and padding logic of exported graphs are made of.

Comparisons take two operands of one numeric dtype and give bool; And, Or, Xor and Not work on bool; Where picks
between two values by a bool condition (three-way NumPy broadcasting); Trilu keeps one triangle of the last two axes
(causal masks). All follow ONNX (opsets 13-23).
"""

from __future__ import annotations

from collections.abc import Sequence

from uaii.ir.dtype import PLAIN_TYPES, DType
from uaii.ir.ops.elementwise import broadcast, same_shape
from uaii.ir.ops.opset import Op
from uaii.ir.ops.schema import (
    NUMERIC,
    Cost,
    InferCtx,
    OpKind,
    OpSchema,
    Param,
    bool_attr,
    int_attr,
)
from uaii.ir.shapes import Shape

BOOL = frozenset({DType.BOOL})

NOT = OpSchema(
    Op.NOT, 1, "Y = not X, elementwise (ONNX Not).",
    inputs=(Param("X", BOOL, "input"),), outputs=(Param("Y", BOOL, "same shape as X"),),
    infer=same_shape, kind=OpKind.UNARY, elementwise=True, fusible=True, inplace=((0, 0),), cost=Cost.LOW)


def _compare(op: str, formula: str, types: frozenset[DType] = NUMERIC) -> OpSchema:
    return OpSchema(
        op, 1, f"C = ({formula}), elementwise with NumPy broadcasting; A and B have one dtype, C is bool. Floats "
        "compare as IEEE values: any comparison with NaN is false (Equal too).",
        inputs=(Param("A", "T", "left operand"), Param("B", "T", "right operand")),
        outputs=(Param("C", BOOL, "the broadcast shape of A and B"),),
        types={"T": types}, infer=broadcast, kind=OpKind.BINARY, elementwise=True, cost=Cost.LOW)


EQUAL = _compare(Op.EQUAL, "A == B", NUMERIC | BOOL)
LESS = _compare(Op.LESS, "A < B")
GREATER = _compare(Op.GREATER, "A > B")
LESS_OR_EQUAL = _compare(Op.LESS_OR_EQUAL, "A <= B")
GREATER_OR_EQUAL = _compare(Op.GREATER_OR_EQUAL, "A >= B")


def _logic(op: str, formula: str) -> OpSchema:
    return OpSchema(
        op, 1, f"C = A {formula} B, elementwise over bool with NumPy broadcasting.",
        inputs=(Param("A", BOOL, "left operand"), Param("B", BOOL, "right operand")),
        outputs=(Param("C", BOOL, "the broadcast shape of A and B"),),
        infer=broadcast, kind=OpKind.BINARY, elementwise=True, fusible=True, inplace=((0, 0), (1, 0)),
        cost=Cost.LOW)


AND = _logic(Op.AND, "and")
OR = _logic(Op.OR, "or")
XOR = _logic(Op.XOR, "xor")

WHERE = OpSchema(
    Op.WHERE, 1,
    "Y = X where condition else Y (ONNX Where): the three inputs broadcast together, NumPy style. The values keep "
    "their bits (a selection, no arithmetic).",
    inputs=(Param("condition", BOOL, "where to take X"), Param("X", "T", "values where true"),
            Param("Y", "T", "values where false")),
    outputs=(Param("output", "T", "the broadcast shape of the three inputs"),),
    types={"T": PLAIN_TYPES}, infer=broadcast, kind=OpKind.SELECT, elementwise=True, inplace=((1, 0), (2, 0)),
    cost=Cost.LOW)


def trilu_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    return [ctx.rank(0, 2)]


TRILU = OpSchema(
    Op.TRILU, 1,
    "Y = X with one triangle of its last two axes kept and the rest zeroed (ONNX Trilu, k as an attribute): "
    "upper keeps the elements with column - row >= k, lower those with column - row <= k. Leading axes are a "
    "batch.",
    inputs=(Param("X", "T", "input, rank >= 2"),), outputs=(Param("Y", "T", "same shape as X"),),
    attrs=(bool_attr("upper", True, "keep the upper triangle (else the lower one)"),
           int_attr("k", 0, "the diagonal offset: 0 the main diagonal, > 0 above it, < 0 below it")),
    types={"T": PLAIN_TYPES}, infer=trilu_shape, kind=OpKind.SELECT, inplace=((0, 0),), cost=Cost.LOW)

SCHEMAS = (NOT, EQUAL, LESS, GREATER, LESS_OR_EQUAL, GREATER_OR_EQUAL, AND, OR, XOR, WHERE, TRILU)

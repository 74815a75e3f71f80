"""Elementwise ops: unary maps, Cast, binary arithmetic with NumPy broadcasting, and gated linear units."""

from __future__ import annotations

from collections.abc import Sequence

from uaii.ir.dtype import FLOAT_TYPES, PLAIN_TYPES, DType
from uaii.ir.errors import UaiiError
from uaii.ir.ops.access import WeightAccess
from uaii.ir.ops.opset import Op
from uaii.ir.ops.schema import (
    ANY_TYPE,
    NUMERIC,
    AttrSpec,
    Cost,
    InferCtx,
    OpKind,
    OpSchema,
    Param,
    ShapeFn,
    bool_attr,
    float_attr,
    positive,
    str_attr,
)
from uaii.ir.shapes import Shape, ShapeError, broadcast_shapes, dim_div, unify


def same_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    """Output 0 has the shape of input 0."""
    return [ctx.shape(0)]


def _unary(op: str, doc: str, types: frozenset[DType] = FLOAT_TYPES,
           attrs: tuple[AttrSpec, ...] = ()) -> OpSchema:
    return OpSchema(
        op, 1, doc, inputs=(Param("X", "T", "input"),), outputs=(Param("Y", "T", "same shape as X"),),
        attrs=attrs, types={"T": types}, infer=same_shape, kind=OpKind.UNARY, elementwise=True, fusible=True,
        inplace=((0, 0),), cost=Cost.LOW)


APPROXIMATE = str_attr("approximate", "none", "'none': exact erf form; 'tanh': the tanh approximation",
                       choices=("none", "tanh"))

NEG = _unary(Op.NEG, "Y = -X.", NUMERIC)
RELU = _unary(Op.RELU, "Y = max(X, 0).", NUMERIC)
SILU = _unary(Op.SILU, "Y = X * sigmoid(X) (swish).")
GELU = _unary(Op.GELU, "Y = X * Phi(X); with approximate='tanh', "
              "0.5 X (1 + tanh(sqrt(2/pi) (X + 0.044715 X^3))).", attrs=(APPROXIMATE,))
SIGMOID = _unary(Op.SIGMOID, "Y = 1 / (1 + exp(-X)).")
TANH = _unary(Op.TANH, "Y = tanh(X).")
EXP = _unary(Op.EXP, "Y = exp(X).")
SQRT = _unary(Op.SQRT, "Y = sqrt(X).")
SOFTCAP = _unary(Op.SOFTCAP, "Y = cap * tanh(X / cap): a smooth clamp to (-cap, cap) (gemma 2 soft-capping).",
                 attrs=(float_attr("cap", None, "the bound; > 0", required=True, check=positive),))
ERF = _unary(Op.ERF, "Y = erf(X), the Gauss error function (ONNX Erf; GELU written out in exported graphs).")
RECIPROCAL = _unary(Op.RECIPROCAL, "Y = 1 / X (0 gives inf of the sign of the zero).")
COS = _unary(Op.COS, "Y = cos(X), X in radians.")
SIN = _unary(Op.SIN, "Y = sin(X), X in radians.")
ABS = _unary(Op.ABS, "Y = |X| (integers wrap: the most negative value stays itself, as in two's complement).", NUMERIC)
LOG = _unary(Op.LOG, "Y = ln(X) (0 gives -inf, negative X NaN).")


def _dtype_name(value: object) -> str | None:
    try:
        dt = DType.parse(str(value))
    except UaiiError:
        return f"is {value!r}; not a dtype name"
    return None if dt in PLAIN_TYPES else f"is {value!r}; a Cast target must be a plain (unquantized) type"


def _cast_dtype(ctx: InferCtx) -> Sequence[DType | None]:
    return [DType.parse(str(ctx.attr("to")))]


CAST = OpSchema(
    Op.CAST, 1,
    "Y = X converted to dtype `to` (values rounded to nearest even, saturating for integers). A "
    "block-quantized X is dequantized, which is how a packed tensor is expanded explicitly.",
    inputs=(Param("X", "T1", "input; any dtype"),),
    outputs=(Param("Y", "T2", "same shape as X, dtype `to`"),),
    attrs=(str_attr("to", None, "target dtype name (f32, f16, i64, ...; aliases such as float32 accepted)",
                    required=True, check=_dtype_name),),
    types={"T1": ANY_TYPE, "T2": PLAIN_TYPES}, infer=same_shape, dtypes=_cast_dtype, kind=OpKind.UNARY,
    elementwise=True, fusible=True, cost=Cost.LOW, weight_access={0: WeightAccess.WHOLE})


def broadcast(ctx: InferCtx) -> Sequence[Shape | None]:
    return [broadcast_shapes(*(ctx.shape(i) for i in range(len(ctx.inputs))))]


def _binary(op: str, formula: str, types: frozenset[DType] = NUMERIC, attrs: tuple[AttrSpec, ...] = (),
            infer: ShapeFn = broadcast) -> OpSchema:
    return OpSchema(
        op, 1, f"C = {formula}, elementwise with NumPy broadcasting. A and B have the same dtype.",
        inputs=(Param("A", "T", "left operand"), Param("B", "T", "right operand")),
        outputs=(Param("C", "T", "the broadcast shape of A and B"),), attrs=attrs,
        types={"T": types}, infer=infer, kind=OpKind.BINARY, elementwise=True, fusible=True,
        inplace=((0, 0), (1, 0)), cost=Cost.LOW)


ADD = _binary(Op.ADD, "A + B")
SUB = _binary(Op.SUB, "A - B")
MUL = _binary(Op.MUL, "A * B")
DIV = _binary(Op.DIV, "A / B (integer division truncates toward zero)")
POW = _binary(Op.POW, "A ** B (ONNX Pow over floats: a negative A with a non-integer B gives NaN, 0 ** 0 = 1)",
              FLOAT_TYPES)
MAX = _binary(Op.MAX, "max(A, B) (ONNX Max of two inputs; a NaN operand gives NaN)")
MIN = _binary(Op.MIN, "min(A, B) (ONNX Min of two inputs; a NaN operand gives NaN)")


def _mod_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    if ctx.dtype(0).is_float and not ctx.attr("fmod"):
        ctx.fail(f"Mod of {ctx.dtype(0).value} operands needs fmod=1 (the remainder with the dividend's sign); "
                 "fmod=0 (the divisor's sign) is defined for integers only, as in ONNX", "attr-range")
    return broadcast(ctx)


MOD = _binary(Op.MOD, "A mod B (ONNX Mod): with fmod=0 (integers only) the remainder takes the sign of B, as "
              "Python's %; with fmod=1 it takes the sign of A, as C's fmod. A zero divisor is an error for integers "
              "and gives NaN for floats",
              attrs=(bool_attr("fmod", False, "false: sign of the divisor (integers); true: sign of the dividend"),),
              infer=_mod_shape)


def glu_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    """Two inputs of one shape, or one input whose last dim is split in halves (gate first, then up)."""
    a = ctx.rank(0, 1)
    if ctx.has(1):
        b = ctx.shape(1)
        if len(a) != len(b):
            ctx.fail(f"gate {list(a)} and up {list(b)} must have the same shape")
        return [tuple(unify(x, y, "gate and up dims") for x, y in zip(a, b, strict=True))]
    try:
        half = dim_div(a[-1], 2)
    except ShapeError:
        ctx.fail(f"a single packed input needs an even last dim to split into gate and up, found {a[-1]}")
    return [(*a[:-1], half)]


def _glu(op: str, act: str, attrs: tuple[AttrSpec, ...] = ()) -> OpSchema:
    return OpSchema(
        op, 1,
        f"Y = {act}(gate) * up. With two inputs, gate and up have one shape; with one input, its last dim is "
        "split in halves: the first half is gate, the second is up (a fused gate/up projection).",
        inputs=(Param("gate", "T", "gate, or the packed [..., 2*d] gate|up"),
                Param("up", "T", "up; omit for the packed form", optional=True)),
        outputs=(Param("Y", "T", "[..., d]"),), attrs=attrs, types={"T": FLOAT_TYPES}, infer=glu_shape,
        kind=OpKind.GLU, fusible=True, inplace=((0, 0),), cost=Cost.LOW)


SWIGLU = _glu(Op.SWIGLU, "silu")
GEGLU = _glu(Op.GEGLU, "gelu", (APPROXIMATE,))

SCHEMAS = (NEG, RELU, SILU, GELU, SIGMOID, TANH, EXP, SQRT, SOFTCAP, CAST, ERF, RECIPROCAL, COS, SIN, ABS, LOG, ADD,
           SUB, MUL, DIV, POW, MAX, MIN, MOD, SWIGLU, GEGLU)

"""ai.onnx elementwise ops: unary math, binary arithmetic, comparisons, logic, Where, Cast, pass-throughs.

Each maps one to one onto the IR op of the same meaning; integer arithmetic and comparisons on sizes fold
symbolically (:mod:`.fold`) so that mask and shape subgraphs disappear where the shapes decide them.
"""

from __future__ import annotations

import numpy as np

from uaii.ir import Dim, DType

from .context import NodeContext
from .dispatch import AI_ONNX, Handler, onnx_op
from .fold import broadcast_pairs, dim_minmax, like, sym_binary, sym_compare
from .onnx_api import elem_dtype
from .values import Value

# --- unary ------------------------------------------------------------------------------------------------
_UNARY = {
    "Relu": ("Relu", (13, 14)), "Sigmoid": ("Sigmoid", (13,)), "Tanh": ("Tanh", (13,)), "Exp": ("Exp", (13,)),
    "Sqrt": ("Sqrt", (13,)), "Neg": ("Neg", (13,)), "Erf": ("Erf", (13,)), "Reciprocal": ("Reciprocal", (13,)),
    "Cos": ("Cos", (7, 22)), "Sin": ("Sin", (7, 22)), "Abs": ("Abs", (13,)), "Log": ("Log", (13,)),
    "Not": ("Not", (1,)),
}


def _unary(ir_op: str) -> Handler:
    def handler(ctx: NodeContext) -> Value:
        return ctx.emit(ir_op, [ctx.input(0)])

    handler.__doc__ = ir_op
    return handler


for _onnx, (_ir, _versions) in _UNARY.items():
    onnx_op(AI_ONNX, _onnx, *_versions)(_unary(_ir))


@onnx_op(AI_ONNX, "Gelu", 20)
def gelu(ctx: NodeContext) -> Value:
    """Gelu (approximate none | tanh)"""
    approx = ctx.attr("approximate", "none")
    if approx not in ("none", "tanh"):
        ctx.fail(f"approximate={approx!r}; expected 'none' or 'tanh'")
    return ctx.emit("Gelu", [ctx.input(0)], {"approximate": approx})


# --- binary -----------------------------------------------------------------------------------------------
def _same_type(ctx: NodeContext, x: Value, y: Value) -> tuple[Value, Value]:
    """ONNX requires equal input types; Pow does not (its exponent may be an int): a constant exponent is
    Cast to the base's type (folded at load time when it is a constant)."""
    if x.dtype is y.dtype:
        return x, y
    if ctx.op_type != "Pow":
        ctx.fail(f"inputs have different types {x.dtype.value} and {y.dtype.value}")
    return x, ctx.emit("Cast", [y], {"to": x.dtype.value})  # a constant exponent folds through Cast's reference


def _binary(ir_op: str, symbolic: bool) -> Handler:
    def handler(ctx: NodeContext) -> Value:
        x, y = _same_type(ctx, ctx.input(0), ctx.input(1))
        if symbolic:
            folded = sym_binary(ctx, ir_op, x, y)
            if folded is not None:
                return folded
        return ctx.emit(ir_op, [x, y])

    handler.__doc__ = ir_op
    return handler


for _name, _versions, _sym in (("Add", (13, 14), True), ("Sub", (13, 14), True), ("Mul", (13, 14), True),
                               ("Div", (13, 14), True), ("Pow", (13, 15), False)):
    onnx_op(AI_ONNX, _name, *_versions)(_binary(_name, _sym))


@onnx_op(AI_ONNX, "Mod", 13, 28)
def mod(ctx: NodeContext) -> Value:
    """Mod (fmod 0 or 1)"""
    x, y = ctx.input(0), ctx.input(1)
    if x.dtype is not y.dtype:
        ctx.fail(f"inputs have different types {x.dtype.value} and {y.dtype.value}")
    return ctx.emit("Mod", [x, y], {"fmod": bool(ctx.attr("fmod", 0))})


def _variadic(ir_op: str) -> Handler:
    def handler(ctx: NodeContext) -> Value:
        vals = [v for v in ctx.inputs if v is not None]
        if not vals:
            ctx.fail("needs at least one input")
        acc = vals[0]
        for v in vals[1:]:
            if v.dtype is not acc.dtype:
                ctx.fail(f"inputs have different types {acc.dtype.value} and {v.dtype.value}")
            acc = _minmax(ctx, ir_op, acc, v)
        return acc

    handler.__doc__ = f"{ir_op} (chained over the inputs)"
    return handler


def _minmax(ctx: NodeContext, ir_op: str, x: Value, y: Value) -> Value:
    a, b = x.dims(), y.dims()
    if (x.is_sym or y.is_sym) and a is not None and b is not None and x.rank <= 1 and y.rank <= 1:
        pairs = broadcast_pairs(a, b)
        if pairs is not None:
            return like([dim_minmax(ctx, ir_op, p, q, x.dtype) for p, q in pairs], x if x.rank >= y.rank else y,
                        x.dtype)
    return ctx.emit(ir_op, [x, y])


onnx_op(AI_ONNX, "Max", 13)(_variadic("Max"))
onnx_op(AI_ONNX, "Min", 13)(_variadic("Min"))


# --- comparisons and logic ----------------------------------------------------------------------------------
def _compare(ir_op: str) -> Handler:
    def handler(ctx: NodeContext) -> Value:
        x, y = ctx.input(0), ctx.input(1)
        if x.dtype is not y.dtype:
            ctx.fail(f"inputs have different types {x.dtype.value} and {y.dtype.value}")
        folded = sym_compare(ctx, ir_op, x, y)
        if folded is not None:
            return folded
        return ctx.emit(ir_op, [x, y])

    handler.__doc__ = f"{ir_op} (bool result)"
    return handler


for _name, _versions in (("Equal", (13, 19)), ("Less", (13,)), ("Greater", (13,)),
                         ("LessOrEqual", (12, 16)), ("GreaterOrEqual", (12, 16))):
    onnx_op(AI_ONNX, _name, *_versions)(_compare(_name))


def _logic(ir_op: str) -> Handler:
    def handler(ctx: NodeContext) -> Value:
        return ctx.emit(ir_op, [ctx.input(0), ctx.input(1)])

    handler.__doc__ = ir_op
    return handler


for _name in ("And", "Or", "Xor"):
    onnx_op(AI_ONNX, _name, 7)(_logic(_name))


@onnx_op(AI_ONNX, "Where", 9, 16)
def where(ctx: NodeContext) -> Value:
    """Where (folded when the condition and both branches are known sizes)"""
    c, x, y = ctx.input(0), ctx.input(1), ctx.input(2)
    if x.dtype is not y.dtype:
        ctx.fail(f"X and Y have different types {x.dtype.value} and {y.dtype.value}")
    cond = ctx.const(0)
    a, b = x.dims(), y.dims()
    if cond is not None and (x.is_sym or y.is_sym) and a is not None and b is not None and cond.ndim <= 1:
        n = max(len(a), len(b), cond.size)
        pick = np.broadcast_to(cond.reshape(-1), (n,))
        aa, bb = (a * n if len(a) == 1 else a), (b * n if len(b) == 1 else b)
        if len(aa) == len(bb) == n:
            picked = [p if k else q for k, p, q in zip(pick, aa, bb, strict=True)]
            return like(picked, max((c, x, y), key=lambda v: v.rank), x.dtype)
    if cond is not None and cond.size and bool(np.all(cond)) and tuple(x.shape) == _bshape(c, x, y):
        return x
    if cond is not None and cond.size and not bool(np.any(cond)) and tuple(y.shape) == _bshape(c, x, y):
        return y
    return ctx.emit("Where", [c, x, y])


def _bshape(*vals: Value) -> tuple[Dim, ...]:
    from uaii.ir.shapes import ShapeError, broadcast_shapes

    try:
        return broadcast_shapes(*(v.shape for v in vals))
    except ShapeError:
        return ()


@onnx_op(AI_ONNX, "IsNaN", 13, 20)
def is_nan(ctx: NodeContext) -> Value:
    """Not(Equal(X, X)) (NaN is the one value unequal to itself)"""
    x = ctx.input(0)
    if not x.dtype.is_float:
        ctx.fail(f"X must be a float tensor, found {x.dtype.value}")
    return ctx.emit("Not", [ctx.emit("Equal", [x, x])])


@onnx_op(AI_ONNX, "IsInf", 10, 20)
def is_inf(ctx: NodeContext) -> Value:
    """Equal(X, +inf) / Equal(X, -inf) (Or of both)"""
    x = ctx.input(0)
    if not x.dtype.is_float:
        ctx.fail(f"X must be a float tensor, found {x.dtype.value}")
    pos, neg = bool(ctx.attr("detect_positive", 1)), bool(ctx.attr("detect_negative", 1))
    hits = [ctx.emit("Equal", [x, Value.scalar(sign * np.inf, x.dtype)])
            for sign, on in ((1.0, pos), (-1.0, neg)) if on]
    if not hits:
        return _all_false(ctx, x)
    return hits[0] if len(hits) == 1 else ctx.emit("Or", hits)


def _all_false(ctx: NodeContext, x: Value) -> Value:
    """IsInf with both detections off: false everywhere (x != x is false except for NaN, so And it with x == x)."""
    same = ctx.emit("Equal", [x, x])
    return ctx.emit("And", [same, ctx.emit("Not", [same])])


def _trunc_parts(ctx: NodeContext, x: Value) -> tuple[Value, Value]:
    """(trunc(x), x - trunc(x)) with C's fmod: both exact in floating point."""
    frac = ctx.emit("Mod", [x, Value.scalar(1.0, x.dtype)], {"fmod": True})
    return ctx.emit("Sub", [x, frac]), frac


def _round_toward(ctx: NodeContext, step: float) -> Value:
    """Floor (step -1) / Ceil (step +1): the truncation moved one step where the fraction points that way;
    infinities pass through (their fraction is NaN)."""
    x = ctx.input(0)
    if not x.dtype.is_float:
        ctx.fail(f"X must be a float tensor, found {x.dtype.value}")
    whole, frac = _trunc_parts(ctx, x)
    zero = Value.scalar(0.0, x.dtype)
    moved = ctx.emit("Add", [whole, Value.scalar(step, x.dtype)])
    beyond = ctx.emit("Less" if step < 0 else "Greater", [frac, zero])
    out = ctx.emit("Where", [beyond, moved, whole])
    inf = ctx.emit("Equal", [ctx.emit("Abs", [x]), Value.scalar(np.inf, x.dtype)])
    return ctx.emit("Where", [inf, x, out])


@onnx_op(AI_ONNX, "Floor", 13)
def floor(ctx: NodeContext) -> Value:
    """Mod (fmod) + Sub + Where (no IR Floor: computed from the exact remainder)"""
    return _round_toward(ctx, -1.0)


@onnx_op(AI_ONNX, "Ceil", 13)
def ceil(ctx: NodeContext) -> Value:
    """Mod (fmod) + Sub + Where (no IR Ceil: computed from the exact remainder)"""
    return _round_toward(ctx, 1.0)


# --- types and pass-throughs --------------------------------------------------------------------------------
def _cast_to(ctx: NodeContext, x: Value, to: DType) -> Value:
    if x.dtype is to:
        return x
    if x.sym is not None and to in (DType.I64, DType.I32):
        return Value("", to, x.shape, sym=x.sym)
    if x.dtype.is_float and to.is_integer:
        x = _trunc_parts(ctx, x)[0]  # ONNX (and onnxruntime) truncate toward zero; the IR's Cast rounds
    return ctx.emit("Cast", [x], {"to": to.value})


@onnx_op(AI_ONNX, "Cast", 13, 19, 21, 23, 24, 25, 28)
def cast(ctx: NodeContext) -> Value:
    """Cast"""
    if ctx.attr("saturate", 1) != 1:
        ctx.warn("saturate=0 only matters for float8 targets, which are not supported")
    return _cast_to(ctx, ctx.input(0), elem_dtype(int(ctx.need_attr("to")), ctx.where))


@onnx_op(AI_ONNX, "CastLike", 15, 19, 21, 23, 24, 25)
def cast_like(ctx: NodeContext) -> Value:
    """Cast (to the second input's type)"""
    return _cast_to(ctx, ctx.input(0), ctx.input(1).dtype)


@onnx_op(AI_ONNX, "Identity", 13, 14, 16, 19, 21, 23, 24, 25)
def identity(ctx: NodeContext) -> Value:
    """(pass-through: no IR node)"""
    return ctx.input(0)


@onnx_op(AI_ONNX, "Dropout", 13, 22)
def dropout(ctx: NodeContext) -> list[Value | None]:
    """(inference: pass-through; the mask output is all true)"""
    training = ctx.const(2)
    if ctx.optional(2) is not None and (training is None or bool(np.any(training))):
        ctx.fail("training_mode must be a constant false for inference")
    x = ctx.input(0)
    mask = None
    if ctx.output_used(1):  # (folded through Fill's reference when x's shape is static and small)
        mask = ctx.emit("Fill", [ctx.symbolic(x.shape), Value.scalar(True, DType.BOOL)], shape=x.shape)
    return [x, mask][: ctx.n_outputs]


__all__ = ["cast", "dropout", "gelu", "identity", "mod", "where"]

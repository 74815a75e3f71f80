"""Elementwise references: unary maps, Cast, binary arithmetic (Pow, Max, Min, Mod included) with NumPy broadcasting,
gated linear units."""

from __future__ import annotations

import numpy as np

from uaii.ir.dtype import DType
from uaii.ir.reference._common import (
    BF16,
    Array,
    RefFn,
    erf,
    f64,
    fail,
    float_out,
    gelu64,
    is_floatlike,
    same_dtype,
    sigmoid64,
    silu64,
    to_dtype,
)


# --- unary --------------------------------------------------------------------------------------------------
def neg(x: Array) -> Array:
    """Y = -X (integers wrap, as two's complement does)."""
    return float_out(-f64(x), x) if is_floatlike(x) else np.negative(x)


def relu(x: Array) -> Array:
    """Y = max(X, 0)."""
    return float_out(np.maximum(f64(x), 0.0), x) if is_floatlike(x) else np.maximum(x, 0).astype(x.dtype)


def silu(x: Array) -> Array:
    """Y = X * sigmoid(X)."""
    return float_out(silu64(f64(x)), x)


def gelu(x: Array, *, approximate: str = "none") -> Array:
    """Y = X * Phi(X) = 0.5 X (1 + erf(X / sqrt 2)); 'tanh': 0.5 X (1 + tanh(sqrt(2/pi) (X + 0.044715 X^3)))."""
    return float_out(gelu64(f64(x), approximate), x)


def sigmoid(x: Array) -> Array:
    """Y = 1 / (1 + exp(-X))."""
    return float_out(sigmoid64(f64(x)), x)


def tanh(x: Array) -> Array:
    """Y = tanh(X)."""
    return float_out(np.tanh(f64(x)), x)


def exp(x: Array) -> Array:
    """Y = exp(X) (overflow gives inf)."""
    with np.errstate(over="ignore"):
        return float_out(np.exp(f64(x)), x)


def sqrt(x: Array) -> Array:
    """Y = sqrt(X) (negative X gives NaN)."""
    with np.errstate(invalid="ignore"):
        return float_out(np.sqrt(f64(x)), x)


def softcap(x: Array, *, cap: float) -> Array:
    """Y = cap * tanh(X / cap)."""
    return float_out(cap * np.tanh(f64(x) / cap), x)


def erf_(x: Array) -> Array:
    """Y = erf(X)."""
    return float_out(erf(f64(x)), x)


def reciprocal(x: Array) -> Array:
    """Y = 1 / X (0 gives inf of the zero's sign)."""
    with np.errstate(divide="ignore", over="ignore"):
        return float_out(1.0 / f64(x), x)


def cos(x: Array) -> Array:
    """Y = cos(X)."""
    return float_out(np.cos(f64(x)), x)


def sin(x: Array) -> Array:
    """Y = sin(X)."""
    return float_out(np.sin(f64(x)), x)


def abs_(x: Array) -> Array:
    """Y = |X| (integers wrap: the most negative value stays itself)."""
    return float_out(np.abs(f64(x)), x) if is_floatlike(x) else np.abs(x)


def log(x: Array) -> Array:
    """Y = ln(X) (0 gives -inf, negative X NaN)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float_out(np.log(f64(x)), x)


# --- Cast ---------------------------------------------------------------------------------------------------
def _int_range(dt: np.dtype) -> tuple[int, int]:
    info = np.iinfo(dt)
    return int(info.min), int(info.max)


def _float_to_int(x: Array, dt: np.dtype) -> Array:
    """Round half to even, saturate to the type's range; NaN becomes 0."""
    lo, hi = _int_range(dt)
    y = np.rint(np.nan_to_num(f64(x), nan=0.0, posinf=np.inf, neginf=-np.inf))
    top = y >= float(hi)  # float(hi) may round up past hi (i64, u32 are exact; i64 max is not)
    y = np.clip(np.where(top, 0.0, y), float(lo), float(hi))
    return np.where(top, np.array(hi, dt), y.astype(dt)).astype(dt)


def cast(x: Array, *, to: str) -> Array:
    """Y = X converted to dtype ``to``.

    float → int rounds half to even and saturates (NaN → 0); int → int saturates; anything → bool is X != 0;
    bool → number is 0/1; float → float rounds to nearest even (float64 → bf16 through float32). A
    block-quantized X reaches the evaluator dequantized (float32), so Cast of it is a float → T cast.
    """
    dt = DType.parse(to)
    if dt.is_quantized:
        return fail("Cast", f"the target {dt.value} is block-quantized; Cast targets a plain type")
    target = dt.numpy
    if dt is DType.BOOL:
        return f64(x) != 0 if is_floatlike(x) else x != 0
    if dt.is_float:
        return to_dtype(f64(x) if x.dtype == BF16 else x, target)
    if is_floatlike(x):
        return _float_to_int(x, target)
    if x.dtype == np.bool_:
        return x.astype(target)
    lo, hi = _int_range(target)
    return np.clip(x.astype(np.int64), lo, hi).astype(target)


# --- binary -------------------------------------------------------------------------------------------------
def _binary(op: str, a: Array, b: Array, fn: RefFn) -> Array:
    same_dtype(op, a, b)
    if is_floatlike(a):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return float_out(fn(f64(a), f64(b)), a)
    with np.errstate(over="ignore"):
        return np.asarray(fn(a, b)).astype(a.dtype)


def add(a: Array, b: Array) -> Array:
    """C = A + B, NumPy broadcasting (integers wrap)."""
    return _binary("Add", a, b, np.add)


def sub(a: Array, b: Array) -> Array:
    """C = A - B, NumPy broadcasting."""
    return _binary("Sub", a, b, np.subtract)


def mul(a: Array, b: Array) -> Array:
    """C = A * B, NumPy broadcasting."""
    return _binary("Mul", a, b, np.multiply)


def _int_div(a: Array, b: Array) -> Array:
    if np.any(b == 0):
        fail("Div", "integer division by zero")
    q = np.abs(a.astype(np.int64)) // np.abs(b.astype(np.int64))
    return np.where((a < 0) != (b < 0), -q, q)


def div(a: Array, b: Array) -> Array:
    """C = A / B, NumPy broadcasting; integer division truncates toward zero (C semantics)."""
    return _binary("Div", a, b, np.divide if is_floatlike(a) else _int_div)


def pow_(a: Array, b: Array) -> Array:
    """C = A ** B over floats, NumPy broadcasting (negative A with a non-integer B gives NaN; 0 ** 0 = 1)."""
    if not is_floatlike(a):
        return fail("Pow", f"operands must be floats, found {a.dtype}")
    return _binary("Pow", a, b, np.power)


def max_(a: Array, b: Array) -> Array:
    """C = max(A, B), NumPy broadcasting; NaN wins."""
    return _binary("Max", a, b, np.maximum)


def min_(a: Array, b: Array) -> Array:
    """C = min(A, B), NumPy broadcasting; NaN wins."""
    return _binary("Min", a, b, np.minimum)


def mod(a: Array, b: Array, *, fmod: bool = False) -> Array:
    """C = A mod B, NumPy broadcasting (ONNX Mod). fmod=False (integers only): the remainder has B's sign (Python's
    %); fmod=True: A's sign (C's fmod). An integer zero divisor is an error; a float one gives NaN."""
    if is_floatlike(a):
        if not fmod:
            return fail("Mod", "float operands need fmod=1")
        return _binary("Mod", a, b, np.fmod)
    if np.any(b == 0):
        return fail("Mod", "integer modulo by zero")
    return _binary("Mod", a, b, np.fmod if fmod else np.mod)


# --- gated linear units -------------------------------------------------------------------------------------
def _gate_up(op: str, gate: Array, up: Array | None) -> tuple[Array, Array]:
    if up is not None:
        if gate.shape != up.shape:
            fail(op, f"gate {list(gate.shape)} and up {list(up.shape)} differ in shape")
        return f64(gate), f64(up)
    if gate.shape[-1] % 2:
        fail(op, f"a packed gate|up input needs an even last dim, found {gate.shape[-1]}")
    g, u = np.split(f64(gate), 2, axis=-1)
    return g, u


def swiglu(gate: Array, up: Array | None = None) -> Array:
    """Y = silu(gate) * up; one packed input [..., 2d] is split into gate = [..., :d], up = [..., d:]."""
    g, u = _gate_up("SwiGLU", gate, up)
    return float_out(silu64(g) * u, gate)


def geglu(gate: Array, up: Array | None = None, *, approximate: str = "none") -> Array:
    """Y = gelu(gate) * up (erf form, or tanh with approximate='tanh'); packed input as for SwiGLU."""
    g, u = _gate_up("GeGLU", gate, up)
    return float_out(gelu64(g, approximate) * u, gate)


REFS: dict[str, RefFn] = {
    "Neg": neg, "Relu": relu, "Silu": silu, "Gelu": gelu, "Sigmoid": sigmoid, "Tanh": tanh, "Exp": exp,
    "Sqrt": sqrt, "Softcap": softcap, "Cast": cast, "Add": add, "Sub": sub, "Mul": mul, "Div": div,
    "SwiGLU": swiglu, "GeGLU": geglu, "Erf": erf_, "Reciprocal": reciprocal, "Cos": cos, "Sin": sin, "Abs": abs_,
    "Log": log, "Pow": pow_, "Max": max_, "Min": min_, "Mod": mod,
}

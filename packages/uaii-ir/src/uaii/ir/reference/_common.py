"""What every reference module shares: the value convention, float conversion and the error type.

Values are NumPy arrays in the dtype of :attr:`DType.numpy`. bf16 therefore travels as raw ``uint16`` words
(UAII has no u16 type, so a ``uint16`` array always means bf16); block-quantized values travel dequantized as
float32 (the caller's weight callback dequantizes). Float ops compute in float64 and round the result once to
the activation dtype of their main input.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from uaii.ir.errors import UaiiError

Array = np.ndarray
RefFn = Callable[..., Any]
"""A reference: the node's inputs positionally (None for an omitted optional input), its resolved attributes
as keywords, plus ``num_outputs`` when it declares that keyword; returns one array or a tuple of them."""

BF16 = np.dtype(np.uint16)


class EvaluationError(UaiiError):
    """The reference evaluator could not run a node or a graph; the message names which and why."""

    component = "reference"


def fail(op: str, detail: str) -> Any:
    raise EvaluationError(f"[reference] {op}: {detail}")


def same_dtype(op: str, a: Array, b: Array, names: str = "AB") -> None:
    """Operands that ONNX types with one type variable must agree: no silent promotion."""
    if a.dtype != b.dtype:
        fail(op, f"{names[0]} is {a.dtype} and {names[1]} is {b.dtype}; both must have one dtype")


# --- bf16 ---------------------------------------------------------------------------------------------------
def bf16_to_f32(words: Array) -> Array:
    """Raw bf16 words → float32 (exact: bf16 is the upper half of a float32)."""
    return (np.asarray(words, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(x: Array) -> Array:
    """float32 → raw bf16 words, rounded to nearest even; NaN stays a quiet NaN."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(np.asarray(x, np.float32))
    return np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), rounded).astype(np.uint16)


# --- float conversion ---------------------------------------------------------------------------------------
def is_floatlike(x: Array) -> bool:
    return x.dtype.kind == "f" or x.dtype == BF16


def f64(x: Array) -> Array:
    """Any float (bf16 words included) or integer array as float64."""
    x = np.asarray(x)
    if x.dtype == BF16:
        x = bf16_to_f32(x)
    return x.astype(np.float64)


def to_dtype(y: Array, dtype: np.dtype) -> Array:
    """Round ``y`` once to ``dtype`` (bf16 = raw uint16 words). float64 → bf16 goes through float32."""
    y = np.asarray(y)
    with np.errstate(over="ignore"):  # out-of-range values become inf, as a hardware conversion does
        return f32_to_bf16(y.astype(np.float32)) if dtype == BF16 else y.astype(dtype)


def float_out(y: Array, like: Array) -> Array:
    """``y`` in the float dtype of ``like``; an integer ``like`` is not an activation type."""
    if not is_floatlike(like):
        return fail("dtype", f"expected a float activation, found {like.dtype}")
    return to_dtype(y, like.dtype)


# --- small math shared by several families ------------------------------------------------------------------
_ERF = np.frompyfunc(math.erf, 1, 1)


def erf(x: Array) -> Array:
    """The error function, elementwise, in float64 (math.erf is exact to the last bit or two)."""
    return np.asarray(_ERF(np.asarray(x, np.float64)), dtype=np.float64)


def sigmoid64(x: Array) -> Array:
    """1 / (1 + exp(-x)) without overflow warnings for large |x|."""
    x = np.asarray(x, np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu64(x: Array) -> Array:
    return np.asarray(x, np.float64) * sigmoid64(x)


def gelu64(x: Array, approximate: str = "none") -> Array:
    x = np.asarray(x, np.float64)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def softmax64(x: Array, axis: int = -1) -> Array:
    x = np.asarray(x, np.float64)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def order_key(x: Array) -> Array:
    """Values that compare like ``x`` does (bf16 words do not)."""
    return f64(x) if x.dtype == BF16 else x


def sorted_indices(x: Array, largest: bool) -> Array:
    """Indices along the last axis sorting ``x`` (descending when ``largest``); ties keep the lower index."""
    key = order_key(x)
    if not largest:
        return np.argsort(key, axis=-1, kind="stable")
    n = key.shape[-1]
    rev = np.argsort(key[..., ::-1], axis=-1, kind="stable")[..., ::-1]  # stable on reversed = lower index first
    return n - 1 - rev


def check_index(op: str, idx: Array, size: int, what: str) -> Array:
    """Integer indices in [-size, size) as non-negative int64; anything else is an error."""
    idx = np.asarray(idx)
    if idx.dtype.kind == "f" and not np.all(np.isfinite(idx) & (idx == np.round(idx))):
        fail(op, f"{what} hold non-integer values")
    out = idx.astype(np.int64)
    bad = (out < -size) | (out >= size)
    if np.any(bad):
        fail(op, f"{what} {int(out[bad].flat[0])} out of range for size {size}")
    return np.where(out < 0, out + size, out)

"""Numpy lowerings of the math ONNX graphs bring: Erf, Reciprocal, Cos, Sin, Abs, Log; Pow, Max, Min, Mod; ReduceSum,
ReduceMax, ReduceMin; CumSum. Floats compute in float32 (float64 for f64 and for sums) and round once to the output
dtype, as ops_numpy does; integers compute in their own type and wrap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from uaii.backends.cpu.bind import Bind, Step, numpy_step
from uaii.backends.cpu.memory import NodeInfo
from uaii.backends.cpu.ops_numpy import compute, operand, store


def raw(b: Bind, name: str) -> np.ndarray:
    """The value's array with its stored bits (bf16 as words): what a selection or a copy moves."""
    if b.is_weight(name):
        return b.weight(name).raw.reshape(b.types[name].shape)
    return b.a(name)


# --- unary ---------------------------------------------------------------------------------------------------
_ERF_TERMS = 14


def erf64(x: np.ndarray) -> np.ndarray:
    """erf in float64, vectorized: the Maclaurin series below |x| = 0.5 (14 terms: exact to double rounding there),
    1 - erfc(|x|) above with Numerical Recipes' erfcc (fractional error < 1.2e-7, so |error| < 6e-8 for |x| >= 0.5):
    float32 results within an ulp of math.erf."""
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    z = x * x
    term, total = x.copy(), x.copy()
    for n in range(1, _ERF_TERMS):
        term = term * -z / n
        total += term / (2 * n + 1)
    series = total * (2.0 / math.sqrt(math.pi))
    t = 1.0 / (1.0 + 0.5 * a)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (
        0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    tail = np.sign(x) * (1.0 - t * np.exp(poly - z))
    return np.where(a < 0.5, series, tail)


UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Erf": lambda x: erf64(x).astype(x.dtype),
    "Reciprocal": np.reciprocal,
    "Cos": np.cos,
    "Sin": np.sin,
    "Abs": np.abs,
    "Log": np.log,
}


def unary(b: Bind, info: NodeInfo) -> list[Step]:
    fn, out = UNARY[info.node.op], info.node.outputs[0]
    x, xdt = operand(b, info.node.inputs[0])
    dt, y = b.dtype(out), b.a(out)

    def step() -> None:
        with np.errstate(all="ignore"):  # log(0), 1/0, log(-1): inf and NaN as the reference gives them
            store(y, fn(compute(x, xdt)), dt)

    return [numpy_step(step)]


# --- binary --------------------------------------------------------------------------------------------------
def _mod(fmod: bool) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    return np.fmod if fmod else np.mod


def binary(b: Bind, info: NodeInfo) -> list[Step]:
    op, out = info.node.op, info.node.outputs[0]
    fn: Callable[..., np.ndarray] = {"Pow": np.power, "Max": np.maximum, "Min": np.minimum}.get(op) or _mod(
        bool(info.attrs.get("fmod")))
    (a1, d1), (a2, d2) = (operand(b, n) for n in info.node.inputs)
    dt, y = b.dtype(out), b.a(out)

    def step() -> None:
        with np.errstate(all="ignore"):  # a zero divisor: the reference refuses integers, gives NaN for floats
            store(y, fn(compute(a1, d1), compute(a2, d2)), dt)

    return [numpy_step(step)]


# --- reductions ----------------------------------------------------------------------------------------------
def _axes(info: NodeInfo, rank: int) -> tuple[int, ...]:
    return tuple(a % rank for a in info.attrs.get("axes") or range(rank)) if rank else ()


def reduce(b: Bind, info: NodeInfo) -> list[Step]:
    op, out = info.node.op, info.node.outputs[0]
    x, xdt = operand(b, info.node.inputs[0])
    dt, y = b.dtype(out), b.a(out)
    axes, keep = _axes(info, len(b.types[info.node.inputs[0]].shape)), bool(info.attrs["keepdims"])
    floats = dt.is_float
    if op == "ReduceSum":
        def run(v: np.ndarray) -> Any:  # floats summed in float64 (a long axis does not drift), integers wrap
            return np.sum(v, axis=axes, keepdims=keep, dtype=np.float64 if floats else v.dtype)
    else:
        largest = op == "ReduceMax"
        fn = np.max if largest else np.min
        if floats:
            init: Any = -np.inf if largest else np.inf
        else:
            limits = np.iinfo(dt.numpy)
            init = limits.min if largest else limits.max

        def run(v: np.ndarray) -> Any:  # the initial value is what an empty reduction gives
            return fn(v, axis=axes, keepdims=keep, initial=init)

    return [numpy_step(lambda: store(y, np.asarray(run(compute(x, xdt))), dt))]


def cumsum(b: Bind, info: NodeInfo) -> list[Step]:
    out, at = info.node.outputs[0], info.attrs
    x, xdt = operand(b, info.node.inputs[0])
    dt, y = b.dtype(out), b.a(out)
    rank = len(b.types[info.node.inputs[0]].shape)
    axis, exclusive, reverse = int(at["axis"]) % rank, bool(at["exclusive"]), bool(at["reverse"])
    acc = np.float64 if dt.is_float else (np.uint64 if dt.numpy.kind == "u" else np.int64)
    head = tuple(slice(1, None) if d == axis else slice(None) for d in range(rank))
    tail = tuple(slice(None, -1) if d == axis else slice(None) for d in range(rank))

    def step() -> None:
        v = compute(x, xdt).astype(acc)
        if reverse:
            v = np.flip(v, axis)
        c = np.cumsum(v, axis=axis)
        if exclusive:  # shift by one along the axis: each element's own value left out
            shifted = np.zeros_like(c)
            shifted[head] = c[tail]
            c = shifted
        if reverse:
            c = np.flip(c, axis)
        store(y, c if dt.is_float else c.astype(dt.numpy), dt)

    return [numpy_step(step)]


MATH: dict[str, Callable[[Bind, NodeInfo], list[Step]]] = {
    **dict.fromkeys(UNARY, unary), **dict.fromkeys(("Pow", "Max", "Min", "Mod"), binary),
    **dict.fromkeys(("ReduceSum", "ReduceMax", "ReduceMin"), reduce), "CumSum": cumsum,
}

__all__ = ["MATH", "erf64", "raw"]

"""Numpy lowerings of comparisons (Equal, Less, Greater, LessOrEqual, GreaterOrEqual -> bool), boolean logic (Not, And,
Or, Xor) and selections (Where, Trilu). Comparisons see float values (bf16 words widened); selections move stored
bits and never round.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from uaii.backends.cpu.bind import Bind, Step, numpy_step
from uaii.backends.cpu.memory import NodeInfo
from uaii.backends.cpu.ops_math import raw
from uaii.backends.cpu.ops_numpy import compute, operand

COMPARE: dict[str, Callable[..., np.ndarray]] = {
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal,
}
LOGIC: dict[str, Callable[..., np.ndarray]] = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}


def compare(b: Bind, info: NodeInfo) -> list[Step]:
    fn, y = COMPARE[info.node.op], b.a(info.node.outputs[0])
    (a1, d1), (a2, d2) = (operand(b, n) for n in info.node.inputs)

    def step() -> None:
        with np.errstate(invalid="ignore"):
            fn(compute(a1, d1), compute(a2, d2), out=y)

    return [numpy_step(step)]


def logic(b: Bind, info: NodeInfo) -> list[Step]:
    fn, y = LOGIC[info.node.op], b.a(info.node.outputs[0])
    a1, a2 = (raw(b, n) for n in info.node.inputs)
    return [numpy_step(lambda: fn(a1, a2, out=y))]


def not_(b: Bind, info: NodeInfo) -> list[Step]:
    x, y = raw(b, info.node.inputs[0]), b.a(info.node.outputs[0])
    return [numpy_step(lambda: np.logical_not(x, out=y))]


def where(b: Bind, info: NodeInfo) -> list[Step]:
    cond, x, other = (raw(b, n) for n in info.node.inputs)
    y = b.a(info.node.outputs[0])
    return [numpy_step(lambda: np.copyto(y, np.where(cond, x, other)))]  # a new array: y may share x's buffer


def trilu(b: Bind, info: NodeInfo) -> list[Step]:
    x, y = raw(b, info.node.inputs[0]), b.a(info.node.outputs[0])
    rows, cols = b.types[info.node.inputs[0]].shape[-2:]
    k = int(info.attrs["k"])
    offset = np.arange(cols)[None, :] - np.arange(rows)[:, None]  # column - row
    keep = offset >= k if info.attrs["upper"] else offset <= k
    zero = np.zeros((), x.dtype)
    return [numpy_step(lambda: np.copyto(y, np.where(keep, x, zero)))]


SELECT: dict[str, Callable[[Bind, NodeInfo], list[Step]]] = {
    **dict.fromkeys(COMPARE, compare), **dict.fromkeys(LOGIC, logic), "Not": not_, "Where": where, "Trilu": trilu,
}

__all__ = ["SELECT"]

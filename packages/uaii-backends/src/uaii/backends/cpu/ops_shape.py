"""Numpy lowerings of Shape, Range, Fill (ONNX ConstantOfShape) and Expand: the ops whose output shapes follow from
values. A binding knows those shapes exactly (``analysis.infer_types`` computes the values they depend on per feed
shapes), so each step only writes its fixed-size output; Range checks at run time that its inputs still give the
length it was bound for, so a binding never writes a sequence of the wrong length silently.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from uaii.backends.base import BackendError
from uaii.backends.cpu.bind import Bind, Step, numpy_step
from uaii.backends.cpu.memory import NodeInfo
from uaii.backends.cpu.ops_math import raw
from uaii.ir.ops.shape_ops import range_length, shape_dims


def shape(b: Bind, info: NodeInfo) -> list[Step]:
    dims = b.types[info.node.inputs[0]].shape
    picked = shape_dims(len(dims), int(info.attrs["start"]), info.attrs.get("end"))
    value = np.array([dims[i] for i in picked], np.int64)
    y = b.a(info.node.outputs[0])
    return [numpy_step(lambda: np.copyto(y, value))]  # the arena's bytes are reused: written every run


def range_(b: Bind, info: NodeInfo) -> list[Step]:
    start, limit, delta = (raw(b, n).reshape(()) for n in info.node.inputs)
    y = b.a(info.node.outputs[0])
    n, name = y.shape[0], info.node.name
    steps: np.ndarray = np.arange(n, dtype=np.float64 if y.dtype.kind == "f" else np.int64)

    def step() -> None:
        try:
            got = range_length(start, limit, delta)
        except ValueError as exc:
            raise BackendError(f"[backend] node {name!r} (Range): {exc}") from None
        if got != n:
            raise BackendError(f"[backend] node {name!r} (Range): start {start}, limit {limit} and delta {delta} give "
                               f"{got} values, but this run was bound for {n}")
        if y.dtype.kind == "f":  # each element computed in double precision and rounded once
            y[...] = float(start) + float(delta) * steps
        else:
            y[...] = int(start) + int(delta) * steps

    return [numpy_step(step)]


def fill(b: Bind, info: NodeInfo) -> list[Step]:
    y, v = b.a(info.node.outputs[0]), raw(b, info.node.inputs[1])
    return [numpy_step(lambda: np.copyto(y, v.reshape(())))]  # the value's stored bits (bf16 words included)


def expand(b: Bind, info: NodeInfo) -> list[Step]:
    x, y = raw(b, info.node.inputs[0]), b.a(info.node.outputs[0])
    return [numpy_step(lambda: np.copyto(y, np.broadcast_to(x, y.shape)))]


SHAPE: dict[str, Callable[[Bind, NodeInfo], list[Step]]] = {
    "Shape": shape, "Range": range_, "Fill": fill, "Expand": expand,
}

__all__ = ["SHAPE"]

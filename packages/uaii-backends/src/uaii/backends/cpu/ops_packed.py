"""What the lowerings of products with a weight packed in several tensors share (ONNX's MatMulNBits: values, scales,
zero points; MLX's QuantizedMatMul: values, scales, biases): float32 activations for the kernel, the bias, and the
weight wrapped once per binding when its tensors are weights, or at run time when the graph computes them.

The kernel step is bound once per binding with every pointer resolved; activations that are not contiguous float32
(an f16 or bf16 A, a strided view) are converted into a scratch buffer by a step before it, and a bias that is not a
weight is added by a step after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from uaii.backends.cpu.bind import NULL, Bind, Step, fptr, kernel, numpy_step, status_fail, to_f32
from uaii.backends.cpu.memory import NodeInfo
from uaii.kernels import PackedWeight

F32 = np.dtype(np.float32)
Wrap = Callable[[dict[str, np.ndarray]], PackedWeight]
"""The node's weight over its tensors' arrays, by input name (no copy)."""
Call = Callable[[PackedWeight, Any, Any, int], tuple[Any, ...]]
"""The kernel's arguments for (weight, bias pointer, activation pointer, rows)."""


def packed_product(b: Bind, info: NodeInfo, *, a_name: str, parts: Sequence[str], bias_name: str, k: int,
                   fn: Any, call: Call, wrap: Wrap) -> list[Step]:
    """Steps of ``Y = A @ W^T (+ bias)`` for the weight made of the inputs ``parts``: ``fn(*call(...))`` is the C
    kernel, ``wrap`` makes the PackedWeight."""
    out = info.node.outputs[0]
    x, y = b.a(a_name), b.a(out)
    m = x.size // k
    if m == 0:
        return []
    steps: list[Step] = []
    xs = x
    if x.dtype != F32 or not x.flags.c_contiguous:
        xs = b.scratch(x.shape)
        a_dtype = b.dtype(a_name)
        steps.append(numpy_step(lambda: np.copyto(xs, to_f32(x, a_dtype))))
    bias: Any = NULL
    late_bias: np.ndarray | None = None
    if bias_name and b.is_weight(bias_name):
        bias_f32 = b.f32_weight(bias_name).reshape(-1)
        b.keep.append(bias_f32)
        bias = fptr(bias_f32)
    elif bias_name:
        late_bias = b.a(bias_name)
    if all(b.is_weight(v) for v in parts):
        pw = wrap({v: b.weight(v).raw for v in parts})
        b.keep.append(pw)
        steps.append(kernel(fn, *call(pw, bias, fptr(xs), m)))
    else:
        def step() -> None:
            pw = wrap({v: np.ascontiguousarray(b.a(v)) for v in parts})
            rc = fn(*call(pw, bias, fptr(xs), m))
            if rc:
                raise status_fail(f"node {info.node.name!r} ({info.node.op})", int(rc))

        steps.append(step)
    if late_bias is not None:
        bias_dtype = b.dtype(bias_name)
        lb = late_bias
        steps.append(numpy_step(lambda: np.add(y, to_f32(lb, bias_dtype), out=y)))
    return steps


__all__ = ["packed_product"]

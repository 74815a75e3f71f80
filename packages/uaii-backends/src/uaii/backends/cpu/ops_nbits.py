"""The CPU lowering of MatMulNBits: ONNX's block-quantized weight runs in its own bytes through the C kernel
(``uk_nbits_gemm``), in one of two modes (:func:`nbits_mode`): int8 activations per 32 values and integer dots (mode
0, onnxruntime's accuracy_level 4), or f32 activations times the weight dequantized to f32 (mode 1, levels 0..3: in
registers for decode rows, by chunks for batches). The node's ``accuracy_level`` is what the model's author accepts,
so the ``fast`` gemm option (the default) follows it; the ``f32`` option asks for exact products everywhere and wins
over a level of 4. Nothing is dequantized or repacked at compile time, so a streamed weight is read from its staging
view as a mapped one is from the map (the streaming layer relowers the node per staging address).

The kernel step is bound once per binding with every pointer resolved; activations that are not contiguous float32
(an f16 or bf16 A, a strided view) are converted into a scratch buffer by a step before it, and a bias that is not a
weight is added by a step after it. B, scales or zero points computed by the graph (not weights) are wrapped at run
time instead, through the same kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from uaii.backends.cpu.bind import NULL, Bind, Step, fptr, kernel, lib, numpy_step, status_fail, to_f32
from uaii.backends.cpu.memory import NodeInfo
from uaii.kernels import PackedWeight, nbits_call

F32 = np.dtype(np.float32)
INT8_ACCURACY = 4
"""The accuracy_level from which A may be quantized to int8 (onnxruntime's CompInt8; its CPU computes 0..3 in f32)."""
INT8_MODE, F32_MODE = 0, 1
"""uk_nbits_gemm's modes (and uk_gemm's numbers for the gemm option: 0 fast, 1 f32)."""


def nbits_mode(gemm_mode: int, accuracy_level: int) -> int:
    """uk_nbits_gemm's mode for a node at ``accuracy_level`` under the executable's ``gemm_mode`` (Bind.gemm_mode):
    ``f32`` is exact everywhere; ``fast`` takes the integer path only where the model allows int8 activations.

    Why not the integer path everywhere in ``fast``: an ONNX model states its accuracy, and at levels 0..3 onnxruntime
    computes in f32; int8 activations would miss its outputs by 1e-2..1e-1 (relative) where f32 arithmetic gives
    ~1e-6. An explicit ``gemm="fast"`` cannot be told from the default here (the executable keeps the resolved mode
    only), so it does not force int8 on levels 0..3."""
    if gemm_mode == F32_MODE:
        return F32_MODE
    return INT8_MODE if accuracy_level >= INT8_ACCURACY else F32_MODE


def _inputs(info: NodeInfo) -> tuple[str, str, str, str, str]:
    ins = [*info.node.inputs, "", ""][:5]
    return ins[0], ins[1], ins[2], ins[3], ins[4]


def _packed(b: Bind, info: NodeInfo, arrays: dict[str, np.ndarray]) -> PackedWeight:
    """The node's weight as a PackedWeight over ``arrays`` (B, scales and zero points by name; no copy)."""
    _, b_name, s_name, z_name, _ = _inputs(info)
    at = info.attrs
    return PackedWeight.from_nbits(arrays[b_name], arrays[s_name], arrays[z_name] if z_name else None,
                                   n=int(at["N"]), k=int(at["K"]), bits=int(at["bits"]),
                                   block_size=int(at["block_size"]), scale_dtype=b.dtype(s_name),
                                   zp_dtype=b.dtype(z_name) if z_name else None)


def matmul_nbits(b: Bind, info: NodeInfo) -> list[Step]:
    a_name, b_name, s_name, z_name, bias_name = _inputs(info)
    out = info.node.outputs[0]
    k, n = int(info.attrs["K"]), int(info.attrs["N"])
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
    mode = nbits_mode(b.gemm_mode(out), int(info.attrs.get("accuracy_level", 0)))
    bias: Any = NULL
    late_bias: np.ndarray | None = None
    if bias_name and b.is_weight(bias_name):
        bias_f32 = b.f32_weight(bias_name).reshape(-1)
        b.keep.append(bias_f32)
        bias = fptr(bias_f32)
    elif bias_name:
        late_bias = b.a(bias_name)
    parts = [v for v in (b_name, s_name, z_name) if v]
    if all(b.is_weight(v) for v in parts):
        pw = _packed(b, info, {v: b.weight(v).raw for v in parts})
        b.keep.append(pw)
        steps.append(kernel(lib.uk_nbits_gemm, *nbits_call(pw), bias, fptr(xs), m, k, fptr(y), n, mode))
    else:
        def step() -> None:
            pw = _packed(b, info, {v: np.ascontiguousarray(b.a(v)) for v in parts})
            rc = lib.uk_nbits_gemm(*nbits_call(pw), bias, fptr(xs), m, k, fptr(y), n, mode)
            if rc:
                raise status_fail(f"node {info.node.name!r} (MatMulNBits)", int(rc))

        steps.append(step)
    if late_bias is not None:
        bias_dtype = b.dtype(bias_name)
        lb = late_bias
        steps.append(numpy_step(lambda: np.add(y, to_f32(lb, bias_dtype), out=y)))
    return steps


NBITS: dict[str, Any] = {"MatMulNBits": matmul_nbits}

__all__ = ["INT8_ACCURACY", "NBITS", "matmul_nbits", "nbits_mode"]

"""The CPU lowering of MatMulNBits: ONNX's block-quantized weight runs in its own bytes through the C kernel
(``uk_nbits_gemm``), in one of two modes (:func:`nbits_mode`): int8 activations per 32 values and integer dots (mode
0, onnxruntime's accuracy_level 4), or f32 activations times the weight dequantized to f32 (mode 1, levels 0..3: in
registers for decode rows, by chunks for batches). The node's ``accuracy_level`` is what the model's author accepts,
so the ``fast`` gemm option (the default) follows it; the ``f32`` option asks for exact products everywhere and wins
over a level of 4. Nothing is dequantized or repacked at compile time, so a streamed weight is read from its staging
view as a mapped one is from the map (the streaming layer relowers the node per staging address). Activations, bias
and weights computed by the graph are handled as for every packed product (:mod:`.ops_packed`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from uaii.backends.cpu.bind import Bind, Step, fptr, lib
from uaii.backends.cpu.memory import NodeInfo
from uaii.backends.cpu.ops_packed import packed_product
from uaii.kernels import PackedWeight, nbits_call

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
    k, n = int(info.attrs["K"]), int(info.attrs["N"])
    y = b.a(info.node.outputs[0])
    mode = nbits_mode(b.gemm_mode(info.node.outputs[0]), int(info.attrs.get("accuracy_level", 0)))
    return packed_product(b, info, a_name=a_name, parts=[v for v in (b_name, s_name, z_name) if v],
                          bias_name=bias_name, k=k, fn=lib.uk_nbits_gemm,
                          call=lambda pw, bias, x, m: (*nbits_call(pw), bias, x, m, k, fptr(y), n, mode),
                          wrap=lambda arrays: _packed(b, info, arrays))


NBITS: dict[str, Any] = {"MatMulNBits": matmul_nbits}

__all__ = ["INT8_ACCURACY", "NBITS", "matmul_nbits", "nbits_mode"]

"""The CPU lowerings of MLX's quantized layout (uaii.ir.ops.quantized): QuantizedMatMul runs in the packed words through
the C kernel ``uk_mlx_gemm`` (f32 activations, each weight value dequantized exactly as mlx does, in registers for
decode rows and by chunks for batches), QuantizedEmbedding dequantizes the looked-up rows with ``uk_mlx_dequantize``.
Nothing is dequantized or repacked at compile time, so a streamed weight is read from its staging view as a mapped one
is from the map.

Activations, bias and weights computed by the graph are handled as for every packed product (:mod:`.ops_packed`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from uaii.backends.base import BackendError
from uaii.backends.cpu.bind import Bind, Step, fptr, lib, numpy_step, status_fail
from uaii.backends.cpu.memory import NodeInfo
from uaii.backends.cpu.ops_packed import packed_product
from uaii.ir.ops.quantized import BANK_SLOTS
from uaii.kernels import PackedWeight, mlx_call


def _slots(info: NodeInfo, count: int) -> list[str]:
    return [*info.node.inputs, *[""] * count][:count]


def packed_mlx(b: Bind, info: NodeInfo, arrays: dict[str, np.ndarray], n: int, k: int) -> PackedWeight:
    """The node's weight (packed values, scales, biases: inputs 1..3) as a PackedWeight over ``arrays`` (no copy)."""
    _, w_name, s_name, z_name = _slots(info, 4)
    at = info.attrs
    return PackedWeight.from_mlx(arrays[w_name], arrays[s_name], arrays[z_name] if z_name else None, n=n, k=k,
                                 mode=str(at["mode"]), bits=int(at["bits"]), group_size=int(at["group_size"]),
                                 scale_dtype=b.dtype(s_name))


def quantized_matmul(b: Bind, info: NodeInfo) -> list[Step]:
    a_name, w_name, s_name, z_name, bias_name = _slots(info, 5)
    k, n = int(info.attrs["K"]), int(info.attrs["N"])
    y = b.a(info.node.outputs[0])
    return packed_product(b, info, a_name=a_name, parts=[v for v in (w_name, s_name, z_name) if v],
                          bias_name=bias_name, k=k, fn=lib.uk_mlx_gemm,
                          call=lambda pw, bias, x, m: (*mlx_call(pw), bias, x, m, k, fptr(y), n),
                          wrap=lambda arrays: packed_mlx(b, info, arrays, n, k))


def quantized_embedding(b: Bind, info: NodeInfo) -> list[Step]:
    ids_name, w_name, s_name, z_name = _slots(info, 4)
    dim = int(info.attrs["dim"])
    y = b.a(info.node.outputs[0])
    ids = b.index_as(ids_name, np.int64)
    if ids.size == 0:
        return []
    if not y.flags.c_contiguous or y.dtype != np.float32:
        raise BackendError(f"[backend] node {info.node.name!r}: QuantizedEmbedding writes a contiguous float32 output")
    parts = [v for v in (w_name, s_name, z_name) if v]
    fed = not all(b.is_weight(v) for v in parts)
    vocab = int(b.types[w_name].shape[0])
    rows = y.reshape(-1, dim)
    name = info.node.name

    def lookup(pw: PackedWeight) -> None:
        call = mlx_call(pw)
        for j, r in enumerate(ids.reshape(-1).tolist()):
            if not 0 <= r < vocab:
                raise BackendError(f"[backend] node {name!r}: token id {r} is outside the table {w_name!r} "
                                   f"({vocab} rows)")
            rc = lib.uk_mlx_dequantize(*call, r, 1, fptr(rows[j]))
            if rc:
                raise status_fail(f"node {name!r} (QuantizedEmbedding)", int(rc))

    if fed:
        return [lambda: lookup(packed_mlx(b, info, {v: np.ascontiguousarray(b.a(v)) for v in parts}, vocab, dim))]
    pw = packed_mlx(b, info, {v: b.weight(v).raw for v in parts}, vocab, dim)
    b.keep.append(pw)
    return [lambda: lookup(pw)]


def dequantize_row(pw: PackedWeight, out: np.ndarray) -> int:
    """Row 0 of ``pw`` (a one-row weight over a table row's bytes) into ``out``: the streaming row path's writer."""
    return int(lib.uk_mlx_dequantize(*mlx_call(pw), 0, 1, fptr(out)))


# --- expert banks (QuantizedMoEExperts) -------------------------------------------------------------------------
def bank_inputs(info: NodeInfo) -> list[tuple[str, str, str]]:
    """(packed values, scales, biases or "") of the gate, up and down banks, by the op's slots."""
    ins = [*info.node.inputs, *[""] * 12]
    return [(ins[w], ins[s], ins[z]) for w, s, z in BANK_SLOTS.values()]


def expert_weights(b: Bind, info: NodeInfo, e: int, arrays: dict[str, np.ndarray], *,
                   one_expert: bool = False) -> list[PackedWeight]:
    """Expert ``e``'s gate, up and down weights over ``arrays`` (each bank tensor by name; no copy): whole banks
    ([n_experts, rows, x], expert e taken as a view), or with ``one_expert`` expert e's own bytes (uint8, as the
    expert cache holds them)."""
    at = info.attrs
    out = []
    for i, names in enumerate(bank_inputs(info)):
        parts: list[np.ndarray | None] = []
        for v in names:
            if not v:
                parts.append(None)
                continue
            t = b.types[v]
            rows = int(t.shape[1])
            a = arrays[v]
            if one_expert:
                parts.append(a.reshape(-1).view(np.uint8).view(t.dtype.numpy).reshape(rows, -1))
            else:
                parts.append(a.reshape(int(t.shape[0]), rows, -1)[e])
        w, s, z = parts
        assert w is not None and s is not None
        gs = int(at["group_sizes"][i])
        out.append(PackedWeight.from_mlx(w, s, z, n=s.shape[0], k=s.shape[1] * gs, mode=str(at["mode"]),
                                         bits=int(at["bits"][i]), group_size=gs, scale_dtype=b.dtype(names[1])))
    return out


def quantized_moe_experts(b: Bind, info: NodeInfo) -> list[Step]:
    """The expert loop of ops_extra (:func:`expert_step`) over per-expert views of the mapped banks."""
    from uaii.backends.cpu.ops_extra import expert_step

    names = [v for bank in bank_inputs(info) for v in bank if v]
    arrays = {v: np.ascontiguousarray(b.weight(v).raw) if b.is_weight(v) else np.ascontiguousarray(b.a(v))
              for v in names}
    n_experts = int(info.attrs["n_experts"])
    experts = [expert_weights(b, info, e, arrays) for e in range(n_experts)]
    b.keep.append(experts)
    d_ff = experts[0][0].n
    step = expert_step(b, info, d_ff, lambda e: (experts[e][0], experts[e][1], experts[e][2]),
                       f"node {info.node.name!r} (QuantizedMoEExperts gemm)")
    return [numpy_step(step)]


MLXQ: dict[str, Any] = {"QuantizedMatMul": quantized_matmul, "QuantizedEmbedding": quantized_embedding,
                        "QuantizedMoEExperts": quantized_moe_experts}

__all__ = ["MLXQ", "bank_inputs", "dequantize_row", "expert_weights", "packed_mlx", "quantized_embedding",
           "quantized_matmul", "quantized_moe_experts"]

"""Lowerings of the ops with their own structure: RoPE and Attention in numpy (any rank, masks, any float type),
and mixture of experts (the router in numpy, the experts through the packed GEMM, one expert slice at a time).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from uaii.backends.base import BackendError
from uaii.backends.cpu.bind import NULL, Bind, Step, fptr, lib, numpy_step, status_fail
from uaii.backends.cpu.memory import NodeInfo
from uaii.backends.cpu.ops_fast import rope_inv_freq
from uaii.backends.cpu.ops_numpy import compute, operand, store
from uaii.ir import DType, UaiiError, WeightAccess
from uaii.kernels import DEQUANT_TYPES, PackedWeight, mlx_call


# --- RoPE ----------------------------------------------------------------------------------------------------
def rope(b: Bind, info: NodeInfo) -> list[Step]:
    x_name, p_name = info.node.inputs[:2]
    ff_name = info.node.inputs[2] if len(info.node.inputs) > 2 else ""
    out = info.node.outputs[0]
    dt, y, x, pos = b.dtype(out), b.a(out), b.a(x_name), b.a(p_name)
    ff = operand(b, ff_name) if ff_name else None
    attrs = info.attrs
    d = b.types[x_name].shape[-1]
    rot = int(attrs["rotary_dims"]) or d
    neox = attrs["mode"] == "neox"
    factor = float(attrs["attn_factor"]) if attrs["scaling_type"] == "yarn" else 1.0

    def step() -> None:
        inv = rope_inv_freq(rot, attrs, None if ff is None else compute(*ff)).astype(np.float64)
        angle = pos.astype(np.float64)[..., :, None, None] * inv
        cos, sin = np.cos(angle) * factor, np.sin(angle) * factor
        xf = compute(x, dt).astype(np.float64)
        xr = xf[..., :rot]
        if neox:
            a, c = xr[..., :rot // 2], xr[..., rot // 2:]
            r = np.concatenate([a * cos - c * sin, a * sin + c * cos], axis=-1)
        else:
            a, c = xr[..., 0::2], xr[..., 1::2]
            r = np.stack([a * cos - c * sin, a * sin + c * cos], axis=-1).reshape(xr.shape)
        store(y, np.concatenate([r, xf[..., rot:]], axis=-1), dt)

    return [numpy_step(step)]


# --- Attention -----------------------------------------------------------------------------------------------
def _visible(seq: int, total: int, causal: bool, window: int, sinks: int) -> np.ndarray:
    p = (total - seq) + np.arange(seq)[:, None]
    j = np.arange(total)[None, :]
    keep = np.ones((seq, total), dtype=bool)
    if causal:
        keep &= j <= p
    if window > 0:
        keep &= (j > p - window) | (j < sinks)
    return keep


def attention(b: Bind, info: NodeInfo) -> list[Step]:
    node, at = info.node, info.attrs
    if node.name in b.exe.kv_layer:
        raise BackendError(f"[backend] node {node.name!r}: the cached attention needs float32 [seq, heads, dim] "
                           "tensors on this backend")
    ins = list(node.inputs) + [""] * (6 - len(node.inputs))
    dt = b.dtype(node.outputs[0])
    q, k, v = (b.a(n) for n in ins[:3])
    past = (b.a(ins[3]), b.a(ins[4])) if ins[3] else None
    mask = b.a(ins[5]) if ins[5] else None
    mask_dt = b.types[ins[5]].dtype if ins[5] else None
    outs = [b.a(n) if n else None for n in node.outputs]

    def step() -> None:
        kk = k if past is None else np.concatenate([past[0], k], axis=-3)
        vv = v if past is None else np.concatenate([past[1], v], axis=-3)
        group = q.shape[-2] // k.shape[-2]
        seq, total = q.shape[-3], kk.shape[-3]
        qh = np.swapaxes(compute(q, dt).astype(np.float64), -3, -2)
        kh = np.swapaxes(np.repeat(compute(kk, dt).astype(np.float64), group, axis=-2), -3, -2)
        vh = np.swapaxes(np.repeat(compute(vv, dt).astype(np.float64), group, axis=-2), -3, -2)
        s = (at["scale"] or 1.0 / math.sqrt(q.shape[-1])) * (qh @ np.swapaxes(kh, -1, -2))
        if at["softcap"] > 0:
            s = at["softcap"] * np.tanh(s / at["softcap"])
        keep = _visible(seq, total, at["causal"], at["sliding_window"], at["sinks"])
        if mask is not None:
            if mask_dt is DType.BOOL:
                keep = keep & mask
            else:
                s = s + compute(mask, mask_dt or DType.F32)
        s = np.where(keep, s, -np.inf)
        top = np.max(s, axis=-1, keepdims=True)
        p = np.exp(s - np.where(np.isfinite(top), top, 0.0))
        denom = np.sum(p, axis=-1, keepdims=True)
        p = np.divide(p, denom, out=np.zeros_like(p), where=denom > 0)
        store(outs[0], np.swapaxes(p @ vh, -3, -2), dt)  # type: ignore[arg-type]
        for o, src in zip(outs[1:], (kk, vv), strict=False):
            if o is not None:
                np.copyto(o, src)

    return [numpy_step(step)]


# --- mixture of experts ----------------------------------------------------------------------------------------
def moe_router(b: Bind, info: NodeInfo) -> list[Step]:
    x_name = info.node.inputs[0]
    logits, dt = b.a(x_name), b.types[x_name].dtype
    w_out, i_out = (b.a(n) for n in info.node.outputs)
    k, normalize, sigmoid = int(info.attrs["top_k"]), bool(info.attrs["normalize"]), info.attrs["scoring"] == "sigmoid"

    def step() -> None:
        x = compute(logits, dt).astype(np.float64)
        if sigmoid:
            scores = 1.0 / (1.0 + np.exp(-x))
        else:
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            scores = e / e.sum(axis=-1, keepdims=True)
        idx = np.argsort(-scores, axis=-1, kind="stable")[..., :k]
        w = np.take_along_axis(scores, idx, axis=-1)
        if normalize:
            w = w / w.sum(axis=-1, keepdims=True)
        w_out[...] = w
        i_out[...] = idx

    return [numpy_step(step)]


class _Bank:
    """One expert bank as per-expert packed weights (views of the bank's bytes, never dequantized whole)."""

    def __init__(self, b: Bind, name: str) -> None:
        t = b.exe.graph.tensor(name)
        if t.dtype not in DEQUANT_TYPES:
            raise BackendError(f"[backend] expert bank {name!r} has dtype {t.dtype.value}, which the GEMM does "
                               "not support")
        n_exp, rows, cols = (int(d) for d in t.shape)
        self.rows, self.cols = rows, cols
        try:
            raw = np.ascontiguousarray(b.weight(name).raw).reshape(-1).view(np.uint8)
        except UaiiError:
            if t.weight is None:
                raise
            # a bank stored as one tensor per expert: each expert through its own reference (#e=N)
            self.experts = [PackedWeight.from_raw(b.exe.acquire(str(t.weight.with_expert(e))), t.dtype, (rows, cols))
                            for e in range(n_exp)]
            return
        per = raw.size // n_exp
        self.experts = [PackedWeight.from_raw(raw[e * per:(e + 1) * per], t.dtype, (rows, cols))
                        for e in range(n_exp)]


def _gemm(pw: PackedWeight, x: np.ndarray, y: np.ndarray, mode: int, where: str) -> None:
    if pw.mlx is not None:  # an MLX-quantized expert (QuantizedMoEExperts): f32 activations, exact weights
        rc = lib.uk_mlx_gemm(*mlx_call(pw), NULL, fptr(x), x.shape[0], pw.k, fptr(y), pw.n)
        if rc:
            raise status_fail(where, rc)
        return
    rc = lib.uk_gemm(pw.kernel_type, pw.pointer(), pw.n, pw.k, fptr(x), x.shape[0], pw.k, fptr(y), pw.n, mode)
    if rc:
        raise status_fail(where, rc)


ExpertWeights = Callable[[int], tuple[PackedWeight, PackedWeight, PackedWeight]]
ExpertBatch = Callable[[list[int]], list[tuple[PackedWeight, PackedWeight, PackedWeight]] | None]


def expert_step(b: Bind, info: NodeInfo, ff: int, experts: ExpertWeights, where: str,
                experts_of: ExpertBatch | None = None) -> Step:
    """The expert loop of MoEExperts / MoEExpertsSwiGLU, for banks mapped whole (below) and for banks streamed
    through the expert cache (StreamingWeights): ``experts(e)`` gives expert e's (gate, up, down) weights, fetched
    only for the experts the router picked. Each picked expert runs once over all of its tokens. ``experts_of``,
    when given, fetches all the picked experts at once (streamed banks: the cache reads their misses in parallel
    instead of one expert's banks at a time between GEMMs) or says None when they do not fit together."""
    from uaii.kernels import glu

    node = info.node
    x_name, w_name, i_name = node.inputs[:3]
    out = node.outputs[0]
    dt, y = b.dtype(out), b.a(out)
    x, weights, indices = b.a(x_name), b.a(w_name), b.a(i_name)
    d = x.shape[-1]
    rows = max(x.size // d if d else 0, 1)
    xs, g, u, h = (b.scratch((rows, n)) for n in (d, ff, ff, d))
    act = info.attrs.get("activation", "silu")  # MoEExpertsSwiGLU admits silu only
    kind = "silu" if act == "silu" else "gelu"
    mode = b.gemm_mode(out)

    def step() -> None:
        x2 = compute(x, dt).reshape(-1, d)
        acc = np.zeros_like(x2, dtype=np.float32)
        idx = indices.reshape(x2.shape[0], -1)
        wts = weights.reshape(x2.shape[0], -1).astype(np.float32)
        picked = [int(e) for e in np.unique(idx)]
        together = experts_of(picked) if experts_of is not None else None
        for i, e in enumerate(picked):
            gate, up, down = together[i] if together is not None else experts(e)
            tok, slot = np.nonzero(idx == e)
            n = tok.size
            np.take(x2, tok, axis=0, out=xs[:n])
            _gemm(gate, xs[:n], g[:n], mode, where)
            _gemm(up, xs[:n], u[:n], mode, where)
            glu(g[:n], u[:n], kind, out=g[:n])
            _gemm(down, g[:n], h[:n], mode, where)
            np.add.at(acc, tok, h[:n] * wts[tok, slot][:, None])
        store(y, acc.reshape(y.shape), dt)

    return step


def expert_banks(info: NodeInfo, weights: Collection[str]) -> list[str]:
    """The expert banks a node reads: the inputs among ``weights`` that its schema reads by EXPERTS, in slot order
    (MoEExperts: gate, up, down)."""
    return [w.name for w in info.schema.weight_inputs(info.node, weights, info.attrs, access=WeightAccess.EXPERTS)]


def moe_experts(b: Bind, info: NodeInfo) -> list[Step]:
    banks = expert_banks(info, b.exe.weight_names)
    if len(banks) != 3:
        raise BackendError(f"[backend] node {info.node.name!r} ({info.node.op}): expected gate, up and down expert "
                           f"banks among its weights, found {banks}")
    gate, up, down = (b.exe.cached(("bank", n), lambda n=n: _Bank(b, n)) for n in banks)
    step = expert_step(b, info, gate.rows, lambda e: (gate.experts[e], up.experts[e], down.experts[e]),
                       "MoEExperts gemm")
    return [numpy_step(step)]


EXTRA: dict[str, Any] = {"RoPE": rope, "Attention": attention, "MoERouter": moe_router, "MoEExperts": moe_experts,
                         "MoEExpertsSwiGLU": moe_experts}

__all__ = ["EXTRA", "ExpertBatch", "ExpertWeights", "expert_banks", "expert_step"]

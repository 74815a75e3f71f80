"""Mixture-of-experts references: MoERouter and the expert FFN (MoEExperts, MoEExpertsSwiGLU).

Expert banks are [n_experts, rows, cols] with rows = output features (MatMul with transpose_b); block-quantized
banks arrive dequantized (float32).
"""

from __future__ import annotations

import numpy as np

from uaii.ir.reference._common import (
    Array,
    RefFn,
    f64,
    fail,
    float_out,
    gelu64,
    sigmoid64,
    silu64,
    softmax64,
    sorted_indices,
)


def moe_router(logits: Array, *, n_experts: int, top_k: int, normalize: bool = True,
               scoring: str = "softmax") -> tuple[Array, Array]:
    """scores = softmax(logits) (or sigmoid) over the last axis; indices = the top_k experts by score, best
    first, ties to the lower index; weights = their scores, divided by their sum when ``normalize``.

    This is HF mixtral / qwen3-moe (norm_topk_prob=True) with normalize, qwen2-moe (norm_topk_prob=False)
    without. Weights are float32, indices int64 (the evaluator casts to the declared index type).
    """
    if logits.shape[-1] != n_experts:
        fail("MoERouter", f"logits {list(logits.shape)} must end in n_experts = {n_experts}")
    if top_k > n_experts:
        fail("MoERouter", f"top_k {top_k} exceeds n_experts {n_experts}")
    z = f64(logits)
    scores = sigmoid64(z) if scoring == "sigmoid" else softmax64(z)
    idx = sorted_indices(scores, largest=True)[..., :top_k]
    w = np.take_along_axis(scores, idx, axis=-1)
    if normalize:
        w = w / np.sum(w, axis=-1, keepdims=True)
    return w.astype(np.float32), idx.astype(np.int64)


def _check_banks(op: str, d_model: int, gate: Array, up: Array, down: Array, n_experts: int) -> None:
    d_ff = gate.shape[1] if gate.ndim == 3 else -1
    if gate.shape != (n_experts, d_ff, d_model) or up.shape != gate.shape or down.shape != (n_experts, d_model,
                                                                                            d_ff):
        fail(op, f"banks gate {list(gate.shape)}, up {list(up.shape)}, down {list(down.shape)} must be "
                 f"[n_experts, d_ff, d_model] twice and [n_experts, d_model, d_ff] (n_experts = {n_experts}, "
                 f"d_model = {d_model})")


def moe_experts(x: Array, weights: Array, indices: Array, gate_exps: Array, up_exps: Array, down_exps: Array,
                *, n_experts: int, top_k: int, activation: str = "silu") -> Array:
    """Y[t] = sum_j weights[t, j] * down_e @ (act(gate_e @ X[t]) * (up_e @ X[t])), e = indices[t, j];
    act = silu, or gelu in its exact erf form with activation='gelu'.

    Computed expert by expert over the tokens routed to it; an expert chosen twice for one token counts twice.
    """
    op = "MoEExperts"
    d = x.shape[-1]
    _check_banks(op, d, gate_exps, up_exps, down_exps, n_experts)
    if weights.shape != (*x.shape[:-1], top_k) or indices.shape != weights.shape:
        fail(op, f"weights {list(weights.shape)} and indices {list(indices.shape)} must be "
                 f"{[*x.shape[:-1], top_k]}")
    xt, w, idx = f64(x).reshape(-1, d), f64(weights).reshape(-1, top_k), np.asarray(indices).reshape(-1, top_k)
    if np.any((idx < 0) | (idx >= n_experts)):
        fail(op, f"expert index outside [0, {n_experts})")
    act = silu64 if activation == "silu" else gelu64
    y = np.zeros_like(xt)
    for e in np.unique(idx):
        tokens, slot = np.nonzero(idx == e)
        h = xt[tokens]
        ff = act(h @ f64(gate_exps[e]).T) * (h @ f64(up_exps[e]).T)
        np.add.at(y, tokens, w[tokens, slot, None] * (ff @ f64(down_exps[e]).T))
    return float_out(y.reshape(x.shape), x)


def moe_experts_swiglu(x: Array, weights: Array, indices: Array, gate_exps: Array, up_exps: Array,
                       down_exps: Array, *, n_experts: int, top_k: int, activation: str = "silu") -> Array:
    """MoEExperts with activation = silu (the C++ runtime's name)."""
    return moe_experts(x, weights, indices, gate_exps, up_exps, down_exps, n_experts=n_experts, top_k=top_k,
                       activation=activation)


REFS: dict[str, RefFn] = {"MoERouter": moe_router, "MoEExperts": moe_experts,
                          "MoEExpertsSwiGLU": moe_experts_swiglu}

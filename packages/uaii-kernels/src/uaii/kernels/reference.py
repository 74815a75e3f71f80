"""Short NumPy references of every kernel: what the C paths are tested against (tests/kernels).

They favour clarity over speed and compute in float64 where that makes the reference exact enough to judge
float32 kernels. Quantized formats follow gguf-py (``gguf.quants``); MXFP4, which gguf 0.17.1 lacks, follows
ggml's dequantize_row_mxfp4.
"""

from __future__ import annotations

import math

import numpy as np

# --- formats --------------------------------------------------------------------------------------------------
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)  # e2m1, doubled


def dequantize_mxfp4(raw: np.ndarray) -> np.ndarray:
    """MXFP4 blocks (1 byte E8M0 exponent + 16 bytes of 4-bit E2M1 codes) to float32."""
    blocks = np.asarray(raw, dtype=np.uint8).reshape(-1, 17)
    e = blocks[:, :1].astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23)).astype(np.uint32)
    d = bits.view(np.float32)                                  # 0.5 * 2^(e - 127), as ggml_e8m0_to_fp32_half
    qs = blocks[:, 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
    return (d * MXFP4_VALUES[codes].astype(np.float32)).reshape(-1)


def matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y = x . w^T in float64, rounded to float32 (w already dequantized)."""
    return (np.asarray(x, np.float64) @ np.asarray(w, np.float64).T).astype(np.float32)


# --- normalization --------------------------------------------------------------------------------------------
def rms_norm(x: np.ndarray, w: np.ndarray | None = None, eps: float = 1e-6, add_one: bool = False) -> np.ndarray:
    x64 = np.asarray(x, np.float64)
    y = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    if w is not None:
        y = y * ((1.0 + w.astype(np.float64)) if add_one else w.astype(np.float64))
    return y.astype(np.float32)


def layer_norm(x: np.ndarray, w: np.ndarray | None = None, b: np.ndarray | None = None,
               eps: float = 1e-5) -> np.ndarray:
    x64 = np.asarray(x, np.float64)
    mu = x64.mean(axis=-1, keepdims=True)
    y = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y.astype(np.float32)


def softmax(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Softmax over the last axis; a row that is all -inf gives zeros."""
    z = np.asarray(x, np.float64) * scale
    mx = z.max(axis=-1, keepdims=True)
    finite = np.isfinite(mx)
    e = np.exp(z - np.where(finite, mx, 0.0))
    s = e.sum(axis=-1, keepdims=True)
    return np.where(finite, e / np.where(s == 0, 1, s), 0.0).astype(np.float32)


# --- activations ----------------------------------------------------------------------------------------------
def silu(x: np.ndarray) -> np.ndarray:
    x64 = np.asarray(x, np.float64)
    return (x64 / (1.0 + np.exp(-x64))).astype(np.float32)


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    x64 = np.asarray(x, np.float64)
    if approximate == "tanh":
        y = 0.5 * x64 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)))
    else:
        erf = np.vectorize(math.erf, otypes=[np.float64])
        y = 0.5 * x64 * (1.0 + erf(x64 / math.sqrt(2.0)))
    return y.astype(np.float32)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return (silu(gate).astype(np.float64) * up).astype(np.float32)


def geglu(gate: np.ndarray, up: np.ndarray, approximate: str = "none") -> np.ndarray:
    return (gelu(gate, approximate).astype(np.float64) * up).astype(np.float32)


# --- rotary embeddings ----------------------------------------------------------------------------------------
def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, neox: bool = False,
         attn_factor: float = 1.0) -> np.ndarray:
    """x [t, h, d]; rotates the first 2 * len(inv_freq) dims of each head."""
    x64 = np.asarray(x, np.float64)
    n_rot = 2 * len(inv_freq)
    ang = np.asarray(positions, np.float64)[:, None] * np.asarray(inv_freq, np.float64)[None, :]  # [t, n_rot/2]
    cos = (np.cos(ang) * attn_factor)[:, None, :]
    sin = (np.sin(ang) * attn_factor)[:, None, :]
    y = x64.copy()
    if neox:
        a, b = x64[..., : n_rot // 2], x64[..., n_rot // 2 : n_rot]
        y[..., : n_rot // 2] = a * cos - b * sin
        y[..., n_rot // 2 : n_rot] = a * sin + b * cos
    else:
        a, b = x64[..., 0:n_rot:2], x64[..., 1:n_rot:2]
        y[..., 0:n_rot:2] = a * cos - b * sin
        y[..., 1:n_rot:2] = a * sin + b * cos
    return y.astype(np.float32)


# --- attention ------------------------------------------------------------------------------------------------
def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray,
              scale: float, window: int = 0, n_sink: int = 0, softcap: float = 0.0,
              sinks: np.ndarray | None = None) -> np.ndarray:
    """q [t, hq, d], k [s, hkv, d], v [s, hkv, dv]: causal GQA attention by positions (see uk_attention)."""
    t, hq, _ = q.shape
    hkv = k.shape[1]
    qp = np.asarray(q_pos, np.int64)[:, None]
    kp = np.asarray(k_pos, np.int64)[None, :]
    visible = (kp >= 0) & (kp <= qp)
    if window > 0:
        visible &= (qp - kp < window) | (kp < n_sink)
    out = np.zeros((t, hq, v.shape[2]), np.float64)
    for h in range(hq):
        g = h // (hq // hkv)
        logits = (q[:, h, :].astype(np.float64) @ k[:, g, :].astype(np.float64).T) * scale      # [t, s]
        if softcap > 0:
            logits = softcap * np.tanh(logits / softcap)
        logits = np.where(visible, logits, -np.inf)
        mx = logits.max(axis=1, keepdims=True)
        if sinks is not None:
            mx = np.maximum(mx, float(sinks[h]))
        safe = np.where(np.isfinite(mx), mx, 0.0)
        p = np.where(visible, np.exp(logits - safe), 0.0)
        denom = p.sum(axis=1, keepdims=True)
        if sinks is not None:
            denom = denom + np.exp(float(sinks[h]) - safe)
        p = p / np.where(denom == 0, 1, denom)
        out[:, h, :] = p @ v[:, g, :].astype(np.float64)
    return out.astype(np.float32)


# --- routing and the rest -------------------------------------------------------------------------------------
def topk(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values of each row, descending (ties: the lower index first), and their indices."""
    idx = np.argsort(-np.asarray(x, np.float64), axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, idx, axis=-1), idx.astype(np.int64)


def argmax(x: np.ndarray) -> np.ndarray:
    return np.argmax(x, axis=-1)


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (np.asarray(a, np.float64) + b).astype(np.float32)


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (np.asarray(a, np.float64) * b).astype(np.float32)

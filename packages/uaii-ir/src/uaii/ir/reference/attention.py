"""RoPE and Attention references. Layout: ``[..., seq, heads, head_dim]`` for q, k, v, caches and outputs.

Positions: RoPE takes absolute positions as an input. Attention has no positions input: key j of the
concatenated cache (past_k then k) sits at position j, and query i sits at position ``past + i`` where
``past = past_k.shape[-3]`` (0 without a cache), so a prefill and a decode step that feeds ``present`` back as
``past`` see the same keys.
"""

from __future__ import annotations

import math

import numpy as np

from uaii.ir.reference._common import Array, RefFn, f64, fail, float_out


# --- RoPE ---------------------------------------------------------------------------------------------------
def _llama3(inv: Array, factor: float, original: int, low: float, high: float) -> Array:
    """HF ``_compute_llama3_parameters``: wavelengths beyond original/low are divided by factor, those below
    original/high kept, and the band between blended by smooth = (original / wavelen - low) / (high - low)."""
    wavelen = 2.0 * math.pi / inv
    smooth = (original / wavelen - low) / (high - low)
    blended = (1.0 - smooth) * inv / factor + smooth * inv
    out = np.where(wavelen > original / low, inv / factor, inv)
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return np.where(medium, blended, out)


def _yarn(inv: Array, rot: int, theta: float, factor: float, original: int, beta_fast: float,
          beta_slow: float) -> Array:
    """HF ``_compute_yarn_parameters`` (truncate=True): frequency index i < low extrapolates (keeps inv), i >
    high interpolates (inv / factor), and the correction range [low, high] between ramps linearly."""
    def corr(rotations: float) -> float:
        return rot * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), rot - 1)
    ramp = np.clip((np.arange(rot // 2) - low) / ((high - low) or 0.001), 0.0, 1.0)
    extrapolate = 1.0 - ramp
    return inv / factor * (1.0 - extrapolate) + inv * extrapolate


def rope_inv_freq(rot: int, theta: float, freq_factors: Array | None = None, *, scaling_type: str = "none",
                  factor: float = 1.0, original_max_position: int = 0, low_freq_factor: float = 1.0,
                  high_freq_factor: float = 4.0, beta_fast: float = 32.0, beta_slow: float = 1.0) -> Array:
    """The rot/2 angular frequencies: theta^(-2i/rot) / freq_factors[i], then the scaling scheme.

    freq_factors divide first (as ggml does), so llama3 bands are judged on the divided frequencies.
    'linear' divides every frequency by factor, which equals dividing positions by factor.
    """
    inv = theta ** (-np.arange(0, rot, 2, dtype=np.float64) / rot)
    if freq_factors is not None:
        if freq_factors.shape != inv.shape:
            fail("RoPE", f"freq_factors {list(freq_factors.shape)} must hold rotary_dims/2 = {len(inv)} values")
        inv = inv / f64(freq_factors)
    if scaling_type == "linear":
        return inv / factor
    if scaling_type == "llama3":
        return _llama3(inv, factor, original_max_position, low_freq_factor, high_freq_factor)
    if scaling_type == "yarn":
        return _yarn(inv, rot, theta, factor, original_max_position, beta_fast, beta_slow)
    return inv


def rope(x: Array, positions: Array, freq_factors: Array | None = None, *, mode: str = "normal",
         rotary_dims: int = 0, theta: float = 10000.0, scaling_type: str = "none", factor: float = 1.0,
         original_max_position: int = 0, low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
         beta_fast: float = 32.0, beta_slow: float = 1.0, attn_factor: float = 1.0) -> Array:
    """Rotate channel pairs (a, b) of each head by angle = position * inv_freq[i]:
    (a, b) → (a cos - b sin, a sin + b cos); pair i is (2i, 2i+1) in 'normal' mode and (i, i + rot/2) in
    'neox' mode. Channels from rotary_dims on pass through unchanged.

    positions [seq] or [..., seq] give each token's absolute position (broadcast over X's leading dims).
    With scaling_type 'yarn' the rotated channels are multiplied by attn_factor, which is the whole magnitude
    correction (HF's ``attention_factor``, 0.1 ln(factor) + 1 by default): the reference does not derive it.
    """
    d = x.shape[-1]
    rot = rotary_dims or d
    if rot % 2 or rot > d:
        fail("RoPE", f"rotary_dims {rot} must be even and at most head_dim {d}")
    if positions.shape[-1] != x.shape[-3]:
        fail("RoPE", f"positions {list(positions.shape)} must give one position per token of X {list(x.shape)}")
    inv = rope_inv_freq(rot, theta, freq_factors, scaling_type=scaling_type, factor=factor,
                        original_max_position=original_max_position, low_freq_factor=low_freq_factor,
                        high_freq_factor=high_freq_factor, beta_fast=beta_fast, beta_slow=beta_slow)
    angle = f64(positions)[..., :, None, None] * inv  # [..., seq, 1, rot/2]
    cos, sin = np.cos(angle), np.sin(angle)
    if scaling_type == "yarn":
        cos, sin = cos * attn_factor, sin * attn_factor
    xf = f64(x)
    xr = xf[..., :rot]
    if mode == "neox":
        a, b = xr[..., : rot // 2], xr[..., rot // 2:]
        out = np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    else:
        a, b = xr[..., 0::2], xr[..., 1::2]
        pairs = np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1)  # [..., rot/2, 2]
        out = pairs.reshape(*pairs.shape[:-2], rot)
    if out.shape != xr.shape:
        fail("RoPE", f"positions {list(positions.shape)} do not broadcast over X {list(x.shape)}")
    return float_out(np.concatenate([out, xf[..., rot:]], axis=-1), x)


# --- Attention ----------------------------------------------------------------------------------------------
def visible(seq: int, total: int, *, causal: bool = True, sliding_window: int = 0, sinks: int = 0) -> Array:
    """Bool [seq, total]: may query i (at position p = total - seq + i) see key j (at position j)?

    causal: j <= p. sliding_window w > 0: j > p - w, i.e. the w most recent positions up to p (HF
    ``sliding_window_overlay``: kv_idx > q_idx - sliding_window), except keys j < sinks, which stay visible
    whatever the window (they are still subject to causal). Without causal the window bounds only the past.
    """
    p = (total - seq) + np.arange(seq)[:, None]
    j = np.arange(total)[None, :]
    keep = np.ones((seq, total), dtype=bool)
    if causal:
        keep &= j <= p
    if sliding_window > 0:
        keep &= (j > p - sliding_window) | (j < sinks)
    return keep


def _heads_check(q: Array, k: Array, n_heads: int, n_kv_heads: int, head_dim: int) -> int:
    hq, hk = q.shape[-2], k.shape[-2]
    if hk == 0 or hq % hk:
        fail("Attention", f"q has {hq} heads, not a multiple of the {hk} kv heads")
    declared = {"n_heads": (n_heads, hq), "n_kv_heads": (n_kv_heads, hk), "head_dim": (head_dim, q.shape[-1])}
    for attr, (want, got) in declared.items():
        if want and want != got:
            fail("Attention", f"attribute {attr} = {want} but the tensors have {got}")
    return hq // hk


def attention(q: Array, k: Array, v: Array, past_k: Array | None = None, past_v: Array | None = None,
              mask: Array | None = None, *, causal: bool = True, n_heads: int = 0, n_kv_heads: int = 0,
              head_dim: int = 0, scale: float = 0.0, sliding_window: int = 0, sinks: int = 0,
              softcap: float = 0.0) -> tuple[Array, Array, Array]:
    """Y[..., i, h] = sum_j softmax_j(s[h, i, j]) V[..., j, h // g], g = n_heads / n_kv_heads, with
    K = concat(past_k, k), V = concat(past_v, v) along the sequence axis and

        s = scale * q[i, h] . K[j, h // g]      (scale 0 → 1 / sqrt(head_dim))
        s = softcap * tanh(s / softcap)          (softcap > 0; before the mask, as HF gemma2/3)
        s = s + mask (float)  |  s = -inf where not mask (bool, true = attend)
        s = -inf where not visible(...)         (causal, sliding window, sinks; see :func:`visible`)

    mask broadcasts to [..., n_heads, seq, total]. A query that sees no key at all gets Y = 0. Returns
    (Y, present_k, present_v); the caches are K and V in q's dtype.
    """
    if (past_k is None) != (past_v is None):
        fail("Attention", "past_k and past_v must be given together")
    group = _heads_check(q, k, n_heads, n_kv_heads, head_dim)
    big_k = k if past_k is None else np.concatenate([past_k, k], axis=-3)
    big_v = v if past_v is None else np.concatenate([past_v, v], axis=-3)
    seq, total = q.shape[-3], big_k.shape[-3]
    qh = np.swapaxes(f64(q), -3, -2)  # [..., H, seq, D]
    kh = np.swapaxes(np.repeat(f64(big_k), group, axis=-2), -3, -2)  # [..., H, total, D]
    vh = np.swapaxes(np.repeat(f64(big_v), group, axis=-2), -3, -2)
    s = (scale or 1.0 / math.sqrt(q.shape[-1])) * (qh @ np.swapaxes(kh, -1, -2))  # [..., H, seq, total]
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    keep = visible(seq, total, causal=causal, sliding_window=sliding_window, sinks=sinks)
    if mask is not None:
        if mask.dtype == np.bool_:
            keep = keep & mask
        else:
            s = s + f64(mask)
    s = np.where(keep, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    denom = np.sum(p, axis=-1, keepdims=True)
    p = np.divide(p, denom, out=np.zeros_like(p), where=denom > 0)
    y = np.swapaxes(p @ vh, -3, -2)  # [..., seq, H, Dv]
    return float_out(y, q), big_k.astype(q.dtype), big_v.astype(q.dtype)


REFS: dict[str, RefFn] = {"RoPE": rope, "Attention": attention}

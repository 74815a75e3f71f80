"""Operators for a runtime: each checks and prepares its arguments, then calls one C kernel (or numpy for the
trivial ones). Every function takes ``out=`` so that a decode step can run on preallocated buffers; ``out`` may be
the input for the elementwise and row operators (in place). Inputs are float32 with a contiguous last axis.
References: :mod:`uaii.kernels.reference`; tolerances: docs/kernels.md.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from uaii.kernels.native import KernelError, check, f32, ffi, lib, view_ptr

ACT = {"silu": 0, "gelu": 1, "gelu_erf": 1, "gelu_tanh": 2}


def _f32(x: np.ndarray, name: str, what: str) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise KernelError(f"[kernels] {what}: {name} must be a float32 numpy array, got "
                          f"{getattr(x, 'dtype', type(x).__name__)}")
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)


def _out(out: np.ndarray | None, shape: tuple[int, ...], what: str) -> np.ndarray:
    if out is None:
        return np.empty(shape, np.float32)
    if out.dtype != np.float32 or out.shape != shape or not out.flags.c_contiguous or not out.flags.writeable:
        raise KernelError(f"[kernels] {what}: out must be a writable C-contiguous float32 array of shape {shape}, "
                          f"got {out.dtype} {out.shape}")
    return out


def _vec(w: np.ndarray | None, n: int, name: str, what: str) -> Any:
    if w is None:
        return ffi.NULL
    w = _f32(w, name, what)
    if w.shape != (n,):
        raise KernelError(f"[kernels] {what}: {name} must have shape ({n},), got {w.shape}")
    return f32(w)


# --- normalization --------------------------------------------------------------------------------------------
def rms_norm(x: np.ndarray, w: np.ndarray | None = None, eps: float = 1e-6, *, add_one: bool = False,
             out: np.ndarray | None = None) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis; ``add_one`` scales by (1 + w), as Gemma stores it."""
    x = _f32(x, "x", "rms_norm")
    n = x.shape[-1]
    y = _out(out, x.shape, "rms_norm")
    wp = _vec(w, n, "w", "rms_norm")
    check(lib.uk_rmsnorm(f32(x), wp, f32(y), x.size // n, n, eps, int(add_one)), "rms_norm")
    return y


def layer_norm(x: np.ndarray, w: np.ndarray | None = None, b: np.ndarray | None = None, eps: float = 1e-5, *,
               out: np.ndarray | None = None) -> np.ndarray:
    x = _f32(x, "x", "layer_norm")
    n = x.shape[-1]
    y = _out(out, x.shape, "layer_norm")
    check(lib.uk_layernorm(f32(x), _vec(w, n, "w", "layer_norm"), _vec(b, n, "b", "layer_norm"), f32(y),
                           x.size // n, n, eps), "layer_norm")
    return y


def softmax(x: np.ndarray, scale: float = 1.0, *, out: np.ndarray | None = None) -> np.ndarray:
    """softmax(scale * x) over the last axis; a row that is all -inf gives zeros."""
    x = _f32(x, "x", "softmax")
    n = x.shape[-1]
    y = _out(out, x.shape, "softmax")
    check(lib.uk_softmax(f32(x), f32(y), x.size // n, n, scale), "softmax")
    return y


# --- activations ----------------------------------------------------------------------------------------------
def _act_kind(name: str) -> int:
    try:
        return ACT[name]
    except KeyError:
        raise KernelError(f"[kernels] unknown activation {name!r}; expected one of: {', '.join(ACT)}") from None


def silu(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    x = _f32(x, "x", "silu")
    y = _out(out, x.shape, "silu")
    check(lib.uk_act(0, f32(x), f32(y), x.size), "silu")
    return y


def gelu(x: np.ndarray, approximate: str = "none", *, out: np.ndarray | None = None) -> np.ndarray:
    """GELU with erf (``approximate="none"``) or the tanh approximation (``"tanh"``)."""
    x = _f32(x, "x", "gelu")
    y = _out(out, x.shape, "gelu")
    check(lib.uk_act(2 if approximate == "tanh" else 1, f32(x), f32(y), x.size), "gelu")
    return y


def _rows2d(a: np.ndarray, name: str, what: str) -> tuple[np.ndarray, int]:
    """A [rows, n] view with contiguous rows and a row stride (elements), accepting strided views of a fused
    tensor (e.g. gate = fused[:, :n], up = fused[:, n:])."""
    if not isinstance(a, np.ndarray) or a.dtype != np.float32:
        raise KernelError(f"[kernels] {what}: {name} must be a float32 numpy array")
    a2 = a.reshape(-1, a.shape[-1]) if a.ndim != 2 else a
    if a2.strides[1] != 4 or a2.strides[0] % 4 or a2.strides[0] < 4 * a2.shape[1]:
        a2 = np.ascontiguousarray(a2)
    if a2.shape[0] <= 1:
        a2 = np.ascontiguousarray(a2)
    return a2, a2.strides[0] // 4 if a2.shape[0] > 1 else a2.shape[1]


def glu(gate: np.ndarray, up: np.ndarray, activation: str = "silu", *, out: np.ndarray | None = None) -> np.ndarray:
    """act(gate) * up: SwiGLU with "silu", GeGLU with "gelu" / "gelu_tanh". gate and up may be column views of one
    fused [rows, 2n] projection output (no copy)."""
    kind = _act_kind(activation)
    if gate.shape != up.shape:
        raise KernelError(f"[kernels] glu: gate {gate.shape} and up {up.shape} differ")
    g2, gs = _rows2d(gate, "gate", "glu")
    u2, us = _rows2d(up, "up", "glu")
    y = _out(out, gate.shape, "glu")
    rows, n = g2.shape
    check(lib.uk_glu(kind, view_ptr(g2), gs, view_ptr(u2), us, f32(y), rows, n), "glu")
    return y


def swiglu(gate: np.ndarray, up: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return glu(gate, up, "silu", out=out)


def geglu(gate: np.ndarray, up: np.ndarray, approximate: str = "none", *,
          out: np.ndarray | None = None) -> np.ndarray:
    return glu(gate, up, "gelu_tanh" if approximate == "tanh" else "gelu", out=out)


# --- rotary embeddings ----------------------------------------------------------------------------------------
def rope_inv_freq(n_rot: int, base: float = 10000.0, *, scaling: str | None = None, factor: float = 1.0,
                  low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                  original_max_position: int = 8192, beta_fast: float = 32.0,
                  beta_slow: float = 1.0) -> np.ndarray:
    """Inverse frequencies (n_rot / 2 of them) with the frequency scaling folded in:
    None, "linear" (positions / factor), "llama3" (Llama 3.1's band-wise factor) or "yarn" (YaRN's ramp between
    interpolation and extrapolation; pair it with :func:`yarn_attn_factor`)."""
    inv = 1.0 / (base ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot))
    if scaling in (None, "none") or factor == 1.0:
        pass
    elif scaling == "linear":
        inv = inv / factor
    elif scaling == "llama3":
        low_wavelen = original_max_position / low_freq_factor
        high_wavelen = original_max_position / high_freq_factor
        wavelen = 2 * math.pi / inv
        smooth = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        mid = (1 - smooth) * inv / factor + smooth * inv
        inv = np.where(wavelen > low_wavelen, inv / factor, np.where(wavelen < high_wavelen, inv, mid))
    elif scaling == "yarn":
        def dim(rot: float) -> float:
            return n_rot * math.log(original_max_position / (rot * 2 * math.pi)) / (2 * math.log(base))
        lo, hi = max(math.floor(dim(beta_fast)), 0), min(math.ceil(dim(beta_slow)), n_rot // 2 - 1)
        ramp = np.clip((np.arange(n_rot // 2) - lo) / max(hi - lo, 1e-3), 0, 1)
        extrapolation = 1 - ramp
        inv = inv / factor * (1 - extrapolation) + inv * extrapolation
    else:
        raise KernelError(f"[kernels] unknown rope scaling {scaling!r}; expected none, linear, llama3 or yarn")
    return inv.astype(np.float32)


def yarn_attn_factor(factor: float) -> float:
    """YaRN's attention scale (applied to cos and sin): 0.1 ln(factor) + 1."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, *, neox: bool = False,
         attn_factor: float = 1.0, out: np.ndarray | None = None) -> np.ndarray:
    """Rotate x [t, heads, d] at ``positions`` [t]; the first 2 * len(inv_freq) dims of each head rotate (partial
    rotary dims), the rest pass through. neox: pairs (i, i + n_rot/2); else adjacent pairs. out=x rotates in place."""
    x = _f32(x, "x", "rope")
    if x.ndim != 3:
        raise KernelError(f"[kernels] rope: x must be [t, heads, d], got {x.shape}")
    t, h, d = x.shape
    pos = np.ascontiguousarray(positions, dtype=np.int32)
    inv = _f32(np.asarray(inv_freq), "inv_freq", "rope")
    if pos.shape != (t,):
        raise KernelError(f"[kernels] rope: positions must have shape ({t},), got {pos.shape}")
    n_rot = 2 * inv.size
    if n_rot > d:
        raise KernelError(f"[kernels] rope: {n_rot} rotary dims exceed the head size {d}")
    y = _out(out, x.shape, "rope")
    check(lib.uk_rope(f32(x), f32(y), t, h, d, n_rot, ffi.cast("int32_t *", ffi.from_buffer(pos)), f32(inv),
                      attn_factor, int(neox)), "rope")
    return y


# --- attention ------------------------------------------------------------------------------------------------
def _cache(a: np.ndarray, name: str, s: int, h: int, d: int) -> tuple[Any, int, int, int]:
    """(pointer, stride_s, stride_h, kv_type) for a cache view [s, h, d] with a contiguous last axis."""
    if a.dtype not in (np.float32, np.float16) or a.ndim != 3 or a.shape != (s, h, d):
        raise KernelError(f"[kernels] attention: {name} must be a float32/float16 [s, heads, d] = {(s, h, d)} array,"
                          f" got {a.dtype} {a.shape}")
    es = a.itemsize
    if a.strides[2] != es or a.strides[0] % es or a.strides[1] % es:
        raise KernelError(f"[kernels] attention: the last axis of {name} must be contiguous")
    p = view_ptr(a, "uint8_t *")
    return p, a.strides[0] // es, a.strides[1] // es, 1 if a.dtype == np.float16 else 0


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, q_pos: np.ndarray | None = None,
              k_pos: np.ndarray | None = None, scale: float | None = None, window: int = 0, n_sink: int = 0,
              softcap: float = 0.0, sinks: np.ndarray | None = None,
              out: np.ndarray | None = None) -> np.ndarray:
    """Causal GQA attention: q [t, hq, d] over a KV cache k [s, hkv, d], v [s, hkv, dv] (float32 or float16; any
    strides with a contiguous last axis, e.g. views of a larger ring buffer).

    q_pos / k_pos: absolute positions (default: keys 0..s-1, queries the last t of them); k_pos < 0 marks an empty
    slot. window > 0: a query sees keys less than ``window`` positions back, plus the first ``n_sink`` positions
    (attention sinks). softcap > 0: logits -> softcap * tanh(logits / softcap). sinks: per-head logits added to the
    softmax denominator (gpt-oss style). scale: default 1/sqrt(d)."""
    q = _f32(q, "q", "attention")
    if q.ndim != 3:
        raise KernelError(f"[kernels] attention: q must be [t, heads, d], got {q.shape}")
    t, hq, d = q.shape
    s, hkv = k.shape[0], k.shape[1]
    dv = v.shape[-1]
    if hkv <= 0 or hq % hkv:
        raise KernelError(f"[kernels] attention: {hq} query heads are not a multiple of {hkv} kv heads")
    if k.dtype != v.dtype:
        raise KernelError("[kernels] attention: k and v must have the same dtype")
    kp_, kss, ksh, kv_type = _cache(k, "k", s, hkv, d)
    vp_, vss, vsh, _ = _cache(v, "v", s, hkv, dv)
    qpos = np.ascontiguousarray(q_pos, dtype=np.int32) if q_pos is not None else None
    kpos = np.ascontiguousarray(k_pos, dtype=np.int32) if k_pos is not None else None
    if qpos is not None and qpos.shape != (t,):
        raise KernelError(f"[kernels] attention: q_pos must have shape ({t},)")
    if kpos is not None and kpos.shape != (s,):
        raise KernelError(f"[kernels] attention: k_pos must have shape ({s},)")
    sk = _vec(sinks, hq, "sinks", "attention")
    y = _out(out, (t, hq, dv), "attention")
    check(lib.uk_attention(
        f32(q), kp_, vp_, f32(y), t, s, hq, hkv, d, dv, kss, ksh, vss, vsh,
        ffi.cast("int32_t *", ffi.from_buffer(qpos)) if qpos is not None else ffi.NULL,
        ffi.cast("int32_t *", ffi.from_buffer(kpos)) if kpos is not None else ffi.NULL,
        1.0 / math.sqrt(d) if scale is None else scale, int(window), int(n_sink), float(softcap), sk, kv_type),
        "attention")
    return y


# --- the trivial ones: numpy ----------------------------------------------------------------------------------
def add(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """a + b with numpy broadcasting (float32)."""
    return np.add(a, b, out=out, dtype=np.float32)


def mul(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    return np.multiply(a, b, out=out, dtype=np.float32)


def topk(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values per row (last axis), descending, ties to the lower index, and their int64 indices —
    exact top-k for MoE routing."""
    if not 0 < k <= x.shape[-1]:
        raise KernelError(f"[kernels] topk: k = {k} must be in 1..{x.shape[-1]}")
    idx = np.argsort(-x, axis=-1, kind="stable")[..., :k].astype(np.int64)   # experts: small rows
    return np.take_along_axis(x, idx, axis=-1), idx


def argmax(x: np.ndarray) -> np.ndarray:
    """Index of the largest value per row (the first on ties)."""
    return np.argmax(x, axis=-1)

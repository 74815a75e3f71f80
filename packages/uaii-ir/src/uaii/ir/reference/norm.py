"""Normalization references: Softmax, LayerNorm, RMSNorm, in float64, rounded to X's dtype.

Norm weights may have another float dtype than X (f32 weights with f16 activations); the result has X's.
"""

from __future__ import annotations

import numpy as np

from uaii.ir.reference._common import Array, RefFn, f64, fail, float_out, softmax64


def softmax(x: Array, *, axis: int = -1) -> Array:
    """Y = exp(X - max X) / sum exp(X - max X) along ``axis``."""
    return float_out(softmax64(f64(x), axis), x)


def _check_param(op: str, p: Array, want: tuple[int, ...], what: str) -> None:
    if p.shape != want:
        fail(op, f"{what} has shape {list(p.shape)}; expected {list(want)} (the normalized dims of X)")


def layer_norm(x: Array, weight: Array, bias: Array | None = None, *, eps: float = 1e-5,
               axis: int = -1) -> Array:
    """Y = (X - mean) / sqrt(var + eps) * weight + bias over dims axis..last, var biased (divided by N)."""
    first = axis % x.ndim
    dims = tuple(range(first, x.ndim))
    _check_param("LayerNorm", weight, x.shape[first:], "weight")
    xf = f64(x)
    mean = xf.mean(axis=dims, keepdims=True)
    var = ((xf - mean) ** 2).mean(axis=dims, keepdims=True)
    y = (xf - mean) / np.sqrt(var + eps) * f64(weight)
    if bias is not None:
        _check_param("LayerNorm", bias, x.shape[first:], "bias")
        y = y + f64(bias)
    return float_out(y, x)


def rms_norm(x: Array, weight: Array, *, eps: float = 1e-6, add_unit_offset: bool = False) -> Array:
    """Y = X / sqrt(mean(X^2) + eps) * w over the last dim; w = weight, or 1 + weight with add_unit_offset.

    HF gemma computes (1 + weight) in float32 before scaling; here everything is float64, which differs from
    that only by float32 rounding.
    """
    _check_param("RMSNorm", weight, x.shape[-1:], "weight")
    xf = f64(x)
    w = f64(weight) + 1.0 if add_unit_offset else f64(weight)
    return float_out(xf / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + eps) * w, x)


REFS: dict[str, RefFn] = {"Softmax": softmax, "LayerNorm": layer_norm, "RMSNorm": rms_norm}

"""Accuracy of the c-q8dot path (or c-precise's) against the f32 path, per weight type (the table in docs/kernels.md).

For each type a random weight (values spread like real weights: gaussian, a few outliers) is quantized with our
quantizer where we have one (else random blocks), and x . W^T from c-q8dot is compared with the exact product of
the dequantized weight (f64). The error is the activation quantization's: W itself is the same for both.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from uaii.ir.dtype import DType
from uaii.kernels.gemm import PackedWeight, gemm_path, get_gemm
from uaii.kernels.quant import QUANT_TYPES, quantize
from uaii.kernels.testing import random_weight


class Accuracy(NamedTuple):
    dtype: DType
    path: str
    max_rel: float     # max |y - ref| / max |ref| over the outputs of a row, worst row
    mean_rel: float    # mean |y - ref| / mean |ref|


def _weight(dt: DType, n: int, k: int, rng: np.random.Generator) -> PackedWeight:
    if dt in QUANT_TYPES:
        w = rng.standard_normal((n, k)).astype(np.float32) * 0.02
        w[rng.random((n, k)) < 1e-3] *= 20                      # outliers, as real weights have
        return PackedWeight.from_raw(quantize(w, dt), dt, (n, k))
    return PackedWeight.from_raw(random_weight(dt, n, k, seed=1), dt, (n, k))


def gemm_accuracy(dt: DType, *, n: int = 256, k: int = 2048, m: int = 16, seed: int = 0,
                  precise: bool = False) -> Accuracy:
    """``precise``: measure c-precise (16-bit activations for Q8_0) instead of c-q8dot."""
    provider = get_gemm("c-precise" if precise else "c-q8dot")
    rng = np.random.default_rng(seed)
    w = _weight(dt, n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, rng.random(k) < 0.01] *= 10                            # activation outliers (as after a norm)
    ref = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    worst, means = 0.0, []
    for rows in (1, m):                                         # the GEMV and the GEMM kernels
        y = provider.gemm(x[:rows], w).astype(np.float64)
        err = np.abs(y - ref[:rows])
        worst = max(worst, float((err.max(axis=1) / np.abs(ref[:rows]).max(axis=1)).max()))
        means.append(float(err.mean() / np.abs(ref[:rows]).mean()))
    return Accuracy(dt, gemm_path(dt, precise=precise), worst, float(np.mean(means)))

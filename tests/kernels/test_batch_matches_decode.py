"""A batch of activation rows (prefill: the tile kernels) gives, row for row, the bits of one row at a time (decode:
the GEMV kernels), for every weight type on every ISA.

Why bits and not a tolerance: a model quantizes each layer's activations to 8 bits, so a last-bit difference in one
layer's output moves some value across a rounding boundary of the next layer's quantizer, and that difference grows
layer by layer. Kernels that agreed to 4e-7 (float summation order) made SmolLM2's and Gemma-3's logits of the same
position differ by up to 1.1 between batched prefill and token-by-token decode (tests/runtime/
test_prefill_decode_agree.py); the same math in the same order gives identical logits.
"""

from __future__ import annotations

import numpy as np
import pytest

import uaii.kernels as K
from uaii.ir.dtype import DType
from uaii.kernels.testing import random_weight

TYPES = sorted(K.DEQUANT_TYPES, key=lambda d: d.value)
# 32-value types: 1-3 blocks past a group of 4 (the wide GEMV) and 1-7 past a group of 8 (the 256-bit GEMV)
K32 = (32, 96, 160, 256, 576, 640, 736, 1056)   # 1056: past the 1024-value rows of Q5_0's wide GEMV
K256 = (256, 768)


def _check(dt: DType, k: int, rng: np.random.Generator, mode: str) -> None:
    n = 37                                     # chunks of 16 rows and row groups of 4, with remainders
    w = K.PackedWeight.from_raw(random_weight(dt, n, k, seed=k), dt, (n, k))
    x = rng.standard_normal((40, k)).astype(np.float32)
    x[:, rng.random(k) < 0.02] *= 30           # outliers: large block scales next to small ones
    x[3, : min(k, 64)] = 0.0                   # all-zero blocks (scale 0)
    g = K.get_gemm(mode)
    # 16 and more: the row-lane batches of Q4_0/Q5_0 (tiles of 16 activation rows; 21 and 40: a padded last tile)
    for m in (4, 5, 9, 16, 21, 40):
        batch = g.gemm(x[:m], w)
        rows = np.concatenate([g.gemm(x[j:j + 1], w) for j in range(m)])
        np.testing.assert_array_equal(batch, rows, err_msg=f"{dt.value} k={k} m={m} {mode}")


@pytest.mark.parametrize("dt", TYPES, ids=lambda d: d.value)
def test_batch_rows_equal_decode_rows(dt: DType, isa: str, rng: np.random.Generator) -> None:
    for k in (K256 if dt.block_size == 256 else K32):
        _check(dt, k, rng, "c-q8dot")


@pytest.mark.parametrize("dt", [DType.Q4_K, DType.Q8_0, DType.F16], ids=lambda d: d.value)
def test_exact_mode_batch_rows_equal_decode_rows(dt: DType, isa: str, rng: np.random.Generator) -> None:
    _check(dt, 512, rng, "c-f32")


@pytest.mark.parametrize("dt", [DType.Q8_0, DType.Q4_K], ids=lambda d: d.value)
def test_precise_mode_batch_rows_equal_decode_rows(dt: DType, isa: str, rng: np.random.Generator) -> None:
    """Mode 2 (c-precise: Q8_0's 16-bit activations, mode 0 for the others) keeps the guarantee."""
    for k in (K256 if dt.block_size == 256 else K32):
        _check(dt, k, rng, "c-precise")


@pytest.mark.parametrize(("dt", "m"), [(DType.Q6_K, 6), (DType.Q5_0, 40), (DType.Q4_0, 40)], ids=str)
def test_batch_rows_equal_decode_rows_with_threads(dt: DType, m: int, rng: np.random.Generator) -> None:
    """Rows are split between threads, never a row's sum: the thread count changes nothing (Q5_0/Q4_0 at 40 rows:
    the tasks lay the activation rows out into shared tiles of 16 together)."""
    k = 768 if dt.block_size == 256 else 640
    w = K.PackedWeight.from_raw(random_weight(dt, 300, k, seed=2), dt, (300, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    with K.num_threads(1):
        rows = np.concatenate([K.matmul(x[j:j + 1], w) for j in range(m)])
    for n in (2, 3):
        with K.num_threads(n):
            np.testing.assert_array_equal(K.matmul(x, w), rows)

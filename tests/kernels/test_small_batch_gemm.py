"""Small batches (2-8 rows: one batched decode step of several sequences) read each weight block once for all rows,
and still give every row the bits of that row alone, whatever the row count and the thread count.

Why bits: the runtime decodes several sequences in one forward pass (uaii.backends KVBatch) and promises each the
output it would get alone; a model amplifies any last-bit difference through its activation quantizers (see
test_batch_matches_decode.py). Their cost is a benchmark, not a test: `make bench-kernels` prints it per row count
(the 16-bit-activation tile of the Q8_0 output projection once ran a 4-row call ~8x slower than one row).
"""

from __future__ import annotations

import numpy as np
import pytest

import uaii.kernels as K
from uaii.ir.dtype import DType
from uaii.kernels.testing import random_weight

TYPES = sorted(K.DEQUANT_TYPES, key=lambda d: d.value)
MODES = ("c-q8dot", "c-f32", "c-precise")
K32 = (224, 512, 576, 736)     # 7, 16, 18 and 23 blocks: odd, past groups of 4 and of 8; Q4_1's 16-block groups
                               # whole, with the 2-block tail that pairs weight rows (x86_q41x16.inc), and longer
K256 = (768,)                  # 3 super-blocks


def _rows(dt: DType, k: int, mode: str, rng: np.random.Generator) -> None:
    n = 45                                     # chunks and row groups of 4 with remainders
    w = K.PackedWeight.from_raw(random_weight(dt, n, k, seed=k + 7), dt, (n, k))
    wide = rng.standard_normal((9, k + 40)).astype(np.float32)
    wide[:, : k][:, rng.random(k) < 0.02] *= 30     # outliers: large block scales next to small ones
    wide[4, : min(k, 64)] = 0.0                     # all-zero blocks (scale 0)
    x = wide[:, :k]                                 # ldx = k + 40 > k
    g = K.get_gemm(mode)
    with K.num_threads(1):
        alone = np.concatenate([g.gemm(x[j:j + 1], w) for j in range(9)])
    for threads in (1, 2):
        with K.num_threads(threads):
            for m in range(1, 10):
                got = g.gemm(x[:m], w)
                np.testing.assert_array_equal(got, alone[:m], err_msg=f"{dt.value} k={k} m={m} {mode} t={threads}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dt", TYPES, ids=lambda d: d.value)
def test_each_row_of_a_small_batch_equals_the_row_alone(dt: DType, mode: str, isa: str,
                                                         rng: np.random.Generator) -> None:
    if not K.get_gemm(mode).supports(dt):
        pytest.skip(f"{mode} does not take {dt.value}")
    for k in (K256 if dt.block_size == 256 else K32):
        _rows(dt, k, mode, rng)


def test_simd_small_batches_match_scalar(rng: np.random.Generator) -> None:
    """The SIMD tiles of every row count against the scalar reference: mode 2 Q8_0 bit for bit (one summation order
    on every ISA, tile16_q8_0_ref), the 8-bit types to the float-order tolerance of test_gemm.py."""
    cases = ((DType.Q8_0, "c-precise", 736), (DType.Q4_1, "c-q8dot", 736), (DType.Q4_0, "c-q8dot", 736),
             (DType.Q5_0, "c-q8dot", 736), (DType.Q4_K, "c-q8dot", 768),
             (DType.Q4_1, "c-q8dot", 512), (DType.Q4_1, "c-q8dot", 1056),   # 16 blocks; 2 x 16 + 1 (x86_gemv512)
             (DType.Q4_1, "c-q8dot", 544), (DType.Q4_1, "c-q8dot", 576))    # 16 + 1, 16 + 2: tails of 2 weight rows
    for dt, mode, k in cases:
        w = K.PackedWeight.from_raw(random_weight(dt, 37, k, seed=3), dt, (37, k))
        x = rng.standard_normal((8, k)).astype(np.float32)
        with K.use_isa("scalar"):
            ref = K.get_gemm(mode).gemm(x, w)
        for isa in K.available_isas():
            with K.use_isa(isa):
                for m in (2, 3, 4, 5, 8):
                    got, msg = K.get_gemm(mode).gemm(x[:m], w), f"{dt.value} {isa} m={m}"
                    if mode == "c-precise":
                        np.testing.assert_array_equal(got, ref[:m], err_msg=msg)
                    else:
                        np.testing.assert_allclose(got, ref[:m], rtol=2e-5, atol=2e-5 * np.abs(ref).max(),
                                                   err_msg=msg)

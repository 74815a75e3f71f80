"""Q8_0 weights against 16-bit activations (c-q8dot's path for Q8_0): the quantizer's format, the error it leaves,
and the same bits on every ISA, decode rows and batches alike.

Why 16 bits for Q8_0: its weights carry 8 bits, so 8-bit activations were the larger error of the product (~1e-2
relative), which made SmolLM2's tied Q8_0 output projection the main source of its KL divergence from the exact
model. Why bits on every ISA: the kernels define one float summation order (tile16_q8_0_ref), and a model amplifies
any last-bit difference through its activation quantizers (see test_batch_matches_decode.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import uaii.kernels as K
from uaii.ir.dtype import DType
from uaii.kernels.accuracy import gemm_accuracy
from uaii.kernels.testing import random_weight

# rows of 1-7 blocks past the last group of 8, exact groups of 8, and the models' widths (576, 640, 2048)
K32 = (32, 96, 160, 224, 256, 288, 576, 640, 736, 2048)


def _q16_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The documented format in numpy: q = round-half-even(x * (32767 / amax)) in float32, d = amax / 32767."""
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(32767) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(blocks * inv[:, None]).astype(np.int16).reshape(-1)
    return q, (amax / np.float32(32767)).astype(np.float32)


def _activations(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, rng.random(k) < 0.02] *= 30           # outliers: large block scales next to small ones
    x[min(3, m - 1), : min(k, 64)] = 0.0       # all-zero blocks (scale 0)
    return x


def test_quantize_activations16_format(isa: str, rng: np.random.Generator) -> None:
    x = _activations(rng, 5, 640)
    x[1, 5] = 0.5 / 32767 * np.abs(x[1, :32]).max()     # near a rounding tie
    q, d = K.quantize_activations16(x)
    eq, ed = _q16_reference(x)
    np.testing.assert_array_equal(q, eq)
    np.testing.assert_array_equal(d, ed)
    assert np.abs(q).max() == 32767
    with pytest.raises(K.KernelError, match="multiple of 32"):
        K.quantize_activations16(np.zeros(33, np.float32))


def test_q8_0_uses_16bit_activations() -> None:
    assert K.gemm_path("q8_0") == "int16-dot"
    assert K.gemm_path("q4_0") == "int8-dot"


def test_q8_0_same_bits_on_every_isa(isa: str, rng: np.random.Generator) -> None:
    """Decode rows (1-3 activation rows) and batches: every ISA gives the scalar reference's bits."""
    for k in K32:
        w = K.PackedWeight.from_raw(random_weight(DType.Q8_0, 37, k, seed=k), DType.Q8_0, (37, k))
        x = _activations(rng, 9, k)
        for m in (1, 2, 3, 4, 9):
            with K.use_isa("scalar"):
                expected = K.matmul(x[:m], w)
            np.testing.assert_array_equal(K.matmul(x[:m], w), expected, err_msg=f"k={k} m={m}")


def test_q8_0_error_is_that_of_16bit_activations(isa: str) -> None:
    """Against the exact product of the dequantized weight, decode and batch kernels: ~1e-4 (8-bit activations
    left 1.3e-2 max / 8.8e-3 mean; the accuracy table of docs/kernels.md)."""
    acc = gemm_accuracy(DType.Q8_0)
    assert acc.path == "int16-dot"
    assert acc.max_rel < 3e-4 and acc.mean_rel < 1e-4, acc


def test_q8_0_extreme_weights_do_not_overflow(rng: np.random.Generator) -> None:
    """-128 bytes (which the quantizer never writes, a file may) against full-scale activations of the same sign:
    32 * 128 * 32767 per block stays inside int32, so the result is exact up to the float scale."""
    k = 512
    raw = np.zeros((4, k // 32, 34), np.uint8)
    raw[:, :, :2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    raw[:, :, 2:] = 0x80                                 # every weight -128
    w = K.PackedWeight.from_raw(raw.reshape(-1), DType.Q8_0, (4, k))
    x = -np.ones((2, k), np.float32)
    np.testing.assert_array_equal(K.matmul(x, w), np.full((2, 4), 128.0 * k, np.float32))

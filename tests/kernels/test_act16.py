"""Q8_0 weights against 16-bit activations (uk_gemm mode 2, the ``c-precise`` provider): the quantizer's format,
the error it leaves, the same bits on every ISA, decode rows and batches alike; and mode 0 (c-q8dot) keeping 8-bit
activations for Q8_0.

Why 16 bits for Q8_0: its weights carry 8 bits, so 8-bit activations were the larger error of the product (~1e-2
relative), which made SmolLM2's tied Q8_0 output projection the main source of its KL divergence from the exact
model. Why only on request (mode 2): the 16-bit batches run ~2.5x slower than the 8-bit ones, which a model quantized
to Q8_0 throughout would pay on every prefill; the CPU backend asks for mode 2 on the output MatMul only (the logits,
one row per generated token). Why bits on every ISA: the kernels define one float summation order
(tile16_q8_0_ref), and a model amplifies any last-bit difference through its activation quantizers (see
test_batch_matches_decode.py).
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


def test_q8_0_uses_16bit_activations_only_when_precise() -> None:
    assert K.gemm_path("q8_0") == "int8-dot"
    assert K.gemm_path("q8_0", precise=True) == "int16-dot"
    assert K.gemm_path("q4_0", precise=True) == "int8-dot"
    assert K.gemm_path("f16", precise=True) == "float"
    assert "c-precise" in K.gemm_providers()


def test_q8_0_same_bits_on_every_isa(isa: str, rng: np.random.Generator) -> None:
    """Mode 2, decode rows (1-3 activation rows) and batches: every ISA gives the scalar reference's bits, and a row
    gives the same bits alone as in a batch."""
    for k in K32:
        w = K.PackedWeight.from_raw(random_weight(DType.Q8_0, 37, k, seed=k), DType.Q8_0, (37, k))
        x = _activations(rng, 9, k)
        with K.use_isa("scalar"):
            rows = np.concatenate([K.matmul(x[j:j + 1], w, provider="c-precise") for j in range(9)])
        for m in (1, 2, 3, 4, 9):
            np.testing.assert_array_equal(K.matmul(x[:m], w, provider="c-precise"), rows[:m], err_msg=f"k={k} m={m}")


@pytest.mark.parametrize("k", (8192, 8224))
def test_q8_0_same_bits_at_every_pass_and_width(k: int, isa: str, rng: np.random.Generator) -> None:
    """The AVX-512 tile16 rearranges up to 4 activation rows of at most 8192 values on the stack (x86_act16.inc):
    batches of 5-8 rows run as passes of 3-4 rows, and wider rows take the t16_row kernel; both sides of each limit
    give the scalar reference's bits."""
    w = K.PackedWeight.from_raw(random_weight(DType.Q8_0, 19, k, seed=k), DType.Q8_0, (19, k))
    x = _activations(rng, 8, k)
    with K.use_isa("scalar"):
        rows = np.concatenate([K.matmul(x[j:j + 1], w, provider="c-precise") for j in range(8)])
    for m in range(1, 9):
        np.testing.assert_array_equal(K.matmul(x[:m], w, provider="c-precise"), rows[:m], err_msg=f"k={k} m={m}")


def test_q8_0_precise_bits_do_not_depend_on_threads(rng: np.random.Generator) -> None:
    w = K.PackedWeight.from_raw(random_weight(DType.Q8_0, 300, 640, seed=5), DType.Q8_0, (300, 640))
    x = _activations(rng, 6, 640)
    with K.num_threads(1):
        rows = np.concatenate([K.matmul(x[j:j + 1], w, provider="c-precise") for j in range(6)])
    for n in (2, 3):
        with K.num_threads(n):
            np.testing.assert_array_equal(K.matmul(x, w, provider="c-precise"), rows)


def test_q8_0_error_is_that_of_16bit_activations(isa: str) -> None:
    """Against the exact product of the dequantized weight, decode and batch kernels: ~1e-4 in mode 2, ~1e-2 in
    mode 0 (the accuracy table of docs/kernels.md)."""
    acc = gemm_accuracy(DType.Q8_0, precise=True)
    assert acc.path == "int16-dot"
    assert acc.max_rel < 3e-4 and acc.mean_rel < 1e-4, acc
    fast = gemm_accuracy(DType.Q8_0)
    assert fast.path == "int8-dot"
    assert fast.mean_rel > 20 * acc.mean_rel, (fast, acc)


def _int8_product(x: np.ndarray, w: K.PackedWeight) -> np.ndarray:
    """x . W^T as the 8-bit path computes it, in float64: per block the int dot of the weight bytes and the int8
    activations (K.quantize_activations) times both scales. Mode 0 may only differ from it by float rounding."""
    raw = w.data.reshape(w.n, w.k // 32, 34)
    wd = raw[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float64)                      # [n, nb]
    wq = raw[:, :, 2:].view(np.int8).astype(np.int64)                                          # [n, nb, 32]
    out = np.empty((x.shape[0], w.n))
    for j, row in enumerate(x):
        q, d, _ = K.quantize_activations(row)
        isum = np.einsum("nbl,bl->nb", wq, q.reshape(-1, 32).astype(np.int64))
        out[j] = (isum * wd * d.astype(np.float64)).sum(axis=1)
    return out


def test_q8_0_mode_0_keeps_8bit_activations(isa: str, rng: np.random.Generator) -> None:
    """c-q8dot on Q8_0 is the 8-bit product (the speed of the int8 kernels), decode rows and batches; the 16-bit one
    is measurably different, so the test tells them apart."""
    k = 640
    w = K.PackedWeight.from_raw(random_weight(DType.Q8_0, 37, k, seed=7), DType.Q8_0, (37, k))
    x = _activations(rng, 9, k)
    ref = _int8_product(x, w)
    scale = np.abs(ref).max()
    for m in (1, 9):
        fast = K.matmul(x[:m], w).astype(np.float64)
        assert np.abs(fast - ref[:m]).max() < 1e-5 * scale
    precise = K.matmul(x, w, provider="c-precise").astype(np.float64)
    assert np.abs(precise - ref).max() > 1e-3 * scale


@pytest.mark.parametrize("dt", sorted(K.DEQUANT_TYPES - {DType.Q8_0}, key=lambda d: d.value), ids=lambda d: d.value)
def test_precise_is_mode_0_for_other_types(dt: DType, rng: np.random.Generator) -> None:
    """Mode 2 changes only the types with a 16-bit kernel: every other type gives mode 0's bits."""
    k = 512
    w = K.PackedWeight.from_raw(random_weight(dt, 37, k, seed=3), dt, (37, k))
    x = _activations(rng, 5, k)
    for m in (1, 5):
        np.testing.assert_array_equal(K.matmul(x[:m], w, provider="c-precise"), K.matmul(x[:m], w))


def test_q8_0_extreme_weights_do_not_overflow(rng: np.random.Generator) -> None:
    """-128 bytes (which the quantizer never writes, a file may) against full-scale activations of the same sign:
    32 * 128 * 32767 per block stays inside int32, so the result is exact up to the float scale."""
    k = 512
    raw = np.zeros((4, k // 32, 34), np.uint8)
    raw[:, :, :2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    raw[:, :, 2:] = 0x80                                 # every weight -128
    w = K.PackedWeight.from_raw(raw.reshape(-1), DType.Q8_0, (4, k))
    x = -np.ones((2, k), np.float32)
    np.testing.assert_array_equal(K.matmul(x, w, provider="c-precise"), np.full((2, 4), 128.0 * k, np.float32))


def test_unknown_gemm_mode_is_an_argument_error() -> None:
    """uk_gemm has modes 0, 1 and 2; any other is refused (UK_E_ARG), even for an empty product."""
    from uaii.kernels.native import f32, lib

    raw = random_weight(DType.Q8_0, 4, 64, seed=1)
    w = K.PackedWeight.from_raw(raw, DType.Q8_0, (4, 64))
    x, y = np.ones((1, 64), np.float32), np.empty((1, 4), np.float32)
    for mode, n in ((3, 4), (-1, 4), (3, 0)):
        assert lib.uk_gemm(8, w.pointer(), n, 64, f32(x), 1, 64, f32(y), 4, mode) == -2
    assert lib.uk_gemm_path_mode(8, 3) == 0

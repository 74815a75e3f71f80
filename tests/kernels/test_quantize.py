"""Quantization: byte-exact with gguf-py where it implements the type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16, BF16);
Q4_K and Q6_K (not in gguf 0.17.1) by round-trip error bounds and the properties of their grids."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import uaii.kernels as K
from uaii.ir.dtype import DType


def _data(rng: np.random.Generator, rows: int = 48, cols: int = 512) -> np.ndarray:
    x = rng.standard_normal((rows, cols)) * rng.choice([1e-4, 1e-2, 1.0, 300.0], (rows, 1))
    x[0] = 0.0                                     # an all-zero row
    x[1, :64] = 2.5                                # constant blocks
    x[2, ::7] = 0.0
    x[3] = np.abs(x[3])                            # min > 0: Q4_1/Q5_1 minimum above zero
    x[4, :32] = np.float32(1.0) * np.arange(32)    # exact grid values
    return x.astype(np.float32)


@pytest.mark.parametrize("dt", [DType.Q8_0, DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.F16,
                                DType.BF16], ids=lambda d: d.value)
def test_matches_gguf(dt: DType, rng: np.random.Generator) -> None:
    x = _data(rng)
    expected = np.asarray(gguf.quants.quantize(x, gguf.GGMLQuantizationType(dt.gguf_id))).reshape(-1).view(np.uint8)
    got = K.quantize(x, dt)
    assert got.dtype == np.uint8 and got.size == dt.nbytes(x.size)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dt, rms_bound, max_bound", [(DType.Q4_K, 0.09, 0.25), (DType.Q6_K, 0.025, 0.06)],
                         ids=["q4_k", "q6_k"])
def test_k_quants_round_trip(dt: DType, rms_bound: float, max_bound: float, rng: np.random.Generator) -> None:
    # gaussian rows of various scales (not below ~1e-2: the float16 super-block scales would turn subnormal)
    x = (rng.standard_normal((32, 1024)) * rng.choice([1e-2, 1.0, 300.0], (32, 1))).astype(np.float32)
    y = K.dequantize(K.quantize(x, dt), dt, x.size).reshape(x.shape)
    rms = np.linalg.norm(y - x, axis=1) / np.linalg.norm(x, axis=1)
    worst = np.abs(y - x).max(axis=1) / np.abs(x).max(axis=1)
    assert rms.max() < rms_bound, rms.max()
    assert worst.max() < max_bound, worst.max()


@pytest.mark.parametrize("dt", [DType.Q4_K, DType.Q6_K], ids=lambda d: d.value)
def test_k_quants_properties(dt: DType, rng: np.random.Generator) -> None:
    x = _data(rng, rows=16, cols=512)
    q = K.quantize(x, dt)
    y = K.dequantize(q, dt, x.size).reshape(x.shape)
    np.testing.assert_array_equal(y[0], 0.0)                        # zeros stay zeros
    assert np.all(np.isfinite(y))
    # dequantize(quantize(.)) is (nearly) a projection: quantizing its output again changes almost nothing
    y2 = K.dequantize(K.quantize(y, dt), dt, y.size).reshape(y.shape)
    err1 = np.linalg.norm(y - x, axis=1)
    err2 = np.linalg.norm(y2 - y, axis=1)
    assert np.all(err2 <= 0.5 * err1 + 1e-30)


def test_quantize_rejects_other_types() -> None:
    from uaii.ir.errors import UnsupportedDType

    with pytest.raises(UnsupportedDType, match="q2_k"):
        K.quantize(np.zeros(256, np.float32), "q2_k")
    with pytest.raises(Exception, match="whole number of blocks"):
        K.quantize(np.zeros(33, np.float32), "q8_0")


def test_quantize_activations_format(rng: np.random.Generator) -> None:
    x = rng.standard_normal(256).astype(np.float32)
    q, d, s = K.quantize_activations(x)
    blocks = x.reshape(-1, 32)
    np.testing.assert_allclose(d, np.abs(blocks).max(axis=1) / 127, rtol=1e-7)
    np.testing.assert_array_equal(q.reshape(-1, 32), np.rint(blocks * (127 / np.abs(blocks).max(axis=1,
                                                                     keepdims=True))).astype(np.int8))
    np.testing.assert_allclose(s, d * q.reshape(-1, 32).sum(axis=1), rtol=1e-6)

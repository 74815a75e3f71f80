"""Dequantization: bit-exact with gguf-py (MXFP4: with ggml's definition) on random blocks, on every ISA."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import uaii.kernels as K
from uaii.ir.dtype import DType
from uaii.ir.errors import UnsupportedDType
from uaii.kernels import reference
from uaii.kernels.testing import random_blocks

TYPES = sorted(K.DEQUANT_TYPES, key=lambda d: d.value)


def gguf_dequantize(blocks: np.ndarray, dt: DType) -> np.ndarray:
    if dt is DType.MXFP4:                                     # gguf 0.17.1 has no MXFP4
        return reference.dequantize_mxfp4(blocks)
    raw = np.ascontiguousarray(blocks).reshape(1, -1)
    return np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(dt.gguf_id)), np.float32).reshape(-1)


def assert_bits_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape
    diff = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
    assert diff.size == 0, f"{diff.size} values differ, first at {diff[:5]}: {a[diff[:5]]} vs {b[diff[:5]]}"


@pytest.mark.parametrize("dt", TYPES, ids=lambda d: d.value)
def test_random_blocks_bit_exact(dt: DType, isa: str) -> None:
    blocks = random_blocks(dt, 515, seed=dt.type_size)
    n = blocks.shape[0] * dt.block_size
    with np.errstate(over="ignore"):
        expected = gguf_dequantize(blocks, dt)
    assert_bits_equal(K.dequantize(blocks, dt, n), expected)


@pytest.mark.parametrize("dt", TYPES, ids=lambda d: d.value)
def test_large_tensor_is_split_across_threads(dt: DType) -> None:
    blocks = random_blocks(dt, 70_000 // dt.block_size + 3, seed=7)
    n = blocks.shape[0] * dt.block_size
    with np.errstate(over="ignore"):
        expected = gguf_dequantize(blocks, dt)
    for threads in (1, 2, 3):
        with K.num_threads(threads):
            assert_bits_equal(K.dequantize(blocks, dt, n), expected)


def test_names_and_out_buffer() -> None:
    blocks = random_blocks(DType.Q4_K, 4)
    out = np.empty(1024, np.float32)
    got = K.dequantize(blocks.tobytes(), "q4_k", 1024, out=out)
    assert got is out
    assert_bits_equal(out, gguf_dequantize(blocks, DType.Q4_K))
    with pytest.raises(K.KernelError, match="out must be"):
        K.dequantize(blocks, "q4_k", 1024, out=np.empty(1000, np.float32))


@pytest.mark.parametrize("name", ["iq2_xxs", "iq3_s", "iq1_m", "tq1_0", "q8_k", "q8_1", "i32"])
def test_unsupported_types_raise_naming_the_type(name: str) -> None:
    with pytest.raises(UnsupportedDType, match=name):
        K.dequantize(b"\0" * 4096, name, 256)


def test_size_checks() -> None:
    with pytest.raises(Exception, match="whole number of blocks"):
        K.dequantize(b"\0" * 18, "q4_0", 31)
    with pytest.raises(K.KernelError, match="need 36 bytes"):
        K.dequantize(b"\0" * 18, "q4_0", 64)


@pytest.mark.parametrize("dt", [DType.Q4_0, DType.Q4_K, DType.Q6_K, DType.F16, DType.MXFP4], ids=lambda d: d.value)
def test_get_rows_dequantizes_only_the_rows_used(dt: DType, isa: str) -> None:
    n_rows, n_cols = 50, 512
    blocks = random_blocks(dt, n_rows * n_cols // dt.block_size, seed=3)
    with np.errstate(over="ignore"):
        table = gguf_dequantize(blocks, dt).reshape(n_rows, n_cols)
    ids = np.array([3, 0, 49, 3, 17])
    assert_bits_equal(K.get_rows(blocks, dt, n_cols, ids).reshape(-1), table[ids].reshape(-1))
    with pytest.raises(K.KernelError, match="ids must lie"):
        K.get_rows(blocks, dt, n_cols, [50])

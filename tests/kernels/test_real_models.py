"""Every tensor of the two real models dequantizes bit-exactly as gguf-py does, and the GEMV/GEMM paths agree with
the f32 reference on real weights."""

from __future__ import annotations

import functools
from pathlib import Path

import gguf
import numpy as np
import pytest

import uaii.kernels as K
from uaii.ir.dtype import DType


@functools.cache
def _reader(path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(path)          # parsing Gemma's 262k-token vocabulary takes seconds: once per session


def _check_all_tensors(path: Path, expected_types: set[str]) -> None:
    reader = _reader(path)
    seen: set[str] = set()
    out = np.empty(1 << 22, np.float32)
    for t in reader.tensors:
        dt = DType.from_gguf_id(int(t.tensor_type))
        seen.add(dt.value)
        data = np.asarray(t.data)
        rows = data.reshape(-1, data.shape[-1])                     # packed bytes (or values) per row
        row_elems = int(np.prod(t.shape)) // rows.shape[0]
        step = max(1, out.size // row_elems)
        for r0 in range(0, rows.shape[0], step):                    # bounded memory for the big embeddings
            chunk = rows[r0:r0 + step]
            n = chunk.shape[0] * row_elems
            expected = np.asarray(gguf.quants.dequantize(chunk, t.tensor_type), np.float32).reshape(-1)
            got = K.dequantize(np.ascontiguousarray(chunk).view(np.uint8), dt, n, out=out[:n])
            assert np.array_equal(got.view(np.uint32), expected.view(np.uint32)), f"{t.name} ({dt.value}) row {r0}"
    assert expected_types <= seen, seen


def test_smollm2_every_tensor_bit_exact(smollm2_path: Path) -> None:
    _check_all_tensors(smollm2_path, {"q4_1", "q8_0", "f32"})


def test_gemma3_every_tensor_bit_exact(gemma3_path: Path) -> None:
    _check_all_tensors(gemma3_path, {"q5_0", "q4_k", "q6_k", "q8_0", "f32"})


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_gemm_on_real_weights(model: str, request: pytest.FixtureRequest) -> None:
    """c-q8dot against the f32 path on one block of layer-0 weights of each quantized type."""
    reader = _reader(request.getfixturevalue(f"{model}_path"))
    rng = np.random.default_rng(0)
    done: set[DType] = set()
    for t in reader.tensors:
        dt = DType.from_gguf_id(int(t.tensor_type))
        if dt in done or not dt.is_quantized or len(t.shape) != 2 or not t.name.startswith("blk."):
            continue
        done.add(dt)
        k, n = (int(s) for s in t.shape)
        n = min(n, 512)
        raw = np.asarray(t.data).reshape(-1).view(np.uint8)[: dt.nbytes(n * k)]
        w = K.PackedWeight.from_raw(raw, dt, (n, k))
        x = rng.standard_normal((5, k)).astype(np.float32)
        ref = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
        for m in (1, 5):
            y = K.matmul(x[:m], w)
            rel = np.linalg.norm(y - ref[:m]) / np.linalg.norm(ref[:m])
            assert rel < 0.02, (t.name, dt.value, m, rel)
    assert done

"""The CPU backend's GEMM mode: the compile option ``gemm`` ("fast" | "f32"), whose default is $UAII_CPU_GEMM."""

from __future__ import annotations

import numpy as np
import pytest

import uaii.kernels as K
from uaii.backends import ArrayWeights, get_backend
from uaii.backends.base import BackendError
from uaii.backends.config import CPU_GEMM_ENV, cpu_gemm
from uaii.ir import DType, Node, Tensor, make_graph
from uaii.kernels.testing import random_weight

CPU = get_backend("cpu")
N, KD = 48, 512


def _graph() -> object:
    tensors = [Tensor("x", DType.F32, ("seq", KD)), Tensor("w", DType.Q4_K, (N, KD), is_weight=True),
               Tensor("y", DType.F32, ("seq", N))]
    return make_graph("mm", [Node("mm", "MatMul", ("x", "w"), ("y",), {"transpose_b": True})], tensors, ["x"], ["y"])


def _run(x: np.ndarray, **options: object) -> np.ndarray:
    raw = random_weight(DType.Q4_K, N, KD, seed=3)
    exe = CPU.compile(_graph(), None, ArrayWeights({"w": raw}), max_tokens=16, **options)
    return np.array(exe.run({"x": x})["y"])


def test_compile_option_and_environment_default(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng(0).standard_normal((5, KD)).astype(np.float32)
    w = K.PackedWeight.from_raw(random_weight(DType.Q4_K, N, KD, seed=3), DType.Q4_K, (N, KD))
    exact, fast = K.get_gemm("c-f32").gemm(x, w), K.get_gemm("c-q8dot").gemm(x, w)
    assert np.abs(exact - fast).max() > 0                      # the modes differ: the test can tell them apart
    monkeypatch.delenv(CPU_GEMM_ENV, raising=False)
    np.testing.assert_array_equal(_run(x), fast)
    np.testing.assert_array_equal(_run(x, gemm="f32"), exact)
    monkeypatch.setenv(CPU_GEMM_ENV, "f32")
    np.testing.assert_array_equal(_run(x), exact)
    np.testing.assert_array_equal(_run(x, gemm="fast"), fast)   # the option wins over the variable


def test_bad_modes_are_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CPU_GEMM_ENV, " F32 ")
    assert cpu_gemm() == "f32"
    monkeypatch.setenv(CPU_GEMM_ENV, "int4")
    with pytest.raises(BackendError, match=r"\[backend\] UAII_CPU_GEMM must be one of fast, f32, found 'int4'"):
        cpu_gemm()
    monkeypatch.delenv(CPU_GEMM_ENV)
    with pytest.raises(BackendError, match="gemm must be one of fast, f32"):
        _run(np.zeros((1, KD), np.float32), gemm="exact")

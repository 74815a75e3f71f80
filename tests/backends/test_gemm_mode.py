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


# --- the output projection: mode 2 (16-bit activations for Q8_0) in the fast mode, mode 0 everywhere else ---------
D, V = 256, 96


def _head_graph(softcap: bool = False) -> object:
    """x -> MatMul(w_in) -> h -> MatMul(w_out) -> y [-> Softcap -> z]: two Q8_0 projections, the second the output
    one. The output is named "y" / "z" on purpose: the backend asks the graph, never the names."""
    q8 = DType.Q8_0
    tensors = [Tensor("x", DType.F32, ("seq", D)), Tensor("w_in", q8, (D, D), is_weight=True),
               Tensor("h", DType.F32, ("seq", D)), Tensor("w_out", q8, (V, D), is_weight=True),
               Tensor("y", DType.F32, ("seq", V))]
    nodes = [Node("mm_in", "MatMul", ("x", "w_in"), ("h",), {"transpose_b": True}),
             Node("head", "MatMul", ("h", "w_out"), ("y",), {"transpose_b": True})]
    if softcap:
        tensors.append(Tensor("z", DType.F32, ("seq", V)))
        nodes.append(Node("cap", "Softcap", ("y",), ("z",), {"cap": 30.0}))
    return make_graph("head", nodes, tensors, ["x"], ["z" if softcap else "y"])


def _head_weights() -> dict[str, np.ndarray]:
    return {"w_in": random_weight(DType.Q8_0, D, D, seed=11), "w_out": random_weight(DType.Q8_0, V, D, seed=12)}


def _kernels(x: np.ndarray, inner: str, outer: str) -> tuple[np.ndarray, np.ndarray]:
    """The two projections through the kernels called directly: (h, y)."""
    raws = _head_weights()
    w_in = K.PackedWeight.from_raw(raws["w_in"], DType.Q8_0, (D, D))
    w_out = K.PackedWeight.from_raw(raws["w_out"], DType.Q8_0, (V, D))
    h = K.get_gemm(inner).gemm(x, w_in)
    return h, K.get_gemm(outer).gemm(h, w_out)


def _x(m: int = 5) -> np.ndarray:
    return np.random.default_rng(4).standard_normal((m, D)).astype(np.float32)


def test_output_projection_runs_precise_the_others_fast() -> None:
    x = _x()
    _, expected = _kernels(x, "c-q8dot", "c-precise")
    _, all_fast = _kernels(x, "c-q8dot", "c-q8dot")
    _, all_precise = _kernels(x, "c-precise", "c-precise")
    assert np.abs(expected - all_fast).max() > 0 and np.abs(expected - all_precise).max() > 0   # tells them apart
    exe = CPU.compile(_head_graph(), None, ArrayWeights(_head_weights()), max_tokens=16, gemm="fast")
    assert exe.output_projections == {"y"}
    assert (exe.gemm_mode_for("h"), exe.gemm_mode_for("y")) == (0, 2)
    for m in (1, 5):                                   # decode rows and batches
        np.testing.assert_array_equal(np.array(exe.run({"x": x[:m]})["y"]), expected[:m])


def test_exact_mode_stays_f32_everywhere() -> None:
    x = _x()
    _, expected = _kernels(x, "c-f32", "c-f32")
    exe = CPU.compile(_head_graph(), None, ArrayWeights(_head_weights()), max_tokens=16, gemm="f32")
    assert not exe.output_projections and exe.gemm_mode_for("y") == 1
    np.testing.assert_array_equal(np.array(exe.run({"x": x})["y"]), expected)


def test_output_projection_through_a_final_softcap() -> None:
    """Gemma-2's logits are Softcap(MatMul): the MatMul is still the output projection."""
    x = _x()
    _, y = _kernels(x, "c-q8dot", "c-precise")
    exe = CPU.compile(_head_graph(softcap=True), None, ArrayWeights(_head_weights()), max_tokens=16, gemm="fast")
    assert exe.output_projections == {"y"}
    np.testing.assert_allclose(np.array(exe.run({"x": x})["z"]), 30.0 * np.tanh(y / 30.0), rtol=1e-6, atol=1e-6)


class _Store(ArrayWeights):
    """The streaming-store surface StreamingWeights uses, over arrays: acquire (row ranges ``ref@rows=A:B`` too),
    release, prefetch, window_bytes."""

    def acquire(self, ref: str) -> np.ndarray:
        base, _, rows = str(ref).partition("@rows=")
        raw = super().acquire(base)
        if not rows:
            return raw
        a, b = (int(r) for r in rows.split(":"))
        per = raw.size // (V if base == "w_out" else D)
        return raw[a * per:b * per]

    def prefetch(self, order: object) -> None:
        """Nothing to read ahead: the arrays are in memory."""

    def window_bytes(self, ref: str) -> int:
        return int(self.arrays[str(ref)].size)


@pytest.mark.parametrize("chunk_bytes", [0, 4096 + 272 * 40], ids=["staged", "row-chunks"])
def test_streamed_weights_choose_as_the_mapped_ones(chunk_bytes: int) -> None:
    """Weights acquired around their steps (whole, or the output projection in row chunks of a staging buffer) run
    in the same modes as mapped ones: the same bits."""
    x = _x()
    _, expected = _kernels(x, "c-q8dot", "c-precise")
    exe = CPU.compile(_head_graph(), None, _Store(_head_weights()), max_tokens=16, gemm="fast",
                      streamed={"w_in", "w_out"}, chunk_bytes=chunk_bytes)
    assert exe.streaming is not None
    assert (exe.streaming.chunks(exe.infos[1]) is not None) == bool(chunk_bytes)
    for m in (1, 5):
        np.testing.assert_array_equal(np.array(exe.run({"x": x[:m]})["y"]), expected[:m])

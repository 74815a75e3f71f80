"""The CPU lowering of MatMulNBits picks its arithmetic from the node's accuracy_level and the gemm option: level 4
(int8 activations allowed) runs the integer kernel, levels 0..3 the float kernel, and the ``f32`` option the float
kernel at every level. Each is checked by its bits: the lowered graph gives exactly what uaii.kernels' c-q8dot or
c-f32 gives on the same packed weight, for decode rows and a batch, with the weight mapped or fed at run time."""

from __future__ import annotations

import numpy as np
import pytest

import uaii.kernels as K
from uaii.backends import ArrayWeights, get_backend
from uaii.backends.cpu.ops_nbits import nbits_mode
from uaii.backends.testing.cases import Builder

CPU = get_backend("cpu")
N, KDIM, BITS, BS = 20, 100, 4, 32


def _graph(level: int, rows: int, fed: bool = False) -> tuple[object, dict[str, np.ndarray], dict[str, np.ndarray]]:
    b = Builder("MatMulNBits", f"rows{rows}_fed{fed}")           # the same data at every level
    kb = -(-KDIM // BS)
    put = b.input if fed else b.weight
    a = b.input("a", "f32", (rows, KDIM))
    ins = [a, put("B", "u8", (N, kb, BS * BITS // 8), value=b.rng.integers(0, 256, (N, kb, BS * BITS // 8)).astype(
               np.uint8)),
           put("scales", "f32", (N * kb,), value=b.rng.uniform(0.01, 0.05, N * kb).astype(np.float32)),
           put("zp", "u8", (N * kb // 2,), value=b.rng.integers(0, 256, N * kb // 2).astype(np.uint8)),
           b.weight("bias", "f32", (N,))]
    case = b.case(ins, [("y", "f32", (rows, N))], K=KDIM, N=N, bits=BITS, block_size=BS, accuracy_level=level)
    return case.graph, case.feeds, case.weights


def _kernel(provider: str, feeds: dict[str, np.ndarray], weights: dict[str, np.ndarray]) -> np.ndarray:
    arrays = {**feeds, **weights}
    w = K.PackedWeight.from_nbits(arrays["B"], arrays["scales"], arrays["zp"], n=N, k=KDIM, bits=BITS, block_size=BS)
    return K.get_gemm(provider).gemm(arrays["a"], w) + arrays["bias"]


def _run(level: int, rows: int, gemm: str | None = None, fed: bool = False) -> tuple[np.ndarray, dict, dict]:
    graph, feeds, weights = _graph(level, rows, fed)
    options = {"gemm": gemm} if gemm else {}
    exe = CPU.compile(graph, None, ArrayWeights(weights), kv_state=False, **options)
    try:
        return exe.run(feeds)["y"], feeds, weights
    finally:
        exe.close()


def test_the_mode_rule() -> None:
    assert [nbits_mode(0, level) for level in range(5)] == [1, 1, 1, 1, 0]   # fast: the model's level decides
    assert [nbits_mode(1, level) for level in range(5)] == [1] * 5           # f32: exact everywhere
    assert nbits_mode(2, 4) == 0 and nbits_mode(2, 0) == 1                   # precise is fast's choice here


@pytest.mark.parametrize("rows", [1, 9])
@pytest.mark.parametrize("fed", [False, True])
@pytest.mark.parametrize("level,provider", [(0, "c-f32"), (1, "c-f32"), (3, "c-f32"), (4, "c-q8dot")])
def test_accuracy_level_picks_the_kernel(level: int, provider: str, rows: int, fed: bool) -> None:
    y, feeds, weights = _run(level, rows, fed=fed)
    assert np.array_equal(y, _kernel(provider, feeds, weights))


@pytest.mark.parametrize("level", [0, 4])
def test_the_f32_option_wins_over_the_level(level: int) -> None:
    y, feeds, weights = _run(level, 5, gemm="f32")
    assert np.array_equal(y, _kernel("c-f32", feeds, weights))


def test_the_two_kernels_differ_here() -> None:
    """Else the tests above could not tell which kernel ran."""
    y0, _, _ = _run(0, 9)
    y4, _, _ = _run(4, 9)
    assert not np.array_equal(y0, y4)

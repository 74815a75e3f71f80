"""The CPU executable: one arena with reused offsets, free views, in-place steps, cached bindings, no allocation
per decode step, clear errors."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from uaii.backends import ArrayWeights, UnsupportedOpError, get_backend
from uaii.backends.base import BackendError
from uaii.ir import DType, Node, Tensor, make_graph

CPU = get_backend("cpu")


def _chain(n: int = 6) -> object:
    """x -> (RMSNorm -> MatMul -> Silu -> Add residual) * n -> Reshape: a toy decoder trunk."""
    tensors = [Tensor("x", DType.F32, ("seq", 32))]
    nodes, cur = [], "x"
    for i in range(n):
        tensors += [Tensor(f"n{i}.w", DType.F32, (32,), is_weight=True), Tensor(f"m{i}.w", DType.F32, (32, 32),
                                                                                  is_weight=True)]
        for v in ("norm", "mm", "act", "res"):
            tensors.append(Tensor(f"{v}{i}", DType.F32, ("seq", 32)))
        nodes += [Node(f"norm{i}", "RMSNorm", (cur, f"n{i}.w"), (f"norm{i}",)),
                  Node(f"mm{i}", "MatMul", (f"norm{i}", f"m{i}.w"), (f"mm{i}",), {"transpose_b": True}),
                  Node(f"act{i}", "Silu", (f"mm{i}",), (f"act{i}",)),
                  Node(f"res{i}", "Add", (cur, f"act{i}"), (f"res{i}",))]
        cur = f"res{i}"
    tensors.append(Tensor("y", DType.F32, ("seq", 4, 8)))
    nodes.append(Node("out", "Reshape", (cur,), ("y",), {"shape": (0, 4, 8)}))
    return make_graph("chain", nodes, tensors, ["x"], ["y"])


def _weights(n: int = 6) -> ArrayWeights:
    rng = np.random.default_rng(0)
    w = {}
    for i in range(n):
        w[f"n{i}.w"] = rng.uniform(0.5, 1.5, 32).astype(np.float32)
        w[f"m{i}.w"] = rng.normal(scale=0.2, size=(32, 32)).astype(np.float32)
    return ArrayWeights(w)


def _numpy(x: np.ndarray, w: ArrayWeights, n: int = 6) -> np.ndarray:
    for i in range(n):
        h = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w.arrays[f"n{i}.w"]
        h = h @ w.arrays[f"m{i}.w"].T
        x = x + h / (1 + np.exp(-h))
    return x.reshape(-1, 4, 8)


def test_results_and_arena_reuse() -> None:
    w = _weights()
    exe = CPU.compile(_chain(), None, w, max_tokens=64)
    flat = CPU.compile(_chain(), None, w, max_tokens=64, memory_reuse=False)
    x = np.random.default_rng(1).normal(size=(64, 32)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x})["y"], _numpy(x, w), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(flat.run({"x": x})["y"], _numpy(x, w), rtol=1e-4, atol=1e-5)
    row = 64 * 32 * 4
    assert exe.arena_bytes <= 5 * row + 64  # 25 values of one row each share a handful of buffers
    assert flat.arena_bytes >= 19 * row


def test_views_are_free_and_smaller_batches_reuse_the_arena() -> None:
    exe = CPU.compile(_chain(), None, _weights(), max_tokens=64)
    arena = exe.arena_bytes
    n_prefill = exe.steps_for({"x": (64, 32)})
    assert n_prefill == 6 * 4  # the Reshape is a view: no step
    x = np.ones((3, 32), np.float32)
    y1 = exe.run({"x": x})["y"]
    y2 = exe.run({"x": x * 2})["y"]
    assert np.shares_memory(y1, y2) and exe.arena_bytes == arena  # same buffers, same arena
    assert len(exe._bindings) == 2  # the prefill-size binding planned at compile time and this one


def test_a_decode_step_allocates_nothing_that_stays() -> None:
    exe = CPU.compile(_chain(), None, _weights(), max_tokens=64)
    x = np.ones((1, 32), np.float32)
    exe.run({"x": x})
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(200):
            exe.run({"x": x})
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    ours = [tracemalloc.Filter(True, "*uaii*")]  # Python's own free lists keep a few tuples: not ours
    diff = after.filter_traces(ours).compare_to(before.filter_traces(ours), "lineno")
    grown = sum(s.size_diff for s in diff if s.size_diff > 0)
    assert grown < 1024, [str(s) for s in diff[:3]]


def test_errors_name_what_is_wrong() -> None:
    exe = CPU.compile(_chain(), None, _weights())
    with pytest.raises(BackendError, match="missing input 'x'"):
        exe.run({})
    bad = make_graph("bad", [Node("f", "Frobnicate", ("x",), ("y",))],
                     [Tensor("x", DType.F32, (2,)), Tensor("y", DType.F32, (2,))], ["x"], ["y"])
    with pytest.raises(UnsupportedOpError, match="node 'f' \\(Frobnicate\\)"):
        CPU.compile(bad, None, ArrayWeights())
    with pytest.raises(BackendError, match=r"no weight 'm0\.w' among 0 supplied"):
        CPU.compile(_chain(), None, ArrayWeights())

"""Step profiles of the CPU executable (Capabilities.step_profile): every step timed while profiling is on, per node
and op family, one profile per rows fed; outputs unchanged; nothing recorded while off."""

from __future__ import annotations

import numpy as np
import pytest

from uaii.backends import ArrayWeights, NodeTiming, StepProfile, get_backend, merge_profiles
from uaii.ir import DType, Node, Tensor, make_graph
from uaii.kernels import quantize

CPU = get_backend("cpu")
D, F = 64, 96


def _graph_and_weights() -> tuple[object, ArrayWeights, int]:
    """x -> RMSNorm -> MatMul (Q8_0 weight) -> Silu -> MatMul (f32 weight): two product families and two others."""
    rng = np.random.default_rng(0)
    up = rng.normal(scale=0.1, size=(F, D)).astype(np.float32)
    q8 = np.frombuffer(quantize(up, DType.Q8_0), np.uint8)
    weights = ArrayWeights({"norm.w": rng.uniform(0.5, 1.5, D).astype(np.float32), "up.w": q8,
                            "down.w": rng.normal(scale=0.1, size=(D, F)).astype(np.float32)})
    tensors = [Tensor("x", DType.F32, ("seq", D)), Tensor("norm.w", DType.F32, (D,), is_weight=True),
               Tensor("up.w", DType.Q8_0, (F, D), is_weight=True), Tensor("down.w", DType.F32, (D, F), is_weight=True),
               Tensor("h", DType.F32, ("seq", D)), Tensor("u", DType.F32, ("seq", F)),
               Tensor("a", DType.F32, ("seq", F)), Tensor("y", DType.F32, ("seq", D))]
    nodes = [Node("norm", "RMSNorm", ("x", "norm.w"), ("h",)),
             Node("up", "MatMul", ("h", "up.w"), ("u",), {"transpose_b": True}),
             Node("act", "Silu", ("u",), ("a",)),
             Node("down", "MatMul", ("a", "down.w"), ("y",), {"transpose_b": True})]
    return make_graph("profiled", nodes, tensors, ["x"], ["y"]), weights, q8.nbytes


def _runs(exe: object, rows: list[int]) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [np.array(exe.run({"x": rng.normal(size=(n, D)).astype(np.float32)})["y"]) for n in rows]  # type: ignore


def test_the_cpu_backend_declares_step_profiles() -> None:
    assert CPU.capabilities.step_profile


def test_profiles_time_every_step_per_rows_without_changing_outputs() -> None:
    graph, weights, q8_bytes = _graph_and_weights()
    plain = CPU.compile(graph, None, weights, max_tokens=8)
    timed = CPU.compile(graph, None, weights, max_tokens=8)
    timed.set_profiling(True)
    order = [1, 4, 1, 4, 1]
    for a, b in zip(_runs(plain, order), _runs(timed, order), strict=True):
        np.testing.assert_array_equal(a, b)  # the timed loop runs the same steps
    profiles = timed.take_profile()
    assert [(p.rows, p.runs) for p in profiles] == [(1, 3), (4, 2)]
    for p in profiles:
        by = {n.node: n for n in p.nodes}
        assert {"norm", "up", "act", "down"} <= set(by)
        for n in p.nodes:
            assert n.steps >= 1 and n.calls == n.steps * p.runs and n.seconds > 0
        assert by["up"].family == "gemm q8_0" and by["up"].weight_bytes == q8_bytes
        assert by["down"].family == "gemm f32" and by["down"].weight_bytes == D * F * 4
        assert by["norm"].family == "RMSNorm" and by["norm"].weight_bytes == 0  # not a product: no GB/s
        assert p.steps_per_run == sum(n.steps for n in p.nodes)
        assert p.run_seconds >= p.step_seconds and p.executor_seconds >= 0
        fams = {f.family: f for f in p.families()}
        assert fams["gemm q8_0"].nodes == 1 and fams["gemm q8_0"].weight_bytes == q8_bytes
        assert [f.seconds for f in p.families()] == sorted((f.seconds for f in p.families()), reverse=True)
    assert timed.take_profile() == []  # taken: counts start again
    _runs(timed, [4])
    again = timed.take_profile()
    assert [(p.rows, p.runs) for p in again] == [(4, 1)]
    assert all(n.calls == n.steps for n in again[0].nodes)


def test_nothing_is_recorded_while_profiling_is_off() -> None:
    graph, weights, _ = _graph_and_weights()
    exe = CPU.compile(graph, None, weights, max_tokens=8)
    assert exe.take_profile() == []
    _runs(exe, [1, 2])
    assert exe.take_profile() == []
    exe.set_profiling(True)
    _runs(exe, [2])
    exe.set_profiling(False)  # what was not taken is dropped
    exe.set_profiling(True)
    _runs(exe, [1])
    assert [(p.rows, p.runs) for p in exe.take_profile()] == [(1, 1)]


def test_a_failing_step_still_raises_while_profiling() -> None:
    graph, weights, _ = _graph_and_weights()
    exe = CPU.compile(graph, None, weights, max_tokens=8)
    exe.set_profiling(True)
    with pytest.raises(Exception, match="missing input 'x'"):
        exe.run({})


def test_merge_adds_profiles_of_the_same_rows() -> None:
    a = StepProfile(1, 2, 1.0, [NodeTiming("n", "MatMul", "gemm q4_0", 1, 2, 0.5, 100)])
    b = StepProfile(1, 3, 2.0, [NodeTiming("n", "MatMul", "gemm q4_0", 1, 3, 0.25, 100),
                                NodeTiming("m", "Add", "Add", 1, 3, 0.1)])
    c = StepProfile(7, 1, 0.5, [])
    merged = merge_profiles([a, b, c])
    assert [(p.rows, p.runs, p.run_seconds) for p in merged] == [(1, 5, 3.0), (7, 1, 0.5)]
    n = {t.node: t for t in merged[0].nodes}
    assert n["n"].calls == 5 and n["n"].seconds == 0.75 and n["n"].weight_bytes == 100 and n["m"].calls == 3
    assert a.nodes[0].calls == 2  # inputs untouched

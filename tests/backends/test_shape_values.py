"""Data-dependent shapes on the CPU backend: a graph whose shapes are computed from its feeds' shapes (Shape -> Gather
-> Range -> Fill / Expand -> Where, as exported models build masks and position ids) binds every feed length to exact
shapes in one executable; a graph whose shapes come from a feed's values binds per value; a shape nothing can know
ahead is a clear error."""

from __future__ import annotations

import numpy as np
import pytest

from uaii.backends import ArrayWeights, get_backend
from uaii.backends.analysis import node_infos, shape_values
from uaii.backends.base import BackendError
from uaii.ir import DType, Node, Tensor, check, make_graph
from uaii.ir.reference import evaluate

CPU = get_backend("cpu")
I64, F32, BOOL = DType.I64, DType.F32, DType.BOOL


def _mask_graph() -> object:
    """x [seq, 4] -> n = Shape(x)[0] -> pos = Range(0, n, 1); a lower-triangular [n, n] mask from Fill + Trilu; the
    positions expanded to [n, n] and masked with Where (-1 above the diagonal); and x scaled by its row's position."""
    c = Tensor.constant
    tensors = [
        Tensor("x", F32, ("seq", 4)), c("zero", np.array(0, np.int64)), c("one", np.array(1, np.int64)),
        c("first", np.array(0, np.int64)), c("minus_one", np.array(-1, np.int64)), c("true", np.array(True)),
        Tensor("shape", I64, (2,)), Tensor("n", I64, ()), Tensor("n1", I64, (1,)), Tensor("nn", I64, (2,)),
        Tensor("pos", I64, ("seq",)), Tensor("row", I64, (1, "seq")), Tensor("grid", I64, ("seq", "seq")),
        Tensor("ones", BOOL, ("seq", "seq")), Tensor("tri", BOOL, ("seq", "seq")),
        Tensor("masked", I64, ("seq", "seq")), Tensor("posf", F32, ("seq",)), Tensor("col", F32, ("seq", 1)),
        Tensor("scaled", F32, ("seq", 4)),
    ]
    nodes = [
        Node("shape", "Shape", ("x",), ("shape",)),
        Node("n", "Gather", ("shape", "first"), ("n",)),
        Node("pos", "Range", ("zero", "n", "one"), ("pos",)),
        Node("n1", "Reshape", ("n",), ("n1",), {"shape": (1,)}),
        Node("nn", "Concat", ("n1", "n1"), ("nn",), {"axis": 0}),
        Node("ones", "Fill", ("nn", "true"), ("ones",)),
        Node("tri", "Trilu", ("ones",), ("tri",), {"upper": False}),
        Node("row", "Reshape", ("pos",), ("row",), {"shape": (1, -1)}),
        Node("grid", "Expand", ("row", "nn"), ("grid",)),
        Node("masked", "Where", ("tri", "grid", "minus_one"), ("masked",)),
        Node("posf", "Cast", ("pos",), ("posf",), {"to": "f32"}),
        Node("col", "Reshape", ("posf",), ("col",), {"shape": (-1, 1)}),
        Node("scaled", "Mul", ("x", "col"), ("scaled",)),
    ]
    return check(make_graph("masks", nodes, tensors, ["x"], ["masked", "scaled"]))


def _expected(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = x.shape[0]
    j, i = np.meshgrid(np.arange(n), np.arange(n))
    return np.where(j <= i, j, -1).astype(np.int64), x * np.arange(n, dtype=np.float32)[:, None]


def test_shapes_computed_from_feed_shapes_bind_every_length_in_one_executable() -> None:
    graph = _mask_graph()
    exe = CPU.compile(graph, None, ArrayWeights({}), max_tokens=16)  # laid out for 16 rows at compile time
    rng = np.random.default_rng(0)
    for n in (5, 1, 9, 5, 40):  # shorter than planned, a repeat (cached binding), and longer (a new layout)
        x = rng.standard_normal((n, 4)).astype(np.float32)
        got = exe.run({"x": x})
        masked, scaled = _expected(x)
        assert got["masked"].shape == (n, n) and got["masked"].dtype == np.int64
        np.testing.assert_array_equal(got["masked"], masked)
        np.testing.assert_allclose(got["scaled"], scaled, rtol=1e-6)
        ref = evaluate(graph, {"x": x}, {})
        np.testing.assert_array_equal(got["masked"], ref["masked"])
    exe.close()


def test_a_graph_whose_shapes_follow_from_shapes_has_no_value_feeds() -> None:
    graph = _mask_graph()
    deps = shape_values(graph, node_infos(graph))
    assert deps.feeds == ()
    assert {"shape", "n", "nn", "zero", "one"} <= deps.values and "x" not in deps.values  # Shape reads x's shape


def _fed_range() -> object:
    """y = Range(0, limit, 1) with limit a graph input: the output length is the fed value."""
    tensors = [Tensor("limit", I64, ()), Tensor.constant("zero", np.array(0, np.int64)),
               Tensor.constant("one", np.array(1, np.int64)), Tensor("y", I64, ("n",)), Tensor("z", F32, ("n", 2)),
               Tensor("shape", I64, (2,)), Tensor.constant("two", np.array([2], np.int64)), Tensor("y1", I64, (1,)),
               Tensor.constant("half", np.array(0.5, np.float32))]
    nodes = [Node("range", "Range", ("zero", "limit", "one"), ("y",)),
             Node("y1", "Shape", ("y",), ("y1",)),
             Node("cat", "Concat", ("y1", "two"), ("shape",), {"axis": 0}),
             Node("fill", "Fill", ("shape", "half"), ("z",))]
    return check(make_graph("fed_range", nodes, tensors, ["limit"], ["y", "z"]))


def test_shapes_decided_by_a_feeds_values_bind_per_value() -> None:
    graph = _fed_range()
    exe = CPU.compile(graph, None, ArrayWeights({}))
    assert exe.shape_feeds == ("limit",)
    for limit in (3, 7, 3, 0):
        got = exe.run({"limit": np.array(limit, np.int64)})
        np.testing.assert_array_equal(got["y"], np.arange(limit))
        np.testing.assert_array_equal(got["z"], np.full((limit, 2), 0.5, np.float32))
    exe.close()


def test_a_shape_from_a_weights_values_is_a_clear_error() -> None:
    tensors = [Tensor("limit", I64, (), is_weight=True), Tensor.constant("zero", np.array(0, np.int64)),
               Tensor.constant("one", np.array(1, np.int64)), Tensor("y", I64, ("n",))]
    graph = check(make_graph("weight_range", [Node("range", "Range", ("zero", "limit", "one"), ("y",))], tensors, [],
                             ["y"]))
    with pytest.raises(BackendError, match=r"Range.*depends on the values of \['limit'\].*weight"):
        CPU.compile(graph, None, ArrayWeights({"limit": np.array(4, np.int64)})).run({})


def test_range_refuses_a_zero_delta_while_binding() -> None:
    tensors = [Tensor("delta", I64, ()), Tensor.constant("zero", np.array(0, np.int64)),
               Tensor.constant("four", np.array(4, np.int64)), Tensor("y", I64, ("n",))]
    graph = check(make_graph("zero_delta", [Node("range", "Range", ("zero", "four", "delta"), ("y",))], tensors,
                             ["delta"], ["y"]))
    exe = CPU.compile(graph, None, ArrayWeights({}))
    np.testing.assert_array_equal(exe.run({"delta": np.array(2, np.int64)})["y"], [0, 2])
    with pytest.raises(BackendError, match="delta is 0"):
        exe.run({"delta": np.array(0, np.int64)})

"""The ops ONNX graphs brought into the IR (issue #14): schemas, shape inference (exact from constants, fresh symbols
from values known only at run time), the NumPy references against NumPy and hand-computed edge cases (broadcasting,
negative axes, empty tensors, integer modulo signs, Trilu's k, CumSum's exclusive/reverse, Range's negative delta and
zero length), ONNX semantics checked against onnxruntime where it is installed, and validation and serialization of
graphs that use them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from uaii.ir import DType, Node, Tensor, check, from_bytes, loads_json, make_graph, to_bytes, validate
from uaii.ir.ops import COMPARE, GROUPS, InferCtx, InferError, Op, OpKind, TensorType
from uaii.ir.reference import EvaluationError, evaluate, f32_to_bf16, run_node
from uaii.ir.registry import default_registry, render_markdown
from uaii.ir.serialize import dumps_json
from uaii.ir.shapes import Shape

NEW_OPS = ("Erf", "Reciprocal", "Cos", "Sin", "Abs", "Log", "Not", "Pow", "Max", "Min", "Mod", "Equal", "Less",
           "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where", "Trilu", "Shape", "Range", "Fill",
           "Expand", "ReduceSum", "ReduceMax", "ReduceMin", "CumSum")
F32, F16, I32, I64, BOOL = DType.F32, DType.F16, DType.I32, DType.I64, DType.BOOL
RNG = np.random.default_rng(14)


def run(op: str, *inputs: np.ndarray | None, **attrs: Any) -> np.ndarray:
    names = tuple("" if x is None else f"in{i}" for i, x in enumerate(inputs))
    return run_node(Node("n", op, names, ("out",), attrs), list(inputs))[0]


def infer(op: str, inputs: Sequence[tuple[DType, Shape]], consts: dict[int, np.ndarray] | None = None,
          **attrs: Any) -> list[Shape | None]:
    """The shapes ``op``'s schema infers for these input types (and constants), attributes resolved."""
    node = Node("node", op, tuple(f"in{i}" for i in range(len(inputs))), ("out",), attrs)
    schema = default_registry().get(op)
    values, problems = schema.resolve_attrs(node)
    assert not problems, problems
    ctx = InferCtx(node, schema, [TensorType(dt, tuple(s)) for dt, s in inputs], values, consts)
    assert schema.infer is not None
    return list(schema.infer(ctx))


# --- the schemas ------------------------------------------------------------------------------------------------
def test_every_new_op_is_a_member_of_op_with_a_version_1_schema_of_its_group() -> None:
    reg = default_registry()
    members = {str(o) for o in Op}
    kinds = {str(op): kind for kind, ops in GROUPS.items() for op in ops}
    for op in NEW_OPS:
        assert op in members
        assert reg.get(op, 1).kind is OpKind(kinds[op])
    assert reg.get("Shape").from_shape and not reg.get("Range").from_shape
    assert reg.get("Range").value_inputs == (0, 1, 2) and reg.get("Fill").value_inputs == (0,)
    assert reg.get("Expand").value_inputs == (1,) and reg.get("Reshape").value_inputs == (1,)
    assert {s.op for s in reg.schemas() if s.value_inputs} == {"Reshape", "Range", "Fill", "Expand"}


def test_the_op_reference_documents_the_new_ops() -> None:
    text = render_markdown(builtin_only=True)
    for op in NEW_OPS:
        assert f"## {op} (version 1)" in text
    assert "shape from the values of start, limit, delta" in text and "values from shapes" in text


def test_comparisons_give_bool_and_take_one_dtype() -> None:
    reg = default_registry()
    for op in COMPARE:
        s = reg.get(op)
        assert s.check_dtypes([F32, F32], [BOOL]) == []
        assert s.check_dtypes([F32, F16], [BOOL])  # one dtype for both operands
        assert s.check_dtypes([I64, I64], [I64])  # the result is bool
    assert reg.get("Equal").check_dtypes([BOOL, BOOL], [BOOL]) == []
    assert reg.get("Less").check_dtypes([BOOL, BOOL], [BOOL])
    assert reg.get("Pow").check_dtypes([I64, I64], [I64])  # Pow is over floats
    assert reg.get("Not").check_dtypes([F32], [F32])


# --- shape inference ------------------------------------------------------------------------------------------
def test_broadcasting_ops_infer_the_numpy_shape_with_symbols() -> None:
    assert infer("Where", [(BOOL, (4, 1, 6)), (F32, (1, 5, 6)), (F32, (6,))]) == [(4, 5, 6)]
    assert infer("Where", [(BOOL, ("seq", 1)), (F32, (1, "seq")), (F32, ())]) == [("seq", "seq")]
    assert infer("Less", [(I64, ("seq",)), (I64, (3, 1))]) == [(3, "seq")]
    assert infer("Pow", [(F32, (2, 3)), (F32, ())]) == [(2, 3)]
    with pytest.raises(Exception, match="do not broadcast"):
        infer("And", [(BOOL, (3,)), (BOOL, (4,))])


def test_mod_of_floats_needs_fmod() -> None:
    assert infer("Mod", [(F32, (3,)), (F32, (3,))], fmod=True) == [(3,)]
    with pytest.raises(InferError, match="fmod=1"):
        infer("Mod", [(F32, (3,)), (F32, (3,))])
    assert infer("Mod", [(I64, (2, 3)), (I64, (3,))]) == [(2, 3)]


def test_reductions_and_cumsum_infer_like_reduce_mean() -> None:
    assert infer("ReduceSum", [(F32, (2, 3, 4))], axes=(-1, 0)) == [(1, 3, 1)]
    assert infer("ReduceMax", [(F32, (2, "seq", 4))], axes=(1,), keepdims=False) == [(2, 4)]
    assert infer("ReduceMin", [(I64, (2, 3))], keepdims=False) == [()]
    assert infer("CumSum", [(I64, (2, "seq"))], axis=-1) == [(2, "seq")]
    with pytest.raises(InferError, match="out of range"):
        infer("CumSum", [(F32, (2, 3))], axis=2)
    with pytest.raises(InferError, match="twice"):
        infer("ReduceSum", [(F32, (2, 3))], axes=(1, -1))


def test_trilu_needs_two_axes() -> None:
    assert infer("Trilu", [(F32, (2, "seq", "seq"))], upper=False, k=-1) == [(2, "seq", "seq")]
    with pytest.raises(InferError, match="rank >= 2"):
        infer("Trilu", [(F32, (5,))])


def test_shape_infers_its_length_from_start_and_end() -> None:
    assert infer("Shape", [(F32, ("b", "seq", 64))]) == [(3,)]
    assert infer("Shape", [(F32, (2, 3, 4, 5))], start=1) == [(3,)]
    assert infer("Shape", [(F32, (2, 3, 4, 5))], start=-3, end=-1) == [(2,)]
    assert infer("Shape", [(F32, (2, 3))], start=-9, end=9) == [(2,)]  # clamped
    assert infer("Shape", [(F32, (2, 3))], start=2, end=1) == [(0,)]
    assert infer("Shape", [(F32, ())]) == [(0,)]


def test_range_is_exact_from_constants_and_fresh_otherwise() -> None:
    scalars = [(I64, ()), (I64, ()), (I64, ())]
    c = {0: np.array(10, np.int64), 1: np.array(-1, np.int64), 2: np.array(-3, np.int64)}
    assert infer("Range", scalars, c) == [(4,)]  # 10, 7, 4, 1
    assert infer("Range", scalars, {0: np.array(5), 1: np.array(5), 2: np.array(1)}) == [(0,)]
    assert infer("Range", [(F32, ()), (F32, (1,)), (F32, ())],
                 {0: np.float32(0.0), 1: np.array([1.0], np.float32), 2: np.float32(0.3)}) == [(4,)]
    (fresh,) = infer("Range", scalars, {0: np.array(0), 2: np.array(1)})
    assert fresh is not None and len(fresh) == 1 and isinstance(fresh[0], str)
    with pytest.raises(InferError, match="delta is 0"):
        infer("Range", scalars, {0: np.array(0), 1: np.array(3), 2: np.array(0)})
    with pytest.raises(InferError, match="scalar"):
        infer("Range", [(I64, (2,)), (I64, ()), (I64, ())])


def test_fill_and_expand_are_exact_from_constants_and_fresh_otherwise() -> None:
    one = (F32, ())
    assert infer("Fill", [(I64, (2,)), one], {0: np.array([3, 4])}) == [(3, 4)]
    assert infer("Fill", [(I64, (0,)), one], {0: np.zeros(0, np.int64)}) == [()]
    (dims,) = infer("Fill", [(I64, (3,)), one])
    assert dims is not None and len(dims) == 3 and all(isinstance(d, str) for d in dims)
    assert len(set(dims)) == 3  # each unknown dim its own symbol
    assert infer("Fill", [(I64, ("n",)), one]) == [None]  # not even the rank is known
    with pytest.raises(InferError, match="negative"):
        infer("Fill", [(I64, (2,)), one], {0: np.array([3, -1])})
    with pytest.raises(InferError, match="one element"):
        infer("Fill", [(I64, (1,)), (I64, (2,))], {0: np.array([2])})
    assert infer("Expand", [(F32, (3, 1)), (I64, (3,))], {1: np.array([2, 1, 4])}) == [(2, 3, 4)]
    assert infer("Expand", [(F32, (2, 3)), (I64, (1,))], {1: np.array([1])}) == [(2, 3)]
    (out,) = infer("Expand", [(F32, ("seq", 1, 5)), (I64, (2,))])
    assert out is not None and out[0] == "seq" and out[2] == 5 and isinstance(out[1], str)
    with pytest.raises(InferError, match="cannot expand"):
        infer("Expand", [(F32, (3, 2)), (I64, (2,))], {1: np.array([3, 4])})


def test_shape_inference_through_the_validator_accepts_declared_symbols() -> None:
    tensors = [Tensor("x", F32, ("seq", 8)), Tensor("s", I64, (2,)), Tensor.constant("i", np.array(0, np.int64)),
               Tensor("n", I64, ()), Tensor.constant("zero", np.array(0, np.int64)),
               Tensor.constant("one", np.array(1, np.int64)), Tensor("pos", I64, ("seq",))]
    nodes = [Node("shape", "Shape", ("x",), ("s",)), Node("n", "Gather", ("s", "i"), ("n",)),
             Node("range", "Range", ("zero", "n", "one"), ("pos",))]
    graph = make_graph("g", nodes, tensors, ["x"], ["pos"])
    assert validate(graph) == []
    out = evaluate(graph, {"x": np.zeros((5, 8), np.float32)}, {})
    np.testing.assert_array_equal(out["pos"], np.arange(5))


# --- references: values and edge cases ------------------------------------------------------------------------------
def test_unary_math_matches_numpy_and_math() -> None:
    x = np.linspace(-4, 4, 41).astype(np.float32)
    np.testing.assert_array_equal(run("Erf", x), np.array([math.erf(v) for v in x.astype(np.float64)], np.float32))
    np.testing.assert_array_equal(run("Cos", x), np.cos(x.astype(np.float64)).astype(np.float32))
    np.testing.assert_array_equal(run("Sin", x), np.sin(x.astype(np.float64)).astype(np.float32))
    np.testing.assert_array_equal(run("Abs", x), np.abs(x))
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_array_equal(run("Reciprocal", x), (1.0 / x.astype(np.float64)).astype(np.float32))
        np.testing.assert_array_equal(run("Log", x), np.log(x.astype(np.float64)).astype(np.float32))
    zeros = np.array([0.0, -0.0], np.float32)
    assert list(run("Reciprocal", zeros)) == [np.inf, -np.inf]
    assert run("Log", zeros)[0] == -np.inf and np.isnan(run("Log", np.float32([-1.0]))[0])
    ints = np.array([-128, -3, 0, 7, 127], np.int8)
    np.testing.assert_array_equal(run("Abs", ints), [-128, 3, 0, 7, 127])  # two's complement wraps
    np.testing.assert_array_equal(run("Not", np.array([True, False])), [False, True])
    half = run("Erf", np.float16([0.5, -2.0]))
    assert half.dtype == np.float16 and half[0] == np.float16(math.erf(0.5))
    bf = run("Cos", f32_to_bf16(np.float32([0.0, 1.0])))
    assert bf.dtype == np.uint16 and bf[0] == f32_to_bf16(np.float32([1.0]))[0]


def test_pow_max_min_follow_numpy_and_ieee() -> None:
    a = np.float32([[2.0, -2.0, 0.0, -8.0]])
    b = np.float32([3.0, 2.0, 0.0, 1.0 / 3.0])
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(run("Pow", a, b), np.power(a.astype(np.float64), b).astype(np.float32))
    out = run("Pow", a, b)
    assert out[0, 2] == 1.0 and np.isnan(out[0, 3])  # 0 ** 0 = 1; a negative base to a fraction is NaN
    x, y = np.float32([1.0, np.nan, 3.0]), np.float32([2.0, 0.0, np.nan])
    mx, mn = run("Max", x, y), run("Min", x, y)
    assert mx[0] == 2.0 and mn[0] == 1.0 and np.isnan(mx[1:]).all() and np.isnan(mn[1:]).all()
    i = np.array([[-5, 7], [3, -1]], np.int64)
    np.testing.assert_array_equal(run("Max", i, np.array([0], np.int64)), [[0, 7], [3, 0]])
    with pytest.raises(EvaluationError, match="one dtype"):
        run("Max", i, i.astype(np.int32))


def test_mod_sign_rules_of_onnx() -> None:
    a = np.array([7, -7, 7, -7, 0, 6], np.int64)
    b = np.array([3, 3, -3, -3, 5, -3], np.int64)
    np.testing.assert_array_equal(run("Mod", a, b), [1, 2, -2, -1, 0, 0])  # the divisor's sign (Python %)
    np.testing.assert_array_equal(run("Mod", a, b, fmod=True), [1, -1, 1, -1, 0, 0])  # the dividend's sign (C fmod)
    f = run("Mod", np.float32([5.5, -5.5]), np.float32([2.0, 2.0]), fmod=True)
    np.testing.assert_array_equal(f, [1.5, -1.5])
    assert np.isnan(run("Mod", np.float32([1.0]), np.float32([0.0]), fmod=True)[0])
    with pytest.raises(EvaluationError, match="modulo by zero"):
        run("Mod", a, np.zeros(6, np.int64))
    with pytest.raises(EvaluationError, match="fmod=1"):
        run("Mod", np.float32([1.0]), np.float32([2.0]))


def test_comparisons_broadcast_and_treat_nan_as_unequal() -> None:
    a = np.float32([[1.0, 2.0, np.nan]])
    b = np.float32([[1.0], [2.0]])
    np.testing.assert_array_equal(run("Equal", a, b), [[True, False, False], [False, True, False]])
    np.testing.assert_array_equal(run("Less", a, b), [[False, False, False], [True, False, False]])
    np.testing.assert_array_equal(run("GreaterOrEqual", a, b), [[True, True, False], [False, True, False]])
    np.testing.assert_array_equal(run("LessOrEqual", np.int64([3, 4]), np.int64([4])), [True, True])
    np.testing.assert_array_equal(run("Greater", np.int64([3, 4]), np.int64([3])), [False, True])
    w = f32_to_bf16(np.float32([1.0, -2.0, 3.0]))  # bf16 words compare as their values, not as integers
    np.testing.assert_array_equal(run("Less", w, f32_to_bf16(np.float32([0.0]))), [False, True, False])
    t, f = np.array([True, True, False, False]), np.array([True, False, True, False])
    np.testing.assert_array_equal(run("And", t, f), t & f)
    np.testing.assert_array_equal(run("Or", t, f), t | f)
    np.testing.assert_array_equal(run("Xor", t, f), t ^ f)
    with pytest.raises(EvaluationError, match="bool"):
        run("And", t.astype(np.int64), f)


def test_where_broadcasts_three_ways_and_keeps_bits() -> None:
    cond = np.array([[True], [False]])
    x = np.float32([1.0, 2.0, 3.0])
    y = np.float32(-1.0)
    np.testing.assert_array_equal(run("Where", cond, x, y), [[1.0, 2.0, 3.0], [-1.0, -1.0, -1.0]])
    words = np.array([0x7FC1, 0x3F80], np.uint16)  # a NaN payload survives a selection
    assert run("Where", np.array([True, False]), words, np.uint16([0, 0]))[0] == 0x7FC1
    with pytest.raises(EvaluationError, match="bool"):
        run("Where", np.array([1, 0]), x[:2], x[:2])


@pytest.mark.parametrize("k", [-2, -1, 0, 1, 3, 9, -9])
def test_trilu_keeps_one_triangle_of_the_last_two_axes(k: int) -> None:
    x = RNG.standard_normal((2, 4, 5)).astype(np.float32)
    rows, cols = np.indices((4, 5))
    upper, lower = run("Trilu", x, k=k), run("Trilu", x, upper=False, k=k)
    np.testing.assert_array_equal(upper, np.where(cols - rows >= k, x, 0))
    np.testing.assert_array_equal(lower, np.where(cols - rows <= k, x, 0))


def test_cumsum_exclusive_and_reverse() -> None:
    x = np.array([[1, 2, 3, 4], [10, 20, 30, 40]], np.int64)
    np.testing.assert_array_equal(run("CumSum", x, axis=1), [[1, 3, 6, 10], [10, 30, 60, 100]])
    np.testing.assert_array_equal(run("CumSum", x, axis=-1, exclusive=True), [[0, 1, 3, 6], [0, 10, 30, 60]])
    np.testing.assert_array_equal(run("CumSum", x, axis=1, reverse=True), [[10, 9, 7, 4], [100, 90, 70, 40]])
    np.testing.assert_array_equal(run("CumSum", x, axis=1, exclusive=True, reverse=True),
                                  [[9, 7, 4, 0], [90, 70, 40, 0]])
    np.testing.assert_array_equal(run("CumSum", x, axis=0), [[1, 2, 3, 4], [11, 22, 33, 44]])
    assert run("CumSum", np.zeros((3, 0), np.float32), axis=1).shape == (3, 0)
    big = np.int8([100, 100])
    np.testing.assert_array_equal(run("CumSum", big, axis=0), np.int8([100, -56]))  # integers wrap
    f = RNG.standard_normal(1000).astype(np.float32)
    np.testing.assert_array_equal(run("CumSum", f, axis=0), np.cumsum(f.astype(np.float64)).astype(np.float32))


def test_reductions_with_negative_axes_and_empty_inputs() -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(run("ReduceSum", x, axes=(-1,)),
                                  x.astype(np.float64).sum(-1, keepdims=True).astype(np.float32))
    np.testing.assert_array_equal(run("ReduceMax", x, axes=(0, -2), keepdims=False), x.max(axis=(0, 1)))
    np.testing.assert_array_equal(run("ReduceMin", x), x.min(keepdims=True))
    empty = np.zeros((2, 0), np.float32)
    np.testing.assert_array_equal(run("ReduceSum", empty, axes=(1,)), [[0.0], [0.0]])
    np.testing.assert_array_equal(run("ReduceMax", empty, axes=(1,), keepdims=False), [-np.inf, -np.inf])
    np.testing.assert_array_equal(run("ReduceMin", empty, axes=(1,), keepdims=False), [np.inf, np.inf])
    ie = np.zeros((0, 3), np.int32)
    np.testing.assert_array_equal(run("ReduceMax", ie, axes=(0,), keepdims=False), [np.iinfo(np.int32).min] * 3)
    np.testing.assert_array_equal(run("ReduceMin", ie, axes=(0,), keepdims=False), [np.iinfo(np.int32).max] * 3)
    np.testing.assert_array_equal(run("ReduceSum", np.int8([[100, 100]]), axes=(1,)), [[-56]])
    assert np.isnan(run("ReduceMax", np.float32([1.0, np.nan, 3.0]))[0])
    with pytest.raises(EvaluationError, match="distinct axes"):
        run("ReduceSum", x, axes=(3,))


def test_shape_range_fill_expand_values() -> None:
    x = np.zeros((2, 3, 4), np.float32)
    np.testing.assert_array_equal(run("Shape", x), [2, 3, 4])
    np.testing.assert_array_equal(run("Shape", x, start=-2), [3, 4])
    np.testing.assert_array_equal(run("Shape", x, start=1, end=-1), [3])
    assert run("Shape", x, start=5).shape == (0,) and run("Shape", x).dtype == np.int64
    i = np.int64
    np.testing.assert_array_equal(run("Range", i(10), i(-1), i(-3)), [10, 7, 4, 1])  # negative delta
    assert run("Range", i(3), i(3), i(1)).shape == (0,)  # zero length
    assert run("Range", i(3), i(9), i(-2)).shape == (0,)  # the limit behind a negative step
    fr = run("Range", np.float32(1.0), np.float32(-0.5), np.float32(-0.5))
    np.testing.assert_array_equal(fr, np.float32([1.0, 0.5, 0.0]))
    assert fr.dtype == np.float32
    np.testing.assert_array_equal(run("Range", np.int32(-4), np.int32(7), np.int32(5)), np.int32([-4, 1, 6]))
    with pytest.raises(EvaluationError, match="delta is 0"):
        run("Range", i(0), i(3), i(0))
    with pytest.raises(EvaluationError, match="one is needed"):
        run("Range", i(0), np.int32(3), i(1))
    filled = run("Fill", np.array([2, 3], np.int64), np.float32(2.5))
    assert filled.dtype == np.float32 and filled.shape == (2, 3) and (filled == 2.5).all()
    assert run("Fill", np.zeros(0, np.int64), np.float32(0)).shape == ()
    assert run("Fill", np.array([0, 3], np.int64), np.int64(1)).shape == (0, 3)
    assert run("Fill", np.array([2], np.int64), np.array([True])).tolist() == [True, True]
    assert run("Fill", np.array([1], np.int64), np.int32(-7)).tolist() == [-7]
    big = np.int64((1 << 63) - 1)  # exact: never through a float
    assert run("Fill", np.array([2], np.int64), big).tolist() == [big, big]
    word = np.uint16(0xFF80)  # bf16 -inf: the word is copied
    assert run("Fill", np.array([1], np.int64), word).tolist() == [0xFF80]
    with pytest.raises(EvaluationError, match="negative"):
        run("Fill", np.array([2, -1], np.int64), np.float32(0))
    with pytest.raises(EvaluationError, match="one element"):
        run("Fill", np.array([2], np.int64), np.float32([1, 2]))
    v = np.float32([[1.0], [2.0]])
    np.testing.assert_array_equal(run("Expand", v, np.array([2, 1, 3], np.int64)), np.broadcast_to(v, (2, 2, 3)))
    np.testing.assert_array_equal(run("Expand", v, np.array([1], np.int64)), v)  # a 1 keeps X's dim
    with pytest.raises(EvaluationError, match="do not broadcast"):
        run("Expand", v, np.array([3, 3], np.int64))


def test_scalar_constants_keep_rank_zero() -> None:
    t = Tensor.constant("c", np.array(3, np.int64))
    assert t.shape == () and t.numpy().shape == () and int(t.numpy()) == 3


# --- onnx semantics, against onnxruntime -----------------------------------------------------------------------
def _ort(op_type: str, inputs: Sequence[np.ndarray], attrs: dict[str, Any], opset: int = 18) -> np.ndarray:
    """One ONNX node run by onnxruntime; every input a graph input."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper

    names = [f"i{k}" for k in range(len(inputs))]
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
           for n, a in zip(names, inputs, strict=True)]
    out = helper.make_empty_tensor_value_info("y")
    node = helper.make_node(op_type, names, ["y"], **attrs)
    model = helper.make_model(helper.make_graph([node], "t", vis, [out]),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, dict(zip(names, inputs, strict=True)))[0])


def _f(*shape: int, low: float = -3.0, high: float = 3.0) -> np.ndarray:
    return RNG.uniform(low, high, size=shape).astype(np.float32)


def _i(*shape: int) -> np.ndarray:
    return RNG.integers(-9, 10, size=shape).astype(np.int64)


def _b(*shape: int) -> np.ndarray:
    return RNG.random(shape) < 0.5


def _onnx_cases() -> list[tuple[str, str, list[np.ndarray], dict[str, Any], list[np.ndarray], dict[str, Any]]]:
    """(id, ONNX op, our inputs, our attributes, extra ONNX inputs, ONNX attributes)."""
    i64 = np.int64
    cases: list[tuple[str, str, list[np.ndarray], dict[str, Any], list[np.ndarray], dict[str, Any]]] = []
    for op in ("Erf", "Cos", "Sin", "Abs"):
        cases.append((op, op, [_f(3, 7)], {}, [], {}))
    cases += [("Log", "Log", [_f(3, 7, low=0.01)], {}, [], {}),
              ("Reciprocal", "Reciprocal", [_f(3, 7, low=0.2)], {}, [], {}),
              ("Abs_i64", "Abs", [_i(4, 5)], {}, [], {}), ("Not", "Not", [_b(3, 4)], {}, [], {}),
              ("Pow", "Pow", [_f(3, 4, low=0.1), _f(4, low=-2, high=2)], {}, [], {}),
              ("Max", "Max", [_f(3, 4), _f(1, 4)], {}, [], {}), ("Min_i64", "Min", [_i(3, 4), _i(3, 1)], {}, [], {}),
              ("Mod_int", "Mod", [_i(4, 5), np.array([3, -3, 4, -2, 7], i64)], {}, [], {}),
              ("Mod_fmod", "Mod", [_i(4, 5), np.array([3, -3, 4, -2, 7], i64)], {"fmod": True}, [], {"fmod": 1}),
              ("Mod_float", "Mod", [_f(4, 5, low=-9, high=9), _f(5, low=0.5)], {"fmod": True}, [], {"fmod": 1})]
    small = RNG.integers(-2, 3, size=(4, 5)).astype(np.float32)
    for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        cases.append((op, op, [small, small[:1] * -1], {}, [], {}))
    for op in ("And", "Or", "Xor"):
        cases.append((op, op, [_b(3, 1, 4), _b(5, 1)], {}, [], {}))
    cases.append(("Where", "Where", [_b(4, 1, 6), _f(1, 5, 6), _f(6)], {}, [], {}))
    for k in (-1, 0, 2):
        for upper in (True, False):
            cases.append((f"Trilu_{k}_{upper}", "Trilu", [_f(2, 4, 5)], {"k": k, "upper": upper},
                          [np.array(k, i64)], {"upper": int(upper)}))
    for excl in (False, True):
        for rev in (False, True):
            cases.append((f"CumSum_{excl}_{rev}", "CumSum", [_f(3, 6)], {"axis": -1, "exclusive": excl,
                                                                      "reverse": rev},
                          [np.array(-1, i64)], {"exclusive": int(excl), "reverse": int(rev)}))
    cases.append(("CumSum_i64", "CumSum", [_i(2, 7)], {"axis": 1}, [np.array(1, i64)], {}))
    for op in ("ReduceSum", "ReduceMax", "ReduceMin"):
        cases.append((op, op, [_f(2, 3, 4)], {"axes": (-1, 0)}, [np.array([-1, 0], i64)], {}))
        cases.append((f"{op}_flat", op, [_i(3, 4)], {"axes": (1,), "keepdims": False}, [np.array([1], i64)],
                      {"keepdims": 0}))
    cases += [("Shape", "Shape", [_f(2, 3, 4, 5)], {"start": 1, "end": -1}, [], {"start": 1, "end": -1}),
              ("Shape_neg", "Shape", [_f(2, 3, 4)], {"start": -2}, [], {"start": -2}),
              ("Range_neg", "Range", [np.array(10, i64), np.array(-1, i64), np.array(-3, i64)], {}, [], {}),
              ("Range_f32", "Range", [np.array(0.5, np.float32), np.array(3.0, np.float32),
                                      np.array(0.4, np.float32)], {}, [], {}),
              ("Range_empty", "Range", [np.array(4, np.int32), np.array(2, np.int32), np.array(1, np.int32)], {}, [],
               {}),
              ("Expand", "Expand", [_f(3, 1), np.array([2, 1, 4], i64)], {}, [], {}),
              ("Expand_keep", "Expand", [_f(2, 3), np.array([1, 1], i64)], {}, [], {})]
    return cases


@pytest.mark.parametrize("case", _onnx_cases(), ids=lambda c: c[0])
def test_the_reference_agrees_with_onnxruntime(case: tuple[Any, ...]) -> None:
    _, onnx_op, ins, attrs, extra, onnx_attrs = case
    theirs = _ort(onnx_op, [*ins, *extra], onnx_attrs)
    ours = run(onnx_op, *ins, **attrs)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    if ours.dtype.kind == "f":
        np.testing.assert_allclose(ours, theirs, rtol=2e-6, atol=2e-7)
    else:
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("dtype,value", [(np.float32, 1.5), (np.int64, -3), (np.bool_, True), (np.float16, 0.3),
                                         (np.int64, (1 << 53) + 1), (np.int64, (1 << 63) - 1)])
def test_fill_is_constant_of_shape(dtype: Any, value: Any) -> None:
    pytest.importorskip("onnx")
    from onnx import numpy_helper

    shape = np.array([2, 3], np.int64)
    theirs = _ort("ConstantOfShape", [shape], {"value": numpy_helper.from_array(np.array([value], dtype))})
    ours = run("Fill", shape, np.asarray(value, dtype))
    assert ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours, theirs)


# --- validation and serialization ----------------------------------------------------------------------------------
def _graph_with_every_new_op() -> Any:
    c = Tensor.constant
    t = [Tensor("x", F32, ("seq", 4)), Tensor("m", BOOL, ("seq", 4)), c("two", np.array(2.0, np.float32)),
         c("three", np.array(3, np.int64)), c("one", np.array(1, np.int64)), c("zero", np.array(0, np.int64)),
         c("target", np.array([2, 1, 1], np.int64)), c("i64_one", np.array(1, np.int64))]
    names = {}
    nodes: list[Node] = []

    def add(op: str, ins: Sequence[str], dt: DType, shape: Shape, **attrs: Any) -> str:
        name = f"v{len(nodes)}"
        nodes.append(Node(f"n{len(nodes)}_{op}", op, tuple(ins), (name,), attrs))
        t.append(Tensor(name, dt, shape))
        names[op] = name
        return name

    for op in ("Erf", "Reciprocal", "Cos", "Sin", "Abs", "Log"):
        add(op, ["x"], F32, ("seq", 4))
    add("Pow", ["x", "two"], F32, ("seq", 4))
    for op in ("Max", "Min"):
        add(op, ["x", "two"], F32, ("seq", 4))
    add("Mod", ["x", "two"], F32, ("seq", 4), fmod=True)
    for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        add(op, ["x", "two"], BOOL, ("seq", 4))
    add("Not", ["m"], BOOL, ("seq", 4))
    for op in ("And", "Or", "Xor"):
        add(op, ["m", names["Less"]], BOOL, ("seq", 4))
    add("Where", [names["Xor"], "x", "two"], F32, ("seq", 4))
    add("Trilu", ["x"], F32, ("seq", 4), upper=False, k=-1)
    for op in ("ReduceSum", "ReduceMax", "ReduceMin"):
        add(op, ["x"], F32, ("seq", 1), axes=(-1,))
    add("CumSum", ["x"], F32, ("seq", 4), axis=0, exclusive=True)
    add("Shape", ["x"], I64, (1,), end=1)
    add("Range", ["zero", "three", "one"], I64, (3,))
    add("Fill", [names["Shape"], "i64_one"], I64, ("seq",))
    add("Expand", ["x", "target"], F32, (2, "seq", 4))
    outs = [n.outputs[0] for n in nodes]
    return make_graph("every_new_op", nodes, t, ["x", "m"], outs)


def test_a_graph_of_every_new_op_validates_evaluates_and_round_trips() -> None:
    graph = check(_graph_with_every_new_op())
    assert {n.op for n in graph.nodes} == set(NEW_OPS)
    for back in (loads_json(dumps_json(graph)), from_bytes(to_bytes(graph))):
        assert dumps_json(back) == dumps_json(graph)
        assert back.tensor("three").shape == ()  # scalar constants stay scalars
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    out = evaluate(from_bytes(to_bytes(graph)), {"x": x, "m": _b(5, 4)}, {})
    np.testing.assert_array_equal(out[graph.nodes[-4].outputs[0]], [5])  # Shape(x)[:1]
    np.testing.assert_array_equal(out[graph.nodes[-2].outputs[0]], np.ones(5, np.int64))  # Fill of that shape
    assert out[graph.nodes[-1].outputs[0]].shape == (2, 5, 4)

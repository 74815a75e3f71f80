"""The ONNX importer where ONNX's semantics are easy to get subtly wrong: bf16 constants of decompositions, exact
ConstantOfShape values, ONNX's Slice clamping against run-time sizes, int32 size vectors, Squeeze without axes,
negative ids into an embedding table, int64 wrap-around in folded size arithmetic, and symbol names that must not
alias. Each case is compared with onnxruntime — or, where onnxruntime has no bf16 kernel for the op, with float32
arithmetic rounded to bf16 — through uaii.ir's reference here, and again on the CPU backend in
tests/runtime/test_onnx_cpu.py (the ``check`` and ``uaii_run`` fixtures). Beside them: what the loader does around
the graph (hub-cache symlinks, chat templates, import notes, UAII's internal ops in a file).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402
from test_onnx_import import I64, F, check_reference, make, ops, ort_run, weights_of  # noqa: E402

from uaii.ir import FormatError  # noqa: E402
from uaii.ir.reference import bf16_to_f32, evaluate, f32_to_bf16  # noqa: E402
from uaii.loaders import LoadedModel, LoaderError, load_model  # noqa: E402
from uaii.loaders.onnx import OnnxImportError  # noqa: E402
from uaii.loaders.onnx.values import GENERATED, sanitize_symbol  # noqa: E402

BF, I32 = TP.BFLOAT16, TP.INT32


def run_reference(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """UAII's outputs of the model at ``path`` (uaii.ir's reference evaluator), bf16 as raw words."""
    model = load_model(path)
    return {k: np.asarray(v) for k, v in evaluate(model.graph, dict(feeds), weights_of(model)).items()}


@pytest.fixture
def check() -> Any:
    """onnxruntime vs UAII on the same model (tests/runtime/test_onnx_cpu.py adds the CPU backend)."""
    return check_reference


@pytest.fixture
def uaii_run() -> Any:
    """UAII's outputs where the expected ones come from elsewhere (tests/runtime/test_onnx_cpu.py: the reference
    and the CPU backend, which must agree)."""
    return run_reference


def words(x: Any) -> np.ndarray:
    """float values rounded to bf16 words."""
    return f32_to_bf16(np.asarray(x, np.float32))


def ort_run_bf16(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime on a model with bf16 graph inputs/outputs (its Python API cannot pass bf16 arrays): each bf16
    input fed as float32 and Cast to bf16 inside, each bf16 output Cast to float32 — exact both ways — and given
    back as bf16 words."""
    import onnxruntime as ort

    model = onnx.load(str(path))
    g = model.graph
    casts, bf16_out = [], []
    for vi in g.input:
        if vi.type.tensor_type.elem_type == BF:
            casts.append(helper.make_node("Cast", [f"{vi.name}__f32"], [vi.name], to=BF))
            vi.name, vi.type.tensor_type.elem_type = f"{vi.name}__f32", F
    for vo in g.output:
        if vo.type.tensor_type.elem_type == BF:
            g.node.append(helper.make_node("Cast", [vo.name], [f"{vo.name}__f32"], to=F))
            bf16_out.append(vo.name)
            vo.name, vo.type.tensor_type.elem_type = f"{vo.name}__f32", F
    for c in reversed(casts):
        g.node.insert(0, c)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    wide = {(f"{k}__f32" if v.dtype == np.uint16 else k): (bf16_to_f32(v) if v.dtype == np.uint16 else v)
            for k, v in feeds.items()}
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, wide), strict=True))
    return {(k[:-5] if k[:-5] in bf16_out else k): (words(v) if k[:-5] in bf16_out else v) for k, v in out.items()}


def twin(tmp: Path, nodes: list[Any], inputs: list[tuple[str, int, Any]], outputs: list[tuple[str, int, Any]],
         **kw: Any) -> tuple[Path, Path]:
    """The model with bf16 I/O, and its float32 twin (every bf16 replaced by float32) for onnxruntime, which has
    no bf16 kernel of Floor, Ceil, Pow or Gemm."""
    def f32(specs: list[tuple[str, int, Any]]) -> list[tuple[str, int, Any]]:
        return [(n, F if t == BF else t, s) for n, t, s in specs]

    (tmp / "bf16").mkdir()
    (tmp / "f32").mkdir()
    return (make(tmp / "bf16", nodes, inputs, outputs, **kw), make(tmp / "f32", nodes, f32(inputs), f32(outputs), **kw))


def as_bf16_of_f32_math(p32: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime's float32 outputs on the bf16 feeds (widened exactly), rounded to bf16 words."""
    wide = {k: bf16_to_f32(v) if v.dtype == np.uint16 else v for k, v in feeds.items()}
    return {k: words(v) for k, v in ort_run(p32, wide).items()}


# --- 1. bf16 constants of decompositions ------------------------------------------------------------------------
XS = [2.7, -2.7, 0.5, -0.5, 3.0, 1e30, -1e30, 7.25, -100.5, float("inf"), float("-inf")]


@pytest.mark.parametrize("op", ["Floor", "Ceil"])
def test_bf16_floor_and_ceil(tmp_path: Path, op: str, uaii_run: Any) -> None:
    p16, p32 = twin(tmp_path, [helper.make_node(op, ["x"], ["y"])], [("x", BF, [len(XS)])], [("y", BF, None)])
    feeds = {"x": words(XS)}
    got, want = uaii_run(p16, feeds)["y"], as_bf16_of_f32_math(p32, feeds)["y"]
    np.testing.assert_array_equal(bf16_to_f32(got), bf16_to_f32(want))


@pytest.mark.parametrize("exponent", [np.float32(2.0), np.int64(3), np.float32(0.5)])
def test_bf16_pow_with_a_constant_exponent(tmp_path: Path, exponent: np.generic, uaii_run: Any) -> None:
    nodes = [helper.make_node("Constant", [], ["e"], value=numpy_helper.from_array(np.asarray(exponent))),
             helper.make_node("Pow", ["x", "e"], ["y"])]
    p16, p32 = twin(tmp_path, nodes, [("x", BF, [4])], [("y", BF, None)])
    feeds = {"x": words([1.5, 2.0, 3.0, 4.0])}
    got, want = uaii_run(p16, feeds)["y"], as_bf16_of_f32_math(p32, feeds)["y"]
    np.testing.assert_array_equal(got, want)


def test_bf16_gemm_alpha_and_beta(tmp_path: Path, uaii_run: Any) -> None:
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=0.5, beta=2.0)]
    p16, p32 = twin(tmp_path, nodes, [("a", BF, [2, 3]), ("b", BF, [3, 2]), ("c", BF, [2])], [("y", BF, None)])
    rng = np.random.default_rng(5)
    feeds = {"a": words(rng.integers(-4, 5, (2, 3))), "b": words(rng.integers(-4, 5, (3, 2))),
             "c": words([1.5, -3.0])}  # small integers: every step is exact in bf16 and float32 alike
    got, want = uaii_run(p16, feeds)["y"], as_bf16_of_f32_math(p32, feeds)["y"]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("to", "np_to"), [(TP.INT64, np.int64), (TP.INT32, np.int32)])
def test_bf16_cast_to_integer_truncates_like_onnxruntime(tmp_path: Path, to: int, np_to: Any, uaii_run: Any) -> None:
    values = [2.7, -2.7, 0.5, -0.5, 3.0, -7.9, 100.5]
    p = make(tmp_path, [helper.make_node("Cast", ["x"], ["y"], to=to)], [("x", BF, [len(values)])],
             [("y", to, None)])
    feeds = {"x": words(values)}
    got = uaii_run(p, feeds)["y"]
    want = ort_run_bf16(p, feeds)["y"]
    assert got.dtype == np_to
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("pos", "neg"), [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_bf16_isinf(tmp_path: Path, pos: int, neg: int, uaii_run: Any) -> None:
    p = make(tmp_path, [helper.make_node("IsInf", ["x"], ["y"], detect_positive=pos, detect_negative=neg)],
             [("x", BF, [len(XS) + 1])], [("y", TP.BOOL, None)], opset=20)
    feeds = {"x": words([*XS, float("nan")])}
    np.testing.assert_array_equal(uaii_run(p, feeds)["y"], ort_run_bf16(p, feeds)["y"])


# --- 2. ConstantOfShape keeps its value exactly ------------------------------------------------------------------
COS_VALUES = [(BF, float("-inf")), (BF, 0.3), (I64, (1 << 53) + 1), (I64, (1 << 63) - 1), (I64, -(1 << 63)),
              (I32, -7), (TP.BOOL, True), (TP.FLOAT16, 0.1), (F, -2.5)]


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic_shape", "constant_shape"])
@pytest.mark.parametrize(("elem", "value"), COS_VALUES)
def test_constant_of_shape_value_is_exact(tmp_path: Path, elem: int, value: Any, symbolic: bool,
                                          uaii_run: Any) -> None:
    tensor = helper.make_tensor("v", elem, [1], [value])
    shape_of = [helper.make_node("Shape", ["x"], ["s"])] if symbolic else [
        helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.asarray([3], np.int64)))]
    p = make(tmp_path, [*shape_of, helper.make_node("ConstantOfShape", ["s"], ["y"], value=tensor)],
             [("x", F, ["n"])], [("y", elem, None)])
    feeds = {"x": np.zeros(3, np.float32)}
    got, want = uaii_run(p, feeds)["y"], ort_run_bf16(p, feeds)["y"]
    assert got.dtype == want.dtype and got.shape == want.shape == (3,)
    np.testing.assert_array_equal(got, want)


def test_constant_of_shape_of_a_run_time_shape(tmp_path: Path, check: Any) -> None:
    """The shape input itself computed at run time (a Cast of a fed vector): a Fill of that shape."""
    nodes = [helper.make_node("Abs", ["s"], ["a"]),
             helper.make_node("ConstantOfShape", ["a"], ["y"], value=helper.make_tensor("v", I64, [1], [9]))]
    p = make(tmp_path, nodes, [("s", I64, [2])], [("y", I64, None)])
    for s in ([2, 3], [0, 4]):
        check(p, {"s": np.asarray(s, np.int64)})


@pytest.mark.parametrize("shape", [["n", 3], [2, 3]], ids=["symbolic", "static"])
def test_dropout_mask_is_all_true(tmp_path: Path, shape: list[Any], check: Any) -> None:
    """Dropout's mask output: a Fill of true (it once carried Fill's old float attributes)."""
    p = make(tmp_path, [helper.make_node("Dropout", ["x"], ["y", "mask"])], [("x", F, shape)],
             [("y", F, None), ("mask", TP.BOOL, None)])
    check(p, {"x": np.ones((2, 3), np.float32)})


# --- 4. Squeeze without axes --------------------------------------------------------------------------------------
def test_squeeze_without_axes_of_symbolic_dims_is_refused(tmp_path: Path) -> None:
    p = make(tmp_path, [helper.make_node("Squeeze", ["x"], ["y"])], [("x", F, ["a", 1, "b"])], [("y", F, None)])
    with pytest.raises(OnnxImportError, match=r"Squeeze without axes.*\['a', 'b'\]"):
        load_model(p)


def test_squeeze_without_axes_of_static_dims(tmp_path: Path, check: Any) -> None:
    p = make(tmp_path, [helper.make_node("Squeeze", ["x"], ["y"])], [("x", F, [1, 3, 1, 2])], [("y", F, None)])
    check(p, {"x": np.arange(6, dtype=np.float32).reshape(1, 3, 1, 2)})


# --- 5. Slice with a start known only at run time ----------------------------------------------------------------
@pytest.mark.parametrize(("end", "past"), [(100, 2), (100, 11), (3, 1), (3, 5), (1 << 40, 4)])
def test_slice_from_a_run_time_start_clamps_like_onnx(tmp_path: Path, end: int, past: int, check: Any) -> None:
    """x[:, p:end] with p a run-time size: the end clamps to x's (symbolic) length, a start past it is empty."""
    c = numpy_helper.from_array
    nodes = [helper.make_node("Shape", ["past"], ["s"]),
             helper.make_node("Constant", [], ["i0"], value=c(np.asarray([0], np.int64))),
             helper.make_node("Gather", ["s", "i0"], ["start"]),
             helper.make_node("Constant", [], ["e"], value=c(np.asarray([end], np.int64))),
             helper.make_node("Constant", [], ["ax"], value=c(np.asarray([1], np.int64))),
             helper.make_node("Slice", ["x", "start", "e", "ax"], ["y"])]
    p = make(tmp_path, nodes, [("x", F, ["a", "b"]), ("past", F, ["p"])], [("y", F, None)])
    check(p, {"x": np.arange(16, dtype=np.float32).reshape(2, 8), "past": np.zeros(past, np.float32)})


def test_slice_between_two_run_time_sizes(tmp_path: Path, check: Any) -> None:
    """x[p : q] along a static axis of 6, both bounds run-time sizes: a start past the end is an empty slice."""
    nodes = [helper.make_node("Shape", ["p"], ["sp"]), helper.make_node("Shape", ["q"], ["sq"]),
             helper.make_node("Slice", ["x", "sp", "sq"], ["y"])]
    p = make(tmp_path, nodes, [("x", F, [6, 2]), ("p", F, ["P"]), ("q", F, ["Q"])], [("y", F, None)])
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    for n_p, n_q in ((1, 3), (4, 2), (0, 6), (5, 5)):
        check(p, {"x": x, "p": np.zeros(n_p, np.float32), "q": np.zeros(n_q, np.float32)})


def test_a_run_time_end_past_a_static_axis_fails_instead_of_clamping(tmp_path: Path) -> None:
    """The one bound not clamped (docs/loaders.md): a run-time end is taken to lie within the axis. A run where it
    does not is an error, never a silently different slice."""
    from uaii.ir.reference import EvaluationError

    nodes = [helper.make_node("Shape", ["q"], ["sq"]), _c("zero", np.asarray([0], np.int64)),
             helper.make_node("Slice", ["x", "zero", "sq"], ["y"])]
    p = make(tmp_path, nodes, [("x", F, [6, 2]), ("q", F, ["Q"])], [("y", F, None)])
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    np.testing.assert_array_equal(run_reference(p, {"x": x, "q": np.zeros(4, np.float32)})["y"], x[:4])
    with pytest.raises(EvaluationError, match="out of range"):
        run_reference(p, {"x": x, "q": np.zeros(9, np.float32)})


# --- 6. int32 size vectors stay int32 -------------------------------------------------------------------------------
def _shape32(x: str = "x") -> list[Any]:
    return [helper.make_node("Shape", [x], [f"{x}_s"]), helper.make_node("Cast", [f"{x}_s"], [f"{x}_s32"], to=I32)]


def _c(name: str, value: Any) -> Any:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def test_int32_size_vectors_keep_their_type(tmp_path: Path, check: Any) -> None:
    """Gather, Slice, Split, Max, Where and Concat of an int32 shape vector with symbols: int32 results."""
    nodes = [*_shape32(), _c("i1", np.int64(1)), helper.make_node("Gather", ["x_s32", "i1"], ["g"]),
             _c("st", np.asarray([1], np.int64)), _c("en", np.asarray([3], np.int64)),
             helper.make_node("Slice", ["x_s32", "st", "en"], ["sl"]),
             helper.make_node("Split", ["x_s32"], ["p0", "p1", "p2"], num_outputs=3),
             _c("four", np.asarray([4, 4, 4], np.int32)), helper.make_node("Max", ["x_s32", "four"], ["mx"]),
             _c("pick", np.asarray([True, False, True])), helper.make_node("Where", ["pick", "x_s32", "four"], ["wh"]),
             helper.make_node("Concat", ["p0", "p2"], ["cat"], axis=0)]
    outs = [(n, I32, None) for n in ("g", "sl", "p0", "p1", "mx", "wh", "cat")]
    p = make(tmp_path, nodes, [("x", F, ["a", "b", 5])], outs)
    check(p, {"x": np.zeros((2, 7, 5), np.float32)})


# --- 10. int pairs of a symbolic vector compute as the IR op does ------------------------------------------------
def test_int_pairs_of_a_size_vector_wrap_like_int64(tmp_path: Path, check: Any) -> None:
    """[n, 3] * [2^62, 2^62]: the symbolic pair stays a run-time Mul, the int pair wraps as int64 arithmetic does
    (through uaii.ir's Mul reference, not Python's unbounded ints); C-style Div of negative ints too."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), _c("big", np.asarray([1 << 62, 1 << 62], np.int64)),
             helper.make_node("Mul", ["s", "big"], ["m"]), _c("neg", np.asarray([-7, -7], np.int64)),
             helper.make_node("Sub", ["s", "neg"], ["sub"]), _c("two", np.asarray([-2, -2], np.int64)),
             helper.make_node("Mul", ["s", "two"], ["negs"]), _c("three", np.asarray([3, 3], np.int64)),
             helper.make_node("Div", ["negs", "three"], ["d"])]
    p = make(tmp_path, nodes, [("x", F, ["n", 3])], [("m", I64, None), ("sub", I64, None), ("d", I64, None)])
    check(p, {"x": np.zeros((5, 3), np.float32)})


def test_shape_start_end_follow_the_ir_shape_op(tmp_path: Path, check: Any) -> None:
    nodes = [helper.make_node("Shape", ["x"], ["a"], start=-3, end=-1),
             helper.make_node("Shape", ["x"], ["b"], start=9),
             helper.make_node("Shape", ["x"], ["c"], start=-9, end=2)]
    p = make(tmp_path, nodes, [("x", F, ["n", 3, "m", 2])], [("a", I64, None), ("b", I64, None), ("c", I64, None)])
    check(p, {"x": np.zeros((4, 3, 5, 2), np.float32)})


# --- 11. symbol names -----------------------------------------------------------------------------------------------
def test_a_dim_param_named_like_a_generated_symbol_is_not_that_sum(tmp_path: Path, check: Any) -> None:
    """a + b compared with a dim called "a_plus_b": different sizes, so Equal must not fold to true."""
    nodes = [helper.make_node("Shape", ["x"], ["sx"]), helper.make_node("Shape", ["y"], ["sy"]),
             helper.make_node("Shape", ["z"], ["sz"]), helper.make_node("Add", ["sx", "sy"], ["sum"]),
             helper.make_node("Equal", ["sum", "sz"], ["same"]),
             helper.make_node("Max", ["sx", "sz"], ["mx"])]
    p = make(tmp_path, nodes, [("x", F, ["a"]), ("y", F, ["b"]), ("z", F, ["a_plus_b"])],
             [("same", TP.BOOL, None), ("mx", I64, None)])
    model = check(p, {"x": np.zeros(1, np.float32), "y": np.zeros(2, np.float32), "z": np.zeros(5, np.float32)})
    check(p, {"x": np.zeros(2, np.float32), "y": np.zeros(3, np.float32), "z": np.zeros(5, np.float32)})
    assert model.graph.tensor("z").shape[0] != "a_plus_b"


def test_generated_symbols_are_identifiers(tmp_path: Path, check: Any) -> None:
    """Max/Min of a size and negative or positive ints, used as a Range bound: valid IR symbols everywhere."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), _c("i0", np.asarray(0, np.int64)),
             helper.make_node("Gather", ["s", "i0"], ["n"]), _c("m1", np.asarray(-1, np.int64)),
             _c("three", np.asarray(3, np.int64)), helper.make_node("Max", ["n", "m1"], ["a"]),
             helper.make_node("Max", ["n", "three"], ["b"]), helper.make_node("Min", ["n", "three"], ["c"]),
             _c("one", np.asarray(1, np.int64)), helper.make_node("Range", ["i0", "a", "one"], ["ra"]),
             helper.make_node("Range", ["i0", "b", "one"], ["rb"]),
             helper.make_node("Range", ["c", "b", "one"], ["rc"])]
    p = make(tmp_path, nodes, [("x", F, ["n"])], [(n, I64, None) for n in ("ra", "rb", "rc")])
    for n in (1, 3, 6):
        model = check(p, {"x": np.zeros(n, np.float32)})
    for t in model.graph.tensors:
        assert all(isinstance(d, int) or d.isidentifier() for d in t.shape), (t.name, t.shape)


@given(st.text(alphabet="ab_09 +-.", max_size=16))
def test_sanitized_dim_params_never_look_generated(name: str) -> None:
    sym = sanitize_symbol(name)
    assert sym.isidentifier() and GENERATED.search(sym) is None, (name, sym)


def test_plain_dim_params_keep_their_names() -> None:
    assert [sanitize_symbol(n) for n in ("batch_size", "sequence length", "a_plus_b", "past_sequence_length + 1")] \
        == ["batch_size", "sequence_length", "a_plusb", "past_sequence_length1"]


# --- 12. negative ids into a weight table ---------------------------------------------------------------------------
def test_constant_negative_ids_into_a_weight_table(tmp_path: Path, check: Any) -> None:
    table = np.random.default_rng(3).standard_normal((40, 4)).astype(np.float32)
    nodes = [_c("ids", np.asarray([[-1, 0, -40, 5]], np.int64)), helper.make_node("Gather", ["table", "ids"], ["e"]),
             helper.make_node("Add", ["e", "x"], ["y"])]
    p = make(tmp_path, nodes, [("x", F, [1, 4, 4])], [("y", F, None)], {"table": table})
    check(p, {"x": np.zeros((1, 4, 4), np.float32)})


# --- 3. nothing big is computed at load time -------------------------------------------------------------------
def _peak_bytes(fn: Any) -> tuple[Any, int]:
    import tracemalloc

    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


HOSTILE_SIZES = [
    ("range_2_40", [_c("a", np.int64(0)), _c("b", np.int64(1 << 40)), _c("d", np.int64(1)),
                    helper.make_node("Range", ["a", "b", "d"], ["y"])], I64),
    ("range_2_28", [_c("a", np.int64(0)), _c("b", np.int64(1 << 28)), _c("d", np.int64(1)),
                    helper.make_node("Range", ["a", "b", "d"], ["y"])], I64),
    ("cos_2_40", [_c("s", np.asarray([1 << 20, 1 << 20], np.int64)),
                  helper.make_node("ConstantOfShape", ["s"], ["y"])], F),
    ("expand_2_30", [_c("x", np.float32(1)), _c("s", np.asarray([1 << 15, 1 << 15], np.int64)),
                     helper.make_node("Expand", ["x", "s"], ["y"])], F),
    ("trilu_empty_2_40", [_c("x", np.zeros((1 << 40, 0), np.float32)), helper.make_node("Trilu", ["x"], ["y"])], F),
]


@pytest.mark.parametrize(("name", "nodes", "elem"), HOSTILE_SIZES, ids=[h[0] for h in HOSTILE_SIZES])
def test_huge_constant_results_are_never_computed_at_load_time(tmp_path: Path, name: str, nodes: list[Any],
                                                               elem: int) -> None:
    """Constant inputs whose result would be gigabytes (or, empty, whose reference would still work per dim): the
    node stays a run-time node (the planner judges its size), and loading allocates no more than a few MiB."""
    p = make(tmp_path, nodes, [], [("y", elem, None)])
    model, peak = _peak_bytes(lambda: load_model(p))
    assert peak < 16 << 20, f"{name}: loading allocated {peak} bytes"
    assert ops(model)[-1] in ("Range", "Fill", "Expand", "Trilu")


def test_a_negative_size_from_a_symbolic_shape_is_refused(tmp_path: Path) -> None:
    nodes = [helper.make_node("Shape", ["x"], ["s"]), _c("m", np.asarray([-5], np.int64)),
             helper.make_node("Concat", ["s", "m"], ["t"], axis=0), helper.make_node("ConstantOfShape", ["t"], ["y"])]
    p = make(tmp_path, nodes, [("x", F, ["n"])], [("y", F, None)])
    with pytest.raises(OnnxImportError, match="negative"):
        load_model(p)


# --- 7, 8, 9, 13: the loader around the graph ---------------------------------------------------------------------
def _relu(tmp: Path, name: str = "model.onnx", **kw: Any) -> Path:
    return make(tmp, [helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, None)], name=name, **kw)


def test_import_notes_are_logged(tmp_path: Path, caplog: Any) -> None:
    p = make(tmp_path, [helper.make_node("Cast", ["x"], ["y"], to=TP.FLOAT16, saturate=0)], [("x", F, [2])],
             [("y", TP.FLOAT16, None)], opset=19)
    with caplog.at_level(logging.WARNING, "uaii.loaders"):
        model = load_model(p)
    assert "saturate=0" in model.source_metadata["onnx.import_notes"]
    assert any("saturate=0" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_uaii_internal_ops_in_a_model_file_are_refused(tmp_path: Path) -> None:
    from uaii.loaders.onnx.contrib_attention import KV_DOMAIN
    from uaii.loaders.onnx.importer import INTERNAL_DOMAINS, import_graph
    from uaii.loaders.onnx.reader import open_onnx

    assert KV_DOMAIN in INTERNAL_DOMAINS
    node = helper.make_node("Attention", ["x", "x", "x", "x", "x"], ["y", "pk", "pv"], domain=KV_DOMAIN,
                            num_heads=1, kv_heads=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [1, 2, 4])],
                              [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(KV_DOMAIN, 1)],
                              ir_version=10)
    p = tmp_path / "model.onnx"
    onnx.save(model, p)
    with pytest.raises(OnnxImportError, match=r"uaii\.kv::Attention"):
        load_model(p)
    with pytest.raises(OnnxImportError, match=r"uaii\.kv::Attention \(internal to UAII"):
        import_graph(open_onnx(p))


def test_a_hub_cache_snapshot_finds_its_tokenizer_files(tmp_path: Path) -> None:
    """Hugging Face's hub cache: snapshots/<rev>/<file> are links to blobs/<hash>. The tokenizer files are the
    snapshot's (beside the path given), not the blobs directory's (where the model file really is)."""
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snap.mkdir(parents=True)
    _relu(blobs, name="aaaa")
    (blobs / "bbbb").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}')
    (blobs / "cccc").write_text("{{ messages }}")
    os.symlink("../../blobs/aaaa", snap / "model.onnx")
    os.symlink("../../blobs/bbbb", snap / "tokenizer.json")
    os.symlink("../../blobs/cccc", snap / "chat_template.jinja")
    model = load_model(snap / "model.onnx")
    assert model.tokenizer_files == {"tokenizer_json": snap / "tokenizer.json",
                                     "chat_template": snap / "chat_template.jinja"}
    assert model.chat_template == "{{ messages }}"


def test_external_data_behind_a_hub_cache_link_is_refused_with_the_reason(tmp_path: Path) -> None:
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    (tmp_path / "export").mkdir()
    blobs.mkdir()
    snap.mkdir(parents=True)
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", F, [1, 64])],
                              [helper.make_tensor_value_info("y", F, None)], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, tmp_path / "export" / "model.onnx", save_as_external_data=True, location="model.onnx_data",
              size_threshold=0)
    os.replace(tmp_path / "export" / "model.onnx", blobs / "aaaa")
    os.replace(tmp_path / "export" / "model.onnx_data", blobs / "dddd")
    os.symlink("../../blobs/aaaa", snap / "model.onnx")
    os.symlink("../../blobs/dddd", snap / "model.onnx_data")
    with pytest.raises(FormatError, match=r"model\.onnx_data"):
        load_model(snap / "model.onnx")
    for name in ("model.onnx", "model.onnx_data"):  # the fix docs/loaders.md gives: real files, one directory
        (snap / name).unlink()
    os.replace(blobs / "aaaa", snap / "model.onnx")
    os.replace(blobs / "dddd", snap / "model.onnx_data")
    assert isinstance(load_model(snap / "model.onnx"), LoadedModel)


def test_a_chat_template_that_is_not_utf8_is_a_format_error(tmp_path: Path) -> None:
    _relu(tmp_path)
    (tmp_path / "chat_template.jinja").write_bytes(b"{{ bos }}\xff\xfe")
    with pytest.raises(FormatError, match=r"chat_template\.jinja.*not UTF-8.*offset 0x9"):
        load_model(tmp_path / "model.onnx")


def test_chat_templates_are_read_as_the_hugging_face_loader_reads_them(tmp_path: Path) -> None:
    import json

    _relu(tmp_path)
    named = [{"name": "tool_use", "template": "T"}, {"name": "rag", "template": "R"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert load_model(tmp_path / "model.onnx").chat_template == "T"  # no "default": the first, as hf.py does


def test_loader_errors_are_loader_errors(tmp_path: Path) -> None:
    """Graph-level problems are OnnxImportError (a LoaderError); file-level ones FormatError (docs/loaders.md)."""
    assert issubclass(OnnxImportError, LoaderError) and not issubclass(FormatError, LoaderError)
    p = make(tmp_path, [helper.make_node("Squeeze", ["x"], ["y"])], [("x", F, ["a"])], [("y", F, None)])
    with pytest.raises(LoaderError):
        load_model(p)

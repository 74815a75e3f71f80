"""The ONNX importer, op by op: hand-built graphs (onnx.helper) run by onnxruntime and by UAII on the same inputs.

Each case is imported with ``load_model`` (reader, importer, validation) and evaluated with uaii.ir's reference;
it must match onnxruntime within 1e-4 (allclose rtol = atol). tests/runtime/test_onnx_cpu.py runs the same cases
on the CPU backend (uaii-loaders' tests may not import the runtime). Beside the numbers: what the IR looks like
where it matters (shape arithmetic folded away, weights kept as references with ``transpose_b``, Embedding for a
gathered table), the one error listing every unsupported op, and symbolic dims.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402
from onnx_lm_support import ort_run, weights_of  # noqa: E402  (re-exported: the semantics and CPU copies use them)

from uaii.ir.reference import evaluate  # noqa: E402
from uaii.loaders import LoadedModel, LoaderError, load_model  # noqa: E402
from uaii.loaders.onnx import OnnxImportError, sanitize_symbol, supported_ops  # noqa: E402

TOL = 1e-4
RNG = np.random.default_rng(1234)
F, I64, B = TP.FLOAT, TP.INT64, TP.BOOL

Spec = tuple[str, int, Sequence[Any] | None]


# --- helpers ------------------------------------------------------------------------------------------------
def make(tmp: Path, nodes: list[Any], inputs: Sequence[Spec], outputs: Sequence[Spec],
         inits: Mapping[str, np.ndarray] | None = None, opset: int = 18, name: str = "model.onnx") -> Path:
    graph = helper.make_graph(
        nodes, "case", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=[numpy_helper.from_array(np.asarray(a), k) for k, a in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    path = tmp / name
    onnx.save(model, path)
    return path


def assert_match(got: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], what: str,
                 tol: float = TOL) -> None:
    for name, want in expected.items():
        have = np.asarray(got[name])
        assert have.shape == want.shape, f"{what} {name}: shape {have.shape} != {want.shape}"
        if want.dtype.kind in "biu":
            assert have.dtype == want.dtype, f"{what} {name}: dtype {have.dtype} != {want.dtype}"
            np.testing.assert_array_equal(have, want, err_msg=f"{what} {name}")
        else:
            np.testing.assert_allclose(have.astype(np.float64), want, rtol=tol, atol=tol, err_msg=f"{what} {name}")


def check_reference(path: Path, feeds: Mapping[str, np.ndarray], tol: float = TOL) -> LoadedModel:
    """onnxruntime vs uaii.ir's reference evaluator on ``feeds``; returns the loaded model."""
    expected = ort_run(path, feeds)
    model = load_model(path)
    assert_match(evaluate(model.graph, dict(feeds), weights_of(model)), expected, "reference", tol)
    return model


@pytest.fixture
def check() -> Any:
    """How a case is checked: here against the reference evaluator; tests/runtime/test_onnx_cpu.py runs the same
    cases with a ``check`` that also runs the CPU backend."""
    return check_reference


def ops(model: LoadedModel) -> list[str]:
    return [n.op for n in model.graph.nodes]


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# --- elementwise ----------------------------------------------------------------------------------------------
UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Erf", "Cos", "Sin", "Abs", "Floor", "Ceil"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(tmp_path: Path, op: str, check: Any) -> None:
    p = make(tmp_path, [helper.make_node(op, ["x"], ["y"])], [("x", F, ["batch", 5])], [("y", F, None)])
    check(p, {"x": randn(3, 5) * 2})


@pytest.mark.parametrize("op", ["Sqrt", "Log", "Reciprocal"])
def test_unary_positive_domain(tmp_path: Path, op: str, check: Any) -> None:
    p = make(tmp_path, [helper.make_node(op, ["x"], ["y"])], [("x", F, [4, "n"])], [("y", F, None)])
    check(p, {"x": np.abs(randn(4, 6)) + 0.1})


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_opset20(tmp_path: Path, approximate: str, check: Any) -> None:
    p = make(tmp_path, [helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)], [("x", F, [2, 8])],
             [("y", F, None)], opset=20)
    assert ops(check(p, {"x": randn(2, 8) * 3})) == ["Gelu"]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
def test_binary_broadcast(tmp_path: Path, op: str, check: Any) -> None:
    p = make(tmp_path, [helper.make_node(op, ["a", "b"], ["y"])], [("a", F, ["n", 1, 4]), ("b", F, [3, 1])],
             [("y", F, None)])
    check(p, {"a": randn(2, 1, 4), "b": randn(3, 1) + 2.0})


def test_variadic_max_and_min_and_pow_with_int_exponent(tmp_path: Path, check: Any) -> None:
    nodes = [helper.make_node("Max", ["a", "b", "c"], ["mx"]), helper.make_node("Min", ["a", "b", "c"], ["mn"]),
             helper.make_node("Pow", ["a", "two"], ["sq"]), helper.make_node("Pow", ["pos", "a"], ["ex"])]
    p = make(tmp_path, nodes, [("a", F, [3, 4]), ("b", F, [3, 4]), ("c", F, [4]), ("pos", F, [3, 4])],
             [("mx", F, None), ("mn", F, None), ("sq", F, None), ("ex", F, None)], {"two": np.array(2, np.int64)})
    check(p, {"a": randn(3, 4), "b": randn(3, 4), "c": randn(4), "pos": np.abs(randn(3, 4)) + 0.5})


def test_mod_integer_and_fmod(tmp_path: Path, check: Any) -> None:
    nodes = [helper.make_node("Mod", ["i", "j"], ["m"]), helper.make_node("Mod", ["x", "z"], ["f"], fmod=1)]
    p = make(tmp_path, nodes, [("i", I64, [6]), ("j", I64, [6]), ("x", F, [6]), ("z", F, [6])],
             [("m", I64, None), ("f", F, None)])
    check(p, {"i": np.array([7, -7, 7, -7, 0, 5]), "j": np.array([3, 3, -3, -3, 2, 5]),
              "x": randn(6) * 5, "z": np.abs(randn(6)) + 0.5})


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_compare(tmp_path: Path, op: str, check: Any) -> None:
    p = make(tmp_path, [helper.make_node(op, ["a", "b"], ["y"])], [("a", I64, [5]), ("b", I64, [1])],
             [("y", B, None)])
    check(p, {"a": np.array([1, 2, 3, 4, 5]), "b": np.array([3])})


def test_logic_where_isnan_isinf(tmp_path: Path, check: Any) -> None:
    nodes = [helper.make_node("Greater", ["x", "zero"], ["pos"]), helper.make_node("IsNaN", ["x"], ["nan"]),
             helper.make_node("IsInf", ["x"], ["inf"]),
             helper.make_node("IsInf", ["x"], ["pinf"], detect_negative=0),
             helper.make_node("Or", ["nan", "inf"], ["bad"]), helper.make_node("Not", ["bad"], ["good"]),
             helper.make_node("And", ["good", "pos"], ["keep"]), helper.make_node("Xor", ["pos", "nan"], ["xo"]),
             helper.make_node("Where", ["keep", "x", "zero"], ["y"])]
    p = make(tmp_path, nodes, [("x", F, ["n"])], [("y", F, None), ("xo", B, None), ("pinf", B, None)],
             {"zero": np.array(0.0, np.float32)})
    x = np.array([1.0, -2.0, np.nan, np.inf, -np.inf, 0.5, 0.0], np.float32)
    check(p, {"x": x})


def test_cast_truncates_like_onnxruntime_and_castlike(tmp_path: Path, check: Any) -> None:
    nodes = [helper.make_node("Cast", ["x"], ["i"], to=I64), helper.make_node("Cast", ["x"], ["b"], to=B),
             helper.make_node("Cast", ["x"], ["h"], to=TP.FLOAT16), helper.make_node("Cast", ["h"], ["back"], to=F),
             helper.make_node("CastLike", ["i", "x"], ["f"])]
    p = make(tmp_path, nodes, [("x", F, [8])], [("i", I64, None), ("b", B, None), ("back", F, None),
                                                 ("f", F, None)])
    check(p, {"x": np.array([0.0, -0.0, 2.5, -2.5, 1.7, -1.7, 3.5, -0.4], np.float32)})


def test_identity_and_dropout_are_pass_throughs(tmp_path: Path, check: Any) -> None:
    nodes = [helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Dropout", ["a"], ["d"]),
             helper.make_node("Relu", ["d"], ["y"])]
    p = make(tmp_path, nodes, [("x", F, [2, 3])], [("y", F, None)])
    assert ops(check(p, {"x": randn(2, 3)})) == ["Relu"]


# --- shapes ---------------------------------------------------------------------------------------------------
def test_shape_gather_concat_reshape_folds_to_an_attribute(tmp_path: Path, check: Any) -> None:
    """The exporters' Shape -> Gather -> Unsqueeze -> Concat -> Reshape becomes one Reshape with a target."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
             helper.make_node("Gather", ["s", "i1"], ["t"], axis=0),
             helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]), helper.make_node("Unsqueeze", ["t", "ax0"], ["t1"]),
             helper.make_node("Concat", ["b1", "t1", "heads", "m1"], ["tgt"], axis=0),
             helper.make_node("Reshape", ["x", "tgt"], ["y"])]
    p = make(tmp_path, nodes, [("x", F, ["batch", "seq", 12])], [("y", F, None)],
             {"i0": np.array(0), "i1": np.array(1), "ax0": np.array([0]), "heads": np.array([3]),
              "m1": np.array([-1])})
    model = check(p, {"x": randn(2, 5, 12)})
    assert ops(model) == ["Reshape"]
    node = model.graph.nodes[0]
    assert node.get("shape") == (0, 0, 3, 4) and len(node.inputs) == 1
    assert model.graph.tensor("y").shape == ("batch", "seq", 3, 4)


def test_size_flatten_squeeze_unsqueeze_and_symbolic_arithmetic(tmp_path: Path, check: Any) -> None:
    nodes = [
        helper.make_node("Size", ["x"], ["n"]), helper.make_node("Cast", ["n"], ["nf"], to=F),
        helper.make_node("Div", ["x", "nf"], ["scaled"]),
        helper.make_node("Flatten", ["scaled"], ["flat"], axis=1),
        helper.make_node("Unsqueeze", ["flat", "axes"], ["u"]), helper.make_node("Squeeze", ["u", "axes"], ["sq"]),
        helper.make_node("Shape", ["x"], ["s"], start=1), helper.make_node("Mul", ["s", "two"], ["s2"]),
        helper.make_node("Concat", ["one", "s2"], ["tgt"], axis=0), helper.make_node("Expand", ["x", "tgt"], ["ex"]),
    ]
    p = make(tmp_path, nodes, [("x", F, [1, "h", "w"])], [("sq", F, None), ("ex", F, None)],
             {"axes": np.array([0, 3]), "two": np.array([1, 1]), "one": np.array([2])})
    check(p, {"x": randn(1, 3, 4)})


def test_slice_split_concat_transpose(tmp_path: Path, check: Any) -> None:
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["sl"]),
             helper.make_node("Split", ["x", "sizes"], ["p0", "p1"], axis=2),
             helper.make_node("Concat", ["p1", "p0"], ["cat"], axis=-1),
             helper.make_node("Transpose", ["cat"], ["tr"], perm=[2, 0, 1])]
    p = make(tmp_path, nodes, [("x", F, [2, "seq", 6])], [("sl", F, None), ("tr", F, None)],
             {"st": np.array([-1, 0]), "en": np.array([-(1 << 62), 1 << 62]), "ax": np.array([1, 2]),
              "sp": np.array([-1, 2]), "sizes": np.array([2, 4])})
    check(p, {"x": randn(2, 5, 6)})


def test_split_18_num_outputs_uneven(tmp_path: Path, check: Any) -> None:
    p = make(tmp_path, [helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3)],
             [("x", F, [2, 7])], [("a", F, None), ("b", F, None), ("c", F, None)])
    check(p, {"x": randn(2, 7)})


def test_slice_to_a_run_time_size_becomes_gather_of_range(tmp_path: Path, check: Any) -> None:
    """A cached table sliced to the sequence length (rotary caches, causal masks) stays plannable."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=0, end=1),
             helper.make_node("Slice", ["table", "zero", "s"], ["rows"]),
             helper.make_node("Add", ["x", "rows"], ["y"])]
    p = make(tmp_path, nodes, [("x", F, ["seq", 4])], [("y", F, None)],
             {"table": randn(16, 4), "zero": np.array([0])})
    model = check(p, {"x": randn(5, 4)})
    assert "Range" in ops(model) and "Gather" in ops(model)


def test_masks_range_constantofshape_expand_trilu_cumsum(tmp_path: Path, check: Any) -> None:
    nodes = [helper.make_node("Shape", ["ids"], ["s"]), helper.make_node("Gather", ["s", "one"], ["n"]),
             helper.make_node("Range", ["zero", "n", "one"], ["pos"]),
             helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
             helper.make_node("Concat", ["n1", "n1"], ["nn"], axis=0),
             helper.make_node("ConstantOfShape", ["nn"], ["ones"],
                              value=numpy_helper.from_array(np.array([1.0], np.float32))),
             helper.make_node("Trilu", ["ones"], ["causal"], upper=0),
             helper.make_node("CumSum", ["causal", "one"], ["cs"]),
             helper.make_node("Expand", ["pos", "nn"], ["grid"]),
             helper.make_node("Cast", ["grid"], ["gf"], to=F),
             helper.make_node("Add", ["gf", "cs"], ["y"])]
    p = make(tmp_path, nodes, [("ids", I64, [1, "sequence"])], [("y", F, None), ("pos", I64, None)],
             {"zero": np.array(0), "one": np.array(1), "ax0": np.array([0])})
    for n in (3, 6):
        check(p, {"ids": np.arange(n).reshape(1, n)})


def test_constant_nodes_and_gather_nd(tmp_path: Path, check: Any) -> None:
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array([[0, 1], [1, 0]]))),
             helper.make_node("Constant", [], ["k"], value_float=2.0),
             helper.make_node("GatherND", ["x", "c"], ["g"]), helper.make_node("Mul", ["g", "k"], ["y"]),
             helper.make_node("GatherND", ["x", "bi"], ["gb"], batch_dims=1)]
    p = make(tmp_path, nodes, [("x", F, [2, 3, 4])], [("y", F, None), ("gb", F, None)],
             {"bi": np.array([[[2], [0]], [[1], [-1]]])})
    check(p, {"x": randn(2, 3, 4)})


# --- reductions and normalizations ----------------------------------------------------------------------------
def test_reductions_argmax_topk(tmp_path: Path, check: Any) -> None:
    nodes = [helper.make_node("ReduceMean", ["x", "ax"], ["mean"]),
             helper.make_node("ReduceSum", ["x", "ax"], ["sum"], keepdims=0),
             helper.make_node("ReduceMax", ["x", "ax"], ["max"]), helper.make_node("ReduceMin", ["x"], ["min"]),
             helper.make_node("ArgMax", ["x"], ["am"], axis=1, keepdims=0),
             helper.make_node("TopK", ["x", "k"], ["tv", "ti"], axis=-1)]
    p = make(tmp_path, nodes, [("x", F, [3, 5])], [("mean", F, None), ("sum", F, None), ("max", F, None),
                                                   ("min", F, None), ("am", I64, None), ("tv", F, None),
                                                   ("ti", I64, None)],
             {"ax": np.array([-1]), "k": np.array([2])})
    check(p, {"x": randn(3, 5)})


def test_reduce_mean_opset13_axes_attribute(tmp_path: Path, check: Any) -> None:
    p = make(tmp_path, [helper.make_node("ReduceMean", ["x"], ["y"], axes=[1, 2])], [("x", F, [2, 3, 4])],
             [("y", F, None)], opset=13)
    check(p, {"x": randn(2, 3, 4)})


def test_softmax_layernorm_rmsnorm(tmp_path: Path, check: Any) -> None:
    nodes = [helper.make_node("Softmax", ["x"], ["sm"], axis=-1),
             helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], epsilon=1e-5),
             helper.make_node("RMSNormalization", ["x", "g"], ["rms"], epsilon=1e-6)]
    p = make(tmp_path, nodes, [("x", F, ["n", 8])], [("sm", F, None), ("ln", F, None), ("rms", F, None)],
             {"g": randn(8), "b": randn(8)}, opset=23)
    check(p, {"x": randn(4, 8)})


# --- linear algebra and weights -------------------------------------------------------------------------------
def test_matmul_weights_stay_references_and_transpose_becomes_transpose_b(tmp_path: Path, check: Any) -> None:
    w_kn, w_nk = randn(16, 8), randn(4, 8)
    nodes = [helper.make_node("MatMul", ["x", "w_kn"], ["h"]),
             helper.make_node("Transpose", ["w_nk"], ["w_t"], perm=[1, 0]),
             helper.make_node("MatMul", ["h", "w_t"], ["y"])]
    p = make(tmp_path, nodes, [("x", F, ["batch", "seq", 16])], [("y", F, None)], {"w_kn": w_kn, "w_nk": w_nk})
    model = check(p, {"x": randn(2, 3, 16)})
    assert ops(model) == ["MatMul", "MatMul"]
    assert model.graph.nodes[1].get("transpose_b") is True
    refs = {str(t.weight) for t in model.graph.weights}
    assert refs == {"model.onnx#w_kn", "model.onnx#w_nk"}
    assert all(t.data is None for t in model.graph.weights)


def test_batched_activation_matmul_and_vector_operands(tmp_path: Path, check: Any) -> None:
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s"]), helper.make_node("MatMul", ["v", "m"], ["vm"])]
    p = make(tmp_path, nodes, [("q", F, [2, "h", 3, 4]), ("k", F, [2, "h", 4, 3]), ("v", F, [4]),
                               ("m", F, [4, 5])], [("s", F, None), ("vm", F, None)])
    check(p, {"q": randn(2, 2, 3, 4), "k": randn(2, 2, 4, 3), "v": randn(4), "m": randn(4, 5)})


@pytest.mark.parametrize(("trans_b", "alpha", "beta"), [(1, 1.0, 1.0), (0, 0.5, 2.0)])
def test_gemm(tmp_path: Path, trans_b: int, alpha: float, beta: float, check: Any) -> None:
    w = randn(6, 10) if trans_b else randn(10, 6)
    p = make(tmp_path, [helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=trans_b, alpha=alpha, beta=beta)],
             [("x", F, ["n", 10])], [("y", F, None)], {"w": w, "c": randn(6)})
    model = check(p, {"x": randn(3, 10)})
    assert model.graph.nodes[0].op == "MatMul" and model.graph.nodes[0].get("transpose_b", False) is bool(trans_b)


def test_gather_of_a_weight_table_is_an_embedding(tmp_path: Path, check: Any) -> None:
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]),
             helper.make_node("Gather", ["e", "col"], ["picked"], axis=2)]
    p = make(tmp_path, nodes, [("ids", I64, [1, "seq"])], [("e", F, None), ("picked", F, None)],
             {"table": randn(50, 8), "col": np.array([3, -1])})
    model = check(p, {"ids": np.array([[4, 0, 49, 7]])})
    assert ops(model)[:4] == ["Less", "Add", "Where", "Embedding"]  # ids made non-negative first (ONNX allows -1)
    check(p, {"ids": np.array([[-1, 0, -50, 7]])})  # from the end, as onnxruntime


# --- symbolic dims ---------------------------------------------------------------------------------------------
def test_dim_params_become_symbols_and_lengths_vary(tmp_path: Path, check: Any) -> None:
    p = make(tmp_path, [helper.make_node("Softmax", ["x"], ["y"])], [("x", F, ["batch size", None, 4])],
             [("y", F, None)])
    model = load_model(p)
    dims = model.graph.tensor("x").shape
    assert dims[0] == sanitize_symbol("batch size") == "batch_size"
    assert isinstance(dims[1], str) and dims[1].isidentifier() and dims[2] == 4
    for n in (2, 9):
        check(p, {"x": randn(1, n, 4)})


# --- errors ---------------------------------------------------------------------------------------------------
def test_every_unsupported_op_is_listed_in_one_error(tmp_path: Path) -> None:
    nodes = [helper.make_node("Einsum", ["x", "x"], ["a"], equation="ij,ij->i"),
             helper.make_node("LpNormalization", ["x"], ["b"]), helper.make_node("Relu", ["x"], ["c"]),
             helper.make_node("Mystery", ["x"], ["d"], domain="example.custom")]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", F, [2, 2])],
                              [helper.make_tensor_value_info(n, F, None) for n in "abcd"])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("example.custom", 1)], ir_version=10)
    path = tmp_path / "bad.onnx"
    onnx.save(model, path)
    with pytest.raises(OnnxImportError) as err:
        load_model(path)
    text = str(err.value)
    assert "3 unsupported operator(s)" in text and "bad.onnx" in text
    for piece in ("ai.onnx::Einsum (version 12)", "ai.onnx::LpNormalization (version 1)",
                  "example.custom::Mystery (version 1)"):
        assert piece in text
    assert "Relu" not in text


@pytest.mark.parametrize("opset", [12, 10_000])
def test_opsets_outside_the_range_are_refused(tmp_path: Path, opset: int) -> None:
    io = [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, [2])]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", *io)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    path = tmp_path / "old.onnx"
    onnx.save(model, path)
    with pytest.raises(OnnxImportError, match=rf"ai.onnx opset {opset} is outside the supported range 13\.\."):
        load_model(path)


def test_a_node_the_ir_cannot_express_names_the_node(tmp_path: Path) -> None:
    p = make(tmp_path, [helper.make_node("Reshape", ["x", "t"], ["y"], name="the_reshape", allowzero=1)],
             [("x", F, [2, 3]), ("t", I64, [2])], [("y", F, None)])
    with pytest.raises(LoaderError, match=r"model.onnx: node 'the_reshape' \(ai.onnx::Reshape v14\): allowzero"):
        load_model(p)


def test_the_dispatch_table_registers_real_onnx_versions() -> None:
    """Every registered ai.onnx (op, since-version) is a version onnx.defs knows, reachable from opset 13 on."""
    top = onnx.defs.onnx_opset_version()
    for reg in supported_ops():
        if reg.domain:
            continue
        try:
            known = {onnx.defs.get_schema(reg.op_type, v, "").since_version for v in range(13, top + 1)}
        except onnx.defs.SchemaError:
            continue  # an onnxruntime op in the default domain (SimplifiedLayerNormalization)
        assert reg.since in known, f"{reg.op_type} since {reg.since}: onnx.defs has {sorted(known)}"


# --- the loader -----------------------------------------------------------------------------------------------
def test_a_directory_with_config_json_and_a_tokenizer_is_an_onnx_model(tmp_path: Path) -> None:
    """An Optimum-style directory: config.json + model.onnx (no safetensors) is ONNX, not Hugging Face; the config
    gives the sizes it knows, the architecture stays "onnx", and the tokenizer files beside it are recorded."""
    import json

    make(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["logits"])], [("x", F, ["seq", 8])],
         [("logits", F, ["seq", 12])], {"w": randn(8, 12)})
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 8,
              "intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 1,
              "vocab_size": 12, "max_position_embeddings": 77, "rms_norm_eps": 1e-6}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    model = load_model(tmp_path)
    assert model.format == "onnx" and model.base_dir == tmp_path.resolve()
    cfg = model.config
    assert cfg.architecture == "onnx" and cfg.extra["hf.architecture"] == "llama"
    assert (cfg.n_layers, cfg.context_length, cfg.vocab_size, cfg.n_kv_heads) == (3, 77, 12, 1)
    assert set(model.tokenizer_files) == {"tokenizer_json", "tokenizer_config"}
    assert model.chat_template == "{{ messages }}"
    assert model.graph.name == tmp_path.name  # a model.onnx is named after its directory


def test_a_directory_with_two_onnx_files_asks_for_one(tmp_path: Path) -> None:
    for name in ("encoder.onnx", "decoder.onnx"):
        make(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, None)], name=name)
    with pytest.raises(LoaderError, match=r"2 \.onnx files \(decoder\.onnx, encoder\.onnx\); open one of them"):
        load_model(tmp_path)
    assert load_model(tmp_path / "decoder.onnx").format == "onnx"

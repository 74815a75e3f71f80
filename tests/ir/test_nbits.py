"""MatMulNBits in uaii-ir: the schema and its shape rules, and the NumPy reference against a dequantize-then-matmul
written here from onnxruntime's contrib-op spec and, where onnxruntime is installed, against its com.microsoft
MatMulNBits kernel on the same bytes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from graph_builder import GraphBuilder

from uaii.ir import Node, ValidationError, check
from uaii.ir.ops import LINALG, Op
from uaii.ir.reference import EvaluationError, run_node
from uaii.ir.registry import default_registry

RNG = np.random.default_rng(0)


def layout(n: int, k: int, bits: int, bs: int, zp: str, seed: int = 0) -> dict[str, Any]:
    """Random B, scales and zero points of a [n, k] weight in ONNX's layout, and the spec's W (float64)."""
    rng = np.random.default_rng(seed)
    kb = -(-k // bs)
    q = rng.integers(0, 2**bits, size=(n, kb * bs))
    packed = q if bits == 8 else q[:, 0::2] | (q[:, 1::2] << 4)           # value 2i: low nibble of byte i
    scales = rng.uniform(0.01, 0.1, (n, kb)).astype(np.float32)
    zero = np.full((n, kb), 2 ** (bits - 1), np.float64)
    z: np.ndarray | None = None
    if zp == "u8":
        zi = rng.integers(0, 2**bits, (n, kb))
        zero = zi.astype(np.float64)
        if bits == 4:
            zi = np.pad(zi, ((0, 0), (0, kb % 2)))                        # each row padded to whole bytes
            zi = zi[:, 0::2] | (zi[:, 1::2] << 4)
        z = zi.astype(np.uint8).reshape(-1)
    elif zp == "float":
        z = rng.uniform(0, 2**bits - 1, (n, kb)).astype(np.float32)
        zero = z.astype(np.float64)
        z = z.reshape(-1)
    w = ((q - np.repeat(zero, bs, axis=1)) * np.repeat(scales.astype(np.float64), bs, axis=1))[:, :k]
    return {"B": packed.astype(np.uint8).reshape(n, kb, bs * bits // 8), "scales": scales.reshape(-1),
            "zero_points": z, "W": w}


def run(a: np.ndarray, lay: dict[str, Any], bias: np.ndarray | None = None, **attrs: Any) -> np.ndarray:
    inputs = [a, lay["B"], lay["scales"], lay["zero_points"], bias]
    names = tuple("" if x is None else f"in{i}" for i, x in enumerate(inputs))
    return run_node(Node("n", "MatMulNBits", names, ("y",), attrs), inputs)[0]


# --- the schema ------------------------------------------------------------------------------------------------
def test_schema_is_a_linalg_op_with_the_contrib_attributes() -> None:
    s = default_registry().get("MatMulNBits", 1)
    assert Op.MATMUL_NBITS in LINALG and s.kind.value == "linalg"
    assert {a.name: a.default for a in s.attrs} == {"K": None, "N": None, "bits": 4, "block_size": None,
                                                    "accuracy_level": 0}
    assert [p.name for p in s.inputs] == ["A", "B", "scales", "zero_points", "bias"]


def _graph(a: list[Any], b: list[Any], s: list[Any], z: tuple[str, list[Any]] | None = None,
           bias: list[Any] | None = None, a_dtype: str = "f32", **attrs: Any) -> Any:
    g = GraphBuilder("nbits")
    ins = [g.input("a", a_dtype, a), g.weight("b", "u8", b), g.weight("s", "f16", s)]
    ins.append(g.weight("z", z[0], z[1]) if z else "")
    ins.append(g.weight("bias", a_dtype, bias) if bias else "")
    g.op("MatMulNBits", ins, [("y", "f32", [*a[:-1], attrs["N"]])], **attrs)
    g.outputs.append("y")
    return g.build()


def test_shapes_that_fit_validate() -> None:
    at = {"K": 100, "N": 12, "bits": 4, "block_size": 32}
    check(_graph(["batch", "seq", 100], [12, 4, 16], [48], ("u8", [12, 2]), [12], **at))
    check(_graph(["seq", 100], [12, 4, 16], [12, 4], ("f16", [48]), None, a_dtype="f16", **at))
    at8 = {"K": 40, "N": 3, "bits": 8, "block_size": 16}
    check(_graph([1, 40], [3, 3, 16], [9], ("u8", [9]), [3], **at8))


@pytest.mark.parametrize("case,match", [
    ({"a": [2, 99]}, "has 99 columns; attribute K is 100"),
    ({"b": [12, 4, 32]}, r"B .* must have shape \[12, 4, 16\]"),
    ({"b": [12, 3, 16]}, r"B .* must have shape \[12, 4, 16\]"),
    ({"s": [47]}, r"scales .* must have shape \[48\]"),
    ({"z": ("u8", [12, 4])}, r"packed uint8 zero_points .* must have shape \[12, 2\]"),
    ({"z": ("f16", [24])}, r"float zero_points .* must have shape \[48\]"),
    ({"bias": [13]}, r"bias must have shape \[12\]"),
    ({"block_size": 48}, "attribute 'block_size' is 48"),
    ({"bits": 2}, "attribute 'bits' is 2"),
    ({"accuracy_level": 5}, "attribute 'accuracy_level' is 5"),
    ({"accuracy_level": -1}, "attribute 'accuracy_level' is -1"),
])
def test_shapes_that_do_not_fit_are_reported(case: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"a": [2, 100], "b": [12, 4, 16], "s": [48], "z": ("u8", [12, 2]), "bias": [12],
                            "K": 100, "N": 12, "bits": 4, "block_size": 32}
    args.update(case)
    with pytest.raises(ValidationError, match=match):
        check(_graph(**args))


def test_required_attributes_and_dtypes() -> None:
    g = GraphBuilder("nbits")
    ins = [g.input("a", "i32", [2, 64]), g.weight("b", "f32", [4, 2, 16]), g.weight("s", "f32", [8])]
    g.op("MatMulNBits", ins, [("y", "f32", [2, 4])], K=64, N=4)
    g.outputs.append("y")
    with pytest.raises(ValidationError) as err:
        check(g.build())
    text = str(err.value)
    assert "required attribute 'block_size'" in text
    assert "input #0 ('A') has dtype i32" in text and "input #1 ('B') has dtype f32" in text


# --- the reference -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("bs", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("zp", ["none", "u8", "float"])
def test_reference_is_dequantize_then_matmul(bits: int, bs: int, zp: str) -> None:
    n, k = 7, 3 * bs - 5                                   # the last block padded
    lay = layout(n, k, bits, bs, zp, seed=bits * bs)
    a = RNG.standard_normal((2, 3, k)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    y = run(a, lay, bias, K=k, N=n, bits=bits, block_size=bs)
    assert y.dtype == np.float32 and y.shape == (2, 3, n)
    want = a.astype(np.float64) @ lay["W"].T + bias
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(run(a, lay, None, K=k, N=n, bits=bits, block_size=bs), want - bias, rtol=1e-6,
                               atol=1e-5)


def test_accuracy_level_validates_and_leaves_the_reference_exact() -> None:
    """ONNX's levels 0..4 all validate; the level allows a backend less exact arithmetic and never changes what the
    reference computes."""
    for level in range(5):
        check(_graph([2, 100], [12, 4, 16], [48], ("u8", [12, 2]), None, K=100, N=12, bits=4, block_size=32,
                     accuracy_level=level))
    lay = layout(6, 70, 4, 32, "u8", seed=4)
    a = RNG.standard_normal((3, 70)).astype(np.float32)
    exact = run(a, lay, K=70, N=6, block_size=32)
    for level in (1, 4):
        assert np.array_equal(run(a, lay, K=70, N=6, block_size=32, accuracy_level=level), exact)


def test_reference_takes_f16_activations_and_scales_and_2d_scales() -> None:
    lay = layout(5, 64, 4, 32, "u8")
    lay16 = dict(lay, scales=lay["scales"].astype(np.float16).reshape(5, 2))
    a = RNG.standard_normal((3, 64)).astype(np.float16)
    y = run(a, lay16, K=64, N=5, block_size=32)
    w16 = lay["W"] / np.repeat(lay["scales"].reshape(5, 2), 32, axis=1) * np.repeat(
        lay16["scales"].astype(np.float64), 32, axis=1)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, a.astype(np.float64) @ w16.T, rtol=1e-6, atol=1e-5)


def test_reference_refuses_inconsistent_arrays() -> None:
    lay = layout(4, 64, 4, 32, "u8")
    a = np.ones((1, 64), np.float32)
    with pytest.raises(EvaluationError, match=r"B must be 128 uint8 bytes \(\[4, 2, 16\]\), found 96"):
        run(a, dict(lay, B=lay["B"][:3]), K=64, N=4, block_size=32)
    with pytest.raises(EvaluationError, match="packed zero_points must hold 4 bytes"):
        run(a, dict(lay, zero_points=lay["zero_points"][:2]), K=64, N=4, block_size=32)
    with pytest.raises(EvaluationError, match="scales must hold N \\* k_blocks = 8"):
        run(a, dict(lay, scales=lay["scales"][:5]), K=64, N=4, block_size=32)


# --- against onnxruntime ----------------------------------------------------------------------------------------
def _ort_matmul_nbits(a: np.ndarray, lay: dict[str, Any], bias: np.ndarray | None, **attrs: int) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(lay["B"], "B"), numpy_helper.from_array(lay["scales"], "scales")]
    names = ["A", "B", "scales", "", "", ""]                  # A, B, scales, zero_points, g_idx, bias
    if lay["zero_points"] is not None:
        inits.append(numpy_helper.from_array(lay["zero_points"], "zp"))
        names[3] = "zp"
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "bias"))
        names[5] = "bias"
    node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, list(a.shape))],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [a.shape[0], attrs["N"]])], inits)
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17),
                                                                   helper.make_opsetid("com.microsoft", 1)])
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {"A": a})[0])


@pytest.mark.parametrize("bits,bs,zp,k", [
    (4, 32, "none", 128), (4, 32, "u8", 100), (4, 16, "u8", 72), (4, 128, "u8", 300), (4, 64, "float", 200),
    (4, 256, "none", 256), (8, 32, "u8", 100), (8, 64, "none", 96), (8, 16, "u8", 48),
])
def test_reference_matches_onnxruntime(bits: int, bs: int, zp: str, k: int) -> None:
    n = 9
    lay = layout(n, k, bits, bs, zp, seed=k + bits)
    a = RNG.standard_normal((4, k)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32) if zp != "none" else None
    got = run(a, lay, bias, K=k, N=n, bits=bits, block_size=bs)
    want = _ort_matmul_nbits(a, lay, bias, K=k, N=n, bits=bits, block_size=bs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))

"""The NumPy references, op by op, against hand-computed values, independent formulas, naive loops and (where
importable) Hugging Face transformers' own functions."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from uaii.ir import Node
from uaii.ir.reference import REFERENCE_OPS, EvaluationError, bf16_to_f32, f32_to_bf16, rope_inv_freq, run_node
from uaii.ir.registry import default_registry

RNG = np.random.default_rng(0)
FAST = settings(max_examples=40, deadline=None)


@pytest.fixture(autouse=True)
def _fresh_rng() -> None:
    """Each test draws the same data whatever ran before it (hypothesis draws vary in number)."""
    global RNG
    RNG = np.random.default_rng(0)


def run(op: str, *inputs: np.ndarray | None, n_out: int = 1, **attrs: Any) -> Any:
    """Run one node of ``op`` through run_node (attributes resolved against the schema)."""
    names = tuple("" if x is None else f"in{i}" for i, x in enumerate(inputs))
    node = Node("n", op, names, tuple(f"out{i}" for i in range(n_out)), attrs)
    out = run_node(node, list(inputs))
    return out if n_out > 1 else out[0]


def randn(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


# --- the table ----------------------------------------------------------------------------------------------
def test_every_registered_op_has_a_reference() -> None:
    missing = [s.key for s in default_registry().schemas() if s.key not in REFERENCE_OPS]
    assert not missing, f"ops without a NumPy reference: {missing}"


@pytest.mark.parametrize("key", sorted(REFERENCE_OPS))
def test_reference_keywords_are_the_schema_attributes(key: tuple[str, int]) -> None:
    schema, fn = default_registry().get(*key), REFERENCE_OPS[key]
    params = inspect.signature(fn).parameters.values()
    keywords = {p.name for p in params if p.kind is p.KEYWORD_ONLY} - {"num_outputs"}
    assert keywords == {a.name for a in schema.attrs}
    assert fn.__doc__, f"{key[0]}'s reference states no formula"


def test_unknown_attribute_and_bad_arity_are_reported() -> None:
    with pytest.raises(EvaluationError, match="unknown attribute 'bogus'"):
        run("Relu", randn(2), bogus=1)
    with pytest.raises(EvaluationError, match=r"node 'n' \(Add\).*takes 2 inputs"):
        run("Add", randn(2))



def test_plugin_op_needs_a_registered_reference() -> None:
    from uaii.ir.ops import FLOATS, OpSchema, Param
    from uaii.ir.reference import register_reference
    from uaii.ir.registry import Registry

    registry = Registry(plugins=False)
    registry.register(OpSchema("Twice", 1, "Y = 2 X", inputs=(Param("X", "T", "x"),),
                               outputs=(Param("Y", "T", "y"),), types={"T": FLOATS}))
    node = Node("t", "Twice", ("x",), ("y",))
    with pytest.raises(EvaluationError, match="no reference implementation for Twice"):
        run_node(node, [randn(2)], registry)
    try:
        register_reference("Twice", lambda x: 2 * x)
        assert run_node(node, [np.ones(2)], registry)[0].tolist() == [2.0, 2.0]
        with pytest.raises(EvaluationError, match="already has a reference"):
            register_reference("Twice", lambda x: 3 * x)
    finally:
        REFERENCE_OPS.pop(("Twice", 1), None)


def test_fused_ops_equal_the_ops_they_replace() -> None:
    a, wq, wk = randn(3, 8), randn(6, 8), randn(4, 8)
    yq, yk = run("GroupedMatMul", a, wq, wk, n_out=2, transpose_b=True)
    np.testing.assert_array_equal(yq, run("MatMul", a, wq, transpose_b=True))
    np.testing.assert_array_equal(yk, run("MatMul", a, wk, transpose_b=True))
    x, r, w = randn(3, 8, dtype=np.float16), randn(3, 8, dtype=np.float16), randn(8)
    y, total = run("AddRMSNorm", x, r, w, n_out=2, eps=1e-5, add_unit_offset=True)
    np.testing.assert_array_equal(total, run("Add", x, r))
    np.testing.assert_array_equal(y, run("RMSNorm", run("Add", x, r), w, eps=1e-5, add_unit_offset=True))

# --- unary --------------------------------------------------------------------------------------------------
def _sig(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Neg": lambda x: -x, "Relu": lambda x: np.maximum(x, 0), "Silu": lambda x: x * _sig(x), "Sigmoid": _sig,
    "Tanh": np.tanh, "Exp": np.exp, "Sqrt": lambda x: np.sqrt(np.abs(x)),
}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_unary_formulas(op: str, dtype: Any) -> None:
    x = randn(3, 5).astype(dtype)
    x = np.abs(x) if op == "Sqrt" else x
    y = run(op, x)
    assert y.dtype == x.dtype and y.shape == x.shape
    want = UNARY[op](x.astype(np.float64))
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=1e-3 if dtype == np.float16 else 1e-6, atol=1e-6)


def test_gelu_values() -> None:
    x = np.array([-3.0, -1.0, 0.0, 1.0, 2.0], np.float64)
    phi = 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x]))
    np.testing.assert_allclose(run("Gelu", x), x * phi, rtol=1e-15)
    assert run("Gelu", np.array([1.0]))[0] == pytest.approx(0.8413447460685429, rel=1e-14)
    assert run("Gelu", np.array([1.0]), approximate="tanh")[0] == pytest.approx(0.8411919906082768, rel=1e-12)


def test_softcap_and_integer_unary() -> None:
    x = np.array([-100.0, -1.0, 0.0, 2.0, 100.0], np.float32)
    np.testing.assert_allclose(run("Softcap", x, cap=30.0), 30 * np.tanh(x / 30), rtol=1e-6)
    ints = np.array([-3, 0, 4], np.int32)
    assert run("Relu", ints).tolist() == [0, 0, 4] and run("Neg", ints).dtype == np.int32


def test_bf16_values_travel_as_raw_words() -> None:
    x = np.array([1.0, -2.5, 3.140625, 1e30, np.inf], np.float32)
    words = f32_to_bf16(x)
    assert words.dtype == np.uint16 and bf16_to_f32(words).tolist()[:3] == [1.0, -2.5, 3.140625]
    assert f32_to_bf16(np.array([1.00390625], np.float32))[0] == f32_to_bf16(np.array([1.0], np.float32))[0]
    y = run("Neg", words)
    assert y.dtype == np.uint16 and bf16_to_f32(y).tolist()[:2] == [-1.0, 2.5]


# --- Cast ---------------------------------------------------------------------------------------------------
def test_cast_rounds_half_to_even_and_saturates() -> None:
    x = np.array([2.5, 3.5, -2.5, -0.5, 300.7, -1e10, np.nan, np.inf], np.float32)
    assert run("Cast", x, to="i8").tolist() == [2, 4, -2, 0, 127, -128, 0, 127]
    assert run("Cast", x, to="u8").tolist() == [2, 4, 0, 0, 255, 0, 0, 255]
    assert run("Cast", np.array([1e30, -1e30]), to="i64").tolist() == [2**63 - 1, -(2**63)]
    assert run("Cast", np.array([-5, 70000], np.int64), to="i16").tolist() == [-5, 32767]
    assert run("Cast", np.array([-5, 7], np.int32), to="u32").tolist() == [0, 7]


def test_cast_between_floats_and_bools() -> None:
    x = np.array([0.0, 1.5, -2.0, 65520.0], np.float32)
    assert run("Cast", x, to="bool").tolist() == [False, True, True, True]
    assert run("Cast", np.array([True, False]), to="float32").tolist() == [1.0, 0.0]
    assert np.isinf(run("Cast", x, to="f16")[3])
    b = run("Cast", x, to="bf16")
    assert b.dtype == np.uint16 and bf16_to_f32(b).tolist()[:3] == [0.0, 1.5, -2.0]
    assert run("Cast", b, to="f32").tolist()[:3] == [0.0, 1.5, -2.0]
    assert run("Cast", np.array([7], np.int64), to="f64").dtype == np.float64


# --- binary -------------------------------------------------------------------------------------------------
@FAST
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4),
       op=st.sampled_from(["Add", "Sub", "Mul", "Div"]), dtype=st.sampled_from([np.float32, np.int32]))
def test_binary_broadcasting_matches_numpy(shapes: Any, op: str, dtype: Any) -> None:
    a = RNG.integers(-9, 10, shapes.input_shapes[0]).astype(dtype)
    b = RNG.integers(1, 10, shapes.input_shapes[1]).astype(dtype)
    fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op]
    y = run(op, a, b)
    want = fn(a.astype(np.float64), b.astype(np.float64))
    if dtype == np.int32 and op == "Div":
        want = np.trunc(want)
    assert y.shape == shapes.result_shape and y.dtype == dtype
    np.testing.assert_allclose(y, want.astype(dtype), rtol=1e-6)


def test_integer_division_truncates_toward_zero() -> None:
    a, b = np.array([7, -7, 7, -7], np.int64), np.array([2, 2, -2, -2], np.int64)
    assert run("Div", a, b).tolist() == [3, -3, -3, 3]
    with pytest.raises(EvaluationError, match="division by zero"):
        run("Div", a, np.zeros(4, np.int64))
    with pytest.raises(EvaluationError, match="one dtype"):
        run("Add", a, b.astype(np.int32))


@pytest.mark.parametrize(("op", "act"), [("SwiGLU", lambda g: g * _sig(g)),
                                         ("GeGLU", lambda g: 0.5 * g * (1 + np.tanh(
                                             math.sqrt(2 / math.pi) * (g + 0.044715 * g**3))))])
def test_glu_two_inputs_and_packed(op: str, act: Callable[[np.ndarray], np.ndarray]) -> None:
    g, u = randn(2, 3, 8), randn(2, 3, 8)
    extra = {"approximate": "tanh"} if op == "GeGLU" else {}
    want = act(g.astype(np.float64)) * u
    np.testing.assert_allclose(run(op, g, u, **extra), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(run(op, np.concatenate([g, u], -1), **extra), run(op, g, u, **extra))


# --- linalg -------------------------------------------------------------------------------------------------
def test_matmul_variants() -> None:
    a, b = randn(2, 3, 4), randn(4, 5)
    np.testing.assert_allclose(run("MatMul", a, b), a @ b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run("MatMul", a, np.ascontiguousarray(b.T), transpose_b=True), a @ b, rtol=1e-5)
    np.testing.assert_allclose(run("MatMul", a[0, 0], b), a[0, 0] @ b, rtol=1e-5)  # 1-D A
    np.testing.assert_allclose(run("MatMulRelu", a, b), np.maximum(a @ b, 0), rtol=1e-5, atol=1e-6)
    y16 = run("MatMul", a.astype(np.float16), b, transpose_b=False)  # f32 (dequantized) weight, f16 activations
    assert y16.dtype == np.float16
    with pytest.raises(EvaluationError, match=r"inner|K="):
        run("MatMul", a, b, transpose_b=True)


def test_gemm() -> None:
    a, b, c = randn(4, 3), randn(5, 4), randn(5)
    y = run("Gemm", a, b, c, alpha=0.5, beta=2.0, transA=True, transB=True)
    np.testing.assert_allclose(y, 0.5 * a.T @ b.T + 2.0 * c, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run("Gemm", a.T, b.T), a.T @ b.T, rtol=1e-5)


# --- norms --------------------------------------------------------------------------------------------------
def test_softmax_axis() -> None:
    x = randn(3, 4, 5)
    for axis in (-1, 1):
        e = np.exp(x - x.max(axis, keepdims=True))
        np.testing.assert_allclose(run("Softmax", x, axis=axis), e / e.sum(axis, keepdims=True), rtol=1e-6)
    assert np.all(np.isfinite(run("Softmax", np.array([1000.0, 0.0], np.float32))))


def test_layer_norm_over_trailing_dims() -> None:
    x, w, b = randn(2, 3, 4), randn(3, 4), randn(3, 4)
    xf = x.reshape(2, 12).astype(np.float64)
    want = ((xf - xf.mean(1, keepdims=True)) / np.sqrt(xf.var(1, keepdims=True) + 1e-3)).reshape(2, 3, 4) * w + b
    np.testing.assert_allclose(run("LayerNorm", x, w, b, axis=1, eps=1e-3), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run("LayerNorm", x, w[0], axis=-1).shape, x.shape)


def test_rms_norm_and_unit_offset() -> None:
    x, w = randn(2, 3, 8), randn(8)
    rms = np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(run("RMSNorm", x, w), x / rms * w, rtol=1e-5)
    np.testing.assert_allclose(run("RMSNorm", x, w, add_unit_offset=True), x / rms * (1 + w), rtol=1e-5)
    assert run("RMSNorm", x.astype(np.float16), w).dtype == np.float16
    with pytest.raises(EvaluationError, match="weight has shape"):
        run("RMSNorm", x, randn(4))


# --- reductions ---------------------------------------------------------------------------------------------
def test_topk_ties_and_order() -> None:
    x = np.array([[1, 3, 3, 0, 3], [5, 5, 1, 1, 2]], np.int32)
    vals, idx = run("TopK", x, n_out=2, k=3)
    assert vals.tolist() == [[3, 3, 3], [5, 5, 2]] and idx.tolist() == [[1, 2, 4], [0, 1, 4]]
    vals, idx = run("TopK", x, n_out=2, k=2, largest=False)
    assert vals.tolist() == [[0, 1], [1, 1]] and idx.tolist() == [[3, 0], [2, 3]]
    vals, idx = run("TopK", x.T.copy(), n_out=2, k=1, axis=0)
    assert idx.tolist() == [[1, 0]] and idx.dtype == np.int64


def test_argmax() -> None:
    x = np.array([[1.0, 4.0, 4.0], [-1.0, -2.0, -1.0]], np.float32)
    assert run("ArgMax", x).tolist() == [[1], [0]]
    assert run("ArgMax", x, axis=0, keepdims=False).tolist() == [0, 0, 0]
    assert run("ArgMax", f32_to_bf16(np.array([-3.0, -1.0, -2.0], np.float32))).tolist() == [1]


def test_reduce_mean_matches_numpy() -> None:
    x = randn(3, 4, 5)
    x64 = x.astype(np.float64)  # the reference sums in float64 and rounds once
    np.testing.assert_allclose(run("ReduceMean", x, axes=(0,)), x64.mean(axis=0, keepdims=True), rtol=1e-7)
    np.testing.assert_allclose(run("ReduceMean", x, axes=(-1, 0), keepdims=False), x64.mean(axis=(0, 2)), rtol=1e-7)
    assert run("ReduceMean", x).shape == (1, 1, 1) and run("ReduceMean", x, keepdims=False).shape == ()
    np.testing.assert_allclose(run("ReduceMean", x, axes=()), x64.mean(keepdims=True), rtol=1e-7)
    h = x.astype(np.float16)
    assert run("ReduceMean", h, axes=(1,)).dtype == np.float16
    bf = run("ReduceMean", f32_to_bf16(np.array([[1.0, 2.0], [3.0, 5.0]], np.float32)), axes=(1,))
    assert bf.dtype == np.uint16 and bf16_to_f32(bf).ravel().tolist() == [1.5, 4.0]
    big = np.full((4096, 2), 1e4, np.float16)  # a float16 sum would overflow; the mean must not
    assert run("ReduceMean", big, axes=(0,)).tolist() == [[1e4, 1e4]]
    assert np.isnan(run("ReduceMean", np.zeros((0, 3), np.float32), axes=(0,))).all()  # ONNX: 0 / 0
    with pytest.raises(EvaluationError, match="distinct axes"):
        run("ReduceMean", x, axes=(0, -3))
    with pytest.raises(EvaluationError, match="expected a float"):
        run("ReduceMean", np.arange(6, dtype=np.int64), axes=(0,))


# --- movement -----------------------------------------------------------------------------------------------
@FAST
@given(x=hnp.arrays(np.int32, hnp.array_shapes(min_dims=1, max_dims=4, max_side=4)), data=st.data())
def test_movement_ops_match_numpy(x: np.ndarray, data: st.DataObject) -> None:
    perm = data.draw(st.permutations(range(x.ndim)))
    np.testing.assert_array_equal(run("Transpose", x, perm=perm), np.transpose(x, perm))
    np.testing.assert_array_equal(run("Transpose", x), x.T)
    np.testing.assert_array_equal(run("Reshape", x, shape=[-1]), x.reshape(-1))
    np.testing.assert_array_equal(run("Reshape", x, shape=[0, -1]), x.reshape(x.shape[0], -1))
    np.testing.assert_array_equal(run("Reshape", x, np.array(x.shape[::-1], np.int64)), x.reshape(x.shape[::-1]))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    np.testing.assert_array_equal(run("Concat", x, x + 1, x, axis=axis), np.concatenate([x, x + 1, x], axis))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    sizes[-1] = x.shape[axis] - sum(sizes[:-1])
    if sizes[-1] >= 0:
        parts = run("Split", x, n_out=len(sizes), axis=axis, split=sizes) if len(sizes) > 1 else [
            run("Split", x, axis=axis, split=sizes)]
        for got, want in zip(parts, np.split(x, np.cumsum(sizes)[:-1], axis), strict=True):
            np.testing.assert_array_equal(got, want)
    bounds = st.integers(-6, 6) | st.just(2**31) | st.just(-(2**31))
    start, end, step = data.draw(bounds), data.draw(bounds), data.draw(st.sampled_from([1, 2, -1, -3]))
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, end, step)
    np.testing.assert_array_equal(run("Slice", x, starts=[start], ends=[end], axes=[axis], steps=[step]),
                                  x[tuple(index)])


def test_split_equal_parts_and_errors() -> None:
    x = np.arange(12).reshape(6, 2)
    a, _, c = run("Split", x, n_out=3)
    assert a.tolist() == [[0, 1], [2, 3]] and c.tolist() == [[8, 9], [10, 11]]
    with pytest.raises(EvaluationError, match="evenly"):
        run("Split", x, n_out=4)
    with pytest.raises(EvaluationError, match="cannot reshape"):
        run("Reshape", x, shape=[5, -1])
    assert run("Slice", x, starts=[1, 0], ends=[2**31, 1]).tolist() == [[2], [4], [6], [8], [10]]


# --- indexing -----------------------------------------------------------------------------------------------
def test_embedding_and_gather() -> None:
    table = randn(10, 4)
    ids = np.array([[3, 0], [9, 3]], np.int64)
    np.testing.assert_array_equal(run("Embedding", ids, table), table[ids])
    np.testing.assert_array_equal(run("Embedding", ids.astype(np.float32), table), table[ids])
    with pytest.raises(EvaluationError, match="out of range"):
        run("Embedding", np.array([10]), table)
    with pytest.raises(EvaluationError, match="non-integer"):
        run("Embedding", np.array([1.5], np.float32), table)
    np.testing.assert_array_equal(run("Gather", table, np.array([-1, 2], np.int32), axis=0), table[[9, 2]])
    np.testing.assert_array_equal(run("Gather", table, ids % 4, axis=-1), np.take(table, ids % 4, axis=-1))


# --- RoPE ---------------------------------------------------------------------------------------------------
def rope_complex(x: np.ndarray, pos: np.ndarray, inv: np.ndarray, mode: str) -> np.ndarray:
    """Rotation as complex multiplication: pair (a, b) is a + ib, multiplied by exp(i * pos * inv)."""
    x = x.astype(np.float64)
    rot = 2 * len(inv)
    re_im = (slice(0, rot, 2), slice(1, rot, 2)) if mode == "normal" else (slice(0, rot // 2), slice(rot // 2, rot))
    z = x[..., re_im[0]] + 1j * x[..., re_im[1]]
    z = z * np.exp(1j * pos[..., :, None, None] * inv)
    out = x.copy()
    out[..., re_im[0]], out[..., re_im[1]] = z.real, z.imag
    return out


@pytest.mark.parametrize("mode", ["normal", "neox"])
@pytest.mark.parametrize("rotary_dims", [0, 4])
def test_rope_is_a_complex_rotation(mode: str, rotary_dims: int) -> None:
    x, pos = randn(2, 5, 3, 8), np.array([[0, 1, 2, 7, 100], [3, 4, 5, 6, 7]], np.int64)
    rot = rotary_dims or 8
    inv = 500000.0 ** (-np.arange(0, rot, 2) / rot)
    y = run("RoPE", x, pos, mode=mode, rotary_dims=rotary_dims, theta=500000.0)
    np.testing.assert_allclose(y, rope_complex(x, pos, inv, mode), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(y[..., rot:], x[..., rot:])
    np.testing.assert_allclose(run("RoPE", x[0], pos[0], mode=mode), rope_complex(x[0], pos[0], 1e4 ** (
        -np.arange(0, 8, 2) / 8), mode), rtol=1e-5, atol=1e-6)  # 1-D positions


def test_rope_freq_factors_and_linear_scaling() -> None:
    x, pos = randn(4, 2, 8), np.arange(4, dtype=np.int32) * 3
    ff = np.array([1.0, 2.0, 4.0, 8.0], np.float32)
    inv = 1e4 ** (-np.arange(0, 8, 2) / 8)
    np.testing.assert_allclose(run("RoPE", x, pos, ff), rope_complex(x, pos, inv / ff, "normal"), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(run("RoPE", x, pos, scaling_type="linear", factor=3.0),
                               rope_complex(x, pos / 3.0, inv, "normal"), rtol=1e-5, atol=1e-6)


def llama3_meta(freqs: np.ndarray, factor: float, low: float, high: float, original: int) -> np.ndarray:
    """Meta's apply_scaling (llama-models), frequency by frequency."""
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < original / high:
            out.append(f)
        elif wavelen > original / low:
            out.append(f / factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


def test_rope_llama3_scaling_matches_meta() -> None:
    base = 500000.0 ** (-np.arange(0, 128, 2) / 128)
    got = rope_inv_freq(128, 500000.0, scaling_type="llama3", factor=8.0, original_max_position=8192,
                        low_freq_factor=1.0, high_freq_factor=4.0)
    want = llama3_meta(base, 8.0, 1.0, 4.0, 8192)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert (got < base).any() and (got == base).any()  # both bands are exercised


def test_rope_yarn_limits() -> None:
    base = rope_inv_freq(64, 1e4)
    yarn = rope_inv_freq(64, 1e4, scaling_type="yarn", factor=4.0, original_max_position=4096)
    np.testing.assert_allclose(yarn[:3], base[:3])  # high frequencies extrapolate
    np.testing.assert_allclose(yarn[-3:], base[-3:] / 4.0)  # low frequencies interpolate
    x, pos = randn(3, 1, 64), np.arange(3)
    y = run("RoPE", x, pos, scaling_type="yarn", factor=4.0, original_max_position=4096, attn_factor=1.5)
    np.testing.assert_allclose(y, 1.5 * rope_complex(x, pos, yarn, "normal"), rtol=1e-5, atol=1e-6)


# --- Attention ----------------------------------------------------------------------------------------------
def naive_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, past: int, *, causal: bool = True,
                    window: int = 0, sinks: int = 0, softcap: float = 0.0, scale: float = 0.0,
                    mask: np.ndarray | None = None) -> np.ndarray:
    """One query, one head, one key at a time. q [seq, H, D]; k, v hold the whole cache [total, Hkv, D]."""
    seq, n_heads, d = q.shape
    total, n_kv, dv = v.shape
    scale = scale or 1 / math.sqrt(d)
    y = np.zeros((seq, n_heads, dv))
    for h in range(n_heads):
        kv = h // (n_heads // n_kv)
        for i in range(seq):
            p = past + i
            scores, values = [], []
            for j in range(total):
                if causal and j > p:
                    continue
                if window and p - j >= window and j >= sinks:
                    continue
                if mask is not None and mask.dtype == bool and not mask[h, i, j]:
                    continue
                s = scale * float(np.dot(q[i, h].astype(np.float64), k[j, kv]))
                if softcap:
                    s = softcap * math.tanh(s / softcap)
                if mask is not None and mask.dtype != bool:
                    s += float(mask[h, i, j])
                scores.append(s)
                values.append(v[j, kv].astype(np.float64))
            if scores:
                w = np.exp(np.array(scores) - max(scores))
                y[i, h] = (w / w.sum()) @ np.array(values)
    return y


ATTENTION_CASES = [
    dict(),
    dict(window=3),
    dict(window=2, sinks=2),
    dict(softcap=2.0, scale=0.3),
    dict(causal=False),
    dict(causal=False, window=2),
]


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "plain")
@pytest.mark.parametrize(("n_heads", "n_kv"), [(4, 2), (4, 1), (2, 2)])
def test_attention_matches_naive_loop(case: dict[str, Any], n_heads: int, n_kv: int) -> None:
    past, seq, d = 4, 3, 8
    q, k, v = randn(seq, n_heads, d), randn(seq, n_kv, d), randn(seq, n_kv, 6)
    pk, pv = randn(past, n_kv, d), randn(past, n_kv, 6)
    attrs = {"causal": case.get("causal", True), "sliding_window": case.get("window", 0),
             "sinks": case.get("sinks", 0), "softcap": case.get("softcap", 0.0), "scale": case.get("scale", 0.0)}
    y, present_k, present_v = run("Attention", q, k, v, pk, pv, n_out=3, n_heads=n_heads, n_kv_heads=n_kv,
                                   **attrs)
    np.testing.assert_array_equal(present_k, np.concatenate([pk, k]))
    np.testing.assert_array_equal(present_v, np.concatenate([pv, v]))
    want = naive_attention(q, present_k, present_v, past, **case)
    assert y.shape == (seq, n_heads, 6) and y.dtype == np.float32
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_attention_masks_batch_and_empty_rows() -> None:
    b, seq, h, d = 2, 3, 2, 4
    q, k, v = randn(b, seq, h, d), randn(b, seq, h, d), randn(b, seq, h, d)
    add = randn(b, h, seq, seq)
    keep = RNG.random((b, 1, seq, seq)) > 0.3
    keep[0, 0, 2] = False  # query 2 of batch 0 sees nothing
    y_add = run("Attention", q, k, v, None, None, add, causal=False)
    y_keep = run("Attention", q, k, v, None, None, keep, causal=False)
    for i in range(b):
        np.testing.assert_allclose(y_add[i], naive_attention(q[i], k[i], v[i], 0, causal=False, mask=add[i]),
                                   rtol=1e-5, atol=1e-6)
        hm = np.broadcast_to(keep[i], (h, seq, seq))
        np.testing.assert_allclose(y_keep[i], naive_attention(q[i], k[i], v[i], 0, causal=False, mask=hm),
                                   rtol=1e-5, atol=1e-6)
    assert np.all(y_keep[0, 2] == 0)
    with pytest.raises(EvaluationError, match="n_kv_heads = 3"):
        run("Attention", q, k, v, n_kv_heads=3)


def test_attention_decode_equals_prefill_rows() -> None:
    q, k, v = randn(6, 4, 8), randn(6, 2, 8), randn(6, 2, 8)
    full = run("Attention", q, k, v, sliding_window=3, sinks=1)
    step = run("Attention", q[5:], k[5:], v[5:], k[:5], v[:5], sliding_window=3, sinks=1)
    np.testing.assert_allclose(step[0], full[5], rtol=1e-6, atol=1e-7)


# --- MoE ----------------------------------------------------------------------------------------------------
def test_moe_router_softmax_sigmoid_and_ties() -> None:
    logits = randn(5, 8)
    w, idx = run("MoERouter", logits, n_out=2, n_experts=8, top_k=2)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want_idx = np.argsort(-p, axis=-1, kind="stable")[:, :2]
    want_w = np.take_along_axis(p, want_idx, -1)
    np.testing.assert_array_equal(idx, want_idx)
    np.testing.assert_allclose(w, want_w / want_w.sum(-1, keepdims=True), rtol=1e-6)
    assert w.dtype == np.float32 and idx.dtype == np.int64
    w, _ = run("MoERouter", logits, n_out=2, n_experts=8, top_k=2, normalize=False)
    np.testing.assert_allclose(w, want_w, rtol=1e-6)
    w, idx = run("MoERouter", logits, n_out=2, n_experts=8, top_k=3, scoring="sigmoid", normalize=False)
    np.testing.assert_allclose(w, _sig(np.take_along_axis(logits.astype(np.float64), idx, -1)), rtol=1e-6)
    _, idx = run("MoERouter", np.array([[1.0, 2.0, 2.0, 2.0]], np.float32), n_out=2, n_experts=4, top_k=2)
    assert idx.tolist() == [[1, 2]]


def naive_moe(x: np.ndarray, w: np.ndarray, idx: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray,
              act: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    y = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = idx[t, j]
            h = act(gate[e].astype(np.float64) @ x[t]) * (up[e].astype(np.float64) @ x[t])
            y[t] += w[t, j] * (down[e].astype(np.float64) @ h)
    return y


@pytest.mark.parametrize("op", ["MoEExperts", "MoEExpertsSwiGLU", "gelu"])
def test_moe_experts_match_per_token_loop(op: str) -> None:
    n, k, d, ff, t = 6, 2, 8, 12, 7
    x, gate, up, down = randn(t, d), randn(n, ff, d), randn(n, ff, d), randn(n, d, ff)
    w, idx = run("MoERouter", randn(t, n), n_out=2, n_experts=n, top_k=k)
    extra = {"activation": "gelu"} if op == "gelu" else {}
    y = run("MoEExperts" if op == "gelu" else op, x, w, idx.astype(np.int32), gate, up, down, n_experts=n,
            top_k=k, **extra)
    act = (lambda z: 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))) if op == "gelu" else (
        lambda z: z * _sig(z))
    np.testing.assert_allclose(y, naive_moe(x, w, idx, gate, up, down, act), rtol=1e-5, atol=1e-5)
    y3 = run("MoEExperts", x.reshape(1, t, d), w.reshape(1, t, k), idx.reshape(1, t, k), gate, up, down,
             n_experts=n, top_k=k, **extra)
    np.testing.assert_allclose(y3[0], y, rtol=1e-6)


# --- against Hugging Face transformers (optional: only where torch and transformers are installed) ----------
def _hf_rope_case(scaling: dict[str, Any]) -> tuple[Any, Any, Any]:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64, rope_theta=500000.0,
                         max_position_embeddings=32768, rope_scaling=scaling)
    return config, LlamaRotaryEmbedding(config), apply_rotary_pos_emb


@pytest.mark.parametrize("scaling", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
], ids=["llama3", "yarn"])
def test_rope_matches_transformers(scaling: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    _, rotary, apply = _hf_rope_case(scaling)
    kind = scaling["rope_type"]
    attrs = {"mode": "neox", "theta": 500000.0, "scaling_type": kind, "factor": scaling["factor"],
             "original_max_position": scaling["original_max_position_embeddings"]}
    if kind == "yarn":
        attrs["attn_factor"] = float(rotary.attention_scaling)
    inv = rope_inv_freq(64, 500000.0, scaling_type=kind, factor=scaling["factor"],
                        original_max_position=scaling["original_max_position_embeddings"])
    np.testing.assert_allclose(inv, rotary.inv_freq.numpy(), rtol=1e-6)
    x = np.random.default_rng(1).standard_normal((1, 6, 4, 64)).astype(np.float32)
    pos = np.array([[0, 1, 2, 50, 999, 20000]], np.int64)
    cos, sin = rotary(torch.from_numpy(x), torch.from_numpy(pos))
    xt = torch.from_numpy(x).transpose(1, 2)  # HF layout [batch, heads, seq, head_dim]
    want, _ = apply(xt, xt, cos, sin)
    got = run("RoPE", x, pos, **attrs)
    err = np.abs(got - want.transpose(1, 2).numpy()).max(axis=(0, 2, 3))
    assert np.all(err <= 1e-6 + 2.5e-7 * pos[0] * np.abs(x).max()), err  # HF forms pos * inv_freq in float32


@pytest.mark.parametrize(("window", "softcap"), [(3, 0.0), (2, 5.0), (0, 3.0)])
def test_attention_matches_transformers_eager(window: int, softcap: float) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import masking_utils
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    past, seq, n_heads, n_kv, d = 4, 3, 4, 2, 8
    q, k, v = randn(1, seq, n_heads, d), randn(1, past + seq, n_kv, d), randn(1, past + seq, n_kv, d)
    mask_fn = (masking_utils.sliding_window_causal_mask_function(window) if window
               else masking_utils.causal_mask_function)
    keep = mask_fn(torch.tensor(0), torch.tensor(0), torch.arange(seq)[:, None] + past,
                   torch.arange(past + seq)[None, :])  # HF's q_idx is the cache position past + i
    additive = torch.where(keep, 0.0, torch.finfo(torch.float32).min)[None, None]
    module = torch.nn.Module()
    module.num_key_value_groups, module.training = n_heads // n_kv, False
    t = [torch.from_numpy(a).transpose(1, 2) for a in (q, k, v)]
    want, _ = eager_attention_forward(module, *t, additive, scaling=0.25, softcap=softcap or None)
    got = run("Attention", q, k[:, past:], v[:, past:], k[:, :past], v[:, :past], n_out=1, scale=0.25,
              sliding_window=window, softcap=softcap)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)  # HF runs in float32


def test_moe_matches_transformers_mixtral() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    n, k, d, ff = 4, 2, 16, 24
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(MixtralConfig(hidden_size=d, intermediate_size=ff, num_local_experts=n,
                                                num_experts_per_tok=k)).eval()
    x = randn(1, 5, d)
    with torch.no_grad():
        want, _ = block(torch.from_numpy(x))
    bank = [np.stack([getattr(e, w).weight.detach().numpy() for e in block.experts]) for w in ("w1", "w3", "w2")]
    logits = run("MatMul", x, block.gate.weight.detach().numpy(), transpose_b=True)
    w, idx = run("MoERouter", logits, n_out=2, n_experts=n, top_k=k)
    got = run("MoEExperts", x, w, idx, *bank, n_experts=n, top_k=k)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)

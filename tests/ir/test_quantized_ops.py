"""QuantizedMatMul and QuantizedEmbedding in uaii-ir: the schemas and their shape rules, and the NumPy reference
against MLX's quantized layout written out here from the spec (uaii.ir.ops.quantized's docstring): codes packed into
LSB-first uint32 bit streams by a packer of our own, and every weight value computed element by element."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import serialize_support as S
from graph_builder import GraphBuilder

from uaii.ir import Node, ValidationError, check
from uaii.ir.ops import INDEX, LINALG, Op
from uaii.ir.reference import EvaluationError, run_node
from uaii.ir.reference.quantized import E2M1_VALUES, dequantize, e4m3_values, e8m0_values
from uaii.ir.registry import default_registry
from uaii.ir.serialize import dumps_json, from_bytes, loads_json, to_bytes

RNG = np.random.default_rng(0)
FP_MODES = {"mxfp4": (4, 32), "mxfp8": (8, 32), "nvfp4": (4, 16)}  # mode -> (bits, group_size)


# --- the layout, from the spec ------------------------------------------------------------------------------------
def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Codes [rows, k] as uint32 [rows, k * bits / 32]: value j at bits j*bits.. of the row's stream, LSB first."""
    rows, k = q.shape
    out = np.zeros((rows, k * bits // 32), np.uint32)
    for r in range(rows):
        stream = 0
        for j, v in enumerate(q[r].tolist()):
            stream |= int(v) << (j * bits)
        out[r] = [(stream >> (32 * w)) & 0xFFFFFFFF for w in range(out.shape[1])]
    return out


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float64 values rounded to bfloat16 (8 significant bits, nearest even; normal range only)."""
    m, e = np.frexp(np.asarray(x, np.float64))
    return np.ldexp(np.round(m * 256.0) / 256.0, e)


def round_to(x: np.ndarray, sdt: str) -> np.ndarray:
    """float64 ``x`` rounded to the scales' type T, as float64."""
    if sdt == "bf16":
        return bf16_round(x)
    return np.asarray(x).astype(np.float16 if sdt == "f16" else np.float32).astype(np.float64)


def stored(x: np.ndarray, sdt: str) -> np.ndarray:
    """T-exact float64 values as the arrays the IR carries (bf16 as raw uint16 words)."""
    if sdt == "bf16":
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return x.astype(np.float16 if sdt == "f16" else np.float32)


def e2m1(c: np.ndarray) -> np.ndarray:
    mag = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])[c & 7]
    return np.where(c & 8, -mag, mag)


def e4m3(c: np.ndarray) -> np.ndarray:
    """OCP E4M3 "fn": sign bit 7, exponent bits 6..3 (bias 7), 3 mantissa bits; S.1111.111 is NaN, no infinity."""
    out = []
    for code in np.asarray(c).reshape(-1).tolist():
        exp, man = (code >> 3) & 15, code & 7
        if exp == 15 and man == 7:
            v = float("nan")
        elif exp == 0:
            v = man / 8 * 2.0**-6
        else:
            v = (1 + man / 8) * 2.0 ** (exp - 7)
        out.append(-v if code & 0x80 else v)
    return np.array(out).reshape(np.shape(c))


def e8m0(c: np.ndarray) -> np.ndarray:
    """2^(c - 127) as mlx computes it, in float32 (code 255 overflows to infinity)."""
    with np.errstate(over="ignore"):
        return np.ldexp(1.0, np.asarray(c, np.int64) - 127).astype(np.float32).astype(np.float64)


def expected(q: np.ndarray, scales: np.ndarray, biases: np.ndarray | None, mode: str, gs: int,
             sdt: str = "u8") -> np.ndarray:
    """W [rows, k] as float32, element by element: affine T(T(s*q) + b); the fp modes value * scale."""
    s = np.repeat(scales, gs, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        if mode == "affine":
            assert biases is not None
            b = np.repeat(biases, gs, axis=1)
            return round_to(round_to(s * q, sdt) + b, sdt).astype(np.float32)
        values = e4m3(q) if mode == "mxfp8" else e2m1(q)
        scale = e8m0(s) if mode.startswith("mx") else e4m3(s)
        return (values * scale).astype(np.float32)


def layout(n: int, k: int, mode: str, bits: int, gs: int, sdt: str = "f32", *, sane: bool = False,
           seed: int = 0) -> dict[str, Any]:
    """Random codes, scales (and biases) of a [n, k] weight: the arrays MLX stores and the expected W.

    Scales include negative values (affine, nvfp4). ``sane`` keeps fp scale and value codes finite (no NaN, no
    infinity) for products; otherwise every code may occur."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 2**bits, (n, k))
    groups = k // gs
    if mode == "affine":
        s = round_to(rng.uniform(-0.1, 0.1, (n, groups)), sdt)
        b = round_to(rng.uniform(-1.0, 1.0, (n, groups)), sdt)
        return {"W": pack(q, bits), "scales": stored(s, sdt), "biases": stored(b, sdt),
                "want": expected(q, s, b, mode, gs, sdt)}
    codes = rng.permutation(np.resize(np.arange(256), n * groups)).reshape(n, groups)  # each code, given room
    if sane:
        codes = rng.integers(120, 131, (n, groups)) if mode.startswith("mx") else codes & 0xBF  # exponent <= 7
        if mode == "mxfp8":
            q = np.where((q & 0x7F) == 0x7F, q - 1, q)
    return {"W": pack(q, bits), "scales": codes.astype(np.uint8), "biases": None,
            "want": expected(q, codes, None, mode, gs)}


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == want.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


# --- the schemas -----------------------------------------------------------------------------------------------
def test_schemas_are_registered_with_their_kinds_inputs_and_defaults() -> None:
    reg = default_registry()
    mm, emb = reg.get("QuantizedMatMul", 1), reg.get("QuantizedEmbedding", 1)
    assert Op.QUANTIZED_MATMUL in LINALG and mm.kind.value == "linalg"
    assert Op.QUANTIZED_EMBEDDING in INDEX and emb.kind.value == "index"
    layout_defaults = {"mode": "affine", "bits": 4, "group_size": 64}
    assert {a.name: a.default for a in mm.attrs} == {"K": None, "N": None, **layout_defaults}
    assert {a.name: a.default for a in emb.attrs} == {"dim": None, **layout_defaults}
    assert [p.name for p in mm.inputs] == ["A", "W", "scales", "biases", "bias"]
    assert [p.name for p in emb.inputs] == ["indices", "W", "scales", "biases"]


def _matmul_graph(a: list[Any] | None = None, w: list[Any] | None = None, s: list[Any] | None = None,
                  biases: list[Any] | None = None, bias: list[Any] | None = None, a_dtype: str = "f32",
                  w_dtype: str = "u32", s_dtype: str = "f16", b_dtype: str | None = None, **attrs: Any) -> Any:
    """QuantizedMatMul over a [12, 128] weight (affine, 4 bits, groups of 64 unless told)."""
    at = {"K": 128, "N": 12, **attrs}
    a = a if a is not None else ["batch", "seq", 128]
    g = GraphBuilder("mlxq")
    ins = [g.input("a", a_dtype, a), g.weight("w", w_dtype, w if w is not None else [12, 16]),
           g.weight("s", s_dtype, s if s is not None else [12, 2])]
    ins.append(g.weight("z", b_dtype or s_dtype, biases) if biases else "")
    ins.append(g.weight("bias", a_dtype, bias) if bias else "")
    g.op("QuantizedMatMul", ins, [("y", "f32", [*a[:-1], at["N"]])], **at)
    g.outputs.append("y")
    return g.build()


def _embedding_graph(ids: list[Any], w: list[Any], s: list[Any], biases: list[Any] | None, dim: int,
                     ids_dtype: str = "i64", s_dtype: str = "f16", **attrs: Any) -> Any:
    g = GraphBuilder("mlxq_emb")
    ins = [g.input("ids", ids_dtype, ids), g.weight("w", "u32", w), g.weight("s", s_dtype, s),
           g.weight("z", s_dtype, biases) if biases else ""]
    g.op("QuantizedEmbedding", ins, [("y", "f32", [*ids, dim])], dim=dim, **attrs)
    g.outputs.append("y")
    return g.build()


@pytest.mark.parametrize("sdt", ["f32", "f16", "bf16"])
def test_affine_shapes_that_fit_validate(sdt: str) -> None:
    check(_matmul_graph(s=[12, 2], biases=[12, 2], s_dtype=sdt))
    check(_matmul_graph(["seq", 128], [12, 12], [12, 4], [12, 4], [12], a_dtype="f16", s_dtype=sdt, bits=3,
                        group_size=32))
    check(_matmul_graph([1, 128], [12, 32], [12, 1], [12, 1], s_dtype=sdt, bits=8, group_size=128))
    check(_embedding_graph(["batch", "seq"], [100, 20], [100, 5], [100, 5], 160, s_dtype=sdt, bits=4,
                           group_size=32))


@pytest.mark.parametrize("mode", FP_MODES)
def test_fp_shapes_that_fit_validate(mode: str) -> None:
    bits, gs = FP_MODES[mode]
    words, groups = 128 * bits // 32, 128 // gs
    check(_matmul_graph(w=[12, words], s=[12, groups], s_dtype="u8", mode=mode, bits=bits, group_size=gs))
    check(_matmul_graph(["seq", 128], [12, words], [12, groups], None, [12], a_dtype="bf16", s_dtype="u8",
                        mode=mode, bits=bits, group_size=gs))
    check(_embedding_graph([7], [50, words], [50, groups], None, 128, ids_dtype="i32", s_dtype="u8", mode=mode,
                           bits=bits, group_size=gs))


@pytest.mark.parametrize("case,match", [
    ({"w": [12, 15]}, r"packed weight \(12 rows of 128 4-bit values\) must have shape \[12, 16\], found \[12, 15\]"),
    ({"w": [13, 16]}, r"packed weight .* must have shape \[12, 16\], found \[13, 16\]"),
    ({"w_dtype": "u8"}, r"input #1 \('W'\) has dtype u8"),
    ({"s": [12, 4]}, r"scales \(12 rows of 2 groups\) must have shape \[12, 2\], found \[12, 4\]"),
    ({"biases": None}, "affine needs biases"),
    ({"biases": [12, 3]}, r"biases \(12 rows of 2 groups\) must have shape \[12, 2\], found \[12, 3\]"),
    ({"b_dtype": "f32"}, "biases are f32, scales f16; MLX stores both in one type"),
    ({"s_dtype": "u8", "b_dtype": "f16"}, "affine scales are the model's float type, found u8"),
    ({"mode": "mxfp4", "group_size": 32, "s": [12, 4], "s_dtype": "u8", "b_dtype": "f16", "biases": [12, 4]},
     "mxfp4 has no biases"),
    ({"mode": "nvfp4", "group_size": 16, "s": [12, 8], "biases": None}, "nvfp4 scales are uint8 e4m3 codes, found f16"),
    ({"mode": "mxfp4", "bits": 8, "group_size": 32, "w": [12, 32], "s": [12, 4], "s_dtype": "u8", "biases": None},
     "mxfp4 takes bits 4, not 8"),
    ({"mode": "mxfp8", "bits": 4, "group_size": 32, "s": [12, 4], "s_dtype": "u8", "biases": None},
     "mxfp8 takes bits 8, not 4"),
    ({"mode": "nvfp4", "group_size": 32, "s": [12, 4], "s_dtype": "u8", "biases": None},
     "nvfp4 takes group sizes 16, not 32"),
    ({"bits": 7}, "attribute 'bits' is 7; expected one of 1, 2, 3, 4, 5, 6, 8"),
    ({"group_size": 16, "s": [12, 8], "biases": [12, 8]}, "affine takes group sizes 32, 64, 128, not 16"),
    ({"group_size": 48}, "attribute 'group_size' is 48"),
    ({"mode": "int4"}, "attribute 'mode' is 'int4'; expected one of 'affine', 'mxfp4', 'mxfp8', 'nvfp4'"),
    ({"a": [2, 96], "K": 96, "w": [12, 12]}, "96 values per row is not a whole number of groups of 64"),
    ({"a": [2, 127]}, r"A \[2, 127\] has 127 columns; attribute K is 128"),
    ({"bias": [13]}, r"bias must have shape \[12\], found \[13\]"),
])
def test_matmul_shapes_that_do_not_fit_are_reported(case: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"biases": [12, 2], **case}
    with pytest.raises(ValidationError, match=match):
        check(_matmul_graph(**args))


def test_required_attributes_are_reported() -> None:
    g = GraphBuilder("mlxq")
    ins = [g.input("a", "f32", [2, 64]), g.weight("w", "u32", [4, 8]), g.weight("s", "f32", [4, 1]),
           g.weight("z", "f32", [4, 1])]
    g.op("QuantizedMatMul", ins, [("y", "f32", [2, 4])], group_size=64)
    g.outputs.append("y")
    with pytest.raises(ValidationError) as err:
        check(g.build())
    assert "required attribute 'K'" in str(err.value) and "required attribute 'N'" in str(err.value)


@pytest.mark.parametrize("case,match", [
    ({"dim": 96}, r"packed weight \(100 rows of 96 4-bit values\) must have shape \[100, 12\], found \[100, 20\]"),
    ({"s": [100, 4]}, r"scales \(100 rows of 5 groups\) must have shape \[100, 5\], found \[100, 4\]"),
    ({"w": [99, 20]}, r"scales \(99 rows of 5 groups\) must have shape \[99, 5\], found \[100, 5\]"),
    ({"ids_dtype": "f32"}, r"input #0 \('indices'\) has dtype f32"),
    ({"ids_dtype": "f16"}, r"input #0 \('indices'\) has dtype f16"),
    ({"biases": None}, "affine needs biases"),
    ({"w": ["vocab", 20]}, "needs a static row count"),
])
def test_embedding_shapes_that_do_not_fit_are_reported(case: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"ids": [2, 3], "w": [100, 20], "s": [100, 5], "biases": [100, 5], "dim": 160,
                            "group_size": 32, **case}
    with pytest.raises(ValidationError, match=match):
        check(_embedding_graph(**args))


# --- the reference: dequantize ------------------------------------------------------------------------------
def test_the_module_tables_are_the_spec_values() -> None:
    codes = np.arange(256)
    assert np.array_equal(E2M1_VALUES.view(np.uint32), e2m1(np.arange(16)).astype(np.float32).view(np.uint32))
    assert_bits_equal(e4m3_values(), e4m3(codes).astype(np.float32))
    assert_bits_equal(e8m0_values(), e8m0(codes).astype(np.float32))
    f8 = e4m3_values()
    assert (f8[0x7E], f8[0x38], f8[0x08], f8[0x01], f8[0xB8]) == (448.0, 1.0, 2.0**-6, 2.0**-9, -1.0)
    assert np.isnan(f8[0x7F]) and np.isnan(f8[0xFF]) and np.isfinite(np.delete(f8, [0x7F, 0xFF])).all()
    e8 = e8m0_values()
    assert (e8[127], e8[0], e8[254], e8[255]) == (1.0, 2.0**-127, 2.0**127, np.inf)


@pytest.mark.parametrize("bits,j,v,words", [
    (3, 10, 0b101, [1 << 30, 1, 0]),                     # value 10 at bits 30..32
    (5, 6, 0b10111, [3 << 30, 5, 0, 0, 0]),              # value 6 at bits 30..34
    (6, 5, 0b110101, [1 << 30, 13, 0, 0, 0, 0]),         # value 5 at bits 30..35
])
def test_values_straddle_words_lsb_first(bits: int, j: int, v: int, words: list[int]) -> None:
    q = np.zeros((1, 32), np.int64)
    q[0, j] = v
    packed = pack(q, bits)
    assert packed.tolist() == [words]
    w = dequantize(packed, np.ones((1, 1), np.float32), np.zeros((1, 1), np.float32), mode="affine", bits=bits,
                   group_size=32)
    assert w.tolist() == [[float(v) if i == j else 0.0 for i in range(32)]]


@pytest.mark.parametrize("sdt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("gs", [32, 64, 128])
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 8])
def test_affine_dequantize_is_bit_exact(bits: int, gs: int, sdt: str) -> None:
    lay = layout(5, 3 * gs, "affine", bits, gs, sdt, seed=bits * gs)
    got = dequantize(lay["W"], lay["scales"], lay["biases"], mode="affine", bits=bits, group_size=gs)
    assert_bits_equal(got, lay["want"])


@pytest.mark.parametrize("mode", FP_MODES)
@pytest.mark.parametrize("sane", [False, True])
def test_fp_dequantize_is_bit_exact_for_every_code(mode: str, sane: bool) -> None:
    bits, gs = FP_MODES[mode]
    lay = layout(32, 8 * gs, mode, bits, gs, sane=sane, seed=bits + gs)  # 256 scale codes
    got = dequantize(lay["W"], lay["scales"], None, mode=mode, bits=bits, group_size=gs)
    assert_bits_equal(got, lay["want"])
    assert np.isfinite(got).all() == sane


def test_negative_scales() -> None:
    w = pack(np.full((1, 32), 3), 4)
    for sdt in ("f32", "f16", "bf16"):
        s, b = stored(np.array([[-0.5]]), sdt), stored(np.array([[0.25]]), sdt)
        assert (dequantize(w, s, b, mode="affine", bits=4, group_size=32) == -1.25).all()
    w16 = pack(np.array([[3] * 16 + [11] * 16]), 4)                  # E2M1 1.5, then -1.5
    nv = dequantize(w16, np.array([[0xB8, 0x38]], np.uint8), None, mode="nvfp4", bits=4, group_size=16)
    assert nv.tolist() == [[-1.5] * 16 + [-1.5] * 16]


def test_dequantize_refuses_arrays_that_do_not_fit() -> None:
    lay = layout(4, 64, "affine", 4, 32, "f32")
    with pytest.raises(EvaluationError, match="64 4-bit values per row need 8 words, found 7"):
        dequantize(lay["W"][:, :7], lay["scales"], lay["biases"], mode="affine", bits=4, group_size=32, k=64)
    with pytest.raises(EvaluationError, match=r"scales must have shape \[4, 2\], found \[4, 1\]"):
        dequantize(lay["W"], lay["scales"][:, :1], lay["biases"], mode="affine", bits=4, group_size=32)
    with pytest.raises(EvaluationError, match="affine mode needs biases"):
        dequantize(lay["W"], lay["scales"], None, mode="affine", bits=4, group_size=32)
    with pytest.raises(EvaluationError, match="mxfp4 takes uint8 scale codes and no biases"):
        dequantize(lay["W"], lay["scales"].astype(np.uint8), lay["scales"], mode="mxfp4", bits=4, group_size=32)
    with pytest.raises(EvaluationError, match="mxfp4 takes bits 4, not 8"):
        dequantize(lay["W"], lay["scales"], None, mode="mxfp4", bits=8, group_size=32)


# --- the reference: the ops ----------------------------------------------------------------------------------
def _run(op: str, inputs: list[np.ndarray | None], **attrs: Any) -> np.ndarray:
    names = tuple("" if x is None else f"in{i}" for i, x in enumerate(inputs))
    return run_node(Node("n", op, names, ("y",), attrs), inputs)[0]


@pytest.mark.parametrize("mode,bits,gs,sdt,adt", [
    ("affine", 4, 64, "f32", "f32"), ("affine", 3, 32, "f16", "f32"), ("affine", 6, 128, "bf16", "f16"),
    ("affine", 2, 32, "bf16", "f32"), ("affine", 8, 64, "f16", "f16"),
    ("mxfp4", 4, 32, "u8", "f32"), ("mxfp8", 8, 32, "u8", "f16"), ("nvfp4", 4, 16, "u8", "f32"),
])
def test_quantized_matmul_is_a_float64_product_with_the_spec_weight(mode: str, bits: int, gs: int, sdt: str,
                                                                    adt: str) -> None:
    n, k = 9, 4 * gs
    lay = layout(n, k, mode, bits, gs, sdt, sane=True, seed=k + bits)
    a = RNG.standard_normal((2, 3, k)).astype(np.float16 if adt == "f16" else np.float32)
    bias = RNG.standard_normal(n).astype(a.dtype)
    at = {"K": k, "N": n, "mode": mode, "bits": bits, "group_size": gs}
    w64 = lay["want"].astype(np.float64)
    for b in (None, bias):
        y = _run("QuantizedMatMul", [a, lay["W"], lay["scales"], lay["biases"], b], **at)
        want = a.astype(np.float64) @ w64.T + (0.0 if b is None else b.astype(np.float64))
        assert y.dtype == np.float32 and y.shape == (2, 3, n)
        np.testing.assert_allclose(y, want.astype(np.float32), rtol=1e-6, atol=1e-7 * float(np.abs(want).max()))


def test_quantized_matmul_refuses_a_k_or_n_that_does_not_fit() -> None:
    lay = layout(4, 64, "affine", 4, 32)
    a = np.ones((1, 64), np.float32)
    with pytest.raises(EvaluationError, match=r"A \[1, 64\] must end in K = 32"):
        _run("QuantizedMatMul", [a, lay["W"], lay["scales"], lay["biases"]], K=32, N=4, group_size=32)
    with pytest.raises(EvaluationError, match="W has 4 rows; attribute N is 5"):
        _run("QuantizedMatMul", [a, lay["W"], lay["scales"], lay["biases"]], K=64, N=5, group_size=32)


@pytest.mark.parametrize("mode,bits,gs,sdt", [("affine", 4, 32, "bf16"), ("affine", 5, 64, "f16"),
                                              ("mxfp4", 4, 32, "u8"), ("nvfp4", 4, 16, "u8")])
def test_quantized_embedding_returns_the_rows_and_refuses_ids_outside_the_table(mode: str, bits: int, gs: int,
                                                                                sdt: str) -> None:
    vocab, dim = 11, 2 * gs
    lay = layout(vocab, dim, mode, bits, gs, sdt, seed=vocab + bits)
    ids = np.array([[3, 0, 3], [10, 1, 3]], np.int64)
    at = {"dim": dim, "mode": mode, "bits": bits, "group_size": gs}
    for idx in (ids, ids.astype(np.int32)):
        y = _run("QuantizedEmbedding", [idx, lay["W"], lay["scales"], lay["biases"]], **at)
        assert y.shape == (2, 3, dim)
        assert_bits_equal(y, lay["want"][ids])
    with pytest.raises(EvaluationError, match="out of range for size 11"):
        _run("QuantizedEmbedding", [np.array([2, 11]), lay["W"], lay["scales"], lay["biases"]], **at)


# --- serialization --------------------------------------------------------------------------------------------
def test_a_graph_with_both_ops_round_trips_through_json_and_binary() -> None:
    g = GraphBuilder("mlxq_model")
    ids = g.input("ids", "i64", ["batch", "seq"])
    emb = [g.weight("emb.w", "u32", [100, 16]), g.weight("emb.s", "bf16", [100, 2]), g.weight("emb.z", "bf16",
                                                                                            [100, 2])]
    g.op("QuantizedEmbedding", [ids, *emb], [("h", "f32", ["batch", "seq", 128])], dim=128, bits=4, group_size=64)
    head = [g.weight("head.w", "u32", [100, 16]), g.weight("head.s", "u8", [100, 4])]
    g.op("QuantizedMatMul", ["h", *head, "", g.weight("head.b", "f32", [100])],
         [("logits", "f32", ["batch", "seq", 100])], K=128, N=100, mode="mxfp4", bits=4, group_size=32)
    g.outputs.append("logits")
    graph = g.build()
    check(graph)
    for back in (loads_json(dumps_json(graph)), from_bytes(to_bytes(graph))):
        assert S.graph_key(back) == S.graph_key(graph)
        check(back)


# --- QuantizedMoEExperts ----------------------------------------------------------------------------------------
def _bank(e: int, n: int, k: int, mode: str, bits: int, gs: int, sdt: str, seed: int) -> dict[str, Any]:
    """An expert bank [e, n, k]: each expert a layout(), stacked; ``want`` the banks' expected float32 values."""
    parts = [layout(n, k, mode, bits, gs, sdt, sane=True, seed=seed + i) for i in range(e)]
    out = {key: np.stack([p[key] for p in parts]) for key in ("W", "scales", "want")}
    out["biases"] = np.stack([p["biases"] for p in parts]) if mode == "affine" else None
    return out


@pytest.mark.parametrize("mode,bits,groups,sdt,act", [
    ("affine", (4, 4, 8), (32, 32, 64), "f32", "silu"), ("affine", (3, 2, 6), (32, 64, 32), "bf16", "gelu"),
    ("mxfp4", (4, 4, 4), (32, 32, 32), "u8", "silu"), ("nvfp4", (4, 4, 4), (16, 16, 16), "u8", "silu")])
def test_quantized_experts_are_moe_experts_over_the_spec_banks(mode: str, bits: tuple[int, ...],
                                                                groups: tuple[int, ...], sdt: str, act: str) -> None:
    """QuantizedMoEExperts (inputs: X, weights, indices, then gate, up, down values and scales, then their biases)
    computes MoEExperts over the banks dequantized as written out here; bits and groups differ per bank."""
    e, d, ff, rows = 4, 64, 128, 5
    banks = [_bank(e, n, k, mode, bits[i], groups[i], sdt, 10 * i)
             for i, (n, k) in enumerate(((ff, d), (ff, d), (d, ff)))]
    x = RNG.standard_normal((rows, d)).astype(np.float32)
    w = RNG.uniform(0.1, 1.0, (rows, 2)).astype(np.float32)
    idx = RNG.integers(0, e, (rows, 2)).astype(np.int64)
    ins = [x, w, idx, *(t for bk in banks for t in (bk["W"], bk["scales"])), *(bk["biases"] for bk in banks)]
    at = {"n_experts": e, "top_k": 2, "activation": act, "mode": mode, "bits": bits, "group_sizes": groups}
    got = _run("QuantizedMoEExperts", ins, **at)
    want = _run("MoEExperts", [x, w, idx, *(bk["want"] for bk in banks)], n_experts=e, top_k=2, activation=act)
    assert_bits_equal(got, want)
    dt = {"f32": "f32", "bf16": "bf16", "u8": "u8"}[sdt]
    for extra in (0, 1):  # extra: a down bank's scales one group too wide
        g = GraphBuilder("qmoe")
        names = [g.input("x", "f32", ["seq", d]), g.input("w", "f32", ["seq", 2]), g.input("i", "i64", ["seq", 2])]
        for i, bk in enumerate(banks):
            sshape = [*bk["scales"].shape[:-1], bk["scales"].shape[-1] + (extra if i == 2 else 0)]
            names += [g.weight(f"w{i}", "u32", list(bk["W"].shape)), g.weight(f"s{i}", dt, sshape)]
        names += [g.weight(f"b{i}", dt, list(bk["biases"].shape)) if bk["biases"] is not None else ""
                  for i, bk in enumerate(banks)]
        g.op("QuantizedMoEExperts", names, [("y", "f32", ["seq", d])], **at)
        g.outputs.append("y")
        if not extra:
            check(g.build())
            continue
        with pytest.raises(ValidationError, match=r"scales \(64 rows of \d+ groups\) must have shape"):
            check(g.build())

"""onnxruntime's contrib ops through the importer, against onnxruntime itself on the same hand-built graphs.

Each graph is built with onnx.helper (domain com.microsoft), run by onnxruntime (CPU, one thread) and imported; the
IR graph is validated and evaluated with uaii.ir's reference, and every output must agree within 1e-4 (f32). The
refusals (features the IR has no counterpart for) must name the node and the feature.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uaii.ir import check
from uaii.ir.reference import evaluate
from uaii.loaders.onnx.contrib_rotary import CACHE_LIMIT, fit_rotary
from uaii.loaders.onnx.dispatch import OnnxImportError
from uaii.loaders.onnx.importer import ImportedGraph, import_graph
from uaii.loaders.onnx.reader import open_onnx

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx_lm_support import ort_run, quantize, rope_caches, weights_of  # noqa: E402

F32 = TensorProto.FLOAT
MS = "com.microsoft"
RNG = np.random.default_rng(14)


# --- harness --------------------------------------------------------------------------------------------------
def make_model(nodes: list[Any], inputs: list[Any], outputs: list[str], inits: dict[str, np.ndarray] | None = None,
               opset: int = 17) -> Any:
    graph = helper.make_graph(nodes, "contrib", inputs, [helper.make_empty_tensor_value_info(o) for o in outputs],
                              initializer=[numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                             ir_version=9)


def tensor_input(name: str, shape: list[int | str], elem: int = F32) -> Any:
    return helper.make_tensor_value_info(name, elem, shape)


def ours(path: Path, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], ImportedGraph]:
    imported = import_graph(open_onnx(path))
    check(imported.graph, source=str(path))
    return evaluate(imported.graph, feeds, weights_of(imported)), imported


def compare(tmp_path: Path, model: Any, feeds: dict[str, np.ndarray], atol: float = 1e-4,
            rtol: float = 1e-4) -> ImportedGraph:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    want = ort_run(path, feeds)
    got, imported = ours(path, feeds)
    for name, w in want.items():
        assert got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, atol=atol, rtol=rtol, err_msg=name)
    return imported


def refused(tmp_path: Path, model: Any, *words: str) -> str:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    with pytest.raises(OnnxImportError) as info:
        import_graph(open_onnx(path))
    msg = str(info.value)
    for w in words:
        assert w in msg, msg
    return msg


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# --- norms ----------------------------------------------------------------------------------------------------
def test_simplified_layer_norm(tmp_path: Path) -> None:
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "w"], ["y"], epsilon=1e-5, axis=-1)
    m = make_model([node], [tensor_input("x", ["b", "s", 32])], ["y"], {"w": randn(32)})
    compare(tmp_path, m, {"x": randn(2, 5, 32)})


@pytest.mark.parametrize("bias", [False, True])
def test_skip_simplified_layer_norm_all_outputs(tmp_path: Path, bias: bool) -> None:
    ins = ["x", "skip", "w", "bias"] if bias else ["x", "skip", "w"]
    node = helper.make_node("SkipSimplifiedLayerNormalization", ins, ["y", "", "", "sum"], domain=MS,
                            epsilon=1e-6)
    inits = {"w": randn(32), **({"bias": randn(32)} if bias else {})}
    m = make_model([node], [tensor_input("x", ["b", "s", 32]), tensor_input("skip", ["b", "s", 32])],
                   ["y", "sum"], inits)
    compare(tmp_path, m, {"x": randn(1, 6, 32), "skip": randn(1, 6, 32)})


def test_skip_simplified_default_epsilon_is_onnxruntimes(tmp_path: Path) -> None:
    """Without the attribute onnxruntime uses 1e-12: tiny inputs show the difference from 1e-5."""
    node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "w"], ["y"], domain=MS)
    m = make_model([node], [tensor_input("x", [1, 3, 16]), tensor_input("skip", [1, 3, 16])], ["y"],
                   {"w": np.ones(16, np.float32)})
    tiny = {"x": randn(1, 3, 16) * 1e-4, "skip": randn(1, 3, 16) * 1e-4}
    compare(tmp_path, m, tiny, atol=1e-3, rtol=1e-3)


def test_skip_layer_norm(tmp_path: Path) -> None:
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "g", "b", "bias"], ["y", "", "", "sum"],
                            domain=MS, epsilon=1e-5)
    m = make_model([node], [tensor_input("x", ["b", "s", 24]), tensor_input("skip", ["b", "s", 24])],
                   ["y", "sum"], {"g": randn(24), "b": randn(24), "bias": randn(24)})
    compare(tmp_path, m, {"x": randn(2, 3, 24), "skip": randn(2, 3, 24)})


def test_training_outputs_are_refused(tmp_path: Path) -> None:
    node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "w"], ["y", "", "inv"], domain=MS)
    m = make_model([node], [tensor_input("x", [1, 2, 8]), tensor_input("skip", [1, 2, 8])], ["y", "inv"],
                   {"w": randn(8)})
    refused(tmp_path, m, "SkipSimplifiedLayerNormalization", "training")


# --- rotary ---------------------------------------------------------------------------------------------------
def test_fit_rotary_recovers_theta_factors_and_magnitude() -> None:
    cos, sin = rope_caches(4096, 64, theta=500000.0)
    fit = fit_rotary(cos, sin)
    assert not isinstance(fit, str)
    assert fit.freq_factors is None and abs(fit.theta - 500000.0) / 500000.0 < 1e-4 and fit.rows == 4096
    factors = np.linspace(1.0, 8.0, 32).astype(np.float32)
    fit = fit_rotary(*rope_caches(2048, 64, factors=factors, magnitude=1.25))
    assert not isinstance(fit, str) and fit.freq_factors is not None
    inv_fit = fit.theta ** (-np.arange(0, 64, 2) / 64) / fit.freq_factors
    inv_true = 1.0 / 10000.0 ** (np.arange(0, 64, 2) / 64) / factors
    np.testing.assert_allclose(inv_fit, inv_true, rtol=1e-5)
    assert abs(fit.magnitude - 1.25) < 1e-5


def test_fit_rotary_refuses_a_table_that_is_not_a_rotation() -> None:
    cos, sin = rope_caches(64, 16)
    angle = np.arctan2(sin[40, 3], cos[40, 3]) + 0.05  # still a unit vector: only the angle is off
    cos[40, 3], sin[40, 3] = np.cos(angle), np.sin(angle)
    why = fit_rotary(cos, sin)
    assert isinstance(why, str) and "row 40, column 3" in why
    assert "magnitude" in str(fit_rotary(cos * np.linspace(1, 2, 64)[:, None].astype(np.float32), sin))


@pytest.mark.parametrize("chunk", [8, 24, 1 << 16])
def test_fit_rotary_works_a_few_rows_at_a_time(chunk: int) -> None:
    """The float64 work goes ``chunk`` elements (here 1 or 3 rows of 8 columns) at a time: the same fit, and a bad
    row or a NaN in a later chunk is still found with its row number."""
    cos, sin = rope_caches(300, 16, theta=500000.0, factors=np.linspace(1, 4, 8).astype(np.float32))
    whole, part = fit_rotary(cos, sin), fit_rotary(cos, sin, chunk=chunk)
    assert not isinstance(whole, str) and not isinstance(part, str)
    assert (part.theta, part.magnitude, part.rows) == (whole.theta, whole.magnitude, whole.rows)
    assert part.freq_factors is not None and whole.freq_factors is not None
    np.testing.assert_array_equal(part.freq_factors, whole.freq_factors)
    bent = cos.copy(), sin.copy()
    angle = np.arctan2(sin[251, 5], cos[251, 5]) + 0.05
    bent[0][251, 5], bent[1][251, 5] = np.cos(angle), np.sin(angle)
    assert "row 251, column 5" in str(fit_rotary(*bent, chunk=chunk))
    nan = cos.copy()
    nan[277, 2] = np.nan
    assert "not finite (row 277)" in str(fit_rotary(nan, sin, chunk=chunk))


def test_a_rotary_cache_too_large_to_read_is_refused_before_reading(tmp_path: Path) -> None:
    """A cos/sin cache of 1 GiB (external data in a sparse file: nothing is written, nothing may be read) is
    refused with its size and the limit, not read and fitted."""
    half, row_bytes = 8, 8 * 4
    rows = 4 * CACHE_LIMIT // row_bytes
    with (tmp_path / "cache.bin").open("wb") as f:
        f.truncate(rows * row_bytes)
    tensors = []
    for name in ("cos", "sin"):
        t = TensorProto(name=name, data_type=F32, dims=[rows, half], data_location=TensorProto.EXTERNAL)
        for key, value in (("location", "cache.bin"), ("offset", "0"), ("length", str(rows * row_bytes))):
            t.external_data.add(key=key, value=value)
        tensors.append(t)
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS)
    m = make_model([node], [tensor_input("x", [1, 2, 3, 16]), tensor_input("pos", [1, 3], TensorProto.INT64)], ["y"])
    m.graph.initializer.extend(tensors)
    refused(tmp_path, m, "RotaryEmbedding", f"cos_cache [{rows}, {half}] is {rows * row_bytes} bytes",
            f"more than {CACHE_LIMIT} bytes")


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["3d", "4d"])
def test_rotary_embedding(tmp_path: Path, interleaved: int, layout: str) -> None:
    heads, head = 2, 16
    cos, sin = rope_caches(64, head)
    attrs: dict[str, Any] = {"interleaved": interleaved}
    if layout == "3d":
        x_in, x = tensor_input("x", [1, "s", heads * head]), randn(1, 5, heads * head)
        attrs["num_heads"] = heads
    else:
        x_in, x = tensor_input("x", [1, heads, "s", head]), randn(1, heads, 5, head)
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, **attrs)
    m = make_model([node], [x_in, tensor_input("pos", [1, "s"], TensorProto.INT64)], ["y"], {"cos": cos, "sin": sin})
    compare(tmp_path, m, {"x": x, "pos": np.asarray([[3, 4, 5, 9, 20]], np.int64)})


def test_rotary_embedding_partial(tmp_path: Path) -> None:
    cos, sin = rope_caches(32, 8)
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, num_heads=2,
                            rotary_embedding_dim=8)
    m = make_model([node], [tensor_input("x", [1, 4, 32]), tensor_input("pos", [1, 4], TensorProto.INT64)], ["y"],
                   {"cos": cos, "sin": sin})
    compare(tmp_path, m, {"x": randn(1, 4, 32), "pos": np.arange(4, dtype=np.int64)[None]})


def test_rotary_embedding_with_scaled_frequencies(tmp_path: Path) -> None:
    cos, sin = rope_caches(64, 16, factors=np.asarray([1, 1, 2, 2, 4, 4, 8, 8], np.float32), magnitude=1.1)
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS)
    m = make_model([node], [tensor_input("x", [1, 2, 3, 16]), tensor_input("pos", [1, 3], TensorProto.INT64)],
                   ["y"], {"cos": cos, "sin": sin})
    compare(tmp_path, m, {"x": randn(1, 2, 3, 16), "pos": np.asarray([[60, 61, 62]], np.int64)})


@pytest.mark.parametrize("layout", ["3d", "4d"])
def test_ai_onnx_rotary_embedding_23(tmp_path: Path, layout: str) -> None:
    cos, sin = rope_caches(64, 8)  # partial: 8 of 16 channels rotate
    attrs: dict[str, Any] = {"rotary_embedding_dim": 8, "interleaved": 1}
    if layout == "3d":
        x_in, x = tensor_input("x", [1, "s", 32]), randn(1, 4, 32)
        attrs["num_heads"] = 2
    else:
        x_in, x = tensor_input("x", [1, 2, "s", 16]), randn(1, 2, 4, 16)
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], **attrs)
    m = make_model([node], [x_in, tensor_input("pos", [1, "s"], TensorProto.INT64)], ["y"], {"cos": cos, "sin": sin},
                   opset=23)
    compare(tmp_path, m, {"x": x, "pos": np.asarray([[0, 2, 4, 63]], np.int64)})


def test_rotary_embedding_refuses_runtime_caches(tmp_path: Path) -> None:
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS)
    m = make_model([node], [tensor_input("x", [1, 2, 3, 16]), tensor_input("pos", [1, 3], TensorProto.INT64),
                            tensor_input("cos", [8, 8]), tensor_input("sin", [8, 8])], ["y"])
    refused(tmp_path, m, "RotaryEmbedding", "cos/sin caches")


# --- GroupQueryAttention --------------------------------------------------------------------------------------
def gqa_model(*, heads: int = 4, kv: int = 2, head: int = 16, packed: bool = True, rotary: bool = False,
              rows: int = 64, lengths: str = "shapes", **attrs: Any) -> Any:
    """``lengths``: ``shapes`` computes seqlens_k = past + seq - 1 and total_sequence_length = past + seq from the
    inputs' shapes (provably unpadded, as the importer requires); ``inputs`` takes them as graph inputs."""
    d = (heads + 2 * kv) * head
    inputs = [tensor_input("q", [1, "s", d if packed else heads * head])]
    names = ["q", "", ""]
    if not packed:
        inputs += [tensor_input("k", [1, "s", kv * head]), tensor_input("v", [1, "s", kv * head])]
        names = ["q", "k", "v"]
    inputs += [tensor_input("past_k", [1, kv, "p", head]), tensor_input("past_v", [1, kv, "p", head])]
    names += ["past_k", "past_v", "seqlens_k", "total"]
    inits: dict[str, np.ndarray] = {}
    nodes = []
    if lengths == "inputs":
        inputs += [tensor_input("seqlens_k", [1], TensorProto.INT32), tensor_input("total", [], TensorProto.INT32)]
    else:
        inits.update(i1=np.asarray(1, np.int64), i2=np.asarray(2, np.int64), axes=np.asarray([0], np.int64))
        nodes = [helper.make_node("Shape", ["past_k"], ["past_shape"]),
                 helper.make_node("Gather", ["past_shape", "i2"], ["past_len"], axis=0),
                 helper.make_node("Shape", ["q"], ["q_shape"]),
                 helper.make_node("Gather", ["q_shape", "i1"], ["seq_len"], axis=0),
                 helper.make_node("Add", ["past_len", "seq_len"], ["total64"]),
                 helper.make_node("Sub", ["total64", "i1"], ["last64"]),
                 helper.make_node("Cast", ["total64"], ["total"], to=TensorProto.INT32),
                 helper.make_node("Cast", ["last64"], ["last"], to=TensorProto.INT32),
                 helper.make_node("Unsqueeze", ["last", "axes"], ["seqlens_k"])]
    if rotary:
        cos, sin = rope_caches(rows, head)
        inits.update(cos=cos, sin=sin)
        names += ["cos", "sin"]
    node = helper.make_node("GroupQueryAttention", names, ["y", "present_k", "present_v"], domain=MS,
                            num_heads=heads, kv_num_heads=kv, do_rotary=int(rotary), **attrs)
    return make_model([*nodes, node], inputs, ["y", "present_k", "present_v"], inits)


def gqa_feeds(seq: int, past: int, *, heads: int = 4, kv: int = 2, head: int = 16,
              packed: bool = True) -> dict[str, np.ndarray]:
    feeds = {"q": randn(1, seq, (heads + 2 * kv) * head if packed else heads * head),
             "past_k": randn(1, kv, past, head), "past_v": randn(1, kv, past, head)}
    if not packed:
        feeds.update(k=randn(1, seq, kv * head), v=randn(1, seq, kv * head))
    return feeds


@pytest.mark.parametrize(("seq", "past"), [(5, 0), (1, 6), (3, 4)])
def test_gqa_packed_with_rotary(tmp_path: Path, seq: int, past: int) -> None:
    compare(tmp_path, gqa_model(rotary=True), gqa_feeds(seq, past))


def test_gqa_separate_qkv_interleaved_rotary_scale_softcap(tmp_path: Path) -> None:
    m = gqa_model(packed=False, rotary=True, rotary_interleaved=1, scale=0.3, softcap=5.0)
    compare(tmp_path, m, gqa_feeds(3, 2, packed=False))


@pytest.mark.parametrize(("seq", "past"), [(6, 0), (1, 7)])
def test_gqa_local_window(tmp_path: Path, seq: int, past: int) -> None:
    compare(tmp_path, gqa_model(local_window_size=3), gqa_feeds(seq, past))


def test_gqa_refuses_lengths_it_cannot_prove_unpadded(tmp_path: Path) -> None:
    """seqlens_k given at run time may pad (onnxruntime then reads a shorter past than past_key holds): refused,
    not imported on the assumption that it does not. The same graph with a padded seqlens_k shows onnxruntime
    differs from the unpadded computation, which is all the IR's Attention could do."""
    model = gqa_model(lengths="inputs")
    msg = refused(tmp_path, model, "GroupQueryAttention", "seqlens_k", "computed at run time", "padding")
    assert "past_key's shape" in msg
    feeds = gqa_feeds(1, 4)
    full = ort_run(tmp_path / "model.onnx", {**feeds, "seqlens_k": np.asarray([4], np.int32),
                                             "total": np.asarray(5, np.int32)})
    padded = ort_run(tmp_path / "model.onnx", {**feeds, "seqlens_k": np.asarray([2], np.int32),
                                               "total": np.asarray(5, np.int32)})
    assert not np.allclose(full["y"], padded["y"], atol=1e-3)


def test_gqa_refuses_a_batch_it_cannot_count(tmp_path: Path) -> None:
    model = gqa_model()
    for vi in model.graph.input:
        vi.type.tensor_type.shape.dim[0].dim_param = "batch"  # seqlens_k [1] no longer covers every row
    refused(tmp_path, model, "GroupQueryAttention", "seqlens_k", "batch")


def test_gqa_refuses_what_the_ir_cannot_do(tmp_path: Path) -> None:
    refused(tmp_path, gqa_model(smooth_softmax=1), "GroupQueryAttention", "smooth softmax")
    refused(tmp_path, gqa_model(k_quant_type="PER_TENSOR"), "quantized KV cache")


# --- MultiHeadAttention ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [0, 1])
def test_mha_with_past_bias_and_padding_mask(tmp_path: Path, causal: int) -> None:
    heads, head, seq, past = 2, 8, 3, 4
    hidden = heads * head
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "bias", "mask", "", "past_k", "past_v"],
                            ["y", "present_k", "present_v"], domain=MS, num_heads=heads, unidirectional=causal)
    inputs = [tensor_input(n, [1, "s", hidden]) for n in ("q", "k", "v")]
    inputs += [tensor_input("mask", [1, "t"], TensorProto.INT32), tensor_input("past_k", [1, heads, "p", head]),
               tensor_input("past_v", [1, heads, "p", head])]
    m = make_model([node], inputs, ["y", "present_k", "present_v"], {"bias": randn(3 * hidden)})
    mask = np.ones((1, past + seq), np.int32)
    mask[0, 1] = 0
    feeds = {"q": randn(1, seq, hidden), "k": randn(1, seq, hidden), "v": randn(1, seq, hidden), "mask": mask,
             "past_k": randn(1, heads, past, head), "past_v": randn(1, heads, past, head)}
    compare(tmp_path, m, feeds)


# --- MatMulNBits ----------------------------------------------------------------------------------------------
def nbits_model(k: int, n: int, bits: int, block: int, zero_points: bool, bias: bool) -> tuple[Any, np.ndarray]:
    w = randn(n, k)
    q, scales, zp = quantize(w, bits, block, zero_points)
    inits = {"B": q, "scales": scales}
    ins = ["a", "B", "scales", "zp" if zero_points else "", "", "bias" if bias else ""]
    if zero_points:
        inits["zp"] = zp
    if bias:
        inits["bias"] = randn(n)
    node = helper.make_node("MatMulNBits", ins, ["y"], domain=MS, K=k, N=n, bits=bits, block_size=block)
    return make_model([node], [tensor_input("a", ["m", k])], ["y"], inits), w


def _nbits_registered() -> bool:
    from uaii.ir.registry import default_registry

    return default_registry().find("MatMulNBits", 1) is not None


NBITS_CASES = [(4, 16, True, False), (4, 32, False, True), (4, 64, True, True), (4, 128, False, False),
               (4, 256, True, False), (8, 32, True, True), (8, 64, False, False), (8, 16, False, True)]


@pytest.mark.parametrize(("bits", "block", "zero_points", "bias"), NBITS_CASES)
def test_matmul_nbits(tmp_path: Path, bits: int, block: int, zero_points: bool, bias: bool) -> None:
    if not _nbits_registered():
        pytest.skip("the IR op MatMulNBits is not registered yet (H5)")
    m, _ = nbits_model(200, 24, bits, block, zero_points, bias)
    compare(tmp_path, m, {"a": randn(3, 200)})  # accuracy_level 0: onnxruntime computes in f32 too


def test_matmul_nbits_keeps_the_accuracy_level(tmp_path: Path) -> None:
    """accuracy_level says whether a backend may quantize A to int8 (4) or must keep it in float (0..3, and unset):
    the IR node carries it; a value outside the spec's 0..4 is refused."""
    for level in (None, 1, 4):
        m, _ = nbits_model(64, 8, 4, 32, True, False)
        if level is not None:
            m.graph.node[0].attribute.append(helper.make_attribute("accuracy_level", level))
        path = tmp_path / f"level{level}.onnx"
        onnx.save(m, path)
        imported = import_graph(open_onnx(path))
        check(imported.graph, source=str(path))
        (node,) = [n for n in imported.graph.nodes if n.op == "MatMulNBits"]
        assert node.get("accuracy_level") == (level or 0)
    m.graph.node[0].attribute[-1].i = 7
    refused(tmp_path, m, "MatMulNBits", "accuracy_level=7")


def test_matmul_nbits_checks_the_layout(tmp_path: Path) -> None:
    m, _ = nbits_model(64, 8, 4, 32, False, False)
    for a in m.graph.node[0].attribute:
        if a.name == "K":
            a.i = 96
    msg = refused(tmp_path, m, "MatMulNBits", "B has shape")
    assert "[8, 3, 16]" in msg


# --- GatherBlockQuantized -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("bits", "block", "zero_points", "blocks"), [(4, 16, True, 3), (4, 32, False, 2),
                                                                       (8, 16, True, 2), (8, 32, False, 1)])
def test_gather_block_quantized(tmp_path: Path, bits: int, block: int, zero_points: bool, blocks: int) -> None:
    vocab, k = 40, block * blocks
    q, scales, zp = quantize(randn(vocab, k), bits, block, zero_points)
    inits = {"data": q.reshape(vocab, -1), "scales": scales.reshape(vocab, blocks)}
    ins = ["data", "ids", "scales"]
    if zero_points:
        inits["zp"] = zp.reshape(vocab, -1)
        ins.append("zp")
    node = helper.make_node("GatherBlockQuantized", ins, ["y"], domain=MS, bits=bits, block_size=block,
                            gather_axis=0, quantize_axis=1)
    m = make_model([node], [tensor_input("ids", [1, "s"], TensorProto.INT64)], ["y"], inits)
    compare(tmp_path, m, {"ids": np.asarray([[0, 39, 7, 7, 21]], np.int64)})

"""WebGPU Embedding, Gather and Cast: rows decoded in the shader are bit-exact with the CPU, tables larger than a
storage binding run in row shards (ids outside the table give zero rows), packed rows gather byte by byte, and
Cast rounds inside the graph exactly as the reference does. On lavapipe (a software adapter) in CI."""

from __future__ import annotations

import os

import numpy as np
import pytest

from uaii.backends import ArrayWeights
from uaii.ir import DType, Graph, Node, Tensor, make_graph
from uaii.ir.reference import evaluate
from uaii.kernels import dequantize, get_rows

wgpu = pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")

from uaii.backends.analysis import node_infos  # noqa: E402
from uaii.backends.webgpu import WebGpuBackend  # noqa: E402
from uaii.backends.webgpu.device import GpuDevice  # noqa: E402
from uaii.backends.webgpu.executable import WebGpuExecutable  # noqa: E402
from uaii.backends.webgpu.ops import LOWERINGS  # noqa: E402
from uaii.backends.webgpu.ops.dequant import SUPPORTED  # noqa: E402
from uaii.kernels import random_weight  # noqa: E402

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
GPU = WebGpuBackend(allow_software=True)
STATUS = GPU.probe()
pytestmark = pytest.mark.skipif(not STATUS.available, reason=f"no WebGPU adapter: {STATUS.reason}")


def _graph(nodes: list[Node], tensors: list[Tensor], inputs: list[str], outputs: list[str]) -> Graph:
    return make_graph("gather", nodes, tensors, inputs, outputs)


def _embedding(ids_dtype: DType, n_ids: int, dtype: DType, vocab: int, dim: int) -> Graph:
    out = DType.F32 if dtype.is_quantized else dtype
    tensors = [Tensor("ids", ids_dtype, (n_ids,)), Tensor("table", dtype, (vocab, dim), is_weight=True),
               Tensor("y", out, (n_ids, dim))]
    return _graph([Node("embed", "Embedding", ("ids", "table"), ("y",))], tensors, ["ids"], ["y"])


def _plain_table(dtype: DType, vocab: int, dim: int) -> np.ndarray:
    """Values over the whole range of the type, f16 subnormals included."""
    x = np.random.default_rng(1).normal(size=(vocab, dim)) * np.logspace(-7, 3, vocab)[:, None]
    if dtype is DType.BF16:
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return x.astype(dtype.numpy)


@pytest.mark.parametrize("dtype", sorted(SUPPORTED, key=lambda d: d.value), ids=lambda d: d.value)
def test_embedding_rows_are_bit_exact_with_the_cpu(dtype: DType) -> None:
    vocab, dim = 16, 256
    table = random_weight(dtype, vocab, dim, seed=2) if dtype.is_quantized else _plain_table(dtype, vocab, dim)
    ids = np.array([7, 0, 15, 7, 3], np.int64)
    got = GPU.compile(_embedding(DType.I64, 5, dtype, vocab, dim), None, ArrayWeights({"table": table}),
                      kv_state=False).run({"ids": ids})["y"]
    if dtype.is_quantized:
        assert np.array_equal(got.view(np.uint32), get_rows(table, dtype, dim, ids).view(np.uint32))
    else:
        assert np.array_equal(got.view(np.uint8), table[ids].view(np.uint8))


def test_embedding_takes_ids_declared_f32() -> None:
    table = random_weight(DType.Q5_0, 8, 64)
    ids = np.array([3.0, 1.0, 7.0], np.float32)
    got = GPU.compile(_embedding(DType.F32, 3, DType.Q5_0, 8, 64), None, ArrayWeights({"table": table}),
                      kv_state=False).run({"ids": ids})["y"]
    assert np.array_equal(got, get_rows(table, DType.Q5_0, 64, ids.astype(np.int64)))


def compile_on(dev: GpuDevice, graph: Graph, weights: dict[str, np.ndarray]) -> WebGpuExecutable:
    return WebGpuExecutable(graph, node_infos(graph), ArrayWeights(weights), dev, lowerings=LOWERINGS, kv_state=False)


@pytest.mark.parametrize(("dtype", "vocab", "dim"), [(DType.Q4_0, 600, 256), (DType.F16, 800, 50)],
                         ids=["q4_0_units", "f16_odd_rows"])
def test_a_sharded_table_matches_and_ids_outside_it_give_zero_rows(small_device: GpuDevice, dtype: DType,
                                                                   vocab: int, dim: int) -> None:
    table = random_weight(dtype, vocab, dim) if dtype.is_quantized else _plain_table(dtype, vocab, dim)
    exe = compile_on(small_device, _embedding(DType.I64, 4, dtype, vocab, dim), {"table": table})
    exe.run({"ids": np.array([1, 2, vocab - 2, 4], np.int64)})  # leaves a row where the bad id lands next
    got = exe.run({"ids": np.array([vocab - 1, 0, vocab + 100, vocab // 2], np.int64)})["y"]
    assert len(exe._packed["table"].shards) == 2
    rows = dequantize(table, dtype, vocab * dim).reshape(vocab, dim) if dtype.is_quantized else table
    assert np.array_equal(got[[0, 1, 3]], rows[[vocab - 1, 0, vocab // 2]])
    assert not np.any(got[2])


def test_packed_rows_gather_byte_by_byte_across_shards(small_device: GpuDevice) -> None:
    """q4_0 rows of 32 values are 18 bytes: output words straddle rows from different shards."""
    rows = 5000  # 90 000 bytes: 2 shards
    data = random_weight(DType.Q4_0, rows, 32)
    idx = np.array([[rows - 1, -1, 7], [0, 2500, 2499]], np.int64)
    tensors = [Tensor("x", DType.Q4_0, (rows, 32), is_weight=True), Tensor("i", DType.I64, (2, 3)),
               Tensor("y", DType.Q4_0, (2, 3, 32))]
    g = _graph([Node("g", "Gather", ("x", "i"), ("y",), {"axis": 0})], tensors, ["i"], ["y"])
    exe = compile_on(small_device, g, {"x": data})
    got = exe.run({"i": idx})["y"]
    assert len(exe._packed["x"].shards) == 2
    assert np.array_equal(got, data.reshape(rows, 18)[np.where(idx < 0, idx + rows, idx)].reshape(-1))


def test_gather_of_ints_along_an_inner_axis() -> None:
    tensors = [Tensor("x", DType.I64, (3, 5, 2)), Tensor("i", DType.I64, (3,)), Tensor("y", DType.I64, (3, 3, 2))]
    g = _graph([Node("g", "Gather", ("x", "i"), ("y",), {"axis": 1})], tensors, ["x", "i"], ["y"])
    x = np.arange(30, dtype=np.int64).reshape(3, 5, 2) - 15
    i = np.array([4, -5, 2], np.int64)
    got = GPU.compile(g, None, ArrayWeights({}), kv_state=False).run({"x": x, "i": i})["y"]
    assert np.array_equal(got, np.take(x, [4, 0, 2], axis=1))


def test_packed_rows_gathered_then_cast_decode_on_the_device() -> None:
    """Gather keeps q8_0 rows packed in the arena; Cast dequantizes that activation in the shader."""
    data = random_weight(DType.Q8_0, 9, 64)
    tensors = [Tensor("x", DType.Q8_0, (9, 64), is_weight=True), Tensor("i", DType.I64, (3,)),
               Tensor("rows", DType.Q8_0, (3, 64)), Tensor("y", DType.F32, (3, 64))]
    nodes = [Node("g", "Gather", ("x", "i"), ("rows",)), Node("c", "Cast", ("rows",), ("y",), {"to": "f32"})]
    g = _graph(nodes, tensors, ["i"], ["y"])
    got = GPU.compile(g, None, ArrayWeights({"x": data}), kv_state=False).run({"i": np.array([8, 0, 4])})["y"]
    assert np.array_equal(got, dequantize(data, DType.Q8_0, 9 * 64).reshape(9, 64)[[8, 0, 4]])


SPECIAL = np.array([1 + 2**-11, 1 + 3 * 2**-11, 65519.0, 65520.0, 1e-8, 2**-25, 3 * 2**-25, -0.0, np.inf, -np.inf,
                    np.nan, 1e10, -3.3e-3, 0.1, 2**-14 - 2**-25, 3.0e38, 1.00390625 + 2**-9, 255.5, -1.5e-45],
                   np.float32)


@pytest.mark.parametrize("mid", ["f16", "bf16"])
def test_a_cast_inside_the_graph_rounds_like_the_reference(mid: str) -> None:
    """f32 -> f16/bf16 -> f32: the middle value lives on the device as f32, so the rounding must happen there."""
    tensors = [Tensor("x", DType.F32, (SPECIAL.size,)), Tensor("h", DType.parse(mid), (SPECIAL.size,)),
               Tensor("y", DType.F32, (SPECIAL.size,))]
    nodes = [Node("down", "Cast", ("x",), ("h",), {"to": mid}), Node("up", "Cast", ("h",), ("y",), {"to": "f32"})]
    g = _graph(nodes, tensors, ["x"], ["y"])
    got = GPU.compile(g, None, ArrayWeights({}), kv_state=False).run({"x": SPECIAL})["y"]
    want = evaluate(g, {"x": SPECIAL}, {})["y"]
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("to", ["i8", "u8", "i32", "bool"])
def test_float_to_int_rounds_half_to_even_saturates_and_maps_nan_to_zero(to: str) -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 127.5, 128.0, -129.0, 3e9, -3e9, np.nan, np.inf, -np.inf, -0.0, 254.5],
                 np.float32)
    tensors = [Tensor("x", DType.F32, (x.size,)), Tensor("y", DType.parse(to), (x.size,))]
    g = _graph([Node("c", "Cast", ("x",), ("y",), {"to": to})], tensors, ["x"], ["y"])
    got = GPU.compile(g, None, ArrayWeights({}), kv_state=False).run({"x": x})["y"]
    want = evaluate(g, {"x": x}, {})["y"]
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_packed_rows_of_a_quantized_weight_gather_along_a_middle_axis() -> None:
    """An expert bank [E, R, K] gathered along R keeps its blocks packed (the weight is not read as f32)."""
    e, r, k = 3, 4, 64
    data = random_weight(DType.Q8_0, e * r, k)
    tensors = [Tensor("x", DType.Q8_0, (e, r, k), is_weight=True), Tensor("i", DType.I64, (2,)),
               Tensor("y", DType.Q8_0, (e, 2, k))]
    g = _graph([Node("g", "Gather", ("x", "i"), ("y",), {"axis": 1})], tensors, ["i"], ["y"])
    got = GPU.compile(g, None, ArrayWeights({"x": data}), kv_state=False).run({"i": np.array([3, -4])})["y"]
    assert np.array_equal(got, data.reshape(e, r, 68)[:, [3, 0]].reshape(-1))

"""Streaming weights to the device in chunks: a streamed weight passes through one staging buffer of
``chunk_bytes`` shard by shard, each shard uploaded right before the dispatch that reads it, so a model whose
weights exceed the device budget runs with a staging buffer far smaller than its largest tensor."""

from __future__ import annotations

import numpy as np
import pytest

from uaii.backends import ArrayWeights
from uaii.ir import DType, Node, Tensor, make_graph
from uaii.ir.reference import evaluate
from uaii.kernels import dequantize

pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")

from uaii.backends.analysis import node_infos
from uaii.backends.webgpu import WebGpuBackend
from uaii.backends.webgpu.device import open_device
from uaii.backends.webgpu.executable import WebGpuExecutable
from uaii.backends.webgpu.ops import LOWERINGS
from uaii.backends.webgpu.program import Upload
from uaii.kernels import random_weight

STATUS = WebGpuBackend(allow_software=True).probe()
pytestmark = pytest.mark.skipif(not STATUS.available, reason=f"no WebGPU adapter: {STATUS.reason}")

D, VOCAB = 128, 300
ROW = DType.Q4_0.nbytes(D)  # 72 bytes


def tied_graph() -> tuple:
    """An embedding lookup and an lm_head over one tied q4_0 table, then a second lm_head pass: the table is read
    by three nodes, in chunks, and must be uploaded again wherever its staging buffer holds another chunk."""
    table = random_weight(DType.Q4_0, VOCAB, D, seed=3)
    tensors = [Tensor("ids", DType.I64, (4,)), Tensor("table", DType.Q4_0, (VOCAB, D), is_weight=True),
               Tensor("h", DType.F32, (4, D)), Tensor("z", DType.F32, (4, VOCAB)),
               Tensor("z2", DType.F32, (4, VOCAB))]
    nodes = [Node("embed", "Embedding", ("ids", "table"), ("h",)),
             Node("head", "MatMul", ("h", "table"), ("z",), {"transpose_b": True}),
             Node("head2", "MatMul", ("h", "table"), ("z2",), {"transpose_b": True})]
    return make_graph("tied", nodes, tensors, ["ids"], ["h", "z", "z2"]), {"table": table}


@pytest.mark.parametrize("chunk_rows", [7, 64, VOCAB])
def test_a_streamed_table_in_chunks_equals_the_resident_run(chunk_rows: int) -> None:
    g, arrays = tied_graph()
    dev = open_device(True)
    ids = np.array([0, 299, 150, 7], np.int64)
    resident = WebGpuExecutable(g, node_infos(g), ArrayWeights(arrays), dev, lowerings=LOWERINGS, kv_state=False)
    want = resident.run({"ids": ids})
    exe = WebGpuExecutable(g, node_infos(g), ArrayWeights(arrays), dev, lowerings=LOWERINGS, kv_state=False,
                           streamed=("table",), chunk_bytes=chunk_rows * ROW)
    got = exe.run({"ids": ids})
    got2 = exe.run({"ids": ids})  # a second run re-uploads from the start: the buffer holds the last chunk
    ref = evaluate(g, {"ids": ids}, {"table": dequantize(arrays["table"], DType.Q4_0, VOCAB * D).reshape(VOCAB, D)})
    for name in ("h", "z", "z2"):
        np.testing.assert_array_equal(got[name], want[name])
        np.testing.assert_array_equal(got2[name], want[name])
        assert np.max(np.abs(got[name] - ref[name])) <= 1e-4 * max(1.0, float(np.max(np.abs(ref[name]))))
    shards = -(-VOCAB // chunk_rows)
    uploads = [op for op in exe._bindings[((4,),)].program if isinstance(op, Upload)]
    assert len(uploads) == 3 * shards if shards > 1 else len(uploads) >= 1
    assert exe.memory().staging_bytes <= -(-chunk_rows * ROW // 16) * 16
    assert exe.memory().weight_bytes == 0


def dense_graph(k: int = 48, n: int = 64, m: int = 96) -> tuple:
    """x @ w ([K, N], read plain or in row chunks) → RMSNorm with g (a 1-D weight read whole) → @ w2ᵀ ([M, N],
    packed, larger than w): three weights of three sizes and two ways of reading them."""
    rng = np.random.default_rng(4)
    arrays = {"w": rng.uniform(-1, 1, (k, n)).astype(np.float32), "g": rng.uniform(0.5, 1.5, n).astype(np.float32),
              "w2": rng.uniform(-1, 1, (m, n)).astype(np.float32)}
    tensors = [Tensor("x", DType.F32, (3, k)), Tensor("h", DType.F32, (3, n)), Tensor("r", DType.F32, (3, n)),
               Tensor("y", DType.F32, (3, m)),
               *(Tensor(w, DType.F32, a.shape, is_weight=True) for w, a in arrays.items())]
    nodes = [Node("mm", "MatMul", ("x", "w"), ("h",)), Node("norm", "RMSNorm", ("h", "g"), ("r",)),
             Node("head", "MatMul", ("r", "w2"), ("y",), {"transpose_b": True})]
    return make_graph("dense", nodes, tensors, ["x"], ["h", "r", "y"]), arrays


@pytest.mark.parametrize("chunk_bytes", [0, 10 * 64 * 4])
def test_streamed_weights_read_whole_are_staged_not_resident(chunk_bytes: int) -> None:
    """A streamed f32 [K, N] MatMul weight and a streamed norm weight, which the kernels read through ctx.region, go
    through staging like packed reads: no device bytes count as resident weights, and the results are the resident
    run's (before, ctx.region uploaded them once and kept them, outside the budget)."""
    g, arrays = dense_graph()
    dev = open_device(True)
    x = np.random.default_rng(5).uniform(-1, 1, (3, 48)).astype(np.float32)
    resident = WebGpuExecutable(g, node_infos(g), ArrayWeights(arrays), dev, lowerings=LOWERINGS, kv_state=False)
    want = resident.run({"x": x})
    exe = WebGpuExecutable(g, node_infos(g), ArrayWeights(arrays), dev, lowerings=LOWERINGS, kv_state=False,
                           streamed=tuple(arrays), chunk_bytes=chunk_bytes)
    for _ in range(2):  # the second run refills every staging buffer from the store again
        got = exe.run({"x": x})
        for name in g.outputs:  # in chunks, the [K, N] product sums its K parts one after another
            tol = 1e-5 if chunk_bytes else 0.0
            np.testing.assert_allclose(got[name], want[name], rtol=tol, atol=tol)
    assert exe.memory().weight_bytes == 0
    refs = [op.ref for op in exe._bindings[((3, 48),)].program if isinstance(op, Upload)]
    assert {"w", "g", "w2"} <= set(refs)


def test_staging_bytes_count_every_live_staging_buffer() -> None:
    """Two streamed weights of different sizes, the smaller first, in the same staging slot (each the only weight
    of its node): the slot is sized once for the larger, so the buffers the program binds are exactly the ones
    memory() counts (before, the slot grew and the outgrown buffer stayed bound and uncounted)."""
    rng = np.random.default_rng(6)
    arrays = {"w1": rng.uniform(-1, 1, (64, 64)).astype(np.float32),
              "w2": rng.uniform(-1, 1, (96, 64)).astype(np.float32)}
    tensors = [Tensor("x", DType.F32, (3, 64)), Tensor("h", DType.F32, (3, 64)), Tensor("y", DType.F32, (3, 96)),
               *(Tensor(w, DType.F32, a.shape, is_weight=True) for w, a in arrays.items())]
    nodes = [Node("mm1", "MatMul", ("x", "w1"), ("h",), {"transpose_b": True}),
             Node("mm2", "MatMul", ("h", "w2"), ("y",), {"transpose_b": True})]
    g = make_graph("two", nodes, tensors, ["x"], ["y"])
    exe = WebGpuExecutable(g, node_infos(g), ArrayWeights(arrays), open_device(True), lowerings=LOWERINGS,
                           kv_state=False, streamed=tuple(arrays))
    x = rng.uniform(-1, 1, (3, 64)).astype(np.float32)
    np.testing.assert_allclose(exe.run({"x": x})["y"], (x @ arrays["w1"].T) @ arrays["w2"].T, rtol=1e-4, atol=1e-4)
    live = {id(op.region.buffer): op.region.buffer.size for b in exe._bindings.values() for op in b.program
            if isinstance(op, Upload)}
    assert len(live) >= 1
    assert exe.memory().staging_bytes == sum(live.values())


def test_rope_frequency_factors_of_a_streamed_weight_are_folded_in_once() -> None:
    """RoPE's frequency-factor weight is streamed: its host value is folded into the frequencies once per
    executable (not read back from a device buffer per binding), nothing stays resident, and two bindings (3 and 5
    tokens) give the resident run's values."""
    ff = np.random.default_rng(7).uniform(1.0, 4.0, 8).astype(np.float32)
    tensors = [Tensor("x", DType.F32, ("seq", 2, 16)), Tensor("pos", DType.I64, ("seq",)),
               Tensor("ff", DType.F32, (8,), is_weight=True), Tensor("y", DType.F32, ("seq", 2, 16))]
    g = make_graph("rope", [Node("rope", "RoPE", ("x", "pos", "ff"), ("y",))], tensors, ["x", "pos"], ["y"])
    dev = open_device(True)
    resident = WebGpuExecutable(g, node_infos(g), ArrayWeights({"ff": ff}), dev, lowerings=LOWERINGS,
                                kv_state=False)
    exe = WebGpuExecutable(g, node_infos(g), ArrayWeights({"ff": ff}), dev, lowerings=LOWERINGS, kv_state=False,
                           streamed=("ff",))
    rng = np.random.default_rng(8)
    for t in (3, 5):
        feeds = {"x": rng.uniform(-1, 1, (t, 2, 16)).astype(np.float32), "pos": np.arange(40, 40 + t)}
        np.testing.assert_array_equal(exe.run(feeds)["y"], resident.run(feeds)["y"])
        ref = evaluate(g, feeds, {"ff": ff})["y"]
        np.testing.assert_allclose(exe.run(feeds)["y"], ref, rtol=1e-4, atol=1e-4)
    assert exe.memory().weight_bytes == 4 * 2 * 8  # the frequencies alone (two f32 parts each), not the factors
    assert not [op for b in exe._bindings.values() for op in b.program if isinstance(op, Upload)]


def test_streamed_banks_stored_one_tensor_per_expert_upload_each_shards_experts() -> None:
    """An expert bank stored as one tensor per expert (``experts.*`` references, as HF checkpoints have), streamed
    in shards of fewer experts than the bank holds: each shard gathers exactly its experts from the store."""
    from dataclasses import replace

    from uaii.backends.testing import cases
    from uaii.ir import WeightRef

    case = next(c for c in cases(["MoEExpertsSwiGLU"]) if c.id == "MoEExpertsSwiGLU/q4_0_4")
    arrays, tensors = {}, []
    for t in case.graph.tensors:
        if t.is_weight:
            ref = WeightRef("model.safetensors", f"experts.*.{t.name}.weight")
            per = np.ascontiguousarray(case.weights[t.name]).reshape(-1).view(np.uint8).reshape(t.shape[0], -1)
            arrays.update({str(ref.with_expert(e)): per[e] for e in range(t.shape[0])})
            t = replace(t, weight=ref)
        tensors.append(t)
    g = replace(case.graph, tensors=tuple(tensors))
    dev = open_device(True)
    resident = WebGpuExecutable(g, node_infos(g), ArrayWeights(arrays), dev, lowerings=LOWERINGS, kv_state=False)
    want = resident.run(case.feeds)
    one_expert = DType.Q4_0.nbytes(32 * 64)
    banks = [t.name for t in tensors if t.is_weight]
    exe = WebGpuExecutable(g, node_infos(g), ArrayWeights(arrays), dev, lowerings=LOWERINGS, kv_state=False,
                           streamed=[str(t.weight) for t in tensors if t.is_weight], chunk_bytes=one_expert)
    got = exe.run(case.feeds)
    staged = {w.name: len(w.shards) for w in exe._packed.values() if w.streamed}
    assert staged == dict.fromkeys(banks, 4)  # one expert per shard
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])

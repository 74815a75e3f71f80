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
from uaii.backends.webgpu.measure import weight_bytes
from uaii.backends.webgpu.ops import LOWERINGS
from uaii.backends.webgpu.program import Upload

STATUS = WebGpuBackend(allow_software=True).probe()
pytestmark = pytest.mark.skipif(not STATUS.available, reason=f"no WebGPU adapter: {STATUS.reason}")

D, VOCAB = 128, 300
ROW = DType.Q4_0.nbytes(D)  # 72 bytes


def tied_graph() -> tuple:
    """An embedding lookup and an lm_head over one tied q4_0 table, then a second lm_head pass: the table is read
    by three nodes, in chunks, and must be uploaded again wherever its staging buffer holds another chunk."""
    table = weight_bytes(DType.Q4_0, VOCAB, D, seed=3)
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

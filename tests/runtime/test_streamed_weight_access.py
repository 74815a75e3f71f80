"""The CPU backend streams a weight the way its op's schema says the op reads it (uaii.ir.ops.WeightAccess), through
a real StreamingStore: tables by rows (``ref@rows=i:i+1``, not the expert syntax ``#e=N``, so a raw-file table
works too), Gather tables included, and MatMulRelu weights in row chunks. Every streamed result equals the mapped
one bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from uaii.backends import ArrayWeights, get_backend
from uaii.ir import DType, Graph, Node, Tensor, WeightRef, make_graph
from uaii.kernels.testing import random_weight

storage = pytest.importorskip("uaii.storage")
CPU = get_backend("cpu")
V, D = 64, 64
# name → dtype of the [V, D] tensor; each is a raw file (a reference with no '#tensor' part, as .uaii.json writes)
WEIGHTS = {"emb": DType.F32, "emb16": DType.F16, "embq": DType.Q8_0, "tab": DType.F32, "wq": DType.Q8_0}


def _graph() -> Graph:
    ids, gids, x = Tensor("ids", DType.I64, ("seq",)), Tensor("gids", DType.I64, ("seq",)), Tensor(
        "x", DType.F32, ("seq", D))
    weights = [Tensor(n, dt, (V, D), weight=WeightRef(f"{n}.bin")) for n, dt in WEIGHTS.items()]
    outs = [Tensor("e", DType.F32, ("seq", D)), Tensor("e16", DType.F16, ("seq", D)),
            Tensor("eq", DType.F32, ("seq", D)), Tensor("g", DType.F32, ("seq", D)), Tensor("r", DType.F32, ("seq", V))]
    nodes = [Node("lookup/f32", "Embedding", ("ids", "emb"), ("e",)),
             Node("lookup/f16", "Embedding", ("ids", "emb16"), ("e16",)),
             Node("lookup/q8_0", "Embedding", ("ids", "embq"), ("eq",)),
             Node("gather", "Gather", ("tab", "gids"), ("g",), {"axis": 0}),
             Node("head", "MatMulRelu", ("x", "wq"), ("r",), {"transpose_b": True})]
    return make_graph("rows", nodes, [ids, gids, x, *weights, *outs], ["ids", "gids", "x"], [o.name for o in outs])


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, np.ndarray]:
    raws = {n: random_weight(dt, V, D, seed=i) for i, (n, dt) in enumerate(WEIGHTS.items())}
    for n, raw in raws.items():
        (tmp_path / f"{n}.bin").write_bytes(raw.tobytes())
    return raws


def test_streamed_tables_rows_and_row_chunks_equal_the_mapped_run(files: dict[str, np.ndarray],
                                                                   tmp_path: Path) -> None:
    g = _graph()
    rng = np.random.default_rng(7)
    feeds = {"ids": np.array([3, 0, 63, 3, 17], np.int64), "gids": np.array([-1, 5, -64, 0, 9], np.int64),
             "x": rng.standard_normal((5, D)).astype(np.float32)}
    mapped = CPU.compile(g, None, ArrayWeights({f"{n}.bin": raw for n, raw in files.items()}), max_tokens=8,
                         kv_state=False)
    want = {k: np.array(v) for k, v in mapped.run(feeds).items()}
    index = {f"{n}.bin": storage.WeightLocation(str(tmp_path / f"{n}.bin"), 0, raw.size, WEIGHTS[n], (V, D))
             for n, raw in files.items()}
    refs = set(index)
    with storage.StreamingStore(index, 1 << 20) as store:
        exe = CPU.compile(g, None, store, max_tokens=8, kv_state=False, streamed=refs, chunk_bytes=4096 + 16 * 68)
        try:
            for _ in range(2):  # the second run reuses the bound steps
                got = exe.run(feeds)
                for k, v in want.items():
                    np.testing.assert_array_equal(np.array(got[k]), v, err_msg=k)
            sw = exe.streaming
            assert sw is not None
            # tables are read by rows, never staged; the MatMulRelu weight is staged in chunks of 16 rows
            assert not {"emb.bin", "emb16.bin", "embq.bin", "tab.bin"} & set(sw.order)
            chunks = sw.chunks(next(i for i in exe.infos if i.node.name == "head"))
            assert chunks is not None and len(chunks) == V // 16
            assert [c[0] for c in chunks] == [f"wq.bin@rows={a}:{a + 16}" for a in range(0, V, 16)]
        finally:
            exe.close()
    assert want["r"].min() == 0.0  # the relu ran (and the chunks computed their slices before it)
    np.testing.assert_array_equal(want["g"], files["tab"].view(np.float32).reshape(V, D)[feeds["gids"]])


def test_a_streamed_lookup_outside_the_table_names_node_index_and_table(files: dict[str, np.ndarray],
                                                                         tmp_path: Path) -> None:
    index = {f"{n}.bin": storage.WeightLocation(str(tmp_path / f"{n}.bin"), 0, raw.size, WEIGHTS[n], (V, D))
             for n, raw in files.items()}
    with storage.StreamingStore(index, 1 << 20) as store:
        exe = CPU.compile(_graph(), None, store, max_tokens=8, kv_state=False, streamed=set(index))
        try:
            feeds = {"ids": np.array([-1], np.int64), "gids": np.array([0], np.int64),
                     "x": np.zeros((1, D), np.float32)}
            with pytest.raises(Exception, match=r"node 'lookup/f32': index -1 is outside the table 'emb' \(64 rows"):
                exe.run(feeds)  # an Embedding's token ids never count from the end (a Gather's do)
        finally:
            exe.close()


def test_a_streamed_n_d_gather_table_is_read_by_rows_as_the_planner_assumes(tmp_path: Path) -> None:
    """The planner stages nothing for a table read by rows (``WeightAccess.ROWS``), whatever its rank; the row path
    reads a row of a [100, 4, 8] table as its 4 * 8 contiguous values instead of staging it whole, so the staging
    buffers the plan sized are enough."""
    from uaii.planner import execution_order
    from uaii.planner.storage import weight_uses

    table = Tensor("t3", DType.F32, (100, 4, 8), weight=WeightRef("t3.bin"))
    g = make_graph("rows3", [Node("gather3", "Gather", ("t3", "ids"), ("y",), {"axis": 0})],
                   [Tensor("ids", DType.I64, ("seq",)), table, Tensor("y", DType.F32, ("seq", 4, 8))], ["ids"], ["y"])
    (use,) = weight_uses(g, execution_order(g)).values()
    assert max(use.staged.values()) == 0 and use.per_token == 4 * 8 * 4
    raw = np.random.default_rng(3).standard_normal((100, 4, 8)).astype(np.float32)
    (tmp_path / "t3.bin").write_bytes(raw.tobytes())
    index = {"t3.bin": storage.WeightLocation(str(tmp_path / "t3.bin"), 0, raw.nbytes, DType.F32, (100, 4, 8))}
    ids = np.array([99, 0, -1, 42, 7], np.int64)
    with storage.StreamingStore(index, 1 << 20) as store:
        exe = CPU.compile(g, None, store, max_tokens=8, kv_state=False, streamed={"t3.bin"})
        try:
            assert exe.streaming is not None and "t3.bin" not in exe.streaming.order  # never staged
            for _ in range(2):
                np.testing.assert_array_equal(np.array(exe.run({"ids": ids})["y"]), raw[ids])
        finally:
            exe.close()


def _mlx_table(tmp_path: Path, mode: str, scale: DType) -> tuple[Graph, dict[str, np.ndarray], dict[str, object]]:
    """A QuantizedEmbedding over a [V, D] table in MLX's layout (values, scales, affine biases), each a raw file."""
    rng = np.random.default_rng(11)
    bits, gs = (4, 32) if mode == "mxfp4" else (3, 32)
    words = rng.integers(0, 2**32, (V, D * bits // 32), dtype=np.uint32)
    if mode == "mxfp4":
        arrays = {"qw": words, "qs": rng.integers(120, 131, (V, D // gs)).astype(np.uint8)}
    else:
        sc = rng.uniform(-0.3, 0.3, (V, D // gs)).astype(np.float32)
        bi = rng.uniform(-1, 1, (V, D // gs)).astype(np.float32)
        conv = (lambda a: (a.view(np.uint32) >> 16).astype(np.uint16)) if scale is DType.BF16 else (lambda a: a)
        arrays = {"qw": words, "qs": conv(sc), "qb": conv(bi)}
    types = {"qw": DType.U32, "qs": DType.U8 if mode == "mxfp4" else scale, "qb": scale}
    for n, a in arrays.items():
        (tmp_path / f"{n}.bin").write_bytes(a.tobytes())
    weights = [Tensor(n, types[n], a.shape, weight=WeightRef(f"{n}.bin")) for n, a in arrays.items()]
    node = Node("lookup/mlx", "QuantizedEmbedding", ("ids", *arrays), ("y",),
                {"dim": D, "mode": mode, "bits": bits, "group_size": gs})
    values = [Tensor("ids", DType.I64, ("seq",)), *weights, Tensor("y", DType.F32, ("seq", D))]
    g = make_graph("mlx_rows", [node], values, ["ids"], ["y"])
    index = {f"{n}.bin": storage.WeightLocation(str(tmp_path / f"{n}.bin"), 0, a.nbytes, types[n], a.shape)
             for n, a in arrays.items()}
    return g, arrays, index


@pytest.mark.parametrize("mode,scale", [("affine", DType.BF16), ("affine", DType.F32), ("mxfp4", DType.U8)])
def test_a_streamed_mlx_table_is_read_by_rows_from_each_of_its_tensors(tmp_path: Path, mode: str,
                                                                       scale: DType) -> None:
    """An MLX-quantized table (QuantizedEmbedding) is two or three tensors, all read by rows: each streamed one row
    by row (never staged), a pinned one (here the scales, some runs) as a view; the rows equal the mapped run's."""
    g, arrays, index = _mlx_table(tmp_path, mode, scale)
    ids = {"ids": np.array([3, 0, 63, 3, 17, 5, 9, 22, 40, 1, 8, 63, 30, 12, 7, 2, 44, 61], np.int64)}
    mapped = CPU.compile(g, None, ArrayWeights({f"{n}.bin": a for n, a in arrays.items()}), max_tokens=32,
                         kv_state=False)
    want = np.array(mapped.run(ids)["y"])
    assert np.isfinite(want).all() and np.abs(want).max() > 0
    for streamed in (set(index), set(index) - {"qs.bin"}):
        with storage.StreamingStore(index, 1 << 20) as store:
            exe = CPU.compile(g, None, store, max_tokens=32, kv_state=False, streamed=streamed)
            try:
                assert exe.streaming is not None and not set(exe.streaming.order)  # nothing staged
                for _ in range(2):
                    np.testing.assert_array_equal(np.array(exe.run(ids)["y"]), want)
                with pytest.raises(Exception, match=r"index 64 is outside the table 'qw' \(64 rows\)"):
                    exe.run({"ids": np.array([1, 64], np.int64)})
            finally:
                exe.close()

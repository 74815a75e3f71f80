"""WebGPU dequantization and matrix products: the in-shader decoders are bit-exact with the CPU's dequantize for
every weight type, the GEMV/GEMM kernels match numpy on the dequantized weights, weights larger than a storage
binding run in row shards, and the bandwidth probes of measure.py run. On lavapipe (a software adapter) in CI."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from uaii.backends import ArrayWeights, BackendError
from uaii.ir import DType, Graph, Node, Tensor, make_graph
from uaii.ir.reference import evaluate
from uaii.kernels import dequantize

wgpu = pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")

from uaii.backends.analysis import node_infos  # noqa: E402
from uaii.backends.webgpu import WebGpuBackend  # noqa: E402
from uaii.backends.webgpu.device import SUBGROUPS_ENV, GpuDevice, choose, open_device  # noqa: E402
from uaii.backends.webgpu.executable import WebGpuExecutable  # noqa: E402
from uaii.backends.webgpu.measure import copy_bandwidth, gemv_bandwidth  # noqa: E402
from uaii.backends.webgpu.ops import LOWERINGS  # noqa: E402
from uaii.backends.webgpu.ops.dequant import SUPPORTED, WG, dequant_source  # noqa: E402
from uaii.backends.webgpu.program import pack_params  # noqa: E402
from uaii.kernels import random_weight  # noqa: E402

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
GPU = WebGpuBackend(allow_software=True)
STATUS = GPU.probe()
pytestmark = pytest.mark.skipif(not STATUS.available, reason=f"no WebGPU adapter: {STATUS.reason}")

TYPES = sorted(SUPPORTED, key=lambda d: d.value)
F16_FIELDS = {DType.Q4_0: (0,), DType.Q4_1: (0, 2), DType.Q5_0: (0,), DType.Q5_1: (0, 2), DType.Q8_0: (0,),
              DType.Q4_K: (0, 2), DType.Q5_K: (0, 2), DType.Q6_K: (208,), DType.Q2_K: (80, 82), DType.Q3_K: (108,)}


def random_encoded(dtype: DType, n: int, seed: int = 0) -> np.ndarray:
    """Random packed bytes of ``n`` values: every bit pattern, but f16 scales and f16/bf16 values finite (f16
    subnormals included, to catch a decoder that flushes them)."""
    rng = np.random.default_rng(seed)
    if dtype is DType.F32:
        return rng.normal(size=n).astype(np.float32).view(np.uint8)
    if dtype in (DType.F16, DType.BF16):
        bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        top = np.uint16(0x7C00 if dtype is DType.F16 else 0x7F80)
        bits[(bits & top) == top] &= np.uint16(0xBFFF)
        return bits.view(np.uint8)
    raw = rng.integers(0, 256, size=(n // dtype.block_size, dtype.type_size), dtype=np.uint8)
    for off in F16_FIELDS[dtype]:
        raw[:, off + 1] &= 0xBF  # exponent < 16: finite, subnormals kept
    return raw.reshape(-1)


def _run(dev: GpuDevice, src: str, buffers: list[Any], params: list[int], groups: int) -> None:
    ubuf = dev.buffer(16, storage=False, uniform=True)
    dev.queue.write_buffer(ubuf, 0, pack_params(params))
    pipe = dev.pipeline(src)
    entries = [{"binding": 0, "resource": {"buffer": ubuf, "offset": 0, "size": 16}}] + [
        {"binding": i + 1, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(buffers)]
    enc = dev.device.create_command_encoder()
    cpass = enc.begin_compute_pass()
    cpass.set_pipeline(pipe)
    cpass.set_bind_group(0, dev.device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=entries))
    cpass.dispatch_workgroups(groups, 1, 1)
    cpass.end()
    dev.queue.submit([enc.finish()])


@pytest.mark.parametrize("dtype", TYPES, ids=lambda d: d.value)
def test_the_shader_dequantizes_bit_exactly_like_the_cpu(dtype: DType) -> None:
    dev = open_device(True)
    n = 256 * 6
    raw = random_encoded(dtype, n, seed=len(dtype.value))
    w, y = dev.buffer(raw.size), dev.buffer(4 * n)
    dev.queue.write_buffer(w, 0, np.concatenate([raw, np.zeros(-raw.size % 4, np.uint8)]))
    _run(dev, dequant_source(dtype), [w, y], [n // 32, 0, 0, 0], -(-n // 32 // WG))
    got = np.frombuffer(dev.queue.read_buffer(y), np.float32)[:n]
    want = dequantize(raw, dtype, n)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, f"{dtype.value}: {bad.size} values differ, first at {bad[0]}: {got[bad[0]]} vs {want[bad[0]]}"


def _weight_array(dtype: DType, raw: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """What a weight store hands over: packed bytes for block types, typed elements for plain types."""
    if dtype.is_quantized:
        return raw
    view = {DType.F32: np.float32, DType.F16: np.float16, DType.BF16: np.uint16}[dtype]
    return raw.view(view).reshape(shape)


def _matmul_graph(m: int, n: int, k: int, dtype: DType) -> Graph:
    tensors = [Tensor("a", DType.F32, (m, k)), Tensor("w", dtype, (n, k), is_weight=True),
               Tensor("y", DType.F32, (m, n))]
    return make_graph("gemv", [Node("mm", "MatMul", ("a", "w"), ("y",), {"transpose_b": True})], tensors, ["a"],
                      ["y"])


@pytest.mark.parametrize("m", [1, 5], ids=["gemv_m1", "gemm_m5"])
@pytest.mark.parametrize("dtype", TYPES, ids=lambda d: d.value)
def test_every_weight_type_matches_numpy_on_the_dequantized_weight(dtype: DType, m: int) -> None:
    n, k = 40, 256
    raw = random_weight(dtype, n, k, seed=m)
    a = np.random.default_rng(m).uniform(-1, 1, size=(m, k)).astype(np.float32)
    exe = GPU.compile(_matmul_graph(m, n, k, dtype), None, ArrayWeights({"w": _weight_array(dtype, raw, (n, k))}),
                      kv_state=False)
    got = exe.run({"a": a})["y"]
    want = a.astype(np.float64) @ dequantize(raw, dtype, n * k).reshape(n, k).astype(np.float64).T
    assert np.max(np.abs(got - want)) <= 1e-5 * max(1.0, float(np.max(np.abs(want))))


def test_prefill_rows_beyond_one_tile() -> None:
    """M = 11 spans two 8-row tiles; K = 1024 gives every thread of a row several units."""
    n, k, m = 24, 1024, 11
    raw = random_weight(DType.Q4_K, n, k, seed=3)
    a = np.random.default_rng(4).normal(size=(m, k)).astype(np.float32)
    exe = GPU.compile(_matmul_graph(m, n, k, DType.Q4_K), None, ArrayWeights({"w": raw}), kv_state=False)
    want = a.astype(np.float64) @ dequantize(raw, DType.Q4_K, n * k).reshape(n, k).astype(np.float64).T
    assert np.max(np.abs(exe.run({"a": a})["y"] - want)) <= 1e-5 * float(np.max(np.abs(want)))


def test_tiled_kernel_broadcasts_batches_and_takes_any_k() -> None:
    """Activation @ activation with two broadcast batch dims, K = 20 (not a tile multiple)."""
    tensors = [Tensor("a", DType.F32, (2, 1, 3, 20)), Tensor("b", DType.F32, (3, 20, 7)),
               Tensor("y", DType.F32, (2, 3, 3, 7))]
    g = make_graph("bmm", [Node("mm", "MatMul", ("a", "b"), ("y",))], tensors, ["a", "b"], ["y"])
    rng = np.random.default_rng(5)
    feeds = {"a": rng.normal(size=(2, 1, 3, 20)).astype(np.float32),
             "b": rng.normal(size=(3, 20, 7)).astype(np.float32)}
    got = GPU.compile(g, None, ArrayWeights({}), kv_state=False).run(feeds)["y"]
    assert np.allclose(got, np.matmul(feeds["a"], feeds["b"]), rtol=1e-5, atol=1e-5)


def test_a_plain_weight_whose_rows_are_not_whole_units_takes_the_tiled_kernel() -> None:
    n, k = 10, 40
    w = np.random.default_rng(6).normal(size=(n, k)).astype(np.float16)
    a = np.random.default_rng(7).normal(size=(3, k)).astype(np.float32)
    exe = GPU.compile(_matmul_graph(3, n, k, DType.F16), None, ArrayWeights({"w": w}), kv_state=False)
    assert np.allclose(exe.run({"a": a})["y"], a @ w.astype(np.float32).T, rtol=1e-5, atol=1e-5)


def compile_on(dev: GpuDevice, graph: Graph, weights: dict[str, np.ndarray]) -> WebGpuExecutable:
    return WebGpuExecutable(graph, node_infos(graph), ArrayWeights(weights), dev, lowerings=LOWERINGS, kv_state=False)


def test_a_small_binding_limit_shards_the_lm_head_and_the_embedding_table(small_device: GpuDevice) -> None:
    vocab, d = 640, 256
    table = random_encoded(DType.Q8_0, vocab * d, seed=8)  # 174 KB: 3 shards of 64 KiB
    head = random_encoded(DType.Q6_K, vocab * d, seed=9)  # 134 KB: 3 shards
    tensors = [Tensor("ids", DType.I64, (4,)), Tensor("table", DType.Q8_0, (vocab, d), is_weight=True),
               Tensor("head", DType.Q6_K, (vocab, d), is_weight=True), Tensor("h", DType.F32, (4, d)),
               Tensor("logits", DType.F32, (4, vocab))]
    nodes = [Node("embed", "Embedding", ("ids", "table"), ("h",)),
             Node("lm_head", "MatMul", ("h", "head"), ("logits",), {"transpose_b": True})]
    g = make_graph("sharded", nodes, tensors, ["ids"], ["logits"])
    exe = compile_on(small_device, g, {"table": table, "head": head})
    ids = np.array([5, 300, 639, 250], np.int64)  # one id in every shard
    got = exe.run({"ids": ids})["logits"]
    assert [len(exe._packed[n].shards) for n in ("table", "head")] == [3, 3]
    ref = {"table": dequantize(table, DType.Q8_0, vocab * d).reshape(vocab, d),
           "head": dequantize(head, DType.Q6_K, vocab * d).reshape(vocab, d)}
    want = evaluate(g, {"ids": ids}, ref)["logits"]
    assert np.max(np.abs(got - want)) <= 1e-5 * float(np.max(np.abs(want)))


def test_streamed_weights_grouped_and_sharded(small_device: GpuDevice) -> None:
    """Streamed weights go through staging buffers (one per streamed weight a node reads; a weight's shards take
    turns in it): a grouped product's weights and a sharded lm_head are each uploaded right before the dispatch
    that reads them."""
    d, vocab = 256, 600
    ws = {f"w{i}": random_weight(DType.Q8_0, n, d, seed=i) for i, n in enumerate((64, 32, 32))}
    ws["head"] = random_weight(DType.Q4_0, vocab, d, seed=7)  # 86 KB: 2 shards
    tensors = [Tensor("a", DType.F32, (2, d))]
    tensors += [Tensor(n, DType.Q8_0, (w.size // 272, d), is_weight=True) for n, w in ws.items() if n != "head"]
    tensors += [Tensor("head", DType.Q4_0, (vocab, d), is_weight=True), Tensor("y0", DType.F32, (2, 64)),
                Tensor("y1", DType.F32, (2, 32)), Tensor("y2", DType.F32, (2, 32)), Tensor("z", DType.F32, (2, vocab))]
    nodes = [Node("qkv", "GroupedMatMul", ("a", "w0", "w1", "w2"), ("y0", "y1", "y2"), {"transpose_b": True}),
             Node("lm_head", "MatMul", ("a", "head"), ("z",), {"transpose_b": True})]
    g = make_graph("streamed", nodes, tensors, ["a"], ["y0", "y1", "y2", "z"])
    exe = WebGpuExecutable(g, node_infos(g), ArrayWeights(ws), small_device, lowerings=LOWERINGS, kv_state=False,
                           streamed=tuple(ws))
    a = np.random.default_rng(10).normal(size=(2, d)).astype(np.float32)
    got = exe.run({"a": a})
    ref = {n: dequantize(w, DType.Q4_0 if n == "head" else DType.Q8_0, w.size // (144 if n == "head" else 272) * d)
           .reshape(-1, d) for n, w in ws.items()}
    want = evaluate(g, {"a": a}, ref)
    head = [w for key, w in exe._packed.items() if key.split("\0")[0] == "head"]
    assert len(head) == 1 and len(head[0].shards) == 2
    for name in ("y0", "y1", "y2", "z"):
        assert np.max(np.abs(got[name] - want[name])) <= 1e-5 * float(np.max(np.abs(want[name]))), name


@pytest.mark.parametrize("op", ["MatMulRelu", "Gemm"])
def test_an_f32_kn_weight_beyond_the_binding_limit_is_summed_over_its_shards(small_device: GpuDevice,
                                                                               op: str) -> None:
    """[K, N] f32 weights (ONNX's layout) shard along K: partial products add up in Y; the relu and the bias apply
    once, around the whole sum."""
    k, n = 300, 100  # 120 KB: 2 shards
    rng = np.random.default_rng(11)
    w = rng.normal(size=(k, n)).astype(np.float32)
    tensors = [Tensor("a", DType.F32, (3, k)), Tensor("w", DType.F32, (k, n), is_weight=True),
               Tensor("y", DType.F32, (3, n))]
    ins, attrs, feeds = ["a", "w"], {}, {"a": rng.normal(size=(3, k)).astype(np.float32)}
    if op == "Gemm":
        tensors.append(Tensor("c", DType.F32, (n,)))
        ins.append("c")
        attrs = {"alpha": 0.5, "beta": -2.0}
        feeds["c"] = rng.normal(size=n).astype(np.float32)
    g = make_graph("kn", [Node("mm", op, tuple(ins), ("y",), attrs)], tensors, [i for i in ins if i != "w"], ["y"])
    exe = compile_on(small_device, g, {"w": w})
    got = exe.run(feeds)["y"]
    assert len(exe._packed["w"].shards) == 2
    want = evaluate(g, feeds, {"w": w})["y"]
    assert np.max(np.abs(got - want)) <= 1e-5 * float(np.max(np.abs(want)))


def test_a_weight_read_whole_beyond_the_binding_limit_is_a_clear_error(small_device: GpuDevice) -> None:
    w = np.zeros((300, 100), np.float16)  # [K, N] f16: read whole as f32 by the tiled kernel, 120 KB
    tensors = [Tensor("a", DType.F32, (1, 300)), Tensor("w", DType.F16, (300, 100), is_weight=True),
               Tensor("y", DType.F32, (1, 100))]
    g = make_graph("kn", [Node("mm", "MatMul", ("a", "w"), ("y",))], tensors, ["a"], ["y"])
    with pytest.raises(BackendError, match="storage binding limit"):
        compile_on(small_device, g, {"w": w}).run({"a": np.zeros((1, 300), np.float32)})


def test_the_bandwidth_probes_run() -> None:
    dev = open_device(True)
    assert gemv_bandwidth(dev, "q4_0", 64, 256, reps=2) > 0
    assert copy_bandwidth(dev, 1 << 16, reps=2) > 0
    assert random_weight(DType.Q3_K, 2, 256).size == 2 * 110
    with pytest.raises(BackendError, match="multiple of its block"):
        gemv_bandwidth(dev, "q4_k", 4, 96)


# --- subgroup reductions ------------------------------------------------------------------------------------------
needs_subgroups = pytest.mark.skipif(not STATUS.available or not open_device(True).subgroups,
                                     reason="the adapter has no `subgroup` feature")


def _gemv_both_ways(compile_fn: Any, feeds: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch
                    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The outputs of the graph lowered on subgroups and, with ``UAII_WEBGPU_SUBGROUPS=0``, on the portable
    workgroup-memory tree (the flag is read when a node is lowered)."""
    monkeypatch.delenv(SUBGROUPS_ENV, raising=False)
    with_sg = compile_fn().run(feeds)
    monkeypatch.setenv(SUBGROUPS_ENV, "0")
    portable = compile_fn().run(feeds)
    return with_sg, portable


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    return float(np.max(np.abs(got - want))) <= 1e-5 * max(1.0, float(np.max(np.abs(want))))


@needs_subgroups
@pytest.mark.parametrize(("m", "k"), [(1, 256), (5, 256), (5, 4096)], ids=["m1", "m5", "m5_k4096"])
@pytest.mark.parametrize("dtype", TYPES, ids=lambda d: d.value)
def test_subgroup_and_portable_reductions_agree_with_numpy_and_each_other(
        dtype: DType, m: int, k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """K = 256: a workgroup's 64 rows outnumber its subgroups (several jobs per subgroup, rows past N idle);
    K = 4096: 4 rows per workgroup, each row split over several subgroups whose sums meet in workgroup memory."""
    n = 40
    raw = random_weight(dtype, n, k, seed=m + k)
    a = np.random.default_rng(m).uniform(-1, 1, size=(m, k)).astype(np.float32)
    weights = ArrayWeights({"w": _weight_array(dtype, raw, (n, k))})
    sg, portable = _gemv_both_ways(lambda: GPU.compile(_matmul_graph(m, n, k, dtype), None, weights, kv_state=False),
                                   {"a": a}, monkeypatch)
    want = a.astype(np.float64) @ dequantize(raw, dtype, n * k).reshape(n, k).astype(np.float64).T
    assert _close(sg["y"], want) and _close(portable["y"], want)
    assert _close(sg["y"], portable["y"])


@needs_subgroups
def test_subgroup_gemv_on_sharded_and_streamed_weights(small_device: GpuDevice,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A Q6_K lm_head in 3 row shards and a streamed Q4_0 weight in 2, M = 3 (a tile of 4 rows, one unused), with a
    Gemm bias: each shard's dispatch writes its own columns on either path."""
    vocab, d, m = 640, 256, 3
    head, up = random_encoded(DType.Q6_K, vocab * d, seed=12), random_weight(DType.Q4_0, 600, d, seed=13)
    bias = np.random.default_rng(14).normal(size=vocab).astype(np.float32)
    tensors = [Tensor("a", DType.F32, (m, d)), Tensor("head", DType.Q6_K, (vocab, d), is_weight=True),
               Tensor("up", DType.Q4_0, (600, d), is_weight=True), Tensor("c", DType.F32, (vocab,)),
               Tensor("y", DType.F32, (m, vocab)), Tensor("z", DType.F32, (m, 600))]
    nodes = [Node("lm_head", "Gemm", ("a", "head", "c"), ("y",), {"transB": 1, "alpha": 0.5, "beta": 2.0}),
             Node("up", "MatMulRelu", ("a", "up"), ("z",), {"transpose_b": True})]
    g = make_graph("sharded_sg", nodes, tensors, ["a", "c"], ["y", "z"])
    ws = {"head": head, "up": up}
    feeds = {"a": np.random.default_rng(15).normal(size=(m, d)).astype(np.float32), "c": bias}

    exes: list[WebGpuExecutable] = []

    def compile_fn() -> WebGpuExecutable:
        exes.append(WebGpuExecutable(g, node_infos(g), ArrayWeights(ws), small_device, lowerings=LOWERINGS,
                                     kv_state=False, streamed=("up",)))
        return exes[-1]

    sg, portable = _gemv_both_ways(compile_fn, feeds, monkeypatch)
    for exe in exes:
        assert [len(w.shards) for key, w in exe._packed.items() if key.split("\0")[0] in ws] == [3, 2]
    ref = {"head": dequantize(head, DType.Q6_K, vocab * d).reshape(vocab, d),
           "up": dequantize(up, DType.Q4_0, 600 * d).reshape(600, d)}
    want = evaluate(g, feeds, ref)
    for name in ("y", "z"):
        assert _close(sg[name], want[name]) and _close(portable[name], want[name]), name
        assert _close(sg[name], portable[name]), name


@needs_subgroups
def test_the_subgroup_kernel_is_what_compiles_when_the_feature_is_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh device (empty pipeline cache): with the feature the GEMV pipelines are the subgroup source, with
    ``UAII_WEBGPU_SUBGROUPS=0`` the portable one — so neither path can silently stay unused."""
    info, adapter = choose(True)
    n, k = 8, 256
    w = random_weight(DType.Q8_0, n, k, seed=16)
    a = np.ones((1, k), np.float32)

    def gemv_sources(flag: str | None) -> list[str]:
        if flag is None:
            monkeypatch.delenv(SUBGROUPS_ENV, raising=False)
        else:
            monkeypatch.setenv(SUBGROUPS_ENV, flag)
        dev = GpuDevice(info, adapter)
        compile_on(dev, _matmul_graph(1, n, k, DType.Q8_0), {"w": w}).run({"a": a})
        return [key for key in dev._pipelines if "// gemv" in key]

    on, off = gemv_sources(None), gemv_sources("0")
    assert len(on) == 1 and "subgroupAdd" in on[0] and on[0].split("\0", 1)[1].split("\n")[0].endswith(" subgroups")
    assert len(off) == 1 and "subgroup" not in off[0]


@needs_subgroups
def test_moe_expert_passes_agree_on_both_reductions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The expert GEMVs share the row core: gate/up (K = 256) and down (K = 64, one thread per row on the portable
    path, so each subgroup takes several rows in turn — where a loop-body `var` that naga does not reset would
    carry one row's sum into the next)."""
    t, e, k, ff, d = 3, 4, 2, 64, 256
    types = {"gate": DType.Q4_K, "up": DType.Q8_0, "down": DType.F16}
    shapes = {"gate": (e, ff, d), "up": (e, ff, d), "down": (e, d, ff)}
    raws = {n: random_weight(dt, shapes[n][0] * shapes[n][1], shapes[n][2], seed=i)
            for i, (n, dt) in enumerate(types.items())}
    packed = {n: r if types[n].is_quantized else r.view(np.float16).reshape(shapes[n]) for n, r in raws.items()}
    ref = {n: dequantize(r, types[n], int(np.prod(shapes[n]))).reshape(shapes[n]) for n, r in raws.items()}
    tensors = [Tensor("x", DType.F32, (t, d)), Tensor("w", DType.F32, (t, k)), Tensor("i", DType.I64, (t, k)),
               *(Tensor(n, types[n], shapes[n], is_weight=True) for n in types), Tensor("y", DType.F32, (t, d))]
    g = make_graph("moe", [Node("experts", "MoEExperts", ("x", "w", "i", "gate", "up", "down"), ("y",),
                                {"n_experts": e, "top_k": k, "activation": "silu"})], tensors, ["x", "w", "i"], ["y"])
    rng = np.random.default_rng(17)
    feeds = {"x": rng.normal(size=(t, d)).astype(np.float32), "w": rng.uniform(0.1, 1, (t, k)).astype(np.float32),
             "i": np.stack([rng.permutation(e)[:k] for _ in range(t)]).astype(np.int64)}
    sg, portable = _gemv_both_ways(lambda: GPU.compile(g, None, ArrayWeights(packed), kv_state=False), feeds,
                                   monkeypatch)
    want = evaluate(g, feeds, ref)["y"]
    assert _close(sg["y"], want) and _close(portable["y"], want) and _close(sg["y"], portable["y"])

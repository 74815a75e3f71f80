"""WebGPU mixture of experts: the router's top-k (ties to the lower index) and weights, the expert FFN over packed
banks of mixed types, a router feeding the experts in one graph, and banks larger than a storage binding split by
experts. Against the reference evaluator, on lavapipe (a software adapter) in CI."""

from __future__ import annotations

import os

import numpy as np
import pytest

from uaii.backends import ArrayWeights
from uaii.ir import DType, Graph, Node, Tensor, make_graph
from uaii.ir.reference import evaluate
from uaii.kernels import dequantize

wgpu = pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")

from uaii.backends.analysis import node_infos  # noqa: E402
from uaii.backends.webgpu import WebGpuBackend  # noqa: E402
from uaii.backends.webgpu.device import MAX_BINDING_ENV, GpuDevice, choose  # noqa: E402
from uaii.backends.webgpu.executable import WebGpuExecutable  # noqa: E402
from uaii.backends.webgpu.ops import LOWERINGS  # noqa: E402
from uaii.kernels import random_weight  # noqa: E402

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
GPU = WebGpuBackend(allow_software=True)
STATUS = GPU.probe()
pytestmark = pytest.mark.skipif(not STATUS.available, reason=f"no WebGPU adapter: {STATUS.reason}")


def _err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-6))


@pytest.mark.parametrize(("scoring", "normalize"), [("softmax", True), ("sigmoid", False)])
def test_the_router_picks_the_top_k_with_ties_to_the_lower_index(scoring: str, normalize: bool) -> None:
    t, e, k = 5, 16, 4
    logits = np.random.default_rng(0).normal(size=(t, e)).astype(np.float32)
    logits[1, [3, 9, 12]] = 5.0  # a three-way tie for the first place
    logits[2] = 0.25  # all tied
    tensors = [Tensor("logits", DType.F32, (t, e)), Tensor("w", DType.F32, (t, k)), Tensor("i", DType.I64, (t, k))]
    g = make_graph("router", [Node("r", "MoERouter", ("logits",), ("w", "i"),
                                   {"n_experts": e, "top_k": k, "normalize": normalize, "scoring": scoring})],
                   tensors, ["logits"], ["w", "i"])
    got = GPU.compile(g, None, ArrayWeights({}), kv_state=False).run({"logits": logits})
    want = evaluate(g, {"logits": logits}, {})
    assert np.array_equal(got["i"], want["i"])
    assert _err(got["w"], want["w"]) < 1e-6


def _banks(types: tuple[DType, DType, DType], e: int, ff: int, d: int) -> tuple[dict[str, np.ndarray],
                                                                               dict[str, np.ndarray]]:
    """Packed banks (what the store holds) and their dequantized values (what the reference takes)."""
    packed, ref = {}, {}
    for (name, shape), dt in zip((("gate", (e, ff, d)), ("up", (e, ff, d)), ("down", (e, d, ff))), types, strict=True):
        raw = random_weight(dt, e * shape[1], shape[2], seed=len(name))
        packed[name] = raw if dt.is_quantized else raw.view(dt.numpy).reshape(shape)
        ref[name] = dequantize(raw, dt, e * shape[1] * shape[2]).reshape(shape)
    return packed, ref


def _experts_graph(t: int, e: int, k: int, ff: int, d: int, types: tuple[DType, DType, DType], act: str,
                   router: bool = False) -> Graph:
    tensors = [Tensor("x", DType.F32, (t, d)), Tensor("w", DType.F32, (t, k)), Tensor("i", DType.I64, (t, k)),
               Tensor("gate", types[0], (e, ff, d), is_weight=True), Tensor("up", types[1], (e, ff, d), is_weight=True),
               Tensor("down", types[2], (e, d, ff), is_weight=True), Tensor("y", DType.F32, (t, d))]
    nodes = [Node("experts", "MoEExperts", ("x", "w", "i", "gate", "up", "down"), ("y",),
                  {"n_experts": e, "top_k": k, "activation": act})]
    inputs = ["x", "w", "i"]
    if router:
        tensors.append(Tensor("logits", DType.F32, (t, e)))
        nodes.insert(0, Node("route", "MoERouter", ("logits",), ("w", "i"), {"n_experts": e, "top_k": k}))
        inputs = ["x", "logits"]
    return make_graph("moe", nodes, tensors, inputs, ["y"])


def _feeds(t: int, e: int, k: int, d: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    idx = np.stack([rng.permutation(e)[:k] for _ in range(t)]).astype(np.int64)
    return {"x": rng.normal(size=(t, d)).astype(np.float32), "w": rng.uniform(0.1, 1, size=(t, k)).astype(np.float32),
            "i": idx}


def test_experts_over_banks_of_three_types() -> None:
    t, e, k, ff, d = 3, 4, 2, 64, 256
    types = (DType.Q4_K, DType.Q6_K, DType.Q8_0)
    packed, ref = _banks(types, e, ff, d)
    g = _experts_graph(t, e, k, ff, d, types, "gelu")
    feeds = _feeds(t, e, k, d)
    got = GPU.compile(g, None, ArrayWeights(packed), kv_state=False).run(feeds)["y"]
    assert _err(got, evaluate(g, feeds, ref)["y"]) < 1e-5


def test_a_router_feeding_the_experts_with_f16_banks() -> None:
    t, e, k, ff, d = 4, 8, 2, 32, 64
    types = (DType.F16, DType.F16, DType.BF16)
    packed, ref = _banks(types, e, ff, d)
    g = _experts_graph(t, e, k, ff, d, types, "silu", router=True)
    rng = np.random.default_rng(4)
    feeds = {"x": rng.normal(size=(t, d)).astype(np.float32), "logits": rng.normal(size=(t, e)).astype(np.float32)}
    got = GPU.compile(g, None, ArrayWeights(packed), kv_state=False).run(feeds)["y"]
    assert _err(got, evaluate(g, feeds, ref)["y"]) < 1e-5


def test_banks_larger_than_a_binding_are_split_by_experts() -> None:
    info, adapter = choose(True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MAX_BINDING_ENV, str(64 * 1024))
        dev = GpuDevice(info, adapter)
    t, e, k, ff, d = 5, 8, 3, 64, 256  # q8_0 experts of 17 KB: 3 per 64 KiB shard
    types = (DType.Q8_0, DType.Q4_0, DType.Q8_0)
    packed, ref = _banks(types, e, ff, d)
    g = _experts_graph(t, e, k, ff, d, types, "silu")
    exe = WebGpuExecutable(g, node_infos(g), ArrayWeights(packed), dev, lowerings=LOWERINGS, kv_state=False)
    feeds = _feeds(t, e, k, d)
    got = exe.run(feeds)["y"]
    assert [len(exe._packed[n].shards) for n in ("gate", "up", "down")] == [3, 2, 3]
    assert _err(got, evaluate(g, feeds, ref)["y"]) < 1e-5


def test_streamed_banks_each_reach_the_device_before_their_pass() -> None:
    """Streamed weights share staging buffers: each bank must be uploaded right before its own pass, not all three
    before the first (the last upload would overwrite the others)."""
    t, e, k, ff, d = 2, 4, 2, 32, 64
    types = (DType.Q8_0, DType.Q4_0, DType.F16)
    packed, ref = _banks(types, e, ff, d)
    g = _experts_graph(t, e, k, ff, d, types, "silu")
    exe = GPU.compile(g, None, ArrayWeights(packed), kv_state=False, streamed=("gate", "up", "down"))
    feeds = _feeds(t, e, k, d)
    assert _err(exe.run(feeds)["y"], evaluate(g, feeds, ref)["y"]) < 1e-5

"""The backend contract (backends/base.py) on the CPU backend: declared capabilities, set_threads, what an executable
reports it allocates (``memory()``), KV state bytes, the shared cached-attention analysis (uaii.ir.kvcache), and
the streamer queueing reads in the plan's prefetch order."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pytest

from uaii.backends import ArrayWeights, get_backend
from uaii.backends.base import BackendBase, BackendError, Capabilities
from uaii.ir import DType, Node, Tensor, WeightRef, make_graph
from uaii.ir.kvcache import kv_bytes_per_token, kv_layers

CPU = get_backend("cpu")
D, H, HD = 32, 2, 8  # model width, kv heads, head dim


def test_the_cpu_backend_declares_what_it_does() -> None:
    caps = CPU.capabilities
    assert caps.streams_weights and caps.threads and caps.kv_window and caps.device_memory == 0
    assert caps.kv_dtypes == {"f32", "f16"} and caps.kv_positions == {"absolute", "cache"}
    assert caps.compile_options == {"gemm"}
    assert Capabilities().kv_dtypes == frozenset() and not Capabilities().streams_weights  # nothing by default


def test_set_threads_needs_a_declared_pool() -> None:
    class NoPool(BackendBase):
        name = "nopool"

    with pytest.raises(BackendError, match=r"nopool cannot set 2 threads: .*capabilities\.threads is False"):
        NoPool().set_threads(2)


# --- memory() ------------------------------------------------------------------------------------------------
def _mlp() -> object:
    """x -> MatMul(a, [N, K]) -> MatMul(b, [K, N] float: transposed once, a copy) -> MatMul(c: the same reference
    as a, another tensor) -> y."""
    t = [Tensor("x", DType.F32, ("seq", D)), Tensor("a", DType.F32, (D, D), weight=WeightRef.parse("w.bin#a")),
         Tensor("b", DType.F32, (D, D), weight=WeightRef.parse("w.bin#b")),
         Tensor("c", DType.F32, (D, D), weight=WeightRef.parse("w.bin#a")),
         Tensor("h1", DType.F32, ("seq", D)), Tensor("h2", DType.F32, ("seq", D)), Tensor("y", DType.F32, ("seq", D))]
    nodes = [Node("m1", "MatMul", ("x", "a"), ("h1",), {"transpose_b": True}),
             Node("m2", "MatMul", ("h1", "b"), ("h2",)),
             Node("m3", "MatMul", ("h2", "c"), ("y",), {"transpose_b": True})]
    return make_graph("mlp", nodes, t, ["x"], ["y"])


def test_memory_reports_the_arena_it_allocated_and_each_weight_buffer_once() -> None:
    rng = np.random.default_rng(0)
    arrays = {f"w.bin#{n}": rng.normal(size=(D, D)).astype(np.float32) for n in "ab"}
    exe = CPU.compile(_mlp(), None, ArrayWeights(arrays), max_tokens=8)
    mem = exe.memory()
    assert mem.device == "host" and mem.staging_bytes == 0 and mem.kv_bytes_per_token == 0
    assert mem.arena_bytes == exe.arena_bytes > 0
    one = D * D * 4
    assert mem.weight_bytes == 2 * one  # a and c are one buffer
    exe.run({"x": rng.normal(size=(8, D)).astype(np.float32)})
    assert exe.memory().weight_bytes == 3 * one  # binding made b's transposed copy
    exe.run({"x": rng.normal(size=(64, D)).astype(np.float32)})  # more tokens than planned: a larger arena
    assert exe.memory().arena_bytes == exe.arena_bytes > mem.arena_bytes
    assert exe.memory().total == exe.arena_bytes + 3 * one


# --- KV --------------------------------------------------------------------------------------------------------
def _attention_graph() -> object:
    """Three Attention nodes: one cached (caches named freely: no name prefix is special), one masked and one whose
    past is computed inside the graph — those two stay functional."""
    t = [Tensor("q", DType.F32, ("seq", H, HD)), Tensor("k", DType.F32, ("seq", H, HD)),
         Tensor("v", DType.F32, ("seq", H, HD)), Tensor("mask", DType.F32, ("seq", "total")),
         Tensor("keys_in", DType.F32, ("past", H, HD)), Tensor("vals_in", DType.F32, ("past", H, HD)),
         Tensor("keys_out", DType.F32, ("total", H, HD)), Tensor("vals_out", DType.F32, ("total", H, HD)),
         Tensor("m_k", DType.F32, ("past", H, HD)), Tensor("m_v", DType.F32, ("past", H, HD)),
         Tensor("y0", DType.F32, ("seq", H, HD)), Tensor("y1", DType.F32, ("seq", H, HD)),
         Tensor("kk", DType.F32, ("seq", H, HD)), Tensor("y2", DType.F32, ("seq", H, HD))]
    nodes = [Node("cached", "Attention", ("q", "k", "v", "keys_in", "vals_in"), ("y0", "keys_out", "vals_out")),
             Node("masked", "Attention", ("q", "k", "v", "m_k", "m_v", "mask"), ("y1",)),
             Node("neg", "Neg", ("k",), ("kk",)),
             Node("inner", "Attention", ("q", "k", "v", "kk", "v"), ("y2",))]
    return make_graph("att", nodes, t, ["q", "k", "v", "mask", "keys_in", "vals_in", "m_k", "m_v"],
                      ["y0", "keys_out", "vals_out", "y1", "y2"])


def test_kv_layers_find_cached_attention_by_structure_not_by_name() -> None:
    (layer,) = kv_layers(_attention_graph())
    assert (layer.node, layer.past_k, layer.past_v, layer.present_k, layer.present_v) == (
        "cached", "keys_in", "vals_in", "keys_out", "vals_out")
    assert (layer.n_kv_heads, layer.k_dim, layer.v_dim) == (H, HD, HD)
    assert kv_bytes_per_token(_attention_graph(), 2) == H * 2 * HD * 2


def test_the_executable_and_its_state_report_kv_bytes() -> None:
    exe = CPU.compile(_attention_graph(), None, ArrayWeights(), max_tokens=4)
    assert set(exe.kv_layer) == {"cached"}
    assert exe.memory().kv_bytes_per_token == kv_bytes_per_token(_attention_graph()) == H * 2 * HD * 4
    assert exe.new_state(10, dtype="f16").nbytes == 10 * H * 2 * HD * 2
    assert exe.new_state(10, window=6, sinks=2).nbytes == 8 * H * 2 * HD * 4  # window + sinks slots


# --- the plan's prefetch order -----------------------------------------------------------------------------------
class _Recorder(ArrayWeights):
    """A weight source that records what is queued for read-ahead (``prefetch``) and what is acquired."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        super().__init__(arrays)
        self.queued: list[list[str]] = []
        self.acquired: list[str] = []

    def prefetch(self, refs: Iterable[str]) -> None:
        self.queued.append([str(r) for r in refs])

    def acquire(self, ref: str) -> np.ndarray:
        self.acquired.append(str(ref))
        return super().acquire(ref)


def _trunk(n: int = 3) -> tuple[object, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    t = [Tensor("x", DType.F32, ("seq", D))]
    nodes, cur, arrays = [], "x", {}
    for i in range(n):
        w = f"blk.{i}.w"  # a trunk layer of its own: the planner streams layers first
        t += [Tensor(w, DType.F32, (D, D), weight=WeightRef.parse(f"m.bin#{w}")), Tensor(f"h{i}", DType.F32,
                                                                                       ("seq", D))]
        nodes.append(Node(f"mm{i}", "MatMul", (cur, w), (f"h{i}",), {"transpose_b": True}))
        arrays[f"m.bin#{w}"] = rng.normal(size=(D, D)).astype(np.float32)
        cur = f"h{i}"
    return make_graph("trunk", nodes, t, ["x"], [cur]), arrays


def test_the_streamer_queues_reads_in_the_plans_prefetch_order() -> None:
    """A plan's prefetch order that differs from the execution order changes what is queued, not what runs."""
    from uaii.planner import PlannerOptions, plan
    from uaii.runtime.planning import arena_policy

    graph, arrays = _trunk()
    one = D * D * 4  # two staging buffers (a weight, rounded up a page for a chunk's read window) and the arena
    p, _ = plan(graph, PlannerOptions(budget_bytes=4 * one + 2048, dim_bounds={"seq": 4}, max_tokens=4), cache=False,
                arena=arena_policy(CPU))
    streamed = [w.ref for w in p.storage.weights if w.mode == "streamed"]
    assert streamed == [f"m.bin#blk.{i}.w" for i in range(3)] == list(p.storage.prefetch_order)
    x = np.ones((1, D), np.float32)
    queued = []
    for order in (p.storage.prefetch_order, p.storage.prefetch_order[::-1]):
        store = _Recorder(arrays)
        exe = CPU.compile(graph, p, store, streamed=streamed, prefetch_order=order)
        exe.run({"x": x})
        assert store.acquired == streamed  # the steps acquire in execution order whatever is queued
        queued.append(store.queued[0])
    assert queued == [list(p.storage.prefetch_order), list(p.storage.prefetch_order[::-1])]


def test_a_prefetch_order_without_a_streamed_weight_is_refused() -> None:
    graph, arrays = _trunk()
    with pytest.raises(BackendError, match=r"prefetch order \(2 references\) does not list the streamed weight "
                                           r"'m\.bin#blk\.2\.w'"):
        CPU.compile(graph, None, _Recorder(arrays), streamed=list(arrays), prefetch_order=list(arrays)[1::-1])


def test_a_tied_table_is_queued_at_its_staged_use() -> None:
    """The plan lists a tied embedding/lm_head table at its first use, a lookup that reads rows outside staging:
    its staged read (the lm_head) is queued where that runs, after the trunk, not ahead of it."""
    rng = np.random.default_rng(2)
    vocab = 16
    t = [Tensor("ids", DType.I64, ("seq",)), Tensor("table", DType.F32, (vocab, D), weight=WeightRef.parse("m.bin#t")),
         Tensor("w", DType.F32, (D, D), weight=WeightRef.parse("m.bin#w")), Tensor("e", DType.F32, ("seq", D)),
         Tensor("h", DType.F32, ("seq", D)), Tensor("logits", DType.F32, ("seq", vocab))]
    nodes = [Node("embed", "Embedding", ("ids", "table"), ("e",)),
             Node("mm", "MatMul", ("e", "w"), ("h",), {"transpose_b": True}),
             Node("head", "MatMul", ("h", "table"), ("logits",), {"transpose_b": True})]
    graph = make_graph("tied", nodes, t, ["ids"], ["logits"])
    arrays = {"m.bin#t": rng.normal(size=(vocab, D)).astype(np.float32),
              "m.bin#w": rng.normal(size=(D, D)).astype(np.float32)}
    exe = CPU.compile(graph, None, _Recorder(arrays), streamed=list(arrays), prefetch_order=["m.bin#t", "m.bin#w"])
    assert exe.streaming is not None and exe.streaming.order == ["m.bin#w", "m.bin#t"]

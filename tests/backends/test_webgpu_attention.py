"""The WebGPU KV cache and attention against the CPU backend and the reference: a resident window with sinks over a
decode loop, truncate/reset, StreamingLLM cache positions with key re-rotation on the device, f16 caches, long
contexts, RoPE at far positions, Softmax along any axis. Runs on lavapipe (a software adapter) in CI."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from uaii.backends import ArrayWeights, BackendError, KVCacheFull, get_backend
from uaii.ir import DType, Node, Tensor, make_graph
from uaii.ir.reference import evaluate

wgpu = pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")

from uaii.backends.webgpu import WebGpuBackend  # noqa: E402

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
GPU = WebGpuBackend(allow_software=True)
STATUS = GPU.probe()
pytestmark = pytest.mark.skipif(not STATUS.available, reason=f"no WebGPU adapter: {STATUS.reason}")

# (query heads, kv heads, key dim, value dim) per layer: GQA with equal dims, MQA with a narrower value
LAYERS = [(4, 2, 8, 8), (2, 1, 16, 4)]
ROPES: list[dict[str, Any]] = [
    {"mode": "normal", "theta": 10000.0},
    {"mode": "neox", "rotary_dims": 4, "theta": 500000.0, "scaling_type": "llama3", "factor": 8.0,
     "original_max_position": 16},
    {"mode": "neox", "theta": 10000.0, "scaling_type": "yarn", "factor": 4.0, "original_max_position": 32,
     "attn_factor": 1.3},
]


def _cached_graph(window: int = 0, sinks: int = 0, ropes: list[dict[str, Any]] | None = None) -> Any:
    """Cached attention layers (:data:`LAYERS`); with ``ropes``, one layer per variant whose q and k go through
    RoPE at the graph input ``positions`` first (what ``positions="cache"`` needs)."""
    nodes, tensors, inputs, outputs = [], [], [], []
    specs = LAYERS if ropes is None else [(4, 2, 8, 8)] * len(ropes)
    if ropes is not None:
        tensors.append(Tensor("positions", DType.I64, ("seq",)))
        inputs.append("positions")
    for i, (hq, h, d, dv) in enumerate(specs):
        q, k = f"q{i}", f"k{i}"
        tensors += [Tensor(f"q{i}", DType.F32, ("seq", hq, d)), Tensor(f"k{i}", DType.F32, ("seq", h, d)),
                    Tensor(f"v{i}", DType.F32, ("seq", h, dv)), Tensor(f"past_k.{i}", DType.F32, ("past", h, d)),
                    Tensor(f"past_v.{i}", DType.F32, ("past", h, dv)), Tensor(f"y{i}", DType.F32, ("seq", hq, dv)),
                    Tensor(f"present_k.{i}", DType.F32, ("all", h, d)),
                    Tensor(f"present_v.{i}", DType.F32, ("all", h, dv))]
        if ropes is not None:
            tensors += [Tensor(f"qr{i}", DType.F32, ("seq", hq, d)), Tensor(f"kr{i}", DType.F32, ("seq", h, d))]
            nodes += [Node(f"q{i}.rope", "RoPE", (q, "positions"), (f"qr{i}",), ropes[i]),
                      Node(f"k{i}.rope", "RoPE", (k, "positions"), (f"kr{i}",), ropes[i])]
            q, k = f"qr{i}", f"kr{i}"
        nodes.append(Node(f"attn{i}", "Attention", (q, k, f"v{i}", f"past_k.{i}", f"past_v.{i}"),
                          (f"y{i}", f"present_k.{i}", f"present_v.{i}"),
                          {"n_heads": hq, "n_kv_heads": h, "sliding_window": window, "sinks": sinks}))
        inputs += [f"q{i}", f"k{i}", f"v{i}", f"past_k.{i}", f"past_v.{i}"]
        outputs += [f"y{i}", f"present_k.{i}", f"present_v.{i}"]
    return make_graph("gpu_kv", nodes, tensors, inputs, outputs)


def _feeds(rng: np.random.Generator, n: int, specs: list[tuple[int, int, int, int]] = LAYERS) -> dict[str, np.ndarray]:
    out = {}
    for i, (hq, h, d, dv) in enumerate(specs):
        out[f"q{i}"] = rng.normal(size=(n, hq, d)).astype(np.float32)
        out[f"k{i}"] = rng.normal(size=(n, h, d)).astype(np.float32)
        out[f"v{i}"] = rng.normal(size=(n, h, dv)).astype(np.float32)
    return out


def _both(graph: Any) -> tuple[Any, Any]:
    return get_backend("cpu").compile(graph, None, ArrayWeights()), GPU.compile(graph, None, ArrayWeights())


def _same_state(gs: Any, cs: Any) -> None:
    assert (gs.used, gs.length, gs.compactions) == (cs.used, cs.length, cs.compactions)
    np.testing.assert_array_equal(gs.pos, cs.pos)
    np.testing.assert_array_equal(gs.device_positions(), cs.pos)  # what the attention kernel masks by


# --- the KV state -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("dtype", "atol"), [("f32", 1e-5), ("f16", 1e-3)])
def test_decode_loop_with_a_window_and_sinks_matches_the_cpu(dtype: str, atol: float) -> None:
    """40 decode steps after a prefill through a 2 sinks + 8 slots window (compacting on the device) give the
    CPU's outputs, bookkeeping and cached rows; the model attends to its 4 latest tokens + 2 sinks, so both also
    equal the unbounded reference."""
    graph = _cached_graph(window=4, sinks=2)
    cpu, gpu = _both(graph)
    cs, gs = cpu.new_state(0, window=8, sinks=2, dtype=dtype), gpu.new_state(0, window=8, sinks=2, dtype=dtype)
    assert gs.capacity == cs.capacity == 10 and gs.dtype == dtype
    rng = np.random.default_rng(0)
    past = {f"past_{kv}.{i}": np.zeros((0, h, d if kv == "k" else dv), np.float32)
            for i, (_, h, d, dv) in enumerate(LAYERS) for kv in "kv"}
    for n in (3, *[1] * 40):
        f = _feeds(rng, n)
        want = {k: v.copy() for k, v in cpu.run(f, cs).items()}
        got = gpu.run(f, gs)
        ref = evaluate(graph, {**f, **past}, {})
        past = {k.replace("present", "past"): v for k, v in ref.items() if k.startswith("present")}
        for i in range(len(LAYERS)):
            np.testing.assert_allclose(got[f"y{i}"], want[f"y{i}"], atol=atol, err_msg=f"layer {i}, length {cs.length}")
            np.testing.assert_allclose(got[f"y{i}"], ref[f"y{i}"], atol=5 * atol)
        _same_state(gs, cs)
    assert gs.compactions >= 5 and gs.length == 43
    for layer in range(len(LAYERS)):
        k, v = gs.rows(layer)
        np.testing.assert_allclose(k, cs.k[layer][:cs.used].astype(np.float32), atol=1e-6)
        np.testing.assert_allclose(v, cs.v[layer][:cs.used].astype(np.float32), atol=1e-6)


def test_truncate_and_reset_match_the_cpu() -> None:
    cpu, gpu = _both(_cached_graph())
    cs, gs = cpu.new_state(16), gpu.new_state(16)
    rng = np.random.default_rng(1)
    a, b = _feeds(rng, 5), _feeds(rng, 2)
    gpu.run(a, gs)
    cpu.run(a, cs)
    first = gpu.run(b, gs)["y0"].copy()
    np.testing.assert_allclose(first, cpu.run(b, cs)["y0"], atol=1e-5)
    gs.truncate(5)
    cs.truncate(5)
    _same_state(gs, cs)
    np.testing.assert_array_equal(gpu.run(b, gs)["y0"], first)
    gs.reset()
    assert gs.length == 0 and gs.used == 0 and np.all(gs.device_positions() == -1)
    with pytest.raises(KVCacheFull, match="cannot truncate to 3"):
        gs.truncate(3)
    gpu.run(_feeds(rng, 16), gs)
    with pytest.raises(KVCacheFull, match="holds 16 tokens"):
        gpu.run(_feeds(rng, 1), gs)


def test_truncate_after_compaction_matches_the_cpu() -> None:
    graph = _cached_graph(window=4, sinks=2)
    cpu, gpu = _both(graph)
    cs, gs = cpu.new_state(0, window=8, sinks=2), gpu.new_state(0, window=8, sinks=2)
    rng = np.random.default_rng(2)
    for n in (3, *[1] * 12):
        f = _feeds(rng, n)
        cpu.run(f, cs)
        gpu.run(f, gs)
    assert gs.compactions > 0
    for st in (cs, gs):
        st.truncate(st.length - 2)
        with pytest.raises(KVCacheFull, match="dropped by window compaction"):
            st.truncate(3)
    _same_state(gs, cs)
    for _ in range(6):
        f = _feeds(rng, 1)
        want = cpu.run(f, cs)["y1"].copy()
        np.testing.assert_allclose(gpu.run(f, gs)["y1"], want, atol=1e-5)
    _same_state(gs, cs)


@pytest.mark.parametrize(("dtype", "atol"), [("f32", 1e-5), ("f16", 2e-3)])
def test_cache_positions_rerotate_keys_on_the_device_as_the_cpu(dtype: str, atol: float) -> None:
    """``positions="cache"``: the fed positions are slots, and compaction rotates the moved keys by the slot shift
    (adjacent and NeoX pairs, partial rotary dims, llama3 and yarn scaling) — on the device, as the CPU does."""
    graph = _cached_graph(ropes=ROPES)
    specs = [(4, 2, 8, 8)] * len(ROPES)
    cpu, gpu = _both(graph)
    cs = cpu.new_state(0, window=8, sinks=2, dtype=dtype, positions="cache")
    gs = gpu.new_state(0, window=8, sinks=2, dtype=dtype, positions="cache")
    rng = np.random.default_rng(7)
    for n in (3, *[1] * 20, 2, 1, 3, *[1] * 10):
        f = _feeds(rng, n, specs=specs)
        first = gs.reserve(n)
        assert first == cs.reserve(n) == gs.used
        f["positions"] = np.arange(first, first + n)
        want = {k: v.copy() for k, v in cpu.run(f, cs).items()}
        got = gpu.run(f, gs)
        for i in range(len(ROPES)):
            np.testing.assert_allclose(got[f"y{i}"], want[f"y{i}"], atol=atol, err_msg=f"layer {i} ({ROPES[i]})")
        _same_state(gs, cs)
    assert gs.compactions >= 5
    for layer in range(len(ROPES)):
        np.testing.assert_allclose(gs.rows(layer)[0], cs.k[layer][:cs.used].astype(np.float32), atol=10 * atol)
    with pytest.raises(KVCacheFull, match=r"call reserve\(4\) before the run"):
        gpu.run({**_feeds(rng, 4, specs=specs), "positions": np.arange(4)}, gs)


def test_cache_positions_need_rope_keys() -> None:
    gpu = GPU.compile(_cached_graph(), None, ArrayWeights())
    with pytest.raises(BackendError, match=r"keys must come from a RoPE node; node 'attn0' \(Attention\)"):
        gpu.new_state(0, window=8, positions="cache")


def test_state_limits_and_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    from uaii.backends.webgpu.device import GpuDevice, choose
    from uaii.backends.webgpu.kv_state import GpuKVState

    info, adapter = choose(True)
    monkeypatch.setenv("UAII_WEBGPU_MAX_BINDING", "4096")
    small = GpuDevice(info, adapter)
    with pytest.raises(KVCacheFull, match=r"layer 0 needs 8192 bytes .* storage binding limit 4096"):
        GpuKVState(small, [(2, 8, 8)], 128)
    st = GpuKVState(small, [(2, 8, 8), (1, 16, 4)], 32, window=24, sinks=8, dtype="f16")
    kv = 32 * 2 * (2 * 8 + 2 * 8 + 16 + 4)
    assert st.nbytes == kv + 4 * 32 + 32 * 2 * 16  # + positions + the compaction staging of the widest buffer
    with pytest.raises(KVCacheFull, match="must be even"):
        GpuKVState(small, [(1, 7, 8)], 8, dtype="f16")
    with pytest.raises(KVCacheFull, match="f32 or f16"):
        GpuKVState(small, [(1, 8, 8)], 8, dtype="f64")


# --- attention, RoPE, softmax beyond the conformance cases ---------------------------------------------------
def _one_node(op: str, ins: list[tuple[str, DType, tuple[int, ...]]], outs: list[tuple[str, DType, tuple[int, ...]]],
              **attrs: Any) -> Any:
    tensors = [Tensor(n, dt, s) for n, dt, s in [*ins, *outs]]
    node = Node("n", op, tuple(n for n, _, _ in ins), tuple(n for n, _, _ in outs), attrs)
    return make_graph(op.lower(), [node], tensors, [n for n, _, _ in ins], [n for n, _, _ in outs])


def _check(graph: Any, feeds: dict[str, np.ndarray], tol: float) -> None:
    got = GPU.compile(graph, None, ArrayWeights(), kv_state=False).run(feeds)
    ref = evaluate(graph, feeds, {})
    for name in graph.outputs:
        r = ref[name].astype(np.float64)
        err = np.max(np.abs(got[name].astype(np.float64) - r)) / max(np.max(np.abs(r)), 1e-6)
        assert err <= tol, f"{name}: normalized error {err:.3g} > {tol}"


@pytest.mark.parametrize("attrs", [{}, {"sliding_window": 700, "sinks": 4, "softcap": 30.0}])
def test_attention_over_thousands_of_keys(attrs: dict[str, Any]) -> None:
    """A decode step over 3000 cached keys: the online softmax carries its max and sum over 47 chunks."""
    t, past, hq, h, d = 2, 3000, 4, 2, 16
    f32 = DType.F32
    graph = _one_node("Attention", [("q", f32, (t, hq, d)), ("k", f32, (t, h, d)), ("v", f32, (t, h, d)),
                                    ("pk", f32, (past, h, d)), ("pv", f32, (past, h, d))],
                      [("y", f32, (t, hq, d))], n_heads=hq, n_kv_heads=h, **attrs)
    rng = np.random.default_rng(3)
    feeds = {n: rng.normal(size=s).astype(np.float32) for n, _, s in
             [("q", 0, (t, hq, d)), ("k", 0, (t, h, d)), ("v", 0, (t, h, d)), ("pk", 0, (past, h, d)),
              ("pv", 0, (past, h, d))]}
    feeds["q"] *= 3.0  # peaked scores: a wrong running max shows
    _check(graph, feeds, 1e-4)


def test_attention_with_batch_dims_and_a_broadcast_mask() -> None:
    b, t, hq, h, d = 2, 5, 4, 2, 8
    f32 = DType.F32
    graph = _one_node("Attention", [("q", f32, (b, t, hq, d)), ("k", f32, (b, t, h, d)), ("v", f32, (b, t, h, d)),
                                    ("pk", f32, (b, 3, h, d)), ("pv", f32, (b, 3, h, d)),
                                    ("mask", DType.BOOL, (hq, 1, 3 + t))],
                      [("y", f32, (b, t, hq, d)), ("nk", f32, (b, 3 + t, h, d)), ("nv", f32, (b, 3 + t, h, d))],
                      n_heads=hq, n_kv_heads=h)
    rng = np.random.default_rng(4)
    feeds = {n: rng.normal(size=s).astype(np.float32) for n, s in
             [("q", (b, t, hq, d)), ("k", (b, t, h, d)), ("v", (b, t, h, d)), ("pk", (b, 3, h, d)),
              ("pv", (b, 3, h, d))]}
    feeds["mask"] = rng.random((hq, 1, 3 + t)) > 0.3
    _check(graph, feeds, 1e-4)


def test_rope_at_far_positions_matches_the_float64_reference() -> None:
    """Positions near 2^20 with 2-D positions broadcast over a batch: the angle is exact in turns on the device,
    where ``f32(pos) * inv_freq`` would be off by ~0.06 rad."""
    x_shape, p_shape = (2, 3, 2, 16), (2, 3)
    graph = _one_node("RoPE", [("x", DType.F32, x_shape), ("pos", DType.I64, p_shape)],
                      [("y", DType.F32, x_shape)], mode="neox", theta=10000.0)
    rng = np.random.default_rng(5)
    feeds = {"x": rng.normal(size=x_shape).astype(np.float32),
             "pos": np.array([[1_000_003, 1_040_000, 999_999], [5, 16_000_000, 777_777]], np.int64)}
    _check(graph, feeds, 2e-5)


@pytest.mark.parametrize(("shape", "axis", "dtype", "tol"), [((3, 3000), -1, DType.F32, 2e-5),
                                                              ((4, 33, 5), 1, DType.F32, 2e-5),
                                                              ((2, 70), -1, DType.F16, 1e-3)])
def test_softmax_long_rows_inner_axes_and_f16(shape: tuple[int, ...], axis: int, dtype: DType, tol: float) -> None:
    graph = _one_node("Softmax", [("x", dtype, shape)], [("y", dtype, shape)], axis=axis)
    x = np.random.default_rng(6).uniform(-8, 8, size=shape).astype(dtype.numpy)
    _check(graph, {"x": x}, tol)

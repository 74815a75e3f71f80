"""KV cache positioning: ``positions="cache"`` (StreamingLLM: rotary position = cache slot) against a reference that
rotates pre-RoPE keys by their slot at every step, for RoPE variants that the re-rotation at compaction must
reproduce (adjacent and NeoX pairs, partial rotary dims, llama3 and yarn scaling)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from uaii.backends import ArrayWeights, BackendError, KVCacheFull, KVState, get_backend
from uaii.ir import DType, Node, Tensor, make_graph
from uaii.ir.reference import evaluate

H, HQ, D = 2, 4, 8
ROPES: list[dict[str, Any]] = [
    {"mode": "normal", "theta": 10000.0},
    {"mode": "neox", "rotary_dims": 4, "theta": 500000.0, "scaling_type": "llama3", "factor": 8.0,
     "original_max_position": 16},
    {"mode": "neox", "theta": 10000.0, "scaling_type": "yarn", "factor": 4.0, "original_max_position": 32,
     "attn_factor": 1.3},
]


def _layer(i: int, rope: dict[str, Any], qpos: str, kpos: str, cached: bool) -> tuple[list[Node], list[Tensor]]:
    past = (f"past_k.{i}", f"past_v.{i}") if cached else ()
    outs = (f"y{i}", f"present_k.{i}", f"present_v.{i}") if cached else (f"y{i}",)
    nodes = [Node(f"q{i}.rope", "RoPE", (f"q{i}", qpos), (f"qr{i}",), rope),
             Node(f"k{i}.rope", "RoPE", (f"k{i}", kpos), (f"kr{i}",), rope),
             Node(f"attn{i}", "Attention", (f"qr{i}", f"kr{i}", f"v{i}", *past), outs,
                  {"n_heads": HQ, "n_kv_heads": H})]
    seq = "seq"
    tensors = [Tensor(f"q{i}", DType.F32, (seq, HQ, D)), Tensor(f"k{i}", DType.F32, ("total", H, D)),
               Tensor(f"v{i}", DType.F32, ("total", H, D)), Tensor(f"qr{i}", DType.F32, (seq, HQ, D)),
               Tensor(f"kr{i}", DType.F32, ("total", H, D)), Tensor(f"y{i}", DType.F32, (seq, HQ, D))]
    if cached:
        tensors += [Tensor(f"past_k.{i}", DType.F32, ("past", H, D)), Tensor(f"past_v.{i}", DType.F32, ("past", H, D)),
                    Tensor(f"present_k.{i}", DType.F32, ("all", H, D)),
                    Tensor(f"present_v.{i}", DType.F32, ("all", H, D))]
    return nodes, tensors


def _graph(cached: bool) -> Any:
    """Cached: one attention layer per RoPE variant, q/k/v before RoPE, one ``positions`` input. Reference: the
    same layers without a cache, keys given in full with their own positions (``kpos``)."""
    nodes: list[Node] = []
    tensors = [Tensor("positions", DType.I64, ("seq",))]
    if not cached:
        tensors.append(Tensor("kpos", DType.I64, ("total",)))
    inputs = ["positions"] if cached else ["positions", "kpos"]
    outputs: list[str] = []
    for i, rope in enumerate(ROPES):
        n, t = _layer(i, rope, "positions", "positions" if cached else "kpos", cached)
        nodes += n
        tensors += t
        inputs += [f"q{i}", f"k{i}", f"v{i}", *((f"past_k.{i}", f"past_v.{i}") if cached else ())]
        outputs += [f"y{i}", *((f"present_k.{i}", f"present_v.{i}") if cached else ())]
    if cached:  # new k/v have seq rows
        tensors = [Tensor(t.name, t.dtype, ("seq", *t.shape[1:])) if t.shape[0] == "total" else t for t in tensors]
    return make_graph("kvpos", nodes, tensors, inputs, outputs)


class Reference:
    """Pre-RoPE keys and values of every token the state keeps, attended with keys rotated at their slots."""

    def __init__(self) -> None:
        self.graph = _graph(cached=False)
        self.tokens: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}  # absolute position -> per layer (k, v)

    def step(self, feeds: dict[str, np.ndarray], state: KVState, n: int) -> list[np.ndarray]:
        start = state.length - n
        for j in range(n):
            self.tokens[start + j] = [(feeds[f"k{i}"][j], feeds[f"v{i}"][j]) for i in range(len(ROPES))]
        kept = [int(p) for p in state.pos[:state.used]]  # slot order; the new tokens last
        assert kept[-n:] == list(range(start, start + n))
        ref = {"positions": np.arange(len(kept) - n, len(kept)), "kpos": np.arange(len(kept))}
        for i in range(len(ROPES)):
            ref[f"q{i}"] = feeds[f"q{i}"]
            ref[f"k{i}"] = np.stack([self.tokens[p][i][0] for p in kept])
            ref[f"v{i}"] = np.stack([self.tokens[p][i][1] for p in kept])
        out = evaluate(self.graph, ref, {})
        return [out[f"y{i}"] for i in range(len(ROPES))]


def _feeds(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    f: dict[str, np.ndarray] = {}
    for i in range(len(ROPES)):
        f[f"q{i}"] = rng.normal(size=(n, HQ, D)).astype(np.float32)
        f[f"k{i}"] = rng.normal(size=(n, H, D)).astype(np.float32)
        f[f"v{i}"] = rng.normal(size=(n, H, D)).astype(np.float32)
    return f


@pytest.mark.parametrize(("dtype", "sinks", "atol"), [("f32", 2, 1e-4), ("f32", 0, 1e-4), ("f16", 3, 2e-2)])
def test_cache_positions_match_keys_rotated_by_slot(dtype: str, sinks: int, atol: float) -> None:
    exe = get_backend("cpu").compile(_graph(cached=True), None, ArrayWeights())
    state = exe.new_state(0, window=8, sinks=sinks, dtype=dtype, positions="cache")
    ref = Reference()
    rng = np.random.default_rng(7)
    sizes = (3, *[1] * 20, 2, 1, 3, *[1] * 12, 4, *[1] * 9)
    for n in sizes:
        f = _feeds(rng, n)
        first = state.reserve(n)
        assert first == state.used  # the slot the first new token is written to
        got = exe.run({**f, "positions": np.arange(first, first + n)}, state)
        want = ref.step(f, state, n)
        for i in range(len(ROPES)):
            np.testing.assert_allclose(got[f"y{i}"], want[i], atol=atol, err_msg=f"layer {i} ({ROPES[i]})")
    assert state.compactions >= 5 and state.length == sum(sizes)
    kept = state.pos[:state.used]
    assert list(kept[:sinks]) == list(range(sinks)) and kept[-1] == state.length - 1  # masks stay absolute


def test_unbounded_cache_positions_are_absolute_positions() -> None:
    exe = get_backend("cpu").compile(_graph(cached=True), None, ArrayWeights())
    a, c = exe.new_state(64), exe.new_state(64, positions="cache")
    rng = np.random.default_rng(3)
    for n in (5, 1, 1, 3):
        f = _feeds(rng, n)
        assert a.reserve(n) == c.reserve(n) == a.length
        pos = {"positions": np.arange(a.length, a.length + n)}
        ya = {k: v.copy() for k, v in exe.run({**f, **pos}, a).items()}
        yc = exe.run({**f, **pos}, c)
        for k in ya:
            np.testing.assert_array_equal(ya[k], yc[k])


def test_absolute_positions_stay_the_default() -> None:
    exe = get_backend("cpu").compile(_graph(cached=True), None, ArrayWeights())
    state = exe.new_state(0, window=8, sinks=2)
    assert state.positions == "absolute" and state.rotations == ()
    rng = np.random.default_rng(4)
    for n in (3, *[1] * 12):
        first = state.reserve(n)
        assert first == state.length  # absolute: the next position of the sequence, whatever the slot
        exe.run({**_feeds(rng, n), "positions": np.arange(first, first + n)}, state)
    assert state.compactions > 0 and state.used < state.length


def test_cache_positions_need_reserve_before_a_compacting_run() -> None:
    exe = get_backend("cpu").compile(_graph(cached=True), None, ArrayWeights())
    state = exe.new_state(0, window=4, sinks=1, positions="cache")
    rng = np.random.default_rng(5)
    exe.run({**_feeds(rng, 5), "positions": np.arange(5)}, state)
    with pytest.raises(KVCacheFull, match=r"call reserve\(1\) before the run"):
        exe.run({**_feeds(rng, 1), "positions": np.arange(5, 6)}, state)


def test_cache_positions_need_rope_keys() -> None:
    """Keys that no RoPE node rotated cannot be re-rotated: the state refuses, naming the node."""
    t = [Tensor("q", DType.F32, ("seq", HQ, D)), Tensor("k", DType.F32, ("seq", H, D)),
         Tensor("v", DType.F32, ("seq", H, D)), Tensor("past_k.0", DType.F32, ("past", H, D)),
         Tensor("past_v.0", DType.F32, ("past", H, D)), Tensor("y", DType.F32, ("seq", HQ, D)),
         Tensor("present_k.0", DType.F32, ("all", H, D)), Tensor("present_v.0", DType.F32, ("all", H, D))]
    node = Node("attn", "Attention", ("q", "k", "v", "past_k.0", "past_v.0"), ("y", "present_k.0", "present_v.0"),
                {"n_heads": HQ, "n_kv_heads": H})
    g = make_graph("norope", [node], t, ["q", "k", "v", "past_k.0", "past_v.0"], ["y", "present_k.0", "present_v.0"])
    exe = get_backend("cpu").compile(g, None, ArrayWeights())
    with pytest.raises(BackendError, match=r"keys must come from a RoPE node; node 'attn' \(Attention\).*graph input"):
        exe.new_state(0, window=8, positions="cache")
    exe.new_state(0, window=8)  # absolute positions do not care
    with pytest.raises(KVCacheFull, match="positions must be one of absolute, cache, found 'slot'"):
        KVState([(H, D, D)], 8, positions="slot")

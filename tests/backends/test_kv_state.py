"""The KV state: bound in place to cached Attention nodes, positions absolute, rewind, reset, and the resident
window with attention sinks."""

from __future__ import annotations

import numpy as np
import pytest

from uaii.backends import ArrayWeights, KVCacheFull, KVState, get_backend
from uaii.ir import DType, Node, Tensor, make_graph
from uaii.ir.reference import evaluate

H, HQ, D = 2, 4, 8


def _graph(window: int = 0, sinks: int = 0) -> object:
    """One cached attention layer: q, k, v [seq, heads, dim] plus past/present caches."""
    t = [Tensor("q", DType.F32, ("seq", HQ, D)), Tensor("k", DType.F32, ("seq", H, D)),
         Tensor("v", DType.F32, ("seq", H, D)), Tensor("past_k.0", DType.F32, ("past", H, D)),
         Tensor("past_v.0", DType.F32, ("past", H, D)), Tensor("y", DType.F32, ("seq", HQ, D)),
         Tensor("present_k.0", DType.F32, ("past_plus_seq", H, D)),
         Tensor("present_v.0", DType.F32, ("past_plus_seq", H, D))]
    node = Node("attn", "Attention", ("q", "k", "v", "past_k.0", "past_v.0"), ("y", "present_k.0", "present_v.0"),
                {"n_heads": HQ, "n_kv_heads": H, "sliding_window": window, "sinks": sinks})
    return make_graph("kv", [node], t, ["q", "k", "v", "past_k.0", "past_v.0"], ["y", "present_k.0", "present_v.0"])


def _feeds(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {"q": rng.normal(size=(n, HQ, D)).astype(np.float32), "k": rng.normal(size=(n, H, D)).astype(np.float32),
            "v": rng.normal(size=(n, H, D)).astype(np.float32)}


def _reference(graph: object, chunks: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    past = {"past_k.0": np.zeros((0, H, D), np.float32), "past_v.0": np.zeros((0, H, D), np.float32)}
    out = []
    for f in chunks:
        r = evaluate(graph, {**f, **past}, {})  # type: ignore[arg-type]
        out.append(r["y"])
        past = {"past_k.0": r["present_k.0"], "past_v.0": r["present_v.0"]}
    return out


def test_cached_attention_runs_in_place_and_matches_the_functional_graph() -> None:
    graph = _graph()
    exe = get_backend("cpu").compile(graph, None, ArrayWeights())
    assert exe.input_names == ("q", "k", "v") and exe.output_names == ("y",)
    state = exe.new_state(32)
    keys = state.k[0]
    rng = np.random.default_rng(0)
    chunks = [_feeds(rng, n) for n in (6, 1, 1, 4, 1)]
    ref = _reference(graph, chunks)
    for f, want in zip(chunks, ref, strict=True):
        got = exe.run(f, state)["y"]
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert state.length == 13 and state.used == 13 and state.k[0] is keys
    np.testing.assert_array_equal(state.pos[:13], np.arange(13))
    with pytest.raises(Exception, match="pass a state"):
        exe.run(chunks[0])


def test_truncate_rewinds_and_reset_forgets() -> None:
    exe = get_backend("cpu").compile(_graph(), None, ArrayWeights())
    state = exe.new_state(16)
    rng = np.random.default_rng(1)
    a, b = _feeds(rng, 5), _feeds(rng, 2)
    exe.run(a, state)
    first = exe.run(b, state)["y"].copy()
    state.truncate(5)
    assert state.length == 5
    np.testing.assert_array_equal(exe.run(b, state)["y"], first)
    state.reset()
    assert state.length == 0 and state.used == 0
    with pytest.raises(KVCacheFull, match="cannot truncate to 3"):
        state.truncate(3)
    exe.run(_feeds(rng, 16), state)
    with pytest.raises(KVCacheFull, match="holds 16 tokens"):
        exe.run(_feeds(rng, 1), state)


def test_resident_window_with_sinks_is_exact_for_a_windowed_model() -> None:
    """A model attending to its 4 latest tokens plus 2 sinks gives the same outputs from a cache that keeps only
    2 sinks + 8 recent slots (compacting as it goes) as from the unbounded cache."""
    graph = _graph(window=4, sinks=2)
    exe = get_backend("cpu").compile(graph, None, ArrayWeights())
    state = exe.new_state(0, window=8, sinks=2)
    assert state.capacity == 10
    rng = np.random.default_rng(2)
    chunks = [_feeds(rng, n) for n in (3, *[1] * 20, 2, 1, 3, *[1] * 10)]
    ref = _reference(graph, chunks)
    for f, want in zip(chunks, ref, strict=True):
        np.testing.assert_allclose(exe.run(f, state)["y"], want, atol=1e-5)
    assert state.compactions > 0 and state.length == sum(len(f["q"]) for f in chunks)
    kept = state.pos[:state.used]
    assert list(kept[:2]) == [0, 1] and np.all(np.diff(kept) > 0) and kept[-1] == state.length - 1


def test_state_shapes_and_dtypes() -> None:
    st = KVState([(2, 8, 4), (1, 16, 16)], 64, dtype="f16")
    assert st.k[0].shape == (64, 2, 8) and st.v[1].shape == (64, 1, 16) and st.k[0].dtype == np.float16
    assert st.nbytes == 2 * 64 * (16 + 8 + 16 + 16) and st.resident_bytes() == 0
    with pytest.raises(KVCacheFull, match="f32 or f16"):
        KVState([(1, 8, 8)], 4, dtype="f64")

"""Batched decode over several sequences' KV states (``run(feeds, KVBatch(states))``): every row's logits and cache
are bit-identical to a run of that sequence alone — with quantized GEMMs, f16 caches, resident windows that compact
(absolute and cache positions), rows joining and leaving between steps — a full row is named and moves no row, a
state of another executable is refused, alternating sequences does not rebind, and the webgpu backend refuses a
batch. The same on the real SmolLM2: tests/runtime/test_batched_rows.py."""

from __future__ import annotations

import gc
import os
import weakref
from typing import Any

import numpy as np
import pytest
from planner_helpers import Dims, llama

from uaii.backends import ArrayWeights, BackendError, KVBatch, KVCacheFull, KVState, get_backend, weight_key
from uaii.backends.webgpu import WebGpuBackend
from uaii.ir import DType
from uaii.kernels.testing import random_weight

DIMS = Dims(d=64, heads=4, kv=2, head_dim=16, ff=96, vocab=50)  # every GEMM k a multiple of 32 (block types)
PROMPTS = [[3, 1, 4], [1, 5, 9, 2, 6], [5, 3, 5, 8, 9, 7, 9], [3, 2]]


def _weights(graph: Any, wdtype: str) -> ArrayWeights:
    """Random weights: norms near 1, f32 embeddings, matrices of ``wdtype`` (packed bytes for block types)."""
    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray] = {}
    for i, t in enumerate(graph.weights):
        shape = tuple(int(d) for d in t.shape)
        if t.dtype is DType.F32:
            base = 1.0 if t.name.endswith("norm.weight") else 0.0
            out[weight_key(t)] = (rng.standard_normal(shape) * 0.3 + base).astype(np.float32)
        else:
            out[weight_key(t)] = random_weight(t.dtype, shape[0], shape[1], seed=i)
    return ArrayWeights(out)


class _Store(ArrayWeights):
    """The streaming-store surface StreamingWeights uses, over in-memory arrays."""

    def prefetch(self, order: object) -> None:
        """Nothing to read ahead: the arrays are in memory."""

    def window_bytes(self, ref: str) -> int:
        return int(self.arrays[str(ref)].nbytes)


def _exe(wdtype: str = "q4_0", dims: Dims = DIMS, layers: int = 2, streamed: bool = False,
         max_tokens: int = 16) -> Any:
    graph = llama(layers, dims=dims, wdtype=wdtype)
    if not streamed:
        return get_backend("cpu").compile(graph, None, _weights(graph, wdtype), max_tokens=max_tokens)
    names = {weight_key(t) for t in graph.weights if len(t.shape) == 2 and t.name != "token_embd.weight"}
    return get_backend("cpu").compile(graph, None, _Store(_weights(graph, wdtype).arrays), max_tokens=16,
                                      streamed=names)


def _feeds(ids: list[int], state: KVState) -> dict[str, np.ndarray]:
    first = state.reserve(len(ids))
    return {"tokens": np.array(ids, np.int64), "positions": np.arange(first, first + len(ids), dtype=np.int64)}


def _prefill(exe: Any, prompt: list[int], **state_kw: Any) -> tuple[KVState, KVState]:
    """A sequence prefilled twice: the state that joins batches and the clone that runs alone."""
    pair = []
    for _ in range(2):
        st = exe.new_state(64, **state_kw)
        exe.run(_feeds(prompt, st), st)
        pair.append(st)
    return pair[0], pair[1]


def _batched(exe: Any, batch: KVBatch, tokens: list[int]) -> np.ndarray:
    positions = np.array([row.reserve(1) for row in batch.rows], np.int64)
    return exe.run({"tokens": np.array(tokens, np.int64), "positions": positions}, batch)["logits"].copy()


def _alone(exe: Any, clones: list[KVState], tokens: list[int]) -> np.ndarray:
    return np.concatenate([exe.run(_feeds([t], c), c)["logits"].copy() for t, c in zip(tokens, clones, strict=True)])


def _same_cache(a: KVState, b: KVState) -> None:
    assert (a.length, a.used, a.compactions) == (b.length, b.used, b.compactions)
    np.testing.assert_array_equal(a.pos[:a.used], b.pos[:b.used])
    for ka, kb, va, vb in zip(a.k, b.k, a.v, b.v, strict=True):
        assert np.array_equal(ka[:a.used], kb[:b.used]) and np.array_equal(va[:a.used], vb[:b.used])


def _decode(exe: Any, pairs: list[tuple[KVState, KVState]], steps: int, batch: KVBatch | None = None) -> KVBatch:
    """``steps`` batched steps of greedy tokens, each checked bit for bit against the clones run alone."""
    batch = batch if batch is not None else KVBatch()
    batch.set([p[0] for p in pairs])
    tokens = [(7 * i + 1) % DIMS.vocab for i in range(len(pairs))]
    for _ in range(steps):
        got = _batched(exe, batch, tokens)
        want = _alone(exe, [p[1] for p in pairs], tokens)
        assert got.shape == want.shape and np.array_equal(got, want)
        for st, clone in pairs:
            _same_cache(st, clone)
        tokens = [int(np.argmax(row)) for row in got]
    return batch


@pytest.mark.parametrize("wdtype", ["f32", "q4_0", "q8_0"])
@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_batched_rows_equal_single_runs_bit_for_bit(wdtype: str, kv_dtype: str) -> None:
    exe = _exe(wdtype)
    pairs = [_prefill(exe, p, dtype=kv_dtype) for p in PROMPTS]
    for st, clone in pairs:
        _same_cache(st, clone)
    batch = _decode(exe, pairs, 3)
    assert [st.length for st, _ in pairs] == [len(p) + 3 for p in PROMPTS]
    # rows leave and a new one joins between steps: the same KVBatch object, other states
    pairs = [pairs[2], _prefill(exe, [9, 9, 1, 2, 3, 4], dtype=kv_dtype), pairs[0]]
    assert _decode(exe, pairs, 3, batch) is batch and len(batch) == 3


def test_streamed_weights_batch_rows_too() -> None:
    """Weights staged around their steps (a budgeted Session): the relowered steps read the same state slot."""
    exe = _exe("q4_0", streamed=True)
    assert exe.streaming is not None and exe.streaming.names
    _decode(exe, [_prefill(exe, p) for p in PROMPTS], 3)
    assert exe.streaming.relowered > 0


@pytest.mark.parametrize("positions", ["absolute", "cache"])
def test_windowed_rows_compact_each_on_its_own(positions: str) -> None:
    """Caches of 2 sinks + 6 recent slots: rows compact at different steps (prompts of different lengths), each as
    it would alone (absolute positions compact in prepare, cache positions in the caller's reserve)."""
    exe = _exe("q8_0")
    pairs = [_prefill(exe, p, window=6, sinks=2, positions=positions) for p in PROMPTS]
    _decode(exe, pairs, 9)
    assert all(st.compactions > 0 for st, _ in pairs)
    assert len({st.compactions for st, _ in pairs}) > 1 or len({st.used for st, _ in pairs}) > 1


def test_a_full_row_is_named_and_no_row_moves() -> None:
    exe = _exe()
    pairs = [_prefill(exe, p) for p in PROMPTS[:3]]
    full = exe.new_state(6)
    exe.run(_feeds([1, 2, 3, 4, 5, 6], full), full)
    batch = KVBatch([pairs[0][0], pairs[1][0], full])
    before = [(st.length, st.used, st.pos.copy()) for st in batch.rows]
    feeds = {"tokens": np.array([1, 2, 3]), "positions": np.array([st.length for st in batch.rows])}
    with pytest.raises(KVCacheFull, match=r"row 2 of 3 \(length 6\).*holds 6 tokens"):
        exe.run(feeds, batch)  # positions as reserve(1) gives them, but the last row's reserve would raise too
    for st, (length, used, pos) in zip(batch.rows, before, strict=True):
        assert (st.length, st.used) == (length, used) and np.array_equal(st.pos, pos)
    _decode(exe, pairs, 2, batch)  # the failed step left nothing behind: the rows still match their clones


def test_batch_rows_must_match_the_feeds() -> None:
    exe = _exe()
    a, b = (_prefill(exe, p)[0] for p in PROMPTS[:2])
    batch = KVBatch([a, b])
    assert len(batch) == 2 and "rows=2" in repr(batch) and f"{[a.length, b.length]}" in repr(batch)
    with pytest.raises(KVCacheFull, match="feeds have 3 rows, the KVBatch holds 2"):
        exe.run({"tokens": np.array([1, 2, 3]), "positions": np.array([a.length, b.length, 0])}, batch)
    assert (a.length, b.length) == (len(PROMPTS[0]), len(PROMPTS[1]))
    with pytest.raises(KVCacheFull, match="feeds have 0 rows, the KVBatch holds 0"):
        exe.run({"tokens": np.zeros(0, np.int64), "positions": np.zeros(0, np.int64)}, KVBatch())
    with pytest.raises(BackendError, match="rows 0 and 2 are the same state"):
        batch.set([a, b, a])
    with pytest.raises(BackendError, match="row 1: expected a KV state"):
        KVBatch([a, "b"])  # type: ignore[list-item]
    assert batch.rows == [a, b]


def test_alternating_sequences_does_not_rebind() -> None:
    """A server's pattern: prefill one sequence, decode another alone, decode a batch — each binding is made once."""
    exe = _exe()
    made: list[int] = []
    bind = exe._bind

    def counting(*args: Any) -> Any:
        made.append(1)
        return bind(*args)

    exe._bind = counting
    pairs = [_prefill(exe, [1, 2, 3]) for _ in range(4)]  # one prompt shape
    batch = KVBatch([pairs[0][0], pairs[1][0]])
    for step in range(3):
        st = exe.new_state(64)
        exe.run(_feeds([4, 5, 6], st), st)
        for other in (pairs[step][0], pairs[step + 1][0], pairs[3][1]):
            exe.run(_feeds([7], other), other)
        batch.set([pairs[step][1], pairs[3][0]])
        _batched(exe, batch, [1, 2])
    assert len(made) == 3  # a prefill of 3 tokens, a single decode row, a batch of 2 rows


def test_decode_bindings_outlive_many_prefill_shapes() -> None:
    """Bindings are dropped least recently used first: prompts of 30 lengths come and go between decode steps of
    batches of 2 and 3 rows, which stay bound (dropping the oldest would rebind them, ~30 ms each on SmolLM2)."""
    exe = _exe(max_tokens=32)
    states = [_prefill(exe, [1, 2])[0] for _ in range(3)]
    made: list[int] = []
    bind = exe._bind

    def counting(*args: Any) -> Any:
        made.append(1)
        return bind(*args)

    exe._bind = counting
    batch = KVBatch()
    for length in range(3, 33):  # up to max_tokens: a longer feed lays the arena out again
        st = exe.new_state(64)
        exe.run(_feeds(list(range(length)), st), st)
        for rows in (states[:2], states):
            batch.set(rows)
            _batched(exe, batch, [1, 2, 3][:len(rows)])
    assert len(made) == 30 + 2


def test_the_executable_holds_no_state_after_its_run() -> None:
    """A server releases a finished sequence's cache at once: no binding or pointer cache keeps its state alive."""
    exe = _exe()
    a, b = (_prefill(exe, p)[0] for p in PROMPTS[:2])
    _batched(exe, KVBatch([a, b]), [1, 2])
    exe.run(_feeds([3], a), a)
    gone = [weakref.ref(a), weakref.ref(b)]
    del a, b
    gc.collect()
    assert [ref() for ref in gone] == [None, None]


def test_rows_move_and_are_replaced_in_one_binding() -> None:
    """The cached attention reads each row's cache through per-binding pointer tables (ops_fast.RowTables, rewritten
    only for rows whose sequence changed): the same 3-row binding with its rows reordered, then one replaced by a
    new sequence — every row's bits as alone — and the tables keep no released sequence's cache alive."""
    exe = _exe("q8_0")
    pairs = [_prefill(exe, p, dtype=dt) for p, dt in zip(PROMPTS, ["f32", "f16", "f32", "f16"], strict=True)]
    batch = _decode(exe, pairs[:3], 2)
    _decode(exe, [pairs[2], pairs[0], pairs[1]], 2, batch)
    gone = weakref.ref(pairs[1][0].k[0])
    pairs[1] = _prefill(exe, [8, 1, 8, 1], dtype="f16")
    _decode(exe, [pairs[2], pairs[1], pairs[0]], 2, batch)
    _decode(exe, [pairs[2], pairs[3], pairs[0]], 2, batch)
    gc.collect()
    assert gone() is None


def test_a_state_of_another_executable_is_refused() -> None:
    exe = _exe()
    narrow = _exe(dims=Dims(d=64, heads=4, kv=1, head_dim=16, ff=96, vocab=50))
    shallow = _exe(layers=1)
    mine = exe.new_state(16)
    for foreign, match in ((narrow.new_state(16), r"layer 0 caches keys \[1, 16\].*needs \[2, 16\]"),
                           (shallow.new_state(16), "caches 1 layers.*has 2 cached attention layers")):
        with pytest.raises(BackendError, match=match):
            exe.run(_feeds([1, 2], foreign), foreign)
        with pytest.raises(BackendError, match="another executable"):
            _batched(exe, KVBatch([mine, foreign]), [1, 2])
        assert foreign.length == 0 and mine.length == 0 and mine.pos[0] == -1
    with pytest.raises(BackendError, match="runs with a KVState"):
        exe.run(_feeds([1], mine), object())


def test_capabilities_declare_batched_kv() -> None:
    assert get_backend("cpu").capabilities.batched_kv is True
    assert WebGpuBackend(allow_software=True).capabilities.batched_kv is False


def test_webgpu_refuses_a_batch() -> None:
    pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    gpu = WebGpuBackend(allow_software=True)
    status = gpu.probe()
    if not status.available:
        pytest.skip(f"no WebGPU adapter: {status.reason}")
    graph = llama(1, dims=DIMS)
    exe = gpu.compile(graph, None, _weights(graph, "f32"), max_tokens=4)
    st = exe.new_state(8)
    with pytest.raises(BackendError, match=r"one sequence per pass \(Capabilities.batched_kv is False\)"):
        exe.run({"tokens": np.array([1]), "positions": np.array([0])}, KVBatch([st]))
    assert st.length == 0
    exe.run(_feeds([1], st), st)  # one sequence per pass still runs
    assert st.length == 1

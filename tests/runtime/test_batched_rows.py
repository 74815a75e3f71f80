"""Batched decode on the real SmolLM2 (Q4_1, int8-activation GEMMs, its tied output projection in the precise mode):
four sequences of different prompt lengths, prefilled one by one, then decoded together in one pass per step give
logits bit-identical to each sequence decoded alone, while rows leave and join between steps. The backend's own
tests (tests/backends/test_kv_batch.py) cover the windowed, f16 and error cases on a tiny decoder. Both with the
weights mapped (the file's layout) and pinned (the GEMM weights rewritten into the held form of this CPU's kernels,
where it has one), which must compute the same bits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uaii.backends import KVBatch, get_backend
from uaii.ir import DType
from uaii.kernels import held_form
from uaii.loaders import load_model
from uaii.storage import MmapStore


@pytest.fixture(scope="module", params=["mapped", "pinned"])
def exe(smollm2_path: Path, request: pytest.FixtureRequest) -> Any:
    model = load_model(smollm2_path)
    store = MmapStore(model.weights)
    if request.param == "pinned":
        store.pin(str(t.weight) for t in model.graph.weights if t.weight is not None)
    exe = get_backend("cpu").compile(model.graph, None, store, max_tokens=16)
    yield exe
    exe.close()
    store.close()


def test_pinned_weights_in_their_held_form_compute_the_mapped_bits(smollm2_path: Path) -> None:
    """Prefill and decode of SmolLM2 with its Q4_1 GEMM weights pinned in the held form (q4_1x16 on AVX-512 VBMI)
    against the same weights mapped as the file lays them out: the same logits, bit for bit."""
    model = load_model(smollm2_path)
    refs = [str(t.weight) for t in model.graph.weights if t.weight is not None]
    with MmapStore(model.weights) as mapped, MmapStore(model.weights) as pinned:
        pinned.pin(refs)
        a = get_backend("cpu").compile(model.graph, None, mapped, max_tokens=16)
        b = get_backend("cpu").compile(model.graph, None, pinned, max_tokens=16)
        try:
            held = {pinned.pinned.form_of(r) for r in refs} - {None}
            assert held == ({"q4_1x16"} if held_form(DType.Q4_1, 576) else set())
            assert not {mapped.pinned.form_of(r) for r in refs} - {None}
            sa, sb = a.new_state(64), b.new_state(64)
            ids = [1, 504, 3458, 282, 260, 1345, 30, 2189, 314]
            for feed in (ids, [17], [4096], [42]):
                la, lb = _run(a, feed, sa), _run(b, feed, sb)
                assert np.array_equal(la.view(np.uint32), lb.view(np.uint32))
        finally:
            a.close()
            b.close()


def _run(exe: Any, ids: list[int], state: Any) -> np.ndarray:
    first = state.reserve(len(ids))
    feeds = {"tokens": np.array(ids, np.int64), "positions": np.arange(first, first + len(ids), dtype=np.int64)}
    return exe.run(feeds, state)["logits"].copy()


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_smollm2_batched_rows_equal_single_runs(exe: Any, kv_dtype: str) -> None:
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 49152, n).tolist() for n in (3, 9, 5, 12, 4)]
    states, clones = [], []
    for ids in prompts:
        for group in (states, clones):
            st = exe.new_state(64, dtype=kv_dtype)
            _run(exe, ids, st)
            group.append(st)
    batch = KVBatch()
    rows = [0, 1, 2, 3]
    tokens = {i: int(rng.integers(0, 49152)) for i in range(len(prompts))}
    for step in range(4):
        if step == 2:
            rows = [3, 4, 1]  # sequences 0 and 2 finish, 4 joins: the same batch object
        batch.set([states[i] for i in rows])
        positions = np.array([states[i].reserve(1) for i in rows], np.int64)
        got = exe.run({"tokens": np.array([tokens[i] for i in rows], np.int64), "positions": positions},
                      batch)["logits"].copy()
        for row, i in enumerate(rows):
            alone = _run(exe, [tokens[i]], clones[i])
            assert np.array_equal(got[row], alone[0]), f"step {step}, row {row} (sequence {i})"
            assert states[i].length == clones[i].length
            tokens[i] = int(np.argmax(got[row]))

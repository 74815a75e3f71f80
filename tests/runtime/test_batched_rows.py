"""Batched decode on the real SmolLM2 (Q4_1, int8-activation GEMMs, its tied output projection in the precise mode):
four sequences of different prompt lengths, prefilled one by one, then decoded together in one pass per step give
logits bit-identical to each sequence decoded alone, while rows leave and join between steps. The backend's own
tests (tests/backends/test_kv_batch.py) cover the windowed, f16 and error cases on a tiny decoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uaii.backends import KVBatch, get_backend
from uaii.loaders import load_model
from uaii.storage import MmapStore


@pytest.fixture(scope="module")
def exe(smollm2_path: Path) -> Any:
    model = load_model(smollm2_path)
    store = MmapStore(model.weights)
    exe = get_backend("cpu").compile(model.graph, None, store, max_tokens=16)
    yield exe
    exe.close()
    store.close()


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

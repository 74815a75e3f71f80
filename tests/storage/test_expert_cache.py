"""The expert LRU cache: hits without I/O, LRU eviction in a byte budget, per-layer statistics."""

from __future__ import annotations

from pathlib import Path

import pytest
from storage_helpers import MiB, WeightFile, random_weight_file

from uaii.ir import DType
from uaii.storage import (
    ExpertCache,
    MmapStore,
    StorageError,
    StreamingStore,
    WeightLocation,
    default_layer_of,
)

N_EXPERTS, ROWS, COLS = 8, 32, 1024  # q4_0: 18 KiB per expert


@pytest.fixture
def moe(tmp_path: Path) -> tuple[WeightFile, int]:
    wf = random_weight_file(tmp_path / "moe.gguf", 2 * MiB, 0, seed=11, max_tensor=1)
    per = ROWS * COLS // 32 * 18
    wf.index = {f"moe.gguf#blk.{layer}.ffn_down_exps": WeightLocation(
        str(wf.path), 1001 + layer * N_EXPERTS * per, N_EXPERTS * per, DType.Q4_0, (N_EXPERTS, ROWS, COLS))
        for layer in range(2)}
    return wf, per


def _ref(layer: int, e: int) -> str:
    return f"moe.gguf#blk.{layer}.ffn_down_exps#e={e}"


def test_hits_misses_and_lru_eviction(moe: tuple[WeightFile, int]) -> None:
    wf, per = moe
    with StreamingStore(wf.index, MiB) as store:
        slot = store.buffer_bytes(_ref(0, 0))
        cache = ExpertCache(store, 4 * slot + slot // 2)  # room for four experts
        got = cache.get_many([_ref(0, e) for e in (0, 1, 2)])
        for e, view in zip((0, 1, 2), got, strict=True):
            assert view.tobytes() == wf.expected(store.location(_ref(0, e)))
        read = store.telemetry.snapshot()["bytes_read"]
        assert cache.get(_ref(0, 1)).tobytes() == wf.expected(store.location(_ref(0, 1)))  # a hit: no I/O
        assert store.telemetry.snapshot()["bytes_read"] == read
        cache.get_many([_ref(1, 5), _ref(1, 6)])  # evicts expert 0 of layer 0, the least recently used
        assert _ref(0, 0) not in cache and _ref(0, 1) in cache and _ref(0, 2) in cache
        cache.get(_ref(1, 7))  # then expert 2 (expert 1 was used more recently)
        assert _ref(0, 1) in cache and _ref(0, 2) not in cache
        assert cache.used_bytes <= cache.budget_bytes and len(cache) == 4
        stats = store.stats()["expert_cache"]
        assert (stats["hits"], stats["misses"], stats["evictions"]) == (1, 6, 2)
        assert stats["per_layer"]["0"] == {"hits": 1, "misses": 3, "bytes_read": 3 * per, "hit_rate": 0.25}
        assert stats["per_layer"]["1"]["misses"] == 3 and stats["bytes_read"] == 6 * per


def test_buffers_are_reused_and_requests_stay_in_budget(moe: tuple[WeightFile, int]) -> None:
    wf, _ = moe
    with StreamingStore(wf.index, MiB) as store:
        slot = store.buffer_bytes(_ref(0, 0))
        cache = ExpertCache(store, 3 * slot)
        for step in range(12):
            experts = [(step + k) % N_EXPERTS for k in (0, 1)]
            views = cache.get_many([_ref(step % 2, e) for e in experts] + [_ref(step % 2, experts[0])])
            assert views[0] is views[2]
            assert views[1].tobytes() == wf.expected(store.location(_ref(step % 2, experts[1])))
            assert cache.used_bytes <= cache.budget_bytes
        with pytest.raises(StorageError, match="cannot hold the 4 experts of one request"):
            cache.get_many([_ref(0, e) for e in range(4)])


def test_resize_evicts_the_least_recently_used_and_keeps_its_bounds(moe: tuple[WeightFile, int]) -> None:
    """A session whose cache is what its budget leaves gives bytes back (another sequence, the batched
    executable) and takes them back: resize evicts LRU experts until the cache fits, never below one step's
    experts (min_bytes) nor above the budget it was made with."""
    wf, _ = moe
    with StreamingStore(wf.index, MiB) as store:
        slot = store.buffer_bytes(_ref(0, 0))
        cache = ExpertCache(store, 4 * slot, min_bytes=slot)
        cache.get_many([_ref(0, e) for e in (0, 1, 2, 3)])
        cache.get(_ref(0, 0))  # now 1 is the least recently used
        cache.resize(2 * slot + slot // 2)
        assert len(cache) == 2 and _ref(0, 0) in cache and _ref(0, 3) in cache and cache.used_bytes <= 2.5 * slot
        assert cache.evictions == 2 and cache.budget_bytes == 2 * slot + slot // 2
        cache.resize(4 * slot)  # growing back evicts nothing
        assert len(cache) == 2 and cache.budget_bytes == 4 * slot
        assert cache.get(_ref(0, 0)).tobytes() == wf.expected(store.location(_ref(0, 0)))  # still right, no I/O
        with pytest.raises(StorageError, match="cannot shrink"):
            cache.resize(slot - 1)
        with pytest.raises(StorageError, match="cannot grow"):
            cache.resize(4 * slot + 1)
        cache.resize(slot)
        assert len(cache) == 1 and cache.used_bytes <= slot
        assert [v.tobytes() for v in cache.get_many([_ref(1, 2)])] == [wf.expected(store.location(_ref(1, 2)))]


def test_cache_over_mmap_store(moe: tuple[WeightFile, int]) -> None:
    wf, per = moe
    with MmapStore(wf.index) as store:
        cache = ExpertCache(store, 2 * per)
        assert cache.get(_ref(1, 7)).tobytes() == wf.expected(store.location(_ref(1, 7)))
        assert cache.get(_ref(1, 7)) is cache.get(_ref(1, 7))
        assert store.stats()["expert_cache"]["hit_rate"] == 2 / 3


def test_default_layer_of() -> None:
    assert default_layer_of("m.gguf#blk.12.ffn_up_exps#e=3") == "12"
    assert default_layer_of("m#model.layers.7.mlp.experts.gate_up_proj") == "7"
    assert default_layer_of("m#transformer.h.3.mlp") == "3"
    assert default_layer_of("m#output.weight") == "output.weight"

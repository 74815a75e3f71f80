"""Prefetch order, concurrent acquire, the staging pool's limits, pins and telemetry."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
from storage_helpers import MiB, WeightFile, random_weight_file

from uaii.ir import DType
from uaii.storage import StagingError, StorageError, StreamingStore, WeightLocation


def _sequential(tmp_path: Path, n: int, size: int) -> WeightFile:
    wf = random_weight_file(tmp_path / "seq.bin", n * size + 100, 0, seed=5, max_tensor=1)
    wf.index = {f"seq#t{i}": WeightLocation(str(wf.path), 100 + i * size, size, DType.U8, (size,))
                for i in range(n)}
    return wf


def _done_seq(store: StreamingStore, ref: str) -> int:
    return store._pool.done_seq(store._staged[ref].job)


def test_reads_complete_in_plan_order(tmp_path: Path) -> None:
    wf = _sequential(tmp_path, 8, 256 * 1024)
    refs = list(wf.index)
    with StreamingStore(wf.index, 4 * MiB, io_threads=1, max_inflight=8) as s:
        s.prefetch(refs)
        views = [s.acquire(r) for r in refs]
        assert [_done_seq(s, r) for r in refs] == sorted(_done_seq(s, r) for r in refs)
        for r, v in zip(refs, views, strict=True):
            assert v.tobytes() == wf.expected(wf.index[r])


def test_acquire_jumps_the_queue(tmp_path: Path) -> None:
    wf = _sequential(tmp_path, 24, 2 * MiB)
    refs = list(wf.index)
    with StreamingStore(wf.index, 64 * MiB, io_threads=1, chunk_bytes=2 * MiB, max_inflight=24) as s:
        s.prefetch(refs)
        last = s.acquire(refs[-1])
        assert last.tobytes() == wf.expected(wf.index[refs[-1]])
        for r in refs[:-1]:
            s.acquire(r)
        assert _done_seq(s, refs[-1]) < _done_seq(s, refs[12])


def test_read_ahead_depth_and_staging_space_bound_the_queue(tmp_path: Path) -> None:
    wf = _sequential(tmp_path, 10, MiB)
    refs = list(wf.index)
    with StreamingStore(wf.index, 4 * MiB + 8192, max_inflight=2) as s:
        s.prefetch(refs)
        staging = s.stats()["staging"]
        assert staging["staged"] == 2 and staging["queued"] == 8
        for r in refs:  # the consumer drains the queue; no deadlock, everything arrives intact
            assert s.acquire(r).tobytes() == wf.expected(wf.index[r])
            s.release(r)
        after = s.stats()["staging"]
        assert (after["used"], after["staged"], after["queued"]) == (0, 0, 0)
        assert after["peak"] <= 3 * (MiB + 8192)  # two reads ahead plus the one held


def test_concurrent_acquire(weights: WeightFile) -> None:
    refs = list(weights.index)
    errors: list[BaseException] = []
    with StreamingStore(weights.index, 8 * MiB, max_inflight=6, chunk_bytes=128 * 1024) as s:
        s.prefetch(refs[::2])

        def worker(seed: int) -> None:
            rng = np.random.default_rng(seed)
            try:
                for i in rng.permutation(len(refs))[:30]:
                    ref = refs[int(i)]
                    while True:
                        try:
                            view = s.acquire(ref)
                            break
                        except StagingError:  # the other threads hold the pool: wait for their releases
                            threading.Event().wait(0.001)
                    assert view.tobytes() == weights.expected(weights.index[ref])
                    s.release(ref)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert s.stats()["staging"]["held"] == 0


def test_same_ref_acquired_twice_is_released_twice(weights: WeightFile) -> None:
    ref = next(iter(weights.index))
    with StreamingStore(weights.index, 4 * MiB) as s:
        a, b = s.acquire(ref), s.acquire(ref)
        assert a is b
        s.release(ref)
        assert s.stats()["staging"]["held"] == 1
        s.release(ref)
        assert s.stats()["staging"]["used"] == 0
        with pytest.raises(StorageError, match="neither acquired nor prefetched"):
            s.release(ref)


def test_tensor_larger_than_the_pool_is_rejected_by_name(tmp_path: Path) -> None:
    wf = _sequential(tmp_path, 2, 3 * MiB)
    with StreamingStore(wf.index, 2 * MiB) as s:
        msg = r"tensor 'seq#t1' \(3145728 bytes, \d+ with read alignment\) is larger than the whole staging"
        with pytest.raises(StagingError, match=msg):
            s.prefetch(["seq#t1"])
        with pytest.raises(StagingError, match=msg):
            s.acquire("seq#t1")


def test_pool_exhaustion_cancels_prefetches_then_fails_clearly(tmp_path: Path) -> None:
    wf = _sequential(tmp_path, 6, MiB)
    refs = list(wf.index)
    with StreamingStore(wf.index, 3 * MiB + 3 * 8192, max_inflight=8) as s:
        s.prefetch(refs[1:])  # fills the pool with reads ahead
        first = s.acquire(refs[0])  # not prefetched: a prefetch is cancelled to make room
        assert first.tobytes() == wf.expected(wf.index[refs[0]])
        held = [s.acquire(r) for r in refs[1:3]]
        assert [h.tobytes() for h in held] == [wf.expected(wf.index[r]) for r in refs[1:3]]
        msg = r"staging pool exhausted: 'seq#t3' needs \d+ bytes but .* held by 3 acquired tensors \('seq#t1'"
        with pytest.raises(StagingError, match=msg):
            s.acquire(refs[3])
        s.release(refs[0])
        assert s.acquire(refs[3]).tobytes() == wf.expected(wf.index[refs[3]])


def test_release_of_a_prefetch_drops_it(tmp_path: Path) -> None:
    wf = _sequential(tmp_path, 4, MiB)
    refs = list(wf.index)
    with StreamingStore(wf.index, 8 * MiB, max_inflight=1) as s:
        s.prefetch(refs)
        s.release(refs[0])  # submitted, never acquired: cancelled
        s.release(refs[3])  # still queued: removed
        st = s.stats()["staging"]
        assert st["staged"] == 1 and st["queued"] == 1
        assert s.acquire(refs[3]).tobytes() == wf.expected(wf.index[refs[3]])


def _union(locs: Iterable[WeightLocation]) -> int:
    """Bytes covered by ``locs`` (one file; the random test tensors may overlap)."""
    total, end = 0, -1
    for loc in sorted(locs, key=lambda x: x.offset):
        total += max(loc.end - max(end, loc.offset), 0)
        end = max(end, loc.end)
    return total


def test_pinned_weights_are_served_without_io(weights: WeightFile) -> None:
    refs = list(weights.index)[:5]
    with StreamingStore(weights.index, 2 * MiB, pin_budget_bytes=16 * MiB) as s:
        s.pin(refs)
        before = s.telemetry.snapshot()
        for r in refs:
            assert s.acquire(r).tobytes() == weights.expected(weights.index[r])
            s.release(r)  # no-op for pins
        after = s.telemetry.snapshot()
        assert after["bytes_read"] == before["bytes_read"] and after["pinned_hits"] == 5
        assert s.pinned.nbytes >= _union(weights.index[r] for r in refs) and len(s.pinned) == 5
        s.unpin(refs[:1])
        assert refs[0] not in s.pinned
    with StreamingStore(weights.index, 4 * MiB) as s:  # pinned while staged: the staged copy is still released
        s.acquire(refs[0])
        s.pin(refs[:1])
        s.release(refs[0])
        assert s.stats()["staging"]["used"] == 0
        s.release(refs[0])  # now a no-op: pinned
        s.prefetch(refs[1:3])
        s.pin(refs[1:3])  # prefetched, then pinned: the staged copies are dropped
        assert s.stats()["staging"]["staged"] == 0
    with StreamingStore(weights.index, MiB, pin_budget_bytes=4096) as s, \
            pytest.raises(StorageError, match="would exceed the pin budget of 4096 bytes"):
        s.pin(refs)


def test_adjacent_pins_are_read_together_into_one_buffer(tmp_path: Path) -> None:
    """Tensors laid out one after the other (a pinned layer; GGUF pads them to 32 bytes) are pinned with one read
    into one buffer: no page of slack per tensor (a 2 KiB norm scale alone held 4-8 KiB), one I/O request."""
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, 1 * MiB, dtype=np.uint8)
    path = tmp_path / "layer.bin"
    data.tofile(path)
    sizes = [2560, 450560, 112640, 1024, 2560, 901120 // 8]
    index, off = {}, 4096 + 96
    for i, n in enumerate(sizes):
        index[f"layer.bin#t{i}"] = WeightLocation(str(path), off, n, DType.U8, (n,))
        off += -(-n // 32) * 32  # 32-byte alignment padding between tensors
    far = WeightLocation(str(path), 900_000, 3000, DType.U8, (3000,))  # not adjacent: a run of its own
    index["layer.bin#far"] = far
    with StreamingStore(index, MiB) as s:
        s.pin(list(index))
        st = s.stats()
        assert st["jobs_done"] == 2
        for ref, loc in index.items():
            got = s.acquire(ref)
            assert got.tobytes() == data[loc.offset:loc.end].tobytes() and not got.flags.writeable
        span = off - (4096 + 96)
        assert s.pinned.nbytes <= -(-span // 4096) * 4096 + 4096 + 8192  # one run + the far tensor's page(s)
        assert s.pinned.nbytes < sum(-(-n // 4096) * 4096 for n in sizes)  # what one buffer per tensor held
        s.unpin(["layer.bin#t0"])
        assert s.acquire("layer.bin#t1").tobytes() == data[index["layer.bin#t1"].offset:
                                                            index["layer.bin#t1"].end].tobytes()


def test_telemetry_counts_bytes_per_token(weights: WeightFile) -> None:
    refs = list(weights.index)
    with StreamingStore(weights.index, 4 * MiB) as s:
        for token in range(3):
            s.begin_token()
            chosen = refs[token * 5:(token + 1) * 5]
            s.prefetch(chosen)
            for r in chosen:
                s.acquire(r)
                s.release(r)
            d = s.end_token()
            payload = sum(weights.index[r].nbytes for r in chosen)
            assert payload <= d["bytes_read"] <= payload + 5 * 2 * 4096
            assert d["bytes_served"] == payload
        stats = s.stats()
        assert stats["tokens"] == 3 and stats["bytes_per_token_last"] == d["bytes_read"]
        assert stats["read_gbps"] > 0 and stats["io_busy_s"] > 0 and stats["errors"] == 0
        assert set(stats["staging"]) >= {"capacity", "used", "peak", "pinned_bytes"}


def test_close_keeps_views_readable(weights: WeightFile) -> None:
    ref = next(iter(weights.index))
    s = StreamingStore(weights.index, 4 * MiB)
    s.prefetch(weights.index)
    view = s.acquire(ref)
    s.close()
    s.close()
    assert view.tobytes() == weights.expected(weights.index[ref])
    with pytest.raises(StorageError, match="closed"):
        s.acquire(ref)

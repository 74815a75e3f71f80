"""Streaming and mmap hand out byte-identical tensors: unaligned ranges, many chunks, experts, raw files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from storage_helpers import MiB, WeightFile, random_weight_file, write_bytes

from uaii.ir import DType
from uaii.storage import (
    MmapStore,
    StreamingStore,
    WeightLocation,
    expert_location,
    locate_raw_file,
    open_store,
)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
def test_streaming_matches_mmap_and_the_file(weights: WeightFile, direct: bool) -> None:
    with StreamingStore(weights.index, 4 * MiB, max_inflight=4, chunk_bytes=64 * 1024, io_threads=3,
                        direct=direct) as streaming, MmapStore(weights.index) as mapped:
        streaming.prefetch(weights.index)
        for ref, loc in weights.index.items():
            a = streaming.acquire(ref)
            b = mapped.acquire(ref)
            assert a.tobytes() == b.tobytes() == weights.expected(loc), ref
            assert a.dtype == b.dtype and a.shape == b.shape
            assert not a.flags.writeable and not b.flags.writeable
            streaming.release(ref)
            mapped.release(ref)
        expected_mode = "direct" if direct else "buffered"
        if direct and streaming.io_mode(str(weights.path)) != "direct":
            pytest.skip(f"the file system of {weights.path} refuses O_DIRECT")
        assert streaming.io_mode(str(weights.path)) == expected_mode
        stats = streaming.stats()
        assert stats["chunks_done"] > stats["jobs_done"]  # large tensors were split across threads
        assert stats["bytes_served"] == sum(loc.nbytes for loc in weights.index.values())


def test_dtype_views_and_packed_blocks(tmp_path: Path) -> None:
    values = np.arange(24, dtype="<f4").reshape(2, 3, 4)
    q = np.arange(2 * 18, dtype=np.uint8)  # two q4_0 blocks, kept packed
    blob = np.concatenate([np.zeros(7, np.uint8), values.view(np.uint8).ravel(), q])
    write_bytes(tmp_path / "m.bin", blob)
    index = {"m#w": WeightLocation(str(tmp_path / "m.bin"), 7, 96, DType.F32, (2, 3, 4)),
             "m#q": WeightLocation(str(tmp_path / "m.bin"), 103, 36, DType.Q4_0, (64,))}
    for store in (open_store(index), open_store(index, staging_bytes=MiB)):
        with store:
            w = store.acquire("m#w")
            assert w.dtype == np.float32 and w.shape == (2, 3, 4)
            np.testing.assert_array_equal(w, values)
            packed = store.acquire("m#q")
            assert packed.dtype == np.uint8 and packed.shape == (36,)
            assert store.location("m#q").dtype is DType.Q4_0
            np.testing.assert_array_equal(packed, q)
            store.release("m#w")
            store.release("m#q")


def test_expert_slices_and_raw_files(tmp_path: Path) -> None:
    wf = random_weight_file(tmp_path / "moe.bin", 3 * MiB, 1, seed=7, max_tensor=64)
    n_experts, rows, cols = 8, 16, 1024
    bank = WeightLocation(str(wf.path), 4097, n_experts * rows * cols // 32 * 18, DType.Q4_0, (8, rows, cols))
    raw = np.random.default_rng(3).standard_normal((33, 17)).astype("<f2")
    raw.tofile(tmp_path / "norm.bin")
    index = {"moe.bin#blk.1.ffn_up_exps": bank,
             "norm.bin": locate_raw_file("norm.bin", tmp_path, dtype=DType.F16, shape=(33, 17))}
    refs = [f"moe.bin#blk.1.ffn_up_exps#e={e}" for e in range(n_experts)] + ["norm.bin"]
    with StreamingStore(index, MiB, chunk_bytes=8192) as s, MmapStore(index) as m:
        s.prefetch(refs)
        for e, ref in enumerate(refs[:-1]):
            loc = expert_location(bank, e)
            assert s.location(ref) == loc
            assert s.acquire(ref).tobytes() == m.acquire(ref).tobytes() == wf.expected(loc)
            s.release(ref)
        np.testing.assert_array_equal(s.acquire("norm.bin"), raw)
        np.testing.assert_array_equal(m.acquire("norm.bin"), raw)


def test_zero_byte_tensor_and_file_end(tmp_path: Path) -> None:
    write_bytes(tmp_path / "t.bin", (np.arange(5000) % 251).astype(np.uint8))
    data = (tmp_path / "t.bin").read_bytes()
    index = {"t#empty": WeightLocation(str(tmp_path / "t.bin"), 5000, 0, DType.F32, (0, 3)),
             "t#tail": WeightLocation(str(tmp_path / "t.bin"), 4999, 1, DType.U8, (1,)),
             "t#all": WeightLocation(str(tmp_path / "t.bin"), 0, 5000, DType.U8, (5000,))}
    with StreamingStore(index, 64 * 1024) as s, MmapStore(index) as m:
        for store in (s, m):
            assert store.acquire("t#empty").shape == (0, 3)
            assert store.acquire("t#tail").tobytes() == data[-1:]
            assert store.acquire("t#all").tobytes() == data

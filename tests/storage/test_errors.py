"""Failures are StorageErrors naming file, offset and size; short reads and EINTR are retried, never data."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from storage_helpers import MiB, WeightFile, write_bytes

from uaii.ir import DType, UaiiError
from uaii.storage import MmapStore, StorageError, StreamingStore, WeightLocation

MakeStore = Callable[[dict[str, WeightLocation]], StreamingStore | MmapStore]


@pytest.fixture(params=["streaming", "mmap"])
def make_store(request: pytest.FixtureRequest) -> MakeStore:
    def make(index: dict[str, WeightLocation]) -> StreamingStore | MmapStore:
        return StreamingStore(index, MiB) if request.param == "streaming" else MmapStore(index)
    return make


def test_missing_file(tmp_path: Path, make_store: MakeStore) -> None:
    index = {"gone#w": WeightLocation(str(tmp_path / "gone.bin"), 0, 4, DType.F32, (1,))}
    with make_store(index) as s, pytest.raises(StorageError, match=r"gone\.bin.*No such file.*'gone#w'"):
        s.acquire("gone#w")


def test_ref_not_in_index(make_store: MakeStore) -> None:
    with make_store({}) as s, pytest.raises(StorageError, match="'m#w' is not in the location index"):
        s.prefetch(["m#w"])


def test_offset_past_end_of_file(tmp_path: Path, make_store: MakeStore) -> None:
    write_bytes(tmp_path / "m.bin", np.zeros(1000, np.uint8))
    index = {"m#w": WeightLocation(str(tmp_path / "m.bin"), 0x3e0, 64, DType.U8, (64,))}
    with make_store(index) as s, pytest.raises(StorageError) as info:
        s.acquire("m#w")
    assert isinstance(info.value, UaiiError)
    msg = str(info.value)
    assert msg.startswith("[storage] ") and "m.bin" in msg and "offset 0x3e0" in msg and "64 bytes" in msg
    assert "(size 0x3e8)" in msg
    assert info.value.offset == 0x3e0 and info.value.nbytes == 64


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
def test_file_truncated_after_open_is_an_error_not_data(tmp_path: Path, direct: bool) -> None:
    path = tmp_path / "m.bin"
    write_bytes(path, np.ones(3 * MiB, np.uint8))
    index = {"m#head": WeightLocation(str(path), 0, 10, DType.U8, (10,)),
             "m#tail": WeightLocation(str(path), 2 * MiB + 5, MiB - 5, DType.U8, (MiB - 5,))}
    with StreamingStore(index, 4 * MiB, direct=direct) as s:
        s.acquire("m#head")  # opens the file while it is whole
        os.truncate(path, 2 * MiB + 100)
        msg = r"reading 'm#tail' \(1048571 bytes at offset 0x200005\) failed: the file ended"
        with pytest.raises(StorageError, match=msg):
            s.acquire("m#tail")
        assert s.stats()["errors"] == 1
        with pytest.raises(StorageError, match="file ended"):  # the failed entry was dropped; retry fails
            s.acquire("m#tail")


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
@pytest.mark.parametrize("fault", ["short", "eintr"])
def test_short_reads_and_eintr_are_retried(weights: WeightFile, direct: bool, fault: str) -> None:
    refs = sorted(weights.index, key=lambda r: -weights.index[r].nbytes)[:6]
    with StreamingStore(weights.index, 16 * MiB, chunk_bytes=256 * 1024, direct=direct) as s:
        s._pool.inject_fault(fault, 40)
        s.prefetch(refs)
        for r in refs:
            assert s.acquire(r).tobytes() == weights.expected(weights.index[r])
        counters = s.telemetry.snapshot()
        assert counters["short_reads" if fault == "short" else "eintr_retries"] >= 20
        assert counters["errors"] == 0

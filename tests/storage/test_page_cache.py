"""Streaming reads do not grow the page cache (O_DIRECT, or buffered pread + POSIX_FADV_DONTNEED)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from storage_helpers import MiB, filesystem_type, write_bytes

from uaii.ir import DType
from uaii.storage import MmapStore, StreamingStore, WeightLocation, drop_page_cache, resident_bytes

SIZE = 64 * MiB


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pagecache") / "big.bin"
    fstype = filesystem_type(path.parent)
    if fstype in ("tmpfs", "ramfs", "overlay", "unknown"):
        pytest.skip(f"{path.parent} is on {fstype}: its pages are the file itself (or DONTNEED is not "
                    "honoured), so page-cache residency cannot be measured there")
    write_bytes(path, np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8))
    return path


def _index(path: Path) -> dict[str, WeightLocation]:
    step = 5 * MiB + 123  # unaligned tensors of about 5 MiB
    sizes = {off: min(step, SIZE - off) for off in range(0, SIZE, step)}
    return {f"big#t{i}": WeightLocation(str(path), off, n, DType.U8, (n,))
            for i, (off, n) in enumerate(sizes.items())}


def _evicted(path: Path) -> int:
    drop_page_cache(path)
    left = resident_bytes(path)
    if left > 4 * MiB:
        pytest.skip(f"the kernel kept {left} bytes of {path} cached after DONTNEED; cannot measure")
    return left


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "fadvise"])
def test_streaming_leaves_the_page_cache_small(big_file: Path, direct: bool) -> None:
    before = _evicted(big_file)
    index = _index(big_file)
    with StreamingStore(index, 24 * MiB, direct=direct) as s:
        s.prefetch(index)
        for ref in index:
            s.acquire(ref)
            s.release(ref)
        assert s.stats()["bytes_read"] >= SIZE
        mode = s.io_mode(str(big_file))
    assert mode == ("direct" if direct else "buffered") or not direct
    assert resident_bytes(big_file) - before <= 2 * MiB, mode


def test_resident_bytes_sees_mmap_reads(big_file: Path) -> None:
    before = _evicted(big_file)
    index = _index(big_file)
    with MmapStore(index) as m:
        total = sum(int(m.acquire(r).sum(dtype=np.uint64)) >= 0 for r in list(index)[:4])
    assert total == 4
    assert resident_bytes(big_file) - before >= 15 * MiB

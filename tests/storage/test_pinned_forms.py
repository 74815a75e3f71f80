"""A pinned tensor rewritten in place into a backend's held form (PinnedSet.reform): served in that form only to
whoever names it, never to a consumer that expects the file's layout, and left intact when the rewrite fails."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from storage_helpers import MiB, WeightFile

from uaii.ir import DType
from uaii.storage import MmapStore, StorageError, StreamingStore, WeightLocation


def _bytes(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def _reverse(buf: np.ndarray) -> None:  # a stand-in form: the bytes in reverse order
    b = _bytes(buf)
    b[...] = b[::-1].copy()


def _stores(weights: WeightFile) -> list[StreamingStore | MmapStore]:
    return [StreamingStore(weights.index, 2 * MiB), MmapStore(weights.index)]


@pytest.mark.parametrize("kind", [0, 1], ids=["streaming", "mmap"])
def test_a_pinned_tensor_is_rewritten_in_place_and_served_in_its_form(weights: WeightFile, kind: int) -> None:
    names = list(weights.index)
    refs = [names[0], names[2], names[3]]  # no two of them overlap in the file (t1 overlaps t3)
    with _stores(weights)[kind] as s:
        s.pin(refs)
        held_before = s.pinned.nbytes
        ref = refs[2]  # a block-quantized tensor: the store hands out its raw bytes
        want = np.frombuffer(weights.expected(weights.index[ref]), np.uint8)
        assert s.pinned.reform(ref, "rev", _reverse)
        assert s.pinned.reform(ref, "rev", _reverse)  # already so: nothing rewritten twice
        assert s.pinned.form_of(ref) == "rev" and s.pinned.nbytes == held_before  # in place: no second copy
        got = s.acquire(ref, form="rev")
        assert np.array_equal(_bytes(got), want[::-1]) and not got.flags.writeable
        with pytest.raises(StorageError, match="held form 'rev', not in the file's layout"):
            s.acquire(ref)
        with pytest.raises(StorageError, match="not in the held form 'other'"):
            s.acquire(ref, form="other")
        assert not s.pinned.reform(ref, "other", _reverse)  # one form per tensor
        for r in refs[:2]:  # the others keep their bytes
            assert s.acquire(r).tobytes() == weights.expected(weights.index[r])
        s.unpin([ref])
        assert s.pinned.form_of(ref) is None


@pytest.mark.parametrize("kind", [0, 1], ids=["streaming", "mmap"])
def test_what_cannot_be_rewritten_is_refused(weights: WeightFile, kind: int) -> None:
    refs = list(weights.index)[:3]
    with _stores(weights)[kind] as s:
        s.pin(refs[:2])
        assert not s.pinned.reform(refs[2], "rev", _reverse)  # not pinned
        with pytest.raises(StorageError, match="not pinned"):
            s.acquire(refs[2], form="rev")
        s.acquire(refs[0])  # handed out as it is: a consumer may hold that view
        assert not s.pinned.reform(refs[0], "rev", _reverse)
        assert s.acquire(refs[0]).tobytes() == weights.expected(weights.index[refs[0]])


def test_a_tensor_sharing_bytes_with_another_keeps_its_layout(tmp_path: Path) -> None:
    """Two entries of a file over overlapping bytes are pinned into one buffer: rewriting one would change the other,
    so neither is rewritten."""
    data = np.random.default_rng(2).integers(0, 256, 64 * 1024, dtype=np.uint8)
    path = tmp_path / "w.bin"
    data.tofile(path)
    index = {"w.bin#a": WeightLocation(str(path), 4096, 8192, DType.U8, (8192,)),
             "w.bin#b": WeightLocation(str(path), 8192, 8192, DType.U8, (8192,)),
             "w.bin#c": WeightLocation(str(path), 20480, 4096, DType.U8, (4096,))}
    with StreamingStore(index, MiB) as s:
        s.pin(list(index))
        assert not s.pinned.reform("w.bin#a", "rev", _reverse) and not s.pinned.reform("w.bin#b", "rev", _reverse)
        assert s.pinned.reform("w.bin#c", "rev", _reverse)  # its neighbour in the same buffer, not overlapping
        for ref in ("w.bin#a", "w.bin#b"):
            loc = index[ref]
            assert s.acquire(ref).tobytes() == data[loc.offset:loc.end].tobytes()


@pytest.mark.parametrize("kind", [0, 1], ids=["streaming", "mmap"])
def test_a_failed_rewrite_serves_the_files_bytes_again(weights: WeightFile, kind: int) -> None:
    """A rewrite that fails half way leaves bytes in no layout: the tensor is unpinned, and read from the file."""
    ref = list(weights.index)[4]
    with _stores(weights)[kind] as s:
        s.pin([ref])

        def half_then_fail(buf: np.ndarray) -> None:
            _bytes(buf)[: buf.nbytes // 2] = 0
            raise RuntimeError("out of memory")

        with pytest.raises(RuntimeError, match="out of memory"):
            s.pinned.reform(ref, "rev", half_then_fail)
        assert ref not in s.pinned and s.pinned.nbytes == 0 and s.pinned.form_of(ref) is None
        assert s.acquire(ref).tobytes() == weights.expected(weights.index[ref])
        s.release(ref)


def test_rows_of_a_pinned_tensor_are_a_view_of_its_resident_bytes(weights: WeightFile) -> None:
    """``ref@rows=A:B`` of a pinned tensor (a device backend streaming it in row pieces) is served from memory:
    the rows' bytes, no staged read (a staging pool far smaller than the rows suffices), a release that balances;
    a held form is never served as rows of the file's layout."""
    from uaii.storage import rows_ref

    ref = next(n for n, loc in weights.index.items() if len(loc.shape) >= 1 and loc.nbytes > 64 * 1024)
    part = rows_ref(ref, 2, weights.index[ref].shape[0] - 2)
    with StreamingStore(weights.index, 4096) as s:
        s.pin([ref])
        rows = s.location(part)
        got = s.acquire(part)
        assert _bytes(np.ascontiguousarray(got)).tobytes() == weights.expected(rows)
        assert s.telemetry.snapshot()["pinned_hits"] >= 1
        s.release(part)
        assert rows.nbytes > 4096  # the rows could not have been staged through this pool
        assert not s.pinned.reform(ref, "rev", _reverse)  # its bytes were handed out: never rewritten after
    with StreamingStore(weights.index, 4096) as s:
        s.pin([ref])
        assert s.pinned.reform(ref, "rev", _reverse)
        with pytest.raises(StorageError):  # rows of a rewritten tensor: a staged read, larger than the pool
            s.acquire(part)

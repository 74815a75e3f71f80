"""Where a weight's bytes are: the location index the stores read through.

A loader maps every weight reference string (``path#tensor``, ``path#tensor#e=N``, a raw file ``path``) to a
:class:`WeightLocation`: the resolved file, the absolute byte offset, the byte count, dtype and shape.
uaii-storage never parses model formats; it only reads these ranges.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from uaii.ir import DType, WeightRef, tensor_nbytes
from uaii.ir.errors import UaiiError
from uaii.storage.errors import StorageError


@dataclass(frozen=True, slots=True)
class WeightLocation:
    """``nbytes`` bytes at ``offset`` in ``path`` hold a ``dtype`` tensor of ``shape`` (outermost first)."""

    path: str
    offset: int
    nbytes: int
    dtype: DType
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.offset < 0 or self.nbytes < 0:
            raise StorageError(f"{self.path}: negative offset {self.offset} or size {self.nbytes}")
        try:
            expected = tensor_nbytes(self.dtype, self.shape)
        except UaiiError as exc:
            raise StorageError(f"{self.path}: tensor at offset {self.offset:#x}: {exc}") from None
        if expected != self.nbytes:
            raise StorageError(f"{self.path}: a {self.dtype.value} tensor of shape {list(self.shape)} needs "
                               f"{expected} bytes, the location says {self.nbytes} (offset {self.offset:#x})")

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


LocationIndex = Mapping[str, Any]
"""reference string → :class:`WeightLocation` (or any object with path/file, offset, nbytes, dtype, shape)."""


def as_location(obj: Any) -> WeightLocation:
    """A :class:`WeightLocation` from itself or from a loader record with the same fields (or ``file``)."""
    if isinstance(obj, WeightLocation):
        return obj
    path = getattr(obj, "path", None) or getattr(obj, "file", None)
    if path is None:
        raise StorageError(f"location index entry {obj!r} has neither 'path' nor 'file'")
    return WeightLocation(str(path), int(obj.offset), int(obj.nbytes), DType.parse(obj.dtype),
                          tuple(int(d) for d in obj.shape))


def expert_location(bank: WeightLocation, n: int) -> WeightLocation:
    """Expert ``n`` of a packed expert bank: the bank's outermost dimension is the expert count."""
    if not bank.shape:
        raise StorageError(f"{bank.path}: the expert bank at offset {bank.offset:#x} is a scalar; "
                           "it has no experts")
    count = bank.shape[0]
    if not 0 <= n < count:
        raise StorageError(f"{bank.path}: the expert bank at offset {bank.offset:#x} has {count} experts; "
                           f"expert {n} does not exist")
    per = bank.nbytes // count
    return WeightLocation(bank.path, bank.offset + n * per, per, bank.dtype, bank.shape[1:])


def locate_raw_file(ref: str | WeightRef, base_dir: str | os.PathLike[str] | None = None,
                    sandbox: str | os.PathLike[str] | None = None, *, dtype: DType | str,
                    shape: Sequence[int]) -> WeightLocation:
    """The location of a raw-file reference (no ``#``): the whole file, which must hold exactly the tensor."""
    wr = ref if isinstance(ref, WeightRef) else WeightRef.parse(ref)
    if not wr.is_raw_file:
        raise StorageError(f"weight reference {str(wr)!r} names a tensor inside a container, not a raw file")
    path = wr.resolve(base_dir, sandbox)
    dt = DType.parse(dtype)
    shp = tuple(int(d) for d in shape)
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        raise StorageError(f"cannot stat raw weight file {path} for {str(wr)!r}: {exc.strerror}",
                           path=str(path)) from None
    want = tensor_nbytes(dt, shp)
    if size != want:
        raise StorageError(f"raw weight file {path} holds {size} bytes; a {dt.value} tensor of shape "
                           f"{list(shp)} needs {want}", path=str(path), nbytes=want)
    return WeightLocation(str(path), 0, size, dt, shp)


ROWS = "@rows="
"""``ref@rows=A:B``: rows [A, B) of the tensor ``ref`` (outermost dimension), e.g. a chunk of an lm_head."""


def rows_ref(ref: str | WeightRef, start: int, stop: int) -> str:
    """The reference of rows [start, stop) of ``ref`` (see :data:`ROWS`)."""
    return f"{ref}{ROWS}{start}:{stop}"


def parse_rows_ref(key: str) -> tuple[str, int, int] | None:
    """``(ref, A, B)`` of a ``ref@rows=A:B`` reference, or None when ``key`` is not one."""
    if ROWS not in key:
        return None
    base, _, span = key.rpartition(ROWS)
    a, _, b = span.partition(":")
    if a.isdigit() and b.isdigit():
        return base, int(a), int(b)
    return None


def row_range(loc: WeightLocation, start: int, stop: int) -> WeightLocation:
    """Rows [start, stop) of a tensor: contiguous bytes, also for block types (a row is whole blocks)."""
    if not loc.shape or not 0 <= start < stop <= loc.shape[0]:
        raise StorageError(f"{loc.path}: rows {start}:{stop} of the tensor at offset {loc.offset:#x} with shape "
                           f"{list(loc.shape)} do not exist")
    row = loc.nbytes // loc.shape[0]
    return WeightLocation(loc.path, loc.offset + start * row, (stop - start) * row, loc.dtype,
                          (stop - start, *loc.shape[1:]))


def lookup(index: LocationIndex, ref: str | WeightRef) -> WeightLocation:
    """The location of ``ref``; an ``#e=N`` reference missing from the index is sliced from its bank, and
    ``ref@rows=A:B`` is rows [A, B) of ``ref``."""
    key = str(ref)
    entry = _get(index, key)
    if entry is not None:
        return as_location(entry)
    rows = parse_rows_ref(key)
    if rows is not None:
        return row_range(lookup(index, rows[0]), rows[1], rows[2])
    try:
        wr = ref if isinstance(ref, WeightRef) else WeightRef.parse(key)
    except UaiiError as exc:
        raise StorageError(f"weight reference {key!r} is not in the location index and is malformed: "
                           f"{exc}") from None
    if wr.expert is not None:
        bank = _get(index, str(WeightRef(wr.path, wr.tensor)))
        if bank is not None:
            return expert_location(as_location(bank), wr.expert)
    raise StorageError(f"weight reference {key!r} is not in the location index ({len(index)} entries)")


def _get(index: LocationIndex, key: str) -> Any:
    try:
        return index[key]
    except (KeyError, UaiiError):  # a loader's index may raise its own UaiiError for a missing key
        return None

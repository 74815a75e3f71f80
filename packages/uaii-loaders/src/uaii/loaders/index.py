"""The weight index: every weight reference of a model → where its bytes are.

Loaders never copy weights into the IR. A graph names its weights by :class:`~uaii.ir.WeightRef`
(``file#tensor``, ``file#tensor#e=N``); the index says, for each reference, which file holds the bytes, at
which absolute offset, how many bytes, and the dtype and shape they encode. The storage layer reads through
this index (``pread`` of ``nbytes`` at ``offset``), so the numbers here are exact.

Reference paths are relative to the model directory (``base_dir``), which keeps graphs portable.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from uaii.ir import DType, WeightRef

from .errors import LoaderError


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor's bytes in a file. ``shape`` is outermost-first (numpy order) for every format."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    file: str  # absolute path of the file that holds the bytes
    offset: int  # absolute byte offset of the first byte in that file
    nbytes: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    def expert(self, e: int) -> TensorInfo:
        """Expert ``e`` of a packed bank: the outermost dimension, one contiguous slice."""
        n = self.shape[0] if self.shape else 0
        if not 0 <= e < n:
            raise LoaderError(f"tensor {self.name!r} has {n} experts; expert {e} does not exist")
        per = self.nbytes // n
        return replace(self, shape=self.shape[1:], offset=self.offset + e * per, nbytes=per)


class WeightIndex(Mapping[str, TensorInfo]):
    """``str(WeightRef)`` → :class:`TensorInfo`. Keys are the exact strings the graph's weight tensors "
      "carry."""

    def __init__(self, base_dir: str | os.PathLike[str],
                 entries: Mapping[str, TensorInfo] | None = None) -> None:
        self.base_dir = Path(base_dir).resolve()
        self._entries: dict[str, TensorInfo] = dict(entries or {})
        # bank reference → expert count, for banks with no single location (one tensor per expert)
        self.virtual_banks: dict[str, int] = {}

    # --- building -------------------------------------------------------------------------------------------
    def ref_for(self, info: TensorInfo, expert: int | None = None) -> WeightRef:
        """The reference of ``info`` (or of expert ``expert`` of it), with a path relative to ``base_dir``."""
        rel = os.path.relpath(info.file, self.base_dir)
        return WeightRef(Path(rel).as_posix(), info.name, expert)

    def add(self, info: TensorInfo, expert: int | None = None) -> WeightRef:
        ref = self.ref_for(info, expert)
        self._entries[str(ref)] = info if expert is None else info.expert(expert)
        return ref

    def add_bank(self, info: TensorInfo) -> list[WeightRef]:
        """Index a packed expert bank whole and as one reference per expert (``#e=N``)."""
        self.add(info)
        return [self.add(info, e) for e in range(info.shape[0])]

    def add_virtual_bank(self, ref: WeightRef, experts: list[TensorInfo]) -> None:
        """A bank made of separate per-expert tensors: only ``ref#e=N`` resolve (:attr:`virtual_banks`)."""

        for e, info in enumerate(experts):
            self._entries[str(ref.with_expert(e))] = info
        self.virtual_banks[str(ref)] = len(experts)

    def experts(self, ref: str | WeightRef) -> list[TensorInfo]:
        """Every expert slice of a bank reference, real or virtual."""
        r = ref if isinstance(ref, WeightRef) else WeightRef.parse(ref)
        n = self.virtual_banks.get(str(r))
        if n is None:
            n = self[r].shape[0]
        return [self[r.with_expert(e)] for e in range(n)]

    # --- Mapping --------------------------------------------------------------------------------------------
    def __getitem__(self, ref: str | WeightRef) -> TensorInfo:
        key = str(ref)
        try:
            return self._entries[key]
        except KeyError:
            raise LoaderError(f"weight reference {key!r} is not in the model's index") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, ref: object) -> bool:
        return str(ref) in self._entries

    # --- reading (tests, tools; the runtime reads through uaii-storage) -------------------------------------
    def files(self) -> list[str]:
        return sorted({i.file for i in self._entries.values()})

    def total_bytes(self) -> int:
        """Bytes of all distinct tensors (expert slices and their banks counted once)."""
        spans = {(i.file, i.offset, i.nbytes) for i in self._entries.values()}
        covered: dict[str, list[tuple[int, int]]] = {}
        for f, off, n in spans:
            covered.setdefault(f, []).append((off, off + n))
        total = 0
        for ranges in covered.values():
            end = -1
            for a, b in sorted(ranges):
                if b <= end:
                    continue
                total += b - max(a, end)
                end = b
        return total

    def read_bytes(self, ref: str | WeightRef) -> bytes:
        info = self[ref]
        with open(info.file, "rb") as f:
            data = os.pread(f.fileno(), info.nbytes, info.offset)
        if len(data) != info.nbytes:
            raise LoaderError(f"{info.file}: short read for {str(ref)!r}: {len(data)} of {info.nbytes} bytes")
        return data

    def read_numpy(self, ref: str | WeightRef) -> np.ndarray:
        """A plain-dtype weight as an array of its shape (block types come back as raw uint8 rows)."""
        info = self[ref]
        raw = np.frombuffer(self.read_bytes(ref), dtype=np.uint8)
        if info.dtype.is_quantized:
            return raw.reshape(*info.shape[:-1], -1) if info.shape else raw
        return raw.view(info.dtype.numpy).reshape(info.shape)


__all__ = ["TensorInfo", "WeightIndex"]

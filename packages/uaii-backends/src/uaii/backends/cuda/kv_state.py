"""The KV cache of one sequence in CUDA device memory: :class:`CudaKVState`.

The slot and position bookkeeping and the window policy are the shared :class:`~uaii.backends.kv_book.KVBook`
(so the CUDA backend keeps and drops the same tokens as the CPU); the rows live on the device: per cached layer one
buffer of keys and one of values, ``[capacity, n_kv_heads, dim]`` f32 or f16, and one i32 buffer of every slot's
absolute position (-1: empty) that the attention kernels mask by. The host copy of the positions is the truth;
each change is copied to the device on the executor's compute stream through a page-locked mirror, so it lands
before the next kernel that reads it and after the last that did.

Compaction moves the kept rows down through a scratch buffer (two device copies per layer and tensor: a copy
within one buffer whose ranges overlap is undefined in CUDA). ``positions="cache"`` (re-rotating moved keys) is
not supported by this backend: ``Capabilities.kv_positions`` says ``absolute`` only.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from uaii.backends.kv_book import KVBook, KVCacheFull


class CudaKVState(KVBook):
    """One sequence's KV cache on a CUDA device (or its host model); see the module doc."""

    def __init__(self, dev: Any, stream: Any, dims: Sequence[tuple[int, int, int]], capacity: int, *,
                 dtype: str = "f32", window: int = 0, sinks: int = 4, max_tokens: int = 512,
                 positions: str = "absolute") -> None:
        if positions != "absolute":
            raise KVCacheFull(f"[kv] the cuda backend keeps absolute positions only (found positions={positions!r}:"
                              " re-rotating cached keys is not built for CUDA)")
        super().__init__(len(dims), capacity, dtype=dtype, window=window, sinks=sinks, max_tokens=max_tokens)
        self.dev = dev
        self.stream = stream
        self.f16 = dtype == "f16"
        item = 2 if self.f16 else 4
        self.row_bytes = [(hkv * dk * item, hkv * dv * item) for hkv, dk, dv in dims]
        self.keys: list[Any] = []
        self.values: list[Any] = []
        self._scratch: Any = None
        self._owned: list[Any] = []  # device buffers, freed by close() or when the state is collected
        self._pinned: list[Any] = []
        self._release = weakref.finalize(self, _release, dev, self._owned, self._pinned)
        try:
            for kb, vb in self.row_bytes:
                self.keys.append(self._alloc(kb * self.capacity))
                self.values.append(self._alloc(vb * self.capacity))
            self.pos_dev = self._alloc(4 * self.capacity)
            self._pinned.append(dev.alloc_host(4 * self.capacity))
            self._mirror = self._pinned[0].view(np.int32)
        except BaseException:
            self.close()
            raise
        self._positions_changed(0, self.capacity)

    def _alloc(self, nbytes: int) -> Any:
        buf = self.dev.alloc(nbytes)
        self._owned.append(buf)
        return buf

    @property
    def nbytes(self) -> int:
        """Device bytes this state holds: keys, values, positions and the compaction scratch once made."""
        rows = sum(k + v for k, v in self.row_bytes) * self.capacity
        return rows + 4 * self.capacity + (self._scratch.nbytes if self._scratch is not None else 0)

    def _positions_changed(self, lo: int, hi: int) -> None:
        if hi <= lo:
            return
        self._mirror[lo:hi] = self.pos[lo:hi]
        self.dev.copy_htod(self.pos_dev.ptr + 4 * lo, self._mirror[lo:hi], self.stream)

    def _move(self, start: int, dst: int, count: int) -> None:
        if self._scratch is None:  # made once, for the most a compaction can move
            self._scratch = self._alloc(max(max(k, v) for k, v in self.row_bytes) * self.capacity)
        tmp = self._scratch.ptr
        for (kb, vb), kbuf, vbuf in zip(self.row_bytes, self.keys, self.values, strict=True):
            for rb, buf in ((kb, kbuf), (vb, vbuf)):
                self.dev.copy_dtod(tmp, buf.ptr + start * rb, count * rb, self.stream)
                self.dev.copy_dtod(buf.ptr + dst * rb, tmp, count * rb, self.stream)

    def cache_ptrs(self, layer: int) -> tuple[int, int]:
        """Device addresses of layer ``layer``'s keys and values."""
        return self.keys[layer].ptr, self.values[layer].ptr

    def close(self) -> None:
        """Free the device buffers now (a state nobody holds frees them when it is collected)."""
        self._release()
        self.keys, self.values = [], []
        self.pos_dev = self._scratch = None


def _release(dev: Any, owned: list[Any], pinned: list[Any]) -> None:
    """Free a state's buffers (its finalizer: it holds the lists, never the state)."""
    while owned:
        dev.free(owned.pop())
    while pinned:
        dev.free_host(pinned.pop())


__all__ = ["CudaKVState"]

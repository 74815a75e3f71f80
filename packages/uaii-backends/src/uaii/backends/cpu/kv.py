"""The KV cache of one sequence, owned by the backend and updated in place.

The IR is functional (``present = concat(past, new)``); copying the cache every step would cost O(context). The CPU
executor instead binds every Attention node's ``past_k``/``past_v`` inputs and ``present_k``/``present_v`` outputs
to a :class:`KVState`: per layer a preallocated ``[capacity, n_kv_heads, head_dim]`` array for keys and one for
values. A run writes the new rows at ``used`` and attends over ``[0, used + seq)``.

Positions are absolute and stored per slot (``pos``): RoPE is applied before caching, so a slot keeps its meaning
wherever it sits. That is what makes a resident window possible: with ``window > 0`` the state keeps the first
``sinks`` slots (attention sinks) and the most recent tokens, compacting (one memmove per layer) when a run would
not fit, while the attention kernel masks by the stored positions. ``window = 0`` keeps everything (capacity
``max_context``); untouched capacity costs address space, not memory (pages are committed on first write).

``positions="cache"`` is the StreamingLLM positioning instead: a token's *rotary* position is the slot it occupies
(sinks ``0..sinks-1``, then the window in order), so the model never sees a distance larger than the cache, whereas
``pos`` stays absolute for the causal and sliding-window masks. It equals caching keys before RoPE and rotating them
by slot at attention time, done cheaply: rotations compose, so when compaction moves keys down by ``shift`` slots
they are rotated by ``-shift`` once (O(window) per compaction, nothing per step). The caller feeds the positions
:meth:`KVState.reserve` returns.

The slot and position bookkeeping and the window policy are shared with the other backends
(:class:`~uaii.backends.kv_book.KVBook`); this module keeps the rows in host memory and moves them.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Sequence

import numpy as np

from uaii.backends.cpu.bind import fptr, lib, vptr
from uaii.backends.kv_book import KV_DTYPES, POSITIONS, KeyRope, KVBook, KVCacheFull


def lazy_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An array over anonymous memory that is committed page by page as it is written, without transparent huge
    pages: a KV cache of ``max_context`` tokens costs resident memory only for the tokens it holds (a 2 MiB huge page
    per layer and per K/V would otherwise be faulted in by the first token)."""
    count = int(np.prod(shape))
    m = mmap.mmap(-1, max(count * dtype.itemsize, 1))
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        with contextlib.suppress(OSError):  # a kernel without transparent huge pages
            m.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(m, dtype=dtype, count=count).reshape(shape)


def shift_keys(rope: KeyRope, keys: np.ndarray, delta: int) -> None:
    """Rotate ``keys`` [n, heads, dim] in place from position p to p + ``delta`` (R(p + d) = R(d) R(p))."""
    n, h, d = keys.shape
    if n == 0 or delta == 0:
        return
    work = keys if keys.dtype == np.float32 else keys.astype(np.float32)
    deltas = np.full(n, delta, np.int32)
    rc = lib.uk_rope(fptr(work), fptr(work), n, h, d, rope.rot, vptr(deltas, "int32_t *"), fptr(rope.inv_freq),
                     1.0, int(rope.neox))
    if rc:
        raise KVCacheFull(f"[kv] re-rotating {n} cached keys failed: kernel status {rc}")
    if work is not keys:
        keys[...] = work


class KVState(KVBook):
    """Keys and values of every cached layer in host arrays; slots, positions and the window policy are
    :class:`~uaii.backends.kv_book.KVBook`'s."""

    def __init__(self, layers: Sequence[tuple[int, int, int]], capacity: int, *, dtype: str = "f32",
                 window: int = 0, sinks: int = 4, max_tokens: int = 512, positions: str = "absolute",
                 rotations: Sequence[KeyRope] = ()) -> None:
        """``layers``: (n_kv_heads, head_dim_k, head_dim_v) per layer; ``capacity``: slots per layer
        (``window + sinks`` when windowed); ``rotations``: per layer, the RoPE of its keys (``positions="cache"``
        only: compaction re-rotates the keys it moves)."""
        super().__init__(len(layers), capacity, dtype=dtype, window=window, sinks=sinks, max_tokens=max_tokens,
                         positions=positions, rotations=rotations)
        np_dtype = np.dtype(np.float32 if dtype == "f32" else np.float16)
        self.k = [lazy_empty((self.capacity, h, dk), np_dtype) for h, dk, _ in layers]
        self.v = [lazy_empty((self.capacity, h, dv), np_dtype) for h, _, dv in layers]

    @property
    def n_layers(self) -> int:
        return len(self.k)

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values at capacity (KVStateLike.nbytes): what a budget counts, though the OS commits
        the pages only as they are written."""
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def resident_bytes(self) -> int:
        """Bytes of keys and values that hold tokens."""
        per_slot = sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)
        return per_slot // self.capacity * self.used

    def _move(self, start: int, dst: int, count: int) -> None:
        """One memmove per layer; with cache positions the moved keys are rotated by the slot shift."""
        for arrays in (self.k, self.v):
            for a in arrays:
                a[dst:dst + count] = a[start:start + count]
        for a, rotation in zip(self.k, self.rotations, strict=False):  # cache positions: slot = rotary position
            shift_keys(rotation, a[dst:dst + count], dst - start)

    def __repr__(self) -> str:
        return (f"<KVState layers={self.n_layers} length={self._length} used={self.used}/{self.capacity} "
                f"{self.dtype}{f' window={self.window}+{self.sinks}' if self.window else ''}"
                f"{' positions=cache' if self.positions == 'cache' else ''}>")


__all__ = ["KV_DTYPES", "POSITIONS", "KVCacheFull", "KVState", "shift_keys"]

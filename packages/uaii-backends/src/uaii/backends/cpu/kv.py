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
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Sequence

import numpy as np

from uaii.ir import UaiiError


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


class KVCacheFull(UaiiError):
    component = "kv"


class KVState:
    """Keys and values of every cached layer, their absolute positions, and the sequence length."""

    def __init__(self, layers: Sequence[tuple[int, int, int]], capacity: int, *, dtype: str = "f32",
                 window: int = 0, sinks: int = 4, max_tokens: int = 512) -> None:
        """``layers``: (n_kv_heads, head_dim_k, head_dim_v) per layer; ``capacity``: slots per layer
        (``window + sinks`` when windowed)."""
        if dtype not in ("f32", "f16"):
            raise KVCacheFull(f"[kv] cache dtype must be f32 or f16, found {dtype!r}")
        if capacity < 1:
            raise KVCacheFull(f"[kv] capacity must be >= 1, found {capacity}")
        np_dtype = np.dtype(np.float32 if dtype == "f32" else np.float16)
        self.dtype = dtype
        self.capacity = int(capacity)
        self.window = int(window)
        self.sinks = int(sinks) if window else 0
        self.k = [lazy_empty((self.capacity, h, dk), np_dtype) for h, dk, _ in layers]
        self.v = [lazy_empty((self.capacity, h, dv), np_dtype) for h, _, dv in layers]
        self.pos = np.full(self.capacity, -1, np.int32)  # absolute position of each slot
        self.q_pos = np.zeros(max(max_tokens, 1), np.int32)  # positions of the tokens of the current run
        self._arange = np.arange(max(max_tokens, 1), dtype=np.int32)
        self.used = 0  # slots holding tokens
        self._length = 0  # tokens of the sequence so far (the next absolute position)
        self.compactions = 0

    # --- the KVStateLike interface ----------------------------------------------------------------------------
    @property
    def length(self) -> int:
        """Tokens processed so far (the absolute position of the next token)."""
        return self._length

    @property
    def n_layers(self) -> int:
        return len(self.k)

    def reset(self) -> None:
        self.used = 0
        self._length = 0
        self.pos[:] = -1

    def truncate(self, n: int) -> None:
        """Forget every token from position ``n`` on (e.g. to rewind to a shared prompt prefix)."""
        if not 0 <= n <= self._length:
            raise KVCacheFull(f"[kv] cannot truncate to {n}: the sequence has {self._length} tokens")
        keep = int(np.count_nonzero(self.pos[:self.used] < n))  # slots are in position order
        if self.compactions and n > keep and keep <= self.sinks < n:
            raise KVCacheFull(f"[kv] cannot truncate to {n}: the tokens before it were dropped by window compaction")
        self.used = keep
        self.pos[keep:] = -1
        self._length = n

    def nbytes(self) -> int:
        """Bytes reserved for keys and values (address space; committed only where written)."""
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def resident_bytes(self) -> int:
        """Bytes of keys and values that hold tokens."""
        per_slot = sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)
        return per_slot // self.capacity * self.used

    # --- used by the executor around one run -----------------------------------------------------------------
    def prepare(self, n: int) -> None:
        """Make room for ``n`` new tokens and set their positions (``q_pos[:n]``, ``pos[used:used + n]``)."""
        if n > self.q_pos.size:
            self.q_pos = np.zeros(n, np.int32)
            self._arange = np.arange(n, dtype=np.int32)
        if self.used + n > self.capacity:
            if not self.window:
                raise KVCacheFull(f"[kv] the KV cache holds {self.capacity} tokens; {self.used} are used and "
                                  f"this step adds {n} (raise max_context or set kv_window)")
            self._compact(n)
        q = self.q_pos[:n]
        np.add(self._arange[:n], self._length, out=q)
        self.pos[self.used:self.used + n] = q

    def advance(self, n: int) -> None:
        self.used += n
        self._length += n

    def _compact(self, n: int) -> None:
        """Drop the oldest tokens after the sinks so that ``n`` more fit, keeping at least ``window - n`` recent
        ones; drops a quarter of the window at once so compaction stays rare."""
        keep_recent = self.capacity - self.sinks - n
        if keep_recent < 0:
            raise KVCacheFull(f"[kv] a step of {n} tokens does not fit a window of {self.capacity - self.sinks} "
                              f"(+{self.sinks} sinks); lower max_batch or raise kv_window")
        keep_recent = max(0, min(keep_recent, self.used - self.sinks - max(n, self.window // 4)))
        start = self.used - keep_recent
        dst = self.sinks
        for arrays in (self.k, self.v):
            for a in arrays:
                a[dst:dst + keep_recent] = a[start:self.used]
        self.pos[dst:dst + keep_recent] = self.pos[start:self.used]
        self.used = dst + keep_recent
        self.pos[self.used:] = -1
        self.compactions += 1

    def __repr__(self) -> str:
        return (f"<KVState layers={self.n_layers} length={self._length} used={self.used}/{self.capacity} "
                f"{self.dtype}{f' window={self.window}+{self.sinks}' if self.window else ''}>")


__all__ = ["KVCacheFull", "KVState"]

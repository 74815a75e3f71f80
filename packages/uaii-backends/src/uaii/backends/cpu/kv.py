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
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from uaii.backends.cpu.bind import fptr, lib, vptr
from uaii.ir import UaiiError

POSITIONS = ("absolute", "cache")


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


@dataclass(frozen=True)
class KeyRotation:
    """The rotary embedding a layer's keys were cached with: all that rotating them again by a delta needs (the
    yarn ``attn_factor`` is left out on purpose: it scaled the keys once and a re-rotation must not scale again)."""

    rot: int  # rotated dims of each head (the rest pass through)
    inv_freq: np.ndarray  # float32 [rot / 2], scaling and frequency factors folded in
    neox: bool  # halves rotated together (NeoX / GPT-J style) rather than adjacent pairs

    def shift(self, keys: np.ndarray, delta: int) -> None:
        """Rotate ``keys`` [n, heads, dim] in place from position p to p + ``delta`` (R(p + d) = R(d) R(p))."""
        n, h, d = keys.shape
        if n == 0 or delta == 0:
            return
        work = keys if keys.dtype == np.float32 else keys.astype(np.float32)
        deltas = np.full(n, delta, np.int32)
        rc = lib.uk_rope(fptr(work), fptr(work), n, h, d, self.rot, vptr(deltas, "int32_t *"), fptr(self.inv_freq),
                         1.0, int(self.neox))
        if rc:
            raise KVCacheFull(f"[kv] re-rotating {n} cached keys failed: kernel status {rc}")
        if work is not keys:
            keys[...] = work


class KVState:
    """Keys and values of every cached layer, their absolute positions, and the sequence length."""

    def __init__(self, layers: Sequence[tuple[int, int, int]], capacity: int, *, dtype: str = "f32",
                 window: int = 0, sinks: int = 4, max_tokens: int = 512, positions: str = "absolute",
                 rotations: Sequence[KeyRotation] = ()) -> None:
        """``layers``: (n_kv_heads, head_dim_k, head_dim_v) per layer; ``capacity``: slots per layer
        (``window + sinks`` when windowed); ``rotations``: per layer, the RoPE of its keys (``positions="cache"``
        only: compaction re-rotates the keys it moves)."""
        if dtype not in ("f32", "f16"):
            raise KVCacheFull(f"[kv] cache dtype must be f32 or f16, found {dtype!r}")
        if capacity < 1:
            raise KVCacheFull(f"[kv] capacity must be >= 1, found {capacity}")
        if positions not in POSITIONS:
            raise KVCacheFull(f"[kv] positions must be one of {', '.join(POSITIONS)}, found {positions!r}")
        if positions == "cache" and len(rotations) != len(layers):
            raise KVCacheFull(f"[kv] positions='cache' needs the key rotation of each of the {len(layers)} layers, "
                              f"found {len(rotations)}")
        self.positions = positions
        self.rotations = tuple(rotations) if positions == "cache" else ()
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
        with self._all_or_reset():
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

    # --- used by the caller before a run, and by the executor around it -----------------------------------------
    def reserve(self, n: int) -> int:
        """Make room for the next ``n`` tokens now (compacting the window if needed) and return the rotary position
        of the first: its absolute position, or with ``positions="cache"`` the slot it will be written to. Feeding
        positions from here is what the cache positioning requires (a run cannot move its own inputs)."""
        if self.used + n > self.capacity:
            self._make_room(n)
        return self.used if self.positions == "cache" else self._length

    def prepare(self, n: int) -> None:
        """Make room for ``n`` new tokens and set their positions (``q_pos[:n]``, ``pos[used:used + n]``)."""
        if n > self.q_pos.size:
            self.q_pos = np.zeros(n, np.int32)
            self._arange = np.arange(n, dtype=np.int32)
        if self.used + n > self.capacity:
            if self.positions == "cache":
                raise KVCacheFull(f"[kv] positions='cache': call reserve({n}) before the run and feed the positions "
                                  "it returns (compaction moves the slots the new tokens' RoPE positions depend on)")
            self._make_room(n)
        q = self.q_pos[:n]
        np.add(self._arange[:n], self._length, out=q)
        self.pos[self.used:self.used + n] = q

    def advance(self, n: int) -> None:
        try:  # as _all_or_reset, inlined: this runs every decode step
            self.used += n
            self._length += n
        except BaseException:
            self.reset()
            raise

    @contextlib.contextmanager
    def _all_or_reset(self) -> Iterator[None]:
        """Around a change of several fields (or of the arrays): if anything interrupts it (KeyboardInterrupt
        included) the state is emptied, never left half-changed. The owner sees ``length`` drop to 0 and forgets
        its tokens too (the runtime Session does: see Session._resync)."""
        try:
            yield
        except BaseException:
            self.reset()
            raise

    def _make_room(self, n: int) -> None:
        if not self.window:
            raise KVCacheFull(f"[kv] the KV cache holds {self.capacity} tokens; {self.used} are used and "
                              f"this step adds {n} (raise max_context or set kv_window)")
        self._compact(n)

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
        with self._all_or_reset():  # a compaction stopped half-way would leave layers that disagree
            for arrays in (self.k, self.v):
                for a in arrays:
                    a[dst:dst + keep_recent] = a[start:self.used]
            for a, rotation in zip(self.k, self.rotations, strict=False):  # cache positions: slot = rotary position
                rotation.shift(a[dst:dst + keep_recent], dst - start)
            self.pos[dst:dst + keep_recent] = self.pos[start:self.used]
            self.used = dst + keep_recent
            self.pos[self.used:] = -1
            self.compactions += 1

    def __repr__(self) -> str:
        return (f"<KVState layers={self.n_layers} length={self._length} used={self.used}/{self.capacity} "
                f"{self.dtype}{f' window={self.window}+{self.sinks}' if self.window else ''}"
                f"{' positions=cache' if self.positions == 'cache' else ''}>")


__all__ = ["POSITIONS", "KVCacheFull", "KVState", "KeyRotation"]

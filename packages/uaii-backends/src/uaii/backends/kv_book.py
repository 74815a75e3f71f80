"""The bookkeeping of a KV cache that every backend shares: which absolute position each slot holds, how many slots
are used, the length of the sequence, and the resident-window policy (attention sinks plus the most recent tokens,
compacted when a run would not fit). Where the keys and values live is the backend's business: host arrays
(``cpu/kv.py``) or device buffers (``webgpu/kv_state.py``). A backend subclasses :class:`KVBook` and implements
:meth:`KVBook._move` (move cached rows down, re-rotating keys under ``positions="cache"``) and, when it keeps a copy
of the positions elsewhere, :meth:`KVBook._positions_changed`.

Why one class: the window policy (what compaction drops, when truncation is refused, what ``reserve`` returns) is
what makes two backends give the same tokens for the same conversation; two copies would drift apart.

Also here: what re-rotating cached keys needs (:class:`KeyRope`) and the graph analysis that finds it for every
cached layer (:func:`key_ropes`), so that no backend derives it differently.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from uaii.backends.analysis import NodeInfo
from uaii.backends.base import BackendError
from uaii.ir import Graph, UaiiError
from uaii.ir.reference.attention import rope_inv_freq

POSITIONS = ("absolute", "cache")
KV_DTYPES = ("f32", "f16")


class KVCacheFull(UaiiError):
    component = "kv"


@dataclass(frozen=True)
class KeyRope:
    """The rotary embedding a layer's keys were cached with: all that rotating them again by a delta needs (the
    yarn ``attn_factor`` is left out on purpose: it scaled the keys once and a re-rotation must not scale again)."""

    rot: int  # rotated dims of each head (the rest pass through)
    inv_freq: np.ndarray  # float32 [rot / 2], scaling and frequency factors folded in
    neox: bool  # halves rotated together (NeoX / GPT-J style) rather than adjacent pairs


def rope_frequencies(rot: int, attrs: Mapping[str, Any], freq_factors: np.ndarray | None) -> np.ndarray:
    """The rot/2 angular frequencies of a RoPE node (resolved ``attrs``), float64: the reference's formula, the
    one definition every backend uses (rounded to float32 where a kernel takes that)."""
    ff = None if freq_factors is None else np.asarray(freq_factors, np.float64).reshape(-1)
    inv = rope_inv_freq(rot, float(attrs["theta"]), ff, scaling_type=str(attrs["scaling_type"]),
                        factor=float(attrs["factor"]), original_max_position=int(attrs["original_max_position"]),
                        low_freq_factor=float(attrs["low_freq_factor"]),
                        high_freq_factor=float(attrs["high_freq_factor"]), beta_fast=float(attrs["beta_fast"]),
                        beta_slow=float(attrs["beta_slow"]))
    return np.asarray(inv, np.float64)


def key_ropes(graph: Graph, infos: Sequence[NodeInfo], layers: Mapping[str, int], head_dims: Sequence[int],
              weight_f32: Callable[[str], np.ndarray], weight_names: Collection[str]) -> list[KeyRope]:
    """Per cached layer (``layers``: Attention node → layer index; ``head_dims``: key dim per layer), the RoPE its
    keys were rotated with. Raises when positions within the cache would not mean what they should: keys not rotated
    by RoPE (learned or no position embeddings: gpt2, bert), or a positions input that something besides RoPE reads
    (it would see cache slots instead of positions). ``weight_f32`` gives a weight's float32 host values."""
    producer = {o: info for info in infos for o in info.node.outputs if o}
    readers: dict[str, set[str]] = {}
    for info in infos:
        for x in info.node.inputs:
            readers.setdefault(x, set()).add(info.node.op)
    if not layers:
        raise BackendError(f"[backend] kv positions 'cache': graph {graph.name!r} has no cached attention")
    out: dict[int, KeyRope] = {}
    for info in infos:
        layer = layers.get(info.node.name)
        if layer is None:
            continue
        where = f"node {info.node.name!r} (Attention) in graph {graph.name!r}"
        rope = producer.get(info.node.inputs[1])
        if rope is None or rope.node.op != "RoPE":
            found = "a graph input" if rope is None else f"{rope.node.op} node {rope.node.name!r}"
            raise BackendError(f"[backend] kv positions 'cache' re-rotates cached keys, so keys must come from a "
                               f"RoPE node; {where} reads keys from {found} (a model without rotary "
                               "embeddings: use kv_positions='absolute')")
        pos_name = rope.node.inputs[1]
        if pos_name not in graph.inputs or readers.get(pos_name, set()) != {"RoPE"}:
            raise BackendError(f"[backend] kv positions 'cache' feeds cache slots as positions; {where}: the "
                               f"positions {pos_name!r} of its RoPE are not a graph input read only by RoPE nodes")
        ff_name = rope.node.inputs[2] if len(rope.node.inputs) > 2 else ""
        if ff_name and ff_name not in weight_names:
            raise BackendError(f"[backend] kv positions 'cache': {where}: the frequency factors {ff_name!r} of "
                               "its RoPE are computed, not a weight")
        rot = int(rope.attrs["rotary_dims"]) or int(head_dims[layer])
        ff = weight_f32(ff_name) if ff_name else None
        inv = np.ascontiguousarray(rope_frequencies(rot, rope.attrs, ff), np.float32)
        out[layer] = KeyRope(rot, inv, rope.attrs["mode"] == "neox")
    return [out[i] for i in range(len(head_dims))]


class KVBook:
    """Slots, positions and the window policy of one sequence's KV cache (see the module doc).

    ``pos[s]``: the absolute position of the token in slot ``s`` (-1: empty); slots ``[0, used)`` hold tokens, in
    position order. ``q_pos[:n]``: the positions of the ``n`` tokens of the current run (set by :meth:`prepare`).
    ``positions="cache"`` (StreamingLLM): a token's rotary position is its slot; compaction then re-rotates the keys it
    moves by the slot shift (``rotations``, one :class:`KeyRope` per layer), while ``pos`` stays absolute for the
    causal and sliding-window masks."""

    def __init__(self, n_layers: int, capacity: int, *, dtype: str = "f32", window: int = 0, sinks: int = 4,
                 max_tokens: int = 512, positions: str = "absolute", rotations: Sequence[KeyRope] = ()) -> None:
        if dtype not in KV_DTYPES:
            raise KVCacheFull(f"[kv] cache dtype must be {' or '.join(KV_DTYPES)}, found {dtype!r}")
        if capacity < 1:
            raise KVCacheFull(f"[kv] capacity must be >= 1, found {capacity}")
        if positions not in POSITIONS:
            raise KVCacheFull(f"[kv] positions must be one of {', '.join(POSITIONS)}, found {positions!r}")
        if positions == "cache" and len(rotations) != n_layers:
            raise KVCacheFull(f"[kv] positions='cache' needs the key rotation of each of the {n_layers} layers, "
                              f"found {len(rotations)}")
        self.dtype = dtype
        self.positions = positions
        self.rotations = tuple(rotations) if positions == "cache" else ()
        self.capacity = int(capacity)
        self.window = int(window)
        self.sinks = int(sinks) if window else 0
        self.pos = np.full(self.capacity, -1, np.int32)  # absolute position of each slot
        self.q_pos = np.zeros(max(max_tokens, 1), np.int32)  # positions of the tokens of the current run
        self._arange = np.arange(max(max_tokens, 1), dtype=np.int32)
        self.used = 0  # slots holding tokens
        self._length = 0  # tokens of the sequence so far (the next absolute position)
        self.compactions = 0

    # --- what a backend implements ----------------------------------------------------------------------------
    def _move(self, start: int, dst: int, count: int) -> None:
        """Move the rows of slots ``[start, start + count)`` to ``[dst, dst + count)`` (``dst < start``) in every
        layer's keys and values, re-rotating the keys by ``dst - start`` under ``positions="cache"``."""
        raise NotImplementedError

    def _positions_changed(self, lo: int, hi: int) -> None:
        """``pos[lo:hi]`` changed (a backend that keeps the positions on a device copies them there)."""

    # --- the KVStateLike interface ----------------------------------------------------------------------------
    @property
    def length(self) -> int:
        """Tokens processed so far (the absolute position of the next token)."""
        return self._length

    def reset(self) -> None:
        self.used = 0
        self._length = 0
        self.pos[:] = -1
        self._positions_changed(0, self.capacity)

    def truncate(self, n: int) -> None:
        """Forget every token from position ``n`` on (e.g. to rewind to a shared prompt prefix)."""
        if not 0 <= n <= self._length:
            raise KVCacheFull(f"[kv] cannot truncate to {n}: the sequence has {self._length} tokens")
        keep = int(np.count_nonzero(self.pos[:self.used] < n))  # slots are in position order
        if self.compactions and n > keep and keep <= self.sinks < n:
            raise KVCacheFull(f"[kv] cannot truncate to {n}: the tokens before it were dropped by window compaction")
        with self._all_or_reset():
            old = self.used
            self.used = keep
            self.pos[keep:] = -1
            self._length = n
            self._positions_changed(keep, max(old, keep))

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
        self._positions_changed(self.used, self.used + n)

    def advance(self, n: int) -> None:
        try:  # as _all_or_reset, inlined: this runs every decode step
            self.used += n
            self._length += n
        except BaseException:
            self.reset()
            raise

    @contextlib.contextmanager
    def _all_or_reset(self) -> Iterator[None]:
        """Around a change of several fields (or of the cached rows): if anything interrupts it (KeyboardInterrupt
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
            if keep_recent and start != dst:
                self._move(start, dst, keep_recent)
            self.pos[dst:dst + keep_recent] = self.pos[start:self.used]
            self.used = dst + keep_recent
            self.pos[self.used:] = -1
            self._positions_changed(dst, self.capacity)
            self.compactions += 1


class KVBatch:
    """The KV states of several sequences run as one batch of decode rows: row ``i`` of the feeds (``tokens[i]``,
    ``positions[i]``) is one new token of ``rows[i]``. A backend whose :attr:`Capabilities.batched_kv` is True runs
    ``run(feeds, batch)`` with its GEMMs over all rows at once and each row's attention against its own cache, so a
    row's result is the one it would get alone; a server decodes every active sequence in one pass this way.

    Why a list holder rather than a tuple per call: a server keeps one batch object and :meth:`set` swaps the rows
    as sequences join and leave between steps. The caller feeds positions from each row's ``reserve(1)``, as for a
    single state; :meth:`prepare` and :meth:`advance` are what the executor calls around the run, like a state's."""

    def __init__(self, states: Sequence[KVBook] = ()) -> None:
        self.rows: list[KVBook] = []
        self.set(states)

    def set(self, states: Sequence[KVBook]) -> None:
        """Replace the rows (sequences join or leave between steps). A state may appear once: two rows of one
        state would write the same slot."""
        rows = list(states)
        seen: dict[int, int] = {}
        for i, row in enumerate(rows):
            if not isinstance(row, KVBook):
                raise BackendError(f"[backend] KVBatch row {i}: expected a KV state from an executable's new_state(), "
                                   f"found {type(row).__name__}")
            j = seen.setdefault(id(row), i)
            if j != i:
                raise BackendError(f"[backend] KVBatch rows {j} and {i} are the same state; a state decodes one "
                                   "token per pass")
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def prepare(self, n: int) -> None:
        """Set one new token's position in every row (``row.prepare(1)``); ``n`` is the batch's rows fed by the
        run. All or nothing: when a row's cache is full, the rows prepared before it are put back as they were
        (``prepare`` moves no token; only :meth:`advance`, after the run, does) and the error names the row."""
        if n != len(self.rows) or not self.rows:
            raise KVCacheFull(f"[kv] a batched run feeds one token per row: the feeds have {n} rows, the KVBatch "
                              f"holds {len(self.rows)} states")
        for i, row in enumerate(self.rows):
            try:
                row.prepare(1)
            except KVCacheFull as exc:
                for done in self.rows[:i]:
                    done.pos[done.used] = -1
                    done._positions_changed(done.used, done.used + 1)
                raise KVCacheFull(f"[kv] KVBatch row {i} of {n} (length {row.length}): {exc}") from exc

    def advance(self, n: int) -> None:
        """The run wrote one token per row: each row's ``advance(1)``."""
        for row in self.rows:
            row.advance(1)

    def __repr__(self) -> str:
        return f"<KVBatch rows={len(self.rows)} lengths={[row.length for row in self.rows]}>"


__all__ = ["KV_DTYPES", "POSITIONS", "KVBatch", "KVBook", "KVCacheFull", "KeyRope", "key_ropes", "rope_frequencies"]

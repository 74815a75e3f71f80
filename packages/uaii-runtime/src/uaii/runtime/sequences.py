"""One sequence of a Session among several: its own KV state and the tokens that state holds.

A Session has its own conversation (``generate``/``stream``/``chat`` and their cache); a server needs many at once.
:meth:`Session.new_sequence <uaii.runtime.session.Session.new_sequence>` gives a :class:`Sequence` with a KV state of
its own from the session's executable (same window, sinks, dtype and positions as the session's), which
``Session.prefill`` and ``Session.decode`` extend. The weights, the compiled steps and the arena are shared; what
a sequence costs is its KV state (committed page by page as it fills). ``Session.release`` drops the state at
once; a released sequence is refused by every call.

Under a memory budget the sequences count (budget.py's rule: what the executables report plus every KV state at
capacity): the option ``sequences`` keeps room for that many states when the session plans
(:meth:`SequencesMixin._reserved_plan`), :meth:`SequencesMixin.sequence_fits` tells a caller (the engine) whether
one more fits now, and the batched decode executable is kept only if what it allocates beyond the session's
executable fits too — else decode runs one pass per sequence, warned once (:attr:`SequencesMixin.batched_decode`).

The invariant is the session's: ``tokens`` and the state agree (a pass and its bookkeeping happen together or not at
all, and the session rewinds the state to ``tokens`` when a pass fails half-way).
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from uaii.runtime.budget import executable_extra, kv_cache_bytes
from uaii.runtime.capabilities import compile_options
from uaii.runtime.errors import SessionError
from uaii.runtime.planning import kv_slots

if TYPE_CHECKING:
    from uaii.backends.base import Executable
    from uaii.ir import Graph

log = logging.getLogger("uaii.runtime")
_ids = itertools.count(1)
BATCH_ROWS = 8  # rows the batched executable's arena is first laid out for (it grows when a batch is larger)


def agree(kv: Any, tokens: list[int]) -> None:
    """Make a KV state and the token list it should hold agree after a pass that did not finish: the state ran
    ahead (truncated to the tokens), or cannot rewind, or reset itself mid-way (both emptied; ``tokens`` is cut in
    place). The one rule of the session's own state and of every sequence's."""
    n = len(tokens)
    if kv.length > n:
        try:
            kv.truncate(n)
        except Exception:  # a window that dropped those tokens cannot rewind: both start over
            kv.reset()
    if kv.length < n:
        del tokens[kv.length:]



def batch_graph(graph: Graph, options: Any) -> Graph:
    """The graph of batched decode: every row's logits (no last-row rewrite), fused as the session's plan fuses
    (GroupedMatMul, AddRMSNorm, SwiGLU). Why fused: unfused, SmolLM2's step runs 573 nodes instead of 424 and a
    one-row pass costs ~1.2 ms more than the session's planned executable — the batch would pay it on every row."""
    try:
        from uaii.planner import PlannerOptions, fuse
    except ImportError:  # the planner is optional: its graph as it is
        return graph
    return fuse(graph, PlannerOptions(enable_fusion=options.enable_fusion))


@dataclass(eq=False)
class Sequence:
    """A sequence's KV state and its tokens (made by ``Session.new_sequence``; use through the session only).

    ``id`` names it in errors; ``owner`` is the session that made it (a sequence runs on no other); ``state`` is
    None once released (``closed``)."""

    owner: Any = field(repr=False)
    state: Any = field(repr=False)
    tokens: list[int] = field(default_factory=list)
    id: int = field(default_factory=lambda: next(_ids))
    closed: bool = False

    @property
    def length(self) -> int:
        """Tokens the sequence's KV state holds (the absolute position of its next token)."""
        return len(self.tokens)

    @property
    def name(self) -> str:
        return f"sequence {self.id}"

    def __repr__(self) -> str:
        status = "closed" if self.closed else f"{self.length} tokens"
        return f"<Sequence {self.id}: {status}>"


class SequencesMixin:
    """The Session's methods for several sequences (see the module docstring). Mixed into
    :class:`~uaii.runtime.session.Session`, whose guard, executables, bounds and helpers it uses; each public call
    holds the session's guard, as ``forward`` does, so the engine's worker and other callers take turns."""

    _batch_exe: Executable | None
    _kv_batch: Any
    _sequences: weakref.WeakSet[Sequence]
    _btokens: np.ndarray
    _bpositions: np.ndarray
    _batch_rows: int
    _batch_extra: int
    _batch_refused: bool
    _sequence_bytes: int | None
    if TYPE_CHECKING:  # provided by Session
        _guard: Any
        _exe: Executable | None
        _kv: Any
        _store: Any
        _stream_kw: dict[str, Any]
        _embedder: Any
        context: int
        graph: Any
        _device_kw: dict[str, Any]
        _bundle: Any
        _tokens: np.ndarray
        _positions: np.ndarray
        _chunk: int
        backend: Any
        options: Any
        bounds: Any

        def _generative(self, what: str) -> None: ...
        def _plan(self, graph: Any, budget: int) -> tuple[Any, bool]: ...
        def _new_kv_state(self, exe: Executable) -> Any: ...
        def _check_ids(self, ids: Any) -> None: ...
        def _chunked(self, ids: list[int], run: Callable[[list[int]], np.ndarray], on_prefill: Any) -> np.ndarray: ...
        def _vocab(self) -> int: ...
        def _next_position(self, n: int, kv: Any = None) -> int: ...
        def _run(self, feeds: Any, state: Any, exe: Executable | None = None) -> dict[str, np.ndarray]: ...

    def _init_sequences(self) -> None:
        self._batch_exe = None  # compiled on the first batched decode (the graph without the last-row rewrite)
        self._kv_batch = None
        self._sequences = weakref.WeakSet()  # the open ones: closing the session releases them
        self._btokens = np.zeros(BATCH_ROWS, np.int64)
        self._bpositions = np.zeros(BATCH_ROWS, np.int64)
        self._batch_rows = 0  # rows the batched executable was compiled for
        self._batch_extra = 0  # bytes it allocates beyond the session's executable (budget.executable_extra)
        self._batch_refused = False  # it did not fit the budget: decode runs one pass per sequence
        self._sequence_bytes: int | None = None  # sequence_bytes, counted once

    @property
    def batched_decode(self) -> bool:
        """Whether :meth:`decode` of several sequences is one forward pass over all of them (the backend declares
        ``capabilities.batched_kv`` and the batched executable fits the memory budget) rather than one pass per
        sequence. Never across pipeline stages."""
        backend = self.backend
        if backend is None or self._batch_refused or self.options.pipeline > 1:
            return False
        return bool(getattr(backend.capabilities, "batched_kv", False))

    # --- the memory budget --------------------------------------------------------------------------------------
    def _reserved_plan(self, graph: Any) -> tuple[Any, bool, Any]:
        """(plan, cache hit, options the session's own part is held to): under a budget, the plan for the budget
        less the KV states of ``options.sequences`` sequences and the batched decode executable's arena
        (:meth:`_batch_arena`), so that a server's requests have room beside the pins the planner fills the
        budget with. Halved (warned) while even the smallest plan does not fit."""
        from uaii.planner import BudgetError

        o = self.options
        per = self.sequence_bytes
        n = o.sequences if o.budget_bytes and per else 0
        while True:
            try:
                reserve = n * per + self._batch_arena(n)
                if n and o.budget_bytes <= reserve:
                    raise BudgetError("", budget_bytes=o.budget_bytes, required_bytes=reserve, parts={})
                own = replace(o, budget_bytes=o.budget_bytes - reserve)
                plan, hit = self._plan(graph, own.budget_bytes)
            except BudgetError:
                if n == 0:
                    raise
                n //= 2
                continue
            if o.budget_bytes and per and n < o.sequences:  # without a budget nothing is reserved, nor needed
                log.warning("[runtime] memory budget of %d bytes keeps room for %d sequence KV state(s) of %d bytes, "
                            "not the %d asked for: requests beyond them wait", o.budget_bytes, n, per, o.sequences)
            return plan, hit, own

    def _batch_arena(self, n: int) -> int:
        """Bytes to keep for the batched decode executable's arena when ``n`` >= 2 sequences are expected: its
        layout at the rows it is first compiled for, by the backend's own rule (0 where the backend decodes one
        sequence per pass or declares no arena rule). Without it the plan fills the budget with pins, and the
        batched executable — compiled later — never fits: every step would decode one sequence per pass, reading
        each streamed weight once per sequence instead of once per step."""
        backend = self.backend
        if n < 2 or backend is None or not backend.capabilities.batched_kv or not backend.capabilities.arena:
            return 0
        graph = batch_graph(self._bundle.graph, self.options)
        return int(backend.plan_arena(graph, max(n, BATCH_ROWS)).size)

    @property
    def sequence_bytes(self) -> int:
        """Bytes one sequence's KV state holds at capacity (the session's own state's size; 0 for an encoder)."""
        if not self._bundle.generative:
            return 0
        if self._sequence_bytes is None:  # the graph's type analysis: once (the engine asks per admission)
            o = self.options
            self._sequence_bytes = kv_cache_bytes(self.graph, kv_slots(o, self.context), o.kv_dtype)
        return self._sequence_bytes

    def _budget_limit(self) -> int:
        """The host budget the session is held to (0: none; a budget without streaming is not enforced)."""
        return int(self.options.budget_bytes) if self._stream_kw else 0

    def memory_bytes(self) -> int:
        """What the session holds by the budget's rule (:func:`uaii.runtime.budget.check_memory`): its executable,
        its own KV state, the batched executable beyond it, the embedding executable beyond it and every open
        sequence's KV state at capacity."""
        with self._guard.cv:  # not while close() frees the executables
            exe = self._exe
            if exe is None:
                return 0
            main = exe.memory()
            total = main.total + (int(self._kv.nbytes) if self._kv is not None else 0) + self._batch_extra
            embedder = getattr(self._embedder, "exe", None)
            if embedder is not None:
                total += executable_extra(main, embedder.memory(), self._shared_staging())
            return total + sum(int(st.nbytes) for st in [q.state for q in list(self._sequences)] if st is not None)

    def sequence_fits(self) -> bool:
        """Whether one more sequence's KV state fits the memory budget beside what the session holds now (always
        without a budget); when the MoE expert cache is the budget's remainder (``expert_cache_bytes`` 0) it
        gives back what is missing, down to one step's experts (:meth:`_make_room`). The engine admits a request
        only then; otherwise it waits for memory to free."""
        if not self._budget_limit():
            return True
        with self._guard.hold("make room for a sequence"):
            return self._make_room(self.sequence_bytes)

    def _auto_cache(self) -> Any:
        """The expert cache when it is what the budget leaves (the planner's auto size), else None."""
        cache = self._stream_kw.get("expert_cache")
        return cache if cache is not None and not self.options.expert_cache_bytes else None

    def _make_room(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit the budget beside what the session holds. The auto expert cache is the
        budget's remainder, so it shrinks by what is missing (evicting its least recently used experts) as long as
        it keeps one step's experts: under a budget the cache must not leave no room for a second sequence or the
        batched executable. The caller holds the guard (no pass reads the cache meanwhile)."""
        limit = self._budget_limit()
        short = self.memory_bytes() + nbytes - limit if limit else 0
        if short <= 0:
            return True
        cache = self._auto_cache()
        if cache is None or cache.budget_bytes - cache.min_bytes < short:
            return False
        cache.resize(cache.budget_bytes - short)
        return True

    def _regrow_cache(self) -> None:
        """The auto expert cache takes back what the budget leaves, up to its planned size (after memory freed).
        Growing evicts nothing, so it is safe while a pass runs."""
        cache, limit = self._auto_cache(), self._budget_limit()
        if cache is None or not limit or cache.budget_bytes >= cache.max_bytes:
            return
        free = limit - self.memory_bytes()
        if free > 0:
            cache.resize(min(cache.max_bytes, cache.budget_bytes + free))

    def _shared_staging(self) -> int:
        """Staging that every executable of the session shares: the store's staging pool and the expert cache."""
        cache = self._stream_kw.get("expert_cache")
        return int(getattr(self._store, "staging_capacity", 0) or 0) + (
            int(cache.budget_bytes) if cache is not None else 0)

    @property
    def open_sequences(self) -> int:
        """Sequences made by :meth:`new_sequence` and not released (each holds a KV state)."""
        return sum(1 for s in list(self._sequences) if not s.closed)

    def new_sequence(self) -> Sequence:
        """A new, empty sequence with its own KV state (same options as the session's own: window, sinks, dtype,
        positions). Its memory is the state's, committed as it fills; :meth:`release` gives it back."""
        with self._guard.hold("make a sequence"):
            self._generative("make a sequence")
            assert self._exe is not None
            self._make_room(self.sequence_bytes)  # the auto expert cache gives room when it can; never refused here
            seq = Sequence(self, self._new_kv_state(self._exe))
            self._sequences.add(seq)
            return seq

    def release(self, seq: Sequence) -> None:
        """Drop the sequence's KV state now (idempotent); the sequence is refused by every call afterwards. Safe
        from any thread without waiting: a pass in flight on it finishes on the state it started with, which is
        freed when that pass ends."""
        self._own(seq)
        seq.closed = True
        state, seq.state = seq.state, None
        free = getattr(state, "release", None)  # a state held elsewhere (a pipeline's stages) is freed there
        if free is not None:
            free()
        self._regrow_cache()

    def prefill(self, seq: Sequence, ids: Iterable[int],
                on_prefill: Callable[[int, int], object] | None = None) -> np.ndarray:
        """Append ``ids`` to ``seq`` (in chunks of ``prefill_chunk`` tokens) and return the last token's logits
        (float32, a copy). Bounds and ids are checked before anything runs; each chunk is all-or-nothing (a
        failed one leaves the sequence as it was before that chunk). ``on_prefill(done, total)`` as in generate."""
        ids = [int(t) for t in ids]
        with self._guard.hold("prefill"):
            self._open(seq, "prefill")
            if not ids:
                raise SessionError(f"[runtime] nothing to prefill on {seq.name}: the token list is empty")
            self.bounds.check(len(ids), seq.length)
            self._check_ids(ids)
            last = self._chunked(ids, lambda chunk: self._seq_pass(seq, chunk), on_prefill)
            return np.array(last, dtype=np.float32)

    def decode(self, seqs: Iterable[Sequence], tokens: Iterable[int]) -> np.ndarray:
        """Feed one token to each sequence; return their next-token logits, float32 ``[len(seqs), vocab]`` (a copy).

        One forward pass over all of them when :attr:`batched_decode` (the backend runs a KVBatch: each row's
        result is bit-identical to a pass of that row alone), else one pass per sequence. All or nothing: on an
        error every sequence is as it was before the call. A sequence at its context limit is refused (naming
        it) before anything runs."""
        seqs, toks = list(seqs), [int(t) for t in tokens]
        if len(seqs) != len(toks) or not seqs:
            raise SessionError(f"[runtime] decode takes one token per sequence: found {len(seqs)} sequence(s) and "
                               f"{len(toks)} token(s)")
        if len({id(s) for s in seqs}) != len(seqs):
            raise SessionError("[runtime] decode: a sequence appears twice in one call (one token per sequence)")
        with self._guard.hold("decode"):
            for s in seqs:
                self._open(s, "decode")
                if not self.bounds.fits(1, s.length):
                    raise SessionError(f"[runtime] {s.name} is full: it holds {s.length} tokens, the context is "
                                       f"{self.bounds.context} ({self.bounds.name}); release it or start another")
            self._check_ids(toks)
            if self.batched_decode and len(seqs) > 1 and self._batched_executable(len(seqs)) is not None:
                return self._batch_pass(seqs, toks)
            lengths = [s.length for s in seqs]
            out = np.empty((len(seqs), self._vocab()), np.float32)
            try:
                for i, (s, t) in enumerate(zip(seqs, toks, strict=True)):
                    out[i] = self._seq_pass(s, [t])[-1]
            except BaseException:
                for s, n in zip(seqs, lengths, strict=True):
                    self._rewind(s, n)
                raise
            return out

    # --- internals --------------------------------------------------------------------------------------------
    def _own(self, seq: Sequence) -> None:
        if not isinstance(seq, Sequence) or seq.owner is not self:
            raise SessionError(f"[runtime] {seq!r} is not a sequence of this session (make one with "
                               "new_sequence())")

    def _open(self, seq: Sequence, what: str) -> None:
        """The checks before a pass on ``seq``; its state is made to agree with its tokens (see _seq_resync)."""
        self._generative(what)
        self._own(seq)
        if seq.closed or seq.state is None:
            raise SessionError(f"[runtime] cannot {what}: {seq.name} was released")
        self._seq_resync(seq)

    def _seq_pass(self, seq: Sequence, ids: list[int]) -> np.ndarray:
        """One forward pass of ``ids`` (at most one chunk) on ``seq``'s state; the logits (a view). All or nothing,
        as Session._pass."""
        self._guard.check_open()
        n = len(ids)
        tokens, positions = self._tokens[:n], self._positions[:n]
        state = seq.state  # once: release() from another thread does not pull it from under the pass
        try:
            tokens[:] = ids
            first = self._next_position(n, state)
            positions[:] = np.arange(first, first + n)
            out = self._run({"tokens": tokens, "positions": positions}, state)
            seq.tokens.extend(ids)
        except BaseException:
            self._seq_resync(seq)
            raise
        return out["logits"]

    def _batch_pass(self, seqs: list[Sequence], toks: list[int]) -> np.ndarray:
        """One forward pass of one token per sequence over a KVBatch of their states (all rows' logits)."""
        exe = self._batch_exe
        assert exe is not None  # decode() compiled it (_batched_executable)
        n = len(seqs)
        if self._btokens.shape[0] < n:
            self._btokens, self._bpositions = np.zeros(n, np.int64), np.zeros(n, np.int64)
        tokens, positions = self._btokens[:n], self._bpositions[:n]
        lengths = [s.length for s in seqs]
        batch = self._kv_batch
        self._guard.check_open()
        try:
            batch.set([s.state for s in seqs])
            tokens[:] = toks
            for i, s in enumerate(seqs):
                positions[i] = self._next_position(1, s.state)
            logits = np.array(self._run({"tokens": tokens, "positions": positions}, batch, exe)["logits"],
                              dtype=np.float32)
            for s, t in zip(seqs, toks, strict=True):
                s.tokens.append(t)
        except BaseException:
            for s, m in zip(seqs, lengths, strict=True):
                self._rewind(s, m)
            raise
        finally:
            batch.set(())  # the batch holds no state between calls: a released sequence's memory goes at once
        return logits

    def _batched_executable(self, rows: int) -> Executable | None:
        """The executable of batched decode: the decoder graph without the last-row rewrite (every row's logits),
        compiled on first use (again for more rows than it was laid out for) with the session's store and
        streaming options and a KV state bound. Under a budget what it allocates beyond the session's executable
        (:func:`uaii.runtime.budget.executable_extra`) must fit beside what the session holds; when it does not,
        it is closed and None returned for good: decode runs one pass per sequence (warned once)."""
        if self._batch_exe is not None and rows <= self._batch_rows:
            return self._batch_exe
        from uaii.backends.kv_book import KVBatch

        self._drop_batch()
        rows = max(rows, BATCH_ROWS)
        exe = self.backend.compile(batch_graph(self._bundle.graph, self.options), None, self._store,
                                   **compile_options(self.backend.capabilities, self.options, self._device_kw,
                                                     max_tokens=rows))
        limit = self._budget_limit()
        if limit and self._exe is not None:
            extra = executable_extra(self._exe.memory(), exe.memory(), self._shared_staging())
            if not self._make_room(extra):
                room = limit - self.memory_bytes()
                exe.close()
                self._batch_refused = True
                log.warning("[runtime] batched decode needs %d more bytes than the budget leaves (%d of %d); "
                            "decoding one sequence per pass", extra, max(room, 0), limit)
                return None
            self._batch_extra = extra
        self._batch_exe, self._batch_rows, self._kv_batch = exe, rows, KVBatch()
        return exe

    def _drop_batch(self) -> None:
        """Close the batched executable (before compiling it for more rows, or when the session closes)."""
        if self._batch_exe is not None:
            self._batch_exe.close()
        self._batch_exe, self._batch_rows, self._batch_extra = None, 0, 0

    def _seq_resync(self, seq: Sequence) -> None:
        """``seq``'s state and tokens agree again after a pass that did not finish (Session._resync's rule)."""
        if seq.state is not None:
            agree(seq.state, seq.tokens)

    def _rewind(self, seq: Sequence, n: int) -> None:
        """Back to its first ``n`` tokens (undoing a call's pass on it)."""
        if seq.state is not None and seq.length > n:
            del seq.tokens[n:]
        self._seq_resync(seq)

    def _close_sequences(self) -> None:
        """The session closes: every sequence is released."""
        for seq in list(self._sequences):
            seq.closed, seq.state = True, None
        self._kv_batch = None


__all__ = ["Sequence", "SequencesMixin", "agree"]

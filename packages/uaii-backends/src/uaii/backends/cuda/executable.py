"""The CUDA executable: a plan's steps as launches of the package's kernels over one activation arena, weights on
the device or streamed from the host through staging buffers, and the KV cache in device memory.

Per feed-shape key a *binding* is made once: every activation's address in the arena (the rule of
:mod:`uaii.backends.webgpu.arena`, with CUDA's 256-byte alignment: views for Reshape/Identity, first fit by
liveness, floats as f32 and ints as i32 on the device) and the list of steps, each of which queues launches on the
executor's compute stream. A run writes the feeds, fills the attention tables of its state(s), queues the steps
and copies the outputs back: one synchronization per run.

CUDA graphs: a binding whose steps are all device work (:func:`device_step`: launches and device copies whose
arguments are fixed at bind time — what a run changes, the attention tables and the fault word, is written to
device memory before the steps) is captured into a graph on its second run with the same key (the KV states'
capacities, which size the attention launches; a few keys per binding) and replayed from then on: one launch call
per decode step instead of one per kernel, so decode is not bound by Python's launch overhead (hundreds of kernels
a token). A binding with host work between its launches (streamed pieces, streamed expert banks, a host-gathered
embedding) runs its steps every time, and so does one whose capture the device refused (said once, in a
warning). ``graphs=False`` turns the capture off (the benchmarks compare the two).

Storage-first on the device: a weight named in ``streamed`` is not uploaded. It is cut into *pieces* of whole rows
(at most ``chunk_bytes``; a matrix's output features) and every run moves its pieces host -> device in the order
the steps read them, into two device slots on a copy stream: piece ``p + 1`` is copied while the kernels of piece
``p`` run. A piece of a weight named in ``host_resident`` (no host budget: host memory may hold it) is copied from
a page-locked host copy made once — the host-pinned tier; any other is read from the store into one of two
page-locked staging buffers first. Events order it (the copy into a slot waits for the kernels that
read the slot's previous piece; those kernels wait for their piece's copy), so the compute stream never stalls on
the host while a copy is in flight. A streamed Embedding table is read on the host: only the rows the tokens
select are copied.

What each node lowers to is :mod:`uaii.backends.cuda.lower`'s (anything else is refused at compile time, naming
the node).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from uaii.backends.analysis import (
    KvLayout,
    NodeInfo,
    VType,
    feed_types,
    infer_types,
    kv_layout,
    shape_values,
    token_shapes,
)
from uaii.backends.base import (
    BackendError,
    ExecutableMemory,
    WeightSource,
    gather_experts,
    per_expert,
    weight_key,
)
from uaii.backends.cuda.expert_cache import DeviceExpertCache, bank_slots
from uaii.backends.cuda.geometry import count
from uaii.backends.cuda.kv_state import CudaKVState
from uaii.backends.kv_book import KVBatch
from uaii.backends.webgpu.arena import lay_out, uncovered
from uaii.backends.webgpu.program import device_nbytes, from_device, to_device
from uaii.ir import DType, Graph
from uaii.ir.kvcache import kv_bytes_per_token
from uaii.ir.plan import ArenaLayout
from uaii.storage import rows_ref

ARENA_RULE = "cuda/1"
"""The identity of the arena rule (webgpu/arena.py's rule at :data:`ALIGN`); bump it when the layout changes."""
ALIGN = 256
"""Offset alignment of the arena's regions (cuMemAlloc aligns to 256; the kernels' vector loads need far less)."""
MAX_BINDINGS = 16
MAX_GRAPHS = 4
"""Graphs kept per binding (one per key: the states' capacities), the least recently used dropped first."""
STAGING_SLOTS = 2
"""Device slots (and page-locked host buffers) streamed pieces take turns in: one read by kernels, one filling."""

c_int, c_ll, c_f, c_p = ctypes.c_int, ctypes.c_longlong, ctypes.c_float, ctypes.c_uint64
log = logging.getLogger("uaii.backends")
Step = Callable[["RunContext"], None]


def device_step(step: Step) -> Step:
    """Mark ``step`` as device work only — launches and device-to-device copies on the compute stream, their
    arguments fixed at bind time (of the run it may read only the states' capacities, a graph's key) — so that a
    CUDA graph may replay it. Unmarked steps make their binding run eagerly every time."""
    setattr(step, "device_only", True)  # noqa: B010  (a plain function attribute: no wrapper call per step)
    return step


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of a streamed weight in the form its reader takes (``packed``: stored bytes;
    ``f32``: the values as f32; ``gather``: the stored rows the run's feed ``ids`` selects, read on the host),
    ``nbytes`` long."""

    name: str
    form: str
    start: int
    stop: int
    nbytes: int
    ids: str = ""


@dataclass
class RunContext:
    """What a run's steps read: the KV state(s) of the run (one, or a KVBatch's rows), and the expert indices a
    router chose, read back once for the three banks of its experts node (``chosen``: by the node's name)."""

    states: list[CudaKVState]
    chosen: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class Binding:
    steps: list[Step]
    feeds: list[tuple[str, int, DType, int]]
    outputs: list[tuple[str, int, DType, tuple[int, ...]]]
    n_new: int
    batched: bool
    pieces: list[Piece]
    owned: list[Any] = field(default_factory=list)
    tables: Any = None
    pinned_tables: Any = None
    pinned_io: Any = None
    faults: list[str] = field(default_factory=list)
    bit_feeds: frozenset[str] = frozenset()
    graphs: dict[Any, Any] = field(default_factory=dict)  # instantiated CUDA graphs of the steps, by run key
    seen: set[Any] = field(default_factory=set)  # keys run once: the next run with one captures
    capture_failed: bool = False  # the device refused a capture: the steps run every time

    @cached_property
    def graphable(self) -> bool:
        """Every step is device work (a binding's steps never change: looked at once, not every decode step)."""
        return bool(self.steps) and all(getattr(s, "device_only", False) for s in self.steps)


def table_layout(rows: int, layers: int) -> dict[str, int]:
    """Byte offsets of the attention tables of ``rows`` rows (8-byte arrays first, so each is aligned): per layer
    and row the key and value cache pointers, per row the slots to scan (i64), the positions' pointer, the query
    position (i32) and the f16 flag (i32); ``size`` in all."""
    o = 16 * layers * rows
    return {"k": 0, "v": 8 * layers * rows, "used": o, "kpos": o + 8 * rows, "qpos": o + 16 * rows,
            "f16": o + 20 * rows, "size": o + 24 * rows}


class CudaExecutable:
    """A graph compiled for the CUDA backend (see the module doc). ``dev``: a
    :class:`~uaii.backends.cuda.device.CudaDevice`, or the host model :class:`~uaii.backends.cuda.host.HostDevice`
    the tests run it on."""

    def __init__(self, graph: Graph, infos: list[NodeInfo], weights: WeightSource, dev: Any, *,
                 max_tokens: int = 512, kv_state: bool = True, streamed: Collection[str] = (),
                 chunk_bytes: int = 0, arena: ArenaLayout | None = None, host_resident: Collection[str] = (),
                 expert_cache_bytes: int = 0, graphs: bool = True, gemm: str = "fast") -> None:
        self.graph = graph
        self.graphs = bool(graphs)
        self.int8 = gemm == "fast"  # the block types' products on int8 activations (CudaBackend.compile's gemm)
        self.graph_launches = 0  # runs that replayed a captured graph (tests and benchmarks read it)
        self.infos = infos
        self.dev = dev
        self.max_tokens = max(int(max_tokens), 1)
        self.chunk_bytes = max(int(chunk_bytes), 0)
        self._source = weights
        self._tmap = graph.tensor_map
        self.weight_names = {t.name for t in graph.tensors if t.is_weight or t.is_constant}
        refs = set(streamed)
        self.streamed = {t.name for t in graph.tensors if t.is_weight and weight_key(t) in refs}
        kept = set(host_resident)
        self.lockable = {n for n in self.streamed if weight_key(self._tmap[n]) in kept}
        self._locked: dict[Piece, Any] = {}  # the host-pinned tier: page-locked copies of host-resident pieces
        self._locked_raw: list[Any] = []
        self.locked_bytes = 0
        kv = kv_layout(graph)
        self.kv: KvLayout | None = kv if kv_state and kv.layers else None
        stateful = self.kv.values if self.kv is not None else frozenset()
        self.input_names = tuple(n for n in graph.inputs if n not in stateful)
        self.output_names = tuple(n for n in graph.outputs if n not in stateful)
        self._planned = arena
        self._resident: dict[tuple[str, str], Any] = {}
        self._derived: dict[Any, Any] = {}
        self._bindings: dict[Any, Binding] = {}
        self._arena: Any = None
        self._arena_bytes = 0
        self._scores: Any = None
        self._slots: list[Any] = []
        self._pinned_slots: list[Any] = []
        self._slot_bytes = 0
        self.weight_bytes = 0
        self.closed = False
        self.stream = dev.stream()
        self.copy_stream = dev.stream()
        self._copied = [dev.event() for _ in range(STAGING_SLOTS)]  # a slot's piece is on the device
        self._read = [dev.event() for _ in range(STAGING_SLOTS)]    # the kernels that read a slot were queued
        self._ids = dev.upload(np.arange(self.max_tokens, dtype=np.int32))  # rows of a host-gathered embedding
        self._current: Binding | None = None
        self._experts: tuple[Any, Any, Any] | None = None  # the expert area of streamed banks (expert_area)
        self.expert_cache_bytes = max(int(expert_cache_bytes), 0)
        self._banks: dict[str, tuple[int, int, int]] = {}  # streamed banks gathered: (experts, expert bytes, top_k)
        self.expert_caches: dict[str, DeviceExpertCache] | None = None  # made once every bank is known
        self._feeds: Mapping[str, np.ndarray] = {}
        self.shape_deps = shape_values(graph, infos)  # feeds whose values decide shapes key the bindings too
        self._fault: Any = None  # a word kernels write a node's fault code to (fault_ptr), and its host copy
        self._fault_host: Any = None

    # --- weights ---------------------------------------------------------------------------------------------
    def _with_host(self, name: str, use: Callable[[np.ndarray], Any]) -> Any:
        """``use(data)`` on the host data of a weight or constant, which is valid only during the call (a store's
        view is released after it): an upload or a conversion reads it in place, without a copy first."""
        t = self._tmap[name]
        if per_expert(t):  # an HF bank: one tensor per expert, gathered
            return use(gather_experts(self._source, t, 0, int(t.shape[0]), release=True))
        if t.is_constant:
            assert t.data is not None
            raw = np.frombuffer(t.data, np.uint8)
            return use(raw if t.dtype.is_quantized else raw.view(t.dtype.numpy).reshape(tuple(int(d) for d in t.shape)))
        ref = weight_key(t)
        data = self._source.acquire(ref)
        try:
            return use(np.asarray(data))
        finally:
            self._source.release(ref)

    def _form(self, name: str, form: str, data: np.ndarray) -> np.ndarray:
        """Host bytes of a weight (or rows of it) in ``form``: ``packed`` (stored bytes, for the decoders),
        ``packed_t`` (a plain [K, N] weight transposed to the [N, K] the GEMV reads) or ``f32`` (values, for norms
        and products by a row)."""
        t = self._tmap[name]
        if form == "packed":
            return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if form == "packed_t":  # a plain [K, N] weight as the GEMV reads it: [N, K], its own element type
            k, n = (int(d) for d in t.shape)
            return np.ascontiguousarray(np.asarray(data).reshape(k, n).T).reshape(-1).view(np.uint8)
        if t.dtype.is_quantized:
            from uaii.kernels import dequantize

            raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            count = raw.size // t.dtype.nbytes(t.dtype.block_size) * t.dtype.block_size
            return dequantize(raw, t.dtype, count).astype(np.float32).view(np.uint8)
        return to_device(np.asarray(data), t.dtype).view(np.uint8)

    def weight(self, name: str, form: str) -> int:
        """Device address of weight ``name`` in ``form``, resident (uploaded once, on first use)."""
        key = (name, form)
        if key not in self._resident:
            buf = self._with_host(name, lambda data: self.dev.upload(self._form(name, form, data)))
            self._resident[key] = buf
            self.weight_bytes += buf.nbytes
        return int(self._resident[key].ptr)

    def pieces_of(self, name: str, form: str) -> list[Piece]:
        """A streamed weight as pieces of whole rows, each at most ``chunk_bytes`` (at least one row)."""
        t = self._tmap[name]
        shape = tuple(int(d) for d in t.shape)
        shape = shape[::-1] if form == "packed_t" else shape
        rows = shape[0] if len(shape) > 1 else 1
        per = count(shape[1:]) if len(shape) > 1 else count(shape)
        row_bytes = t.dtype.nbytes(per) if form == "packed" else 4 * per
        step = max(1, self.chunk_bytes // row_bytes) if self.chunk_bytes else rows
        return [Piece(name, form, a, min(rows, a + step), (min(rows, a + step) - a) * row_bytes)
                for a in range(0, rows, step)]

    def _piece_bytes(self, p: Piece) -> np.ndarray:
        """The host bytes of a piece, read from the store (rows of a file's tensor through ``@rows=``)."""
        t = self._tmap[p.name]
        ref = weight_key(t)
        shape = tuple(int(d) for d in t.shape)
        if p.form == "gather":
            ids = np.asarray(self._feeds[p.ids]).reshape(-1).astype(np.int64)
            if ids.size and (ids.min() < 0 or ids.max() >= shape[0]):
                bad = ids[(ids < 0) | (ids >= shape[0])][0]
                raise BackendError(f"[backend] cuda: id {bad} is outside the {shape[0]} rows of {p.name!r}")
            if t.weight is None:  # a caller's array
                table = np.ascontiguousarray(self._source.acquire(ref)).reshape(-1).view(np.uint8)
                try:
                    return table.reshape(shape[0], -1)[ids].reshape(-1)
                finally:
                    self._source.release(ref)
            rows = {}
            for i in np.unique(ids).tolist():  # only the rows the tokens select are read from the store
                key = rows_ref(ref, i, i + 1)
                row = self._source.acquire(key)
                try:
                    rows[i] = np.ascontiguousarray(row).reshape(-1).view(np.uint8).copy()
                finally:
                    self._source.release(key)
            return np.concatenate([rows[i] for i in ids.tolist()]) if ids.size else np.zeros(0, np.uint8)
        if per_expert(t):
            return gather_experts(self._source, t, p.start, p.stop, release=True)
        if p.form == "packed_t":  # rows of the transpose: the whole weight is read and transposed (a new array)
            return self._with_host(p.name, lambda data: self._form(p.name, p.form, data).reshape(shape[1], -1)[
                p.start:p.stop].reshape(-1))
        whole = p.start == 0 and p.stop == (shape[0] if len(shape) > 1 else 1)
        key = ref if whole or t.weight is None or len(shape) < 2 else rows_ref(ref, p.start, p.stop)
        data = np.asarray(self._source.acquire(key))
        try:
            if key == ref and not whole:  # a caller's array: its rows (raw bytes or typed values alike)
                data = data.reshape(shape[0], -1)[p.start:p.stop]
            return self._form(p.name, p.form, data)
        finally:
            self._source.release(key)

    def _ensure_slots(self, nbytes: int) -> None:
        if nbytes <= self._slot_bytes:
            return
        self.dev.synchronize()
        for b in self._slots:
            self.dev.free(b)
        for h in self._pinned_slots:
            self.dev.free_host(h)
        self._slots = [self.dev.alloc(nbytes) for _ in range(STAGING_SLOTS)]
        self._pinned_slots = [self.dev.alloc_host(nbytes) for _ in range(STAGING_SLOTS)]
        self._slot_bytes = nbytes  # steps read the slots' addresses when they run: no binding goes stale

    def _lock(self, pieces: list[Piece]) -> None:
        """Page-locked host copies of ``pieces`` (each made once, read from the store once): what the copy engine
        reads directly each run, so no host copy stands between the store and the device."""
        for p in pieces:
            if p not in self._locked:
                host = self.dev.alloc_host(p.nbytes)
                host[:p.nbytes] = self._piece_bytes(p)
                self._locked[p] = host[:p.nbytes]
                self._locked_raw.append(host)
                self.locked_bytes += p.nbytes

    # --- binding ---------------------------------------------------------------------------------------------
    def _bind(self, shapes: Mapping[str, tuple[int, ...]], batched: bool,
              values: Mapping[str, np.ndarray] | None = None) -> Binding:
        from uaii.backends.cuda.lower import Binder

        types = infer_types(self.graph, self.infos, feed_types(self.graph, self.input_names, shapes, self.kv), values,
                            self.shape_deps)
        addr = self._layout(types)
        b = Binder(self, types, addr, batched)
        try:
            for info in self.infos:
                b.lower(info)
        except BaseException:  # what the lowering allocated goes as a finished binding's would
            self._free_binding(Binding([], [], [], 0, batched, [], b.owned, b.tables, b.pinned_tables))
            raise
        feeds = [(n, addr[n], self._tmap[n].dtype, device_nbytes(self._tmap[n].dtype, count(types[n].shape)))
                 for n in self.input_names]
        outputs = [(n, addr[n], types[n].dtype, types[n].shape) for n in self.output_names]
        if self.expert_caches is None and self._banks:
            self.expert_caches = {name: DeviceExpertCache(self.dev, n, self._banks[name][1])
                                  for name, n in bank_slots(self.expert_cache_bytes, self._banks).items()}
        binding = Binding(b.steps, feeds, outputs, b.n_new, batched, b.pieces, b.owned, b.tables, b.pinned_tables,
                          faults=b.faults, bit_feeds=frozenset(b.bit_feeds))
        if b.pieces:
            self._ensure_slots(max(p.nbytes for p in b.pieces))
            self._lock([p for p in b.pieces if p.name in self.lockable and p.form != "gather"])
        io = sum(-(-n // 8) * 8 for *_, n in feeds) + sum(
            -(-device_nbytes(d, count(s)) // 8) * 8 for _, _, d, s in outputs)
        binding.pinned_io = self.dev.alloc_host(max(io, 8))
        return binding

    def _layout(self, types: dict[str, VType]) -> dict[str, int]:
        """Addresses of every activation (the arena rule); at the plan's offsets when its arena holds them."""
        stateful = self.kv.values if self.kv is not None else frozenset()
        r = lay_out(self.infos, self.input_names, self.output_names, stateful, types, ALIGN)
        offset, total = r.offset, r.total
        if self._planned is not None:
            problem = next(uncovered(r, self._planned, len(self.infos), types, ALIGN, rule=ARENA_RULE), None)
            if problem is None:
                offset = {s.value: s.offset for s in self._planned.slots}
                total = self._planned.size
            elif not self._arena_bytes:
                raise BackendError(f"[backend] cuda: the plan's arena ({self._planned.rule}, "
                                   f"{self._planned.max_tokens} tokens) does not fit graph {self.graph.name!r} as "
                                   f"this executable binds it: {problem}")
        if total > self._arena_bytes:
            self._drop_bindings()
            if self._arena is not None:
                self.dev.free(self._arena)
            self._arena = self.dev.alloc(total)
            self._arena_bytes = total
        base = int(self._arena.ptr)
        return {v: base + offset[o] for v, o in r.root.items() if o in offset}

    def _drop_bindings(self) -> None:
        for key in list(self._bindings):
            self._free_binding(self._bindings.pop(key))

    def _free_binding(self, b: Binding) -> None:
        self.dev.synchronize()
        self._drop_graphs(b)
        for buf in b.owned:
            self.dev.free(buf)
        if b.tables is not None:
            self.dev.free(b.tables)
            self.dev.free_host(b.pinned_tables)
        if b.pinned_io is not None:
            self.dev.free_host(b.pinned_io)

    # --- running ---------------------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, np.ndarray], state: Any = None) -> dict[str, np.ndarray]:
        """Run once (see the module doc). ``state``: one sequence's :class:`CudaKVState`, or a :class:`KVBatch`
        of them, one feed row each."""
        if self.closed:
            raise BackendError("[backend] the executable is closed")
        try:
            key_shapes = tuple(tuple(int(d) for d in np.shape(feeds[n])) for n in self.input_names)
        except KeyError as exc:
            raise BackendError(f"[backend] missing input {exc.args[0]!r}; the graph takes "
                               f"{', '.join(self.input_names)}") from None
        batched = isinstance(state, KVBatch)
        states = self._states(state)
        values = {n: np.asarray(feeds[n]) for n in self.shape_deps.feeds}
        key = (key_shapes, batched, tuple(v.tobytes() for v in values.values()))
        binding = self._bindings.get(key)
        if binding is None:
            if len(self._bindings) >= MAX_BINDINGS:
                self._free_binding(self._bindings.pop(next(iter(self._bindings))))
            binding = self._bind(dict(zip(self.input_names, key_shapes, strict=True)), batched, values)
            self._bindings[key] = binding
        else:
            self._bindings[key] = self._bindings.pop(key)  # most recently used last
        io = binding.pinned_io
        at = 0
        for name, ptr, dtype, nbytes in binding.feeds:
            try:
                data = _bits(feeds[name]) if name in binding.bit_feeds else \
                    to_device(np.asarray(feeds[name]), dtype).view(np.uint8)
            except BackendError as exc:
                raise BackendError(f"[backend] cuda: input {name!r}: {exc}") from None
            if data.size != nbytes:
                raise BackendError(f"[backend] input {name!r}: {data.size} device bytes, the binding holds {nbytes}")
            if nbytes:
                io[at:at + nbytes] = data
                self.dev.copy_htod(ptr, io[at:at + nbytes], self.stream)
            at += -(-nbytes // 8) * 8
        if binding.n_new:
            state.prepare(binding.n_new)
            self._fill_tables(binding, states)
        ctx = RunContext(states)
        if binding.faults:
            self._fault_host[:] = 0
            self.dev.copy_htod(self.fault_ptr(), self._fault_host, self.stream)
        self._current = binding
        self._feeds = feeds  # a streamed embedding's rows are the ones these ids select
        try:
            if binding.pieces:
                self._stage(binding, 0)
            self._run_steps(binding, ctx)
        except BaseException:
            self.dev.synchronize()
            raise
        finally:
            self._feeds = {}
        outs = []
        for name, ptr, dtype, shape in binding.outputs:
            n = device_nbytes(dtype, count(shape))
            view = io[at:at + n]
            if n:
                self.dev.copy_dtoh(view, ptr, self.stream)
            outs.append((name, view, dtype, shape))
            at += -(-n // 8) * 8
        if binding.faults:
            self.dev.copy_dtoh(self._fault_host, self.fault_ptr(), self.stream)
        self.dev.sync_stream(self.stream)
        if binding.faults:
            self._raise_fault(binding)
        out = {name: from_device(view.tobytes(), dtype, shape) for name, view, dtype, shape in outs}
        if binding.n_new:
            state.advance(binding.n_new)
        return out

    def _run_steps(self, b: Binding, ctx: RunContext) -> None:
        """Queue the binding's steps: replay its graph for the run's key, capture one on the second run with the
        key (see the module doc), or run them. A capture the device refuses is said once (a warning naming the
        error) and the binding runs its steps from then on: nothing of a failed capture ran, so they run now."""
        if not (self.graphs and b.graphable and not b.capture_failed):
            for step in b.steps:
                step(ctx)
            return
        key = tuple(s.capacity for s in ctx.states)
        graph = b.graphs.pop(key, None)
        if graph is None and key in b.seen:
            graph = self._capture(b, ctx)
            if graph is not None and len(b.graphs) >= MAX_GRAPHS:
                self.dev.graph_destroy(b.graphs.pop(next(iter(b.graphs))))
        b.seen.add(key)
        if graph is None:
            for step in b.steps:
                step(ctx)
            return
        b.graphs[key] = graph  # most recently used last
        self.dev.graph_launch(graph, self.stream)
        self.graph_launches += 1

    def _capture(self, b: Binding, ctx: RunContext) -> Any:
        """The binding's steps captured and instantiated, or None (said once) when the device refuses."""
        self.dev.begin_capture(self.stream)
        try:
            for step in b.steps:
                step(ctx)
        except BaseException as exc:
            with contextlib.suppress(BackendError):  # an invalidated capture: the step's error is the one
                self.dev.graph_destroy(self.dev.end_capture(self.stream))
            if isinstance(exc, BackendError):
                return self._capture_failed(b, exc)
            raise
        try:
            return self.dev.end_capture(self.stream)
        except BackendError as exc:
            return self._capture_failed(b, exc)

    def _capture_failed(self, b: Binding, exc: BackendError) -> None:
        b.capture_failed = True
        log.warning("[backend] cuda: a binding of %r (%d steps) could not be captured as a CUDA graph (%s); it "
                    "launches its kernels every run", self.graph.name, len(b.steps), exc)

    def _drop_graphs(self, b: Binding) -> None:
        while b.graphs:
            self.dev.graph_destroy(b.graphs.popitem()[1])

    def _states(self, state: Any) -> list[CudaKVState]:
        if self.kv is None:
            return []
        if state is None:
            raise BackendError("[backend] this graph keeps a KV cache: pass a state from new_state()")
        states: list[CudaKVState] = []
        for s in list(state.rows) if isinstance(state, KVBatch) else [state]:
            if not isinstance(s, CudaKVState) or s.dev is not self.dev:
                raise BackendError(f"[backend] cuda: a KV state of this executable's device is needed, found "
                                   f"{type(s).__name__}")
            if s.row_bytes != [(hkv * dk * (2 if s.f16 else 4), hkv * dv * (2 if s.f16 else 4))
                               for hkv, dk, dv in self.kv.dims]:
                raise BackendError(f"[backend] cuda: the state's layers {s.row_bytes} (bytes per slot of keys, "
                                   f"values) are not this graph's {self.kv.dims} (heads, key dim, value dim)")
            states.append(s)
        return states

    def _fill_tables(self, b: Binding, states: list[CudaKVState]) -> None:
        """Per attention row (:func:`table_layout`): a prefill's rows share their sequence's cache, each with its
        own query position; a batch's rows are one token of each state."""
        assert self.kv is not None
        n_layers, rows = len(self.kv.layers), b.n_new
        at = table_layout(rows, n_layers)
        host = b.pinned_tables
        kp = host[at["k"]:at["v"]].view(np.uint64).reshape(n_layers, rows)
        vp = host[at["v"]:at["used"]].view(np.uint64).reshape(n_layers, rows)
        used = host[at["used"]:at["kpos"]].view(np.int64)
        kpos = host[at["kpos"]:at["qpos"]].view(np.uint64)
        qpos = host[at["qpos"]:at["f16"]].view(np.int32)
        f16 = host[at["f16"]:at["size"]].view(np.int32)
        if b.batched:
            for r, s in enumerate(states):
                for layer in range(n_layers):
                    kp[layer, r], vp[layer, r] = s.cache_ptrs(layer)
                used[r], kpos[r], qpos[r], f16[r] = s.used + 1, int(s.pos_dev.ptr), s.q_pos[0], int(s.f16)
        else:
            s = states[0]
            for layer in range(n_layers):
                kp[layer, :], vp[layer, :] = s.cache_ptrs(layer)
            used[:], kpos[:], qpos[:], f16[:] = s.used + rows, int(s.pos_dev.ptr), s.q_pos[:rows], int(s.f16)
        self.dev.copy_htod(int(b.tables.ptr), host[:at["size"]], self.stream)

    # --- streaming -------------------------------------------------------------------------------------------
    def _stage(self, b: Binding, p: int) -> None:
        """Queue piece ``p``'s copy into slot ``p % 2`` on the copy stream, after the kernels that read the slot's
        previous piece: from its page-locked copy (the host-pinned tier), or from the store through the slot's
        page-locked buffer, refilled once its previous copy has left."""
        slot = p % STAGING_SLOTS
        piece = b.pieces[p]
        src = self._locked.get(piece)
        if src is None:  # read from the store into the slot's page-locked buffer once its last copy has left
            src = self._pinned_slots[slot][:piece.nbytes]
            self.dev.sync_event(self._copied[slot])
            src[:] = self._piece_bytes(piece)
        self.dev.wait(self.copy_stream, self._read[slot])
        self.dev.copy_htod(int(self._slots[slot].ptr), src, self.copy_stream)
        self.dev.record(self._copied[slot], self.copy_stream)

    def piece_step(self, p: int, launch: Callable[[int], None]) -> Step:
        """The step that runs ``launch(slot address)`` on piece ``p`` of the running binding once the piece is on
        the device, after queueing the next piece's copy (the overlap)."""
        slot = p % STAGING_SLOTS

        def step(ctx: RunContext) -> None:
            binding = self._current
            assert binding is not None
            if p + 1 < len(binding.pieces):
                self._stage(binding, p + 1)
            self.dev.wait(self.stream, self._copied[slot])
            launch(int(self._slots[slot].ptr))
            self.dev.record(self._read[slot], self.stream)
        return step

    # --- what the lowering reads -----------------------------------------------------------------------------
    def tensor(self, name: str) -> Any:
        return self._tmap[name]

    def expert_area(self, nbytes: int, pairs: int) -> tuple[int, int, np.ndarray]:
        """The device buffer streamed banks' chosen experts are copied into, their remapped indices' buffer and the
        page-locked host buffer both are staged through: one for every bank and layer (each step that uses it waits
        for its work before it returns), grown to the largest need."""
        need_host = nbytes + 8 * pairs
        if self._experts is None or self._experts[0].nbytes < nbytes or self._experts[1].nbytes < 4 * pairs:
            self._free_experts()
            self._experts = (self.dev.alloc(nbytes), self.dev.alloc(4 * pairs), self.dev.alloc_host(need_host))
        if self._experts[2].size < need_host:
            self.dev.free_host(self._experts[2])
            self._experts = (*self._experts[:2], self.dev.alloc_host(need_host))
        ebuf, remap, host = self._experts
        return int(ebuf.ptr), int(remap.ptr), host

    def _free_experts(self) -> None:
        if self._experts is not None:
            self.dev.free(self._experts[0])
            self.dev.free(self._experts[1])
            self.dev.free_host(self._experts[2])
            self._experts = None

    def gathered_bank(self, bank: str, experts: int, expert_bytes: int, top_k: int) -> None:
        """A binding gathers the chosen experts of streamed ``bank``: the expert caches (expert_cache.py) are shared
        among the banks so registered once the first binding is made."""
        self._banks[bank] = (int(experts), int(expert_bytes), int(top_k))

    def expert_cache(self, bank: str) -> DeviceExpertCache | None:
        return (self.expert_caches or {}).get(bank)

    def expert_bytes(self, bank: str, expert: int, nbytes: int) -> np.ndarray:
        """The stored bytes of one expert of a bank (rows ``[expert, expert + 1)``; an HF bank's own tensor)."""
        return self._piece_bytes(Piece(bank, "packed", expert, expert + 1, nbytes))

    def host_f32(self, name: str) -> np.ndarray:
        """A weight's values as f32, a host copy (RoPE's frequency factors)."""
        return self._with_host(name, lambda data: self._form(name, "f32", data).view(np.float32).copy())

    def derived(self, key: Any, make: Callable[[], np.ndarray]) -> int:
        """Device address of a value computed on the host once per executable (RoPE frequencies)."""
        if key not in self._derived:
            self._derived[key] = self.dev.upload(make())
        return int(self._derived[key].ptr)

    def ids_ptr(self, r: int) -> int:
        """Device address of the ids 0 .. r - 1 (a host-gathered embedding's rows are in order)."""
        if r > self.max_tokens:
            self.dev.free(self._ids)
            self.max_tokens = r
            self._ids = self.dev.upload(np.arange(r, dtype=np.int32))
        return int(self._ids.ptr)

    # --- states, memory --------------------------------------------------------------------------------------
    def new_state(self, capacity: int, *, window: int = 0, sinks: int = 4, dtype: str = "f32",
                  positions: str = "absolute") -> CudaKVState:
        if self.kv is None:
            raise BackendError(f"[backend] graph {self.graph.name!r} keeps no KV cache")
        slots = window + sinks if window else capacity
        return CudaKVState(self.dev, self.stream, self.kv.dims, slots, dtype=dtype, window=window, sinks=sinks,
                           max_tokens=max(slots, 1), positions=positions)

    def prepare(self) -> None:
        """Bind once at ``max_tokens`` tokens at compile time (weights uploaded, arena sized before the first run,
        so ``memory()`` reports them); with a plan, at the shapes its arena was laid out at."""
        shapes = token_shapes(self.graph, self.input_names, self.max_tokens, batched_only=self._planned is None)
        if shapes is None or self.shape_deps.feeds:  # shapes that fed values decide wait for those values
            return
        key = (tuple(tuple(shapes[n]) for n in self.input_names), False, ())
        self._bindings[key] = self._bind(shapes, False)

    def memory(self) -> ExecutableMemory:
        per_token = kv_bytes_per_token(self.graph) if self.kv is not None else 0
        staging = STAGING_SLOTS * self._slot_bytes + (self._scores.nbytes if self._scores is not None else 0) + \
            (self._experts[0].nbytes + self._experts[1].nbytes if self._experts is not None else 0)
        cached = sum(c.slots * c.expert_bytes for c in (self.expert_caches or {}).values())
        return ExecutableMemory(arena_bytes=self._arena_bytes, weight_bytes=self.weight_bytes + cached,
                                staging_bytes=staging, kv_bytes_per_token=per_token, device="device")

    def fault_ptr(self) -> int:
        """The device word a kernel writes a fault code to (lower.Binder.fault); zeroed before each run of a
        binding that has such kernels, read after it."""
        if self._fault is None:
            self._fault = self.dev.upload(np.zeros(2, np.int32))
            self._fault_host = self.dev.alloc_host(8)
        return int(self._fault.ptr)

    def _raise_fault(self, binding: Binding) -> None:
        code = int(self._fault_host[:4].view(np.int32)[0])
        if code:
            raise BackendError(binding.faults[code - 1] if 0 < code <= len(binding.faults)
                               else f"[backend] cuda: a kernel wrote the unknown fault code {code}")

    def scores(self, nbytes: int) -> int:
        """The attention scores scratch, grown to ``nbytes`` (freed after the queued work that reads it)."""
        if self._scores is None or self._scores.nbytes < nbytes:
            if self.dev.capturing(self.stream):  # the binding's last run with this key made it this large
                raise BackendError(f"[backend] cuda: the attention scratch grows to {nbytes} bytes during a graph "
                                   "capture")
            for b in self._bindings.values():  # their graphs read the old scratch
                self._drop_graphs(b)
            if self._scores is not None:
                self.dev.free(self._scores)
            self._scores = self.dev.alloc(nbytes)
        return int(self._scores.ptr)

    def close(self) -> None:
        if self.closed:
            return
        with contextlib.suppress(Exception):
            self.dev.synchronize()
        self._drop_bindings()
        self._free_experts()
        for cache in (self.expert_caches or {}).values():
            with contextlib.suppress(Exception):
                cache.free(self.dev)
        self.expert_caches = {}
        for buf in (*self._resident.values(), *self._derived.values(), *self._slots, self._arena, self._scores,
                    self._ids, self._fault):
            if buf is not None:
                with contextlib.suppress(Exception):
                    self.dev.free(buf)
        for h in (*self._pinned_slots, *self._locked_raw, *([self._fault_host] if self._fault is not None else [])):
            self.dev.free_host(h)
        self._locked.clear()
        self._locked_raw.clear()
        self._resident.clear()
        self._derived.clear()
        self._slots, self._pinned_slots = [], []
        self._arena = self._scores = None
        self.closed = True


def _bits(value: np.ndarray) -> np.ndarray:
    """The bytes of a fed uint32 value that kernels read as stored bits (packed weights: a word past 2^31 is bits,
    not an integer out of the device's range)."""
    a = np.asarray(value)
    if a.dtype != np.uint32:
        raise BackendError(f"packed words must be fed as uint32, found {a.dtype}")
    return np.ascontiguousarray(a, "<u4").reshape(-1).view(np.uint8)

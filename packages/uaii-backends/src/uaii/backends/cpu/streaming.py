"""Streamed weights: nodes whose weights are not resident acquire them from a streaming store around their steps.

A budgeted plan marks weights ``streamed``: they are not bound at compile time. Each node that reads one becomes a
single step that

1. acquires its streamed weights from the store (a ``uaii.storage.StreamingStore``: reads land in the staging pool,
   queued in execution order, so the next tensors are in flight while this node computes),
2. runs the node's ordinary kernel steps over views of the staging bytes (block-quantized weights stay packed: a
   :class:`~uaii.kernels.PackedWeight` wraps the staging view, nothing is dequantized or copied), and
3. releases them, which lets the store submit the next queued reads.

Kernel steps are bound to pointers, so the steps of a node are cached by the addresses its weights were staged at:
with the store's deterministic first-fit allocation the same node lands at the same addresses token after token,
and a decode step then lowers nothing and allocates nothing beyond the staging pool (``relowered`` counts misses).

At the start of every run, and again right after the run's last streamed weight is released (a step of its own),
the whole acquisition order is queued (``prefetch``), so that the first streamed layers of the next token are read
while the rest of this run (final norm, a pinned lm_head) computes and the caller samples (wrap-around).

Two weights never go through staging:

* an Embedding table that streams is read row by row: one ``pread`` of each looked-up row (a row of a
  block-quantized table is contiguous, ``d / block_size * type_size`` bytes) into small aligned row buffers; the
  table is never staged or pinned for the lookup.
* MoE expert banks: after routing, only the selected experts' references (``#e=N``) are read, through an
  :class:`~uaii.storage.ExpertCache` (byte-budgeted LRU) so that repeats are served from memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from uaii.backends.base import BackendError, weight_key
from uaii.backends.cpu.bind import Bind, Step, WeightData, fptr, status_fail, vptr
from uaii.backends.cpu.memory import NodeInfo
from uaii.kernels import DEQUANT_TYPES, PackedWeight
from uaii.kernels._native import ffi, lib

if TYPE_CHECKING:
    from uaii.backends.cpu.executable import CpuExecutable

ROW_CHUNK = 16  # rows of a streamed embedding table read together (parallel preads)
MAX_VARIANTS = 4  # cached lowerings per streamed node (one per distinct staging address set)
MOE_OPS = ("MoEExperts", "MoEExpertsSwiGLU")


class StreamingWeights:
    """The streamed weights of one executable and the steps that acquire them (see the module docstring)."""

    def __init__(self, exe: CpuExecutable, streamed: Collection[str], prefetch_order: Sequence[str],
                 expert_cache: Any = None, chunk_bytes: int = 0) -> None:
        self.exe = exe
        self.chunk_bytes = int(chunk_bytes)
        self.store: Any = exe._source  # a streaming store (prefetch, acquire, read_many_into, window_bytes)
        refs = set(streamed)
        graph = exe.graph
        self.names = {t.name for t in graph.tensors if t.is_weight and weight_key(t) in refs}
        self.ref_of = {n: weight_key(graph.tensor(n)) for n in self.names}
        self.expert_cache = expert_cache
        self._live: dict[str, WeightData] = {}
        self.relowered = 0
        self._row_bufs: list[Any] = []
        self._closed = False
        self._chunks: dict[str, list[tuple[str, int, int]]] = {}
        acquired: list[str] = []  # in execution order: what nodes acquire through staging
        for info in exe.infos:
            for ref in self.acquired_refs(info):
                if ref not in acquired:
                    acquired.append(ref)
        # the plan's prefetch order is by first use; what is queued is the order of acquisition (a tied table's first
        # use is a row lookup, its staged use the lm_head at the end)
        self.order = acquired
        self.planned_order = tuple(prefetch_order)

    # --- what a node reads -----------------------------------------------------------------------------------
    def streamed_inputs(self, info: NodeInfo) -> list[str]:
        return list(dict.fromkeys(x for x in info.node.inputs if x in self.names))

    def _row_table(self, info: NodeInfo) -> str | None:
        """The table of an Embedding whose streamed table is read by rows (None: not such a node)."""
        node = info.node
        if node.op != "Embedding" or len(node.inputs) < 2 or node.inputs[1] not in self.names:
            return None
        t = self.exe.graph.tensor(node.inputs[1])
        if t.dtype not in DEQUANT_TYPES or len(t.shape) != 2 or t.weight is None:
            return None
        return node.inputs[1]

    def _moe(self, info: NodeInfo) -> bool:
        return info.node.op in MOE_OPS and any(x in self.names for x in info.node.inputs[3:6])

    def acquired_names(self, info: NodeInfo) -> list[str]:
        """Streamed weights a node acquires through staging (row lookups and expert banks do not)."""
        if self._moe(info):
            return [x for x in self.streamed_inputs(info) if x not in info.node.inputs[3:6]]
        table = self._row_table(info)
        return [x for x in self.streamed_inputs(info) if x != table]

    def chunks(self, info: NodeInfo) -> list[tuple[str, int, int]] | None:
        """Row chunks ``(ref, start, stop)`` of a MatMul's streamed [N, K] weight too large for one staging buffer;
        None when the node is not such a MatMul."""
        node = info.node
        if node.op != "MatMul" or not self.chunk_bytes or len(node.inputs) < 2 or node.inputs[1] not in self.names:
            return None
        name = node.inputs[1]
        if name in self._chunks:
            return self._chunks[name]
        from uaii.storage import rows_ref
        from uaii.storage._native import PAGE

        t = self.exe.graph.tensor(name)
        if (not info.attrs.get("transpose_b") or len(t.shape) != 2 or t.dtype not in DEQUANT_TYPES
                or self.store.window_bytes(self.ref_of[name]) <= self.chunk_bytes):
            return None
        n, k = (int(d) for d in t.shape)
        row = t.dtype.nbytes(k)
        per = max((self.chunk_bytes - PAGE) // row, 1)
        out = [(rows_ref(self.ref_of[name], a, min(a + per, n)), a, min(a + per, n)) for a in range(0, n, per)]
        self._chunks[name] = out
        return out

    def acquired_refs(self, info: NodeInfo) -> list[str]:
        chunks = self.chunks(info)
        if chunks is not None:
            return [c[0] for c in chunks]
        return list(dict.fromkeys(self.ref_of[n] for n in self.acquired_names(info)))

    # --- lowering --------------------------------------------------------------------------------------------
    def lower(self, b: Bind, info: NodeInfo) -> list[Step] | None:
        """Steps for a node that reads streamed weights; None when it reads none (the ordinary lowering)."""
        if not self.streamed_inputs(info):
            return None
        if self._moe(info):
            if self.acquired_names(info):
                raise BackendError(f"[backend] node {info.node.name!r}: a MoE node streams its expert banks through "
                                   "the expert cache; its other weights must be pinned")
            return self._moe_steps(b, info)
        table = self._row_table(info)
        if table is not None:
            return [self._row_step(b, info, table)]
        chunks = self.chunks(info)
        if chunks is not None:
            return self._chunked_matmul(b, info, chunks)
        return [_StreamedNode(self, b, info, self.acquired_names(info))]

    def live_weight(self, name: str) -> WeightData:
        w = self._live.get(name)
        if w is None:
            raise BackendError(f"[backend] weight {name!r} streams: it is only readable while the node that uses it "
                               "runs")
        return w

    def lower_with(self, b: Bind, info: NodeInfo, names: Sequence[str],
                   views: Sequence[np.ndarray]) -> tuple[list[Step], Bind]:
        """The node's ordinary steps over ``views`` (the staged bytes of ``names``)."""
        from uaii.backends.cpu.executable import lower_node, weight_array

        graph = self.exe.graph
        for name, view in zip(names, views, strict=True):
            t = graph.tensor(name)
            self._live[name] = WeightData(name, t.dtype, tuple(int(d) for d in t.shape), weight_array(t, view))
        arrays = dict(b.arrays)
        for name, w in self._live.items():
            arrays[name] = w.raw if w.dtype.is_quantized else w.raw.reshape(w.shape)
        child = Bind(self.exe, arrays, b.types, b.state)
        try:
            steps = lower_node(child, info)
        finally:
            self._live.clear()
        self.relowered += 1
        return child.prologue + steps, child

    # --- runs ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Queue this run's reads (in execution order); already queued or staged ones are skipped."""
        if self.order and not self._closed:
            self.store.prefetch(self.order)

    def close(self) -> None:
        self._closed = True
        self._row_bufs.clear()

    # --- embedding rows ------------------------------------------------------------------------------------------
    def _row_step(self, b: Bind, info: NodeInfo, table: str) -> Step:
        from uaii.storage._native import PAGE, AlignedBuffer, round_up

        t = self.exe.graph.tensor(table)
        assert t.weight is not None and t.dtype.gguf_id is not None
        vocab, d = (int(x) for x in t.shape)
        row_bytes = t.dtype.nbytes(d)
        if not self._row_bufs:
            size = round_up(row_bytes, PAGE) + PAGE  # a row's read window may straddle a page boundary
            self._row_bufs = [AlignedBuffer(size) for _ in range(ROW_CHUNK)]
        bufs = self._row_bufs
        ids = b.index_as(info.node.inputs[0], np.int64)
        y = b.a(info.node.outputs[0]).reshape(-1, d)
        wref, store, gid = t.weight, self.store, t.dtype.gguf_id
        zero = np.zeros(1, np.int64)
        zptr = vptr(zero, "int64_t *")
        outs = [fptr(y[i]) for i in range(y.shape[0])]
        keep = (zero, ids, y, bufs)

        def step(_keep: Any = keep) -> None:
            n = ids.size
            for s in range(0, n, ROW_CHUNK):
                part = ids[s:s + ROW_CHUNK]
                rows = [int(i) for i in part]
                bad = [r for r in rows if not 0 <= r < vocab]
                if bad:
                    raise BackendError(f"[backend] node {info.node.name!r}: token id {bad[0]} is outside the table "
                                       f"{table!r} ({vocab} rows)")
                views = store.read_many_into([(str(wref.with_expert(r)), bufs[j]) for j, r in enumerate(rows)])
                for j, v in enumerate(views):
                    rc = lib.uk_get_rows(gid, ffi.from_buffer(v), 1, d, zptr, 1, outs[s + j])
                    if rc:
                        raise status_fail(f"node {info.node.name!r} (embedding row)", rc)

        return step

    # --- row-chunked MatMul (an lm_head larger than a staging buffer) ------------------------------------------------
    def _chunked_matmul(self, b: Bind, info: NodeInfo, chunks: list[tuple[str, int, int]]) -> list[Step]:
        node = info.node
        t = self.exe.graph.tensor(node.inputs[1])
        x, y = b.a(node.inputs[0]), b.a(node.outputs[0])
        if x.dtype != np.float32 or y.dtype != np.float32 or not x.flags.c_contiguous or not y.flags.c_contiguous:
            raise BackendError(f"[backend] node {node.name!r}: a row-chunked MatMul needs float32 input and output")
        n, k = (int(d) for d in t.shape)
        m = x.size // k if k else 0
        if m == 0 or n == 0:
            return []
        assert t.dtype.gguf_id is not None
        gid, mode, store = t.dtype.gguf_id, self.exe.gemm_mode_for(node.outputs[0]), self.store
        xp, yp = fptr(x), fptr(y)
        bound: list[tuple[int, Any, Any]] = [(0, None, None)] * len(chunks)  # (address, packed weight, step)

        def step(_keep: Any = (x, y)) -> None:
            for i, (ref, a, stop) in enumerate(chunks):
                view = store.acquire(ref)
                try:
                    addr = view.__array_interface__["data"][0]
                    got = bound[i]
                    if got[0] != addr:
                        pw = PackedWeight.from_raw(view, t.dtype, (stop - a, k))  # wraps the staging bytes
                        got = bound[i] = (addr, pw, partial(lib.uk_gemm, gid, pw.pointer(), stop - a, k, xp, m, k,
                                                            yp + a, n, mode))
                        self.relowered += 1
                    rc = got[2]()
                    if rc:
                        raise status_fail(f"node {node.name!r} (rows {a}:{stop})", rc)
                finally:
                    store.release(ref)

        return [step]

    # --- MoE experts -------------------------------------------------------------------------------------------
    def _moe_steps(self, b: Bind, info: NodeInfo) -> list[Step]:
        from uaii.backends.cpu.ops_extra import expert_step

        cache = self.expert_cache
        node = info.node
        if cache is None:
            raise BackendError(f"[backend] node {node.name!r}: streamed expert banks need an expert cache "
                               "(compile with expert_cache=ExpertCache(store, budget))")
        banks = []
        for name in node.inputs[3:6]:
            t = self.exe.graph.tensor(name)
            if t.dtype not in DEQUANT_TYPES or t.weight is None or len(t.shape) != 3:
                raise BackendError(f"[backend] expert bank {name!r} ({t.dtype.value}, {list(t.shape)}) cannot "
                                   "stream by expert")
            n_exp, rows, cols = (int(d) for d in t.shape)
            banks.append((t.dtype, rows, cols, [str(t.weight.with_expert(e)) for e in range(n_exp)]))

        def experts(e: int) -> tuple[PackedWeight, PackedWeight, PackedWeight]:
            raws = cache.get_many([bank[3][e] for bank in banks])  # the cache's bytes, wrapped as they are
            gate, up, down = (PackedWeight.from_raw(raw, dtype, (rows, cols))
                              for raw, (dtype, rows, cols, _) in zip(raws, banks, strict=True))
            return gate, up, down

        return [expert_step(b, info, banks[0][1], experts, f"node {node.name!r} (expert gemm)")]


class _StreamedNode:
    """One node over streamed weights: acquire, run the cached steps for these addresses, release."""

    def __init__(self, owner: StreamingWeights, b: Bind, info: NodeInfo, names: list[str]) -> None:
        self.owner = owner
        self.b = b
        self.info = info
        self.names = names
        self.refs = list(dict.fromkeys(owner.ref_of[n] for n in names))
        self._slot = [self.refs.index(owner.ref_of[n]) for n in names]
        self.variants: dict[tuple[int, ...], tuple[list[Step], Bind]] = {}

    def __call__(self) -> None:
        store = self.owner.store
        views: list[np.ndarray] = []
        try:
            for ref in self.refs:
                views.append(store.acquire(ref))
            key = tuple(v.__array_interface__["data"][0] for v in views)
            got = self.variants.get(key)
            if got is None:
                if len(self.variants) >= MAX_VARIANTS:
                    self.variants.pop(next(iter(self.variants)))
                got = self.variants[key] = self.owner.lower_with(self.b, self.info, self.names,
                                                                 [views[i] for i in self._slot])
            for s in got[0]:
                rc = s()
                if rc:
                    raise status_fail(f"node {self.info.node.name!r}", int(rc) if isinstance(rc, int) else -99)
        finally:
            for ref in self.refs[:len(views)]:
                with contextlib.suppress(Exception):
                    store.release(ref)


__all__ = ["StreamingWeights"]

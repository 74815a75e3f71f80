"""Streamed weights: nodes whose weights are not resident acquire them from a streaming store around their steps.

A budgeted plan marks weights ``streamed``: they are not bound at compile time. Each node that reads one becomes a
single step that

1. acquires its streamed weights from the store (a ``uaii.storage.StreamingStore``: reads land in the staging pool,
   queued in the plan's prefetch order, so the next tensors are in flight while this node computes),
2. runs the node's ordinary kernel steps over views of the staging bytes (block-quantized weights stay packed: a
   :class:`~uaii.kernels.PackedWeight` wraps the staging view, nothing is dequantized or copied), and
3. releases them, which lets the store submit the next queued reads.

Kernel steps are bound to pointers, so the steps of a node are cached by the addresses its weights were staged at:
with the store's deterministic first-fit allocation the same node lands at the same addresses token after token,
and a decode step then lowers nothing and allocates nothing beyond the staging pool (``relowered`` counts misses).

At the start of every run, and again right after the run's last streamed weight is released (a step of its own),
the whole read order is queued (``prefetch``), so that the first streamed layers of the next token are read while
the rest of this run (final norm, a pinned lm_head) computes and the caller samples (wrap-around). The read order
is the plan's ``storage.prefetch_order`` (each weight expanded to its row chunks where it streams in chunks; see
:meth:`StreamingWeights._queue` for the one place where a weight's staged use differs from its first use).

How a node reads each weight is its op schema's ``WeightAccess`` (the planner sized staging by the same
declaration). Two kinds never go through staging:

* a table read by rows (``ROWS``: an Embedding or Gather table, of any rank: a row is everything after axis 0) is
  read row by row: one ``pread`` of each looked-up row, addressed ``ref@rows=i:i+1`` (a row of a block-quantized
  table is contiguous, ``d / block_size * type_size`` bytes) into small aligned row buffers; the table is never
  staged or pinned for the lookup (the planner sizes staging without it). An MLX-quantized table
  (QuantizedEmbedding) is up to three tensors read by rows: each streamed one is read the same way, row i of a
  pinned one is a view, and the row is dequantized from them.
* MoE expert banks (``EXPERTS``): after routing, only the selected experts' references (``#e=N``) are read, through
  an :class:`~uaii.storage.ExpertCache` (byte-budgeted LRU) so that repeats are served from memory.

A weight read by output rows (``ROW_CHUNKS``: a MatMul's [N, K] weight) that exceeds one staging buffer is staged
in chunks of rows (``ref@rows=A:B``), each computing its slice of the output.
"""

from __future__ import annotations

import contextlib
from collections import ChainMap
from collections.abc import Collection, MutableMapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from uaii.backends.base import BackendError, weight_key
from uaii.backends.cpu.bind import Bind, Step, WeightData, fptr, status_fail, vptr
from uaii.backends.cpu.memory import NodeInfo
from uaii.ir import DType
from uaii.ir.ops import WeightAccess
from uaii.ir.ops.quantized import BANK_SLOTS
from uaii.kernels import DEQUANT_TYPES, PackedWeight
from uaii.kernels.native import ffi, lib

if TYPE_CHECKING:
    from uaii.backends.cpu.executable import CpuExecutable

ROW_CHUNK = 16  # rows of a streamed embedding table read together (parallel preads)
MAX_VARIANTS = 4  # cached lowerings per streamed node (one per distinct staging address set)
ROW_OPS = {"Embedding": False, "Gather": True, "QuantizedEmbedding": False}
"""The ops whose table reads (``WeightAccess.ROWS``) the row path computes → whether a negative index counts from
the end (Gather) or is an error (token ids)."""
PACKED_ROW_OPS = frozenset({"QuantizedEmbedding"})
"""Row ops whose table is several tensors read by rows (an MLX-quantized table: packed values, scales, biases)."""
PACKED_EXPERT_OPS = frozenset({"QuantizedMoEExperts"})
"""MoE ops whose banks are several tensors each (MLX-quantized: packed values, scales, biases), all read by expert."""
CHUNK_OPS = {"MatMul": False, "MatMulRelu": True}
"""The ops whose weight reads by output rows (``WeightAccess.ROW_CHUNKS``) the chunk path computes → relu after."""


def _row_elements(t: Any) -> int:
    """Elements of one row of the table ``t``: everything after axis 0 (1 for a vector)."""
    return int(np.prod([int(x) for x in t.shape[1:]], dtype=np.int64))


class StreamingWeights:
    """The streamed weights of one executable and the steps that acquire them (see the module docstring)."""

    def __init__(self, exe: CpuExecutable, store: Any, streamed: Collection[str], prefetch_order: Sequence[str],
                 expert_cache: Any = None, chunk_bytes: int = 0) -> None:
        """``store``: the streaming store the executable was compiled with (prefetch, acquire, release,
        read_many_into, window_bytes); ``prefetch_order``: the plan's (see :meth:`_queue`)."""
        self.exe = exe
        self.chunk_bytes = int(chunk_bytes)
        self.store = store
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
        reads: dict[str, list[str]] = {}  # weight ref -> what its staged uses acquire (chunks or itself)
        first_use: dict[str, int] = {}
        first_staged: dict[str, int] = {}
        for step, info in enumerate(exe.infos):
            for name in self.streamed_inputs(info):
                first_use.setdefault(self.ref_of[name], step)
            for ref, read in self._staged_reads(info):
                first_staged.setdefault(ref, step)
                got = reads.setdefault(ref, [])
                if read not in got:
                    got.append(read)
        self.queue = self._queue(tuple(prefetch_order), first_use, first_staged)
        self.order = [r for ref in self.queue for r in reads[ref]]  # what start() queues, in this order

    @staticmethod
    def _queue(plan: Sequence[str], first_use: dict[str, int], first_staged: dict[str, int]) -> list[str]:
        """The weight references to read ahead, in the order reads are queued: the plan's prefetch order (without
        one, e.g. a direct compile, the execution order). The plan lists a weight at its first use; a weight whose
        first use reads it outside staging (a tied table's row lookups) is queued at its first staged use (the
        lm_head) instead, before the first weight staged after it: queued first, its chunks would hold the staging
        buffers that the first layers wait for. A streamed weight the plan does not list is an error."""
        if not plan:
            return sorted(first_staged, key=first_staged.__getitem__)
        listed = set(plan)
        missing = [r for r in first_staged if r not in listed]
        if missing:
            raise BackendError(f"[backend] the plan's prefetch order ({len(plan)} references) does not list the "
                               f"streamed weight {missing[0]!r}; a plan and the streamed set it was made with agree")
        ranked = [r for r in dict.fromkeys(plan) if r in first_staged and first_use[r] == first_staged[r]]
        for r in sorted((r for r in first_staged if first_use[r] != first_staged[r]), key=first_staged.__getitem__):
            at = next((i for i, q in enumerate(ranked) if first_staged[q] > first_staged[r]), len(ranked))
            ranked.insert(at, r)
        return ranked

    def staging_bytes(self) -> int:
        """Bytes streaming reads through: the store's staging pool, the embedding row buffers, the expert cache."""
        rows = self._row_buffer_bytes() * ROW_CHUNK * self._row_sets()
        cache = int(self.expert_cache.budget_bytes) if self.expert_cache is not None else 0
        return int(getattr(self.store, "staging_capacity", 0)) + rows + cache

    def _row_buffer_bytes(self) -> int:
        """Bytes of one row buffer: the longest row of any table the row path reads, plus a page (a read may
        straddle one); 0 without such a table. :meth:`staging_bytes` counts what :meth:`_row_buffers` allocates."""
        from uaii.storage import PAGE, round_up

        tables = [self.exe.graph.tensor(x) for info in self.exe.infos for x in self._row_tables(info)]
        return max((round_up(t.dtype.nbytes(_row_elements(t)), PAGE) + PAGE for t in tables), default=0)

    def _row_sets(self) -> int:
        """Row buffers per looked-up row: the most streamed tables one row lookup reads (an MLX table: up to 3)."""
        return max((len(self._row_tables(info)) for info in self.exe.infos), default=0) or 1

    def _row_buffers(self) -> list[Any]:
        """The row buffers, ROW_CHUNK per table a lookup reads; one set for every node, sized for the longest row."""
        from uaii.storage import AlignedBuffer

        if not self._row_bufs:
            self._row_bufs = [AlignedBuffer(self._row_buffer_bytes()) for _ in range(ROW_CHUNK * self._row_sets())]
        return self._row_bufs

    # --- what a node reads -----------------------------------------------------------------------------------
    def streamed_inputs(self, info: NodeInfo) -> list[str]:
        return list(dict.fromkeys(x for x in info.node.inputs if x in self.names))

    def _reads(self, info: NodeInfo, access: WeightAccess, among: Collection[str] | None = None) -> list[str]:
        """The node's weights in ``among`` (default: the streamed ones) that its op reads with ``access``, in slot
        order. The op's schema says how it reads each input (``uaii.ir.ops.WeightAccess``); no slot or op name here."""
        names = self.names if among is None else among
        return [w.name for w in info.schema.weight_inputs(info.node, names, info.attrs, access=access)]

    def _row_tables(self, info: NodeInfo) -> list[str]:
        """The streamed tables a node reads by rows (ROWS access) when the row path computes its op; empty: the node
        stages what it reads."""
        if info.node.op in PACKED_ROW_OPS:
            return self._reads(info, WeightAccess.ROWS)
        table = self._row_table(info)
        return [] if table is None else [table]

    def _row_table(self, info: NodeInfo) -> str | None:
        """The streamed table an Embedding or Gather reads by rows when the row path computes it: rows (all after
        axis 0, whole blocks) copied (the output keeps the table's dtype) or dequantized into f32. None: the node
        stages what it reads."""
        tables = self._reads(info, WeightAccess.ROWS)
        if len(tables) != 1 or info.node.op not in ROW_OPS or len(info.node.inputs) != 2:
            return None
        t = self.exe.graph.tensor(tables[0])
        out = self.exe.graph.tensor(info.node.outputs[0]).dtype
        if not t.shape or _row_elements(t) % t.dtype.block_size or t.weight is None or (out is not t.dtype and (
                t.dtype not in DEQUANT_TYPES or out is not DType.F32)):
            return None
        return tables[0]

    def _moe(self, info: NodeInfo) -> bool:
        return bool(self._reads(info, WeightAccess.EXPERTS))

    def acquired_names(self, info: NodeInfo) -> list[str]:
        """Streamed weights a node acquires through staging (row lookups and expert banks do not)."""
        if self._moe(info):
            return [x for x in self.streamed_inputs(info) if x not in self._reads(info, WeightAccess.EXPERTS)]
        tables = self._row_tables(info)
        return [x for x in self.streamed_inputs(info) if x not in tables]

    def chunks(self, info: NodeInfo) -> list[tuple[str, int, int]] | None:
        """Row chunks ``(ref, start, stop)`` of a streamed [N, K] weight that the node's op reads by output rows
        (ROW_CHUNKS access: a MatMul stored transposed) and that is too large for one staging buffer; else None."""
        chunked = self._reads(info, WeightAccess.ROW_CHUNKS) if self.chunk_bytes else []
        if len(chunked) != 1 or info.node.op not in CHUNK_OPS or len(info.node.inputs) != 2:
            return None
        name = chunked[0]
        if name in self._chunks:
            return self._chunks[name]
        from uaii.storage import PAGE, rows_ref

        t = self.exe.graph.tensor(name)
        if (len(t.shape) != 2 or t.dtype not in DEQUANT_TYPES
                or self.store.window_bytes(self.ref_of[name]) <= self.chunk_bytes):
            return None
        n, k = (int(d) for d in t.shape)
        row = t.dtype.nbytes(k)
        per = max((self.chunk_bytes - PAGE) // row, 1)
        out = [(rows_ref(self.ref_of[name], a, min(a + per, n)), a, min(a + per, n)) for a in range(0, n, per)]
        self._chunks[name] = out
        return out

    def acquired_refs(self, info: NodeInfo) -> list[str]:
        return list(dict.fromkeys(read for _, read in self._staged_reads(info)))

    def _staged_reads(self, info: NodeInfo) -> list[tuple[str, str]]:
        """(weight reference, what is acquired for it) for each read of the node through staging."""
        chunks = self.chunks(info)
        if chunks is not None:
            ref = self.ref_of[self._reads(info, WeightAccess.ROW_CHUNKS)[0]]
            return [(ref, c[0]) for c in chunks]
        return [(self.ref_of[n], self.ref_of[n]) for n in self.acquired_names(info)]

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
        if info.node.op in PACKED_ROW_OPS and self._row_tables(info):
            return [self._packed_row_step(b, info)]
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
            self._live[name] = WeightData(name, t.dtype, tuple(int(d) for d in t.shape), weight_array(t, view),
                                          live=True)
        live = {name: w.raw if w.dtype.is_quantized else w.raw.reshape(w.shape) for name, w in self._live.items()}
        # the node's own weights over the binding's arrays, not a copy of them: every variant of every streamed node
        # keeps its child binding alive (copies: 6.5 MB with SmolLM2 at a tenth of its weights)
        child = Bind(self.exe, ChainMap(live, cast("MutableMapping[str, np.ndarray]", b.arrays)), b.types, b.state)
        try:
            steps = lower_node(child, info)
        finally:
            self._live.clear()
        self.relowered += 1
        return child.prologue + steps, child

    # --- runs ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Queue this run's reads (the plan's prefetch order, :attr:`order`); already queued or staged ones are
        skipped."""
        if self.order and not self._closed:
            self.store.prefetch(self.order)

    def close(self) -> None:
        self._closed = True
        self._row_bufs.clear()

    # --- table rows (Embedding, Gather) ---------------------------------------------------------------------------
    def _row_step(self, b: Bind, info: NodeInfo, table: str) -> Step:
        """Each looked-up row of ``table`` read on its own (``ref@rows=i:i+1``, the one row syntax of
        ``uaii.storage``) into a small row buffer, then copied to its output row, or dequantized into f32."""
        from uaii.storage import rows_ref

        node, t = info.node, self.exe.graph.tensor(table)
        assert t.weight is not None
        vocab, d = int(t.shape[0]), _row_elements(t)
        bufs, wraps, ref, store = self._row_buffers(), ROW_OPS[node.op], str(t.weight), self.store
        ids = b.index_as(node.inputs[1 - node.inputs.index(table)], np.int64)
        y = b.a(node.outputs[0])
        if not y.flags.c_contiguous:
            raise BackendError(f"[backend] node {node.name!r}: a table read by rows needs a contiguous output")
        put = self._row_writer(node.name, t.dtype, d, y, copy=self.exe.graph.tensor(node.outputs[0]).dtype is t.dtype)

        def step(_keep: Any = (ids, y, bufs)) -> None:
            for s in range(0, ids.size, ROW_CHUNK):
                rows = [int(i) for i in ids[s:s + ROW_CHUNK]]
                if wraps:
                    rows = [r + vocab if r < 0 else r for r in rows]
                bad = [r for r in rows if not 0 <= r < vocab]
                if bad:
                    raise BackendError(f"[backend] node {node.name!r}: index {bad[0]} is outside the table "
                                       f"{table!r} ({vocab} rows)")
                views = store.read_many_into([(rows_ref(ref, r, r + 1), bufs[j]) for j, r in enumerate(rows)])
                for j, v in enumerate(views):
                    put(s + j, v)

        return step

    def _packed_row_step(self, b: Bind, info: NodeInfo) -> Step:
        """QuantizedEmbedding over streamed tables: row i of each streamed tensor (packed values, scales, biases) read
        on its own into a row buffer, of a pinned one a view, then the row dequantized from them."""
        from uaii.backends.cpu.ops_mlxq import dequantize_row, packed_mlx
        from uaii.storage import rows_ref

        node, graph = info.node, self.exe.graph
        parts = [v for v in node.inputs[1:4] if v]
        streamed = [v for v in parts if v in self._row_tables(info)]
        pinned = {v: b.weight(v).raw.reshape(int(graph.tensor(v).shape[0]), -1) for v in parts if v not in streamed}
        vocab, dim = int(graph.tensor(parts[0]).shape[0]), int(info.attrs["dim"])
        row_bytes = {v: graph.tensor(v).dtype.nbytes(_row_elements(graph.tensor(v))) for v in streamed}
        types = {v: graph.tensor(v).dtype.numpy for v in streamed}
        refs = {v: self.ref_of[v] for v in streamed}
        bufs, store = self._row_buffers(), self.store
        ids = b.index_as(node.inputs[0], np.int64)
        y = b.a(node.outputs[0])
        if not y.flags.c_contiguous or y.dtype != np.float32:
            raise BackendError(f"[backend] node {node.name!r}: a table read by rows needs a contiguous float32 output")
        out = y.reshape(-1, dim)

        def row_arrays(views: dict[str, np.ndarray], r: int) -> dict[str, np.ndarray]:
            got = {v: views[v].reshape(-1).view(np.uint8)[:row_bytes[v]].view(types[v]).reshape(1, -1)
                   for v in streamed}
            got.update({v: a[r:r + 1] for v, a in pinned.items()})
            return got

        def step(_keep: Any = (ids, y, bufs)) -> None:
            flat = ids.reshape(-1)
            for s in range(0, flat.size, ROW_CHUNK):
                rows = [int(i) for i in flat[s:s + ROW_CHUNK]]
                bad = [r for r in rows if not 0 <= r < vocab]
                if bad:
                    raise BackendError(f"[backend] node {node.name!r}: index {bad[0]} is outside the table "
                                       f"{parts[0]!r} ({vocab} rows)")
                reads = [(rows_ref(refs[v], r, r + 1), bufs[t * ROW_CHUNK + j])
                         for t, v in enumerate(streamed) for j, r in enumerate(rows)]
                views = store.read_many_into(reads)
                for j, r in enumerate(rows):
                    got = row_arrays({v: views[t * len(rows) + j] for t, v in enumerate(streamed)}, r)
                    rc = dequantize_row(packed_mlx(b, info, got, 1, dim), out[s + j])
                    if rc:
                        raise status_fail(f"node {node.name!r} (table row)", rc)

        return step

    @staticmethod
    def _row_writer(where: str, dtype: DType, d: int, y: np.ndarray, *, copy: bool) -> Any:
        """``put(i, row)``: output row ``i`` from the bytes of one table row, copied as they are or dequantized."""
        if copy:
            out = y.reshape(-1).view(np.uint8).reshape(-1, dtype.nbytes(d))

            def put_copy(i: int, v: np.ndarray) -> None:
                out[i] = v.reshape(-1).view(np.uint8)[:out.shape[1]]

            return put_copy
        assert dtype.gguf_id is not None
        gid, zero = dtype.gguf_id, np.zeros(1, np.int64)
        zptr = vptr(zero, "int64_t *")
        outs = [fptr(row) for row in y.reshape(-1, d)]

        def put_dequantized(i: int, v: np.ndarray, _keep: Any = zero) -> None:
            rc = lib.uk_get_rows(gid, ffi.from_buffer(v), 1, d, zptr, 1, outs[i])
            if rc:
                raise status_fail(f"node {where!r} (table row)", rc)

        return put_dequantized

    # --- row-chunked MatMul (an lm_head larger than a staging buffer) ------------------------------------------------
    def _chunked_matmul(self, b: Bind, info: NodeInfo, chunks: list[tuple[str, int, int]]) -> list[Step]:
        node = info.node
        name = self._reads(info, WeightAccess.ROW_CHUNKS)[0]
        t = self.exe.graph.tensor(name)
        x, y = b.a(node.inputs[1 - node.inputs.index(name)]), b.a(node.outputs[0])
        relu = CHUNK_OPS[node.op]
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
            if relu:
                np.maximum(y, 0, out=y)

        return [step]

    # --- MoE experts -------------------------------------------------------------------------------------------
    def _packed_moe_step(self, b: Bind, info: NodeInfo) -> Step:
        """QuantizedMoEExperts over banks streamed through the expert cache: each routed expert's slice of every bank
        tensor (packed values, scales, biases) read by its reference ``#e=N``, wrapped as it lies in the cache."""
        from uaii.backends.cpu.ops_extra import expert_step
        from uaii.backends.cpu.ops_mlxq import expert_weights

        cache, node, graph = self.expert_cache, info.node, self.exe.graph
        names = self._reads(info, WeightAccess.EXPERTS, self.exe.weight_names)
        refs: dict[str, list[str]] = {}
        for name in names:
            t = graph.tensor(name)
            if t.weight is None or len(t.shape) != 3:
                raise BackendError(f"[backend] expert bank {name!r} ({t.dtype.value}, {list(t.shape)}) cannot "
                                   "stream by expert")
            refs[name] = [str(t.weight.with_expert(e)) for e in range(int(t.shape[0]))]
        d_ff = int(graph.tensor(node.inputs[BANK_SLOTS["gate"][0]]).shape[1])

        def experts(e: int) -> tuple[PackedWeight, PackedWeight, PackedWeight]:
            raws = cache.get_many([refs[name][e] for name in names])
            gate, up, down = expert_weights(b, info, e, dict(zip(names, raws, strict=True)), one_expert=True)
            return gate, up, down

        return expert_step(b, info, d_ff, experts, f"node {node.name!r} (expert gemm)")

    def _moe_steps(self, b: Bind, info: NodeInfo) -> list[Step]:
        from uaii.backends.cpu.ops_extra import expert_step

        cache = self.expert_cache
        node = info.node
        if cache is None:
            raise BackendError(f"[backend] node {node.name!r}: streamed expert banks need an expert cache "
                               "(compile with expert_cache=ExpertCache(store, budget))")
        if node.op in PACKED_EXPERT_OPS:
            return [self._packed_moe_step(b, info)]
        banks = []
        for name in self._reads(info, WeightAccess.EXPERTS, self.exe.weight_names):  # gate, up, down (slot order)
            t = self.exe.graph.tensor(name)
            if t.dtype not in DEQUANT_TYPES or t.weight is None or len(t.shape) != 3:
                raise BackendError(f"[backend] expert bank {name!r} ({t.dtype.value}, {list(t.shape)}) cannot "
                                   "stream by expert")
            n_exp, rows, cols = (int(d) for d in t.shape)
            banks.append((t.dtype, rows, cols, [str(t.weight.with_expert(e)) for e in range(n_exp)]))

        def wrap(raws: list[Any]) -> tuple[PackedWeight, PackedWeight, PackedWeight]:
            gate, up, down = (PackedWeight.from_raw(raw, dtype, (rows, cols))  # the cache's bytes, as they are
                              for raw, (dtype, rows, cols, _) in zip(raws, banks, strict=True))
            return gate, up, down

        def experts(e: int) -> tuple[PackedWeight, PackedWeight, PackedWeight]:
            return wrap(cache.get_many([bank[3][e] for bank in banks]))

        def experts_of(es: list[int]) -> list[tuple[PackedWeight, PackedWeight, PackedWeight]] | None:
            refs = [bank[3][e] for e in es for bank in banks]
            if not cache.fits(refs):
                return None  # the smallest caches: one expert at a time
            raws, n = cache.get_many(refs), len(banks)
            return [wrap(raws[i * n:(i + 1) * n]) for i in range(len(es))]

        return [expert_step(b, info, banks[0][1], experts, f"node {node.name!r} (expert gemm)", experts_of)]


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

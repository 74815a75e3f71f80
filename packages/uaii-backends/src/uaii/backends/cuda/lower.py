"""Lowering one binding of a CUDA executable: each node of the plan's steps becomes steps that queue launches.

Why apart from the executable: this is the part that turns shapes and attributes into kernel arguments (row
counts, leading dimensions, table offsets, which rows a streamed piece covers), where one wrong number is a wrong
token, not an error — so it is a list of small functions, one per op, each checked against the CPU backend through
the host model (tests/runtime/test_cuda_executable.py, test_cuda_parity.py, tests/backends/test_cuda_conformance.py).
A node this backend cannot run in the form given (a block-quantized weight stored [K, N] or gathered by Gather,
integer arithmetic narrower than the device's 32-bit words, an i64 constant beyond them) is a BackendError naming
it, at compile time; what only the data shows (an integer division by zero, an index out of range, an i64 result
beyond 32 bits) faults, and the run raises naming the node (:meth:`Binder.fault`). The ops beyond a decoder's are
lowered in lower_ew.py and lower_packed.py; the ops and forms are listed in docs/backends.md.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from uaii.backends.analysis import NodeInfo, VType
from uaii.backends.base import BackendError
from uaii.backends.cuda import geometry, lower_ew, lower_packed
from uaii.backends.cuda.executable import Piece, device_step, table_layout
from uaii.backends.cuda.lower_ew import ROUND
from uaii.backends.cuda.sources import MMQ_TYPES, TYPES
from uaii.backends.kv_book import rope_frequencies
from uaii.backends.webgpu.arena import VIEW_OPS
from uaii.ir import DType

if TYPE_CHECKING:
    from uaii.backends.cuda.executable import CudaExecutable, RunContext

c_int, c_ll, c_f, c_p = ctypes.c_int, ctypes.c_longlong, ctypes.c_float, ctypes.c_uint64
SCORES_BYTES = 64 << 20
"""The most bytes of attention scores one launch of the attention kernels writes; more rows run in chunks."""
UNARY = {"Sigmoid": 0, "Silu": 3, "Tanh": 4, "Relu": 5, "Neg": 6, "Exp": 7, "Abs": 8, "Cos": 9, "Sin": 10, "Erf": 11,
         "Log": 12, "Reciprocal": 13, "Sqrt": 14}
"""Element-wise ops and their ``op`` code in ops.cu's ``unary`` (Gelu takes 1 or 2 by its ``approximate``)."""
LOWERERS: dict[str, Callable[[Binder, NodeInfo], None]] = {**lower_ew.LOWER, **lower_packed.LOWER}
"""Ops lowered by functions of their own modules (the ONNX-style element-wise, movement and reduction ops in
lower_ew.py, the packed layouts of other tools in lower_packed.py), called as ``fn(binder, info)``."""
OPS = frozenset({"Embedding", "RMSNorm", "AddRMSNorm", "LayerNorm", "MatMul", "GroupedMatMul", "RoPE", "Attention",
                 "SwiGLU", "GeGLU", "Add", "Mul", "Gelu", *UNARY, "Reshape", "Identity", "Slice", "Split",
                 "MoERouter", "MoEExperts", "MoEExpertsSwiGLU", *LOWERERS})
"""The ops the CUDA executable lowers (Capabilities.ops)."""


def _broadcast_run(b: tuple[int, ...], out: tuple[int, ...]) -> tuple[int | None, int]:
    """(nb, inner) when ``b`` broadcast to ``out`` (right-aligned) is one run of ``out``'s dims with ones around it
    — b's values repeat every ``inner`` elements, ``nb`` of them cycling — else (None, 0)."""
    if len(b) > len(out):
        return None, 0
    full = (1,) * (len(out) - len(b)) + tuple(b)
    kept = [i for i, (bd, od) in enumerate(zip(full, out, strict=True)) if bd != 1 or od == 1]
    live = [i for i in kept if full[i] != 1]
    if any(full[i] != out[i] for i in live):
        return None, 0
    if not live:
        return 1, 1
    lo, hi = live[0], live[-1]
    if any(full[i] == 1 and out[i] != 1 for i in range(lo, hi + 1)):
        return None, 0
    return geometry.count(out[lo:hi + 1]), geometry.count(out[hi + 1:])


def _on_rows(launch: Callable[[int, int, int], None], piece: Piece) -> Callable[[int], None]:
    """``launch`` over the rows a piece holds, at the staging slot's address."""
    return lambda slot: launch(slot, piece.start, piece.stop - piece.start)


AttentionLaunches = list[tuple[str, geometry.Launch, tuple[Any, ...]]]
"""The attention kernels of one run, (kernel, launch, arguments) in order."""


@dataclass
class AttentionPlan:
    """One attention node's launches at one context size: rows per chunk, the scores' bytes (0: the fused form,
    which keeps none) and the whole scratch's, and the launches made for the scratch at ``scores``."""

    chunk: int
    scores_bytes: int
    scratch_bytes: int
    scores: int = -1
    launches: AttentionLaunches = field(default_factory=list)


class AttentionMask(NamedTuple):
    """An Attention node's mask input as attn_mask reads it: the address of its device words (f32 when ``additive``,
    else i32 0/1), that of the i64 offset of each query row's mask, and its strides along heads and keys (0 where
    broadcast)."""

    ptr: int
    additive: bool
    rows: int
    h_stride: int
    key_stride: int


class Binder:
    """The steps of one binding (see the module doc): ``steps`` in order, the streamed ``pieces`` they read,
    device buffers it ``owned`` (freed with the binding), ``n_new`` tokens per state and the attention ``rows``."""

    def __init__(self, exe: CudaExecutable, types: dict[str, VType], addr: dict[str, int], batched: bool) -> None:
        self.exe = exe
        self.dev = exe.dev
        self.types = types
        self.addr = addr
        self.batched = batched
        self.steps: list[Callable[[RunContext], None]] = []
        self.pieces: list[Piece] = []
        self.owned: list[Any] = []
        self._shared: dict[str, Any] = {}
        self.n_new = 0
        self.tables: Any = None
        self.pinned_tables: Any = None
        self.node = ""
        self.faults: list[str] = []
        self.bit_feeds: set[str] = set()  # feeds the kernels read as stored bits (packed uint32 words): fed as bytes

    # --- helpers ---------------------------------------------------------------------------------------------
    def fail(self, why: str) -> BackendError:
        return BackendError(f"[backend] cuda: node {self.node!r}: {why}")

    def a(self, name: str) -> int:
        """Device address of activation ``name``."""
        if name not in self.addr:
            raise self.fail(f"value {name!r} has no device region (a weight read where an activation is expected)")
        return self.addr[name]

    def fault(self, what: str) -> tuple[int, int]:
        """(address of the executable's fault word, this node's code): a kernel that meets ``what`` writes the code
        there, and the run raises a BackendError naming the node and ``what`` (kernels cannot raise)."""
        self.faults.append(f"[backend] cuda: node {self.node!r}: {what}")
        return self.exe.fault_ptr(), len(self.faults)

    def launch(self, module: str, kernel: str, at: geometry.Launch, *args: Any) -> None:
        dev, stream = self.dev, self.exe.stream
        self.steps.append(device_step(lambda ctx: dev.launch(module, kernel, at, *args, stream=stream)))

    def weight_reader(self, name: str, form: str, rows: int,
                      launch: Callable[[int, int, int], None]) -> None:
        """Steps that call ``launch(address, first row, rows)`` over weight ``name`` in ``form``: once on the
        resident copy, or per streamed piece on its staging slot. ``launch`` queues device work only (a resident
        weight's step is a :func:`device_step`)."""
        if name not in self.exe.streamed:
            ptr = self.exe.weight(name, form)
            self.steps.append(device_step(lambda ctx: launch(ptr, 0, rows)))
            return
        for piece in self.exe.pieces_of(name, form):
            self.pieces.append(piece)
            self.steps.append(self.exe.piece_step(len(self.pieces) - 1, _on_rows(launch, piece)))

    def is_weight(self, name: str) -> bool:
        return name in self.exe.weight_names

    def floats(self, *names: str) -> None:
        """Refuse integer values: the kernels compute in f32 (an i32 through them would be garbage)."""
        for n in names:
            dt = lower_ew.dtype_of(self, n)
            if lower_ew.is_int(dt):
                raise self.fail(f"{n!r} is {dt.value}: the cuda kernels compute on floats")

    # --- dispatch --------------------------------------------------------------------------------------------
    def lower(self, info: NodeInfo) -> None:
        node = info.node
        self.node = node.name
        op = node.op
        if op in VIEW_OPS:
            return self.view(info)
        if op in UNARY:
            return self.unary_map(info, UNARY[op])
        fn = getattr(self, f"op_{op}", None)
        if fn is not None:
            return fn(info)
        if op not in LOWERERS:
            raise self.fail(f"op {op!r} is not implemented by the cuda backend")
        LOWERERS[op](self, info)

    def view(self, info: NodeInfo) -> None:
        src, dst = info.node.inputs[0], info.node.outputs[0]
        if self.is_weight(src):  # the weight's device form (raw blocks, or words) copied into the value's region
            t = self.exe.tensor(src)
            if src in self.exe.streamed:
                raise self.fail(f"a Reshape/Identity of the streamed weight {src!r}")
            form = "packed" if t.dtype.is_quantized and self.types[dst].dtype.is_quantized else "f32"
            nbytes = self.nbytes(dst) if form == "packed" else 4 * geometry.count(self.types[dst].shape)
            self.copy(self.a(dst), self.exe.weight(src, form), nbytes)
            return
        if self.a(src) != self.a(dst):
            self.copy(self.a(dst), self.a(src), self.nbytes(dst))

    def nbytes(self, name: str) -> int:
        t = self.types[name]
        return 4 * geometry.count(t.shape) if not t.dtype.is_quantized else t.dtype.nbytes(geometry.count(t.shape))

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        dev, stream = self.dev, self.exe.stream
        if nbytes:
            self.steps.append(device_step(lambda ctx: dev.copy_dtod(dst, src, nbytes, stream)))

    # --- ops -------------------------------------------------------------------------------------------------
    def op_Embedding(self, info: NodeInfo) -> None:
        ids, table = info.node.inputs[:2]
        y = self.a(info.node.outputs[0])
        if self.types[ids].dtype.is_float or self.types[ids].dtype.is_quantized:
            raise self.fail(f"Embedding ids {ids!r} are {self.types[ids].dtype.value} (the kernel reads integers)")
        t = self.exe.tensor(table)
        if t.dtype not in TYPES or len(t.shape) != 2 or int(t.shape[1]) % 32:
            raise self.fail(f"an Embedding table of {t.dtype.value} {tuple(t.shape)} (the kernels read "
                            f"{', '.join(d.value for d in TYPES)} rows of whole 32-value units)")
        width = int(t.shape[1])
        units, row_bytes = width // 32, t.dtype.nbytes(width)
        r = geometry.count(self.types[ids].shape)
        if not r:
            return
        kernel, at = f"rows_{TYPES[t.dtype][1]}", geometry.elementwise(r * units)
        vocab = int(t.shape[0])
        fault, code = self.fault(f"a token id outside the table's {vocab} rows")
        if table not in self.exe.streamed:
            w = self.exe.weight(table, "packed")
            self.launch("dequant", kernel, at, c_p(w), c_ll(row_bytes), c_ll(units), c_p(self.a(ids)), c_int(r),
                        c_p(y), c_ll(vocab), c_p(fault), c_int(code))
            return
        if ids not in self.exe.input_names:
            raise self.fail("a streamed Embedding table needs its ids fed by the caller (they are read on the host)")
        p = len(self.pieces)
        self.pieces.append(Piece(table, "gather", 0, r, r * row_bytes, ids=ids))
        dev, stream, exe = self.dev, self.exe.stream, self.exe
        exe.ids_ptr(r)  # sized now; read when the step runs (a later, longer binding may grow it)
        self.steps.append(self.exe.piece_step(p, lambda slot: dev.launch(
            "dequant", kernel, at, c_p(slot), c_ll(row_bytes), c_ll(units), c_p(exe.ids_ptr(r)), c_int(r), c_p(y),
            c_ll(r), c_p(fault), c_int(code), stream=stream)))  # the slot holds the r gathered rows

    def _norm_args(self, info: NodeInfo, x: str) -> tuple[int, int, float, int]:
        shape = self.types[x].shape
        n = int(shape[-1]) if shape else 1
        return n, geometry.count(shape) // max(n, 1), float(info.attrs["eps"]), int(bool(info.attrs["add_unit_offset"]))

    def op_RMSNorm(self, info: NodeInfo) -> None:
        x, w = info.node.inputs[:2]
        self.floats(x, info.node.outputs[0])
        n, rows, eps, off = self._norm_args(info, x)
        self._norm_weight(w, n)
        if not rows:
            return
        px, py, dev, stream = self.a(x), self.a(info.node.outputs[0]), self.dev, self.exe.stream
        self.weight_reader(w, "f32", 1, lambda pw, _a, _n: dev.launch(
            "ops", "rms_norm", geometry.norm(rows), c_p(px), c_p(pw), c_p(py), c_int(n), c_f(eps), c_int(off),
            stream=stream))

    def op_AddRMSNorm(self, info: NodeInfo) -> None:
        a, b, w = info.node.inputs[:3]
        self.floats(a, b)
        if self.types[a].shape != self.types[b].shape:
            raise self.fail(f"AddRMSNorm of shapes {self.types[a].shape} and {self.types[b].shape} (the kernel adds "
                            "equal shapes)")
        n, rows, eps, off = self._norm_args(info, a)
        self._norm_weight(w, n)
        if not rows:
            return
        outs = [*info.node.outputs, ""]
        pa, pb, py = self.a(a), self.a(b), self.a(outs[0])
        ps = self.a(outs[1]) if outs[1] else 0
        dev, stream = self.dev, self.exe.stream
        self.weight_reader(w, "f32", 1, lambda pw, _a, _n: dev.launch(
            "ops", "add_rms_norm", geometry.norm(rows), c_p(pa), c_p(pb), c_p(ps), c_p(pw), c_p(py), c_int(n),
            c_f(eps), c_int(off), stream=stream))

    def _norm_weight(self, w: str, n: int) -> None:
        if not self.is_weight(w) or geometry.count(tuple(int(d) for d in self.exe.tensor(w).shape)) != n:
            raise self.fail(f"the norm scale {w!r} must be a weight of {n} values")

    def op_MatMul(self, info: NodeInfo) -> None:
        x, w = info.node.inputs[:2]
        self.matmul(x, w, info.node.outputs[0], bool(info.attrs.get("transpose_b", False)))

    def op_GroupedMatMul(self, info: NodeInfo) -> None:
        x, *ws = info.node.inputs
        quantized: dict[tuple[int, int, int, int], tuple[int, int, int]] = {}  # x quantized once for the group
        for w, y in zip(ws, info.node.outputs, strict=True):
            self.matmul(x, w, y, bool(info.attrs.get("transpose_b", False)), quantized)

    def gemv_shape(self, w: str, trans_b: bool) -> tuple[int, int] | None:
        """Weight ``w`` as the GEMV (and int8 GEMM) read it, [N, K] — a 2-D weight of a decoded type stored [N, K]
        (transpose_b), or [K, N] of a plain type (transposed once on upload), K whole 32-value units — or None when
        they do not read it."""
        if not self.is_weight(w):
            return None
        t = self.exe.tensor(w)
        shape = tuple(int(d) for d in t.shape)
        shape = shape if trans_b else shape[::-1]
        ok = len(shape) == 2 and t.dtype in TYPES and (trans_b or not t.dtype.is_quantized) and shape[1] % 32 == 0
        return (shape[0], shape[1]) if ok else None

    def quantized_rows(self, src: int, ldx: int, m: int, k: int, kind: str,
                       done: dict[tuple[int, int, int, int], tuple[int, int, int]]) -> tuple[int, int, int]:
        """(q, d, s): the addresses of the ``m`` rows of ``k`` values at ``src`` (``ldx`` apart) quantized to int8
        blocks (quant_act, the CPU's integer path's quantizer) in the binding's shared scratch of ``kind`` —
        launched here, or taken from ``done`` where a node quantized the same rows for an earlier product."""
        key = (src, ldx, m, k)
        if key not in done:
            units = k // 32
            q_bytes, s_bytes = -(-m * k // 256) * 256, -(-4 * m * units // 256) * 256
            pq = self.shared(kind, q_bytes + 2 * s_bytes)
            pd, ps = pq + q_bytes, pq + q_bytes + s_bytes
            self.launch("mmq", "quant_act", geometry.elementwise(m * units), c_p(src), c_ll(ldx), c_int(m),
                        c_int(k), c_p(pq), c_p(pd), c_p(ps))
            done[key] = (pq, pd, ps)
        return done[key]

    def matmul(self, x: str, w: str, y: str, trans_b: bool,
               quantized: dict[tuple[int, int, int, int], tuple[int, int, int]] | None = None) -> None:
        """y[m, :] = x[m, :] . W[n, :] for every row m; over each streamed piece, the piece's output columns. The
        block types multiply x's rows quantized to int8 blocks (as the CPU's integer path does): the int8 GEMM beyond
        8 rows, the int8 GEMV (gemvq_, launches of up to 8 rows) below; the float types, and every type with
        ``gemm="f32"`` (CudaBackend.compile), the float GEMV (launches of up to 8 rows). A product
        the GEMV does not read (an activation as B, a plain weight of any K) is ew.cu's general f32 product."""
        shape = self.gemv_shape(w, trans_b)
        if shape is None:
            if self.is_weight(w) and self.exe.tensor(w).dtype.is_quantized:
                t = self.exe.tensor(w)
                raise self.fail(f"weight {w!r} is {t.dtype.value} {tuple(t.shape)} (transpose_b={trans_b}): the "
                                "kernels read block-quantized weights stored [N, K] of whole 32-value units")
            return lower_ew.general_matmul(self, x, w, y, trans_b=trans_b)
        t = self.exe.tensor(w)
        form = "packed" if trans_b else "packed_t"
        n, k = shape
        self.floats(x, y)
        xt = self.types[x]
        if int(xt.shape[-1]) != k:
            raise self.fail(f"x has {xt.shape[-1]} features, weight {w!r} {k}")
        m = geometry.count(xt.shape) // k
        if not m:
            return
        px, py, row_bytes, sfx = self.a(x), self.a(y), t.dtype.nbytes(k), TYPES[t.dtype][1]
        dev, stream = self.dev, self.exe.stream
        if t.dtype in MMQ_TYPES and self.exe.int8:
            pq, pd, ps = self.quantized_rows(px, k, m, k, "activations_i8", {} if quantized is None else quantized)
            if m > 8:
                def gemm(pw: int, r0: int, rows: int) -> None:
                    dev.launch("mmq", f"mmq_{sfx}", geometry.mmq(rows, m), c_p(pw), c_ll(row_bytes), c_int(rows),
                               c_int(k), c_p(pq), c_p(pd), c_p(ps), c_int(m), c_p(py + 4 * r0), c_ll(n), stream=stream)
                self.weight_reader(w, form, n, gemm)
                return
            units = k // 32
            splits = geometry.gemv_splits(m)

            def gemvq(pw: int, r0: int, rows: int) -> None:
                at = geometry.gemv(rows)
                for start, size in splits:
                    dev.launch("gemv", f"gemvq_{sfx}_m{size}", at, c_p(pw), c_ll(row_bytes), c_int(rows), c_int(k),
                               c_p(pq + start * k), c_p(pd + 4 * start * units), c_p(ps + 4 * start * units),
                               c_p(py + 4 * (start * n + r0)), c_ll(n), stream=stream)
            self.weight_reader(w, form, n, gemvq)
            return
        splits = geometry.gemv_splits(m)

        def gemv(pw: int, r0: int, rows: int) -> None:
            at = geometry.gemv(rows)
            for start, size in splits:
                dev.launch("gemv", f"gemv_{sfx}_m{size}", at, c_p(pw), c_ll(row_bytes), c_int(rows), c_int(k),
                           c_p(px + 4 * start * k), c_ll(k), c_p(py + 4 * (start * n + r0)), c_ll(n), stream=stream)
        self.weight_reader(w, form, n, gemv)

    def op_RoPE(self, info: NodeInfo) -> None:
        node, attrs = info.node, info.attrs
        x, pos = node.inputs[:2]
        self.floats(x)
        if self.types[pos].dtype.is_float:
            raise self.fail(f"RoPE positions {pos!r} are {self.types[pos].dtype.value} (the kernel reads integers)")
        shape = self.types[x].shape
        heads, d = int(shape[-2]), int(shape[-1])
        rot = int(attrs["rotary_dims"]) or d
        rows = geometry.count(shape) // max(heads * d, 1)
        if geometry.count(self.types[pos].shape) != rows:
            raise self.fail(f"{geometry.count(self.types[pos].shape)} positions for {rows} rows")
        ff = None
        if len(node.inputs) > 2 and node.inputs[2]:
            ff = self.exe.host_f32(node.inputs[2])
        inv = self.exe.derived(("rope", node.name), lambda: rope_frequencies(rot, attrs, ff).astype(np.float32))
        px, py = self.a(x), self.a(node.outputs[0])
        if not rows:
            return
        if px != py:
            self.copy(py, px, 4 * geometry.count(shape))
        self.launch("ops", "rope", geometry.elementwise(rows * heads * (rot // 2)), c_p(py), c_p(self.a(pos)),
                    c_p(inv), c_int(rows), c_int(heads), c_int(d), c_int(rot), c_int(int(attrs["mode"] == "neox")),
                    c_f(float(attrs["attn_factor"])))

    def op_Attention(self, info: NodeInfo) -> None:
        node, attrs = info.node, info.attrs
        q, k, v = node.inputs[:3]
        self.floats(q, k, v)
        kv = self.exe.kv
        if kv is not None and node.name in kv.layer:
            if not attrs["causal"]:
                raise self.fail("non-causal attention over a KV cache is not lowered")
            if len(node.inputs) > 5 and node.inputs[5]:  # kv_layers leaves a masked Attention functional
                raise self.fail("a mask input over the KV state is not lowered (the state's length changes from run "
                                "to run, the mask's key axis does not)")
            return self._cached_attention(info)
        self._attention_over_values(info)

    def _launch_attention(self, info: NodeInfo, rows: int, tables: int, at_t: dict[str, int], layer: int,
                          s_max: int, mask: AttentionMask | None = None,
                          plans: dict[int, AttentionPlan] | None = None) -> None:
        """The attention kernels over ``rows`` query rows whose per-row tables are at ``tables`` (laid out as
        :func:`table_layout` with ``at_t``; keys and values of table column ``layer``): without a ``mask`` and for
        dv <= ATTN_KEYS x FLASH_VALUES the fused form (attn_flash + attn_flash_sum, chunks of rows within the grid's
        y/z limit); else in chunks of rows whose scores fit SCORES_BYTES (and that limit), with the node's ``mask``
        applied to the scores between the first two (attn_mask); either over stretches of keys when a chunk has few
        (row, head) pairs (geometry.attention); queued on the compute stream now (called by a step, or at bind
        time). The launches depend on ``s_max`` and the scratch's address only: a step passes ``plans`` to keep
        them by ``s_max``, so that a run that is not a graph replay recomputes nothing but the scratch's address."""
        plan = plans.get(s_max) if plans is not None else None
        if plan is None:
            hq = int(self.types[info.node.inputs[0]].shape[-2])
            hkv, dv = int(self.types[info.node.inputs[1]].shape[-2]), int(self.types[info.node.inputs[2]].shape[-1])
            if mask is None and dv <= geometry.ATTN_KEYS * geometry.FLASH_VALUES:  # the fused form: no scores
                chunk = max(1, min(rows, geometry.MAX_GRID_YZ))
                plan = AttentionPlan(chunk, 0, max(geometry.attention(c, hq, hkv, s_max, dv).flash_bytes
                                                   for c in {chunk, rows % chunk or chunk}))
            else:
                chunk = max(1, min(rows, SCORES_BYTES // (4 * hq * s_max), geometry.MAX_GRID_YZ))
                partial = max(geometry.attention(c, hq, hkv, s_max, dv).partial_bytes
                              for c in {chunk, rows % chunk or chunk})
                scores_bytes = -(-4 * chunk * hq * s_max // 256) * 256
                plan = AttentionPlan(chunk, scores_bytes, scores_bytes + partial)  # partial sums after the scores
        scores = self.exe.scores(plan.scratch_bytes)
        if plan.scores != scores:  # first run, or the scratch moved
            plan.launches = self._attention_launches(info, rows, tables, at_t, layer, s_max, mask, plan.chunk,
                                                     scores, plan.scores_bytes)
            plan.scores = scores
            if plans is not None:
                if len(plans) >= 8:  # contexts that grew: the old sizes never come back
                    plans.clear()
                plans[s_max] = plan
        dev, stream = self.dev, self.exe.stream
        for kernel, at, args in plan.launches:
            dev.launch("attention", kernel, at, *args, stream=stream)

    def _attention_launches(self, info: NodeInfo, rows: int, tables: int, at_t: dict[str, int], layer: int,
                            s_max: int, mask: AttentionMask | None, chunk: int, scores: int,
                            scores_bytes: int) -> AttentionLaunches:
        """(kernel, launch, arguments) of :meth:`_launch_attention`, in order."""
        node, attrs = info.node, info.attrs
        q, k, v = node.inputs[:3]
        hq, d = int(self.types[q].shape[-2]), int(self.types[q].shape[-1])
        hkv, dv = int(self.types[k].shape[-2]), int(self.types[v].shape[-1])
        scale = float(attrs["scale"]) or 1.0 / math.sqrt(d)
        window, sinks, softcap = int(attrs["sliding_window"]), int(attrs["sinks"]), float(attrs["softcap"])
        pq, py = self.a(q), self.a(node.outputs[0])
        out: AttentionLaunches = []
        for r0 in range(0, rows, chunk):
            rc = min(chunk, rows - r0)
            at = geometry.attention(rc, hq, hkv, s_max, dv)
            kcp, vcp = tables + at_t["k"] + 8 * (layer * rows + r0), tables + at_t["v"] + 8 * (layer * rows + r0)
            f16, used = tables + at_t["f16"] + 4 * r0, tables + at_t["used"] + 8 * r0
            qpos, kpos = tables + at_t["qpos"] + 4 * r0, tables + at_t["kpos"] + 8 * r0
            y = py + 4 * r0 * hq * dv
            if scores_bytes == 0:  # the fused form (the plan keeps no scores): the scratch holds the stretches
                out.append(("attn_flash", at.flash, (c_p(pq + 4 * r0 * hq * d), c_p(kcp), c_p(vcp), c_p(f16),
                                                     c_p(used), c_p(qpos), c_p(kpos), c_int(hq), c_int(hkv), c_int(d),
                                                     c_int(dv), c_f(scale), c_f(softcap), c_int(window),
                                                     c_int(sinks), c_ll(s_max), c_int(at.splits), c_p(scores))))
                out.append(("attn_flash_sum", at.flash_sum, (c_p(scores), c_p(0), c_int(hq), c_int(dv),
                                                             c_int(at.splits), c_p(y))))
                continue
            out.append(("attn_scores", at.scores, (c_p(pq + 4 * r0 * hq * d), c_p(kcp), c_p(f16), c_p(used),
                                                   c_p(qpos), c_p(kpos), c_int(hq), c_int(hkv), c_int(d),
                                                   c_f(scale), c_f(softcap), c_int(window), c_int(sinks),
                                                   c_p(scores), c_ll(s_max))))
            if mask is not None:
                out.append(("attn_mask", at.mask, (c_p(scores), c_p(used), c_p(mask.ptr), c_int(int(mask.additive)),
                                                   c_p(mask.rows + 8 * r0), c_ll(mask.h_stride),
                                                   c_ll(mask.key_stride), c_int(hq), c_ll(s_max))))
            out.append(("attn_softmax", at.softmax, (c_p(scores), c_p(used), c_p(0), c_int(hq), c_ll(s_max))))
            out.append(("attn_wsum", at.wsum, (c_p(scores), c_p(vcp), c_p(f16), c_p(used), c_int(hq), c_int(hkv),
                                               c_int(dv), c_ll(s_max), c_int(at.splits),
                                               c_p(scores + scores_bytes if at.splits > 1 else y))))
            if at.splits > 1:
                out.append(("attn_wsum_sum", at.wsum_sum, (c_p(scores + scores_bytes), c_int(hq), c_int(dv),
                                                           c_int(at.splits), c_p(y))))
        return out

    def _cached_attention(self, info: NodeInfo) -> None:
        """New keys and values into the run's state(s) at their ``used`` slots (kv_store), then attention over
        the run's tables (filled by the executable each run: a prefill's rows share one cache, a batch's rows are
        one token of each state)."""
        node = info.node
        kv = self.exe.kv
        assert kv is not None
        layer, n_layers = kv.layer[node.name], len(kv.layers)
        q, k, v = node.inputs[:3]
        n = int(self.types[q].shape[0])
        hkv, d, dv = int(self.types[k].shape[1]), int(self.types[k].shape[2]), int(self.types[v].shape[2])
        if not n:
            return
        self.n_new = n
        at = table_layout(n, n_layers)
        if self.tables is None:
            self.tables = self.dev.alloc(at["size"])
            self.pinned_tables = self.dev.alloc_host(at["size"])
        pk, pv, dev, stream, batched = self.a(k), self.a(v), self.dev, self.exe.stream, self.batched
        tables = int(self.tables.ptr)
        wk, wv = hkv * d, hkv * dv

        seq_rows = 1 if batched else n
        kv_f16, used = tables + at["f16"], tables + at["used"]
        stores = [(src, width, tables + at[col] + 8 * layer * n) for src, width, col in ((pk, wk, "k"), (pv, wv, "v"))]
        plans: dict[int, AttentionPlan] = {}

        def step(ctx: RunContext) -> None:
            for src, width, caches in stores:  # every row's cache, slot and f16 flag come from the tables
                dev.launch("attention", "kv_store", geometry.elementwise(n * width), c_p(src), c_ll(width), c_int(n),
                           c_int(width), c_p(caches), c_p(used), c_p(kv_f16), c_int(seq_rows), stream=stream)
            self._launch_attention(info, n, tables, at, layer, max(s.capacity for s in ctx.states), plans=plans)
        self.steps.append(device_step(step))

    def _attention_over_values(self, info: NodeInfo) -> None:
        """Attention over the node's own keys and values (past ones first, written with the new ones into the
        present outputs or a scratch): the same kernels over tables made once at bind time, one row per query of
        every batch element (batch-major, as q and Y lie) reading its batch element's keys and values (their batch
        dims broadcast to q's) at the positions :meth:`_query_positions` gives; a mask input through attn_mask."""
        node, attrs = info.node, info.attrs
        ins = [*node.inputs, "", ""]
        q, k, v, past_k, past_v = ins[:5]
        if not attrs["causal"] and int(attrs["sliding_window"]) and int(attrs["sinks"]):
            raise self.fail("sink tokens in a sliding window without a causal mask are not lowered (the kernels' "
                            "positions express a bidirectional window only without sinks)")
        keys, values = self._present(info, 1, past_k, k), self._present(info, 2, past_v, v)
        shape = self.types[q].shape
        batch, t, hq = shape[:-3], int(shape[-3]), int(shape[-2])
        s = int(self.types[k].shape[-3]) + (int(self.types[past_k].shape[-3]) if past_k else 0)
        rows = geometry.count(batch) * t
        if not rows:
            return
        at = table_layout(rows, 1)
        host = np.zeros(at["size"], np.uint8)
        element = np.repeat(np.arange(geometry.count(batch)), t)  # each row's batch element
        host[at["k"]:at["v"]].view(np.uint64)[:] = self._batch_addresses(keys, k, batch, s)[element]
        host[at["v"]:at["used"]].view(np.uint64)[:] = self._batch_addresses(values, v, batch, s)[element]
        host[at["used"]:at["kpos"]].view(np.int64)[:] = s
        kpos, qpos = self._query_positions(t, s, bool(attrs["causal"]))
        host[at["kpos"]:at["qpos"]].view(np.uint64)[:] = np.tile(kpos, geometry.count(batch))
        host[at["qpos"]:at["f16"]].view(np.int32)[:] = np.tile(qpos, geometry.count(batch))
        tables = self.dev.upload(host)
        self.owned.append(tables)
        mask = self._attention_mask(info, (*batch, hq, t, s))
        plans: dict[int, AttentionPlan] = {}
        self.steps.append(device_step(lambda ctx: self._launch_attention(info, rows, int(tables.ptr), at, 0, s, mask,
                                                                         plans)))

    def _present(self, info: NodeInfo, slot: int, past: str, new: str) -> int:
        """Address of concat(past, new) along the sequence axis, [..., s, heads, dim]: written into the node's present
        output ``slot`` (a scratch when it has none) when there is a past, else ``new`` itself (copied into the
        present output when there is one)."""
        present = [*info.node.outputs, "", ""][slot]
        shape = self.types[new].shape
        outer, t, width = geometry.count(shape[:-3]), int(shape[-3]), geometry.count(shape[-2:])
        p = int(self.types[past].shape[-3]) if past else 0
        if not p:
            if present:
                self.copy(self.a(present), self.a(new), self.nbytes(new))
            return self.a(new)
        if self.types[past].shape[:-3] != shape[:-3]:
            raise self.fail(f"past {self.types[past].shape} and new {shape} differ in their batch dims")
        s = p + t
        dst = self.a(present) if present else self._scratch(4 * outer * s * width)
        self._rows_into(self.a(past), p * width, dst, s * width, outer)
        self._rows_into(self.a(new), t * width, dst + 4 * p * width, s * width, outer)
        return dst

    def _rows_into(self, src: int, width: int, dst: int, dst_ld: int, rows: int) -> None:
        """``rows`` contiguous rows of ``width`` floats from ``src`` into rows ``dst_ld`` floats apart at ``dst``: one
        copy for one row, else copy_rows."""
        if rows == 1:
            self.copy(dst, src, 4 * width)
        elif rows and width:
            self.launch("ops", "copy_rows", geometry.elementwise(rows * width), c_p(src), c_ll(width), c_p(dst),
                        c_ll(dst_ld), c_int(rows), c_int(width))

    def _batch_addresses(self, base: int, new: str, batch: tuple[int, ...], s: int) -> np.ndarray:
        """The address in ``base`` ([..., s, heads, dim], the batch dims of ``new``) of the keys or values each batch
        element of q reads: ``new``'s batch dims broadcast to q's ``batch``, flattened."""
        shape = self.types[new].shape
        try:
            element = np.broadcast_to(np.arange(geometry.count(shape[:-3]), dtype=np.int64).reshape(shape[:-3]), batch)
        except ValueError:
            raise self.fail(f"{new!r} {shape}: its batch dims do not broadcast to q's {batch}") from None
        return (base + 4 * s * geometry.count(shape[-2:]) * element.reshape(-1)).astype(np.uint64)

    def _query_positions(self, t: int, s: int, causal: bool) -> tuple[np.ndarray, np.ndarray]:
        """For each query i (at position p = s - t + i) the address of its keys' positions and its own position, as
        attn_scores tests them (visible: kp <= qp, and not qp - kp >= window). Causal: keys at 0 .. s - 1, the query
        at p. Bidirectional (the reference's visible() without causal: key j hidden iff p - j >= window > 0): every
        key must pass kp <= qp, so the query sits at s - 1 and key j reads min(t - 1 - i + j, s - 1) = s - 1 -
        max(p - j, 0) from one shared array from offset t - 1 - i: qp - kp = max(p - j, 0)."""
        if causal:
            positions = self.dev.upload(np.arange(s, dtype=np.int32))
            first, qpos = np.zeros(t, np.int64), np.arange(s - t, s, dtype=np.int32)
        else:
            positions = self.dev.upload(np.minimum(np.arange(s + t - 1), s - 1).astype(np.int32))
            first, qpos = np.arange(t - 1, -1, -1, dtype=np.int64), np.full(t, s - 1, np.int32)
        self.owned.append(positions)
        return (int(positions.ptr) + 4 * first).astype(np.uint64), qpos

    def _attention_mask(self, info: NodeInfo, full: tuple[int, ...]) -> AttentionMask | None:
        """The node's mask input as attn_mask reads it, broadcast to ``full`` = [..., heads, seq, keys]: from the
        broadcast of its element indices, each query row's offset (batch-major; head 0, key 0) and the head and key
        strides (0 along a broadcast dim)."""
        m = [*info.node.inputs, "", "", ""][5]
        if not m:
            return None
        dtype, shape, ptr = lower_ew.dtype_of(self, m), lower_ew.shape_of(self, m), lower_ew.operand(self, m)
        if dtype is not DType.BOOL and not dtype.is_float:
            raise self.fail(f"mask {m!r} is {dtype.value}: attn_mask reads a bool keep-mask or a float additive mask")
        try:
            index = np.broadcast_to(np.arange(geometry.count(shape), dtype=np.int64).reshape(shape), full)
        except ValueError:
            raise self.fail(f"mask {shape} does not broadcast to [..., heads, seq, keys] = {full}") from None
        offsets = self.dev.upload(np.ascontiguousarray(index[..., 0, :, 0]).reshape(-1))
        self.owned.append(offsets)
        step = index.itemsize
        return AttentionMask(ptr, dtype.is_float, int(offsets.ptr), index.strides[-3] // step,
                             index.strides[-1] // step)

    def shared(self, kind: str, nbytes: int) -> int:
        """Device scratch of at least ``nbytes`` that the nodes of this binding share by ``kind``: a node's kernels
        are done with it before the next node's run (one stream, in order), so a 48-layer prefill holds one
        quantized activation or one MoE scratch, not 48. Grown when a node needs more (the nodes lowered before
        keep the smaller one)."""
        buf = self._shared.get(kind)
        if buf is None or buf.nbytes < nbytes:
            buf = self.dev.alloc(nbytes)
            self.owned.append(buf)
            self._shared[kind] = buf
        return int(buf.ptr)

    def _scratch(self, nbytes: int) -> int:
        buf = self.dev.alloc(nbytes)
        self.owned.append(buf)
        return int(buf.ptr)

    def _glu(self, info: NodeInfo, kernel: str, *extra: Any) -> None:
        """Gate and up as two values, or one packed [..., 2 ff] value (gate the first half): strided reads."""
        ins = [i for i in info.node.inputs if i]
        y = info.node.outputs[0]
        self.floats(*ins, y)
        count = geometry.count(self.types[y].shape)
        ff = int(self.types[y].shape[-1])
        if len(ins) == 1:
            pg, pu, ld = self.a(ins[0]), self.a(ins[0]) + 4 * ff, 2 * ff
        else:
            g, u = ins
            if self.types[g].shape != self.types[u].shape:
                raise self.fail(f"{info.node.op} of gate {self.types[g].shape} and up {self.types[u].shape}")
            pg, pu, ld = self.a(g), self.a(u), ff
        if count:
            self.launch("ops", kernel, geometry.elementwise(count), c_p(pg), c_p(pu), c_ll(ld), c_int(ff),
                        c_ll(count), c_p(self.a(y)), *extra)

    def op_SwiGLU(self, info: NodeInfo) -> None:
        self._glu(info, "swiglu")

    def op_GeGLU(self, info: NodeInfo) -> None:
        approx = str(info.attrs.get("approximate", "none"))
        if approx not in ("none", "tanh"):
            raise self.fail(f"GeGLU approximate={approx!r}")
        self._glu(info, "geglu", c_int(int(approx == "tanh")))

    def _binary(self, info: NodeInfo, op: int) -> None:
        """a + b or a * b where one operand has the output's shape and the other is broadcast to it as a run of
        its dims (a row: a bias or scale; a column: a gate per row; one value; or the same shape): the kernel's
        b[(i / inner) % nb]. The broadcast operand may be a weight or constant (read as f32) or an activation."""
        a, b = info.node.inputs[:2]
        y = info.node.outputs[0]
        out = self.types[y].shape
        shape = {n: lower_ew.shape_of(self, n) for n in (a, b)}
        if shape[a] != out:
            a, b = b, a
        nb, inner = _broadcast_run(shape[b], out)
        dts = [lower_ew.dtype_of(self, n) for n in (a, b)]
        if shape[a] != out or self.is_weight(a) or nb is None or any(lower_ew.is_int(d) for d in dts) or \
                self.types[y].dtype in ROUND:
            return lower_ew.binary(self, info)  # any broadcast, integers, a rounded result: ew.cu's N-d kernels
        count = geometry.count(out)
        if not count:
            return
        pb = self.exe.weight(b, "f32") if self.is_weight(b) else self.a(b)
        self.launch("ops", "bcast", geometry.elementwise(count), c_p(self.a(a)), c_p(pb), c_ll(nb), c_ll(inner),
                    c_ll(count), c_p(self.a(y)), c_int(op))

    def op_Add(self, info: NodeInfo) -> None:
        self._binary(info, 0)

    def op_Mul(self, info: NodeInfo) -> None:
        self._binary(info, 1)

    def unary_map(self, info: NodeInfo, op: int, param: float = 0.0) -> None:
        x, y = info.node.inputs[0], info.node.outputs[0]
        if lower_ew.is_int(lower_ew.dtype_of(self, x)):
            return lower_ew.int_unary(self, info)
        self.floats(x, y)
        count = geometry.count(self.types[y].shape)
        if count:
            self.launch("ops", "unary", geometry.elementwise(count), c_p(self.a(x)), c_ll(count), c_p(self.a(y)),
                        c_int(op), c_f(param), lower_ew.round_arg(self, y))

    def op_Gelu(self, info: NodeInfo) -> None:
        approx = str(info.attrs.get("approximate", "none"))
        if approx not in ("none", "tanh"):
            raise self.fail(f"Gelu approximate={approx!r}")
        self.unary_map(info, 2 if approx == "tanh" else 1)

    def op_LayerNorm(self, info: NodeInfo) -> None:
        ins = [*info.node.inputs, "", ""]
        x, w, b = ins[:3]
        y = info.node.outputs[0]
        self.floats(x, y)
        shape = self.types[x].shape
        first = int(info.attrs.get("axis", -1)) % max(len(shape), 1)
        n = geometry.count(shape[first:])  # the normalized dims axis .. last are one row of n values
        rows, eps = geometry.count(shape) // max(n, 1), float(info.attrs["eps"])
        self._norm_weight(w, n)
        if b:
            self._norm_weight(b, n)
        if not rows:
            return
        pw, pb = self.exe.weight(w, "f32"), self.exe.weight(b, "f32") if b else 0
        self.launch("ops", "layer_norm", geometry.norm(rows), c_p(self.a(x)), c_p(pw), c_p(pb), c_p(self.a(y)),
                    c_int(n), c_f(eps))

    def op_Split(self, info: NodeInfo) -> None:
        """Each output a box of its input along the axis: one copy when contiguous, else rows of a 2-D copy."""
        x = info.node.inputs[0]
        shape = self.types[x].shape
        axis = int(info.attrs.get("axis", 0)) % len(shape)
        outer, inner = geometry.count(shape[:axis]), geometry.count(shape[axis + 1:])
        at = 0
        for y in info.node.outputs:
            size = int(self.types[y].shape[axis])
            if y and size:
                src, dst = self.a(x) + 4 * at * inner, self.a(y)
                if outer == 1:
                    self.copy(dst, src, 4 * size * inner)
                else:
                    self.launch("ops", "copy_rows", geometry.elementwise(outer * size * inner), c_p(src),
                                c_ll(shape[axis] * inner), c_p(dst), c_ll(size * inner), c_int(outer),
                                c_int(size * inner))
            at += size

    def op_MoERouter(self, info: NodeInfo) -> None:
        attrs = info.attrs
        logits = info.node.inputs[0]
        weights, indices = info.node.outputs[:2]
        e, k = int(attrs["n_experts"]), int(attrs["top_k"])
        if k > 16 or str(attrs.get("scoring", "softmax")) not in ("softmax", "sigmoid"):
            raise self.fail(f"MoERouter top_k {k} (at most 16), scoring {attrs.get('scoring')!r}")
        self.floats(logits)
        tokens = geometry.count(self.types[logits].shape) // max(e, 1)
        if tokens:
            self.launch("moe", "moe_route", geometry.elementwise(tokens), c_p(self.a(logits)), c_int(tokens),
                        c_int(e), c_int(k), c_int(int(bool(attrs.get("normalize", True)))),
                        c_int(int(attrs.get("scoring") == "sigmoid")), c_p(self.a(weights)), c_p(self.a(indices)))

    def op_MoEExperts(self, info: NodeInfo) -> None:
        """:meth:`expert_ffn` over banks in the encodings of TYPES, each product a gemv_idx_<type> launch per pair
        (gemvq_idx_<type> on the block types' int8 activations, as the dense products), or for a prefill on
        resident banks the int8 GEMM on each expert's rows. A streamed bank moves only the experts the router chose
        (:meth:`gathered_experts`)."""
        x, _, indices, gate, up, down = info.node.inputs[:6]
        e = int(info.attrs["n_experts"])
        d = int(self.types[x].shape[-1])
        banks = {}
        for name in (gate, up, down):
            t = self.exe.tensor(name)
            bs = tuple(int(s) for s in t.shape)
            if t.dtype not in TYPES or len(bs) != 3 or bs[0] != e or bs[2] % 32:
                raise self.fail(f"expert bank {name!r} is {t.dtype.value} {bs}: the kernels read [n_experts, rows, "
                                f"cols] banks of {', '.join(x.value for x in TYPES)} with whole 32-value units")
            banks[name] = (t.dtype, bs)
        ff = banks[gate][1][1]
        if banks[gate][1] != (e, ff, d) or banks[up][1] != (e, ff, d) or banks[down][1] != (e, d, ff):
            raise self.fail(f"banks {banks[gate][1]}, {banks[up][1]}, {banks[down][1]} are not [E, ff, d] twice and "
                            f"[E, d, ff] (d = {d})")
        k, dev, stream = int(info.attrs["top_k"]), self.dev, self.exe.stream
        grouped = _GroupedExperts(self, self.a(indices), e, k)

        def products(which: int, src: int, ldx: int, x_div: int, dst: int, rows: int, cols: int, pairs: int) -> None:
            bank, pidx = (gate, up, down)[which], self.a(indices)
            dtype = banks[bank][0]
            int8 = dtype in MMQ_TYPES and self.exe.int8
            if pairs // k > GROUPED_TOKENS and int8 and bank not in self.exe.streamed:
                return grouped.products(bank, dtype, src, ldx, x_div, dst, rows, cols, pairs)
            row_bytes, units = dtype.nbytes(cols), cols // 32
            if int8:  # each distinct activation row quantized once (the node's gate and up share the tokens')
                pq, pd, ps = grouped.quantized_rows(src, ldx, pairs // x_div, cols)

            def launch(pw: int, e0: int, count: int, idx: int = pidx) -> None:
                for s0, n_pairs in geometry.pair_chunks(pairs, k):
                    a0 = s0 // x_div
                    rows_of = ((c_p(pq + a0 * cols), c_p(pd + 4 * a0 * units), c_p(ps + 4 * a0 * units)) if int8
                               else (c_p(src + 4 * a0 * ldx), c_ll(ldx)))
                    dev.launch("gemv", f"gemv{'q' if int8 else ''}_idx_{TYPES[dtype][1]}",
                               geometry.gemv_pairs(rows, n_pairs), c_p(pw), c_ll(rows * row_bytes), c_ll(row_bytes),
                               c_int(rows), c_int(cols), *rows_of, c_int(x_div), c_p(idx + 4 * s0), c_int(e0),
                               c_int(e0 + count), c_p(dst + 4 * s0 * rows), c_ll(rows), stream=stream)
            if bank in self.exe.streamed:
                self.gathered_experts(info, bank, rows * row_bytes, pairs, launch)
            else:
                self.weight_reader(bank, "packed", e, launch)
        self.expert_ffn(info, ff, products)

    def expert_ffn(self, info: NodeInfo, ff: int, products: Callable[[int, int, int, int, int, int, int, int], None]
                   ) -> None:
        """The chosen experts only: gate and up products per (token, slot) pair on its expert, the activation, the
        down product per pair, then each token's weighted sum. ``products(which, x, ldx, x_div, out, rows, cols,
        pairs)`` queues bank ``which``'s (0 gate, 1 up, 2 down) products of every pair s: out[s] = W_e x[s / x_div]
        with e the pair's expert, W_e rows x cols. One FFN for every bank encoding: MoEExperts' here,
        QuantizedMoEExperts' in lower_packed.py."""
        x, weights = info.node.inputs[:2]
        y = info.node.outputs[0]
        k = int(info.attrs["top_k"])
        act = str(info.attrs.get("activation", "silu"))
        self.floats(x, weights, y)
        d = int(self.types[x].shape[-1])
        tokens = geometry.count(self.types[x].shape) // max(d, 1)
        if act not in ("silu", "gelu"):
            raise self.fail(f"{info.node.op} activation {act!r}")
        pairs = tokens * k
        if not pairs:
            return
        hg = self.shared("moe_ffn", 4 * pairs * (2 * ff + d))
        hu = hg + 4 * pairs * ff
        o = hu + 4 * pairs * ff
        px = self.a(x)
        products(0, px, d, k, hg, ff, d, pairs)
        products(1, px, d, k, hu, ff, d, pairs)
        count = pairs * ff
        if act == "silu":
            self.launch("ops", "swiglu", geometry.elementwise(count), c_p(hg), c_p(hu), c_ll(ff), c_int(ff),
                        c_ll(count), c_p(hg))
        else:
            self.launch("ops", "geglu", geometry.elementwise(count), c_p(hg), c_p(hu), c_ll(ff), c_int(ff),
                        c_ll(count), c_p(hg), c_int(0))
        products(2, hg, ff, 1, o, d, ff, pairs)
        self.launch("moe", "moe_combine", geometry.elementwise(tokens * d), c_p(o), c_p(self.a(weights)),
                    c_int(tokens), c_int(k), c_int(d), c_p(self.a(y)))

    def op_MoEExpertsSwiGLU(self, info: NodeInfo) -> None:
        self.op_MoEExperts(info)

    def gathered_experts(self, info: NodeInfo, bank: str, expert_bytes: int, pairs: int,
                          launch: Callable[..., None]) -> None:
        """A streamed bank's products on the experts the router chose, and on them alone: the step reads the
        indices back (one small copy and a wait per experts node, shared by its banks), copies the distinct experts
        into an expert buffer of at most one staging slot's bytes (groups of them when more were chosen than it
        holds) and runs the products with the indices remapped into the buffer (-1: another group's). A decode step
        of a top-k router moves k experts of each bank, not the bank. With a device expert cache (expert_cache.py)
        holding the bank's share, the chosen experts are placed in its slots and only those not held are copied."""
        e = int(info.attrs["n_experts"])
        per = max(1, self.exe.chunk_bytes // expert_bytes) if self.exe.chunk_bytes else e
        group = max(1, min(e, pairs, per))
        dev, stream, exe = self.dev, self.exe.stream, self.exe
        pidx, node = self.a(info.node.inputs[2]), info.node.name
        exe.expert_area(group * expert_bytes, pairs)  # sized at bind time: the run allocates nothing
        exe.gathered_bank(bank, e, expert_bytes, int(info.attrs["top_k"]))

        def fill(experts: np.ndarray, todo: list[tuple[int, int]], dst: Callable[[int], int]) -> None:
            """Copy experts (expert, place) into ``dst(place)`` through the page-locked buffer, ``group`` at a
            time (the buffer is reused once the copies before have run)."""
            for c0 in range(0, len(todo), group):
                dev.sync_stream(stream)  # the buffer's last copies (and the products that read the places) are done
                for j, (ex, place) in enumerate(todo[c0:c0 + group]):
                    at = experts[j * expert_bytes:(j + 1) * expert_bytes]
                    at[:] = exe.expert_bytes(bank, ex, expert_bytes)
                    dev.copy_htod(dst(place), at, stream)

        def step(ctx: RunContext) -> None:
            ebuf, pmap, host = exe.expert_area(group * expert_bytes, pairs)
            experts = host[:group * expert_bytes]
            chosen_host = host[group * expert_bytes:group * expert_bytes + 4 * pairs].view(np.int32)
            remap_host = host[group * expert_bytes + 4 * pairs:group * expert_bytes + 8 * pairs].view(np.int32)
            if node not in ctx.chosen:  # the node's first streamed bank reads them; the others reuse them
                dev.copy_dtoh(chosen_host, pidx, stream)
                dev.sync_stream(stream)
                ctx.chosen[node] = chosen_host.copy()
            idx = ctx.chosen[node]
            distinct = np.unique(idx)
            cache = exe.expert_cache(bank)
            if cache is not None and distinct.size <= cache.slots:  # the cache's slots hold every chosen expert
                slots, todo = cache.place(distinct)
                fill(experts, todo, lambda slot: cache.ptr + slot * expert_bytes)
                remap_host[:] = [slots[int(x)] for x in idx]
                dev.copy_htod(pmap, remap_host, stream)
                launch(cache.ptr, 0, cache.slots, pmap)
                dev.sync_stream(stream)
                return
            for g0 in range(0, distinct.size, group):
                members = distinct[g0:g0 + group]
                fill(experts, [(int(ex), j) for j, ex in enumerate(members)], lambda j: ebuf + j * expert_bytes)
                at = np.minimum(np.searchsorted(members, idx), members.size - 1)
                remap_host[:] = np.where(members[at] == idx, at, -1)
                dev.copy_htod(pmap, remap_host, stream)
                launch(ebuf, 0, int(members.size), pmap)
            dev.sync_stream(stream)  # the shared expert area is free for the next bank's step
        self.steps.append(step)

    @staticmethod
    def _slice_box(shape: tuple[int, ...], axes: list[int], starts: list[int], ends: list[int],
                   steps: list[int]) -> list[tuple[int, int, int]]:
        """Each axis's (start, stop, step) as Python's slice.indices gives them (whole axes: (0, d, 1))."""
        box = [(0, d, 1) for d in shape]
        for ax, s, e, st in zip(axes, starts, ends, steps, strict=True):
            box[ax % len(shape)] = slice(s, e, st).indices(shape[ax % len(shape)])
        return box

    def op_Slice(self, info: NodeInfo) -> None:
        x, y = info.node.inputs[0], info.node.outputs[0]
        shape = self.types[x].shape
        attrs = info.attrs
        starts, ends = list(attrs["starts"]), list(attrs["ends"])
        axes = list(attrs.get("axes") or range(len(starts)))
        steps = list(attrs.get("steps") or [1] * len(starts))
        cuts = self._slice_box(shape, axes, starts, ends, steps)
        if any(step != 1 for _, _, step in cuts):
            return lower_ew.strided_slice(self, x, y, cuts)
        box = [(lo, max(lo, hi)) for lo, hi, _ in cuts]
        # contiguous: after the first cut axis every axis is whole, before it every extent is 1
        cut = next((i for i, (lo, hi) in enumerate(box) if (lo, hi) != (0, shape[i])), len(shape))
        if cut < len(shape) and (any(box[i] != (0, shape[i]) for i in range(cut + 1, len(shape)))
                                 or any(hi - lo != 1 for lo, hi in box[:cut])):
            return lower_ew.strided_slice(self, x, y, cuts)
        first = sum(lo * st for (lo, _), st in zip(box, lower_ew.contiguous(shape), strict=True))
        self.copy(self.a(y), self.a(x) + 4 * first, self.nbytes(y))

GROUPED_TOKENS = 8
"""A MoE node over more tokens than this (a prefill) multiplies each expert's rows with the int8 GEMM, the weights read
once for all the rows that chose it (moe_group + mmq_idx_<type>); fewer take a GEMV per (token, slot) pair, as the
dense products take the GEMM above 8 rows."""


class _GroupedExperts:
    """The int8 GEMM path of one MoE node's resident banks: each distinct activation (the tokens for gate and up, the
    pairs for down) quantized once, the pairs listed by expert once (moe_group: the lists of every bank, which all
    hold the node's n_experts), then one mmq_idx_<type> launch per bank; in scratch the binding's MoE nodes share
    (Binder.shared)."""

    def __init__(self, b: Binder, idx: int, n_experts: int, top_k: int) -> None:
        self.b, self.idx, self.n_experts, self.top_k = b, idx, n_experts, top_k
        self.quantized: dict[tuple[int, int, int, int], tuple[int, int, int]] = {}
        self.lists: tuple[int, int] | None = None

    def quantized_rows(self, src: int, ldx: int, m: int, k: int) -> tuple[int, int, int]:
        """(q, d, s): the m rows of k values at ``src`` (ldx apart) quantized by quant_act once per node, each
        distinct activation in a kind of shared scratch of its own (Binder.quantized_rows)."""
        return self.b.quantized_rows(src, ldx, m, k, f"moe_activations_i8_{len(self.quantized)}", self.quantized)

    def _lists(self, pairs: int) -> tuple[int, int]:
        if self.lists is None:
            e = self.n_experts
            order = self.b.shared("moe_lists", -(-4 * e * pairs // 256) * 256 + 4 * e)
            counts = order + -(-4 * e * pairs // 256) * 256
            self.b.launch("moe", "moe_group", geometry.elementwise(e), c_p(self.idx), c_int(pairs), c_int(0),
                          c_int(e), c_p(order), c_p(counts))
            self.lists = (order, counts)
        return self.lists

    def products(self, bank: str, dtype: DType, src: int, ldx: int, x_div: int, dst: int, rows: int, cols: int,
                 pairs: int) -> None:
        """out[s] = W_e x[s / x_div] for every pair s (e its expert), as the per-pair GEMV computes it, with the
        int8 GEMM on each expert's rows."""
        pq, pd, ps = self.quantized_rows(src, ldx, pairs // x_div, cols)
        order, counts = self._lists(pairs)
        row_bytes, tokens = dtype.nbytes(cols), pairs // self.top_k
        kernel, dev, stream = f"mmq_idx_{TYPES[dtype][1]}", self.b.dev, self.b.exe.stream

        def launch(pw: int, e0: int, count: int) -> None:
            assert e0 == 0 and count == self.n_experts  # a resident bank: its lists are the node's
            dev.launch("mmq", kernel, geometry.mmq_idx(rows, tokens, count), c_p(pw), c_ll(rows * row_bytes),
                       c_ll(row_bytes), c_int(rows), c_int(cols), c_p(pq), c_p(pd), c_p(ps), c_int(x_div),
                       c_p(order), c_p(counts), c_int(pairs), c_p(dst), c_ll(rows), stream=stream)
        self.b.weight_reader(bank, "packed", self.n_experts, launch)


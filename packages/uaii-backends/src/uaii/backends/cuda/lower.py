"""Lowering one binding of a CUDA executable: each node of the plan's steps becomes steps that queue launches.

Why apart from the executable: this is the part that turns shapes and attributes into kernel arguments (row
counts, leading dimensions, table offsets, which rows a streamed piece covers), where one wrong number is a wrong
token, not an error — so it is a list of small functions, one per op, each checked against the CPU backend through
the host model (tests/backends/test_cuda_executable.py). A node this backend cannot run in the form given (a weight
stored [K, N], K not a multiple of 32, a non-contiguous slice) is a BackendError naming it, at compile time.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from uaii.backends.analysis import NodeInfo, VType
from uaii.backends.base import BackendError
from uaii.backends.cuda import geometry
from uaii.backends.cuda.executable import Piece, table_layout
from uaii.backends.cuda.sources import MMQ_TYPES, TYPES
from uaii.backends.kv_book import rope_frequencies
from uaii.backends.webgpu.arena import VIEW_OPS

if TYPE_CHECKING:
    from uaii.backends.cuda.executable import CudaExecutable, RunContext

c_int, c_ll, c_f, c_p = ctypes.c_int, ctypes.c_longlong, ctypes.c_float, ctypes.c_uint64
SCORES_BYTES = 64 << 20
"""The most bytes of attention scores one launch of the attention kernels writes; more rows run in chunks."""
OPS = frozenset({"Embedding", "RMSNorm", "AddRMSNorm", "MatMul", "GroupedMatMul", "RoPE", "Attention", "SwiGLU",
                 "GeGLU", "Add", "Mul", "Reshape", "Identity", "Slice"})
"""The ops the CUDA executable lowers (Capabilities.ops)."""


def _count(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _on_rows(launch: Callable[[int, int, int], None], piece: Piece) -> Callable[[int], None]:
    """``launch`` over the rows a piece holds, at the staging slot's address."""
    return lambda slot: launch(slot, piece.start, piece.stop - piece.start)


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
        self.n_new = 0
        self.tables: Any = None
        self.pinned_tables: Any = None
        self.node = ""

    # --- helpers ---------------------------------------------------------------------------------------------
    def fail(self, why: str) -> BackendError:
        return BackendError(f"[backend] cuda: node {self.node!r}: {why}")

    def a(self, name: str) -> int:
        """Device address of activation ``name``."""
        if name not in self.addr:
            raise self.fail(f"value {name!r} has no device region (a weight read where an activation is expected)")
        return self.addr[name]

    def launch(self, module: str, kernel: str, at: geometry.Launch, *args: Any) -> None:
        dev, stream = self.dev, self.exe.stream
        self.steps.append(lambda ctx: dev.launch(module, kernel, at, *args, stream=stream))

    def weight_reader(self, name: str, form: str, rows: int,
                      launch: Callable[[int, int, int], None]) -> None:
        """Steps that call ``launch(address, first row, rows)`` over weight ``name`` in ``form``: once on the
        resident copy, or per streamed piece on its staging slot."""
        if name not in self.exe.streamed:
            ptr = self.exe.weight(name, form)
            self.steps.append(lambda ctx: launch(ptr, 0, rows))
            return
        for piece in self.exe.pieces_of(name, form):
            self.pieces.append(piece)
            self.steps.append(self.exe.piece_step(len(self.pieces) - 1, _on_rows(launch, piece)))

    def is_weight(self, name: str) -> bool:
        return name in self.exe.weight_names

    def floats(self, *names: str) -> None:
        """Refuse integer values: the kernels compute in f32 (an i32 through them would be garbage)."""
        for n in names:
            dt = self.types[n].dtype if n in self.types else self.exe.tensor(n).dtype
            if not (dt.is_float or dt.is_quantized):
                raise self.fail(f"{n!r} is {dt.value}: the cuda kernels compute on floats")

    # --- dispatch --------------------------------------------------------------------------------------------
    def lower(self, info: NodeInfo) -> None:
        node = info.node
        self.node = node.name
        op = node.op
        if op in VIEW_OPS:
            return self.view(info)
        fn = getattr(self, f"op_{op}", None)
        if fn is None:
            raise self.fail(f"op {op!r} is not implemented by the cuda backend")
        fn(info)

    def view(self, info: NodeInfo) -> None:
        src, dst = info.node.inputs[0], info.node.outputs[0]
        if self.is_weight(src):
            raise self.fail("a Reshape/Identity of a weight (the cuda backend reads weights only through the ops "
                            "that take them)")
        if self.a(src) != self.a(dst):
            self.copy(self.a(dst), self.a(src), self.nbytes(dst))

    def nbytes(self, name: str) -> int:
        t = self.types[name]
        return 4 * _count(t.shape) if not t.dtype.is_quantized else t.dtype.nbytes(_count(t.shape))

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        dev, stream = self.dev, self.exe.stream
        if nbytes:
            self.steps.append(lambda ctx: dev.copy_dtod(dst, src, nbytes, stream))

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
        r = _count(self.types[ids].shape)
        if not r:
            return
        kernel, at = f"rows_{TYPES[t.dtype][1]}", geometry.elementwise(r * units)
        if table not in self.exe.streamed:
            w = self.exe.weight(table, "packed")
            self.launch("dequant", kernel, at, c_p(w), c_ll(row_bytes), c_ll(units), c_p(self.a(ids)), c_int(r),
                        c_p(y))
            return
        if ids not in self.exe.input_names:
            raise self.fail("a streamed Embedding table needs its ids fed by the caller (they are read on the host)")
        p = len(self.pieces)
        self.pieces.append(Piece(table, "gather", 0, r, r * row_bytes, ids=ids))
        dev, stream, arange = self.dev, self.exe.stream, self.exe.ids_ptr(r)
        self.steps.append(self.exe.piece_step(p, lambda slot: dev.launch(
            "dequant", kernel, at, c_p(slot), c_ll(row_bytes), c_ll(units), c_p(arange), c_int(r), c_p(y),
            stream=stream)))

    def _norm_args(self, info: NodeInfo, x: str) -> tuple[int, int, float, int]:
        shape = self.types[x].shape
        n = int(shape[-1]) if shape else 1
        return n, _count(shape) // max(n, 1), float(info.attrs["eps"]), int(bool(info.attrs["add_unit_offset"]))

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
        if not self.is_weight(w) or _count(tuple(int(d) for d in self.exe.tensor(w).shape)) != n:
            raise self.fail(f"the norm scale {w!r} must be a weight of {n} values")

    def op_MatMul(self, info: NodeInfo) -> None:
        x, w = info.node.inputs[:2]
        self.matmul(info, x, w, info.node.outputs[0])

    def op_GroupedMatMul(self, info: NodeInfo) -> None:
        x, *ws = info.node.inputs
        for w, y in zip(ws, info.node.outputs, strict=True):
            self.matmul(info, x, w, y)

    def matmul(self, info: NodeInfo, x: str, w: str, y: str) -> None:
        """y[m, :] = x[m, :] . W[n, :] for every row m: GEMV launches of up to 8 rows, or the int8 GEMM beyond 8
        rows on the block types; over each streamed piece, the piece's output columns."""
        if not self.is_weight(w) or not info.attrs.get("transpose_b", False):
            raise self.fail("the cuda backend multiplies by a 2-D weight stored [N, K] (transpose_b); an "
                            "activation or a [K, N] weight is not lowered")
        t = self.exe.tensor(w)
        shape = tuple(int(d) for d in t.shape)
        if len(shape) != 2 or t.dtype not in TYPES or shape[1] % 32:
            raise self.fail(f"weight {w!r} is {t.dtype.value} {shape}: the kernels read 2-D "
                            f"{', '.join(d.value for d in TYPES)} weights of whole 32-value units")
        n, k = shape
        self.floats(x, y)
        xt = self.types[x]
        if int(xt.shape[-1]) != k:
            raise self.fail(f"x has {xt.shape[-1]} features, weight {w!r} {k}")
        m = _count(xt.shape) // k
        if not m:
            return
        px, py, row_bytes, sfx = self.a(x), self.a(y), t.dtype.nbytes(k), TYPES[t.dtype][1]
        dev, stream = self.dev, self.exe.stream
        if m > 8 and t.dtype in MMQ_TYPES:
            q = self.dev.alloc(m * k + 8 * m * (k // 32) + 2 * geometry.ELEMENTWISE)
            self.owned.append(q)
            pq = int(q.ptr)
            pd = pq + -(-m * k // 256) * 256
            ps = pd + 4 * m * (k // 32)
            self.launch("mmq", "quant_act", geometry.elementwise(m * (k // 32)), c_p(px), c_ll(k), c_int(m),
                        c_int(k), c_p(pq), c_p(pd), c_p(ps))

            def gemm(pw: int, r0: int, rows: int) -> None:
                dev.launch("mmq", f"mmq_{sfx}", geometry.mmq(rows, m), c_p(pw), c_ll(row_bytes), c_int(rows),
                           c_int(k), c_p(pq), c_p(pd), c_p(ps), c_int(m), c_p(py + 4 * r0), c_ll(n), stream=stream)
            self.weight_reader(w, "packed", n, gemm)
            return
        splits = geometry.gemv_splits(m)

        def gemv(pw: int, r0: int, rows: int) -> None:
            at = geometry.gemv(rows)
            for start, size in splits:
                dev.launch("gemv", f"gemv_{sfx}_m{size}", at, c_p(pw), c_ll(row_bytes), c_int(rows), c_int(k),
                           c_p(px + 4 * start * k), c_ll(k), c_p(py + 4 * (start * n + r0)), c_ll(n), stream=stream)
        self.weight_reader(w, "packed", n, gemv)

    def op_RoPE(self, info: NodeInfo) -> None:
        node, attrs = info.node, info.attrs
        x, pos = node.inputs[:2]
        self.floats(x)
        if self.types[pos].dtype.is_float:
            raise self.fail(f"RoPE positions {pos!r} are {self.types[pos].dtype.value} (the kernel reads integers)")
        if float(attrs["attn_factor"]) != 1.0:
            raise self.fail(f"RoPE with attn_factor {attrs['attn_factor']} (yarn's scale is not in the kernel)")
        shape = self.types[x].shape
        heads, d = int(shape[-2]), int(shape[-1])
        rot = int(attrs["rotary_dims"]) or d
        rows = _count(shape) // max(heads * d, 1)
        if _count(self.types[pos].shape) != rows:
            raise self.fail(f"{_count(self.types[pos].shape)} positions for {rows} rows")
        ff = None
        if len(node.inputs) > 2 and node.inputs[2]:
            ff = self.exe.host_f32(node.inputs[2])
        inv = self.exe.derived(("rope", node.name), lambda: rope_frequencies(rot, attrs, ff).astype(np.float32))
        px, py = self.a(x), self.a(node.outputs[0])
        if not rows:
            return
        self.copy(py, px, 4 * _count(shape)) if px != py else None
        self.launch("ops", "rope", geometry.elementwise(rows * heads * (rot // 2)), c_p(py), c_p(self.a(pos)),
                    c_p(inv), c_int(rows), c_int(heads), c_int(d), c_int(rot), c_int(int(attrs["mode"] == "neox")))

    def op_Attention(self, info: NodeInfo) -> None:
        node, attrs = info.node, info.attrs
        kv = self.exe.kv
        if kv is None or node.name not in kv.layer:
            raise self.fail("Attention without a KV cache (the cuda backend runs cached causal attention)")
        if not attrs["causal"] or (len(node.inputs) > 5 and node.inputs[5]):
            raise self.fail("non-causal attention or per-head sink logits are not lowered by the cuda backend")
        layer, n_layers = kv.layer[node.name], len(kv.layers)
        q, k, v = node.inputs[:3]
        n, hq, d = (int(s) for s in self.types[q].shape)
        hkv, dv = int(self.types[k].shape[1]), int(self.types[v].shape[2])
        if not n:
            return
        self.n_new = n
        at = table_layout(n, n_layers)
        if self.tables is None:
            self.tables = self.dev.alloc(at["size"])
            self.pinned_tables = self.dev.alloc_host(at["size"])
        scale = float(attrs["scale"]) or 1.0 / math.sqrt(d)
        window, sinks, softcap = int(attrs["sliding_window"]), int(attrs["sinks"]), float(attrs["softcap"])
        pq, pk, pv, py = self.a(q), self.a(k), self.a(v), self.a(node.outputs[0])
        dev, stream, exe, batched = self.dev, self.exe.stream, self.exe, self.batched
        tables = int(self.tables.ptr)
        wk, wv = hkv * d, hkv * dv

        def step(ctx: RunContext) -> None:
            states = ctx.states
            for r, s in enumerate(states if batched else states[:1]):
                rows = 1 if batched else n
                kc, vc = s.cache_ptrs(layer)
                for src, width, cache in ((pk + 4 * r * wk, wk, kc), (pv + 4 * r * wv, wv, vc)):
                    dev.launch("attention", "kv_store", geometry.elementwise(rows * width), c_p(src), c_ll(width),
                               c_int(rows), c_int(width), c_p(cache), c_ll(s.used), c_int(int(s.f16)), stream=stream)
            s_max = max(s.capacity for s in states)
            chunk = max(1, min(n, SCORES_BYTES // (4 * hq * s_max)))
            scores = exe.scores(4 * chunk * hq * s_max)
            for r0 in range(0, n, chunk):
                rc = min(chunk, n - r0)
                at_s, at_m, at_w = geometry.attention(rc, hq, s_max, dv)
                kcp, vcp = tables + at["k"] + 8 * (layer * n + r0), tables + at["v"] + 8 * (layer * n + r0)
                f16, used = tables + at["f16"] + 4 * r0, tables + at["used"] + 8 * r0
                qpos, kpos = tables + at["qpos"] + 4 * r0, tables + at["kpos"] + 8 * r0
                dev.launch("attention", "attn_scores", at_s, c_p(pq + 4 * r0 * hq * d), c_p(kcp), c_p(f16),
                           c_p(used), c_p(qpos), c_p(kpos), c_int(hq), c_int(hkv), c_int(d), c_f(scale),
                           c_f(softcap), c_int(window), c_int(sinks), c_p(scores), c_ll(s_max), stream=stream)
                dev.launch("attention", "attn_softmax", at_m, c_p(scores), c_p(used), c_p(0), c_int(hq),
                           c_ll(s_max), stream=stream)
                dev.launch("attention", "attn_wsum", at_w, c_p(scores), c_p(vcp), c_p(f16), c_p(used), c_int(hq),
                           c_int(hkv), c_int(dv), c_ll(s_max), c_p(py + 4 * r0 * hq * dv), stream=stream)
        self.steps.append(step)

    def _glu(self, info: NodeInfo, kernel: str, *extra: Any) -> None:
        g, u = info.node.inputs[:2]
        y = info.node.outputs[0]
        self.floats(g, u, y)
        if self.types[g].shape != self.types[u].shape:
            raise self.fail(f"{info.node.op} of gate {self.types[g].shape} and up {self.types[u].shape}")
        count = _count(self.types[y].shape)
        ff = int(self.types[y].shape[-1])
        if count:
            self.launch("ops", kernel, geometry.elementwise(count), c_p(self.a(g)), c_p(self.a(u)), c_ll(ff),
                        c_int(ff), c_ll(count), c_p(self.a(y)), *extra)

    def op_SwiGLU(self, info: NodeInfo) -> None:
        if len(info.node.inputs) < 2:
            raise self.fail("SwiGLU of one packed [gate | up] input is not lowered (the plan splits it)")
        self._glu(info, "swiglu")

    def op_GeGLU(self, info: NodeInfo) -> None:
        if len(info.node.inputs) < 2:
            raise self.fail("GeGLU of one packed [gate | up] input is not lowered (the plan splits it)")
        approx = str(info.attrs.get("approximate", "none"))
        if approx not in ("none", "tanh"):
            raise self.fail(f"GeGLU approximate={approx!r}")
        self._glu(info, "geglu", c_int(int(approx == "tanh")))

    def op_Add(self, info: NodeInfo) -> None:
        a, b = info.node.inputs[:2]
        y = info.node.outputs[0]
        self.floats(a, b, y)
        if self.is_weight(a) or self.is_weight(b) or self.types[a].shape != self.types[b].shape:
            raise self.fail("Add of two activations of one shape is lowered; broadcasts and weights are not")
        count = _count(self.types[y].shape)
        if count:
            self.launch("ops", "add", geometry.elementwise(count), c_p(self.a(a)), c_p(self.a(b)),
                        c_p(self.a(y)), c_ll(count))

    def op_Mul(self, info: NodeInfo) -> None:
        a, b = info.node.inputs[:2]
        if self.is_weight(a) and not self.is_weight(b):
            a, b = b, a
        y = info.node.outputs[0]
        self.floats(a, b, y)
        sa, sb = self.types[a].shape, tuple(int(d) for d in self.exe.tensor(b).shape) if self.is_weight(b) else ()
        core = tuple(d for d in sb)
        while core and core[0] == 1:
            core = core[1:]
        if not self.is_weight(b) or (core and tuple(sa[-len(core):]) != core) or self.types[y].shape != sa:
            raise self.fail("Mul by a weight or constant broadcast over the leading dims is lowered; found shapes "
                            f"{sa} and {sb}")
        nb, count = max(_count(core), 1), _count(sa)
        if not count:
            return
        pb = self.exe.weight(b, "f32")
        self.launch("ops", "mul_bcast", geometry.elementwise(count), c_p(self.a(a)), c_p(pb), c_ll(nb), c_ll(count),
                    c_p(self.a(y)))

    def op_Slice(self, info: NodeInfo) -> None:
        x, y = info.node.inputs[0], info.node.outputs[0]
        shape = self.types[x].shape
        attrs = info.attrs
        starts, ends = list(attrs["starts"]), list(attrs["ends"])
        axes = list(attrs.get("axes") or range(len(starts)))
        steps = list(attrs.get("steps") or [1] * len(starts))
        box = [(0, d) for d in shape]
        for ax, s, e, st in zip(axes, starts, ends, steps, strict=True):
            ax %= len(shape)
            lo, hi, step = slice(s, e, st).indices(shape[ax])
            if step != 1:
                raise self.fail("a Slice with a step other than 1 is not lowered")
            box[ax] = (lo, max(lo, hi))
        # contiguous: after the first cut axis every axis is whole, before it every extent is 1
        cut = next((i for i, (lo, hi) in enumerate(box) if (lo, hi) != (0, shape[i])), len(shape))
        if cut < len(shape) and (any(box[i] != (0, shape[i]) for i in range(cut + 1, len(shape)))
                                 or any(hi - lo != 1 for lo, hi in box[:cut])):
            raise self.fail(f"a Slice of {shape} to {[hi - lo for lo, hi in box]} is not contiguous")
        strides = [_count(shape[i + 1:]) for i in range(len(shape))]
        first = sum(lo * st for (lo, _), st in zip(box, strides, strict=True))
        self.copy(self.a(y), self.a(x) + 4 * first, self.nbytes(y))

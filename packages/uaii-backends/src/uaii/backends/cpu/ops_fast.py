"""Lowerings onto the C kernels of uaii-kernels: MatMul, norms, activations, GLUs, RoPE, Attention, Embedding.

Each lowering checks that the node fits the kernel (float32 activations, contiguous buffers, weight types the GEMM
keeps packed) and otherwise returns None so that the numpy lowering of the same op takes over. Kernels get raw
pointers resolved at bind time; the one step that reads state at run time is the cached Attention (the cache length
moves every step, and which sequence's cache it is — or which several, one per row — is set by each run).
"""

from __future__ import annotations

import math
import weakref
from functools import partial
from typing import Any

import numpy as np

from uaii.backends.cpu.bind import NULL, Bind, CacheRows, KVSlot, Step, fptr, kernel, lib, numpy_step, vptr
from uaii.backends.cpu.memory import NodeInfo
from uaii.backends.kv_book import rope_frequencies
from uaii.ir import DType
from uaii.kernels import DEQUANT_TYPES
from uaii.kernels.native import ffi

F32 = np.dtype(np.float32)


def _f32(*arrays: np.ndarray) -> bool:
    return all(a.dtype == F32 and a.flags.c_contiguous for a in arrays)


# --- linear algebra ---------------------------------------------------------------------------------------------
def matmul(b: Bind, info: NodeInfo) -> list[Step] | None:
    x_name, w_name = info.node.inputs[:2]
    x, y = b.a(x_name), b.a(info.node.outputs[0])
    if not b.is_weight(w_name) or not _f32(x, y) or len(b.types[w_name].shape) != 2:
        return None
    wt = b.types[w_name]
    if wt.dtype not in DEQUANT_TYPES or (not info.attrs["transpose_b"] and wt.dtype.is_quantized):
        return None
    return gemm_steps(b, w_name, x, y, bool(info.attrs["transpose_b"]), b.gemm_mode(info.node.outputs[0]),
                      relu=info.node.op == "MatMulRelu")


def gemm_steps(b: Bind, w_name: str, x: np.ndarray, y: np.ndarray, transpose_b: bool, mode: int,
               relu: bool = False) -> list[Step]:
    """uk_gemm in ``mode`` (the executable's choice for the value ``y`` holds: Bind.gemm_mode)."""
    pw = b.packed(w_name, transpose_b)
    m = x.size // pw.k if pw.k else 0
    if m == 0 or pw.n == 0:
        return []
    steps = [kernel(lib.uk_gemm, pw.kernel_type, pw.pointer(), pw.n, pw.k, fptr(x), m, pw.k, fptr(y), pw.n, mode)]
    if relu:
        steps.append(numpy_step(lambda: np.maximum(y, 0, out=y)))
    return steps


def grouped_matmul(b: Bind, info: NodeInfo) -> list[Step] | None:
    x = b.a(info.node.inputs[0])
    if not info.attrs["transpose_b"] or not _f32(x):
        return None
    steps: list[Step] = []
    for w_name, out in zip(info.node.inputs[1:], info.node.outputs, strict=True):
        y = b.a(out)
        wt = b.types[w_name]
        if not b.is_weight(w_name) or len(wt.shape) != 2 or wt.dtype not in DEQUANT_TYPES or not _f32(y):
            return None
        steps += gemm_steps(b, w_name, x, y, True, b.gemm_mode(out))
    return steps


# --- normalization and activations ----------------------------------------------------------------------------
def _rows(x: np.ndarray, n: int) -> int:
    return x.size // n if n else 0


def rms_norm(b: Bind, info: NodeInfo) -> list[Step] | None:
    x, w = info.node.inputs
    xa, ya = b.a(x), b.a(info.node.outputs[0])
    if not _f32(xa, ya) or xa.size == 0:
        return None
    n = xa.shape[-1]
    wa = b.f32_weight(w) if b.is_weight(w) else b.a(w)
    if not _f32(wa):
        return None
    return [kernel(lib.uk_rmsnorm, fptr(xa), fptr(wa), fptr(ya), _rows(xa, n), n, float(info.attrs["eps"]),
                   int(bool(info.attrs["add_unit_offset"])))]


def add_rms_norm(b: Bind, info: NodeInfo) -> list[Step] | None:
    a_name, r_name, w = info.node.inputs
    aa, ra, ya = b.a(a_name), b.a(r_name), b.a(info.node.outputs[0])
    s_name = info.node.outputs[1] if len(info.node.outputs) > 1 else ""
    sa = b.a(s_name) if s_name else b.scratch(ya.shape)
    wa = b.f32_weight(w) if b.is_weight(w) else b.a(w)
    if not _f32(aa, ra, ya, sa, wa) or ya.size == 0:
        return None
    n = ya.shape[-1]
    return [numpy_step(lambda: np.add(aa, ra, out=sa)),
            kernel(lib.uk_rmsnorm, fptr(sa), fptr(wa), fptr(ya), _rows(ya, n), n, float(info.attrs["eps"]),
                   int(bool(info.attrs["add_unit_offset"])))]


def layer_norm(b: Bind, info: NodeInfo) -> list[Step] | None:
    x = info.node.inputs[0]
    xa, ya = b.a(x), b.a(info.node.outputs[0])
    if not _f32(xa, ya) or xa.size == 0:
        return None
    axis = info.attrs["axis"] % xa.ndim
    n = int(np.prod(xa.shape[axis:]))
    params: list[np.ndarray | None] = []
    for name in info.node.inputs[1:3]:
        if not name:
            params.append(None)
            continue
        p = (b.f32_weight(name) if b.is_weight(name) else b.a(name)).reshape(-1)
        if not _f32(p):
            return None
        params.append(p)
    w = params[0]
    bias = params[1] if len(params) > 1 else None
    return [kernel(lib.uk_layernorm, fptr(xa), fptr(w) if w is not None else NULL,
                   fptr(bias) if bias is not None else NULL, fptr(ya), _rows(xa, n), n, float(info.attrs["eps"]))]


def softmax(b: Bind, info: NodeInfo) -> list[Step] | None:
    xa, ya = b.a(info.node.inputs[0]), b.a(info.node.outputs[0])
    if not _f32(xa, ya) or xa.size == 0 or info.attrs["axis"] % xa.ndim != xa.ndim - 1:
        return None
    n = xa.shape[-1]
    return [kernel(lib.uk_softmax, fptr(xa), fptr(ya), _rows(xa, n), n, 1.0)]


ACT_KIND = {"Silu": 0, "Gelu": 1}


def activation(b: Bind, info: NodeInfo) -> list[Step] | None:
    xa, ya = b.a(info.node.inputs[0]), b.a(info.node.outputs[0])
    if not _f32(xa, ya) or xa.size == 0:
        return None
    kind = ACT_KIND[info.node.op]
    if info.node.op == "Gelu" and info.attrs.get("approximate") == "tanh":
        kind = 2
    return [kernel(lib.uk_act, kind, fptr(xa), fptr(ya), xa.size)]


def glu(b: Bind, info: NodeInfo) -> list[Step] | None:
    gate = b.a(info.node.inputs[0])
    up_name = info.node.inputs[1] if len(info.node.inputs) > 1 else ""
    ya = b.a(info.node.outputs[0])
    if not _f32(gate, ya) or ya.size == 0:
        return None
    kind = 0 if info.node.op == "SwiGLU" else (2 if info.attrs.get("approximate") == "tanh" else 1)
    n = ya.shape[-1]
    rows = _rows(ya, n)
    if up_name:
        up = b.a(up_name)
        if not _f32(up):
            return None
        return [kernel(lib.uk_glu, kind, fptr(gate), n, fptr(up), n, fptr(ya), rows, n)]
    base = fptr(gate)
    return [kernel(lib.uk_glu, kind, base, 2 * n, base + n, 2 * n, fptr(ya), rows, n)]


# --- rotary embeddings ---------------------------------------------------------------------------------------
def rope_inv_freq(rot: int, attrs: dict[str, Any], freq_factors: np.ndarray | None) -> np.ndarray:
    """The rot/2 angular frequencies, float32 as the kernels take them: the one formula of
    :func:`uaii.backends.kv_book.rope_frequencies` (the reference's), rounded."""
    return rope_frequencies(rot, attrs, freq_factors).astype(np.float32)


def rope_freqs(b: Bind, info: NodeInfo, head_dim: int) -> tuple[int, np.ndarray] | None:
    rot = int(info.attrs["rotary_dims"]) or head_dim
    ff_name = info.node.inputs[2] if len(info.node.inputs) > 2 else ""
    if ff_name and not b.is_weight(ff_name):
        return None  # computed frequency factors: the numpy lowering handles them
    ff = b.f32_weight(ff_name) if ff_name else None
    return rot, b.exe.cached(("rope", info.node.name), lambda: rope_inv_freq(rot, info.attrs, ff))


def rope(b: Bind, info: NodeInfo) -> list[Step] | None:
    x_name, p_name = info.node.inputs[:2]
    xa, ya = b.a(x_name), b.a(info.node.outputs[0])
    if not _f32(xa, ya) or xa.ndim != 3 or b.a(p_name).ndim != 1 or xa.size == 0:
        return None
    t, h, d = xa.shape
    freqs = rope_freqs(b, info, d)
    if freqs is None:
        return None
    rot, inv = freqs
    pos = b.index_as(p_name, np.int32)
    attn = float(info.attrs["attn_factor"]) if info.attrs["scaling_type"] == "yarn" else 1.0
    return [kernel(lib.uk_rope, fptr(xa), fptr(ya), t, h, d, rot, vptr(pos, "int32_t *"), fptr(inv), attn,
                   int(info.attrs["mode"] == "neox"))]


# --- attention -----------------------------------------------------------------------------------------------
def _strides(a: np.ndarray) -> tuple[int, int]:
    return a.strides[0] // a.itemsize, a.strides[1] // a.itemsize


def attention(b: Bind, info: NodeInfo) -> list[Step] | None:
    node, attrs = info.node, info.attrs
    ins = list(node.inputs) + [""] * (6 - len(node.inputs))
    q, k, v = (b.a(n) for n in ins[:3])
    y = b.a(node.outputs[0])
    if ins[5] or not _f32(q, k, v, y) or q.ndim != 3:
        return None
    t, hq, d = q.shape
    hkv, dv = k.shape[1], v.shape[2]
    scale = float(attrs["scale"]) or 1.0 / math.sqrt(d)
    window, sinks, softcap = int(attrs["sliding_window"]), int(attrs["sinks"]), float(attrs["softcap"])
    if not attrs["causal"] and window:
        return None  # the kernel measures a window from each query's position; non-causal queries have none here
    layer = b.exe.kv_layer.get(node.name)
    if layer is not None:
        if b.state is None:
            raise_state(node.name)
        if not attrs["causal"]:
            return None
        return [_cached_attention(b, layer, q, k, v, y, scale, window, sinks, softcap)]
    steps: list[Step] = []
    if ins[3]:
        kk, vv = _concat_cache(b, node, ins, k, v, steps)
    else:
        kk, vv = k, v
        for slot, src in ((1, k), (2, v)):
            if len(node.outputs) > slot and node.outputs[slot]:
                dst = b.a(node.outputs[slot])
                steps.append(numpy_step(partial(np.copyto, dst, src)))
    s = kk.shape[0]
    if t == 0:
        return steps
    if s == 0:
        return [*steps, numpy_step(partial(y.fill, 0.0))]
    qpos = NULL
    if not attrs["causal"]:
        full = b.scratch((t,), np.int32)
        full.fill(s - 1)
        qpos = vptr(full, "int32_t *")
    kss, ksh = _strides(kk)
    vss, vsh = _strides(vv)
    steps.append(kernel(lib.uk_attention, fptr(q), vptr(kk), vptr(vv), fptr(y), t, s, hq, hkv, d, dv, kss, ksh,
                        vss, vsh, qpos, NULL, scale, window, sinks, softcap, NULL, 0))
    return steps


def raise_state(node: str) -> None:
    from uaii.backends.base import BackendError

    raise BackendError(f"[backend] node {node!r} (Attention) reads the KV cache: run the executable with a state "
                       "(Executable.new_state)")


def _concat_cache(b: Bind, node: Any, ins: list[str], k: np.ndarray, v: np.ndarray,
                  steps: list[Step]) -> tuple[np.ndarray, np.ndarray]:
    """present = concat(past, new) into the present outputs (or scratch when they are not requested)."""
    out = []
    for slot, past_name, new in ((1, ins[3], k), (2, ins[4], v)):
        past = b.a(past_name)
        name = node.outputs[slot] if len(node.outputs) > slot else ""
        dst = b.a(name) if name else b.scratch((past.shape[0] + new.shape[0], *new.shape[1:]))
        steps.append(numpy_step(partial(_concat_into, dst, past, new)))
        out.append(dst)
    return out[0], out[1]


def _concat_into(dst: np.ndarray, past: np.ndarray, new: np.ndarray) -> None:
    p = past.shape[0]
    np.copyto(dst[:p], past)
    np.copyto(dst[p:], new)


def _cached_attention(b: Bind, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, y: np.ndarray,
                      scale: float, window: int, sinks: int, softcap: float) -> Step:
    """Write the new keys and values at the state's ``used`` slot and attend over its cache. The state is read
    from the binding's :class:`~uaii.backends.cpu.bind.KVSlot` when the step runs (any state of this executable's
    layer dims; the executable checked it). Decode rows — a KVBatch (row ``i`` of q/k/v is one token of
    ``states[i]``) or one state's single token — are one uk_attention_rows call per layer over the binding's
    :class:`RowTables`: each row attends with t=1 against its own cache only, the very work a uk_attention call of
    that row alone does, so its bits are the same; one call instead of one Python-driven call per row is what lets
    a batched step's attention amortize. A prefill chunk (t > 1 tokens of one state) calls uk_attention."""
    slot = b.state
    assert slot is not None
    t, hq, d = q.shape
    hkv, dv = k.shape[1], v.shape[2]
    if slot.batched or t == 1:
        tab = RowTables.of(b, t)
        return kernel(lib.uk_attention_rows, fptr(q), fptr(k), fptr(v), fptr(y), t, *tab.layer(layer), hq, hkv, d,
                      dv, scale, window, sinks, softcap, NULL)
    kss, ksh, vss, vsh = hkv * d, d, hkv * dv, dv  # the cache arrays are C-contiguous [capacity, hkv, d]
    att, pq, py = lib.uk_attention, fptr(q), fptr(y)

    def step() -> int:
        st, r = slot.states[0], slot.rows[0]
        kc, vc, pkc, pvc, kvt = r.layers[layer]
        u = st.used
        kc[u:u + t] = k
        vc[u:u + t] = v
        return att(pq, pkc, pvc, py, t, u + t, hq, hkv, d, dv, kss, ksh, vss, vsh, r.pqpos, r.pkpos, scale, window,
                   sinks, softcap, NULL, kvt)

    return step


class RowTables:
    """What uk_attention_rows reads of a run's decode rows, in arrays of fixed address that the binding's steps
    point at: per layer and row the cache pointers and KV type, per row the ``used`` slot and the positions'
    pointers. One per binding (its rows are fixed by its feed shapes), filled by a prologue step each run from
    the :class:`~uaii.backends.cpu.bind.KVSlot`.

    Why the refill is cheap: pointers are rewritten only for a row whose sequence differs from the last run's at
    that row (a decode batch keeps its rows for many steps), recognised through weak references to its arrays —
    so the tables never keep a released sequence's cache alive; ``used`` is rewritten every run."""

    def __init__(self, slot: KVSlot, rows: int, layers: int) -> None:
        self.slot = slot
        self.k = np.zeros((layers, rows), np.uintp)
        self.v = np.zeros((layers, rows), np.uintp)
        self.kv_type = np.zeros((layers, rows), np.int32)
        self.used = np.zeros(rows, np.int64)
        self.q_pos = np.zeros(rows, np.uintp)
        self.k_pos = np.zeros(rows, np.uintp)
        self._held: list[tuple[Any, ...]] = [()] * rows  # weak references to what each row's pointers point at

    @staticmethod
    def of(b: Bind, rows: int) -> RowTables:
        """The binding's tables (made, and their fill step added to its prologue, by its first cached Attention)."""
        for kept in b.keep:
            if isinstance(kept, RowTables):
                return kept
        assert b.state is not None
        tab = RowTables(b.state, rows, max(b.exe.kv_layer.values()) + 1)
        b.keep.append(tab)
        b.prologue.append(tab.fill)
        return tab

    def layer(self, i: int) -> tuple[Any, ...]:
        """uk_attention_rows' k_cache, v_cache, kv_type, used, q_pos and k_pos arguments for layer ``i``."""
        return (vptr(self.k[i], "void **"), vptr(self.v[i], "void **"), vptr(self.kv_type[i], "int32_t *"),
                vptr(self.used, "int64_t *"), vptr(self.q_pos, "int32_t **"), vptr(self.k_pos, "int32_t **"))

    def fill(self) -> None:
        for i, (st, r) in enumerate(zip(self.slot.states, self.slot.rows, strict=True)):
            self.used[i] = st.used
            held = self._held[i]
            if not held or held[0]() is not r.layers[0][0] or held[1]() is not r.q_pos or held[2]() is not r.pos:
                self._point(i, r)

    def _point(self, i: int, r: CacheRows) -> None:
        for j, (_k, _v, pk, pv, kvt) in enumerate(r.layers):
            self.k[j, i], self.v[j, i], self.kv_type[j, i] = _address(pk), _address(pv), kvt
        self.q_pos[i], self.k_pos[i] = _address(r.pqpos), _address(r.pkpos)
        self._held[i] = (weakref.ref(r.layers[0][0]), weakref.ref(r.q_pos), weakref.ref(r.pos))


def _address(p: Any) -> int:
    return int(ffi.cast("uintptr_t", p))


# --- embedding ---------------------------------------------------------------------------------------------
def embedding(b: Bind, info: NodeInfo) -> list[Step] | None:
    ids_name, table = info.node.inputs
    y = b.a(info.node.outputs[0])
    tt = b.types[table]
    if not b.is_weight(table) or y.dtype != F32 or tt.dtype not in DEQUANT_TYPES or len(tt.shape) != 2:
        return None
    ids = b.index_as(ids_name, np.int64)
    if ids.size == 0:
        return []
    w = b.weight(table)
    assert tt.dtype.gguf_id is not None
    return [kernel(lib.uk_get_rows, tt.dtype.gguf_id, vptr(w.raw), tt.shape[0], tt.shape[1],
                   vptr(ids, "int64_t *"), ids.size, fptr(y))]


FAST = {
    "MatMul": matmul, "MatMulRelu": matmul, "GroupedMatMul": grouped_matmul, "RMSNorm": rms_norm,
    "AddRMSNorm": add_rms_norm, "LayerNorm": layer_norm, "Softmax": softmax, "Silu": activation,
    "Gelu": activation, "SwiGLU": glu, "GeGLU": glu, "RoPE": rope, "Attention": attention, "Embedding": embedding,
}
"""op → kernel lowering (returns None when the node does not fit the kernel; numpy takes over)."""

__all__ = ["FAST", "DType", "RowTables", "rope_inv_freq"]

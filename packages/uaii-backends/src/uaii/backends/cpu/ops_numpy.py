"""Numpy lowerings: every registered op, for every dtype the schemas allow.

They take over where a C kernel does not fit (f16/bf16 activations, integer arithmetic, masks, odd axes, ops that
are pure data movement). Floats compute in float32 (float64 for f64) and round once to the output dtype; bf16
travels as raw uint16 words; block-quantized values travel as their raw bytes, rows of ``row_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from uaii.backends.cpu.bind import Bind, Step, from_f32, numpy_step, to_f32
from uaii.backends.cpu.memory import NodeInfo, VType
from uaii.ir import DType
from uaii.kernels import dequantize, gelu, get_rows, silu


def compute(a: np.ndarray, dt: DType) -> np.ndarray:
    """The values to compute with: float32 (float64 for f64) for floats, the integers themselves otherwise. ``dt``
    is the dtype ``a`` is in (what :func:`operand` says), not necessarily the value's declared one."""
    if dt is DType.F64 or not dt.is_float:
        return a
    return to_f32(a, dt)


def store(y: np.ndarray, r: np.ndarray, dt: DType) -> None:
    y[...] = from_f32(r, dt) if dt.is_float and dt is not DType.F64 else r


def qbytes(a: np.ndarray, t: VType) -> np.ndarray:
    """A block-quantized value as bytes shaped [*shape[:-1], row_bytes]."""
    row = t.dtype.nbytes(t.shape[-1]) if t.shape else a.size
    return a.reshape(*t.shape[:-1], row)


def operand(b: Bind, name: str) -> tuple[np.ndarray, DType]:
    """The array to compute ``name`` from and the dtype it is in: a float or block-quantized weight (or constant)
    as float32, converted once per compile (a streamed one per run, Bind.f32_weight); anything else as its own
    array. Pass both to :func:`compute` at run time: a bf16 weight is float32 here, not bf16 words."""
    if b.is_weight(name):
        w = b.weight(name)
        if w.dtype.is_quantized or (w.dtype.is_float and w.dtype is not DType.F64):
            return b.f32_weight(name), DType.F32
        return w.raw.reshape(b.types[name].shape), w.dtype
    return b.a(name), b.types[name].dtype


# --- elementwise -------------------------------------------------------------------------------------------
def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype)


def _kernel_f32(fn: Callable[..., np.ndarray]) -> Callable[[np.ndarray, dict[str, Any]], np.ndarray]:
    def run(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        x32 = np.ascontiguousarray(x, np.float32)
        return fn(x32, attrs.get("approximate", "none")) if fn is gelu else fn(x32)
    return run


UNARY: dict[str, Callable[[np.ndarray, dict[str, Any]], np.ndarray]] = {
    "Neg": lambda x, a: np.negative(x),
    "Relu": lambda x, a: np.maximum(x, x.dtype.type(0)),
    "Silu": _kernel_f32(silu),
    "Gelu": _kernel_f32(gelu),
    "Sigmoid": lambda x, a: _sigmoid(x),
    "Tanh": lambda x, a: np.tanh(x),
    "Exp": lambda x, a: np.exp(x),
    "Sqrt": lambda x, a: np.sqrt(x),
    "Softcap": lambda x, a: a["cap"] * np.tanh(x / a["cap"]),
}


def unary(b: Bind, info: NodeInfo) -> list[Step]:
    x_name, out = info.node.inputs[0], info.node.outputs[0]
    fn, attrs, dt = UNARY[info.node.op], info.attrs, b.dtype(out)
    xa, y = b.a(x_name), b.a(out)
    return [numpy_step(lambda: store(y, fn(compute(xa, dt), attrs), dt))]


def _trunc_div(a: np.ndarray, c: np.ndarray) -> np.ndarray:
    q = np.floor_divide(a, c)
    fix = (np.remainder(a, c) != 0) & ((a < 0) != (c < 0))
    return q + fix.astype(q.dtype)


BINARY: dict[str, Any] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
    "Div": lambda a, c: np.divide(a, c) if a.dtype.kind == "f" else _trunc_div(a, c),
}


def binary(b: Bind, info: NodeInfo) -> list[Step]:
    an, bn = info.node.inputs
    out = info.node.outputs[0]
    dt, fn, y = b.dtype(out), BINARY[info.node.op], b.a(out)
    (a1, d1), (a2, d2) = operand(b, an), operand(b, bn)
    if dt is DType.F32 and info.node.op != "Div" and a1.dtype == a2.dtype == np.float32:
        return [numpy_step(lambda: fn(a1, a2, out=y))]
    return [numpy_step(lambda: store(y, fn(compute(a1, d1), compute(a2, d2)), dt))]


def cast(b: Bind, info: NodeInfo) -> list[Step]:
    x_name, out = info.node.inputs[0], info.node.outputs[0]
    src, dst, y = b.types[x_name], b.dtype(out), b.a(out)
    xa = b.weight(x_name).raw if b.is_weight(x_name) else b.a(x_name)
    n = int(np.prod(src.shape))

    def step() -> None:
        if src.dtype.is_quantized:
            v: np.ndarray = dequantize(xa, src.dtype, n).reshape(src.shape)
        else:
            v = compute(xa, src.dtype) if src.dtype is DType.BF16 else xa
        if dst.is_integer and v.dtype.kind == "f":
            info_ = np.iinfo(dst.numpy)
            v = np.clip(np.rint(np.nan_to_num(v.astype(np.float64))), info_.min, info_.max)
        elif dst is DType.BOOL:
            v = v != 0
        elif dst.is_integer and v.dtype.kind in "iub":
            info_ = np.iinfo(dst.numpy)
            v = np.clip(v, info_.min, info_.max) if v.dtype.kind != "b" else v
        store(y, v if dst.is_float else v.astype(dst.numpy), dst)

    return [numpy_step(step)]


def glu(b: Bind, info: NodeInfo) -> list[Step]:
    out = info.node.outputs[0]
    dt, y = b.dtype(out), b.a(out)
    gate = b.a(info.node.inputs[0])
    up_name = info.node.inputs[1] if len(info.node.inputs) > 1 else ""
    up = b.a(up_name) if up_name else None
    approx = info.attrs.get("approximate", "none")

    def step() -> None:
        g = compute(gate, dt)
        u = compute(up, dt) if up is not None else None
        if u is None:
            half = g.shape[-1] // 2
            g, u = g[..., :half], g[..., half:]
        g32 = np.ascontiguousarray(g, np.float32)
        act = silu(g32) if info.node.op == "SwiGLU" else gelu(g32, approx)
        store(y, act * u, dt)

    return [numpy_step(step)]


# --- linear algebra and normalization ---------------------------------------------------------------------------
def matmul(b: Bind, info: NodeInfo) -> list[Step]:
    a_name, w_name = info.node.inputs[:2]
    out = info.node.outputs[0]
    dt, y, relu = b.dtype(out), b.a(out), info.node.op == "MatMulRelu"
    a, (w, wdt) = b.a(a_name), operand(b, w_name)

    def step() -> None:
        bm = compute(w, wdt)
        bm = np.swapaxes(bm, -1, -2) if info.attrs["transpose_b"] else bm
        r = np.matmul(compute(a, dt), bm.astype(np.float32, copy=False))
        store(y, np.maximum(r, 0) if relu else r, dt)

    return [numpy_step(step)]


def grouped_matmul(b: Bind, info: NodeInfo) -> list[Step]:
    steps = []
    for w_name, out in zip(info.node.inputs[1:], info.node.outputs, strict=True):
        sub = NodeInfo(info.index, info.node.__class__(info.node.name, "MatMul", (info.node.inputs[0], w_name),
                                                       (out,), info.node.attributes), info.schema, info.attrs)
        steps += matmul(b, sub)
    return steps


def gemm(b: Bind, info: NodeInfo) -> list[Step]:
    ins, out = info.node.inputs, info.node.outputs[0]
    dt, y, at = b.dtype(out), b.a(out), info.attrs
    (a, ad), (w, wd) = operand(b, ins[0]), operand(b, ins[1])
    c = operand(b, ins[2]) if len(ins) > 2 and ins[2] else None

    def step() -> None:
        am, bm = compute(a, ad), compute(w, wd).astype(np.float32, copy=False)
        r = at["alpha"] * (am.T if at["transA"] else am) @ (bm.T if at["transB"] else bm)
        if c is not None:
            r = r + at["beta"] * compute(*c)
        store(y, r, dt)

    return [numpy_step(step)]


def _rms(x: np.ndarray, w: np.ndarray, eps: float, unit: bool) -> np.ndarray:
    x64 = x.astype(np.float64)
    r = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    return r * ((1.0 + w) if unit else w)


def rms_norm(b: Bind, info: NodeInfo) -> list[Step]:
    out = info.node.outputs[0]
    dt, y = b.dtype(out), b.a(out)
    x, (w, wdt) = b.a(info.node.inputs[0]), operand(b, info.node.inputs[1])
    eps, unit = float(info.attrs["eps"]), bool(info.attrs["add_unit_offset"])
    return [numpy_step(lambda: store(y, _rms(compute(x, dt), compute(w, wdt), eps, unit), dt))]


def add_rms_norm(b: Bind, info: NodeInfo) -> list[Step]:
    outs = info.node.outputs
    dt, y = b.dtype(outs[0]), b.a(outs[0])
    s = b.a(outs[1]) if len(outs) > 1 and outs[1] else None
    a1, a2 = b.a(info.node.inputs[0]), b.a(info.node.inputs[1])
    w, wdt = operand(b, info.node.inputs[2])
    eps, unit = float(info.attrs["eps"]), bool(info.attrs["add_unit_offset"])

    def step() -> None:
        total = from_f32(compute(a1, dt) + compute(a2, dt), dt)  # the sum is rounded like Add's output
        r = _rms(compute(total, dt), compute(w, wdt), eps, unit)
        store(y, r, dt)
        if s is not None:
            s[...] = total

    return [numpy_step(step)]


def layer_norm(b: Bind, info: NodeInfo) -> list[Step]:
    out = info.node.outputs[0]
    dt, y = b.dtype(out), b.a(out)
    x = b.a(info.node.inputs[0])
    params = [operand(b, n) if n else None for n in info.node.inputs[1:3]]
    eps, axis = float(info.attrs["eps"]), info.attrs["axis"]

    def step() -> None:
        x64 = compute(x, dt).astype(np.float64)
        axes = tuple(range(axis % x64.ndim, x64.ndim))
        mu = x64.mean(axis=axes, keepdims=True)
        r = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(axis=axes, keepdims=True) + eps)
        if params[0] is not None:
            r = r * compute(*params[0])
        if len(params) > 1 and params[1] is not None:
            r = r + compute(*params[1])
        store(y, r, dt)

    return [numpy_step(step)]


def softmax(b: Bind, info: NodeInfo) -> list[Step]:
    out = info.node.outputs[0]
    dt, y, x, axis = b.dtype(out), b.a(out), b.a(info.node.inputs[0]), info.attrs["axis"]

    def step() -> None:
        v = compute(x, dt).astype(np.float64)
        e = np.exp(v - v.max(axis=axis, keepdims=True))
        store(y, e / e.sum(axis=axis, keepdims=True), dt)

    return [numpy_step(step)]


# --- reductions ------------------------------------------------------------------------------------------------
def topk(b: Bind, info: NodeInfo) -> list[Step]:
    x_name, outs = info.node.inputs[0], info.node.outputs
    x, dt = b.a(x_name), b.types[x_name].dtype
    k, axis, largest = int(info.attrs["k"]), info.attrs["axis"], bool(info.attrs["largest"])
    vals = b.a(outs[0])
    idx = b.a(outs[1]) if len(outs) > 1 and outs[1] else None

    def step() -> None:
        key = np.moveaxis(compute(x, dt), axis, -1)
        order = np.argsort(-key if largest and key.dtype.kind == "f" else key, axis=-1, kind="stable")
        if largest and key.dtype.kind != "f":
            n = key.shape[-1]
            order = n - 1 - np.argsort(key[..., ::-1], axis=-1, kind="stable")[..., ::-1]
        order = np.moveaxis(order[..., :k], -1, axis)
        vals[...] = np.take_along_axis(x, order, axis=axis)
        if idx is not None:
            idx[...] = order

    return [numpy_step(step)]


def argmax(b: Bind, info: NodeInfo) -> list[Step]:
    x_name, out = info.node.inputs[0], info.node.outputs[0]
    x, dt, y = b.a(x_name), b.types[x_name].dtype, b.a(out)
    axis, keep = info.attrs["axis"], bool(info.attrs["keepdims"])
    return [numpy_step(lambda: np.copyto(y, np.argmax(compute(x, dt), axis=axis, keepdims=keep)))]


def reduce_mean(b: Bind, info: NodeInfo) -> list[Step]:
    x_name, out = info.node.inputs[0], info.node.outputs[0]
    x, dt, y = b.a(x_name), b.dtype(out), b.a(out)
    rank = len(b.types[x_name].shape)
    axes = tuple(a % rank for a in info.attrs.get("axes") or range(rank))
    keep = bool(info.attrs["keepdims"])
    # summed in float64 so that a long sequence does not drift from the reference's mean
    return [numpy_step(lambda: store(y, compute(x, dt).mean(axis=axes, dtype=np.float64, keepdims=keep), dt))]


# --- movement --------------------------------------------------------------------------------------------------
def _raw(b: Bind, name: str) -> np.ndarray:
    """The value's array in element form (quantized: bytes [*shape[:-1], row_bytes])."""
    a = b.weight(name).raw if b.is_weight(name) else b.a(name)
    t = b.types[name]
    return qbytes(a, t) if t.dtype.is_quantized else a.reshape(t.shape)


def copy_view(b: Bind, info: NodeInfo) -> list[Step]:
    """Reshape / Identity whose output did not become a view (e.g. a weight or a feed reshaped into a graph output)."""
    src, dst = b.a(info.node.inputs[0]), b.a(info.node.outputs[0])
    if np.shares_memory(src, dst) or src.size == 0:
        return []
    return [numpy_step(lambda: np.copyto(dst.reshape(-1), src.reshape(-1)))]


def transpose(b: Bind, info: NodeInfo) -> list[Step]:
    x, y = _raw(b, info.node.inputs[0]), b.a(info.node.outputs[0])
    perm = info.attrs.get("perm") or tuple(range(x.ndim))[::-1]
    return [numpy_step(lambda: np.copyto(y, np.transpose(x, perm)))]


def concat(b: Bind, info: NodeInfo) -> list[Step]:
    parts = [_raw(b, n) for n in info.node.inputs]
    out = info.node.outputs[0]
    y = _raw(b, out)
    axis = info.attrs["axis"] % len(b.types[out].shape)
    return [numpy_step(lambda: np.concatenate(parts, axis=axis, out=y))]


def split(b: Bind, info: NodeInfo) -> list[Step]:
    x_name = info.node.inputs[0]
    x, t = _raw(b, x_name), b.types[x_name]
    axis = info.attrs["axis"] % len(t.shape)
    outs = [(_raw(b, n), b.types[n].shape[axis]) for n in info.node.outputs if n]
    if t.dtype.is_quantized and axis == len(t.shape) - 1:
        per = x.shape[-1] // t.shape[-1] if t.shape[-1] else 0
        outs = [(a, s * per) for a, s in outs]  # not reached for valid graphs: blocks never split

    def step() -> None:
        start = 0
        for y, size in outs:
            np.copyto(y, np.take(x, range(start, start + size), axis=axis))
            start += size

    return [numpy_step(step)]


def slice_index(info: NodeInfo, shape: tuple[int, ...]) -> tuple[slice, ...]:
    idx = [slice(None)] * len(shape)
    starts, ends = info.attrs["starts"], info.attrs["ends"]
    axes = info.attrs.get("axes") or tuple(range(len(starts)))
    steps = info.attrs.get("steps") or (1,) * len(starts)
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        idx[a % len(shape)] = slice(s, e, st)  # Python slices clamp out-of-range bounds, as the op says
    return tuple(idx)


def slice_(b: Bind, info: NodeInfo) -> list[Step]:
    x_name = info.node.inputs[0]
    x, y = _raw(b, x_name), b.a(info.node.outputs[0])
    if np.shares_memory(x, y):
        return []
    idx = slice_index(info, b.types[x_name].shape)
    return [numpy_step(lambda: np.copyto(y.reshape(x[idx].shape), x[idx]))]


# --- indexing --------------------------------------------------------------------------------------------------
def embedding(b: Bind, info: NodeInfo) -> list[Step]:
    ids_name, table = info.node.inputs
    out = info.node.outputs[0]
    ids, y, tt, dt = b.a(ids_name), b.a(out), b.types[table], b.dtype(out)
    raw = b.weight(table).raw if b.is_weight(table) else b.a(table)

    def step() -> None:
        i = ids.astype(np.int64).reshape(-1)
        if tt.dtype.is_quantized:
            store(y, get_rows(raw, tt.dtype, tt.shape[1], i).reshape(y.shape), dt)
        else:
            store(y, compute(raw.reshape(tt.shape)[i], tt.dtype).reshape(y.shape), dt)

    return [numpy_step(step)]


def gather(b: Bind, info: NodeInfo) -> list[Step]:
    d_name, i_name = info.node.inputs
    data, idx, t = _raw(b, d_name), b.a(i_name), b.types[d_name]
    y = _raw(b, info.node.outputs[0])
    axis = info.attrs["axis"] % len(t.shape)
    size = t.shape[axis]
    return [numpy_step(lambda: np.copyto(y, np.take(data, np.where(idx < 0, idx + size, idx), axis=axis)))]


NUMPY: dict[str, Callable[[Bind, NodeInfo], list[Step]]] = {
    **dict.fromkeys(UNARY, unary), **dict.fromkeys(BINARY, binary), "Cast": cast, "SwiGLU": glu, "GeGLU": glu,
    "MatMul": matmul, "MatMulRelu": matmul, "GroupedMatMul": grouped_matmul, "Gemm": gemm, "RMSNorm": rms_norm,
    "AddRMSNorm": add_rms_norm, "LayerNorm": layer_norm, "Softmax": softmax, "TopK": topk, "ArgMax": argmax,
    "ReduceMean": reduce_mean, "Identity": copy_view, "Reshape": copy_view, "Transpose": transpose, "Concat": concat,
    "Split": split, "Slice": slice_, "Embedding": embedding, "Gather": gather,
}

__all__ = ["NUMPY", "compute", "operand", "qbytes", "slice_index", "store"]

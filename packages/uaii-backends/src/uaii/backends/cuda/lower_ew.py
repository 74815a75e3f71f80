"""Lowering of the element-wise, movement, reduction and general matrix-product ops (ONNX's vocabulary) for the
CUDA executable: ``LOWER[op](binder, info)`` queues the node's launches on a :class:`~uaii.backends.cuda.lower.Binder`
(see lower.py's module doc), over kernels/ew.cu.

Why a module apart from lower.py: these ops are what graphs imported from ONNX carry around the decoder proper
(position ids, masks, shapes, casts), so their forms are general — any rank, NumPy broadcasting, integers — where
lower.py's kernels are tuned for the few forms a decoder step runs. Values are the device's 4-byte words (f32 for
floats, i32 for integers and bools), so an integer beyond 32 bits cannot live on the device: a constant or feed
holding one is refused, a kernel producing one faults (the executable raises naming the node after the run), never
a wrapped value passed on.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from uaii.backends.analysis import NodeInfo
from uaii.backends.base import BackendError
from uaii.backends.cuda import geometry
from uaii.backends.cuda.geometry import count
from uaii.ir import DType

if TYPE_CHECKING:
    from uaii.backends.cuda.lower import Binder

c_int, c_ll, c_f, c_p = ctypes.c_int, ctypes.c_longlong, ctypes.c_float, ctypes.c_uint64
MAX_DIMS = 8
"""ew.cu's EW_MAX_DIMS: the most dims of one N-d launch."""
ROUND = {DType.F16: 1, DType.BF16: 2}
"""The ``round`` argument of a kernel writing a value of this dtype (held in an f32 word, rounded as the CPU does)."""
INT_UNARY = {"Neg": 0, "Abs": 1, "Relu": 2, "Not": 3}
"""Integer element-wise ops and their ``op`` code in ew.cu's ``unary_i``."""
I32_MIN, I32_MAX = -(2 ** 31), 2 ** 31 - 1


# --- values ----------------------------------------------------------------------------------------------------
def dtype_of(b: Binder, name: str) -> DType:
    return b.types[name].dtype if name in b.types else b.exe.tensor(name).dtype


def shape_of(b: Binder, name: str) -> tuple[int, ...]:
    if name in b.types:
        return tuple(b.types[name].shape)
    return tuple(int(d) for d in b.exe.tensor(name).shape)


def is_int(dtype: DType) -> bool:
    """Held as i32 words on the device (integers and bools)."""
    return not (dtype.is_float or dtype.is_quantized)


def wide_int(b: Binder, name: str) -> int:
    """The ``wide`` argument of an integer kernel computing on ``name``'s dtype: 0 for i32 and bools (the word wraps
    as the type does), 1 for i64 (a result beyond 32 bits faults). Narrower or unsigned types are refused: the word
    would not wrap where theirs does (an i8 sum past 127), or would read a u32 past 2^31 as negative."""
    dt = dtype_of(b, name)
    if dt in (DType.I32, DType.BOOL):
        return 0
    if dt is DType.I64:
        return 1
    raise b.fail(f"integer arithmetic on {dt.value} (the kernels compute in signed 32-bit words: i32, i64 and bools)")


def int_args(b: Binder, name: str, what: str = "") -> tuple[Any, Any, Any]:
    """The trailing (fault, code, wide) arguments of an integer kernel computing on ``name``'s dtype
    (:func:`wide_int`): its faults raise naming the node and ``what`` (an i64 result beyond 32 bits by default)."""
    wide = wide_int(b, name)
    fault, code = b.fault(what or OVERFLOW)
    return c_p(fault), c_int(code), c_int(wide)


def round_arg(b: Binder, y: str) -> Any:
    """The ``round`` argument of a kernel writing float value ``y``: its f16 / bf16 width, else 0."""
    return c_int(ROUND.get(b.types[y].dtype, 0))


def signed_words(b: Binder, *names: str) -> None:
    """Refuse reading a u32 value's words as numbers: past 2^31 the signed word is negative (moving or selecting
    them keeps their bits and is fine)."""
    for n in names:
        if dtype_of(b, n) is DType.U32:
            raise b.fail(f"{n!r} is u32: the kernels read integer words as signed")


def operand(b: Binder, name: str) -> int:
    """Device address of a value read as words: an activation's region, or a weight or constant uploaded once as
    the device holds its dtype (a block-quantized weight as its f32 values)."""
    if not b.is_weight(name):
        return b.a(name)
    if name in b.exe.streamed:
        raise b.fail(f"weight {name!r} is streamed: this op reads its operands whole (only the matrix products, "
                     "embeddings, norms and expert banks read streamed weights)")
    try:
        return b.exe.weight(name, "f32")
    except BackendError as exc:
        raise b.fail(str(exc)) from None


def contiguous(shape: Sequence[int]) -> list[int]:
    """Row-major strides of ``shape``, in elements."""
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= int(d)
    return out[::-1]


def broadcast(shape: Sequence[int], out: Sequence[int], strides: Sequence[int] | None = None) -> list[int]:
    """Strides reading a value of ``shape`` (its own ``strides``, row-major by default) at every index of ``out``
    (NumPy broadcasting: right-aligned, 0 where a dim of 1 is repeated)."""
    pad = len(out) - len(shape)
    st = [0] * pad + list(contiguous(shape) if strides is None else strides)
    full = [1] * pad + [int(d) for d in shape]
    return [0 if d == 1 and o != 1 else s for d, o, s in zip(full, out, st, strict=True)]


def table(b: Binder, *rows: Sequence[int]) -> int:
    """A launch's shapes and strides, uploaded once for the binding (freed with it)."""
    data = np.array([int(v) for r in rows for v in r] or [0], np.int64)
    buf = b.dev.upload(data)
    b.owned.append(buf)
    return int(buf.ptr)


def rank_ok(b: Binder, shape: Sequence[int]) -> None:
    if len(shape) > MAX_DIMS:
        raise b.fail(f"a value of rank {len(shape)} (the kernels index at most {MAX_DIMS} dims)")


def ew_launch(b: Binder, kernel: str, items: int, *args: Any) -> None:
    if items:
        b.launch("ew", kernel, geometry.elementwise(items), *args)


# --- element-wise ----------------------------------------------------------------------------------------------
BINARY_F = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3, "Pow": 4, "Max": 5, "Min": 6, "Mod": 7}
BINARY_I = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3, "Max": 4, "Min": 5, "Mod": 6, "And": 8, "Or": 9, "Xor": 10}
COMPARE = {"Equal": 0, "Less": 1, "Greater": 2, "LessOrEqual": 3, "GreaterOrEqual": 4}
FAULTS = {"Div": "integer division by zero (or an i64 result beyond the device's 32 bits)",
          "Mod": "integer modulo by zero"}
OVERFLOW = "an i64 result beyond the device's 32-bit integers (it would wrap where the host's 64 bits do not)"


def binary(b: Binder, info: NodeInfo) -> None:
    """C = A op B with NumPy broadcasting at any rank: floats through binary_f (rounded to the output's type),
    integers and bools through binary_i (wrapping; a zero divisor faults), comparisons to bools."""
    op = info.node.op
    a, c = info.node.inputs[:2]
    y = info.node.outputs[0]
    out = tuple(b.types[y].shape)
    rank_ok(b, out)
    n = count(out)
    tab = table(b, out, broadcast(shape_of(b, a), out), broadcast(shape_of(b, c), out))
    args = (c_p(operand(b, a)), c_p(operand(b, c)), c_p(b.a(y)), c_p(tab), c_int(len(out)), c_ll(n))
    ints = is_int(dtype_of(b, a))
    signed_words(b, a, c)
    if op in COMPARE:
        return ew_launch(b, "compare_i" if ints else "compare_f", n, *args, c_int(COMPARE[op]))
    if not ints:
        if op not in BINARY_F:
            raise b.fail(f"{op} of {dtype_of(b, a).value} values (it takes bools)")
        if op == "Mod" and not info.attrs.get("fmod"):
            raise b.fail("Mod of floats needs fmod=1")
        return ew_launch(b, "binary_f", n, *args, c_int(BINARY_F[op]), round_arg(b, y))
    if op not in BINARY_I:
        raise b.fail(f"{op} of integers")
    code = 7 if op == "Mod" and info.attrs.get("fmod") else BINARY_I[op]
    ew_launch(b, "binary_i", n, *args, c_int(code), *int_args(b, a, FAULTS.get(op, OVERFLOW)))


def int_unary(b: Binder, info: NodeInfo) -> None:
    x, y = info.node.inputs[0], info.node.outputs[0]
    op = info.node.op
    if op not in INT_UNARY:
        raise b.fail(f"{op} of {dtype_of(b, x).value} values (the kernel computes it on floats)")
    n = count(b.types[y].shape)
    ew_launch(b, "unary_i", n, c_p(operand(b, x)), c_ll(n), c_p(b.a(y)), c_int(INT_UNARY[op]), *int_args(b, x))


def softcap(b: Binder, info: NodeInfo) -> None:
    cap = float(info.attrs["cap"])
    if cap == 0.0:
        raise b.fail("Softcap with cap 0")
    b.unary_map(info, 15, cap)


def where(b: Binder, info: NodeInfo) -> None:
    cond, x, z = info.node.inputs[:3]
    y = info.node.outputs[0]
    out = tuple(b.types[y].shape)
    rank_ok(b, out)
    n = count(out)
    tab = table(b, out, *(broadcast(shape_of(b, v), out) for v in (cond, x, z)))
    ew_launch(b, "where_w", n, c_p(operand(b, cond)), c_p(operand(b, x)), c_p(operand(b, z)), c_p(b.a(y)), c_p(tab),
              c_int(len(out)), c_ll(n))


def cast(b: Binder, info: NodeInfo) -> None:
    """Y = X as ``to``: float → float rounds to the target's width, float → int rounds half to even and saturates
    to the target's range (a result beyond 32 bits faults), int → int saturates, anything → bool is X != 0."""
    x, y = info.node.inputs[0], info.node.outputs[0]
    src, dst = dtype_of(b, x), b.types[y].dtype
    signed_words(b, x, y)
    n = count(b.types[y].shape)
    px, py = c_p(operand(b, x)), c_p(b.a(y))
    if dst.is_quantized:
        raise b.fail(f"Cast to {dst.value}")
    if dst.is_float:
        kernel = "cast_i2f" if is_int(src) else "cast_f"
        return ew_launch(b, kernel, n, px, c_ll(n), py, round_arg(b, y))
    to_bool = int(dst is DType.BOOL)
    lo, hi = (0, 1) if to_bool else (int(np.iinfo(dst.numpy).min), int(np.iinfo(dst.numpy).max))
    if is_int(src):
        return ew_launch(b, "cast_i2i", n, px, c_ll(n), py, c_ll(max(lo, I32_MIN)), c_ll(min(hi, I32_MAX)),
                         c_int(to_bool))
    fault, tag = b.fault(f"a value cast to {dst.value} lies beyond the device's 32-bit integers")
    ew_launch(b, "cast_f2i", n, px, c_ll(n), py, c_ll(lo), c_ll(hi), c_int(to_bool), c_p(fault), c_int(tag))


# --- movement ----------------------------------------------------------------------------------------------------
def copy_box(b: Binder, src: int, src_base: int, src_strides: Sequence[int], dst: int, dst_base: int,
             dst_strides: Sequence[int], shape: Sequence[int]) -> None:
    """y[dst_base + i . dst_strides] = x[src_base + i . src_strides] for every index i of ``shape`` (words)."""
    rank_ok(b, shape)
    n = count(shape)
    if n:
        tab = table(b, shape, src_strides, dst_strides)
        ew_launch(b, "copy_nd", n, c_p(src), c_ll(src_base), c_p(dst), c_ll(dst_base), c_p(tab), c_int(len(shape)),
                  c_ll(n))


def transpose(b: Binder, info: NodeInfo) -> None:
    x, y = info.node.inputs[0], info.node.outputs[0]
    shape = shape_of(b, x)
    given = info.attrs.get("perm")
    perm = [int(p) for p in given] if given else list(range(len(shape)))[::-1]
    st = contiguous(shape)
    out = [shape[p] for p in perm]
    copy_box(b, operand(b, x), 0, [st[p] for p in perm], b.a(y), 0, contiguous(out), out)


def expand(b: Binder, info: NodeInfo) -> None:
    x, y = info.node.inputs[0], info.node.outputs[0]
    out = tuple(b.types[y].shape)
    copy_box(b, operand(b, x), 0, broadcast(shape_of(b, x), out), b.a(y), 0, contiguous(out), out)


def strided_slice(b: Binder, x: str, y: str, box: Sequence[tuple[int, int, int]]) -> None:
    """Y = X[start:stop:step, ...] per axis (``box``: Python's slice.indices of each axis)."""
    st = contiguous(shape_of(b, x))
    out = tuple(b.types[y].shape)
    base = sum(lo * s for (lo, _, _), s in zip(box, st, strict=True))
    copy_box(b, operand(b, x), base, [s * step for (_, _, step), s in zip(box, st, strict=True)], b.a(y), 0,
             contiguous(out), out)


def concat(b: Binder, info: NodeInfo) -> None:
    y = info.node.outputs[0]
    out = tuple(b.types[y].shape)
    axis = int(info.attrs["axis"]) % max(len(out), 1)
    if b.types[y].dtype.is_quantized:
        return _concat_blocks(b, info, axis)
    dst = contiguous(out)
    at = 0
    for x in info.node.inputs:
        shape = shape_of(b, x)
        copy_box(b, operand(b, x), 0, contiguous(shape), b.a(y), at * dst[axis], dst, shape)
        at += shape[axis]


def _concat_blocks(b: Binder, info: NodeInfo, axis: int) -> None:
    """Block-quantized weights joined along their leading axis: their stored bytes, one after another."""
    y = info.node.outputs[0]
    if count(b.types[y].shape[:axis]) != 1:
        raise b.fail(f"Concat of {b.types[y].dtype.value} blocks along axis {axis} (only whole rows are joined)")
    at = b.a(y)
    for x in info.node.inputs:
        if not b.is_weight(x) or x in b.exe.streamed:
            raise b.fail(f"Concat of the block-quantized value {x!r}: only resident weights are joined as bytes")
        nbytes = dtype_of(b, x).nbytes(count(shape_of(b, x)))
        b.copy(at, b.exe.weight(x, "packed"), nbytes)
        at += nbytes


def gather(b: Binder, info: NodeInfo) -> None:
    """Y = take(data, indices, axis); an index outside [-len, len) faults (the run raises naming the node)."""
    data, idx = info.node.inputs[:2]
    y = info.node.outputs[0]
    shape = shape_of(b, data)
    axis = int(info.attrs.get("axis", 0)) % len(shape)
    if not is_int(dtype_of(b, idx)):
        raise b.fail(f"Gather indices {idx!r} are {dtype_of(b, idx).value} (the kernel reads integers)")
    if b.is_weight(data) and dtype_of(b, data).is_quantized:
        raise b.fail(f"Gather from the block-quantized table {data!r} (an Embedding reads those rows packed)")
    n_idx, inner = count(shape_of(b, idx)), count(shape[axis + 1:])
    n = count(b.types[y].shape)
    fault, tag = b.fault(f"an index out of range for axis {axis} of size {shape[axis]}")
    ew_launch(b, "gather_w", n, c_p(operand(b, data)), c_p(operand(b, idx)), c_p(b.a(y)), c_ll(n_idx),
              c_ll(max(inner, 1)), c_ll(shape[axis]), c_ll(n), c_p(fault), c_int(tag))


def trilu(b: Binder, info: NodeInfo) -> None:
    x, y = info.node.inputs[0], info.node.outputs[0]
    shape = shape_of(b, x)
    n = count(shape)
    ew_launch(b, "trilu_w", n, c_p(operand(b, x)), c_p(b.a(y)), c_ll(shape[-2]), c_ll(max(shape[-1], 1)), c_ll(n),
              c_ll(int(info.attrs.get("k", 0))), c_int(int(bool(info.attrs.get("upper", True)))))


def shape(b: Binder, info: NodeInfo) -> None:
    """Y = X's dims (known when the binding is made): words uploaded once and copied in each run."""
    x, y = info.node.inputs[0], info.node.outputs[0]
    dims = np.array(shape_of(b, x)[slice(int(info.attrs.get("start", 0)), info.attrs.get("end"))], np.int32)
    if dims.size:
        buf = b.dev.upload(dims)
        b.owned.append(buf)
        b.copy(b.a(y), int(buf.ptr), 4 * dims.size)


def fill(b: Binder, info: NodeInfo) -> None:
    value, y = info.node.inputs[1], info.node.outputs[0]
    n = count(b.types[y].shape)
    ew_launch(b, "fill_w", n, c_p(operand(b, value)), c_p(b.a(y)), c_ll(n))


def range_(b: Binder, info: NodeInfo) -> None:
    start, _, delta = info.node.inputs[:3]
    y = info.node.outputs[0]
    n = count(b.types[y].shape)
    args = (c_p(operand(b, start)), c_p(operand(b, delta)), c_p(b.a(y)), c_ll(n))
    if is_int(b.types[y].dtype):
        ew_launch(b, "range_i", n, *args, *int_args(b, y))
    else:
        ew_launch(b, "range_f", n, *args, round_arg(b, y))


# --- reductions ----------------------------------------------------------------------------------------------------
REDUCE = {"ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3}


def reduce(b: Binder, info: NodeInfo) -> None:
    """One thread per output value over the reduced axes (the table: kept dims and their x strides, reduced dims
    and theirs)."""
    x, y = info.node.inputs[0], info.node.outputs[0]
    shape = shape_of(b, x)
    rank_ok(b, shape)
    axes = info.attrs.get("axes")
    red = sorted({int(a) % len(shape) for a in axes}) if axes else list(range(len(shape)))
    kept = [d for d in range(len(shape)) if d not in red]
    st = contiguous(shape)
    n, rn = count([shape[d] for d in kept]), count([shape[d] for d in red])
    op = REDUCE[info.node.op]
    dt = dtype_of(b, x)
    signed_words(b, x)
    tab = table(b, [shape[d] for d in kept], [st[d] for d in kept], [shape[d] for d in red], [st[d] for d in red])
    args = (c_p(operand(b, x)), c_p(b.a(y)), c_p(tab), c_int(len(kept)), c_int(len(red)), c_ll(n), c_ll(rn),
            c_int(op))
    if not is_int(dt):
        return ew_launch(b, "reduce_f", n, *args, round_arg(b, y))
    if op == 1:
        raise b.fail("ReduceMean of integers")
    if not rn and op >= 2 and dt.numpy.itemsize > 4:
        raise b.fail(f"an empty {info.node.op} of {dt.value} (its identity lies beyond the device's 32 bits)")
    ew_launch(b, "reduce_i", n, *args, *int_args(b, x))


def _axis_view(b: Binder, x: str, axis: int) -> tuple[int, int, int]:
    """(outer, n, inner) of x viewed around ``axis``."""
    shape = shape_of(b, x)
    a = axis % len(shape)
    return count(shape[:a]), shape[a], count(shape[a + 1:])


def softmax(b: Binder, info: NodeInfo) -> None:
    x, y = info.node.inputs[0], info.node.outputs[0]
    outer, n, inner = _axis_view(b, x, int(info.attrs.get("axis", -1)))
    cols = outer * inner
    ew_launch(b, "softmax_ax", cols if n else 0, c_p(operand(b, x)), c_p(b.a(y)), c_ll(n), c_ll(max(inner, 1)),
              c_ll(cols), round_arg(b, y))


def cumsum(b: Binder, info: NodeInfo) -> None:
    x, y = info.node.inputs[0], info.node.outputs[0]
    outer, n, inner = _axis_view(b, x, int(info.attrs["axis"]))
    cols = outer * inner
    flags = (c_int(int(bool(info.attrs.get("exclusive")))), c_int(int(bool(info.attrs.get("reverse")))))
    args = (c_p(operand(b, x)), c_p(b.a(y)), c_ll(n), c_ll(max(inner, 1)), c_ll(cols), *flags)
    if is_int(dtype_of(b, x)):
        ew_launch(b, "cumsum_i", cols, *args, *int_args(b, x))
    else:
        ew_launch(b, "cumsum_f", cols, *args, round_arg(b, y))


def argmax(b: Binder, info: NodeInfo) -> None:
    x, y = info.node.inputs[0], info.node.outputs[0]
    signed_words(b, x)
    outer, n, inner = _axis_view(b, x, int(info.attrs.get("axis", -1)))
    if not n:
        raise b.fail("ArgMax over an empty axis")
    ew_launch(b, "argmax_ax", outer * inner, c_p(operand(b, x)), c_p(b.a(y)), c_ll(n), c_ll(max(inner, 1)),
              c_ll(outer * inner), c_int(int(is_int(dtype_of(b, x)))))


def topk(b: Binder, info: NodeInfo) -> None:
    x = info.node.inputs[0]
    signed_words(b, x)
    vals, idx = info.node.outputs[:2]
    outer, n, inner = _axis_view(b, x, int(info.attrs.get("axis", -1)))
    k = int(info.attrs["k"])
    if k > n:
        raise b.fail(f"TopK k = {k} of an axis of {n}")
    if not idx:
        raise b.fail("TopK without its indices output (the kernel writes both)")
    ew_launch(b, "topk_ax", outer * inner if k else 0, c_p(operand(b, x)), c_p(b.a(vals)), c_p(b.a(idx)), c_ll(n),
              c_ll(max(inner, 1)), c_ll(outer * inner), c_int(k), c_int(int(bool(info.attrs.get("largest", True)))),
              c_int(int(is_int(dtype_of(b, x)))))


# --- matrix products -----------------------------------------------------------------------------------------------
def general_matmul(b: Binder, a: str, w: str, y: str, *, trans_a: bool = False, trans_b: bool = False,
                   bias: str = "", alpha: float = 1.0, beta: float = 1.0, relu: bool = False) -> None:
    """y = alpha op(a) @ op(w) (+ beta bias) in f32 with NumPy's batch broadcasting, one thread per output value
    (double sums): the form of a product no GEMV reads — an activation times an activation, a plain weight of any
    K, Gemm. A block-quantized weight is refused (its products are the GEMV's and the int8 GEMM's)."""
    for v in (a, w):
        if dtype_of(b, v).is_quantized or is_int(dtype_of(b, v)):
            raise b.fail(f"a general matrix product of {dtype_of(b, v).value} {v!r} (it multiplies floats; a "
                         "block-quantized weight goes through the GEMV as [N, K])")
    sa, sw, out = shape_of(b, a), shape_of(b, w), tuple(b.types[y].shape)
    if len(sa) < 2 or len(sw) < 2:
        raise b.fail(f"a matrix product of {sa} and {sw} (both need 2 dims)")
    m, n = out[-2], out[-1]
    k = sa[-2] if trans_a else sa[-1]
    batch = out[:-2]
    rank_ok(b, batch)
    ta, tw = contiguous(sa), contiguous(sw)
    am, ak = (ta[-1], ta[-2]) if trans_a else (ta[-2], ta[-1])
    wk, wn = (tw[-1], tw[-2]) if trans_b else (tw[-2], tw[-1])

    bc = broadcast(shape_of(b, bias), out) if bias else [0] * len(out)
    tab = table(b, batch, broadcast(sa[:-2], batch, ta[:-2]), broadcast(sw[:-2], batch, tw[:-2]), bc[:-2],
                [am, ak, wk, wn, *bc[-2:]])
    total = count(out)
    ew_launch(b, "matmul_f", total, c_p(operand(b, a)), c_p(operand(b, w)), c_p(operand(b, bias) if bias else 0),
              c_p(b.a(y)), c_p(tab), c_int(len(batch)), c_ll(m), c_ll(n), c_ll(k), c_ll(total), c_f(alpha),
              c_f(beta), c_int(int(relu)), round_arg(b, y))


def gemm(b: Binder, info: NodeInfo) -> None:
    """alpha op(A) op(B) + beta C: a weight the GEMV reads goes through it (then the scale and the bias, each one
    broadcast launch), anything else through the general product."""
    ins = [*info.node.inputs, ""]
    a, w, c = ins[:3]
    y = info.node.outputs[0]
    at = info.attrs
    alpha, beta, trans_b = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0)), bool(at.get("transB"))
    if at.get("transA") or b.gemv_shape(w, trans_b) is None:
        return general_matmul(b, a, w, y, trans_a=bool(at.get("transA")), trans_b=trans_b, bias=c, alpha=alpha,
                              beta=beta)
    b.matmul(a, w, y, trans_b)
    out = tuple(b.types[y].shape)
    if alpha != 1.0:
        _accumulate(b, y, _constant(b, alpha), [0] * len(out), 2)
    if c:
        bias = _scaled(b, c, beta) if beta != 1.0 else operand(b, c)
        _accumulate(b, y, bias, broadcast(shape_of(b, c), out), 0)


def _constant(b: Binder, value: float) -> int:
    buf = b.dev.upload(np.array([value], np.float32))
    b.owned.append(buf)
    return int(buf.ptr)


def _accumulate(b: Binder, y: str, other: int, strides: list[int], op: int) -> None:
    """y = y op other (op 0: +, 2: *), ``other`` read through ``strides`` (a broadcast bias or one scale)."""
    out = tuple(b.types[y].shape)
    tab = table(b, out, contiguous(out), strides)
    ew_launch(b, "binary_f", count(out), c_p(b.a(y)), c_p(other), c_p(b.a(y)), c_p(tab), c_int(len(out)),
              c_ll(count(out)), c_int(op), round_arg(b, y))


def _scaled(b: Binder, name: str, scale: float) -> int:
    """beta C for Gemm's bias: one broadcast product into a scratch of C's size."""
    shape = shape_of(b, name)
    buf = b.dev.alloc(4 * max(count(shape), 1))
    b.owned.append(buf)
    tab = table(b, shape, contiguous(shape), [0] * len(shape))
    ew_launch(b, "binary_f", count(shape), c_p(operand(b, name)), c_p(_constant(b, scale)), c_p(int(buf.ptr)),
              c_p(tab), c_int(len(shape)), c_ll(count(shape)), c_int(2), c_int(0))
    return int(buf.ptr)


def matmul_relu(b: Binder, info: NodeInfo) -> None:
    """The GEMV / int8 GEMM where they read the weight, then relu in place; else the general product with relu."""
    x, w = info.node.inputs[:2]
    y = info.node.outputs[0]
    trans_b = bool(info.attrs.get("transpose_b"))
    if b.gemv_shape(w, trans_b) is not None:
        b.matmul(x, w, y, trans_b)
        n = count(b.types[y].shape)
        if n:
            b.launch("ops", "unary", geometry.elementwise(n), c_p(b.a(y)), c_ll(n), c_p(b.a(y)), c_int(5), c_f(0.0),
                     round_arg(b, y))
        return
    general_matmul(b, x, w, y, trans_b=trans_b, relu=True)


def _ops(fn: Callable[[Binder, NodeInfo], None], *names: str) -> dict[str, Callable[[Binder, NodeInfo], None]]:
    return dict.fromkeys(names, fn)


LOWER: dict[str, Callable[[Binder, NodeInfo], None]] = {
    **_ops(binary, "Sub", "Div", "Pow", "Max", "Min", "Mod", "And", "Or", "Xor", *COMPARE),
    "Not": int_unary, "Softcap": softcap, "Where": where, "Cast": cast, "Transpose": transpose, "Expand": expand,
    "Concat": concat, "Gather": gather, "Trilu": trilu, "Shape": shape, "Fill": fill, "Range": range_,
    **_ops(reduce, *REDUCE), "Softmax": softmax, "CumSum": cumsum, "ArgMax": argmax, "TopK": topk, "Gemm": gemm,
    "MatMulRelu": matmul_relu,
}

"""The CPU reference of every CUDA kernel (kernels/*.cu) in the kernel's launch signature: ``reference(kernel)(mem,
at, values)`` does to :class:`~uaii.backends.cuda.host.HostMemory` what the kernel does to device memory, launched
with ``at`` (grid, block) and the arguments ``values`` (pointers as int addresses, 0 for NULL).

Why it exists: the host model of a device (:mod:`uaii.backends.cuda.host`) runs a whole model's launches through
these, so that what the executor decides (kernels, pointers, strides, sizes, geometry) is compared with the CPU
backend on any machine; on a GPU the kernels are compared with the same references. Hence:

- coverage: a reference computes only what the launch's threads cover (GEMV rows < grid.x * block.y, items <
  grid.x * block.x, a norm's row per block, ...: a grid too small leaves the same values unwritten as on a device)
  and touches only addresses the kernel does (HostMemory fails a range outside one allocation, where a device would
  corrupt memory silently). A kernel that assumes its block shape (a warp per GEMV row, 256-thread reductions, the
  int8 GEMM's 16 x 16 threads) refuses another one rather than model a device's garbage.
- arithmetic: where a CPU function has the kernel's definition it is used (uaii.kernels.dequantize for the decoders,
  quantize_activations for quant_act: the same bits); the int8 GEMM decodes units in their integer form (decode.cuh:
  uk_unit_int); sums and transcendental functions are computed in float64 and rounded once to float32 (a device sums
  in another order: results agree to rounding); add, bcast, copy_rows, attn_mask and kv_store are exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import cache, partial
from typing import TYPE_CHECKING, Any

import numpy as np

import uaii.kernels as K
from uaii.backends.base import BackendError
from uaii.backends.cuda.geometry import (
    ATTN_HEADS,
    ATTN_KEYS,
    ATTN_SOFTMAX,
    ATTN_VALUES,
    FLASH_VALUES,
    GEMV_WARPS,
    MMQ_SIDE,
    MMQ_TILE,
    NORM_BLOCK,
    WARP,
    Launch,
)
from uaii.backends.cuda.sources import GEMV_ROWS, MMQ_TYPES, TYPES
from uaii.ir import DType
from uaii.ir.reference.elementwise import erf_, gelu

if TYPE_CHECKING:
    from uaii.backends.cuda.host import HostMemory

Values = tuple[Any, ...]
Reference = Callable[["HostMemory", Launch, Values], None]
F32, F64 = np.float32, np.float64
_CHUNK = 1 << 22  # decoded weight values per step of a GEMV / int8 GEMM (bounds the host's memory)


# --- memory ------------------------------------------------------------------------------------------------------
def _offsets(count: int, width: int, ld: int) -> np.ndarray:
    """Element offsets of the first ``count`` items of a matrix of rows ``width`` wide and ``ld`` apart."""
    i = np.arange(max(count, 0), dtype=np.int64)
    if width == ld or not i.size:
        return i
    if width <= 0:
        raise BackendError(f"[cuda-host] rows of {width} values: the kernel would divide by zero")
    return i // width * ld + i % width


def _load(mem: HostMemory, ptr: int, dtype: Any, offsets: np.ndarray) -> np.ndarray:
    """A copy of the ``dtype`` values at element ``offsets`` from ``ptr`` (their span must be one allocation)."""
    if not offsets.size:
        return np.empty(offsets.shape, dtype)
    lo, hi = int(offsets.min()), int(offsets.max())
    return mem.array(ptr + lo * np.dtype(dtype).itemsize, dtype, hi - lo + 1)[offsets - lo]


def _store(mem: HostMemory, ptr: int, dtype: Any, offsets: np.ndarray, values: np.ndarray) -> None:
    """Write ``values`` (rounded to ``dtype``) at element ``offsets`` from ``ptr``."""
    if offsets.size:
        lo, hi = int(offsets.min()), int(offsets.max())
        mem.array(ptr + lo * np.dtype(dtype).itemsize, dtype, hi - lo + 1)[offsets - lo] = values


def _fault(mem: HostMemory, fault: int, code: int, bad: np.ndarray) -> None:
    """Write the fault ``code`` to the word at ``fault`` where any of ``bad`` holds, as a kernel does."""
    if np.any(bad):
        _store(mem, fault, np.int32, np.zeros(1, np.int64), np.array([code], np.int32))


def _at(mem: HostMemory, ptr: int, dtype: Any, i: int) -> Any:
    """Element ``i`` of a device array (a Python int or float)."""
    return mem.array(ptr + i * np.dtype(dtype).itemsize, dtype, 1)[0].item()


# --- launches ----------------------------------------------------------------------------------------------------
def _items(at: Launch, count: int) -> int:
    """How many of ``count`` items a one-thread-per-item kernel computes: its grid's x threads cover 0 .. that."""
    return max(0, min(count, at.grid[0] * at.block[0]))


def _need_block(at: Launch, kernel: str, x: int, y: int | None = None) -> None:
    if at.block[0] != x or (y is not None and at.block[1:] != (y, 1)):
        want = f"({x}, {y}, 1)" if y is not None else f"({x}, ...)"
        raise BackendError(f"[cuda-host] {kernel} assumes blocks of {want} threads, launched with {at.block}")


# --- weights -----------------------------------------------------------------------------------------------------
def _raw_rows(mem: HostMemory, w: int, dtype: DType, starts: np.ndarray, units: int) -> tuple[np.ndarray, int]:
    """The bytes of the blocks holding units 0 .. ``units`` of the weight rows at byte offsets ``starts``, as
    [rows * blocks, block bytes], and the blocks per row."""
    _, _, nbytes, per = TYPES[dtype]
    blocks = -(-units // per)
    raw = _load(mem, w, np.uint8, (starts[:, None] + np.arange(blocks * nbytes)).reshape(-1))
    return raw.reshape(-1, nbytes), blocks


def _decode_rows(mem: HostMemory, w: int, dtype: DType, starts: np.ndarray, units: int) -> np.ndarray:
    """Units 0 .. ``units`` of the rows at byte offsets ``starts`` decoded (decode.cuh: uk_row_unit), [rows, 32 u]."""
    if units <= 0 or not starts.size:
        return np.zeros((starts.size, 0), F32)
    raw, blocks = _raw_rows(mem, w, dtype, starts, units)
    per = TYPES[dtype][3]
    return K.dequantize(raw, dtype, raw.shape[0] * per * 32).reshape(starts.size, blocks * per * 32)[:, :32 * units]


def _chunks(rows: int, units: int) -> Iterator[np.ndarray]:
    """Weight rows 0 .. rows in steps of at most _CHUNK decoded values."""
    step = max(1, _CHUNK // max(1, 32 * units))
    for r0 in range(0, rows, step):
        yield np.arange(r0, min(rows, r0 + step), dtype=np.int64)


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, at:at + 2]).view(np.float16).astype(F32)  # [blocks, 1]


def _int_units(dtype: DType, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """decode.cuh's uk_row_unit_int of every unit of blocks ``b`` [blocks, bytes]: q [blocks, units, 32], the half
    scales sc [blocks, units, 2] and the term mn [blocks, units] (the k-quants' minimum negated), float32 as there."""
    nb = b.shape[0]
    i32 = b.astype(np.int32)
    if dtype in (DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.Q8_0):
        at = {DType.Q4_0: 2, DType.Q4_1: 4, DType.Q5_0: 6, DType.Q5_1: 8, DType.Q8_0: 2}[dtype]
        if dtype is DType.Q8_0:
            q = b[:, 2:34].view(np.int8).astype(np.int32)
        else:
            qs = i32[:, at:at + 16]
            q = np.concatenate([qs & 15, qs >> 4], axis=1)
            if dtype in (DType.Q5_0, DType.Q5_1):
                qh = np.ascontiguousarray(b[:, at - 4:at]).view("<u4").astype(np.int64)
                q |= (((qh >> np.arange(32)) & 1) << 4).astype(np.int32)
            q -= {DType.Q4_0: 8, DType.Q5_0: 16}.get(dtype, 0)
        mn = _f16(b, 2) if dtype in (DType.Q4_1, DType.Q5_1) else np.zeros((nb, 1), F32)
        return q[:, None, :], np.repeat(_f16(b, 0), 2, axis=1)[:, None, :], mn
    if dtype is DType.Q6_K:
        nib = np.stack([i32[:, :128] & 15, i32[:, :128] >> 4], axis=1)             # [blocks, hi, 128]
        ql = nib.reshape(nb, 2, 2, 2, 32).transpose(0, 2, 1, 3, 4).reshape(nb, 2, 4, 32)  # [half, k = 2 hi + odd]
        qh = i32[:, 128:192].reshape(nb, 2, 1, 32) >> (2 * np.arange(4)).reshape(1, 1, 4, 1)
        q = (ql | ((qh & 3) << 4)) - 32
        sc = _f16(b, 208)[:, :, None] * b[:, 192:208].view(np.int8).astype(F32).reshape(nb, 8, 2)
        return q.reshape(nb, 8, 32), sc, np.zeros((nb, 8), F32)
    s6 = i32[:, 4:16]                                                               # Q4_K, Q5_K: uk_scale_min_k4
    sc = np.concatenate([s6[:, 0:4] & 63, (s6[:, 8:12] & 15) | ((s6[:, 0:4] >> 6) << 4)], axis=1)
    mins = np.concatenate([s6[:, 4:8] & 63, (s6[:, 8:12] >> 4) | ((s6[:, 4:8] >> 6) << 4)], axis=1)
    low = 16 if dtype is DType.Q4_K else 48
    qs = i32[:, low:low + 128].reshape(nb, 4, 1, 32)
    q = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(nb, 8, 32)
    if dtype is DType.Q5_K:
        q |= ((i32[:, None, 16:48] >> np.arange(8).reshape(1, 8, 1)) & 1) << 4
    d = _f16(b, 0) * sc.astype(F32)
    return q, np.repeat(d[:, :, None], 2, axis=2), -(_f16(b, 2) * mins.astype(F32))


# --- decoders and products ---------------------------------------------------------------------------------------
def _dequant(dtype: DType, mem: HostMemory, at: Launch, v: Values) -> None:
    w, units, y = v
    n = _items(at, units)
    values = _decode_rows(mem, w, dtype, np.zeros(1, np.int64), n)
    _store(mem, y, F32, np.arange(values.size), values.reshape(-1))


def _rows(dtype: DType, mem: HostMemory, at: Launch, v: Values) -> None:
    """Units < grid.x * block.x of the rows idx[0 .. r): an id outside [0, n_rows) gives zeros and writes the fault
    code."""
    w, row_bytes, per_row, idx, r, y, n_rows, fault, code = v
    n = _items(at, per_row * r)
    if n <= 0:
        return
    full, rest = divmod(n, per_row)
    ids = _load(mem, idx, np.int32, np.arange(full + (rest > 0))).astype(np.int64)
    bad = (ids < 0) | (ids >= n_rows)
    _fault(mem, fault, code, bad)
    safe = np.where(bad, 0, ids)
    values = _decode_rows(mem, w, dtype, safe[:full] * row_bytes, per_row)
    values[bad[:full]] = 0.0
    values = values.reshape(-1)
    if rest:
        tail = _decode_rows(mem, w, dtype, safe[full:] * row_bytes, rest)
        tail[bad[full:]] = 0.0
        values = np.concatenate([values, tail.reshape(-1)])
    _store(mem, y, F32, np.arange(values.size), values)


def _gemv(dtype: DType, m: int, mem: HostMemory, at: Launch, v: Values) -> None:
    """y[i, row] = x[i] . W[row], as float64 sums of the decoded weight (rows ``< grid.x * block.y``)."""
    w, row_bytes, n, k, x, ldx, y, ldy = v
    _need_block(at, f"gemv_{TYPES[dtype][1]}_m{m}", WARP, GEMV_WARPS)
    rows, units = max(0, min(n, at.grid[0] * at.block[1])), max(k, 0) // 32
    if rows == 0:
        return
    xs = _load(mem, x, F32, _offsets(m * 32 * units, 32 * units, ldx)).reshape(m, 32 * units).astype(F64)
    out = np.empty((m, rows), F32)
    for r in _chunks(rows, units):
        out[:, r[0]:r[-1] + 1] = xs @ _decode_rows(mem, w, dtype, r * row_bytes, units).astype(F64).T
    _store(mem, y, F32, _offsets(m * rows, rows, ldy), out.reshape(-1))


def _gemvq(dtype: DType, m: int, mem: HostMemory, at: Launch, v: Values) -> None:
    """y[i, row] = the int8 product of activation row i (quant_act's blocks) with W[row], as :func:`_mmq` sums it
    (rows ``< grid.x * block.y``): the unit pairs are mmq's, only their order of addition differs."""
    w, row_bytes, n, k, qa, da, sa, y, ldy = v
    _need_block(at, f"gemvq_{TYPES[dtype][1]}_m{m}", WARP, GEMV_WARPS)
    rows = max(0, min(n, at.grid[0] * at.block[1]))
    if rows == 0:
        return
    out = _int8_product(dtype, mem, w, row_bytes, rows, k, qa, da, sa, np.arange(m))
    _store(mem, y, F32, _offsets(m * rows, rows, ldy), out.reshape(-1))


def _quant_act(mem: HostMemory, at: Launch, v: Values) -> None:
    """Blocks i < grid.x * block.x of x [m, k] (rows ldx apart): q [m, k] (rows k apart), d and s [m, k / 32]."""
    x, ldx, m, k, q, d, s = v
    nb = max(k, 0) // 32
    n = _items(at, m * nb)
    if n <= 0:
        return
    qa, da, sa = K.quantize_activations(_load(mem, x, F32, _offsets(32 * n, 32 * nb, ldx)))
    _store(mem, q, np.int8, _offsets(32 * n, 32 * nb, k), qa)
    _store(mem, d, F32, np.arange(n), da)
    _store(mem, s, F32, np.arange(n), sa)


def _mmq(dtype: DType, mem: HostMemory, at: Launch, v: Values) -> None:
    """y[c, r] = the sum over units of uk_unit_dot: da (sc0 lo + sc1 hi) + mn sa, as (sc q) . (da qa) + mn . sa in
    float64, over the tiles of MMQ_TILE x MMQ_TILE the grid covers (one rectangle from (0, 0))."""
    w, row_bytes, n, k, qa, da, sa, m, y, ldy = v
    _need_block(at, f"mmq_{TYPES[dtype][1]}", MMQ_SIDE, MMQ_SIDE)
    rows, cols = max(0, min(n, at.grid[0] * MMQ_TILE)), max(0, min(m, at.grid[1] * MMQ_TILE))
    if rows == 0 or cols == 0:
        return
    out = _int8_product(dtype, mem, w, row_bytes, rows, k, qa, da, sa, np.arange(cols))
    _store(mem, y, F32, _offsets(cols * rows, rows, ldy), out.reshape(-1))


def _mmq_idx(dtype: DType, mem: HostMemory, at: Launch, v: Values) -> None:
    """For each expert e < grid.z of the bank: its first min(counts[e], grid.y * MMQ_TILE) pairs s (order[e * pairs
    ..]) get y[s, r] = :func:`_mmq`'s product of activation row s / x_div with W_e[r], rows r < grid.x * MMQ_TILE."""
    bank, expert_bytes, row_bytes, n, k, qa, da, sa, x_div, order, counts, pairs, y, ldy = v
    _need_block(at, f"mmq_idx_{TYPES[dtype][1]}", MMQ_SIDE, MMQ_SIDE)
    rows = max(0, min(n, at.grid[0] * MMQ_TILE))
    if rows == 0:
        return
    have = mem.array(counts, np.int32, at.grid[2])
    for e in range(at.grid[2]):
        m = min(int(have[e]), at.grid[1] * MMQ_TILE)
        if m <= 0:
            continue
        pair = mem.array(order + 4 * e * pairs, np.int32, m).astype(np.int64)
        out = _int8_product(dtype, mem, bank + e * expert_bytes, row_bytes, rows, k, qa, da, sa, pair // x_div)
        _store(mem, y, F32, (pair[:, None] * ldy + np.arange(rows)[None, :]).reshape(-1), out.reshape(-1))


def _int8_product(dtype: DType, mem: HostMemory, w: int, row_bytes: int, rows: int, k: int, qa: int, da: int,
                  sa: int, a_rows: np.ndarray) -> np.ndarray:
    """[len(a_rows), rows] float64: the activation rows ``a_rows`` (int8 in qa, k apart; their d and s) times the
    weight rows 0 .. rows at w, row_bytes apart, as mmq_tile sums them."""
    units = max(k, 0) // 32
    out = np.zeros((a_rows.size, rows), F64)
    if not units:
        return out
    cells = (a_rows[:, None] * k + np.arange(32 * units)[None, :]).reshape(-1)
    aq = _load(mem, qa, np.int8, cells).reshape(a_rows.size, units, 32)
    blocks = (a_rows[:, None] * units + np.arange(units)[None, :]).reshape(-1)
    ad = _load(mem, da, F32, blocks).reshape(a_rows.size, units, 1)
    a_s = _load(mem, sa, F32, blocks).reshape(a_rows.size, units).astype(F64)
    a_eff = (aq.astype(F64) * ad).reshape(a_rows.size, 32 * units)
    for r in _chunks(rows, units):
        raw, nblocks = _raw_rows(mem, w, dtype, r * row_bytes, units)
        q, sc, mn = _int_units(dtype, raw)
        per = q.shape[1]
        q, sc, mn = (a.reshape(r.size, nblocks * per, *a.shape[2:])[:, :units] for a in (q, sc, mn))
        w_eff = (q.astype(F64) * np.repeat(sc, 16, axis=2)).reshape(r.size, 32 * units)
        out[:, r[0]:r[-1] + 1] = a_eff @ w_eff.T + a_s @ mn.astype(F64).T
    return out


def _moe_group(mem: HostMemory, at: Launch, v: Values) -> None:
    """Experts e < min(n_experts, grid.x * block.x): the pairs s whose idx[s] == e0 + e, ascending, at order[e *
    pairs ..], their count at counts[e]."""
    idx, pairs, e0, n_experts, order, counts = v
    n = _items(at, n_experts)
    if n <= 0:
        return
    chosen = mem.array(idx, np.int32, pairs) if pairs > 0 else np.zeros(0, np.int32)
    got = np.empty(n, np.int32)
    for e in range(n):
        mine = np.flatnonzero(chosen == e0 + e).astype(np.int32)
        got[e] = mine.size
        if mine.size:
            _store(mem, order, np.int32, e * pairs + np.arange(mine.size), mine)
    _store(mem, counts, np.int32, np.arange(n), got)


# --- row operators -----------------------------------------------------------------------------------------------
def _add_rms_norm(mem: HostMemory, at: Launch, v: Values, kernel: str = "add_rms_norm") -> None:
    """ops.cu's rms_row for rows 0 .. grid.x (the kernel has no row count): the sum written first (when its pointer
    is not NULL), then y normalized from the sum as written (so a sum aliasing a or res still gives the right y)."""
    a, res, total, w, y, n, eps, unit_offset = v
    _need_block(at, kernel, NORM_BLOCK, 1)
    rows = at.grid[0]
    if n <= 0:
        return
    av = mem.array(a, F32, rows * n).reshape(rows, n)
    rv = mem.array(res, F32, rows * n).reshape(rows, n) if res else None
    first = av + rv if rv is not None else av.astype(F32)
    if total:
        mem.array(total, F32, rows * n)[:] = first.reshape(-1)
    first64 = first.astype(F64)
    inv = 1.0 / np.sqrt(np.mean(first64 * first64, axis=1, keepdims=True) + float(eps))
    wv = mem.array(w, F32, n)
    scale = (F32(1) + wv if unit_offset else wv).astype(F64)
    again = (mem.array(total, F32, rows * n).reshape(rows, n) if total else
             av + rv if rv is not None else av).astype(F64)
    mem.array(y, F32, rows * n)[:] = (again * inv * scale).astype(F32).reshape(-1)


def _rms_norm(mem: HostMemory, at: Launch, v: Values) -> None:
    x, w, y, n, eps, unit_offset = v
    _add_rms_norm(mem, at, (x, 0, 0, w, y, n, eps, unit_offset), "rms_norm")


def _glu(act: Callable[..., np.ndarray], mem: HostMemory, at: Launch, v: Values) -> None:
    """y[i] = act(g[r ld + c]) * u[r ld + c] with r, c = divmod(i, ff), for i < grid.x * block.x."""
    g, u, ld, ff, count, y, *flag = v
    n = _items(at, count)
    offs = _offsets(n, ff, ld)
    a, b = _load(mem, g, F32, offs).astype(F64), _load(mem, u, F32, offs).astype(F64)
    _store(mem, y, F32, np.arange(n), act(a, *flag) * b)


def _add(mem: HostMemory, at: Launch, v: Values) -> None:
    a, b, y, count = v
    i = np.arange(_items(at, count))
    _store(mem, y, F32, i, _load(mem, a, F32, i) + _load(mem, b, F32, i))


def _bcast(mem: HostMemory, at: Launch, v: Values) -> None:
    """y[i] = a[i] + b[(i / inner) % nb] (op 0) or a[i] * b[...] (op 1), for i < grid.x * block.x."""
    a, b, nb, inner, count, y, op = v
    i = np.arange(_items(at, count))
    if i.size and (nb <= 0 or inner <= 0):
        raise BackendError(f"[cuda-host] bcast over {nb} values of {inner}: the kernel would divide by zero")
    av, bv = _load(mem, a, F32, i), _load(mem, b, F32, i // max(inner, 1) % max(nb, 1))
    _store(mem, y, F32, i, av * bv if op else av + bv)


_UNARY: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    0: lambda a: 1.0 / (1.0 + np.exp(-a)), 1: lambda a: gelu(a, approximate="none"),
    2: lambda a: gelu(a, approximate="tanh"), 3: lambda a: a / (1.0 + np.exp(-a)), 4: np.tanh,
    5: lambda a: np.where(a > 0, a, 0.0), 6: np.negative, 7: np.exp, 8: np.abs, 9: np.cos, 10: np.sin, 11: erf_,
    12: np.log, 13: lambda a: 1.0 / a, 14: np.sqrt,
}


def _unary(mem: HostMemory, at: Launch, v: Values) -> None:
    """y = f(x) as the kernel's switch (15: p tanh(x / p); anything unlisted silu), rounded to f16 / bf16 as
    ``round`` asks."""
    from uaii.backends.cuda.reference_ew import round_to

    x, count, y, op, p, rnd = v
    i = np.arange(_items(at, count))
    a = _load(mem, x, F32, i).astype(F64)
    r = p * np.tanh(a / p) if op == 15 else _UNARY.get(op, _UNARY[3])(a)
    _store(mem, y, F32, i, round_to(np.asarray(r).astype(F32), rnd))


def _copy_rows(mem: HostMemory, at: Launch, v: Values) -> None:
    src, src_ld, dst, dst_ld, rows, width = v
    n = _items(at, rows * width)
    _store(mem, dst, F32, _offsets(n, width, dst_ld), _load(mem, src, F32, _offsets(n, width, src_ld)))


def _layer_norm(mem: HostMemory, at: Launch, v: Values) -> None:
    """Rows 0 .. grid.x: (x - mean) / sqrt(var + eps) * w (+ b when not NULL), the variance biased, float64."""
    x, w, b, y, n, eps = v
    _need_block(at, "layer_norm", NORM_BLOCK, 1)
    rows = at.grid[0]
    if n <= 0:
        return
    xv = mem.array(x, F32, rows * n).reshape(rows, n).astype(F64)
    mean = xv.mean(axis=1, keepdims=True)
    var = ((xv - mean) ** 2).mean(axis=1, keepdims=True)
    out = (xv - mean) / np.sqrt(var + float(eps)) * mem.array(w, F32, n).astype(F64)
    if b:
        out = out + mem.array(b, F32, n).astype(F64)
    mem.array(y, F32, rows * n)[:] = out.astype(F32).reshape(-1)


def _moe_route(mem: HostMemory, at: Launch, v: Values) -> None:
    """Tokens < grid.x * block.x: softmax (or sigmoid) scores, the top_k best first with ties to the lower index,
    weights normalized by their sum when asked (the reference MoERouter's rule)."""
    logits, tokens, n_experts, top_k, normalize, sigmoid, weights, idx = v
    t = _items(at, tokens)
    if t <= 0 or top_k > 16:
        return
    z = mem.array(logits, F32, t * n_experts).reshape(t, n_experts).astype(F64)
    sc = 1.0 / (1.0 + np.exp(-z)) if sigmoid else np.exp(z - z.max(axis=1, keepdims=True))
    if not sigmoid:
        sc = sc / sc.sum(axis=1, keepdims=True)
    pick = np.argsort(-sc, axis=1, kind="stable")[:, :top_k]
    best = np.take_along_axis(sc, pick, axis=1)
    if normalize:
        best = best / best.sum(axis=1, keepdims=True)
    mem.array(weights, F32, t * top_k)[:] = best.astype(F32).reshape(-1)
    mem.array(idx, np.int32, t * top_k)[:] = pick.astype(np.int32).reshape(-1)


def _moe_combine(mem: HostMemory, at: Launch, v: Values) -> None:
    """y[t, c] = sum_j w[t, j] o[t top_k + j, c] for the values < grid.x * block.x."""
    o, w, tokens, top_k, d, y = v
    n = _items(at, tokens * d)
    if n <= 0 or top_k <= 0:
        return
    t = -(-n // d)
    ov = mem.array(o, F32, t * top_k * d).reshape(t, top_k, d).astype(F64)
    wv = mem.array(w, F32, t * top_k).reshape(t, top_k, 1).astype(F64)
    _store(mem, y, F32, np.arange(n), (wv * ov).sum(axis=1).reshape(-1)[:n])


def _gemv_idx(dtype: DType, mem: HostMemory, at: Launch, v: Values) -> None:
    """For each pair s < grid.y whose expert e = idx[s] is in [e0, e1): y[s, row] = x[s / x_div] . W_{e - e0}[row]
    (rows < grid.x * block.y), float64 sums of the decoded weight."""
    bank, expert_bytes, row_bytes, n, k, x, ldx, x_div, idx, e0, e1, y, ldy = v
    _need_block(at, f"gemv_idx_{TYPES[dtype][1]}", WARP, GEMV_WARPS)
    rows, units = max(0, min(n, at.grid[0] * at.block[1])), max(k, 0) // 32
    if rows == 0:
        return
    experts = mem.array(idx, np.int32, at.grid[1])
    for s in range(at.grid[1]):
        e = int(experts[s])
        if not e0 <= e < e1:
            continue
        xs = _load(mem, x + 4 * (s // x_div) * ldx, F32, np.arange(32 * units)).astype(F64)
        base = bank + (e - e0) * expert_bytes
        out = np.empty(rows, F32)
        for r in _chunks(rows, units):
            out[r[0]:r[-1] + 1] = _decode_rows(mem, base, dtype, r * row_bytes, units).astype(F64) @ xs
        _store(mem, y + 4 * s * ldy, F32, np.arange(rows), out)


def _gemvq_idx(dtype: DType, mem: HostMemory, at: Launch, v: Values) -> None:
    """:func:`_gemv_idx` on int8 activations: pair s reads quant_act's row s / x_div (k apart in qa, k / 32 in da
    and sa), summed as :func:`_mmq` sums a pair."""
    bank, expert_bytes, row_bytes, n, k, qa, da, sa, x_div, idx, e0, e1, y, ldy = v
    _need_block(at, f"gemvq_idx_{TYPES[dtype][1]}", WARP, GEMV_WARPS)
    rows = max(0, min(n, at.grid[0] * at.block[1]))
    if rows == 0:
        return
    experts = mem.array(idx, np.int32, at.grid[1])
    for s in range(at.grid[1]):
        e = int(experts[s])
        if e0 <= e < e1:
            out = _int8_product(dtype, mem, bank + (e - e0) * expert_bytes, row_bytes, rows, k, qa, da, sa,
                                np.array([s // x_div]))
            _store(mem, y + 4 * s * ldy, F32, np.arange(rows), out.reshape(-1))


def _rope(mem: HostMemory, at: Launch, v: Values) -> None:
    """Pairs t < grid.x * block.x rotated in place by the angle (double) pos[row] * (double) inv_freq[i], its sine
    and cosine rounded to float32 and scaled by ``attn`` (yarn's magnitude; the CPU's rope_angles)."""
    x, pos, inv_freq, rows, heads, d, n_rot, neox, attn = v
    half = int(n_rot / 2)
    t = np.arange(_items(at, rows * heads * half) if half > 0 else 0, dtype=np.int64)
    if not t.size:
        return
    i, head = t % half, t // half
    angle = _load(mem, pos, np.int32, head // heads).astype(F64) * _load(mem, inv_freq, F32, i).astype(F64)
    s = (np.sin(angle).astype(F32) * F32(attn)).astype(F64)
    c = (np.cos(angle).astype(F32) * F32(attn)).astype(F64)
    ia, ib = (head * d + i, head * d + i + half) if neox else (head * d + 2 * i, head * d + 2 * i + 1)
    x0, x1 = _load(mem, x, F32, ia).astype(F64), _load(mem, x, F32, ib).astype(F64)
    _store(mem, x, F32, ia, x0 * c - x1 * s)
    _store(mem, x, F32, ib, x0 * s + x1 * c)


# --- attention ---------------------------------------------------------------------------------------------------
def _cache_rows(mem: HostMemory, table: int, flags: int, row: int, slots: np.ndarray, h: int, hq: int, hkv: int,
                width: int) -> np.ndarray:
    """Values 0 .. width at cache slots ``slots`` of ``row``'s cache (f32 or f16) [slots, hkv, width] for query head
    ``h``: kv head h / (hq / hkv) as the kernels divide (a zero divisor refused), float64."""
    if hkv <= 0 or hq // hkv <= 0:
        raise BackendError(f"[cuda-host] attention with {hq} query heads over {hkv} kv heads divides by zero")
    dt = np.float16 if _at(mem, flags, np.int32, row) else F32
    offs = ((slots * hkv + h // (hq // hkv)) * width)[:, None] + np.arange(width)
    return _load(mem, _at(mem, table, np.uint64, row), dt, offs.reshape(-1)).reshape(slots.size, width).astype(F64)


def _attn_scores(mem: HostMemory, at: Launch, v: Values) -> None:
    """scores[row, h, t] for rows < grid.z, the heads of the GQA group parts < grid.y (ATTN_HEADS heads of a kv
    head's hq / hkv per part), keys t < min(used[row], grid.x * block.x): scale q . k (soft-capped), -inf where the
    key is hidden (an empty slot, in the future, out of the window and no sink)."""
    q, k_cache, kv_f16, used, q_pos, k_pos, hq, hkv, d, scale, softcap, window, n_sink, scores, s_max = v
    _need_block(at, "attn_scores", ATTN_KEYS)
    heads = _group_heads(at, hq, hkv)
    for row in range(at.grid[2]):
        s = min(_at(mem, used, np.int64, row), at.grid[0] * at.block[0])
        if s <= 0:
            continue
        keys = _visible_keys(mem, k_pos, q_pos, row, 0, s, window, n_sink)
        for h in heads:
            logits = np.full(s, -np.inf)
            if keys.size:
                logits[keys] = _logits(mem, q, k_cache, kv_f16, row, keys, h, hq, hkv, d, scale, softcap)
            _store(mem, scores, F32, (row * hq + h) * s_max + np.arange(s), logits)


def _visible_keys(mem: HostMemory, k_pos: int, q_pos: int, row: int, t0: int, t1: int, window: int,
                  n_sink: int) -> np.ndarray:
    """The keys t0 <= t < t1 of ``row`` its query sees (attention.cu's visible: not an empty slot, not in the
    future, in the window or a sink), ascending."""
    if t1 <= t0:
        return np.zeros(0, np.int64)
    kp = _load(mem, _at(mem, k_pos, np.uint64, row), np.int32, np.arange(t0, t1)).astype(np.int64)
    qp = _at(mem, q_pos, np.int32, row)
    return t0 + np.flatnonzero((kp >= 0) & (kp <= qp) & ~((window > 0) & (qp - kp >= window) & (kp >= n_sink)))


def _logits(mem: HostMemory, q: int, k_cache: int, kv_f16: int, row: int, keys: np.ndarray, h: int, hq: int,
            hkv: int, d: int, scale: float, softcap: float) -> np.ndarray:
    """float64 scale q . k of query head h of ``row`` with its ``keys``, soft-capped where softcap > 0."""
    qv = _load(mem, q, F32, (row * hq + h) * d + np.arange(d)).astype(F64)
    lk = (_cache_rows(mem, k_cache, kv_f16, row, keys, h, hq, hkv, d) @ qv) * scale
    return softcap * np.tanh(lk / softcap) if softcap > 0 else lk


def _attn_mask(mem: HostMemory, at: Launch, v: Values) -> None:
    """scores[row, h, t] not yet hidden (-inf), for rows < grid.z, heads < grid.y, keys t < min(used[row], grid.x *
    block.x): + the f32 mask (additive; one float32 sum, exact as the device's) or -inf where the i32 mask is 0, the
    mask of (row, h, t) at row_off[row] + h h_stride + t key_stride (only those of live keys read, as the kernel)."""
    scores, used, mask, additive, row_off, h_stride, key_stride, hq, s_max = v
    for row in range(at.grid[2]):
        keys = np.arange(_items(at, _at(mem, used, np.int64, row)), dtype=np.int64)
        if not keys.size:
            continue
        base = _at(mem, row_off, np.int64, row)
        for h in range(at.grid[1]):
            offs = (row * hq + h) * s_max + keys
            p = _load(mem, scores, F32, offs)
            live = np.flatnonzero(p != -np.inf)
            at_mask = base + h * h_stride + keys[live] * key_stride
            if additive:
                p[live] = (p[live].astype(F64) + _load(mem, mask, F32, at_mask).astype(F64)).astype(F32)
            else:
                p[live] = np.where(_load(mem, mask, np.int32, at_mask) == 0, -np.inf, p[live])
            _store(mem, scores, F32, offs, p)


def _attn_softmax(mem: HostMemory, at: Launch, v: Values) -> None:
    """In place over heads < grid.x of rows < grid.y: exp(l - max) / (sum + exp(sink - max)); -inf gives 0, and a
    head that sees nothing (sum 0, no sink) zeros."""
    scores, used, sinks, hq, s_max = v
    _need_block(at, "attn_softmax", ATTN_SOFTMAX, 1)
    for row in range(at.grid[1]):
        s = _at(mem, used, np.int64, row)
        for h in range(at.grid[0]):
            sink = float(_at(mem, sinks, F32, h)) if sinks else None
            if s <= 0:
                continue
            offs = (row * hq + h) * s_max + np.arange(s)
            p = _load(mem, scores, F32, offs).astype(F64)
            mx = float(np.fmax.reduce(p, initial=-math.inf if sink is None else sink))
            e = np.where(p == -np.inf, 0.0, np.exp(p - mx))
            total = float(e.sum()) + (math.exp(sink - mx) if sink is not None else 0.0)
            _store(mem, scores, F32, offs, e * (1.0 / total if total > 0 else 0.0))


def _group_heads(at: Launch, hq: int, hkv: int) -> list[int]:
    """The query heads the block rows < grid.y of attn_scores / attn_wsum cover: ATTN_HEADS heads of one kv head's
    hq / hkv per row."""
    if hkv <= 0 or hq // hkv <= 0:
        raise BackendError(f"[cuda-host] attention with {hq} query heads over {hkv} kv heads divides by zero")
    group = hq // hkv
    parts = -(-group // ATTN_HEADS)
    return [h for y in range(at.grid[1])
            for h in range(y // parts * group + y % parts * ATTN_HEADS,
                           min(y // parts * group + (y % parts + 1) * ATTN_HEADS, (y // parts + 1) * group))]


def _attn_wsum(mem: HostMemory, at: Launch, v: Values) -> None:
    """For stretch j < grid.x of the keys (ceil(s_max / splits) each) and the heads the block rows cover: the sum
    over its keys t < used[row] with p != 0 of p[t] v[t, kv head, e], for e < dv (the block's threads loop over
    them), written to out[row, h, j, e] (out [rows, hq, splits, dv]: with one stretch, the output itself)."""
    scores, v_cache, kv_f16, used, hq, hkv, dv, s_max, splits, out = v
    _need_block(at, "attn_wsum", ATTN_VALUES)
    if splits <= 0:
        raise BackendError(f"[cuda-host] attn_wsum over {splits} stretches: the kernel would divide by zero")
    heads = _group_heads(at, hq, hkv)
    chunk = -(-s_max // splits)
    for row in range(at.grid[2]):
        s = max(_at(mem, used, np.int64, row), 0)
        for h in heads:
            for j in range(at.grid[0]):
                t0, t1 = j * chunk, min(j * chunk + chunk, s)
                p = _load(mem, scores, F32, (row * hq + h) * s_max + np.arange(t0, max(t1, t0))).astype(F64)
                keys = np.flatnonzero(p != 0)
                acc = np.zeros(max(dv, 0))
                if keys.size:
                    acc = p[keys] @ _cache_rows(mem, v_cache, kv_f16, row, keys + t0, h, hq, hkv, dv)
                _store(mem, out, F32, ((row * hq + h) * splits + j) * dv + np.arange(max(dv, 0)), acc)


def _attn_wsum_sum(mem: HostMemory, at: Launch, v: Values) -> None:
    """out[row, h, e] = the float32 sum of the ``splits`` partials [rows, hq, splits, dv] in order, e < grid.x *
    block.x."""
    partial, hq, dv, splits, out = v
    width = _items(at, dv)
    for row in range(at.grid[2]):
        for h in range(at.grid[1]):
            acc = np.zeros(width, F32)
            for j in range(max(splits, 0)):
                acc += _load(mem, partial, F32, ((row * hq + h) * splits + j) * dv + np.arange(width))
            _store(mem, out, F32, (row * hq + h) * dv + np.arange(width), acc)


def _attn_flash(mem: HostMemory, at: Launch, v: Values) -> None:
    """For stretch j < grid.x of the keys (ceil(s_max / splits) each, as attn_wsum's), the heads the block rows
    cover, rows < grid.z: over the visible keys t of the stretch, with l_t the capped logit (attn_scores'), m =
    max l_t (-inf: none), l = sum exp(l_t - m), acc[e] = sum exp(l_t - m) v[t, e] — in float64, written to
    partial[row, h, j] = (acc[0 .. dv), m, l)."""
    (q, k_cache, v_cache, kv_f16, used, q_pos, k_pos, hq, hkv, d, dv, scale, softcap, window, n_sink, s_max, splits,
     partial) = v
    _need_block(at, "attn_flash", ATTN_KEYS)
    if splits <= 0 or dv > ATTN_KEYS * FLASH_VALUES:
        raise BackendError(f"[cuda-host] attn_flash over {splits} stretches, {dv} values a head: the kernel divides "
                           f"by zero or leaves values past {ATTN_KEYS * FLASH_VALUES} unwritten")
    heads = _group_heads(at, hq, hkv)
    chunk = -(-s_max // splits)
    for row in range(at.grid[2]):
        s = max(_at(mem, used, np.int64, row), 0)
        for j in range(at.grid[0]):
            keys = _visible_keys(mem, k_pos, q_pos, row, j * chunk, min(j * chunk + chunk, s), window, n_sink)
            for h in heads:
                acc, m, total = np.zeros(max(dv, 0)), -math.inf, 0.0
                if keys.size:
                    lk = _logits(mem, q, k_cache, kv_f16, row, keys, h, hq, hkv, d, scale, softcap)
                    m = float(lk.max())
                    e = np.exp(lk - m)
                    total, acc = float(e.sum()), e @ _cache_rows(mem, v_cache, kv_f16, row, keys, h, hq, hkv, dv)
                _store(mem, partial, F32, ((row * hq + h) * splits + j) * (dv + 2) + np.arange(dv + 2),
                       np.concatenate([acc, [m, total]]))


def _attn_flash_sum(mem: HostMemory, at: Launch, v: Values) -> None:
    """out[row, h, e] for e < grid.x * block.x: the stretches' partials combined under their common maximum M (with
    the head's sink logit): sum_j acc_j exp(m_j - M) / (sum_j l_j exp(m_j - M) + exp(sink - M)); zeros when that
    is 0."""
    partial, sinks, hq, dv, splits, out = v
    width = _items(at, dv)
    for row in range(at.grid[2]):
        for h in range(at.grid[1]):
            parts = _load(mem, partial, F32, ((row * hq + h) * splits * (dv + 2) + np.arange(splits * (dv + 2))))
            parts = parts.reshape(splits, dv + 2).astype(F64)
            sink = float(_at(mem, sinks, F32, h)) if sinks else -math.inf
            top = max(sink, float(parts[:, dv].max(initial=-math.inf)))
            value, total = np.zeros(width), 0.0
            if top != -math.inf:
                w = np.where(parts[:, dv] == -np.inf, 0.0, np.exp(parts[:, dv] - top))
                value, total = w @ parts[:, :width], float(w @ parts[:, dv + 1]) + math.exp(sink - top)
            _store(mem, out, F32, (row * hq + h) * dv + np.arange(width),
                   value / total if total > 0 else np.zeros(width))


def _kv_store(mem: HostMemory, at: Launch, v: Values) -> None:
    """Row r of x (ldx apart) into its table entry's cache at slot used[r] - seq_rows + r % seq_rows (f16 rounded to
    nearest even where its flag says), ``width`` values per row; the grid's threads cover the first items only."""
    x, ldx, rows, width, cache, used, kv_f16, seq_rows = v
    if seq_rows <= 0:
        raise BackendError(f"[cuda-host] kv_store with seq_rows {seq_rows}: the kernel would divide by zero")
    n = _items(at, rows * width)
    values = _load(mem, x, F32, _offsets(n, width, ldx))
    for r in range(-(-n // width) if width > 0 else 0):
        cols = np.arange(min(width, n - r * width))
        slot = _at(mem, used, np.int64, r) - seq_rows + r % seq_rows
        dt = np.float16 if _at(mem, kv_f16, np.int32, r) else F32
        _store(mem, _at(mem, cache, np.uint64, r), dt, slot * width + cols, values[r * width + cols])


# --- the table ---------------------------------------------------------------------------------------------------
@cache
def _table() -> dict[str, Reference]:
    table: dict[str, Reference] = {
        "quant_act": _quant_act, "rms_norm": _rms_norm, "add_rms_norm": _add_rms_norm, "add": _add,
        "swiglu": partial(_glu, lambda a: a / (1.0 + np.exp(-a))),
        "geglu": partial(_glu, lambda a, tanh_approx: gelu(a, approximate="tanh" if tanh_approx else "none")),
        "bcast": _bcast, "unary": _unary, "copy_rows": _copy_rows, "layer_norm": _layer_norm,
        "moe_route": _moe_route, "moe_group": _moe_group, "moe_combine": _moe_combine, "rope": _rope,
        "attn_scores": _attn_scores, "attn_mask": _attn_mask, "attn_softmax": _attn_softmax, "attn_wsum": _attn_wsum,
        "attn_wsum_sum": _attn_wsum_sum, "attn_flash": _attn_flash, "attn_flash_sum": _attn_flash_sum,
        "kv_store": _kv_store,
    }
    for dtype, (_, suffix, _, _) in TYPES.items():
        table[f"dequant_{suffix}"] = partial(_dequant, dtype)
        table[f"rows_{suffix}"] = partial(_rows, dtype)
        for m in GEMV_ROWS:
            table[f"gemv_{suffix}_m{m}"] = partial(_gemv, dtype, m)
        table[f"gemv_idx_{suffix}"] = partial(_gemv_idx, dtype)
    for dtype in MMQ_TYPES:
        table[f"mmq_{TYPES[dtype][1]}"] = partial(_mmq, dtype)
        for m in GEMV_ROWS:
            table[f"gemvq_{TYPES[dtype][1]}_m{m}"] = partial(_gemvq, dtype, m)
        table[f"gemvq_idx_{TYPES[dtype][1]}"] = partial(_gemvq_idx, dtype)
        table[f"mmq_idx_{TYPES[dtype][1]}"] = partial(_mmq_idx, dtype)
    from uaii.backends.cuda import reference_ew, reference_packed  # they use this module's memory helpers

    return {**table, **reference_ew.TABLE, **reference_packed.TABLE}


def _quietly(fn: Reference, mem: HostMemory, at: Launch, values: Values) -> None:
    with np.errstate(all="ignore"):  # a device's IEEE arithmetic (overflow to inf, inf - inf, 0 * inf) warns nobody
        fn(mem, at, values)


def reference(kernel: str) -> Reference:
    """The CPU reference of ``kernel``: called as ``fn(mem, launch, values)``, values in the kernel's parameter
    order (pointers as addresses, 0 for NULL)."""
    fn = _table().get(kernel)
    if fn is None:
        raise BackendError(f"[cuda-host] no CPU reference for kernel {kernel}")
    return partial(_quietly, fn)


__all__ = ["Reference", "reference"]

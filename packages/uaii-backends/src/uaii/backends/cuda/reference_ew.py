"""CPU references of the kernels of kernels/ew.cu, in the form and under the rules of reference.py (what the
launch's threads cover, only the addresses the kernel touches, float64 arithmetic rounded once).

The N-d kernels read their shapes and strides from a table of int64 in device memory; :func:`_offsets_nd` is the
kernel's ew_offsets over every covered item at once. Integer arithmetic wraps at 32 bits (the device's words) and
a fault is written where the kernel writes one, so the host model reports what a device would.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from uaii.backends.cuda.reference import F32, F64, Reference, Values, _fault, _items, _load, _store
from uaii.ir.reference import bf16_to_f32, f32_to_bf16

if TYPE_CHECKING:
    from uaii.backends.cuda.geometry import Launch
    from uaii.backends.cuda.host import HostMemory

I32, U32, I64 = np.int32, np.uint32, np.int64


def _table(mem: HostMemory, t: int, n: int) -> np.ndarray:
    return _load(mem, t, I64, np.arange(n))


def _offsets_nd(i: np.ndarray, t: np.ndarray, nd: int, ops: int) -> list[np.ndarray]:
    """ew_offsets: per operand the element offset of each output item ``i`` (t: shape[nd], strides[nd] per operand)."""
    off = [np.zeros(i.shape, I64) for _ in range(ops)]
    rest = i.astype(I64)
    for d in range(nd - 1, -1, -1):
        n = int(t[d])
        c = rest % n if n else np.zeros_like(rest)
        rest = rest // n if n else np.zeros_like(rest)
        for o in range(ops):
            off[o] += c * int(t[nd * (o + 1) + d])
    return off


def round_to(x: np.ndarray, round_: int) -> np.ndarray:
    """decode.cuh's uk_round_to: float32 values rounded to f16 (1) or bf16 (2) and back."""
    x = np.asarray(x, F32)
    if round_ == 1:
        return x.astype(np.float16).astype(F32)
    if round_ == 2:
        return bf16_to_f32(f32_to_bf16(x))
    return x


_BINARY_F = {0: np.add, 1: np.subtract, 2: np.multiply, 3: np.divide, 4: np.power, 5: np.maximum, 6: np.minimum,
             7: np.fmod}


def _binary_f(mem: HostMemory, at: Launch, v: Values) -> None:
    a, b, y, t, nd, count, op, rnd = v
    i = np.arange(_items(at, count))
    oa, ob = _offsets_nd(i, _table(mem, t, 3 * nd), nd, 2)
    u, w = _load(mem, a, F32, oa), _load(mem, b, F32, ob)
    r = _BINARY_F[op](u.astype(F64), w.astype(F64)) if op == 4 else _BINARY_F[op](u, w)
    _store(mem, y, F32, i, round_to(r.astype(F32), rnd))


def _wrap(x: np.ndarray) -> np.ndarray:
    return (x.astype(I64) & 0xFFFFFFFF).astype(U32).view(I32)


def _fit(mem: HostMemory, x: np.ndarray, wide: int, fault: int, code: int) -> np.ndarray:
    """ew.cu's ew_fit: x wrapped to the device's word; a fault where ``wide`` and x does not fit in 32 bits."""
    x = np.asarray(x, I64)
    if wide:
        _fault(mem, fault, code, (x < -2 ** 31) | (x > 2 ** 31 - 1))
    return _wrap(x)


def _binary_i(mem: HostMemory, at: Launch, v: Values) -> None:
    a, b, y, t, nd, count, op, fault, code, wide = v
    i = np.arange(_items(at, count))
    oa, ob = _offsets_nd(i, _table(mem, t, 3 * nd), nd, 2)
    u, w = _load(mem, a, I32, oa).astype(I64), _load(mem, b, I32, ob).astype(I64)
    zero = (w == 0) & np.isin(op, (3, 6, 7))
    _fault(mem, fault, code, zero)
    ws = np.where(zero, 1, w)
    q = np.abs(u) // np.abs(ws)
    trunc_div = np.where((u < 0) != (ws < 0), -q, q)
    c_mod = u - trunc_div * ws
    r = {0: u + w, 1: u - w, 2: u * w, 3: trunc_div, 4: np.maximum(u, w), 5: np.minimum(u, w),
         6: np.where((c_mod != 0) & ((c_mod < 0) != (ws < 0)), c_mod + ws, c_mod), 7: c_mod,
         8: (u != 0) & (w != 0), 9: (u != 0) | (w != 0), 10: (u != 0) ^ (w != 0)}[op]
    _store(mem, y, I32, i, np.where(zero, 0, _fit(mem, np.where(zero, 0, np.asarray(r, I64)), wide, fault, code)))


_COMPARE = {0: np.equal, 1: np.less, 2: np.greater, 3: np.less_equal, 4: np.greater_equal}


def _compare(dtype: type, mem: HostMemory, at: Launch, v: Values) -> None:
    a, b, y, t, nd, count, op = v
    i = np.arange(_items(at, count))
    oa, ob = _offsets_nd(i, _table(mem, t, 3 * nd), nd, 2)
    _store(mem, y, I32, i, _COMPARE[op](_load(mem, a, dtype, oa), _load(mem, b, dtype, ob)).astype(I32))


def _unary_i(mem: HostMemory, at: Launch, v: Values) -> None:
    x, count, y, op, fault, code, wide = v
    i = np.arange(_items(at, count))
    a = _load(mem, x, I32, i).astype(I64)
    r = {0: -a, 1: np.abs(a), 2: np.maximum(a, 0), 3: (a == 0).astype(I64)}[op]
    _store(mem, y, I32, i, _fit(mem, r, wide, fault, code))


def _where_w(mem: HostMemory, at: Launch, v: Values) -> None:
    c, x, y, out, t, nd, count = v
    i = np.arange(_items(at, count))
    oc, ox, oy = _offsets_nd(i, _table(mem, t, 4 * nd), nd, 3)
    _store(mem, out, U32, i, np.where(_load(mem, c, I32, oc) != 0, _load(mem, x, U32, ox), _load(mem, y, U32, oy)))


def _cast_f(mem: HostMemory, at: Launch, v: Values) -> None:
    x, count, y, rnd = v
    i = np.arange(_items(at, count))
    _store(mem, y, F32, i, round_to(_load(mem, x, F32, i), rnd))


def _cast_f2i(mem: HostMemory, at: Launch, v: Values) -> None:
    x, count, y, lo, hi, to_bool, fault, code = v
    i = np.arange(_items(at, count))
    a = _load(mem, x, F32, i).astype(F64)
    if to_bool:
        _store(mem, y, I32, i, (a != 0).astype(I32))
        return
    r = np.clip(np.rint(np.where(np.isnan(a), 0.0, a)), float(lo), float(hi))
    beyond = (r < -2.0 ** 31) | (r > 2.0 ** 31 - 1)
    _fault(mem, fault, code, beyond)
    _store(mem, y, I32, i, np.clip(r, -2.0 ** 31, 2.0 ** 31 - 1).astype(I32))


def _cast_i2f(mem: HostMemory, at: Launch, v: Values) -> None:
    x, count, y, rnd = v
    i = np.arange(_items(at, count))
    _store(mem, y, F32, i, round_to(_load(mem, x, I32, i).astype(F32), rnd))


def _cast_i2i(mem: HostMemory, at: Launch, v: Values) -> None:
    x, count, y, lo, hi, to_bool = v
    i = np.arange(_items(at, count))
    a = _load(mem, x, I32, i).astype(I64)
    _store(mem, y, I32, i, (a != 0).astype(I32) if to_bool else np.clip(a, lo, hi).astype(I32))


def _copy_nd(mem: HostMemory, at: Launch, v: Values) -> None:
    x, src, y, dst, t, nd, count = v
    i = np.arange(_items(at, count))
    ox, oy = _offsets_nd(i, _table(mem, t, 3 * nd), nd, 2)
    _store(mem, y, U32, dst + oy, _load(mem, x, U32, src + ox))


def _gather_w(mem: HostMemory, at: Launch, v: Values) -> None:
    x, idx, y, n_idx, inner, axis_len, count, fault, code = v
    i = np.arange(_items(at, count), dtype=I64)
    if not i.size:
        return
    c, j, o = i % inner, (i // inner) % n_idx, i // (inner * n_idx)
    k = _load(mem, idx, I32, j).astype(I64)
    k = np.where(k < 0, k + axis_len, k)
    bad = (k < 0) | (k >= axis_len)
    _fault(mem, fault, code, bad)
    ok = ~bad
    vals = np.zeros(i.size, U32)
    vals[ok] = _load(mem, x, U32, ((o * axis_len + k) * inner + c)[ok])
    _store(mem, y, U32, i, vals)


def _trilu_w(mem: HostMemory, at: Launch, v: Values) -> None:
    x, y, rows, cols, count, k, upper = v
    i = np.arange(_items(at, count), dtype=I64)
    d = i % cols - (i // cols) % rows
    keep = d >= k if upper else d <= k
    _store(mem, y, U32, i, np.where(keep, _load(mem, x, U32, i), 0).astype(U32))


def _fill_w(mem: HostMemory, at: Launch, v: Values) -> None:
    val, y, count = v
    n = _items(at, count)
    if n:
        _store(mem, y, U32, np.arange(n), np.full(n, _load(mem, val, U32, np.zeros(1, I64))[0], U32))


def _range_f(mem: HostMemory, at: Launch, v: Values) -> None:
    start, delta, y, count, rnd = v
    i = np.arange(_items(at, count))
    if i.size:
        s, d = (float(_load(mem, p, F32, np.zeros(1, I64))[0]) for p in (start, delta))
        _store(mem, y, F32, i, round_to((s + i * d).astype(F32), rnd))


def _range_i(mem: HostMemory, at: Launch, v: Values) -> None:
    start, delta, y, count, fault, code, wide = v
    i = np.arange(_items(at, count), dtype=I64)
    if i.size:
        s, d = (int(_load(mem, p, I32, np.zeros(1, I64))[0]) for p in (start, delta))
        _store(mem, y, I32, i, _fit(mem, s + i * d, wide, fault, code))


def _reduced(mem: HostMemory, x: int, dtype: type, t: int, nd: int, nr: int, count: int,
             rcount: int) -> tuple[np.ndarray, np.ndarray]:
    """(covered output items, their reduced values [items, rcount])."""
    i = np.arange(count)
    tab = _table(mem, t, 2 * nd + 2 * nr)
    (base,) = _offsets_nd(i, tab, nd, 1)
    (roff,) = _offsets_nd(np.arange(rcount), tab[2 * nd:], nr, 1)
    offs = base[:, None] + roff[None, :]
    return i, _load(mem, x, dtype, offs.reshape(-1)).reshape(i.size, rcount)


def _reduce_f(mem: HostMemory, at: Launch, v: Values) -> None:
    x, y, t, nd, nr, count, rcount, op, rnd = v
    i, vals = _reduced(mem, x, F32, t, nd, nr, _items(at, count), rcount)
    a = vals.astype(F64)
    if op == 0:
        r = a.sum(axis=1)
    elif op == 1:
        r = a.sum(axis=1) / rcount if rcount else np.full(i.size, np.nan)
    else:
        fn = np.max if op == 2 else np.min
        r = fn(a, axis=1, initial=-np.inf if op == 2 else np.inf)
    _store(mem, y, F32, i, round_to(r.astype(F32), rnd))


def _reduce_i(mem: HostMemory, at: Launch, v: Values) -> None:
    x, y, t, nd, nr, count, rcount, op, fault, code, wide = v
    i, vals = _reduced(mem, x, I32, t, nd, nr, _items(at, count), rcount)
    a = vals.astype(I64)
    if op == 0:
        r = _fit(mem, a.sum(axis=1), wide, fault, code)
    else:
        r = (a.max(axis=1, initial=-2 ** 31) if op == 2 else a.min(axis=1, initial=2 ** 31 - 1)).astype(I32)
    _store(mem, y, I32, i, r)


def _columns(count: int, n: int, inner: int) -> np.ndarray:
    """Element offsets [columns, n] of the covered (outer, inner) columns of x viewed as [outer, n, inner]."""
    i = np.arange(count, dtype=I64)
    base = i // inner * n * inner + i % inner
    return base[:, None] + np.arange(n, dtype=I64)[None, :] * inner


def _softmax_ax(mem: HostMemory, at: Launch, v: Values) -> None:
    x, y, n, inner, count, rnd = v
    offs = _columns(_items(at, count), n, inner)
    a = _load(mem, x, F32, offs.reshape(-1)).reshape(offs.shape).astype(F64)
    e = np.exp(a - a.max(axis=1, keepdims=True, initial=-np.inf))
    _store(mem, y, F32, offs.reshape(-1), round_to((e / e.sum(axis=1, keepdims=True)).astype(F32), rnd).reshape(-1))


def _cumsum(dtype: type, mem: HostMemory, at: Launch, v: Values) -> None:
    x, y, n, inner, count, exclusive, reverse, *rest = v
    offs = _columns(_items(at, count), n, inner)
    if reverse:
        offs = offs[:, ::-1]
    a = _load(mem, x, dtype, offs.reshape(-1)).reshape(offs.shape)
    c = np.cumsum(a.astype(F64 if dtype is F32 else I64), axis=1)
    if exclusive:
        c = np.concatenate([np.zeros_like(c[:, :1]), c[:, :-1]], axis=1)
    out = round_to(c.astype(F32), rest[0]) if dtype is F32 else _fit(mem, c, rest[2], rest[0], rest[1])
    _store(mem, y, dtype, offs.reshape(-1), out.reshape(-1))


def _ordered(a: np.ndarray, largest: int) -> np.ndarray:
    """Per row, the column order of ew_before: values descending (largest) or ascending, NaN greatest, ties to the
    lower index."""
    nan = np.isnan(a)
    key = np.where(nan, 0.0, a)
    cols = np.arange(a.shape[1])[None, :].repeat(a.shape[0], axis=0)
    if largest:
        return np.lexsort((cols, -key, ~nan), axis=1)
    return np.lexsort((cols, key, nan), axis=1)


def _argmax_ax(mem: HostMemory, at: Launch, v: Values) -> None:
    x, y, n, inner, count, is_int = v
    offs = _columns(_items(at, count), n, inner)
    a = _load(mem, x, I32 if is_int else F32, offs.reshape(-1)).reshape(offs.shape).astype(F64)
    _store(mem, y, I32, np.arange(offs.shape[0]), _ordered(a, 1)[:, 0].astype(I32) if n else np.zeros(0, I32))


def _topk_ax(mem: HostMemory, at: Launch, v: Values) -> None:
    x, vals, idx, n, inner, count, k, largest, is_int = v
    offs = _columns(_items(at, count), n, inner)
    a = _load(mem, x, I32 if is_int else F32, offs.reshape(-1)).reshape(offs.shape).astype(F64)
    order = _ordered(a, largest)[:, :k]
    words = _load(mem, x, U32, offs.reshape(-1)).reshape(offs.shape)
    out = _columns(offs.shape[0], k, inner)
    _store(mem, vals, U32, out.reshape(-1), np.take_along_axis(words, order, axis=1).reshape(-1))
    _store(mem, idx, I32, out.reshape(-1), order.astype(I32).reshape(-1))


def _matmul_f(mem: HostMemory, at: Launch, v: Values) -> None:
    a, b, c, y, t, nb, m, n, k, count, alpha, beta, relu, rnd = v
    i = np.arange(_items(at, count), dtype=I64)
    if not i.size:
        return
    tab = _table(mem, t, 4 * nb + 6)
    col, row = i % n, (i // n) % m
    oa, ob, oc = _offsets_nd(i // (m * n), tab, nb, 3)
    s = tab[4 * nb:]
    ks = np.arange(k, dtype=I64)[None, :]
    pa = _load(mem, a, F32, (oa[:, None] + row[:, None] * s[0] + ks * s[1]).reshape(-1)).reshape(i.size, k)
    pb = _load(mem, b, F32, (ob[:, None] + col[:, None] * s[3] + ks * s[2]).reshape(-1)).reshape(i.size, k)
    acc = (pa.astype(F64) * pb.astype(F64)).sum(axis=1) * float(np.float32(alpha))
    if c:
        acc = acc + float(np.float32(beta)) * _load(mem, c, F32, oc + row * s[4] + col * s[5]).astype(F64)
    if relu:
        acc = np.where(acc > 0, acc, np.where(np.isnan(acc), acc, 0.0))
    _store(mem, y, F32, i, round_to(acc.astype(F32), rnd))


TABLE: dict[str, Reference] = {
    "binary_f": _binary_f, "binary_i": _binary_i, "compare_f": partial(_compare, F32),
    "compare_i": partial(_compare, I32), "unary_i": _unary_i, "where_w": _where_w, "cast_f": _cast_f,
    "cast_f2i": _cast_f2i, "cast_i2f": _cast_i2f, "cast_i2i": _cast_i2i, "copy_nd": _copy_nd, "gather_w": _gather_w,
    "trilu_w": _trilu_w, "fill_w": _fill_w, "range_f": _range_f, "range_i": _range_i, "reduce_f": _reduce_f,
    "reduce_i": _reduce_i, "softmax_ax": _softmax_ax, "cumsum_f": partial(_cumsum, F32),
    "cumsum_i": partial(_cumsum, I32), "argmax_ax": _argmax_ax, "topk_ax": _topk_ax, "matmul_f": _matmul_f,
}

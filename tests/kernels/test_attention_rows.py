"""uk_attention_rows (a batched decode step's attention: one new token per sequence, each over its own cache) against
what the per-row path does — the new key/value stored by numpy (f16 caches: numpy's float16 cast) and uk_attention
with t = 1 over that row's cache alone — bit for bit, on every ISA, with threads woken or not, windows, sinks, soft-
capping, sink logits, ring-buffer positions and caches of both types in one call."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import uaii.kernels as K
from uaii.kernels.native import ffi, lib

HQ, HKV, D, DV = 6, 2, 64, 48


def _ptr(a: np.ndarray, ctype: str = "void *") -> Any:
    return ffi.cast(ctype, ffi.from_buffer(a))


class Row:
    """One sequence: a cache of ``capacity`` slots, ``used`` of them filled, slot positions (-1: empty), and the
    position of its new token."""

    def __init__(self, rng: np.random.Generator, used: int, dtype: type, capacity: int = 300,
                 ring: bool = False) -> None:
        self.k = np.zeros((capacity, HKV, D), dtype)
        self.v = np.zeros((capacity, HKV, DV), dtype)
        self.k[:used] = rng.standard_normal((used, HKV, D))
        self.v[:used] = rng.standard_normal((used, HKV, DV))
        self.pos = np.full(capacity, -1, np.int32)
        self.pos[:used + 1] = np.arange(used + 1)
        if ring and used > 4:  # positions out of slot order and an empty slot, as a compacted ring leaves them
            self.pos[:used] = rng.permutation(used) + 10
            self.pos[2] = -1
            self.pos[used] = used + 10
        self.q_pos = np.array([self.pos[used]], np.int32)
        self.used = used
        self.kv_type = 1 if dtype == np.float16 else 0

    def copy(self) -> Row:
        other = object.__new__(Row)
        other.__dict__.update({n: (a.copy() if isinstance(a, np.ndarray) else a) for n, a in self.__dict__.items()})
        return other


def _alone(row: Row, q: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, **kw: Any) -> np.ndarray:
    """The per-row path: numpy stores the new key/value, uk_attention attends with t = 1."""
    with np.errstate(over="ignore"):  # 70000 overflows f16 on purpose
        row.k[row.used] = k_new
    row.v[row.used] = v_new
    s = row.used + 1
    return K.attention(q[None], row.k[:s], row.v[:s], q_pos=row.q_pos, k_pos=row.pos[:s], **kw)[0]


def _rows_call(rows: list[Row], q: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, *, scale: float,
               window: int = 0, n_sink: int = 0, softcap: float = 0.0, sinks: np.ndarray | None = None) -> np.ndarray:
    n = len(rows)
    out = np.full((n, HQ, DV), np.nan, np.float32)
    kc = ffi.new("void *[]", [_ptr(r.k) for r in rows] or 1)
    vc = ffi.new("void *[]", [_ptr(r.v) for r in rows] or 1)
    qp = ffi.new("int32_t *[]", [_ptr(r.q_pos, "int32_t *") for r in rows] or 1)
    kp = ffi.new("int32_t *[]", [_ptr(r.pos, "int32_t *") for r in rows] or 1)
    kvt = np.array([r.kv_type for r in rows] or [0], np.int32)
    used = np.array([r.used for r in rows] or [0], np.int64)
    rc = lib.uk_attention_rows(_ptr(q, "float *"), _ptr(k_new, "float *"), _ptr(v_new, "float *"),
                               _ptr(out, "float *"), n, kc, vc, _ptr(kvt, "int32_t *"), _ptr(used, "int64_t *"),
                               qp, kp, HQ, HKV, D, DV, scale, window, n_sink, softcap,
                               _ptr(sinks, "float *") if sinks is not None else ffi.NULL)
    assert rc == 0
    return out


def _bits(a: np.ndarray) -> np.ndarray:
    """The bit patterns (a row whose new key overflowed f16 attends to NaN: NaN == NaN here)."""
    return a.view(np.uint16 if a.dtype == np.float16 else np.uint32)


CASES = {
    "plain": {},
    "window_sinks": {"window": 16, "n_sink": 3},
    "softcap_sinklogits": {"softcap": 4.0, "sinks": True},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("used", [[20, 21, 19, 22], [250, 3, 0, 180, 64]])  # the second wakes threads
def test_rows_equal_each_row_alone(case: str, used: list[int], isa: str, rng: np.random.Generator) -> None:
    kw: dict[str, Any] = dict(CASES[case])
    if kw.pop("sinks", False):
        kw["sinks"] = rng.standard_normal(HQ).astype(np.float32)
    dtypes = [np.float32, np.float16]
    rows = [Row(rng, u, dtypes[i % 2], ring=i == 1) for i, u in enumerate(used)]
    clones = [r.copy() for r in rows]
    q = rng.standard_normal((len(rows), HQ, D)).astype(np.float32)
    k_new = rng.standard_normal((len(rows), HKV, D)).astype(np.float32) * 3
    v_new = rng.standard_normal((len(rows), HKV, DV)).astype(np.float32) * 3
    k_new[1, 0, :6] = [np.inf, -np.inf, 1e-7, 70000.0, -3e-6, 6.1e-5]  # f16 overflow, subnormals, infinities
    scale = 0.125
    got = _rows_call(rows, q, k_new, v_new, scale=scale, **kw)
    for i, (row, clone) in enumerate(zip(rows, clones, strict=True)):
        want = _alone(clone, q[i], k_new[i], v_new[i], scale=scale, **kw)
        assert np.array_equal(_bits(got[i]), _bits(want)), f"row {i} (used {row.used}, {row.k.dtype})"
        assert np.array_equal(_bits(row.k), _bits(clone.k)) and np.array_equal(row.v, clone.v), f"row {i}'s cache"


def test_no_rows_and_bad_arguments(rng: np.random.Generator) -> None:
    q = np.zeros((1, HQ, D), np.float32)
    kv = np.zeros((1, HKV, max(D, DV)), np.float32)
    _rows_call([], q, kv, kv, scale=1.0)  # an empty batch is a no-op
    row = Row(rng, 5, np.float32)
    row.kv_type = 2
    with pytest.raises(AssertionError):
        _rows_call([row], q, kv, kv, scale=1.0)
    assert not row.k[5].any()  # refused before any row was stored


def test_f16_cache_stores_are_numpys_cast(isa: str, rng: np.random.Generator) -> None:
    """The new keys and values go into an f16 cache as numpy's float16 cast rounds them, on every ISA (the x86 ones
    convert 8 at a time with F16C, which would quiet a NaN numpy keeps the payload of): ties, overflow to inf,
    subnormals, NaNs of every kind and random bit patterns."""
    special = np.array([0x7F800001, 0x7FC00001, 0xFFA00000, 0x7F802000, 0x7FFFFFFF, 0x7F800000, 0xFF800000,
                        0x477FE000, 0x477FEFFF, 0x477FF000, 0x47800000, 0x33000000, 0x33000001, 0x387FC000,
                        0x38800000, 0x80000000, 0x00000001, 0x3F801000, 0x3F803000, 0x3F800FFF], np.uint32)
    bits = rng.integers(0, 2**32, 64 * HKV * D, dtype=np.uint64).astype(np.uint32)
    bits[:special.size] = special
    bits[200:200 + special.size] = special  # again, 8-aligned differently
    values = bits.view(np.float32).reshape(64, HKV, D)
    rows = [Row(rng, 0, np.float16, capacity=2) for _ in range(64)]
    q = np.zeros((64, HQ, D), np.float32)
    v_new = np.zeros((64, HKV, DV), np.float32)
    with np.errstate(all="ignore"):
        _rows_call(rows, q, values, v_new, scale=0.125)
        want = values.astype(np.float16)
    got = np.stack([r.k[0] for r in rows])
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))

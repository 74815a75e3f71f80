"""CPU references of the kernels of kernels/packed.cu, in the form and under the rules of reference.py (what the
launch's threads cover, only the addresses the kernel touches, float64 arithmetic rounded once).

A packed row is decoded by the CPU references of uaii.ir — quantized.dequantize (MLX's layout, bit for bit as mlx
computes it) and nbits.dequantize (ONNX's MatMulNBits, in float64) — from what the kernel reads: the row's stored
bytes (one every ``stride`` device bytes), its scale words (float32 values or uint8 codes, one per word) and its
offset words (affine biases, float zero points, or packed zero-point bytes one per word), turned back into the
arrays those functions take. So the references and the kernels answer to one definition of each layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from uaii.backends.base import BackendError
from uaii.backends.cuda.geometry import PACKED_ROWS, WARP, Launch
from uaii.backends.cuda.reference import (
    F32,
    F64,
    Reference,
    Values,
    _chunks,
    _fault,
    _items,
    _load,
    _need_block,
    _offsets,
    _store,
)
from uaii.backends.cuda.sources import PACKED_MODES
from uaii.ir.reference import f32_to_bf16, nbits, quantized

if TYPE_CHECKING:
    from uaii.backends.cuda.host import HostMemory

_MODES = {code: name for name, code in PACKED_MODES.items()}
_WITH_OFFSETS = ("affine_f32", "affine_f16", "affine_bf16", "nbits_float_zp")
"""Modes whose kernel reads an offset word for every group (never NULL)."""


@dataclass(frozen=True)
class _Layout:
    """A kernel's packed-weight arguments (packed.cu's pk_layout, its pointers to scales and offsets)."""

    kernel: str
    stride: int
    k: int
    bits: int
    group: int
    mode: str
    scales: int
    offs: int

    @property
    def groups(self) -> int:
        return -(-self.k // self.group)

    @property
    def row_bytes(self) -> int:
        return self.groups * self.group * self.bits // 8

    @property
    def offs_ld(self) -> int:
        """Offset words per row: packed zero points take ceil(groups * bits / 8) bytes, one per word."""
        return -(-self.groups * self.bits // 8) if self.mode == "nbits" else self.groups


def _layout(kernel: str, stride: int, k: int, bits: int, group: int, mode: int, scales: int, offs: int) -> _Layout:
    """The layout of a launch, refusing what the kernel would compute garbage from (an unknown mode, a group that
    is not a multiple of 16 values, a NULL where it reads offsets)."""
    name = _MODES.get(mode)
    if name is None or k < 1 or group < 16 or group % 16 or not 1 <= bits <= 8 or stride not in (1, 4):
        raise BackendError(f"[cuda-host] {kernel}: no packed layout of mode {mode}, k {k}, bits {bits}, group "
                           f"{group}, stride {stride}")
    if name in _WITH_OFFSETS and not offs:
        raise BackendError(f"[cuda-host] {kernel}: mode {name} reads an offset per group, given NULL")
    return _Layout(kernel, stride, k, bits, group, name, scales, offs)


def _words(mem: HostMemory, ptr: int, rows: np.ndarray, ld: int) -> np.ndarray:
    """The ``ld`` 4-byte words of each row ``rows`` of a table at ``ptr``, [rows, ld] uint32."""
    offsets = (rows[:, None] * ld + np.arange(ld)).reshape(-1)
    return _load(mem, ptr, np.uint32, offsets).reshape(rows.size, ld)


def _typed(words: np.ndarray, mode: str) -> np.ndarray:
    """Float words of an affine mode as the array of the scales' type (exact: they are values of that type)."""
    f = np.ascontiguousarray(words).view(np.float32)
    if mode == "affine_f16":
        return f.astype(np.float16)
    return f32_to_bf16(f) if mode == "affine_bf16" else f


def _decode(mem: HostMemory, lay: _Layout, w: int, wrows: np.ndarray, srows: np.ndarray) -> np.ndarray:
    """Rows ``wrows`` of the packed rows at ``w``, with the scales and offsets of rows ``srows``, [rows, k] float64
    (MLX's values exact; MatMulNBits' the float64 of (q - zp) * scale)."""
    count = wrows.size
    if not count:
        return np.zeros((0, lay.k), F64)
    at = ((wrows[:, None] * lay.row_bytes + np.arange(lay.row_bytes)) * lay.stride).reshape(-1)
    raw = _load(mem, w, np.uint8, at).reshape(count, lay.row_bytes)
    scales = _words(mem, lay.scales, srows, lay.groups)
    offs = _words(mem, lay.offs, srows, lay.offs_ld) if lay.offs else None
    if lay.mode.startswith("nbits"):
        zp = None if offs is None else (offs & 255).astype(np.uint8) if lay.mode == "nbits" else offs.view(F32)
        return nbits.dequantize(raw, scales.view(F32), zp, K=lay.k, N=count, bits=lay.bits, block_size=lay.group)
    packed = np.ascontiguousarray(raw).view("<u4")
    if lay.mode.startswith("affine"):
        assert offs is not None
        values = quantized.dequantize(packed, _typed(scales, lay.mode), _typed(offs, lay.mode), mode="affine",
                                      bits=lay.bits, group_size=lay.group, k=lay.k)
    else:
        values = quantized.dequantize(packed, (scales & 255).astype(np.uint8), None, mode=lay.mode, bits=lay.bits,
                                      group_size=lay.group, k=lay.k)
    return values.astype(F64)


def _pk_gemv(mem: HostMemory, at: Launch, v: Values) -> None:
    """y[i, row] = x[i] . W[row] for rows < grid.x * block.y and activation rows i < grid.y * PACKED_ROWS, float64
    sums of the decoded rows."""
    w, n, stride, k, bits, group, mode, scales, offs, x, ldx, m, y, ldy = v
    _need_block(at, "pk_gemv", WARP)
    lay = _layout("pk_gemv", stride, k, bits, group, mode, scales, offs)
    rows, ms = max(0, min(n, at.grid[0] * at.block[1])), max(0, min(m, at.grid[1] * PACKED_ROWS))
    if not rows or not ms:
        return
    xs = _load(mem, x, F32, _offsets(ms * k, k, ldx)).reshape(ms, k).astype(F64)
    out = np.empty((ms, rows), F32)
    for r in _chunks(rows, -(-k // 32)):
        out[:, r[0]:r[-1] + 1] = xs @ _decode(mem, lay, w, r, r).T
    _store(mem, y, F32, _offsets(ms * rows, rows, ldy), out.reshape(-1))


def _pk_gemv_idx(mem: HostMemory, at: Launch, v: Values) -> None:
    """For each pair s < grid.y whose expert e = idx[s] is in [e0, e1): y[s, row] = x[s / x_div] . W_{e - e0}[row]
    (rows < grid.x * block.y), the scales those of expert sidx[s]; float64 sums of the decoded rows."""
    bank, n, stride, k, bits, group, mode, scales, offs, x, ldx, x_div, idx, e0, e1, sidx, y, ldy = v
    _need_block(at, "pk_gemv_idx", WARP)
    lay = _layout("pk_gemv_idx", stride, k, bits, group, mode, scales, offs)
    rows = max(0, min(n, at.grid[0] * at.block[1]))
    if not rows:
        return
    if x_div <= 0:
        raise BackendError(f"[cuda-host] pk_gemv_idx with x_div {x_div}: the kernel would divide by zero")
    experts = _load(mem, idx, np.int32, np.arange(at.grid[1])).astype(np.int64)
    for s in np.flatnonzero((experts >= e0) & (experts < e1)).tolist():
        chosen = int(_load(mem, sidx, np.int32, np.array([s]))[0])
        xs = _load(mem, x + 4 * (s // x_div) * ldx, F32, np.arange(k)).astype(F64)
        out = np.empty(rows, F32)
        for r in _chunks(rows, -(-k // 32)):
            out[r[0]:r[-1] + 1] = _decode(mem, lay, bank, (experts[s] - e0) * n + r, chosen * n + r) @ xs
        _store(mem, y + 4 * s * ldy, F32, np.arange(rows), out)


def _pk_rows(mem: HostMemory, at: Launch, v: Values) -> None:
    """y[i, :] = row widx[i] - w0 of the packed rows, decoded with the scales of row sidx[i], for the ids whose row
    is in [w0, w1): the 32-value units < grid.x * block.x (a token's units in turn), exact. A token whose id
    (sidx) lies outside [0, vocab) gets zeros and the fault code."""
    w, stride, k, bits, group, mode, scales, offs, widx, w0, w1, sidx, r, y, vocab, fault, code = v
    lay = _layout("pk_rows", stride, k, bits, group, mode, scales, offs)
    units = -(-k // 32)
    n = _items(at, units * r)
    if n <= 0:
        return
    tokens = np.arange(-(-n // units))
    ids = _load(mem, sidx, np.int32, tokens).astype(np.int64)
    bad = (ids < 0) | (ids >= vocab)
    _fault(mem, fault, code, bad)
    if bad.any():
        cut = np.minimum(k, 32 * np.minimum(units, n - tokens[bad] * units))
        zero = (tokens[bad][:, None] * k + np.arange(k))[np.arange(k) < cut[:, None]]
        _store(mem, y, F32, zero, np.zeros(zero.size, F32))
    rows = _load(mem, widx, np.int32, tokens).astype(np.int64)
    mine = np.flatnonzero((rows >= w0) & (rows < w1) & ~bad)
    if not mine.size:
        return
    values = _decode(mem, lay, w, rows[mine] - w0, _load(mem, sidx, np.int32, mine).astype(np.int64))
    covered = np.minimum(k, 32 * np.minimum(units, n - mine * units))  # the last token's units may be cut
    keep = np.arange(k) < covered[:, None]
    _store(mem, y, F32, (mine[:, None] * k + np.arange(k))[keep], values[keep].astype(F32))


TABLE: dict[str, Reference] = {"pk_gemv": _pk_gemv, "pk_gemv_idx": _pk_gemv_idx, "pk_rows": _pk_rows}

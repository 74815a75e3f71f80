"""Launch geometry of the CUDA kernels: grid and block for each kernel family, from the problem's sizes.

Why its own module: these are the host's only decisions that a wrong number turns into silent wrong results (rows
never computed) or launch failures (a grid dimension past the device limit), and they are plain arithmetic — unit-
tested on any machine (every row covered once, limits held), where the kernels themselves need a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from uaii.backends.base import BackendError
from uaii.backends.cuda.sources import GEMV_ROWS

MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535
MAX_THREADS = 1024
WARP = 32
GEMV_WARPS = 4          # gemv.cu's UK_GEMV_WARPS: weight rows per GEMV block (one warp each)
ELEMENTWISE = 256       # threads per block of the one-thread-per-item kernels
NORM_BLOCK = 256        # ops.cu's UK_BLOCK: one block per row
ATTN_KEYS = 128         # attention.cu's UK_ATTN_KEYS: attn_scores' keys (and threads) per block
ATTN_HEADS = 8          # attention.cu's UK_ATTN_HEADS: query heads of a GQA group per attn_scores block
ATTN_SOFTMAX = 256      # attention.cu's UK_ATTN_BLOCK
ATTN_VALUES = 128       # attn_wsum's threads (a thread per output value, looping past 128); attn_wsum_sum's per block
ATTN_BLOCKS = 256       # attn_wsum cuts the keys into stretches until rows x heads x stretches reaches this
ATTN_STRETCH = 64       # ... but no stretch shorter than this many keys
FLASH_VALUES = 2        # attention.cu's UK_FLASH_VALUES: attn_flash's output values a thread (dv <= ATTN_KEYS x this)
MMQ_TILE = 64           # mmq.cu's MMQ_TILE: weight rows and activation rows per block
MMQ_SIDE = 16           # mmq.cu's MMQ_SIDE: a block is MMQ_SIDE x MMQ_SIDE threads
PACKED_ROWS = 8         # packed.cu's PK_M: activation rows per block of pk_gemv


@dataclass(frozen=True)
class Launch:
    """cuLaunchKernel's grid and block dimensions (x, y, z) and dynamic shared memory bytes."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int = 0

    def __post_init__(self) -> None:
        gx, gy, gz = self.grid
        bx, by, bz = self.block
        if min(*self.grid, *self.block) < 1:
            raise BackendError(f"[cuda] empty launch: grid {self.grid}, block {self.block}")
        if gx > MAX_GRID_X or gy > MAX_GRID_YZ or gz > MAX_GRID_YZ:
            raise BackendError(f"[cuda] grid {self.grid} is past the device limits ({MAX_GRID_X}, {MAX_GRID_YZ}, "
                               f"{MAX_GRID_YZ})")
        if bx * by * bz > MAX_THREADS:
            raise BackendError(f"[cuda] block {self.block} has more than {MAX_THREADS} threads")

    @property
    def threads(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2] * self.block[0] * self.block[1] * self.block[2]


def count(shape: Sequence[int]) -> int:
    """Values in a tensor of ``shape`` (1 for a scalar's empty shape)."""
    return math.prod(int(d) for d in shape)


def _blocks(items: int, per: int) -> int:
    return max(1, -(-items // per))


def gemv(rows: int) -> Launch:
    """gemv_<type>_m<M>, gemvq_<type>_m<M>: one warp per weight row, GEMV_WARPS rows per block."""
    return Launch((_blocks(rows, GEMV_WARPS), 1, 1), (WARP, GEMV_WARPS, 1))


def gemv_splits(m: int) -> list[tuple[int, int]]:
    """The (first activation row, M) of the launches that cover ``m`` activation rows with the instantiated M
    (gemv_<type>_m1/2/4/8): the largest first, e.g. 11 -> (0, 8), (8, 2), (10, 1)."""
    if m < 1:
        raise BackendError(f"[cuda] a GEMV needs at least one activation row, found {m}")
    out, start = [], 0
    for size in sorted(GEMV_ROWS, reverse=True):
        while m - start >= size:
            out.append((start, size))
            start += size
    return out


def gemv_pairs(rows: int, pairs: int) -> Launch:
    """gemv_idx_<type>, gemvq_idx_<type>, pk_gemv_idx: gemv's blocks over the weight rows (grid x), one (token, slot)
    pair per grid y."""
    return Launch((_blocks(rows, GEMV_WARPS), pairs, 1), (WARP, GEMV_WARPS, 1))


def pair_chunks(pairs: int, top_k: int) -> list[tuple[int, int]]:
    """(first pair, pairs) of the expert-product launches covering ``pairs`` (token, slot) pairs within the grid's y
    limit, each a whole number of tokens (a launch reads its pairs' rows of x from its first pair's token on)."""
    chunk = max(top_k, (MAX_GRID_YZ // top_k) * top_k)
    return [(s0, min(chunk, pairs - s0)) for s0 in range(0, pairs, chunk)]


def packed_gemv(rows: int, m: int) -> Launch:
    """pk_gemv: one warp per weight row, GEMV_WARPS rows per block (grid x); PACKED_ROWS activation rows per block
    (grid y: each block decodes its weight rows once for that many rows)."""
    return Launch((_blocks(rows, GEMV_WARPS), _blocks(m, PACKED_ROWS), 1), (WARP, GEMV_WARPS, 1))


def elementwise(count: int) -> Launch:
    """One thread per item: dequant_<type> (units), rows_<type>, swiglu, add, rope (pairs)."""
    return Launch((_blocks(count, ELEMENTWISE), 1, 1), (ELEMENTWISE, 1, 1))


def norm(rows: int) -> Launch:
    """rms_norm / add_rms_norm: one block per row."""
    return Launch((rows, 1, 1), (NORM_BLOCK, 1, 1))


class Attention(NamedTuple):
    """The launches of attention over ``rows`` sequences of ``hq`` query heads (in groups over ``hkv`` kv heads) and
    at most ``s_max`` keys: attn_scores and attn_wsum (up to ATTN_HEADS heads of a group per block row; attn_wsum
    over ``splits`` stretches of keys), attn_mask (a head per block row), attn_softmax, attn_wsum_sum adding the
    stretches (only when ``splits`` > 1; their partial sums need ``partial_bytes`` of scratch); or the two of the
    fused form: attn_flash over the same blocks and stretches as attn_wsum (ATTN_KEYS threads), attn_flash_sum
    combining the stretches as attn_wsum_sum adds them (``flash_bytes`` of scratch: dv + 2 values per stretch)."""

    scores: Launch
    mask: Launch
    softmax: Launch
    wsum: Launch
    wsum_sum: Launch
    splits: int
    partial_bytes: int
    flash: Launch
    flash_sum: Launch
    flash_bytes: int


def attention(rows: int, hq: int, hkv: int, s_max: int, dv: int) -> Attention:
    """The launches of attention (:class:`Attention`); the stretches keep a decode step's few (row, head group)
    blocks from each walking the whole context alone."""
    if rows > MAX_GRID_YZ or hq > MAX_GRID_YZ:
        raise BackendError(f"[cuda] attention over {rows} rows x {hq} heads is past the grid's y/z limit")
    if hkv < 1 or hq % hkv:
        raise BackendError(f"[cuda] attention with {hq} query heads over {hkv} kv heads: not whole GQA groups")
    groups = hkv * _blocks(hq // hkv, ATTN_HEADS)  # block rows of up to ATTN_HEADS heads of one GQA group
    pairs = max(rows * groups, 1)
    splits = 1 if pairs >= ATTN_BLOCKS else max(1, min(-(-ATTN_BLOCKS // pairs), -(-s_max // ATTN_STRETCH)))
    keys = _blocks(s_max, ATTN_KEYS)
    return Attention(Launch((keys, groups, rows), (ATTN_KEYS, 1, 1)),
                     Launch((keys, hq, rows), (ATTN_KEYS, 1, 1)),
                     Launch((hq, rows, 1), (ATTN_SOFTMAX, 1, 1)),
                     Launch((splits, groups, rows), (ATTN_VALUES, 1, 1)),
                     Launch((_blocks(dv, ATTN_VALUES), hq, rows), (ATTN_VALUES, 1, 1)),
                     splits, 4 * rows * hq * splits * dv if splits > 1 else 0,
                     Launch((splits, groups, rows), (ATTN_KEYS, 1, 1)),
                     Launch((_blocks(dv, ATTN_KEYS), hq, rows), (ATTN_KEYS, 1, 1)),
                     4 * rows * hq * splits * (dv + 2))


def mmq(n: int, m: int) -> Launch:
    """mmq_<type>: one block per tile of MMQ_TILE weight rows (grid x) by MMQ_TILE activation rows (grid y)."""
    if n < 1 or m < 1:
        raise BackendError(f"[cuda] an int8 GEMM needs weight and activation rows, found n = {n}, m = {m}")
    return Launch((_blocks(n, MMQ_TILE), _blocks(m, MMQ_TILE), 1), (MMQ_SIDE, MMQ_SIDE, 1))


def mmq_idx(n: int, rows: int, experts: int) -> Launch:
    """mmq_idx_<type>: mmq's tiles of MMQ_TILE weight rows (grid x) by MMQ_TILE of an expert's listed rows (grid y,
    ``rows`` the most any expert can have: a prefill's tokens) for each expert of the bank (grid z)."""
    if n < 1 or rows < 1 or experts < 1:
        raise BackendError(f"[cuda] an experts' int8 GEMM needs weight rows, rows and experts, found n = {n}, rows = "
                           f"{rows}, experts = {experts}")
    if experts > MAX_GRID_YZ:
        raise BackendError(f"[cuda] {experts} experts in one bank: past the grid's z limit ({MAX_GRID_YZ})")
    return Launch((_blocks(n, MMQ_TILE), _blocks(rows, MMQ_TILE), experts), (MMQ_SIDE, MMQ_SIDE, 1))


def mmq_tiles(launch: Launch, n: int, m: int) -> list[tuple[int, int, int, int]]:
    """The (weight row, activation row) ranges each block of an mmq launch computes, [r0, r1) x [c0, c1), as the
    kernel clips them (the host's model of the kernel's indexing, for tests)."""
    return [(bx * MMQ_TILE, min(n, (bx + 1) * MMQ_TILE), by * MMQ_TILE, min(m, (by + 1) * MMQ_TILE))
            for bx in range(launch.grid[0]) for by in range(launch.grid[1])]


__all__ = ["Launch", "attention", "count", "elementwise", "gemv", "gemv_pairs", "gemv_splits", "mmq", "mmq_idx",
           "mmq_tiles", "norm", "packed_gemv", "pair_chunks"]

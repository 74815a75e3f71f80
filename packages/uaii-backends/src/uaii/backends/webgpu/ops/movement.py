"""Movement ops: Identity and Reshape when not a view (a weight or constant copied into an activation), Transpose,
Concat, Split and Slice — every one a *box copy*: a box of the source, read with per-axis start, step and permutation,
written at an offset of the destination.

Element units: plain values are 4-byte words on the device (f32/i32 whatever the dtype); block-quantized values are
raw bytes, copied as the byte tensor ``[*shape[:-1], row_bytes]`` — so a q8_0 Concat of rows is a byte copy, and a
position along the last axis must fall on a block boundary. Box copies are coalesced on the host; a byte copy whose
runs and offsets are all multiples of 4 (real quantized rows are) runs as a word copy, the rest byte by byte with
atomic and/or on the destination words, which is correct when two inputs share a word (a 34-byte q8_0 row).

A quantized weight is read in its stored encoding (``Lower.packed``), whose row shards are cut along axis 0: each
shard serves the part of the box whose source rows it holds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from uaii.backends.analysis import NodeInfo
from uaii.backends.base import BackendError
from uaii.backends.webgpu.lower import Lower, Lowering
from uaii.backends.webgpu.ops.elementwise import INDEX, WG, coalesce, contiguous, vec8
from uaii.backends.webgpu.program import Region

COPY = """// copy {unit}
struct P {{ n: u32, rank: u32, sbase: u32, dbase: u32, shape: vec4<u32>, shape2: vec4<u32>,
           sstr: vec4<u32>, sstr2: vec4<u32>, dstr: vec4<u32>, dstr2: vec4<u32> }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<{dst_t}>;
{index}
@compute @workgroup_size({wg})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = gid.x + gid.y * nwg.x * {wg}u;
  if (i >= p.n) {{ return; }}
  let s = p.sbase + offset8(i, p.rank, p.shape, p.shape2, p.sstr, p.sstr2);
  let d = p.dbase + offset8(i, p.rank, p.shape, p.shape2, p.dstr, p.dstr2);
{body}
}}
"""
WORD_BODY = "  dst[d] = src[s];"
BYTE_BODY = """  let v = (src[s >> 2u] >> ((s & 3u) * 8u)) & 255u;
  let sh = (d & 3u) * 8u;
  atomicAnd(&dst[d >> 2u], ~(255u << sh));
  atomicOr(&dst[d >> 2u], v << sh);"""
WORD_COPY = COPY.format(unit="words", dst_t="u32", index=INDEX, wg=WG, body=WORD_BODY)
BYTE_COPY = COPY.format(unit="bytes", dst_t="atomic<u32>", index=INDEX, wg=WG, body=BYTE_BODY)


# --- layouts and pieces ----------------------------------------------------------------------------------------
def layout(ctx: Lower, name: str) -> tuple[list[int], int]:
    """(element shape, bytes per element) of a value as a copy sees it (see the module doc)."""
    dt, shape = ctx.dtype(name), list(ctx.shape(name)) or [1]
    if dt.is_quantized:
        return [*shape[:-1], dt.nbytes(shape[-1])], 1
    return shape, 4


def pieces(ctx: Lower, name: str) -> list[tuple[int, int, Region]]:
    """(first row, end row, region) along axis 0 of the element shape: a quantized weight's shards, else one."""
    rows = layout(ctx, name)[0][0]
    if ctx.is_weight(name) and ctx.dtype(name).is_quantized and len(ctx.shape(name)) > 1:
        return [(s.start, s.stop, s.region) for s in ctx.packed(name).shards]
    if ctx.is_weight(name) and ctx.dtype(name).is_quantized:
        (shard,) = ctx.packed(name).shards
        return [(0, rows, shard.region)]
    return [(0, rows, ctx.region(name))]


def position(ctx: Lower, name: str, axis: int, at: int) -> int:
    """Logical index ``at`` along ``axis`` of ``name`` in element units (bytes on a quantized last axis)."""
    dt, shape = ctx.dtype(name), ctx.shape(name)
    if not dt.is_quantized or axis != len(shape) - 1:
        return at
    if at % dt.block_size:
        raise BackendError(f"[backend] webgpu: node {ctx.node!r} cuts {dt.value} value {name!r} at element {at} of "
                           f"its last axis, inside a block of {dt.block_size}")
    return dt.nbytes(at)


def _rows_in(lo: int, step: int, count: int, r0: int, r1: int) -> tuple[int, int]:
    """The range [c0, c1) of c in [0, count) whose source row ``lo + c * step`` lies in [r0, r1)."""
    if step > 0:
        c0, c1 = -(-(r0 - lo) // step), -(-(r1 - lo) // step)
    else:
        c0, c1 = -(-(lo - r1 + 1) // -step), (lo - r0) // -step + 1
    return max(c0, 0), min(c1, count)


# --- the copies -----------------------------------------------------------------------------------------------
def emit(ctx: Lower, box: Sequence[int], src: Region, sbase: int, sstr: Sequence[int], dst: Region, dbase: int,
         dstr: Sequence[int], unit: int) -> None:
    """One dispatch copying ``box`` from ``src`` (offset ``sbase``, strides ``sstr``) to ``dst``, in elements."""
    shape, (ss, ds) = coalesce(list(box), list(sstr), list(dstr))
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0:
        return
    if unit == 1 and ss[-1] == ds[-1] == 1 and shape[-1] % 4 == 0 and sbase % 4 == dbase % 4 == 0 \
            and all(s % 4 == 0 for s in (*ss[:-1], *ds[:-1])):
        shape[-1] //= 4
        ss, ds = [s // 4 if k < len(ss) - 1 else 1 for k, s in enumerate(ss)], \
            [s // 4 if k < len(ds) - 1 else 1 for k, s in enumerate(ds)]
        sbase, dbase, n, unit = sbase // 4, dbase // 4, n // 4, 4
    node = ctx.node
    params = [n, len(shape), sbase, dbase, *vec8(node, shape), *vec8(node, ss), *vec8(node, ds)]
    ctx.dispatch(WORD_COPY if unit == 4 else BYTE_COPY, [src, dst], params, -(-n // WG))


def copy_box(ctx: Lower, x: str, y: str, lo: Sequence[int], steps: Sequence[int], counts: Sequence[int],
             perm: Sequence[int], dst_lo: Sequence[int]) -> None:
    """Copy the box of ``x`` (per source axis: start ``lo``, ``steps``, ``counts``; element units) into ``y`` at
    ``dst_lo``; box axis i walks source axis ``perm[i]``."""
    if 0 in counts:
        return
    sshape, unit = layout(ctx, x)
    dshape, _ = layout(ctx, y)
    sstr, dstr = contiguous(sshape), contiguous(dshape)
    i0 = list(perm).index(0)
    dbase = sum(a * s for a, s in zip(dst_lo, dstr, strict=True))
    for r0, r1, region in pieces(ctx, x):
        c0, c1 = _rows_in(lo[0], steps[0], counts[0], r0, r1)
        if c0 >= c1:
            continue
        box = [counts[p] for p in perm]
        box[i0] = c1 - c0
        sbase = (lo[0] + c0 * steps[0] - r0) * sstr[0] + sum(lo[d] * sstr[d] for d in range(1, len(sstr)))
        emit(ctx, box, region, sbase, [sstr[p] * steps[p] for p in perm], ctx.region(y), dbase + c0 * dstr[i0],
             dstr, unit)


# --- the ops --------------------------------------------------------------------------------------------------
def copy(ctx: Lower, info: NodeInfo) -> None:
    """Identity / Reshape whose output is not a view of the input: the elements in order."""
    x, y = info.node.inputs[0], info.node.outputs[0]
    shape, unit = layout(ctx, x)
    row = int(np.prod(shape[1:], dtype=np.int64))
    for r0, r1, region in pieces(ctx, x):
        emit(ctx, [(r1 - r0) * row], region, 0, [1], ctx.region(y), r0 * row, [1], unit)


def transpose(ctx: Lower, info: NodeInfo) -> None:
    x, y = info.node.inputs[0], info.node.outputs[0]
    rank = len(ctx.shape(x))
    if rank == 0:
        return copy(ctx, info)
    if ctx.dtype(x).is_quantized:
        raise BackendError(f"[backend] webgpu: node {ctx.node!r}: Transpose takes plain dtypes, found "
                           f"{ctx.dtype(x).value}")
    perm = info.attrs.get("perm") or tuple(range(rank))[::-1]
    copy_box(ctx, x, y, [0] * rank, [1] * rank, layout(ctx, x)[0], [int(p) for p in perm], [0] * rank)


def concat(ctx: Lower, info: NodeInfo) -> None:
    y = info.node.outputs[0]
    rank = len(ctx.shape(y))
    axis = int(info.attrs["axis"]) % rank
    at = 0
    for x in info.node.inputs:
        dst_lo = [0] * rank
        dst_lo[axis] = position(ctx, y, axis, at)
        copy_box(ctx, x, y, [0] * rank, [1] * rank, layout(ctx, x)[0], list(range(rank)), dst_lo)
        at += ctx.shape(x)[axis]


def split(ctx: Lower, info: NodeInfo) -> None:
    x = info.node.inputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    axis = int(info.attrs["axis"]) % rank
    outs = info.node.outputs
    sizes = info.attrs.get("split") or [shape[axis] // len(outs)] * len(outs)
    at = 0
    for y, size in zip(outs, sizes, strict=True):
        if y:
            lo = [0] * rank
            lo[axis] = position(ctx, x, axis, at)
            copy_box(ctx, x, y, lo, [1] * rank, layout(ctx, y)[0], list(range(rank)), [0] * rank)
        at += int(size)


def slice_(ctx: Lower, info: NodeInfo) -> None:
    x, y = info.node.inputs[0], info.node.outputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    lo, steps, counts = [0] * rank, [1] * rank, list(layout(ctx, x)[0])
    starts, ends = info.attrs["starts"], info.attrs["ends"]
    axes = info.attrs.get("axes") or tuple(range(len(starts)))
    for a, s, e, st in zip(axes, starts, ends, info.attrs.get("steps") or (1,) * len(starts), strict=True):
        a = int(a) % rank
        start, stop, step = slice(int(s), int(e), int(st)).indices(shape[a])
        n = len(range(start, stop, step))
        if ctx.dtype(x).is_quantized and a == rank - 1:
            if step != 1 and n > 1:
                raise BackendError(f"[backend] webgpu: node {ctx.node!r} steps by {step} along the last axis of "
                                   f"{ctx.dtype(x).value} value {x!r}; blocks can only be cut whole")
            lo[a] = position(ctx, x, a, start)
            counts[a] = position(ctx, x, a, start + n) - lo[a]
            continue
        lo[a], steps[a], counts[a] = start, step, n
    copy_box(ctx, x, y, lo, steps, counts, list(range(rank)), [0] * rank)


LOWERINGS: dict[str, Lowering] = {"Identity": copy, "Reshape": copy, "Transpose": transpose, "Concat": concat,
                                  "Split": split, "Slice": slice_}

__all__ = ["LOWERINGS", "copy_box", "emit"]

"""Indexing: Embedding (row lookup that dequantizes) and Gather (ONNX Gather, dtype kept).

Tables stay packed on the device (``Lower.packed``), split by rows into shards when larger than one storage
binding: each shard's dispatch writes the output rows whose ids fall in it, and the last one writes zeros for ids
outside the table (the reference raises there; a shader cannot). Block-quantized rows decode one 32-value unit per
thread (dequant.py); plain rows (f32/f16/bf16) one value per thread, so any row length works. Gather of raw data
(ints, or block-quantized rows along a leading axis, which stay packed) copies bytes assembled into whole words, so
rows need not be 4-byte aligned.
"""

from __future__ import annotations

from uaii.backends.analysis import NodeInfo
from uaii.backends.base import BackendError
from uaii.backends.webgpu.lower import GpuWeight, Lower, Lowering, Shard
from uaii.backends.webgpu.ops.dequant import ELEM, PLAIN, UNIT, decoder
from uaii.backends.webgpu.program import device_dtype
from uaii.ir import DType

WG = 64

IDS = """
fn id_at(j: u32) -> i32 {{
  var v = {read};
  if (p.wrap == 1u && v < 0) {{ v = v + i32(p.vocab); }}
  return v;
}}
"""

ROWS = """// rows {dtype} {mode}
struct P {{ nids: u32, dim: u32, row_bytes: u32, start: u32, stop: u32, vocab: u32, fill: u32, wrap: u32 }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> W: array<u32>;
@group(0) @binding(2) var<storage, read_write> I: array<u32>;
@group(0) @binding(3) var<storage, read_write> Y: array<{yt}>;
{lib}{ids}
@compute @workgroup_size({wg})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = gid.x + gid.y * nwg.x * {wg}u;
  let per = {per};
  let r = i / per; let c = i % per;
  if (r >= p.nids) {{ return; }}
  let id = id_at(r);
  if (id >= i32(p.start) && id < i32(p.stop)) {{
{body}  }} else if (p.fill == 1u && (id < 0 || id >= i32(p.vocab))) {{
{zero}  }}
}}
"""


def rows_source(dtype: DType, float_ids: bool) -> str:
    """Rows of a table (binding W, a shard) into Y: one 32-value unit per thread for block types, one value per
    thread for plain types."""
    read = "i32(bitcast<f32>(I[j]))" if float_ids else "bitcast<i32>(I[j])"
    ids = IDS.format(read=read)
    if dtype in PLAIN:
        return ROWS.format(dtype=dtype.value, mode="elems", yt="f32", lib=ELEM[dtype], ids=ids, wg=WG,
                           per="p.dim", body="    Y[i] = elem(u32(id - i32(p.start)) * p.dim + c);\n",
                           zero="    Y[i] = 0.0;\n")
    dec = decoder(dtype)
    body = ("    var q: array<vec4<f32>, 8>;\n"
            f"    let s = unit({dec.address('u32(id - i32(p.start)) * p.row_bytes', 'c')}, &q);\n"
            + "".join(f"    Y[i * 8u + {j}u] = {dec.value(f'q[{j}]', 's', '0' if j < 4 else '1')};\n"
                      for j in range(8)))
    zero = "".join(f"    Y[i * 8u + {j}u] = vec4<f32>(0.0);\n" for j in range(8))
    return ROWS.format(dtype=dtype.value, mode="units", yt="vec4<f32>", lib=dec.wgsl, ids=ids, wg=WG,
                       per=f"p.dim / {UNIT}u", body=body, zero=zero)


def _table(ctx: Lower, name: str) -> GpuWeight:
    """The table as shards: a weight's own row shards, or an activation's region as one shard."""
    if ctx.is_weight(name):
        return ctx.packed(name)
    shape = ctx.shape(name)
    return GpuWeight(name, ctx.dtype(name), shape, (Shard(0, shape[0], ctx.region(name)),))


def lookup_rows(ctx: Lower, ids: str, table: str, y: str, *, wrap: bool) -> None:
    """Y[j, :] = decode(table[ids[j], :]) over every shard of the table (see the module doc)."""
    t = _table(ctx, table)
    if not t.dtype.is_quantized and not ctx.is_weight(table):
        t = GpuWeight(t.name, DType.F32, t.shape, t.shards)  # an activation table is f32 on the device
    dim = ctx.count(table) // max(t.rows, 1)
    nids = ctx.count(ids)
    src = rows_source(t.dtype, ctx.dtype(ids).is_float)
    per = dim if t.dtype in PLAIN else dim // UNIT
    for k, s in enumerate(t.shards):
        params = [nids, dim, t.row_bytes, s.start, s.stop, t.rows, int(k == len(t.shards) - 1), int(wrap)]
        ctx.dispatch(src, [s.region, ctx.region(ids), ctx.region(y)], params, -(-nids * per // WG))


def embedding(ctx: Lower, info: NodeInfo) -> None:
    ids, table = info.node.inputs[0], info.node.inputs[1]
    lookup_rows(ctx, ids, table, info.node.outputs[0], wrap=False)


# --- Gather of raw data (ints, packed rows) -------------------------------------------------------------------
BYTES = """// gather bytes wordwise={wordwise}
struct P {{ words: u32, nbytes: u32, ib: u32, nidx: u32, axis: u32, start: u32, stop: u32, fill: u32 }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> D: array<u32>;
@group(0) @binding(2) var<storage, read_write> I: array<u32>;
@group(0) @binding(3) var<storage, read_write> Y: array<u32>;
fn src_byte(ob: u32) -> i32 {{
  let rest = ob / p.ib; let j = rest % p.nidx; let o = rest / p.nidx;
  var id = bitcast<i32>(I[j]);
  if (id < 0) {{ id = id + i32(p.axis); }}
  if (id < i32(p.start) || id >= i32(p.stop)) {{
    return select(-1, -2, p.fill == 1u && (id < 0 || id >= i32(p.axis)));
  }}
  return i32((o * (p.stop - p.start) + u32(id) - p.start) * p.ib + ob % p.ib);
}}
@compute @workgroup_size({wg})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let w = gid.x + gid.y * nwg.x * {wg}u;
  if (w >= p.words) {{ return; }}
{body}}}
"""

_WORDWISE = """  let sb = src_byte(4u * w);
  if (sb >= 0) { Y[w] = D[u32(sb) >> 2u]; } else if (sb == -2) { Y[w] = 0u; }
"""
_BYTEWISE = """  var out = Y[w];
  for (var k = 0u; k < 4u; k = k + 1u) {
    let ob = 4u * w + k;
    if (ob >= p.nbytes) { break; }
    let sb = src_byte(ob);
    if (sb == -1) { continue; }
    var v = 0u;
    if (sb >= 0) { v = (D[u32(sb) >> 2u] >> ((u32(sb) & 3u) * 8u)) & 255u; }
    out = (out & ~(255u << (8u * k))) | (v << (8u * k));
  }
  Y[w] = out;
"""


def gather_bytes(ctx: Lower, data: GpuWeight, ids: str, y: str, axis: int) -> None:
    """Y = take(data, ids, axis) on the device encoding of ``data`` (4-byte f32/i32 values or packed blocks), one
    dispatch per row shard (shards exist only for axis 0)."""
    shape = data.shape
    outer = 1
    for d in shape[:axis]:
        outer *= d
    inner = 1
    for d in shape[axis + 1:]:
        inner *= d
    kind = device_dtype(data.dtype)
    ib = data.dtype.nbytes(inner) if kind == "raw" else 4 * inner
    nidx = ctx.count(ids)
    nbytes = outer * nidx * ib
    words = -(-nbytes // 4)
    wordwise = ib % 4 == 0
    src = BYTES.format(wordwise=int(wordwise), wg=WG, body=_WORDWISE if wordwise else _BYTEWISE)
    for k, s in enumerate(data.shards):
        params = [words, nbytes, ib, nidx, shape[axis], s.start, s.stop, int(k == len(data.shards) - 1)]
        ctx.dispatch(src, [s.region, ctx.region(ids), ctx.region(y)], params, -(-words // WG))


def gather(ctx: Lower, info: NodeInfo) -> None:
    """Float rows of a weight along axis 0 decode like Embedding (f16/bf16 tables stay packed); everything else is
    a byte gather of the device encoding (packed rows of a block-quantized weight stay packed)."""
    node = info.node
    data, ids, y = node.inputs[0], node.inputs[1], node.outputs[0]
    shape = ctx.shape(data)
    axis = int(info.attrs.get("axis", 0)) % max(len(shape), 1)
    dt = ctx.dtype(data)
    weight = ctx.is_weight(data)
    if weight and axis == 0 and dt in PLAIN and len(shape) >= 2:
        lookup_rows(ctx, ids, data, y, wrap=True)
        return
    if weight and dt.is_quantized:  # packed as stored: ctx.region would hand it over dequantized to f32
        table = ctx.packed(data)
        if axis:
            if len(table.shards) > 1:
                raise BackendError(f"[backend] webgpu: node {ctx.node!r} gathers {data!r} along axis {axis}, but the "
                                   f"weight is split into {len(table.shards)} row shards; only axis 0 spans shards")
            table = GpuWeight(data, dt, shape, (Shard(0, shape[axis], table.shards[0].region),))
    else:
        table = GpuWeight(data, dt, shape, (Shard(0, shape[axis], ctx.region(data)),))
    gather_bytes(ctx, table, ids, y, axis)


LOWERINGS: dict[str, Lowering] = {"Embedding": embedding, "Gather": gather}

__all__ = ["LOWERINGS", "gather_bytes", "lookup_rows", "rows_source"]

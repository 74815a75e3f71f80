"""Matrix products: MatMul, MatMulRelu, Gemm and GroupedMatMul.

Two kernels. The *GEMV* kernel reads a weight stored [N, K] (``transpose_b``, the GGUF layout) in its packed
encoding and dequantizes inside the shader (see dequant.py): ``TPR`` threads share one output row, each striding
over the row's 32-value units, and reduce in workgroup memory; a workgroup holds ``128 / TPR`` rows. For M > 1
activation rows (prefill) each workgroup also takes a tile of up to 8 rows, so every weight unit is decoded once
per tile. Where the device has subgroups (:attr:`GpuDevice.subgroups`) the GEMV reduces with ``subgroupAdd``
instead (:data:`GEMV_SG`). A weight larger than one storage binding arrives in row shards (``Lower.packed``): one
dispatch per shard, each writing its own output columns. Everything else — B an activation, B stored [K, N],
batched B, transposed A — goes to a tiled f32 kernel with strides (weights then read as f32, whole — or, for an
f32 [K, N] weight larger than a binding, shard by shard along K, the partial products summed in Y).
"""

from __future__ import annotations

import numpy as np

from uaii.backends.analysis import NodeInfo
from uaii.backends.base import BackendError
from uaii.backends.webgpu.lower import Lower, Lowering
from uaii.backends.webgpu.ops.dequant import PLAIN, SUPPORTED, UNIT, Decoder, decoder
from uaii.backends.webgpu.ops.elementwise import broadcast_strides
from uaii.backends.webgpu.program import Region
from uaii.ir import DType

WG = 128
MAX_TILE = 8

ROW_DOT = """
fn part(x: u32, q: ptr<function, array<vec4<f32>, 8>>, s: vec4<f32>) -> f32 {{
  let x0 = X[x]; let x1 = X[x + 1u]; let x2 = X[x + 2u]; let x3 = X[x + 3u];
  let x4 = X[x + 4u]; let x5 = X[x + 5u]; let x6 = X[x + 6u]; let x7 = X[x + 7u];
  let lo = dot((*q)[0], x0) + dot((*q)[1], x1) + dot((*q)[2], x2) + dot((*q)[3], x3);
  let hi = dot((*q)[4], x4) + dot((*q)[5], x5) + dot((*q)[6], x6) + dot((*q)[7], x7);
  return {combine};
}}
fn row_dot(rb: u32, xb: u32, ldx: u32, nm: u32, t: u32, units: u32{st}) -> array<f32, {mt}> {{
  var acc: array<f32, {mt}>;
  var q: array<vec4<f32>, 8>;
  for (var u = t; u < units; u = u + {step}) {{
    let s = unit({addr}, &q);
{rows}  }}
  return acc;
}}
"""


def row_dot_wgsl(dec: Decoder, tpr: int, mt: int, strided: bool = False) -> str:
    """``row_dot``: this thread's share of the dot products of one packed weight row (at byte ``rb`` of ``W``) with
    ``nm`` <= mt rows of ``X`` (vec4 index ``xb``, stride ``ldx``); units ``t, t+tpr, ...`` of ``units`` — or, when
    ``strided``, ``t, t+st, ...`` with ``st`` a last argument (the subgroup kernel knows its stride only at run
    time)."""
    combine = "lo + hi"
    if dec.scaled:
        combine = "s.x * lo + s.y * hi"
    if dec.offset:
        combine += " + s.z * dot(x0 + x1 + x2 + x3, vec4<f32>(1.0)) + s.w * dot(x4 + x5 + x6 + x7, vec4<f32>(1.0))"
    rows = "".join(f"    if ({i}u < nm) {{ acc[{i}] = acc[{i}] + part(xb + {i}u * ldx + u * 8u, &q, s); }}\n"
                   for i in range(mt))
    st, step = (", st: u32", "st") if strided else ("", f"{tpr}u")
    return dec.wgsl + ROW_DOT.format(combine=combine, mt=mt, st=st, step=step, addr=dec.address("rb", "u"),
                                     rows=rows)


def reduce_wgsl(tpr: int, mt: int) -> str:
    """Sum ``acc`` over the ``tpr`` threads of each row into ``red[i * WG + li]`` of the row's first thread."""
    out = "".join(f"  red[{i}u * {WG}u + li] = acc[{i}];\n" for i in range(mt)) + "  workgroupBarrier();\n"
    adds = "".join(f"red[{i}u * {WG}u + li] = red[{i}u * {WG}u + li] + red[{i}u * {WG}u + li + st]; "
                   for i in range(mt))
    out += (f"  for (var st = {tpr // 2}u; st > 0u; st = st >> 1u) {{\n    if (t < st) {{ {adds}}}\n"
            "    workgroupBarrier();\n  }\n")
    return out


UNITS_PER_THREAD = 4
"""Units each thread of a row decodes (at least, up to the 64-thread cap): enough work between loads and the
row's reduction; on lavapipe 4 beat 1, 2 and 8 (q4_0, q8_0, q4_k, f16 GEMVs with K from 576 to 2048)."""


def threads_per_row(units: int) -> int:
    """Threads sharing one row: the power of two covering ``units / UNITS_PER_THREAD``, at most 64."""
    tpr = 1
    while tpr * UNITS_PER_THREAD < units and tpr < 64:
        tpr *= 2
    return tpr


def tile_rows(m: int) -> int:
    """Activation rows per workgroup: 1 for a decode step, else the power of two covering M, at most 8."""
    mt = 1
    while mt < min(m, MAX_TILE):
        mt *= 2
    return mt


GEMV_HEAD = """struct P {{ rows: u32, units: u32, row_bytes: u32, m: u32, ldx: u32, ldy: u32, col0: u32, groups: u32,
           cm: u32, cn: u32, alpha: f32, beta: f32 }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> W: array<u32>;
@group(0) @binding(2) var<storage, read_write> X: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
{cbind}{dot}
var<workgroup> red: array<f32, {red}>;
"""
"""What both GEMV kernels declare: params (:func:`gemv_params`), bindings W, X, Y[, C], the row dot product and the
workgroup reduction array."""

GEMV = """// gemv {dtype} tpr={tpr} mt={mt} c={has_c} relu={relu}
"""+GEMV_HEAD+"""@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {{
  let g = wid.x + wid.y * nwg.x;
  let m0 = (g / p.groups) * {mt}u;
  let t = li % {tpr}u; let row = (g % p.groups) * {rpw}u + li / {tpr}u;
  var acc: array<f32, {mt}>;
  if (row < p.rows && m0 < p.m) {{
    acc = row_dot(row * p.row_bytes, m0 * p.ldx, p.ldx, min(p.m - m0, {mt}u), t, p.units);
  }}
{reduce}  if (t == 0u && row < p.rows) {{
    let col = p.col0 + row;
{store}  }}
}}
"""


GEMV_SG = """// gemv {dtype} tpr={tpr} mt={mt} c={has_c} relu={relu} subgroups
"""+GEMV_HEAD+"""@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>, @builtin(subgroup_id) sg: u32,
        @builtin(num_subgroups) nsg: u32) {{
  let g = wid.x + wid.y * nwg.x;
  let m0 = (g / p.groups) * {mt}u; let r0 = (g % p.groups) * {rpw}u;
  let lanes = subgroupAdd(1u); let rank = subgroupExclusiveAdd(1u);
  let per = max(1u, nsg / {rpw}u);
  var acc: array<f32, {mt}>;  // reset in the loop: naga initializes a loop-body `var` only once
  for (var job = sg; job < {rpw}u * per; job = job + nsg) {{
    let row = r0 + job % {rpw}u;
    acc = array<f32, {mt}>();
    if (row < p.rows && m0 < p.m) {{
      acc = row_dot(row * p.row_bytes, m0 * p.ldx, p.ldx, min(p.m - m0, {mt}u), (job / {rpw}u) * lanes + rank,
                    p.units, per * lanes);
    }}
{sgsum}  }}
  workgroupBarrier();
  let row = r0 + li;
  if (li < {rpw}u && row < p.rows) {{
    let col = p.col0 + row;
    var tot: array<f32, {mt}>;
    for (var q = 0u; q < per; q = q + 1u) {{
{total}    }}
{store}  }}
}}
"""
"""The GEMV on subgroups. WGSL promises nothing about which local invocations form a subgroup or in which lane
order, so work goes by subgroup, not by ``local_invocation_index``: the workgroup's ``rpw`` rows are split into
``per = max(1, num_subgroups / rpw)`` parts, and subgroup ``subgroup_id`` takes jobs ``subgroup_id,
+num_subgroups, ...`` (job = part * rpw + row). Inside a job the lanes are numbered by ``subgroupExclusiveAdd(1)``
among the active ones (dense even in a partial subgroup) and stride over the row's units by
``per * subgroupAdd(1)``; ``subgroupAdd`` then sums the job and the subgroup's first lane writes it to
``red[job]``, a slot no other subgroup writes. After one barrier, thread ``li < rpw`` adds its row's ``per``
parts. Correct for any lane mapping and subgroup size, no atomics, one barrier instead of log2(tpr).

Naga (wgpu-native) rejects the ``enable subgroups;`` directive ("not yet implemented") and accepts the built-ins
when the device has the feature, so the source carries no directive; a browser's Tint would need it first."""


def _gemv_store(mt: int, has_c: bool, relu: bool, total: str) -> str:
    """The statements that write a row's ``mt`` results (``total`` formats the row sum of activation row {i})."""
    store = ""
    for i in range(mt):
        v = "p.alpha * " + total.format(i=i)
        if has_c:
            v += f" + p.beta * C[(m0 + {i}u) * p.cm + col * p.cn]"
        if relu:
            v = f"max({v}, 0.0)"
        store += f"    if (m0 + {i}u < p.m) {{ Y[(m0 + {i}u) * p.ldy + col] = {v}; }}\n"
    return store


def gemv_source(dec: Decoder, tpr: int, mt: int, has_c: bool = False, relu: bool = False,
                subgroups: bool = False) -> str:
    """The GEMV kernel over a packed weight (bindings: W, X, Y[, C]); params in the order of :func:`gemv_params`.
    ``subgroups``: the :data:`GEMV_SG` variant (the device must have the ``subgroup`` feature); the same
    bindings, params and dispatch size, the same sums up to f32 reassociation."""
    cbind = "@group(0) @binding(4) var<storage, read_write> C: array<f32>;\n" if has_c else ""
    common = dict(dtype=dec.dtype.value, tpr=tpr, mt=mt, has_c=int(has_c), relu=int(relu), cbind=cbind,
                  red=WG * mt, wg=WG, rpw=WG // tpr)
    if not subgroups:
        return GEMV.format(**common, dot=row_dot_wgsl(dec, tpr, mt), reduce=reduce_wgsl(tpr, mt),
                           store=_gemv_store(mt, has_c, relu, "red[{i}u * " + f"{WG}u + li]"))
    sgsum = "".join(f"    let s{i} = subgroupAdd(acc[{i}]);\n" for i in range(mt))
    sgsum += "    if (rank == 0u) { " + "".join(f"red[{i}u * {WG}u + job] = s{i}; " for i in range(mt)) + "}\n"
    total = "".join(f"      tot[{i}] = tot[{i}] + red[{i}u * {WG}u + q * {WG // tpr}u + li];\n" for i in range(mt))
    return GEMV_SG.format(**common, dot=row_dot_wgsl(dec, tpr, mt, strided=True), sgsum=sgsum, total=total,
                          store=_gemv_store(mt, has_c, relu, "tot[{i}]"))


def gemv_params(rows: int, k: int, row_bytes: int, m: int, n: int, col0: int, tpr: int, *, cm: int = 0,
                cn: int = 0, alpha: float = 1.0, beta: float = 0.0) -> list[int | float]:
    return [rows, k // UNIT, row_bytes, m, k // 4, n, col0, -(-rows // (WG // tpr)), cm, cn, float(alpha),
            float(beta)]


def gemv(ctx: Lower, a: str, w_name: str, y: str, *, relu: bool = False, alpha: float = 1.0, beta: float = 0.0,
         c: str = "") -> None:
    """Y[M, N] = alpha * A[M, K] @ W[N, K]^T (+ beta * C) (relu), one dispatch per row shard of W."""
    w = ctx.packed(w_name)
    dec = decoder(w.dtype, f"node {ctx.node!r}")
    n, k = w.shape
    m = ctx.count(a) // k
    tpr, mt = threads_per_row(k // UNIT), tile_rows(m)
    src = gemv_source(dec, tpr, mt, bool(c), relu, ctx.dev.subgroups)
    cm, cn = _c_strides(ctx, c, m, n)
    tiles = -(-m // mt)
    for s in w.shards:
        rows = s.stop - s.start
        params = gemv_params(rows, k, w.row_bytes, m, n, s.start, tpr, cm=cm, cn=cn, alpha=alpha, beta=beta)
        regions = [s.region, ctx.region(a), ctx.region(y)] + ([ctx.region(c)] if c else [])
        ctx.dispatch(src, regions, params, int(params[7]) * tiles)


def packed_ok(ctx: Lower, a: str, b: str, transposed: bool) -> bool:
    """Whether ``A @ B^T`` runs on the GEMV kernel: B a 2-D weight stored [N, K] in a decodable type, K made of
    whole 32-value units (plain types with another K take the tiled kernel)."""
    if not (transposed and ctx.is_weight(b) and len(ctx.shape(b)) == 2 and ctx.dtype(b) in SUPPORTED):
        return False
    k = ctx.shape(b)[1]
    return bool(ctx.shape(a)) and ctx.shape(a)[-1] == k and (ctx.dtype(b) not in PLAIN or k % UNIT == 0)


def _c_strides(ctx: Lower, c: str, m: int, n: int) -> tuple[int, int]:
    """Element strides of a bias C broadcast to [M, N] (0 along broadcast axes)."""
    if not c:
        return 0, 0
    cm, cn = broadcast_strides(ctx.shape(c), (m, n))
    return cm, cn


# --- the tiled f32 kernel -----------------------------------------------------------------------------------
TILED = """// matmul tiled c={has_c} relu={relu}
struct P {{ m: u32, n: u32, k: u32, tm: u32, tn: u32, nb: u32, sam: u32, sak: u32, sbk: u32, sbn: u32, cm: u32,
           cn: u32, alpha: f32, beta: f32, a0: u32, flags: u32, bshape: vec4<u32>, astr: vec4<u32>, bstr: vec4<u32> }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> A: array<f32>;
@group(0) @binding(2) var<storage, read_write> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
{cbind}
var<workgroup> ta: array<f32, 256>;
var<workgroup> tb: array<f32, 256>;
@compute @workgroup_size(16, 16)
fn main(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {{
  let g = wid.x + wid.y * nwg.x;
  if (g >= p.nb * p.tm * p.tn) {{ return; }}
  let rest = g / p.tn; let bat = rest / p.tm;
  var rem = bat; var ao = 0u; var bo = 0u;
  for (var d = 3; d >= 0; d = d - 1) {{
    let c = rem % p.bshape[d]; rem = rem / p.bshape[d];
    ao = ao + c * p.astr[d]; bo = bo + c * p.bstr[d];
  }}
  let row = (rest % p.tm) * 16u + l.y; let col = (g % p.tn) * 16u + l.x;
  var acc = 0.0;
  for (var k0 = 0u; k0 < p.k; k0 = k0 + 16u) {{
    let ka = k0 + l.x; let kb = k0 + l.y;
    ta[l.y * 16u + l.x] = select(0.0, A[p.a0 + ao + row * p.sam + ka * p.sak], row < p.m && ka < p.k);
    tb[l.y * 16u + l.x] = select(0.0, B[bo + kb * p.sbk + col * p.sbn], kb < p.k && col < p.n);
    workgroupBarrier();
    for (var kk = 0u; kk < 16u; kk = kk + 1u) {{ acc = acc + ta[l.y * 16u + kk] * tb[kk * 16u + l.x]; }}
    workgroupBarrier();
  }}
  if (row < p.m && col < p.n) {{
    var v = p.alpha * acc;
    let at = bat * p.m * p.n + row * p.n + col;
    if ((p.flags & 1u) == 0u) {{ v = v + Y[at]; }}
{epilogue}    Y[at] = v;
  }}
}}
"""


def tiled(ctx: Lower, a: str, b: str, y: str, *, trans_a: bool = False, trans_b: bool = False, relu: bool = False,
          alpha: float = 1.0, beta: float = 0.0, c: str = "") -> None:
    """Y = alpha * op(A) @ op(B) (+ beta * C) with NumPy batch broadcasting (up to 4 batch dims), f32."""
    sa, sb = ctx.shape(a), ctx.shape(b)
    if len(sa) == 1:
        sa = (1, *sa)
    m, k = (sa[-1], sa[-2]) if trans_a else (sa[-2], sa[-1])
    n = sb[-2] if trans_b else sb[-1]
    ba, bb = sa[:-2], sb[:-2]
    nd = max(len(ba), len(bb))
    if nd > 4:
        raise BackendError(f"[backend] webgpu: node {ctx.node!r}: {nd} batch dims, the matmul kernel takes at most 4")
    bout = tuple(max(x, z) for x, z in zip((1,) * (nd - len(ba)) + ba, (1,) * (nd - len(bb)) + bb, strict=True))
    nb = int(np.prod(bout, dtype=np.int64))
    tm, tn = -(-m // 16), -(-n // 16)
    sam, sak = (1, m) if trans_a else (k, 1)
    sbk, sbn = (1, k) if trans_b else (n, 1)
    cm, cn = _c_strides(ctx, c, m, n)
    batch = [*((1,) * (4 - nd) + bout), *(m * k * s for s in broadcast_strides(ba, (1,) * 4)),
             *(k * n * s for s in broadcast_strides(bb, (1,) * 4))]
    epilogue = ("    else { v = v + p.beta * C[row * p.cm + col * p.cn]; }\n" if c else "") + \
        ("    if ((p.flags & 2u) != 0u) { v = max(v, 0.0); }\n" if relu else "")
    cbind = "@group(0) @binding(4) var<storage, read_write> C: array<f32>;" if c else ""
    src = TILED.format(has_c=int(bool(c)), relu=int(relu), cbind=cbind, epilogue=epilogue)
    parts = _k_parts(ctx, b, k, trans_b)
    for i, (br, k0, kk) in enumerate(parts):
        flags = int(i == 0) | (int(i == len(parts) - 1) << 1)
        params = [m, n, kk, tm, tn, nb, sam, sak, sbk, sbn, cm, cn, float(alpha), float(beta), k0 * sak, flags,
                  *batch]
        regions = [ctx.region(a), br, ctx.region(y)] + ([ctx.region(c)] if c else [])
        ctx.dispatch(src, regions, params, nb * tm * tn)


def _k_parts(ctx: Lower, b: str, k: int, trans_b: bool) -> list[tuple[Region, int, int]]:
    """B as (region, first k, count of k) parts: an f32 weight stored [K, N] larger than one storage binding, or
    streamed (then in chunks of its staging buffer), comes in its row shards, which the kernel sums into Y one after
    another (ONNX keeps lm_heads that way); any other B is read whole."""
    if ctx.is_weight(b) and not trans_b and len(ctx.shape(b)) == 2 and ctx.dtype(b) is DType.F32 \
            and (4 * ctx.count(b) > ctx.dev.max_binding or ctx.is_streamed(b)):
        return [(s.region, s.start, s.stop - s.start) for s in ctx.packed(b).shards]
    return [(ctx.region(b), 0, k)]


# --- lowerings ------------------------------------------------------------------------------------------------
def _product(ctx: Lower, a: str, b: str, y: str, transpose_b: bool, relu: bool) -> None:
    if packed_ok(ctx, a, b, transpose_b):
        gemv(ctx, a, b, y, relu=relu)
    else:
        tiled(ctx, a, b, y, trans_b=transpose_b, relu=relu)


def matmul(ctx: Lower, info: NodeInfo) -> None:
    node = info.node
    _product(ctx, node.inputs[0], node.inputs[1], node.outputs[0], bool(info.attrs.get("transpose_b")),
             node.op == "MatMulRelu")


def grouped_matmul(ctx: Lower, info: NodeInfo) -> None:
    """One product per weight; the GEMV kernel reads A from the arena for each (A is small next to the weights)."""
    node = info.node
    tb = bool(info.attrs.get("transpose_b"))
    for w, y in zip(node.inputs[1:], node.outputs, strict=True):
        if y:
            _product(ctx, node.inputs[0], w, y, tb, False)


def gemm(ctx: Lower, info: NodeInfo) -> None:
    node = info.node
    a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
    c = node.inputs[2] if len(node.inputs) > 2 else ""
    at = info.attrs
    alpha = float(at.get("alpha", 1.0))
    beta = float(at.get("beta", 1.0)) if c else 0.0
    ta, tb = bool(at.get("transA")), bool(at.get("transB"))
    if not ta and packed_ok(ctx, a, b, tb):
        gemv(ctx, a, b, y, alpha=alpha, beta=beta, c=c)
    else:
        tiled(ctx, a, b, y, trans_a=ta, trans_b=tb, alpha=alpha, beta=beta, c=c)


LOWERINGS: dict[str, Lowering] = {"MatMul": matmul, "MatMulRelu": matmul, "GroupedMatMul": grouped_matmul,
                                  "Gemm": gemm}

__all__ = ["GEMV_SG", "LOWERINGS", "gemv", "gemv_params", "gemv_source", "packed_ok", "reduce_wgsl", "row_dot_wgsl",
           "threads_per_row", "tile_rows", "tiled"]

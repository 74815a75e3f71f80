"""Reductions: ReduceMean (any axes, keepdims), TopK (values and i64 indices) and ArgMax.

ReduceMean splits the input's dims into kept and reduced groups (each coalesced). When the reduced group holds the
innermost contiguous dim, one workgroup sums one output (coalesced reads along the row, tree in workgroup memory);
otherwise one thread sums one output, which keeps reads coalesced across neighbouring outputs (pooling over tokens).

TopK and ArgMax run one workgroup per searched line. Each of the k rounds finds the best element *after* the last
one chosen in the total order (value, then lower index first) — a strided scan and a tree in workgroup memory — so
nothing is marked or sorted and ties come out lowest index first, as the reference's stable sort gives. The cost is
k scans of the line: right for ArgMax, router top-k and sampling's small k, not for a k in the thousands. NaN orders
above every number (NumPy's argsort/argmax put it first when searching the largest).
"""

from __future__ import annotations

import numpy as np

from uaii.backends.analysis import NodeInfo
from uaii.backends.webgpu.lower import Lower, Lowering
from uaii.backends.webgpu.ops.elementwise import INDEX, coalesce, contiguous, device_type, store_fn, vec8
from uaii.backends.webgpu.ops.norm import REDUCE, WG
from uaii.backends.webgpu.program import Region

MEAN = """// reduce_mean {dtype} {mode}
struct P {{ nout: u32, nred: u32, kr: u32, rr: u32, inv: f32, _a: u32, _b: u32, _c: u32,
           ks: vec4<u32>, ks2: vec4<u32>, kt: vec4<u32>, kt2: vec4<u32>,
           rs: vec4<u32>, rs2: vec4<u32>, rt: vec4<u32>, rt2: vec4<u32> }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
{helpers}
fn at(o: u32, r: u32) -> f32 {{
  return x[offset8(o, p.kr, p.ks, p.ks2, p.kt, p.kt2) + offset8(r, p.rr, p.rs, p.rs2, p.rt, p.rt2)];
}}
{body}
"""

MEAN_ROW = REDUCE + f"""@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {{
  let o = wid.x + wid.y * nwg.x;
  if (o >= p.nout) {{ return; }}
  var acc = 0.0;
  for (var r = lid.x; r < p.nred; r = r + {WG}u) {{ acc = acc + at(o, r); }}
  let total = wg_sum(acc, lid.x);
  if (lid.x == 0u) {{ y[o] = rnd(total * p.inv); }}
}}"""

MEAN_COL = f"""@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let o = gid.x + gid.y * nwg.x * {WG}u;
  if (o >= p.nout) {{ return; }}
  var acc = 0.0;
  for (var r = 0u; r < p.nred; r = r + 1u) {{ acc = acc + at(o, r); }}
  y[o] = rnd(acc * p.inv);
}}"""


def reduce_mean(ctx: Lower, info: NodeInfo) -> None:
    x, y = info.node.inputs[0], info.node.outputs[0]
    shape = ctx.shape(x) or (1,)  # the mean of a scalar is the scalar
    rank = len(shape)
    axes = {int(a) % rank for a in (info.attrs.get("axes") or range(rank))}
    strides = contiguous(shape)
    kshape, (kstr,) = coalesce([shape[d] for d in range(rank) if d not in axes],
                               [strides[d] for d in range(rank) if d not in axes])
    rshape, (rstr,) = coalesce([shape[d] for d in sorted(axes)], [strides[d] for d in sorted(axes)])
    nout = int(np.prod(kshape, dtype=np.int64))
    nred = int(np.prod([shape[d] for d in axes], dtype=np.int64))
    if nout * nred == 0:
        return
    row = rstr[-1] == 1 and nred > 1
    dt = ctx.dtype(y)
    src = MEAN.format(dtype=dt.value, mode="row" if row else "col", helpers=INDEX + store_fn(dt),
                      body=MEAN_ROW if row else MEAN_COL)
    node = ctx.node
    params = [nout, nred, len(kshape), len(rshape), 1.0 / nred, 0, 0, 0, *vec8(node, kshape), *vec8(node, kstr),
              *vec8(node, rshape), *vec8(node, rstr)]
    ctx.dispatch(src, [ctx.region(x), ctx.region(y)], params, nout if row else -(-nout // WG))


SEARCH = """// topk {t} largest={largest} values={with_values}
struct P {{ lines: u32, n: u32, inner: u32, k: u32 }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<{t}>;
@group(0) @binding(2) var<storage, read_write> ind: array<i32>;
{values_decl}
var<workgroup> bv: array<{t}, {wg}>;
var<workgroup> bi: array<u32, {wg}>;
const NONE = 0xffffffffu;
{order}
// a (at index ia) comes before b (at ib): the better value, the lower index on ties; NONE comes last
fn before(a: {t}, ia: u32, b: {t}, ib: u32) -> bool {{
  if (ib == NONE) {{ return ia != NONE; }}
  if (ia == NONE) {{ return false; }}
  return better(a, b) || (!better(b, a) && ia < ib);
}}
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {{
  let line = wid.x + wid.y * nwg.x;
  if (line >= p.lines) {{ return; }}
  let l = lid.x;
  let outer = line / p.inner;
  let inn = line - outer * p.inner;
  let base = outer * p.n * p.inner + inn;
  let obase = outer * p.k * p.inner + inn;
  var pv: {t}; var pi = NONE;
  for (var t = 0u; t < p.k; t = t + 1u) {{
    var cv: {t}; var ci = NONE;
    for (var j = l; j < p.n; j = j + {wg}u) {{
      let v = x[base + j * p.inner];
      if ((pi == NONE || before(pv, pi, v, j)) && before(v, j, cv, ci)) {{ cv = v; ci = j; }}
    }}
    bv[l] = cv; bi[l] = ci;
    workgroupBarrier();
    for (var s = {half}u; s > 0u; s = s >> 1u) {{
      if (l < s && before(bv[l + s], bi[l + s], bv[l], bi[l])) {{ bv[l] = bv[l + s]; bi[l] = bi[l + s]; }}
      workgroupBarrier();
    }}
    pv = bv[0]; pi = bi[0];
    if (l == 0u) {{ ind[obase + t * p.inner] = i32(pi);{values_store} }}
    workgroupBarrier();
  }}
}}
"""

def _order(t: str, largest: bool) -> str:
    """WGSL ``better(a, b)``: a ranks before b by value. NaN is above every number: first when searching the
    largest, last when searching the smallest."""
    cmp = ">" if largest else "<"
    if t != "f32":
        return f"fn better(a: {t}, b: {t}) -> bool {{ return a {cmp} b; }}"
    top, low = ("a", "b") if largest else ("b", "a")
    return ("fn nan_(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u; }\n"
            f"fn better(a: f32, b: f32) -> bool {{\n  if (nan_({top})) {{ return !nan_({low}); }}\n"
            f"  if (nan_({low})) {{ return false; }}\n  return a {cmp} b;\n}}")


def search(ctx: Lower, info: NodeInfo, k: int, largest: bool, x: str, indices: Region,
           values: Region | None = None) -> None:
    """The k best elements along ``axis`` of ``x``, sorted, into ``indices`` (i32) and, when given, ``values``."""
    shape = ctx.shape(x)
    axis = int(info.attrs.get("axis", -1)) % len(shape)
    n = shape[axis]
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    lines = int(np.prod(shape[:axis], dtype=np.int64)) * inner
    if lines * k == 0:
        return
    t = device_type(ctx.dtype(x))
    wg = 64 if n <= 64 else WG  # small lines (router logits over experts) leave no idle threads
    src = SEARCH.format(t=t, largest=largest, with_values=values is not None, wg=wg, half=wg // 2,
                        order=_order(t, largest),
                        values_decl=f"@group(0) @binding(3) var<storage, read_write> vals: array<{t}>;"
                        if values is not None else "",
                        values_store=" vals[obase + t * p.inner] = pv;" if values is not None else "")
    regions = [ctx.region(x), indices] + ([values] if values is not None else [])
    ctx.dispatch(src, regions, [lines, n, inner, k], lines)


def topk(ctx: Lower, info: NodeInfo) -> None:
    outs = info.node.outputs
    values = outs[0]
    count = int(np.prod(ctx.shape(values or outs[1]), dtype=np.int64))
    # the kernel always writes indices: into scratch when the graph does not use them
    indices = ctx.region(outs[1]) if len(outs) > 1 and outs[1] else ctx.scratch(4 * count)
    search(ctx, info, int(info.attrs["k"]), bool(info.attrs["largest"]), info.node.inputs[0], indices,
           ctx.region(values) if values else None)


def argmax(ctx: Lower, info: NodeInfo) -> None:
    search(ctx, info, 1, True, info.node.inputs[0], ctx.region(info.node.outputs[0]))


LOWERINGS: dict[str, Lowering] = {"ReduceMean": reduce_mean, "TopK": topk, "ArgMax": argmax}

__all__ = ["LOWERINGS"]

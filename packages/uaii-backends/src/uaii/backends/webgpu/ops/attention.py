"""Attention: functional (past/present as values, an optional bool or additive mask) and cached (the node's K/V
live in a :class:`~uaii.backends.webgpu.kv_state.GpuKVState`), with causal and sliding-window masks, attention
sinks, softcap, a custom scale and GQA/MQA, as the reference (uaii.ir.reference.attention) computes it.

One workgroup per (query row, head): the query is loaded into workgroup memory, then keys are taken in chunks of
:data:`WG` — one invocation scores one key (visibility by positions, scale, softcap, mask), the chunk's max and sum
are reduced in workgroup memory, and each invocation rescales and accumulates its share of the output channels
(online softmax, so the context length is bounded by nothing but the cache). Under a causal mask keys past the
query's own position are not visited at all (slots are in position order, new tokens last).

Cached runs write the new K/V rows at slot ``used`` first (a separate dispatch: the attention workgroups read rows
that other workgroups would otherwise be writing), then attend over slots ``[0, used + seq)`` masking by the
positions the state keeps on the device. ``used`` and the sequence length change every step: those params are
callables, re-evaluated before each run (after :meth:`KVBook.prepare`, before :meth:`KVBook.advance`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from uaii.backends.analysis import NodeInfo
from uaii.backends.base import BackendError
from uaii.backends.webgpu.lower import Lower, Lowering
from uaii.backends.webgpu.ops.elementwise import MATH, broadcast_strides, store_fn
from uaii.backends.webgpu.program import Region
from uaii.ir import DType

WG = 64
NEG = "-3.0e38"
"""Score of a key that is not visible. Finite on purpose (WGSL implementations may assume finite math); a score
below -1e38 — an additive mask of -inf or of float32's lowest value — counts as masked too."""

ATTENTION = """// attention {kind}
struct P { units: u32, t: u32, hq: u32, hkv: u32, total: u32, qpos0: i32, causal: u32, window: u32,
           sinks: i32, scale: f32, softcap: f32, _a: u32, mstr: vec4<u32> };
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<{kt}>;
@group(0) @binding(3) var<storage, read_write> v: array<{kt}>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
{extra}
const D: u32 = {d}u;
const DV: u32 = {dv}u;
var<workgroup> qs: array<f32, {d}>;
var<workgroup> sc: array<f32, {wg}>;
var<workgroup> red: array<f32, {wg}>;
{rnd}{math}{loads}
fn reduce_max(lid: u32) -> f32 {
  for (var s = {wg}u / 2u; s > 0u; s = s / 2u) {
    if (lid < s) { red[lid] = max(red[lid], red[lid + s]); }
    workgroupBarrier();
  }
  let r = red[0];
  workgroupBarrier();
  return r;
}
fn reduce_sum(lid: u32) -> f32 {
  for (var s = {wg}u / 2u; s > 0u; s = s / 2u) {
    if (lid < s) { red[lid] = red[lid] + red[lid + s]; }
    workgroupBarrier();
  }
  let r = red[0];
  workgroupBarrier();
  return r;
}
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let unit = wid.x + wid.y * nwg.x;  // ((b * t + i) * hq + h)
  let live = unit < p.units;
  let h = unit % p.hq;
  let i = (unit / p.hq) % p.t;
  let b = unit / (p.hq * p.t);
  let g = h / (p.hq / p.hkv);
  let qp = p.qpos0 + i32(i);
  if (live) { for (var c = lid; c < D; c = c + {wg}u) { qs[c] = q[unit * D + c]; } }
  workgroupBarrier();
  var kend = p.total;
  if (p.causal != 0u) { kend = min(p.total, p.total - p.t + i + 1u); }
  var m = {neg};
  var l = 0.0;
  var acc: array<f32, {nc}>;
  for (var start = 0u; start < kend; start = start + {wg}u) {
    let j = start + lid;
    var s = {neg};
    if (live && j < kend) {
      let kp = {kpos};
      var ok = kp >= 0 && (p.causal == 0u || kp <= qp);
      if (p.window > 0u) { ok = ok && (qp - kp < i32(p.window) || kp < p.sinks); }
      {mask_ok}
      if (ok) {
        let kb = ((b * p.total + j) * p.hkv + g) * D;
        var dot = 0.0;
        for (var c = 0u; c < D; c = c + 1u) { dot = dot + qs[c] * kld(kb + c); }
        var z = dot * p.scale;
        if (p.softcap > 0.0) { z = p.softcap * tanh_(clamp(z / p.softcap, -15.0, 15.0)); }
        {mask_add}
        s = select({neg}, z, z > -1.0e38);
      }
    }
    red[lid] = s;
    workgroupBarrier();
    let m2 = max(m, reduce_max(lid));
    var w = 0.0;
    if (s > {neg}) { w = exp(s - m2); }
    sc[lid] = w;
    red[lid] = w;
    workgroupBarrier();
    let corr = exp(m - m2);
    l = l * corr + reduce_sum(lid);
    let cnt = min({wg}u, kend - start);
    for (var e = 0u; e < {nc}u; e = e + 1u) {
      let c = lid + e * {wg}u;
      if (c < DV) {
        var a = acc[e] * corr;
        for (var jj = 0u; jj < cnt; jj = jj + 1u) {
          a = a + sc[jj] * vld(((b * p.total + start + jj) * p.hkv + g) * DV + c);
        }
        acc[e] = a;
      }
    }
    m = m2;
    workgroupBarrier();
  }
  if (live) {
    for (var e = 0u; e < {nc}u; e = e + 1u) {
      let c = lid + e * {wg}u;
      if (c < DV) { y[unit * DV + c] = rnd(select(0.0, acc[e] / l, l > 0.0)); }
    }
  }
}
"""

LOADS = {
    "f32": "fn kld(i: u32) -> f32 { return k[i]; }\nfn vld(i: u32) -> f32 { return v[i]; }\n",
    "f16": "fn kld(i: u32) -> f32 { let w = unpack2x16float(k[i >> 1u]); return select(w.x, w.y, (i & 1u) == 1u); }\n"
           "fn vld(i: u32) -> f32 { let w = unpack2x16float(v[i >> 1u]); return select(w.x, w.y, (i & 1u) == 1u); }\n",
}

CONCAT = """// attention cache concat
struct P { n: u32, tot: u32, a: u32, rs: u32 };
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> z: array<f32>;
@group(0) @binding(3) var<storage, read_write> o: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  if (i >= p.n) { return; }
  let c = i % p.rs;
  let r = (i / p.rs) % p.tot;
  let b = i / (p.rs * p.tot);
  if (r < p.a) { o[i] = x[(b * p.a + r) * p.rs + c]; } else { o[i] = z[(b * (p.tot - p.a) + r - p.a) * p.rs + c]; }
}
"""
"""present = concat(past, new) along the sequence axis, per leading (batch) index."""


# --- the kernel's source and params -------------------------------------------------------------------------
def kernel_source(d: int, dv: int, out: DType, *, kv: str = "f32", kpos: bool = False, mask: str = "") -> str:
    """The attention kernel for head dims ``d``/``dv``: keys at positions ``kpos[j]`` (a cached state) or ``j``;
    ``mask``: "" | "bool" | "add"; ``kv``: how K/V are stored ("f16": two halves per u32 word)."""
    extra, kpos_expr, mask_ok, mask_add = "", "i32(j)", "", ""
    if kpos:
        extra = "@group(0) @binding(5) var<storage, read_write> kpos: array<i32>;"
        kpos_expr = "kpos[j]"
    midx = "b * p.mstr.x + h * p.mstr.y + i * p.mstr.z + j * p.mstr.w"
    if mask == "bool":
        extra = "@group(0) @binding(5) var<storage, read_write> mask: array<i32>;"
        mask_ok = f"ok = ok && mask[{midx}] != 0;"
    elif mask == "add":
        extra = "@group(0) @binding(5) var<storage, read_write> mask: array<f32>;"
        mask_add = f"z = z + mask[{midx}];"
    kind = f"d={d} dv={dv} kv={kv}{' cached' if kpos else ''}{' mask=' + mask if mask else ''}"
    return (ATTENTION.replace("{extra}", extra).replace("{kpos}", kpos_expr).replace("{mask_ok}", mask_ok)
            .replace("{mask_add}", mask_add).replace("{loads}", LOADS[kv]).replace("{rnd}", store_fn(out))
            .replace("{kt}", "u32" if kv == "f16" else "f32").replace("{kind}", kind)
            .replace("{d}", str(d)).replace("{dv}", str(dv)).replace("{nc}", str(-(-dv // WG)))
            .replace("{neg}", NEG).replace("{wg}", str(WG)).replace("{math}", MATH))


def scalar_params(info: NodeInfo, d: int) -> tuple[int, int, int, float, float]:
    """(causal, window, sinks, scale, softcap) of the node, as the kernel's params take them."""
    a = info.attrs
    scale = float(a["scale"]) or 1.0 / math.sqrt(d)
    return int(bool(a["causal"])), int(a["sliding_window"]), int(a["sinks"]), scale, float(a["softcap"])


def params(units: int, t: int, hq: int, hkv: int, total: int, qpos0: int, scalars: Sequence[int | float],
           mstr: Sequence[int] = (0, 0, 0, 0)) -> list[int | float]:
    causal, window, sinks, scale, softcap = scalars
    return [units, t, hq, hkv, total, qpos0, causal, window, sinks, float(scale), float(softcap), 0, *mstr]


# --- lowering ------------------------------------------------------------------------------------------------
def attention(ctx: Lower, info: NodeInfo) -> None:
    node = info.node
    kv = ctx.exe.kv
    if kv is not None and node.name in kv.layer:
        _cached(ctx, info, kv.layer[node.name])
    else:
        _functional(ctx, info)


def _heads(ctx: Lower, info: NodeInfo) -> tuple[int, int, int, int, int]:
    ins = info.node.inputs
    qs, ks, vs = ctx.shape(ins[0]), ctx.shape(ins[1]), ctx.shape(ins[2])
    t, hq, d = qs[-3:]
    hkv, dv = ks[-2], vs[-1]
    if hkv == 0 or hq % hkv:
        raise BackendError(f"[backend] webgpu: node {info.node.name!r} (Attention): q has {hq} heads, not a "
                           f"multiple of the {hkv} kv heads")
    return t, hq, hkv, d, dv


def _cached(ctx: Lower, info: NodeInfo, layer: int) -> None:
    node = info.node
    st = ctx.state
    if st is None:
        raise BackendError(f"[backend] node {node.name!r} (Attention) reads the KV cache: run the executable with a "
                           "state (Executable.new_state)")
    t, hq, hkv, d, dv = _heads(ctx, info)
    if t == 0:
        return
    if len(ctx.shape(node.inputs[0])) != 3:
        raise BackendError(f"[backend] webgpu: node {node.name!r} (Attention): a cached attention takes q as "
                           f"[seq, heads, dim], found {list(ctx.shape(node.inputs[0]))}")
    k_new, v_new = ctx.region(node.inputs[1]), ctx.region(node.inputs[2])
    st.write_rows(ctx, layer, k_new, v_new, t)
    scalars = scalar_params(info, d)
    src = kernel_source(d, dv, ctx.dtype(node.outputs[0]), kv=st.dtype, kpos=True)
    units = t * hq

    def run_params() -> list[int | float]:
        return params(units, t, hq, hkv, st.used + t, st.length, scalars)

    regions = [ctx.region(node.inputs[0]), st.k_region(layer), st.v_region(layer), ctx.region(node.outputs[0]),
               st.pos_region()]
    ctx.dispatch(src, regions, run_params, units)


def _functional(ctx: Lower, info: NodeInfo) -> None:
    node = info.node
    ins = [*node.inputs, *[""] * (6 - len(node.inputs))]
    outs = [*node.outputs, "", ""]
    t, hq, hkv, d, dv = _heads(ctx, info)
    qshape, kshape = ctx.shape(ins[0]), ctx.shape(ins[1])
    lead = qshape[:-3]
    if kshape[:-3] != lead or ctx.shape(ins[2])[:-3] != lead:
        raise BackendError(f"[backend] webgpu: node {node.name!r} (Attention): q {list(qshape)}, k {list(kshape)} "
                           f"and v {list(ctx.shape(ins[2]))} must have the same leading dims")
    batch = int(np.prod(lead, dtype=np.int64))
    past = ctx.shape(ins[3])[-3] if ins[3] else 0
    total = past + t
    keys = _present(ctx, ins[3], ins[1], outs[1], batch, past, t, hkv * d)
    values = _present(ctx, ins[4], ins[2], outs[2], batch, past, t, hkv * dv)
    units = batch * t * hq
    if units == 0:
        return
    mask, mstr = "", (0, 0, 0, 0)
    regions = [ctx.region(ins[0]), keys, values, ctx.region(outs[0])]
    if ins[5]:
        mask = "bool" if ctx.dtype(ins[5]) is DType.BOOL else "add"
        mstr = _mask_strides(node.name, ctx.shape(ins[5]), (*lead, hq, t, total))
        regions.append(ctx.region(ins[5]))
    src = kernel_source(d, dv, ctx.dtype(outs[0]), mask=mask)
    ctx.dispatch(src, regions, params(units, t, hq, hkv, total, past, scalar_params(info, d), mstr), units)


def _present(ctx: Lower, past: str, new: str, out: str, batch: int, n_past: int, t: int, row: int) -> Region:
    """The keys (or values) attended over: ``new`` alone, or concat(past, new) written into the present output
    (a scratch region when the node drops it); a requested present without a past is a copy of ``new``."""
    if not past and not out:
        return ctx.region(new)
    total = n_past + t
    dst = ctx.region(out) if out else ctx.scratch(4 * batch * total * row)
    n = batch * total * row
    if n:
        src_past = ctx.region(past) if past else ctx.region(new)
        ctx.dispatch(CONCAT, [src_past, ctx.region(new), dst], [n, total, n_past, row], -(-n // 256))
    return dst


def _mask_strides(node: str, mshape: tuple[int, ...], full: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Element strides of the mask broadcast to ``full`` = [..., heads, seq, total], as (batch, head, query, key);
    the leading dims must flatten to one batch stride (all broadcast, or all as in q)."""
    if len(mshape) > len(full) or any(m not in (1, f) for m, f in zip(mshape[::-1], full[::-1], strict=False)):
        raise BackendError(f"[backend] webgpu: node {node!r} (Attention): mask {list(mshape)} does not broadcast to "
                           f"{list(full)}")
    shape = (1,) * (len(full) - len(mshape)) + tuple(mshape)
    st = broadcast_strides(mshape, full)
    lead = [(s, x) for s, x in zip(st[:-3], full[:-3], strict=True) if x != 1]
    if lead and any(s != 0 for s, _ in lead) and shape[:-3] != full[:-3]:
        raise BackendError(f"[backend] webgpu: node {node!r} (Attention): mask {list(mshape)} broadcasts over only "
                           f"some of the leading dims of {list(full)}")
    batch = lead[-1][0] if lead else 0
    return batch, st[-3], st[-2], st[-1]


LOWERINGS: dict[str, Lowering] = {"Attention": attention}

__all__ = ["LOWERINGS", "kernel_source"]

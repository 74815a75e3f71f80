"""Normalizations: RMSNorm, AddRMSNorm (residual add + RMSNorm, the sum optional) and LayerNorm.

One workgroup per normalized row: its threads stride over the row (coalesced reads), reduce their partial sums in
workgroup memory, then scale the row. Rows beyond the per-dimension dispatch limit spill into ``y`` of the grid. The
weight (and bias) are read as f32 whatever their dtype; the output is rounded to its dtype in-shader (``rnd``), and
AddRMSNorm normalizes the sum *after* rounding it to A's dtype, as the unfused Add would have stored it.
"""

from __future__ import annotations

import numpy as np

from uaii.backends.analysis import NodeInfo
from uaii.backends.webgpu.lower import Lower, Lowering
from uaii.backends.webgpu.ops.elementwise import INDEX, broadcast_params, store_fn

WG = 256

REDUCE = f"""var<workgroup> red: array<f32, {WG}>;
fn wg_sum(v: f32, l: u32) -> f32 {{
  red[l] = v;
  workgroupBarrier();
  for (var s = {WG // 2}u; s > 0u; s = s >> 1u) {{
    if (l < s) {{ red[l] = red[l] + red[l + s]; }}
    workgroupBarrier();
  }}
  let r = red[0];
  workgroupBarrier();
  return r;
}}
"""
"""The sum of ``v`` over the workgroup (every thread gets it); callers stay in uniform control flow."""

HEAD = """@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {{
  let row = wid.x + wid.y * nwg.x;
  if (row >= p.rows) {{ return; }}
  let l = lid.x;
  let base = row * p.d;
"""

RMS = """// rmsnorm {dtype}
struct P {{ rows: u32, d: u32, eps: f32, unit: f32 }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
{helpers}
{head}
  var acc = 0.0;
  for (var j = l; j < p.d; j = j + {wg}u) {{ let v = x[base + j]; acc = acc + v * v; }}
  let inv = 1.0 / sqrt(wg_sum(acc, l) / f32(p.d) + p.eps);
  for (var j = l; j < p.d; j = j + {wg}u) {{ y[base + j] = rnd(x[base + j] * inv * (w[j] + p.unit)); }}
}}
"""

ADD_RMS = """// add_rmsnorm {dtype} sum={with_sum}
struct P {{ rows: u32, d: u32, eps: f32, unit: f32, _z: u32, rank: u32, _a: u32, _b: u32,
           oshape: vec4<u32>, oshape2: vec4<u32>, astr: vec4<u32>, astr2: vec4<u32>, bstr: vec4<u32>,
           bstr2: vec4<u32> }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
{sum_decl}
{helpers}
fn total(i: u32) -> f32 {{
  return rnd(a[offset8(i, p.rank, p.oshape, p.oshape2, p.astr, p.astr2)]
             + b[offset8(i, p.rank, p.oshape, p.oshape2, p.bstr, p.bstr2)]);
}}
{head}
  var acc = 0.0;
  for (var j = l; j < p.d; j = j + {wg}u) {{ let v = total(base + j); acc = acc + v * v;{sum_store} }}
  let inv = 1.0 / sqrt(wg_sum(acc, l) / f32(p.d) + p.eps);
  for (var j = l; j < p.d; j = j + {wg}u) {{ y[base + j] = rnd(total(base + j) * inv * (w[j] + p.unit)); }}
}}
"""

LAYER = """// layernorm {dtype} bias={with_bias}
struct P {{ rows: u32, d: u32, eps: f32, _a: u32 }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
{bias_decl}
{helpers}
{head}
  var acc = 0.0;
  for (var j = l; j < p.d; j = j + {wg}u) {{ acc = acc + x[base + j]; }}
  let mean = wg_sum(acc, l) / f32(p.d);
  var sq = 0.0;
  for (var j = l; j < p.d; j = j + {wg}u) {{ let c = x[base + j] - mean; sq = sq + c * c; }}
  let inv = 1.0 / sqrt(wg_sum(sq, l) / f32(p.d) + p.eps);
  for (var j = l; j < p.d; j = j + {wg}u) {{ y[base + j] = rnd((x[base + j] - mean) * inv * w[j]{bias_add}); }}
}}
"""


def _rows(shape: tuple[int, ...], first: int) -> tuple[int, int]:
    """(rows, row length) when dims ``first``.. are normalized together."""
    return int(np.prod(shape[:first], dtype=np.int64)), int(np.prod(shape[first:], dtype=np.int64))


def rms_norm(ctx: Lower, info: NodeInfo) -> None:
    x, wname = info.node.inputs[0], info.node.inputs[1]
    y = info.node.outputs[0]
    dt = ctx.dtype(y)
    rows, d = _rows(ctx.shape(y), len(ctx.shape(y)) - 1)
    if rows * d == 0:
        return
    src = RMS.format(dtype=dt.value, helpers=REDUCE + store_fn(dt), head=HEAD.format(wg=WG), wg=WG)
    unit = 1.0 if info.attrs.get("add_unit_offset") else 0.0
    ctx.dispatch(src, [ctx.region(x), ctx.region(wname), ctx.region(y)],
                 [rows, d, float(info.attrs["eps"]), unit], rows)


def add_rms_norm(ctx: Lower, info: NodeInfo) -> None:
    a, b, wname = info.node.inputs[:3]
    y = info.node.outputs[0]
    s = info.node.outputs[1] if len(info.node.outputs) > 1 else ""
    dt = ctx.dtype(y)
    shape = ctx.shape(y)
    rows, d = _rows(shape, len(shape) - 1)
    if rows * d == 0:
        return
    src = ADD_RMS.format(
        dtype=dt.value, with_sum=bool(s), helpers=REDUCE + INDEX + store_fn(dt), head=HEAD.format(wg=WG), wg=WG,
        sum_decl="@group(0) @binding(5) var<storage, read_write> sum: array<f32>;" if s else "",
        sum_store=" sum[base + j] = v;" if s else "")
    regions = [ctx.region(a), ctx.region(b), ctx.region(wname), ctx.region(y)] + ([ctx.region(s)] if s else [])
    unit = 1.0 if info.attrs.get("add_unit_offset") else 0.0
    ctx.dispatch(src, regions, [rows, d, float(info.attrs["eps"]), unit, 0, *broadcast_params(ctx, a, b, shape)],
                 rows)


def layer_norm(ctx: Lower, info: NodeInfo) -> None:
    x, wname = info.node.inputs[0], info.node.inputs[1]
    bias = info.node.inputs[2] if len(info.node.inputs) > 2 else ""
    y = info.node.outputs[0]
    dt = ctx.dtype(y)
    shape = ctx.shape(y)
    rows, d = _rows(shape, int(info.attrs["axis"]) % len(shape))
    if rows * d == 0:
        return
    src = LAYER.format(
        dtype=dt.value, with_bias=bool(bias), helpers=REDUCE + store_fn(dt), head=HEAD.format(wg=WG), wg=WG,
        bias_decl="@group(0) @binding(4) var<storage, read_write> bias: array<f32>;" if bias else "",
        bias_add=" + bias[j]" if bias else "")
    regions = [ctx.region(x), ctx.region(wname), ctx.region(y)] + ([ctx.region(bias)] if bias else [])
    ctx.dispatch(src, regions, [rows, d, float(info.attrs["eps"]), 0], rows)


LOWERINGS: dict[str, Lowering] = {"RMSNorm": rms_norm, "AddRMSNorm": add_rms_norm, "LayerNorm": layer_norm}

__all__ = ["LOWERINGS", "REDUCE"]

"""Softmax along any axis: X seen as [outer, n, inner], one workgroup per (outer, inner) row.

Each invocation keeps an online (max, sum) pair over its strided share of the row, the pairs are merged by a tree
in workgroup memory, and a second pass writes ``exp(x - max) / sum``: two reads of the row, no scratch buffer. Along
the last axis (inner = 1) consecutive invocations read consecutive elements.
"""

from __future__ import annotations

import numpy as np

from uaii.backends.analysis import NodeInfo
from uaii.backends.webgpu.lower import Lower, Lowering
from uaii.backends.webgpu.ops.elementwise import store_fn

WG = 256

SOFTMAX = """// softmax
struct P { rows: u32, n: u32, inner: u32, _a: u32 };
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
var<workgroup> wm: array<f32, {wg}>;
var<workgroup> ws: array<f32, {wg}>;
{rnd}
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let row = wid.x + wid.y * nwg.x;
  let live = row < p.rows;
  let base = (row / p.inner) * p.n * p.inner + row % p.inner;
  var m = -3.0e38;
  var s = 0.0;
  if (live) {
    for (var j = lid; j < p.n; j = j + {wg}u) {
      let v = x[base + j * p.inner];
      let m2 = max(m, v);
      s = s * exp(m - m2) + exp(v - m2);
      m = m2;
    }
  }
  wm[lid] = m;
  ws[lid] = s;
  workgroupBarrier();
  for (var k = {wg}u / 2u; k > 0u; k = k / 2u) {
    if (lid < k) {
      let ma = wm[lid]; let mb = wm[lid + k];
      let m2 = max(ma, mb);
      ws[lid] = ws[lid] * exp(ma - m2) + ws[lid + k] * exp(mb - m2);
      wm[lid] = m2;
    }
    workgroupBarrier();
  }
  let mx = wm[0];
  let inv = 1.0 / ws[0];
  if (live) {
    for (var j = lid; j < p.n; j = j + {wg}u) {
      let at = base + j * p.inner;
      y[at] = rnd(exp(x[at] - mx) * inv);
    }
  }
}
"""


def softmax(ctx: Lower, info: NodeInfo) -> None:
    x, y = info.node.inputs[0], info.node.outputs[0]
    shape = ctx.shape(x)
    axis = int(info.attrs["axis"]) % len(shape)
    n = shape[axis]
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    rows = outer * inner
    if rows == 0 or n == 0:
        return
    src = SOFTMAX.replace("{rnd}", store_fn(ctx.dtype(y))).replace("{wg}", str(WG))
    ctx.dispatch(src, [ctx.region(x), ctx.region(y)], [rows, n, inner, 0], rows)


LOWERINGS: dict[str, Lowering] = {"Softmax": softmax}

__all__ = ["LOWERINGS"]

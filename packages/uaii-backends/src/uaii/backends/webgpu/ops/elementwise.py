"""Element-wise ops: unary math, binary arithmetic with broadcasting."""

from __future__ import annotations

import numpy as np

from uaii.backends.analysis import NodeInfo
from uaii.backends.webgpu.lower import Lower, Lowering

WG = 256

BINARY = """// binary {op}
struct P {{ n: u32, rank: u32, _a: u32, _b: u32, oshape: vec4<u32>, oshape2: vec4<u32>,
           astr: vec4<u32>, astr2: vec4<u32>, bstr: vec4<u32>, bstr2: vec4<u32> }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> a: array<{t}>;
@group(0) @binding(2) var<storage, read_write> b: array<{t}>;
@group(0) @binding(3) var<storage, read_write> y: array<{t}>;
fn dim(v: vec4<u32>, w: vec4<u32>, i: u32) -> u32 {{ if (i < 4u) {{ return v[i]; }} return w[i - 4u]; }}
@compute @workgroup_size({wg})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = gid.x + gid.y * nwg.x * {wg}u;
  if (i >= p.n) {{ return; }}
  var rem = i; var ia = 0u; var ib = 0u;
  for (var d = i32(p.rank) - 1; d >= 0; d = d - 1) {{
    let s = dim(p.oshape, p.oshape2, u32(d));
    let c = rem % s; rem = rem / s;
    ia = ia + c * dim(p.astr, p.astr2, u32(d));
    ib = ib + c * dim(p.bstr, p.bstr2, u32(d));
  }}
  let x = a[ia]; let z = b[ib];
  y[i] = {expr};
}}
"""

BINARY_EXPR = {"Add": "x + z", "Sub": "x - z", "Mul": "x * z", "Div": "x / z"}


def _strides(shape: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    """Element strides of ``shape`` broadcast to ``out`` (0 along broadcast axes)."""
    full = (1,) * (len(out) - len(shape)) + tuple(shape)
    st, acc = [0] * len(out), 1
    for d in range(len(out) - 1, -1, -1):
        st[d] = acc if full[d] != 1 else 0
        acc *= full[d]
    return st


def _vec8(v: list[int]) -> list[int]:
    return [*v, *([0] * (8 - len(v)))] if len(v) <= 8 else v


def binary(ctx: Lower, info: NodeInfo) -> None:
    node = info.node
    a, b = node.inputs[0], node.inputs[1]
    y = node.outputs[0]
    out = ctx.shape(y)
    if len(out) > 8:
        raise ValueError(f"node {node.name!r}: rank {len(out)} > 8")
    kind = "f32" if ctx.dtype(y).is_float else "i32"
    expr = BINARY_EXPR[node.op]
    if kind == "i32" and node.op == "Div":
        expr = "select(x / z, 0, z == 0)"
    src = BINARY.format(op=node.op, t=kind, expr=expr, wg=WG)
    n = int(np.prod(out, dtype=np.int64))
    oshape = _vec8(list(out) or [1])
    params = [n, max(len(out), 1), 0, 0, *oshape, *_vec8(_strides(ctx.shape(a), out) or [0]),
              *_vec8(_strides(ctx.shape(b), out) or [0])]
    ctx.dispatch(src, [ctx.region(a), ctx.region(b), ctx.region(y)], params, -(-n // WG))


LOWERINGS: dict[str, Lowering] = {op: binary for op in BINARY_EXPR}

__all__ = ["LOWERINGS"]

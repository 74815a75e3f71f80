"""Gated linear units: SwiGLU and GeGLU (erf or tanh), from two inputs or from one packed ``[..., 2d]`` gate|up.

One thread per output element; the packed form reads gate at ``row * 2d + c`` and up at ``row * 2d + d + c``, so
the fused gate/up projection needs no split copy. The output is rounded to its dtype in-shader.
"""

from __future__ import annotations

from uaii.backends.analysis import NodeInfo
from uaii.backends.webgpu.lower import Lower, Lowering
from uaii.backends.webgpu.ops.elementwise import MATH, WG, store_fn

GLU = """// glu {op} {dtype} packed={packed}
struct P {{ n: u32, d: u32, _a: u32, _b: u32 }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> gate: array<f32>;
{up_decl}
@group(0) @binding({out}) var<storage, read_write> y: array<f32>;
{helpers}
@compute @workgroup_size({wg})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = gid.x + gid.y * nwg.x * {wg}u;
  if (i >= p.n) {{ return; }}
{load}
  y[i] = rnd({act}(g) * u);
}}
"""

SPLIT_LOAD = "  let g = gate[i]; let u = up[i];"
PACKED_LOAD = ("  let r = i / p.d; let c = i - r * p.d;\n"
               "  let g = gate[r * 2u * p.d + c]; let u = gate[r * 2u * p.d + p.d + c];")


def glu(ctx: Lower, info: NodeInfo) -> None:
    node = info.node
    gate = node.inputs[0]
    up = node.inputs[1] if len(node.inputs) > 1 else ""
    y = node.outputs[0]
    dt = ctx.dtype(y)
    n = ctx.count(y)
    if n == 0:
        return
    act = "silu" if node.op == "SwiGLU" else "gelu_tanh" if info.attrs.get("approximate") == "tanh" else "gelu_erf"
    src = GLU.format(op=node.op, dtype=dt.value, packed=not up, out=3 if up else 2, helpers=MATH + store_fn(dt),
                     up_decl="@group(0) @binding(2) var<storage, read_write> up: array<f32>;" if up else "",
                     load=SPLIT_LOAD if up else PACKED_LOAD, act=act, wg=WG)
    regions = [ctx.region(gate)] + ([ctx.region(up)] if up else []) + [ctx.region(y)]
    ctx.dispatch(src, regions, [n, ctx.shape(y)[-1], 0, 0], -(-n // WG))


LOWERINGS: dict[str, Lowering] = {"SwiGLU": glu, "GeGLU": glu}

__all__ = ["LOWERINGS"]

"""RoPE: rotary position embedding, every variant the schema has (adjacent or NeoX pairs, partial rotary dims,
linear / llama3 / yarn scaling, per-frequency factors), positions from an input broadcast over X's leading dims.

The frequencies are computed once on the host in float64 by the reference's formula
(:func:`uaii.backends.kv_book.rope_frequencies`) and handed to the device as turns per position in two f32 parts
(:func:`turns`). On the device the position's fractional turns are computed exactly and only then turned into an
angle in [-pi, pi] for ``cos``/``sin`` (:data:`ROPE_FNS`). Why: ``f32(position) * inv_freq`` loses ~position * 6e-8
radians (0.06 at position 1e6), and WGSL promises trigonometric accuracy only on [-pi, pi] — GPUs' fast sin/cos
degrade quickly outside it.

One invocation per output element computes its own pair partner's contribution, so the kernel never writes what
another invocation reads; :data:`ROPE_FNS` is shared with the KV cache's key re-rotation (webgpu/kv_state.py).
"""

from __future__ import annotations

import numpy as np

from uaii.backends.analysis import NodeInfo
from uaii.backends.base import BackendError
from uaii.backends.kv_book import rope_frequencies
from uaii.backends.webgpu.lower import Lower, Lowering
from uaii.backends.webgpu.ops.elementwise import broadcast_strides, coalesce, store_fn
from uaii.backends.webgpu.program import Region

WG = 256
MAX_LEAD = 4

ROPE_FNS = """fn rope_cs(pos: i32, g: vec2<f32>) -> vec2<f32> {
  let ph = f32(pos >> 12u) * 4096.0;
  let pl = f32(pos & 4095);
  let gh = bitcast<f32>(bitcast<u32>(g.x) & 0xfffff000u);
  let gl = g.x - gh;
  let t = fract(ph * gh) + fract(ph * gl) + fract(pl * gh) + fract(pl * gl) + fract(f32(pos) * g.y);
  let r = (t - round(t)) * 6.283185307179586;
  return vec2<f32>(cos(r), sin(r));
}
fn rope_k(c: u32, rot: u32, neox: u32) -> u32 { if (neox != 0u) { return c % (rot / 2u); } return c / 2u; }
fn rope_first(c: u32, rot: u32, neox: u32) -> bool { if (neox != 0u) { return c < rot / 2u; } return (c & 1u) == 0u; }
fn rope_partner(c: u32, rot: u32, neox: u32) -> u32 {
  if (neox != 0u) { if (c < rot / 2u) { return c + rot / 2u; } return c - rot / 2u; }
  return c ^ 1u;
}
fn rope_mix(first: bool, xc: f32, xp: f32, cs: vec2<f32>) -> f32 {
  return select(xp * cs.y + xc * cs.x, xc * cs.x - xp * cs.y, first);
}
"""
"""``rope_cs(pos, g)``: cos and sin of ``pos`` turns of frequency ``g = (hi, lo)`` (see :func:`turns`). The
fractional turns are exact: ``pos`` splits into 12-bit halves and ``hi`` into two 12-bit parts, so each partial
product is exact in f32 and so is its ``fract``; only their sum rounds. The angle handed to ``cos``/``sin`` is then
within [-pi, pi] and within ~1e-6 of the float64 reference's for any position below 2^24. Channel ``c < rot`` of a
head rotates with frequency ``rope_k`` and its partner channel ``rope_partner``: (first, partner) -> (first cos -
partner sin, first sin + partner cos)."""


def turns(inv_freq: np.ndarray) -> np.ndarray:
    """Angular frequencies (radians per position) as turns per position, each an f32 pair (hi, lo) whose sum holds
    the float64 value: what :data:`ROPE_FNS` reads, two floats per frequency."""
    g = np.asarray(inv_freq, np.float64).reshape(-1) / (2.0 * np.pi)
    hi = g.astype(np.float32)
    lo = (g - hi.astype(np.float64)).astype(np.float32)
    return np.ascontiguousarray(np.stack([hi, lo], axis=-1).reshape(-1))


ROPE = """// rope
struct P { n: u32, h: u32, d: u32, rot: u32, neox: u32, rank: u32, attn: f32, _a: u32,
           lshape: vec4<u32>, pstr: vec4<u32> };
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> pos: array<i32>;
@group(0) @binding(3) var<storage, read_write> inv: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
{fns}{rnd}
@compute @workgroup_size({wg})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * {wg}u;
  if (i >= p.n) { return; }
  let c = i % p.d;
  if (c >= p.rot) { y[i] = rnd(x[i]); return; }
  var row = i / (p.d * p.h);
  var pi = 0u;
  for (var a = i32(p.rank) - 1; a >= 0; a = a - 1) {
    let s = p.lshape[a];
    pi = pi + (row % s) * p.pstr[a];
    row = row / s;
  }
  let k = rope_k(c, p.rot, p.neox);
  let cs = rope_cs(pos[pi], vec2<f32>(inv[2u * k], inv[2u * k + 1u])) * p.attn;
  let first = rope_first(c, p.rot, p.neox);
  let xp = x[i - c + rope_partner(c, p.rot, p.neox)];
  y[i] = rnd(rope_mix(first, x[i], xp, cs));
}
"""


def inv_freq_region(ctx: Lower, info: NodeInfo, rot: int) -> Region:
    """The node's frequencies on the device as :func:`turns`, computed and uploaded once per executable. Frequency
    factors must be a weight or a constant (GGUF ``rope_freqs``, longrope factors): their host value is folded in."""
    node = info.node
    ff_name = node.inputs[2] if len(node.inputs) > 2 else ""
    ff = ctx.const(info, 2) if ff_name else None
    if ff_name and ff is None and not ctx.is_weight(ff_name):
        raise BackendError(f"[backend] webgpu: node {node.name!r} (RoPE): frequency factors {ff_name!r} are "
                           "computed in the graph; this backend folds them in on the host and needs a weight "
                           "or a constant")

    def build() -> np.ndarray:
        factors = ff
        if ff_name and factors is None:
            factors = np.asarray(ctx.host(ff_name), np.float32).reshape(-1)[:rot // 2]
        return turns(rope_frequencies(rot, info.attrs, factors))

    return ctx.derived(build, f"inv_freq{rot}")


def rope(ctx: Lower, info: NodeInfo) -> None:
    node, attrs = info.node, info.attrs
    x, pos, y = node.inputs[0], node.inputs[1], node.outputs[0]
    shape = ctx.shape(x)
    lead, h, d = shape[:-2], shape[-2], shape[-1]
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0:
        return
    rot = int(attrs["rotary_dims"]) or d
    if rot % 2 or rot > d:
        raise BackendError(f"[backend] webgpu: node {node.name!r} (RoPE): rotary_dims {rot} must be even and at "
                           f"most head_dim {d}")
    lshape, (pstr,) = coalesce(lead, broadcast_strides(ctx.shape(pos), lead))
    if len(lshape) > MAX_LEAD:
        raise BackendError(f"[backend] webgpu: node {node.name!r} (RoPE): positions {list(ctx.shape(pos))} over X "
                           f"{list(shape)} need {len(lshape)} index dims, the kernel handles {MAX_LEAD}")
    attn = float(attrs["attn_factor"]) if attrs["scaling_type"] == "yarn" else 1.0
    pad = [1] * (MAX_LEAD - len(lshape))
    params = [n, h, d, rot, int(attrs["mode"] == "neox"), len(lshape), attn, 0, *lshape, *pad, *pstr, *([0] * len(pad))]
    src = ROPE.replace("{fns}", ROPE_FNS).replace("{rnd}", store_fn(ctx.dtype(y))).replace("{wg}", str(WG))
    ctx.dispatch(src, [ctx.region(x), ctx.region(pos), inv_freq_region(ctx, info, rot), ctx.region(y)], params,
                 -(-n // WG))


LOWERINGS: dict[str, Lowering] = {"RoPE": rope}

__all__ = ["LOWERINGS", "ROPE_FNS", "inv_freq_region", "turns"]

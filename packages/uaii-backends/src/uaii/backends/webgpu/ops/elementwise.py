"""Element-wise ops: unary math (Neg, Relu, Silu, Gelu, Sigmoid, Tanh, Exp, Sqrt, Softcap) and binary arithmetic
with NumPy broadcasting (Add, Sub, Mul, Div); plus the WGSL pieces the other families share.

Why every kernel ends in ``rnd``: on the device a float is f32 whatever its declared dtype, but the reference rounds
each op's result to that dtype, and a later op sees the rounded value. So a kernel whose output is f16 or bf16 rounds
to it in-shader (round to nearest even, by bit operations: ``pack2x16float`` leaves rounding and overflow to the
implementation), and one whose output is an 8/16-bit integer wraps to it, as the host type would. Then a chain of
ops sees what the reference sees, not only the last one (``from_device`` rounds at the edge only).

Broadcasting: shapes and strides are coalesced on the host (unit dims dropped, contiguous neighbours merged), so the
common same-shape case indexes with one division and any rank whose merged form has at most 8 dims works.
"""

from __future__ import annotations

from collections.abc import Sequence

from uaii.backends.analysis import NodeInfo
from uaii.backends.base import BackendError
from uaii.backends.webgpu.lower import Lower, Lowering
from uaii.ir import DType

WG = 256
MAX_RANK = 8

# --- shared WGSL ------------------------------------------------------------------------------------------------
_F16 = """fn rnd(v: f32) -> f32 {
  let b = bitcast<u32>(v);
  let a = b & 0x7fffffffu;
  if (a > 0x7f800000u) { return v; }
  if (a >= 0x477ff000u) { return bitcast<f32>((b & 0x80000000u) | 0x7f800000u); }
  if (a < 0x38800000u) { return round(v * 16777216.0) * 5.9604644775390625e-8; }
  return bitcast<f32>((b + 0xfffu + ((b >> 13u) & 1u)) & 0xffffe000u);
}
"""
# f16: at or above 65520 rounds to inf; below 2^-14 the f16 grid is 2^-24 (round() is half-to-even in WGSL);
# in between, drop 13 mantissa bits with round-to-nearest-even.
_BF16 = """fn rnd(v: f32) -> f32 {
  let b = bitcast<u32>(v);
  if ((b & 0x7fffffffu) > 0x7f800000u) { return bitcast<f32>((b | 0x00400000u) & 0xffff0000u); }
  return bitcast<f32>((b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u);
}
"""
_WRAP = {DType.I8: "(v << 24u) >> 24u", DType.I16: "(v << 16u) >> 16u", DType.U8: "v & 255"}


def device_type(dtype: DType) -> str:
    """The WGSL element type a kernel reads a value of ``dtype`` as (u32 keeps unsigned order and division)."""
    if dtype.is_float:
        return "f32"
    return "u32" if dtype is DType.U32 else "i32"


def store_fn(dtype: DType) -> str:
    """WGSL ``fn rnd(v) -> v``: what storing a computed value as ``dtype`` does to it (see the module doc)."""
    if dtype is DType.F16:
        return _F16
    if dtype is DType.BF16:
        return _BF16
    t = device_type(dtype)
    return f"fn rnd(v: {t}) -> {t} {{ return {_WRAP.get(dtype, 'v')}; }}\n"


MATH = """fn sigm(v: f32) -> f32 { let e = exp(-abs(v)); let s = 1.0 / (1.0 + e); return select(e * s, s, v >= 0.0); }
fn silu(v: f32) -> f32 { return v * sigm(v); }
fn tanh_(v: f32) -> f32 {
  let a = abs(v);
  if (a < 0.625) {
    let z = v * v;
    return v + v * z * ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z
                         + 1.33314422036e-1) * z - 3.33332819422e-1);
  }
  return sign(v) * (1.0 - 2.0 / (exp(2.0 * min(a, 10.0)) + 1.0));
}
fn erfc_(z: f32) -> f32 {
  let t = 1.0 / (1.0 + 0.5 * z);
  let q = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (0.27886807
          + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
  return t * exp(q - z * z);
}
fn gelu_erf(v: f32) -> f32 {
  let c = 0.5 * erfc_(abs(v) * 0.70710678118654752);
  return v * select(c, 1.0 - c, v >= 0.0);
}
fn gelu_tanh(v: f32) -> f32 { return v * sigm(1.5957691216057308 * (v + 0.044715 * v * v * v)); }
"""
"""Activation helpers. sigmoid never overflows. tanh is Cephes' tanhf: an odd polynomial below 0.625 (the
builtin is only absolutely accurate there — lavapipe's tanh(1e-15) is 3e-8 — and some drivers return inf/inf = NaN
past ~44), 1 - 2 / (e^2|x| + 1) above, saturated where f32 is +-1 anyway. erfc is Numerical Recipes' erfcc
(fractional error < 1.2e-7 for every z >= 0), so gelu's negative tail keeps its relative precision; tanh-gelu is
x * sigmoid(2u), the same function without the cancellation of 1 + tanh(u)."""

INDEX = """fn dim8(v: vec4<u32>, w: vec4<u32>, i: u32) -> u32 { if (i < 4u) { return v[i]; } return w[i - 4u]; }
fn offset8(i: u32, rank: u32, s0: vec4<u32>, s1: vec4<u32>, t0: vec4<u32>, t1: vec4<u32>) -> u32 {
  var rem = i; var o = 0u;
  for (var d = i32(rank) - 1; d >= 0; d = d - 1) {
    let s = dim8(s0, s1, u32(d));
    o = o + (rem % s) * dim8(t0, t1, u32(d)); rem = rem / s;
  }
  return o;
}
"""
"""Element offset of the row-major index ``i`` of a box of shape (s0, s1) under strides (t0, t1). Strides may be
negative (passed as i32 bits): u32 arithmetic wraps, so the sum is right whenever the final offset is."""


# --- host side of the index math ----------------------------------------------------------------------------
def contiguous(shape: Sequence[int]) -> list[int]:
    """Row-major element strides of ``shape``."""
    st, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        st[d] = acc
        acc *= int(shape[d])
    return st


def broadcast_strides(shape: Sequence[int], out: Sequence[int]) -> list[int]:
    """Element strides of ``shape`` broadcast to ``out`` (0 along broadcast axes)."""
    full = (1,) * (len(out) - len(shape)) + tuple(shape)
    return [0 if full[d] == 1 else s for d, s in enumerate(contiguous(full))]


def coalesce(shape: Sequence[int], *strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """The same index map with unit dims dropped and neighbours merged where every stride list is contiguous
    across them (dim d+1 steps evenly into dim d); at least one dim remains."""
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    out_shape: list[int] = []
    out: list[list[int]] = [[] for _ in strides]
    for d in dims:
        if out_shape and all(s[d] * shape[d] == o[-1] for s, o in zip(strides, out, strict=True)):
            out_shape[-1] *= shape[d]
            for s, o in zip(strides, out, strict=True):
                o[-1] = s[d]
            continue
        out_shape.append(int(shape[d]))
        for s, o in zip(strides, out, strict=True):
            o.append(int(s[d]))
    if not out_shape:
        return [1], [[0] for _ in strides]
    return out_shape, out


def vec8(node: str, values: Sequence[int]) -> list[int]:
    """``values`` padded to the 8 slots of two vec4 params."""
    if len(values) > MAX_RANK:
        raise BackendError(f"[backend] webgpu: node {node!r} indexes {len(values)} dims after merging contiguous "
                           f"ones; the kernels take at most {MAX_RANK}")
    return [*values, *([0] * (MAX_RANK - len(values)))]


# --- unary --------------------------------------------------------------------------------------------------
UNARY = """// unary {op} {dtype}
struct P {{ n: u32, a: f32, _b: u32, _c: u32 }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<{t}>;
@group(0) @binding(2) var<storage, read_write> y: array<{t}>;
{helpers}
@compute @workgroup_size({wg})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = gid.x + gid.y * nwg.x * {wg}u;
  if (i >= p.n) {{ return; }}
  let v = x[i];
  y[i] = rnd({expr});
}}
"""

UNARY_EXPR = {
    "Neg": "-v", "Relu": "max(v, 0.0)", "Silu": "silu(v)", "Sigmoid": "sigm(v)", "Tanh": "tanh_(v)",
    "Exp": "exp(v)", "Sqrt": "select(sqrt(v), bitcast<f32>(0x7fc00000u), v < 0.0)", "Softcap": "p.a * tanh_(v / p.a)",
}
INT_EXPR = {("Neg", "i32"): "-v", ("Neg", "u32"): "0u - v", ("Relu", "i32"): "max(v, 0)", ("Relu", "u32"): "v"}


def unary_expr(op: str, attrs: dict[str, object]) -> str:
    """The WGSL expression of a float unary op on ``v`` (MATH helpers, ``p.a`` = the op's scalar attribute)."""
    if op == "Gelu":
        return "gelu_tanh(v)" if attrs.get("approximate") == "tanh" else "gelu_erf(v)"
    return UNARY_EXPR[op]


def unary(ctx: Lower, info: NodeInfo) -> None:
    node = info.node
    x, y = node.inputs[0], node.outputs[0]
    dt = ctx.dtype(y)
    t = device_type(dt)
    if t == "f32":
        expr = unary_expr(node.op, info.attrs)
    elif (node.op, t) in INT_EXPR:
        expr = INT_EXPR[(node.op, t)]
    else:
        raise BackendError(f"[backend] webgpu: node {node.name!r}: {node.op} of {dt.value} is not defined")
    n = ctx.count(y)
    if n == 0:
        return
    helpers = store_fn(dt) + (MATH if t == "f32" else "")
    src = UNARY.format(op=node.op, dtype=dt.value, t=t, helpers=helpers, expr=expr, wg=WG)
    cap = float(info.attrs.get("cap") or 0.0)
    ctx.dispatch(src, [ctx.region(x), ctx.region(y)], [n, cap, 0, 0], -(-n // WG))


# --- binary -------------------------------------------------------------------------------------------------
BINARY = """// binary {op} {dtype}
struct P {{ n: u32, rank: u32, _a: u32, _b: u32, oshape: vec4<u32>, oshape2: vec4<u32>,
           astr: vec4<u32>, astr2: vec4<u32>, bstr: vec4<u32>, bstr2: vec4<u32> }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> a: array<{t}>;
@group(0) @binding(2) var<storage, read_write> b: array<{t}>;
@group(0) @binding(3) var<storage, read_write> y: array<{t}>;
{helpers}
@compute @workgroup_size({wg})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = gid.x + gid.y * nwg.x * {wg}u;
  if (i >= p.n) {{ return; }}
  let x = a[offset8(i, p.rank, p.oshape, p.oshape2, p.astr, p.astr2)];
  let z = b[offset8(i, p.rank, p.oshape, p.oshape2, p.bstr, p.bstr2)];
  y[i] = rnd({expr});
}}
"""

BINARY_EXPR = {"Add": "x + z", "Sub": "x - z", "Mul": "x * z", "Div": "x / z"}
INT_DIV = "select(x / z, {zero}, z == {zero})"  # the reference refuses a zero divisor; never trap on the device


def broadcast_params(ctx: Lower, a: str, b: str, out: Sequence[int]) -> list[int]:
    """Params ``rank, 0, 0, shape[8], astr[8], bstr[8]`` of the coalesced broadcast of ``a`` and ``b`` to ``out``
    (the layout of BINARY's P after ``n``)."""
    shape, (sa, sb) = coalesce(list(out), broadcast_strides(ctx.shape(a), out), broadcast_strides(ctx.shape(b), out))
    return [len(shape), 0, 0, *vec8(ctx.node, shape), *vec8(ctx.node, sa), *vec8(ctx.node, sb)]


def binary(ctx: Lower, info: NodeInfo) -> None:
    node = info.node
    a, b = node.inputs[0], node.inputs[1]
    y = node.outputs[0]
    dt = ctx.dtype(y)
    t = device_type(dt)
    expr = BINARY_EXPR[node.op]
    if t != "f32" and node.op == "Div":
        expr = INT_DIV.format(zero="0u" if t == "u32" else "0")
    n = ctx.count(y)
    if n == 0:
        return
    src = BINARY.format(op=node.op, dtype=dt.value, t=t, helpers=INDEX + store_fn(dt), expr=expr, wg=WG)
    params = [n, *broadcast_params(ctx, a, b, ctx.shape(y))]
    ctx.dispatch(src, [ctx.region(a), ctx.region(b), ctx.region(y)], params, -(-n // WG))


LOWERINGS: dict[str, Lowering] = {**{op: binary for op in BINARY_EXPR},
                                  **{op: unary for op in (*UNARY_EXPR, "Gelu")}}

__all__ = ["INDEX", "LOWERINGS", "MATH", "MAX_RANK", "WG", "broadcast_params", "broadcast_strides", "coalesce",
           "contiguous", "device_type", "store_fn", "unary_expr", "vec8"]

"""WGSL decoders of every weight encoding the backend keeps packed on the device, and the dequantize kernel.

Why one library: GEMV, GEMM, Embedding, Gather, Cast and the MoE experts all read weights in their stored encoding
(GGUF blocks, f16/bf16 words, f32) and must agree bit for bit with the CPU's ``uaii.kernels.dequantize``. Each
decoder is a WGSL function over the binding ``W: array<u32>`` (blocks are not 4-byte aligned — q4_0 is 18 bytes —
so bytes are read from words with shifts)::

    fn unit(b: u32, u: u32, q: ptr<function, array<vec4<f32>, 8>>) -> vec4<f32>

decodes *unit* ``u`` — 32 consecutive values — of the block at byte ``b`` into ``q`` (value ``i`` is
``q[i / 4][i % 4]``) and returns ``(s0, s1, o0, o1)``: value ``i`` is ``s * q + o`` with the scale and offset of
its half (``i < 16`` or not). Two halves because q6_k, q2_k and q3_k scale every 16 values. Returning the scales
apart lets a dot product factor them out (``s * dot(q, x) + o * sum(x)``), while the dequantize kernel computes
``s * q + o`` in the same float operations, in the same order, as the C reference (``quant_ref.c``).

Plain types use 32-value units too (a "block" of 32 values), so every decoder has the same shape. f16 data decodes
with ``unpack2x16float`` (fast; a GPU may flush f16 subnormals, which the tests on lavapipe check it does not);
block scales decode with the exact integer conversion :data:`H2F`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from uaii.backends.analysis import NodeInfo
from uaii.backends.base import BackendError
from uaii.backends.webgpu.lower import Lower, Lowering
from uaii.backends.webgpu.ops.elementwise import store_fn
from uaii.backends.webgpu.program import Region
from uaii.ir import DType

HELPERS = """
fn ld(off: u32) -> u32 {
  let i = off >> 2u; let s = (off & 3u) * 8u;
  let lo = W[i];
  if (s == 0u) { return lo; }
  return (lo >> s) | (W[i + 1u] << (32u - s));
}
fn ld16(off: u32) -> u32 { return (W[off >> 2u] >> ((off & 2u) * 8u)) & 0xffffu; }
fn ld8(off: u32) -> u32 { return (W[off >> 2u] >> ((off & 3u) * 8u)) & 0xffu; }
fn h2f(h: u32) -> f32 {
  let e = (h >> 10u) & 31u; let m = h & 1023u; let s = (h & 0x8000u) << 16u;
  if (e == 0u) { return bitcast<f32>(s | bitcast<u32>(f32(m) * 5.9604644775390625e-8)); }
  if (e == 31u) { return bitcast<f32>(s | 0x7f800000u | (m << 13u)); }
  return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}
fn bytes4(w: u32) -> vec4<u32> { return vec4<u32>(w, w >> 8u, w >> 16u, w >> 24u) & vec4<u32>(255u); }
fn nib4(w: u32) -> vec4<u32> { return vec4<u32>(w, w >> 8u, w >> 16u, w >> 24u) & vec4<u32>(15u); }
fn sbytes4(w: u32) -> vec4<f32> {
  return vec4<f32>(vec4<i32>(bitcast<i32>(w << 24u), bitcast<i32>(w << 16u), bitcast<i32>(w << 8u),
                             bitcast<i32>(w)) >> vec4<u32>(24u));
}
fn bit4(h: u32, at: u32) -> vec4<u32> {
  return ((vec4<u32>(h) >> vec4<u32>(at, at + 1u, at + 2u, at + 3u)) & vec4<u32>(1u)) << vec4<u32>(4u);
}
fn sbyte(v: u32) -> f32 { return f32(bitcast<i32>(v << 24u) >> 24u); }
fn kscale(s: u32, j: u32) -> vec2<f32> {
  if (j < 4u) { return vec2<f32>(f32(ld8(s + j) & 63u), f32(ld8(s + j + 4u) & 63u)); }
  return vec2<f32>(f32((ld8(s + j + 4u) & 15u) | ((ld8(s + j - 4u) >> 6u) << 4u)),
                   f32((ld8(s + j + 4u) >> 4u) | ((ld8(s + j) >> 6u) << 4u)));
}
fn q3scale(s: u32, j: u32) -> f32 {
  let lo = select(ld8(s + j - 8u) >> 4u, ld8(s + j) & 15u, j < 8u);
  let hi = (ld8(s + 8u + (j & 3u)) >> (2u * (j >> 2u))) & 3u;
  return f32(i32(lo | (hi << 4u)) - 32);
}
"""

_HEAD = "fn unit(b: u32, u: u32, q: ptr<function, array<vec4<f32>, 8>>) -> vec4<f32> {\n"


def _lines(fmt: str, count: int = 4) -> str:
    return "".join("  " + fmt.format(j=j, j4=j + 4, o=4 * j, o16=4 * j + 16) + "\n" for j in range(count))


def _legacy(lead: str, body: str, count: int, ret: str) -> str:
    return _HEAD + lead + _lines(body, count) + f"  return {ret};\n}}\n"


_BODIES: dict[DType, str] = {
    DType.F32: _HEAD + _lines("(*q)[{j}] = bitcast<vec4<f32>>(vec4<u32>(W[(b >> 2u) + 4u * {j}u], "
                              "W[(b >> 2u) + 4u * {j}u + 1u], W[(b >> 2u) + 4u * {j}u + 2u], "
                              "W[(b >> 2u) + 4u * {j}u + 3u]));", 8) + "  return vec4<f32>(1.0, 1.0, 0.0, 0.0);\n}\n",
    DType.F16: _HEAD + _lines("(*q)[{j}] = vec4<f32>(unpack2x16float(W[(b >> 2u) + 2u * {j}u]), "
                              "unpack2x16float(W[(b >> 2u) + 2u * {j}u + 1u]));", 8)
    + "  return vec4<f32>(1.0, 1.0, 0.0, 0.0);\n}\n",
    DType.BF16: _HEAD + _lines("(*q)[{j}] = bitcast<vec4<f32>>(vec4<u32>(W[(b >> 2u) + 2u * {j}u] << 16u, "
                               "W[(b >> 2u) + 2u * {j}u] & 0xffff0000u, W[(b >> 2u) + 2u * {j}u + 1u] << 16u, "
                               "W[(b >> 2u) + 2u * {j}u + 1u] & 0xffff0000u));", 8)
    + "  return vec4<f32>(1.0, 1.0, 0.0, 0.0);\n}\n",
    DType.Q4_0: _legacy("  let d = h2f(ld16(b));\n",
                        "let w{j} = ld(b + 2u + {o}u); (*q)[{j}] = vec4<f32>(nib4(w{j})) - 8.0; "
                        "(*q)[{j4}] = vec4<f32>(nib4(w{j} >> 4u)) - 8.0;", 4, "vec4<f32>(d, d, 0.0, 0.0)"),
    DType.Q4_1: _legacy("  let d = h2f(ld16(b)); let m = h2f(ld16(b + 2u));\n",
                        "let w{j} = ld(b + 4u + {o}u); (*q)[{j}] = vec4<f32>(nib4(w{j})); "
                        "(*q)[{j4}] = vec4<f32>(nib4(w{j} >> 4u));", 4, "vec4<f32>(d, d, m, m)"),
    DType.Q5_0: _legacy("  let d = h2f(ld16(b)); let h = ld(b + 2u);\n",
                        "let w{j} = ld(b + 6u + {o}u); (*q)[{j}] = vec4<f32>(nib4(w{j}) | bit4(h, {o}u)) - 16.0; "
                        "(*q)[{j4}] = vec4<f32>(nib4(w{j} >> 4u) | bit4(h, {o16}u)) - 16.0;", 4,
                        "vec4<f32>(d, d, 0.0, 0.0)"),
    DType.Q5_1: _legacy("  let d = h2f(ld16(b)); let m = h2f(ld16(b + 2u)); let h = ld(b + 4u);\n",
                        "let w{j} = ld(b + 8u + {o}u); (*q)[{j}] = vec4<f32>(nib4(w{j}) | bit4(h, {o}u)); "
                        "(*q)[{j4}] = vec4<f32>(nib4(w{j} >> 4u) | bit4(h, {o16}u));", 4, "vec4<f32>(d, d, m, m)"),
    DType.Q8_0: _legacy("  let d = h2f(ld16(b));\n", "(*q)[{j}] = sbytes4(ld(b + 2u + {o}u));", 8,
                        "vec4<f32>(d, d, 0.0, 0.0)"),
    DType.Q4_K: _legacy("  let d = h2f(ld16(b)); let dm = h2f(ld16(b + 2u)); let sm = kscale(b + 4u, u);\n"
                        "  let qs = b + 16u + 32u * (u >> 1u); let sh = 4u * (u & 1u);\n",
                        "(*q)[{j}] = vec4<f32>(nib4(ld(qs + {o}u) >> sh));", 8,
                        "vec4<f32>(d * sm.x, d * sm.x, -(dm * sm.y), -(dm * sm.y))"),
    DType.Q5_K: _legacy("  let d = h2f(ld16(b)); let dm = h2f(ld16(b + 2u)); let sm = kscale(b + 4u, u);\n"
                        "  let qs = b + 48u + 32u * (u >> 1u); let sh = 4u * (u & 1u);\n",
                        "(*q)[{j}] = vec4<f32>(nib4(ld(qs + {o}u) >> sh) | (((bytes4(ld(b + 16u + {o}u)) >> "
                        "vec4<u32>(u)) & vec4<u32>(1u)) << vec4<u32>(4u)));", 8,
                        "vec4<f32>(d * sm.x, d * sm.x, -(dm * sm.y), -(dm * sm.y))"),
    DType.Q6_K: _legacy("  let d = h2f(ld16(b + 208u)); let hf = u >> 2u; let k = u & 3u;\n"
                        "  let ql = b + 64u * hf + 32u * (k & 1u); let sh = 4u * (k >> 1u);\n"
                        "  let qh = b + 128u + 32u * hf;\n"
                        "  let sc = b + 192u + 8u * hf + 2u * k;\n",
                        "(*q)[{j}] = vec4<f32>(vec4<i32>(nib4(ld(ql + {o}u) >> sh) | (((bytes4(ld(qh + {o}u)) >> "
                        "vec4<u32>(2u * k)) & vec4<u32>(3u)) << vec4<u32>(4u))) - vec4<i32>(32));", 8,
                        "vec4<f32>(d * sbyte(ld8(sc)), d * sbyte(ld8(sc + 1u)), 0.0, 0.0)"),
    DType.Q2_K: _legacy("  let d = h2f(ld16(b + 80u)); let dm = h2f(ld16(b + 82u)); let hf = u >> 2u; "
                        "let k = u & 3u;\n  let qs = b + 16u + 32u * hf; let s0 = ld8(b + 8u * hf + 2u * k); "
                        "let s1 = ld8(b + 8u * hf + 2u * k + 1u);\n",
                        "(*q)[{j}] = vec4<f32>((bytes4(ld(qs + {o}u)) >> vec4<u32>(2u * k)) & vec4<u32>(3u));", 8,
                        "vec4<f32>(d * f32(s0 & 15u), d * f32(s1 & 15u), -(dm * f32(s0 >> 4u)), "
                        "-(dm * f32(s1 >> 4u)))"),
    DType.Q3_K: _legacy("  let d = h2f(ld16(b + 108u)); let hf = u >> 2u; let k = u & 3u;\n"
                        "  let qs = b + 32u + 32u * hf;\n"
                        "  let bit = 4u * hf + k; let j0 = 8u * hf + 2u * k;\n",
                        "(*q)[{j}] = vec4<f32>(vec4<i32>((bytes4(ld(qs + {o}u)) >> vec4<u32>(2u * k)) & "
                        "vec4<u32>(3u)) - select(vec4<i32>(4), vec4<i32>(0), ((bytes4(ld(b + {o}u)) >> "
                        "vec4<u32>(bit)) & vec4<u32>(1u)) == vec4<u32>(1u)));", 8,
                        "vec4<f32>(d * q3scale(b + 96u, j0), d * q3scale(b + 96u, j0 + 1u), 0.0, 0.0)"),
}

_OFFSET = frozenset({DType.Q4_1, DType.Q5_1, DType.Q4_K, DType.Q5_K, DType.Q2_K})
PLAIN = frozenset({DType.F32, DType.F16, DType.BF16})
UNIT = 32
"""Values per unit: what one thread decodes at a time."""


@dataclass(frozen=True)
class Decoder:
    """How a dtype is laid out for the kernels: a block of ``block`` values in ``block_bytes`` bytes, made of
    ``units`` units of 32 values; ``scaled`` / ``offset``: whether ``unit`` returns scales / offsets to apply."""

    dtype: DType
    block: int
    block_bytes: int
    scaled: bool
    offset: bool

    @property
    def units(self) -> int:
        return self.block // UNIT

    @property
    def wgsl(self) -> str:
        """The helpers and the ``unit`` function (they read the binding ``W``)."""
        return HELPERS + _BODIES[self.dtype]

    def address(self, row_base: str, u: str) -> str:
        """WGSL arguments ``b, u`` of unit ``u`` (an expression) of the row starting at byte ``row_base``."""
        if self.units == 1:
            return f"{row_base} + ({u}) * {self.block_bytes}u, 0u"
        return f"{row_base} + (({u}) / {self.units}u) * {self.block_bytes}u, ({u}) % {self.units}u"

    def value(self, q: str, s: str, half: str) -> str:
        """WGSL of the dequantized vec4 ``q`` in ``half`` (0 or 1), in the C reference's float operations."""
        sc, of = ("x", "z") if half == "0" else ("y", "w")
        v = f"{s}.{sc} * {q}" if self.scaled else q
        return f"{v} + {s}.{of}" if self.offset else v


SUPPORTED = frozenset(_BODIES)


def decoder(dtype: DType, where: str = "") -> Decoder:
    """The decoder of ``dtype``; a type without one is a clear error naming the node."""
    if dtype not in _BODIES:
        known = ", ".join(sorted(d.value for d in _BODIES))
        raise BackendError(f"[backend] webgpu: {where or 'a kernel'} reads {dtype.value} data; the webgpu kernels "
                           f"decode {known}")
    if dtype in PLAIN:
        return Decoder(dtype, UNIT, UNIT * dtype.type_size, False, False)
    return Decoder(dtype, dtype.block_size, dtype.type_size, True, dtype in _OFFSET)


WG = 64

DEQUANT = """// dequantize {dtype}
struct P {{ units: u32, first: u32, out0: u32, _p: u32 }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> W: array<u32>;
@group(0) @binding(2) var<storage, read_write> Y: array<vec4<f32>>;
{lib}
@compute @workgroup_size({wg})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = gid.x + gid.y * nwg.x * {wg}u;
  if (i >= p.units) {{ return; }}
  let un = p.first + i;
  var q: array<vec4<f32>, 8>;
  let s = unit({addr}, &q);
  let o = p.out0 + i * 8u;
{store}}}
"""


def dequant_source(dtype: DType) -> str:
    """A kernel writing units ``first .. first+units`` of ``W`` (a flat run of blocks) as f32 at vec4 ``out0``."""
    dec = decoder(dtype)
    store = "".join(f"  Y[o + {j}u] = {dec.value(f'q[{j}]', 's', '0' if j < 4 else '1')};\n" for j in range(8))
    return DEQUANT.format(dtype=dtype.value, lib=dec.wgsl, wg=WG, addr=dec.address("0u", "un"), store=store)


ELEM = {
    DType.F32: "fn elem(e: u32) -> f32 { return bitcast<f32>(W[e]); }\n",
    DType.F16: "fn elem(e: u32) -> f32 { return unpack2x16float(W[e >> 1u])[e & 1u]; }\n",
    DType.BF16: "fn elem(e: u32) -> f32 { let w = W[e >> 1u]; "
                "return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (e & 1u) == 1u)); }\n",
}
"""``elem(e)``: element ``e`` of ``W`` for the plain types, whose rows need not hold whole 32-value units."""


def dequantize_region(ctx: Lower, src: Region, dtype: DType, n: int, out: Region, out_elem: int = 0) -> None:
    """Dispatch the dequantize kernel: ``n`` values of ``dtype`` at ``src`` into f32 at ``out`` from element
    ``out_elem`` (a multiple of 32)."""
    units = n // UNIT
    ctx.dispatch(dequant_source(dtype), [src, out], [units, 0, out_elem // 4, 0], -(-units // WG))


# --- Cast -----------------------------------------------------------------------------------------------------
CAST = """// cast {mode} {dst}
struct P {{ n: u32, lo: i32, hi: i32, lof: f32, hif: f32, _a: u32, _b: u32, _c: u32 }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> X: array<u32>;
@group(0) @binding(2) var<storage, read_write> Y: array<u32>;
{store}
@compute @workgroup_size({wg})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
  let i = gid.x + gid.y * nwg.x * {wg}u;
  if (i >= p.n) {{ return; }}
  let v = X[i];
{body}}}
"""

_CAST_BODY = {
    "f2f": "  Y[i] = bitcast<u32>(rnd(bitcast<f32>(v)));\n",
    "i2f": "  Y[i] = bitcast<u32>(rnd(f32(bitcast<i32>(v))));\n",
    "f2i": ("  let x = bitcast<f32>(v);\n  if ((v & 0x7fffffffu) > 0x7f800000u) { Y[i] = 0u; return; }\n"
            "  let r = round(x);\n  var o = p.lo;\n"
            "  if (r >= p.hif) { o = p.hi; } else if (r > p.lof) { o = i32(r); }\n"
            "  Y[i] = bitcast<u32>(o);\n"),
    "i2i": "  Y[i] = bitcast<u32>(clamp(bitcast<i32>(v), p.lo, p.hi));\n",
    "f2b": "  Y[i] = select(0u, 1u, (v & 0x7fffffffu) != 0u);\n",
    "i2b": "  Y[i] = select(0u, 1u, v != 0u);\n",
}
_INT_RANGE = {DType.I8: (-128, 127), DType.U8: (0, 255), DType.I16: (-32768, 32767)}


def cast_source(mode: str, dst: DType) -> str:
    """A float target rounds through elementwise's ``rnd`` (store_fn): what storing an f16/bf16 value does, NaN
    kept quiet, the same rounding every other op applies."""
    store = store_fn(dst) if mode[-1] == "f" else ""
    return CAST.format(mode=mode, dst=dst.value, store=store, wg=WG * 4, body=_CAST_BODY[mode])


def cast_range(dst: DType) -> list[int | float]:
    """``lo, hi, float(lo), float(hi)`` of an integer target as the device holds it (i32: wider types saturate
    to the i32 range, the device has no 64-bit integers)."""
    lo, hi = _INT_RANGE.get(dst, (0 if dst is DType.U32 else -(1 << 31), (1 << 31) - 1))
    return [lo, hi, float(np.float32(lo)), float(np.float32(hi))]


def cast(ctx: Lower, info: NodeInfo) -> None:
    """Cast on the device. A block-quantized input is dequantized in the shader first (then converted in place)."""
    node = info.node
    x, y = node.inputs[0], node.outputs[0]
    src, dst = ctx.dtype(x), DType.parse(str(info.attrs["to"]))
    n = ctx.count(y)
    yr = ctx.region(y)
    if src.is_quantized:
        if ctx.is_weight(x):
            w = ctx.packed(x)
            per_row = n // max(w.rows, 1)
            for s in w.shards:
                dequantize_region(ctx, s.region, src, (s.stop - s.start) * per_row, yr, s.start * per_row)
        else:
            dequantize_region(ctx, ctx.region(x), src, n, yr)
        if dst in (DType.F32, DType.F64):
            return
        xr, src = yr, DType.F32
    else:
        xr = ctx.region(x)
    kind = "f" if src.is_float else "i"
    out = "b" if dst is DType.BOOL else "f" if dst.is_float else "i"
    params = [n, *cast_range(dst), 0, 0, 0] if out == "i" else [n, 0, 0, 0.0, 0.0, 0, 0, 0]
    ctx.dispatch(cast_source(kind + "2" + out, dst), [xr, yr], params, -(-n // (WG * 4)))


__all__ = ["ELEM", "LOWERINGS", "PLAIN", "SUPPORTED", "UNIT", "Decoder", "cast", "decoder",
           "dequant_source", "dequantize_region"]

LOWERINGS: dict[str, Lowering] = {"Cast": cast}

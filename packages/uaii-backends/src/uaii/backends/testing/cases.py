"""The conformance cases: for every op of the registry, small graphs with random inputs and a stated tolerance.

A :class:`Case` is a one-node graph (plus, for the cached attention, a sequence of runs). Shapes cover a decode
step (one row) and a prefill batch; MatMul, GroupedMatMul, Embedding and the expert banks also run with
block-quantized weights, which the backend must keep packed while the reference sees them dequantized.

Tolerances are on the normalized error ``max|y - ref| / max(max|ref|, 1e-6)`` — float32 ops within ``F32``; f16 and
bf16 outputs within their rounding; products with quantized weights within ``Q8_ACT`` (the integer GEMM path
quantizes activations to 8 bits). Integer and boolean outputs must match exactly.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from uaii.ir import DType, Graph, Node, Tensor, attr, check, make_graph
from uaii.kernels import dequantize, quantize

F32 = 2e-5
LOW = 1e-2  # f16 / bf16 outputs
Q8_ACT = 3e-2


@dataclass(frozen=True)
class Case:
    """One conformance case. ``weights`` are what a store hands the backend (block types as raw bytes);
    ``ref_weights`` what the reference evaluator takes (block types dequantized). ``runs`` > 1 feeds
    ``feeds_seq`` one after another through a KV state."""

    op: str
    name: str
    graph: Graph
    feeds: dict[str, np.ndarray]
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    ref_weights: dict[str, np.ndarray] = field(default_factory=dict)
    tol: float = F32
    feeds_seq: tuple[dict[str, np.ndarray], ...] = ()

    @property
    def id(self) -> str:
        return f"{self.op}/{self.name}"


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def _values(rng: np.random.Generator, dtype: DType, shape: Sequence[int], low: float = -2.0,
            high: float = 2.0) -> np.ndarray:
    if dtype.is_integer:
        return rng.integers(-20, 20, size=shape).astype(dtype.numpy)
    x = rng.uniform(low, high, size=shape)
    if dtype is DType.BF16:
        from uaii.backends.cpu.bind import from_f32

        return from_f32(x.astype(np.float32), DType.BF16)
    return x.astype(dtype.numpy)


class Builder:
    """Declares a one-node graph: inputs (fed), weights (supplied by a store) and constants (inline)."""

    def __init__(self, op: str, name: str) -> None:
        self.op, self.name = op, name
        self.rng = _rng(f"{op}/{name}")
        self.tensors: list[Tensor] = []
        self.inputs: list[str] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.weights: dict[str, np.ndarray] = {}
        self.ref_weights: dict[str, np.ndarray] = {}

    def input(self, name: str, dtype: DType | str, shape: Sequence[int], value: np.ndarray | None = None,
              decl: Sequence[Any] | None = None, **kw: Any) -> str:
        dt = DType.parse(dtype)
        arr = value if value is not None else _values(self.rng, dt, shape, **kw)
        self.tensors.append(Tensor(name, dt, tuple(decl if decl is not None else arr.shape)))
        self.inputs.append(name)
        self.feeds[name] = arr
        return name

    def weight(self, name: str, dtype: DType | str, shape: Sequence[int], value: np.ndarray | None = None,
               **kw: Any) -> str:
        dt = DType.parse(dtype)
        if dt.is_quantized:
            f = value if value is not None else self.rng.uniform(-1, 1, size=shape).astype(np.float32)
            raw = quantize(f, dt)
            self.weights[name] = raw
            self.ref_weights[name] = dequantize(raw, dt, f.size).reshape(shape)
        else:
            arr = value if value is not None else _values(self.rng, dt, shape, **kw)
            self.weights[name] = self.ref_weights[name] = arr
        self.tensors.append(Tensor(name, dt, tuple(shape), is_weight=True))
        return name

    def const(self, name: str, array: np.ndarray) -> str:
        self.tensors.append(Tensor.constant(name, array))
        return name

    def case(self, ins: Sequence[str], outs: Sequence[tuple[str, DType | str, Sequence[Any]]],
             tol: float = F32, op: str | None = None, params: dict[str, Any] | None = None, **attrs: Any) -> Case:
        for name, dt, shape in outs:
            if name:
                self.tensors.append(Tensor(name, DType.parse(dt), tuple(shape)))
        node = Node(f"{self.name}/{op or self.op}", op or self.op, tuple(ins), tuple(o[0] for o in outs),
                    tuple((k, attr(v)) for k, v in {**(params or {}), **attrs}.items()))
        graph = make_graph(f"conformance.{self.op}.{self.name}", [node], self.tensors, self.inputs,
                           [o[0] for o in outs if o[0]])
        check(graph)
        return Case(self.op, self.name, graph, self.feeds, self.weights, self.ref_weights, tol)


def unary_case(op: str, name: str, dtype: str, shape: Sequence[int], low: float = -3.0, tol: float = F32,
               **attrs: Any) -> Case:
    b = Builder(op, name)
    x = b.input("x", dtype, shape, low=low, high=3.0)
    return b.case([x], [("y", dtype, shape)], tol, **attrs)


def binary_case(op: str, name: str, dtype: str, sa: Sequence[int], sb: Sequence[int], tol: float = F32,
                weight_b: bool = False) -> Case:
    b = Builder(op, name)
    a = b.input("a", dtype, sa)
    if weight_b:
        c = b.weight("b", dtype, sb)
    else:
        vals = _values(b.rng, DType.parse(dtype), sb)
        if op == "Div":
            vals = np.where(vals == 0, 3, vals).astype(vals.dtype) if DType.parse(dtype).is_integer else \
                np.where(np.abs(vals) < 0.25, 0.5, vals).astype(vals.dtype)
        c = b.input("b", dtype, sb, value=vals)
    out = tuple(np.broadcast_shapes(tuple(sa), tuple(sb)))
    return b.case([a, c], [("y", dtype, out)], tol)


# --- MatMulNBits: ONNX's block-quantized weights, kept packed ----------------------------------------------------
def _nbits_weights(b: Builder, n: int, k: int, bits: int, bs: int, zp: str, scale_dtype: str,
                   as_inputs: bool = False) -> list[str]:
    """B, scales and (zp: "u8", a float type, or "") zero points of a random [n, k] weight, as weights (or feeds)."""
    kb = -(-k // bs)
    put = b.input if as_inputs else b.weight
    names = [put("B", "u8", (n, kb, bs * bits // 8),
                 value=b.rng.integers(0, 256, (n, kb, bs * bits // 8)).astype(np.uint8)),
             put("scales", scale_dtype, (n * kb,),
                 value=_values(b.rng, DType.parse(scale_dtype), (n * kb,), 0.01, 0.05))]
    if zp == "u8":
        rows = -(-kb * bits // 8)
        names.append(put("zp", "u8", (n * rows,), value=b.rng.integers(0, 256, n * rows).astype(np.uint8)))
    elif zp:
        names.append(put("zp", zp, (n, kb), value=_values(b.rng, DType.parse(zp), (n, kb), 0, 2**bits - 1)))
    else:
        names.append("")
    return names


def matmul_nbits_cases() -> list[Case]:
    """Decode rows and batches; 4 and 8 bits; blocks of 16 to 256 with K not a multiple of the block (ORT pads the
    last one); packed, float and default zero points; a bias weight or a bias fed as an activation; f16 activations;
    B and scales fed as activations (not weights). At accuracy_level 0 (the default: A stays f32, as onnxruntime
    computes it) within F32; at level 4 (A may be quantized to int8) within Q8_ACT: the CPU's int8-activation path
    measured <= 1.1% normalized error on such inputs."""
    out = []
    for name, rows, k, n, bits, bs, zp, sdt, adt, bias, level in (
            ("q4_b32_zp_decode", (1,), 96, 40, 4, 32, "u8", "f32", "f32", "weight", 4),
            ("q4_b32_zp_prefill", (7,), 100, 24, 4, 32, "u8", "f32", "f32", "weight", 4),
            ("q8_b16_default", (5,), 40, 12, 8, 16, "", "f32", "f32", "", 4),
            ("q4_b128_float_zp", (2, 3), 200, 16, 4, 128, "f16", "f16", "f32", "input", 4),
            ("q4_b256_f16_act", (3,), 300, 8, 4, 256, "", "f32", "f16", "weight", 4),
            ("q8_b64_zp", (1, 4), 130, 20, 8, 64, "u8", "f16", "f32", "", 4),
            ("f32_q4_b32_zp_decode", (1,), 100, 40, 4, 32, "u8", "f32", "f32", "weight", 0),
            ("f32_q4_b16_zp_prefill", (9,), 200, 24, 4, 16, "u8", "bf16", "f32", "", 0),
            ("f32_q8_b64_default", (2, 3), 130, 20, 8, 64, "", "f16", "f32", "weight", 0),
            ("f32_q4_b128_float_zp", (4,), 300, 16, 4, 128, "f32", "f32", "f16", "input", 0)):
        b = Builder("MatMulNBits", name)
        a = b.input("a", adt, (*rows, k))
        ins = [a, *_nbits_weights(b, n, k, bits, bs, zp, sdt)]
        if bias == "weight":
            ins.append(b.weight("bias", adt, (n,)))
        elif bias == "input":
            ins.append(b.input("bias", adt, (n,)))
        out.append(b.case(ins, [("y", "f32", (*rows, n))], Q8_ACT if level == 4 else F32, K=k, N=n, bits=bits,
                          block_size=bs, accuracy_level=level))
    for name, level in (("fed_weight", 4), ("f32_fed_weight", 0)):
        b = Builder("MatMulNBits", name)
        a = b.input("a", "f32", (3, 64))
        out.append(b.case([a, *_nbits_weights(b, 6, 64, 4, 32, "u8", "f32", as_inputs=True)], [("y", "f32", (3, 6))],
                          Q8_ACT if level == 4 else F32, K=64, N=6, bits=4, block_size=32, accuracy_level=level))
    return out


# --- QuantizedMatMul / QuantizedEmbedding: MLX's quantized layout, kept packed ------------------------------------
def _mlx_weights(b: Builder, n: int, k: int, mode: str, bits: int, gs: int, scale_dtype: str = "u8",
                 as_inputs: bool = False, prefix: str = "", experts: int = 0) -> list[str]:
    """Packed values, scales and biases (affine; "" otherwise) of a random [n, k] weight in MLX's layout, as weights
    (or feeds). Every uint32 word is valid but for mxfp8, whose two E4M3 NaN codes are left out; affine scales of
    either sign span about 2 / (2^bits - 1); fp scale codes stay finite (E8M0 120..130: 2^-7..2^3; E4M3 of either
    sign, 0.5..3.75), so every output is finite."""
    put = b.input if as_inputs else b.weight
    groups = k // gs
    lead = (experts,) if experts else ()                   # an expert bank: [experts, n, ...]
    if mode == "mxfp8":
        codes = b.rng.integers(0, 256, (*lead, n, k)).astype(np.uint8)
        codes[(codes & 0x7F) == 0x7F] -= 1
        words = codes.view("<u4")                          # value j in byte j: LSB first
    else:
        words = b.rng.integers(0, 2**32, (*lead, n, k * bits // 32), dtype=np.uint32)
    names = [put(f"{prefix}W", "u32", words.shape, value=words)]
    shape = (*lead, n, groups)
    if mode == "affine":
        sdt, span = DType.parse(scale_dtype), 2.0 / (2**bits - 1)
        return [*names, put(f"{prefix}scales", sdt, shape, value=_values(b.rng, sdt, shape, -span, span)),
                put(f"{prefix}biases", sdt, shape, value=_values(b.rng, sdt, shape, -1.0, 1.0))]
    if mode.startswith("mx"):
        scales = b.rng.integers(120, 131, shape)
    else:
        scales = b.rng.integers(0x30, 0x48, shape) | (b.rng.integers(0, 2, shape) << 7)
    return [*names, put(f"{prefix}scales", "u8", shape, value=scales.astype(np.uint8)), ""]


def quantized_cases() -> list[Case]:
    """QuantizedMatMul on decode rows and batches (leading dims too): affine at 1 to 8 bits with groups of 32 to 128
    and f32, f16 or bf16 scales and biases; mxfp4, mxfp8 and nvfp4; a bias weight or a bias fed as an activation; f16
    activations; the packed weight fed as activations (not weights). QuantizedEmbedding looks up repeated ids in
    affine and fp tables. Within F32: the weight is dequantized exactly, the products accumulate in float32."""
    out = []
    for name, rows, k, n, mode, bits, gs, sdt, adt, bias in (
            ("affine_q4_g64_decode", (1,), 256, 40, "affine", 4, 64, "f32", "f32", "weight"),
            ("affine_q4_g64_prefill", (7,), 256, 40, "affine", 4, 64, "f16", "f32", ""),
            ("affine_q2_g32_batch", (2, 3), 128, 24, "affine", 2, 32, "bf16", "f32", "input"),
            ("affine_q3_g32_decode", (1,), 192, 20, "affine", 3, 32, "f16", "f32", ""),
            ("affine_q3_g128_f16_act", (7,), 256, 16, "affine", 3, 128, "bf16", "f16", "weight"),
            ("affine_q8_g128_prefill", (5,), 256, 24, "affine", 8, 128, "f32", "f32", ""),
            ("affine_q8_g32_decode", (1,), 64, 33, "affine", 8, 32, "bf16", "f32", "weight"),
            ("affine_q6_g64_prefill", (3,), 128, 12, "affine", 6, 64, "f16", "f16", "input"),
            ("affine_q5_g32_decode", (1,), 96, 10, "affine", 5, 32, "f32", "f32", ""),
            ("affine_q1_g32_prefill", (4,), 64, 8, "affine", 1, 32, "f16", "f32", ""),
            ("mxfp4_decode", (1,), 256, 32, "mxfp4", 4, 32, "u8", "f32", ""),
            ("mxfp4_batch", (2, 3), 128, 20, "mxfp4", 4, 32, "u8", "f32", "weight"),
            ("mxfp8_decode", (1,), 64, 16, "mxfp8", 8, 32, "u8", "f32", "weight"),
            ("mxfp8_prefill", (7,), 128, 24, "mxfp8", 8, 32, "u8", "f16", ""),
            ("nvfp4_decode", (1,), 128, 24, "nvfp4", 4, 16, "u8", "f32", "input"),
            ("nvfp4_prefill", (7,), 64, 40, "nvfp4", 4, 16, "u8", "f16", "")):
        b = Builder("QuantizedMatMul", name)
        ins = [b.input("a", adt, (*rows, k)), *_mlx_weights(b, n, k, mode, bits, gs, sdt)]
        if bias == "weight":
            ins.append(b.weight("bias", adt, (n,)))
        elif bias == "input":
            ins.append(b.input("bias", adt, (n,)))
        out.append(b.case(ins, [("y", "f32", (*rows, n))], F32, K=k, N=n, mode=mode, bits=bits, group_size=gs))
    for name, mode, bits, gs, sdt in (("affine_fed", "affine", 4, 32, "f16"), ("mxfp4_fed", "mxfp4", 4, 32, "u8")):
        b = Builder("QuantizedMatMul", name)
        ins = [b.input("a", "f32", (3, 64)), *_mlx_weights(b, 6, 64, mode, bits, gs, sdt, as_inputs=True)]
        out.append(b.case(ins, [("y", "f32", (3, 6))], F32, K=64, N=6, mode=mode, bits=bits, group_size=gs))
    for name, ids, mode, bits, gs, sdt, fed in (
            ("affine_q4_g32", [[3, 0, 3], [49, 7, 3]], "affine", 4, 32, "bf16", False),
            ("affine_q8_g64_decode", [17], "affine", 8, 64, "f32", False),
            ("affine_q3_g128_repeats", [5, 5, 0, 5, 2, 49, 5], "affine", 3, 128, "f16", False),
            ("mxfp4", [[1, 1], [48, 0]], "mxfp4", 4, 32, "u8", False),
            ("nvfp4", [9, 2, 9], "nvfp4", 4, 16, "u8", False),
            ("affine_fed", [4, 0, 4], "affine", 4, 64, "f16", True)):
        b = Builder("QuantizedEmbedding", name)
        idx = np.array(ids, np.int32 if name.endswith("decode") else np.int64)
        ins = [b.input("ids", "i32" if idx.dtype == np.int32 else "i64", idx.shape, value=idx),
               *_mlx_weights(b, 50, 128, mode, bits, gs, sdt, as_inputs=fed)]
        out.append(b.case(ins, [("y", "f32", (*idx.shape, 128))], F32, dim=128, mode=mode, bits=bits,
                          group_size=gs))
    out += _quantized_experts_cases()
    return out


def _quantized_experts_cases() -> list[Case]:
    """QuantizedMoEExperts: a decode row and a batch whose tokens share experts; affine banks of different bits and
    group sizes (down at 8 bits, as mlx-lm's mixed recipes do), and mxfp4 banks; silu and gelu."""
    out = []
    for name, rows, mode, bits, groups, sdt, act in (
            ("affine_mixed_decode", 1, "affine", (4, 4, 8), (64, 64, 32), "f32", "silu"),
            ("affine_bf16_batch", 6, "affine", (3, 3, 6), (32, 32, 32), "bf16", "gelu"),
            ("mxfp4_batch", 5, "mxfp4", (4, 4, 4), (32, 32, 32), "u8", "silu")):
        b = Builder("QuantizedMoEExperts", name)
        x = b.input("x", "f32", (rows, 64))
        w = b.input("w", "f32", (rows, 2), low=0.1, high=1.0)
        idx = b.input("i", "i64", (rows, 2), value=b.rng.integers(0, 4, size=(rows, 2)).astype(np.int64))
        banks = [_mlx_weights(b, n, k, mode, bits[j], groups[j], sdt, prefix=f"{bank}_", experts=4)
                 for j, (bank, n, k) in enumerate((("gate", 32, 64), ("up", 32, 64), ("down", 64, 32)))]
        ins = [x, w, idx, *(t for bank in banks for t in bank[:2]), *(bank[2] for bank in banks)]
        out.append(b.case(ins, [("y", "f32", (rows, 64))], F32, n_experts=4, top_k=2, activation=act, mode=mode,
                          bits=bits, group_sizes=groups))
    return out


__all__ = ["F32", "LOW", "Q8_ACT", "Builder", "Case", "binary_case", "matmul_nbits_cases", "quantized_cases",
           "unary_case"]

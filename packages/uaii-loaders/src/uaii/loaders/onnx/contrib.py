"""onnxruntime's contrib ops (domain com.microsoft, and the ones it defines in ai.onnx) as IR.

These are what onnxruntime-genai's model builder writes for llama/qwen2-style models: fused norms with the residual
add (SkipSimplifiedLayerNormalization), block-quantized matrices (MatMulNBits), rotary embeddings from cos/sin caches
(:mod:`.contrib_rotary`) and GroupQueryAttention with its KV cache (:mod:`.contrib_attention`). Each handler
implements the op's documented semantics (the schema text onnxruntime ships) and is compared against onnxruntime in
tests/loaders/test_onnx_contrib.py; what an op can do that the IR cannot (training outputs, quantized KV caches,
prepacked weights) is refused with the attribute or input that asks for it, never approximated.
"""

from __future__ import annotations

import math

import numpy as np

from uaii.ir import Dim, DType

from .context import NodeContext
from .dispatch import AI_ONNX, MS_DOMAIN, onnx_op
from .fold import reshape_to
from .values import Value


def _no_training_outputs(ctx: NodeContext, slots: tuple[int, ...]) -> None:
    """Mean / inverse-std-dev outputs exist for training; nothing in inference reads them."""
    for i in slots:
        if ctx.output_used(i):
            ctx.fail(f"output #{i} ({ctx.output_names[i]!r}, a saved statistic for training) is not supported")


def _last_axis(ctx: NodeContext, x: Value) -> None:
    axis = int(ctx.attr("axis", -1))
    if axis not in (-1, x.rank - 1):
        ctx.fail(f"axis {axis} normalizes more than the last axis; only the last axis is supported")


def _as(ctx: NodeContext, y: Value, dtype: DType) -> Value:
    return y if y.dtype is dtype else ctx.emit("Cast", [y], {"to": dtype.value}, dtype=dtype, shape=y.shape)


@onnx_op(AI_ONNX, "SimplifiedLayerNormalization", 1)
def simplified_layer_normalization(ctx: NodeContext) -> Value:
    """RMSNorm (onnxruntime's op in the ai.onnx domain; last axis)"""
    x, scale = ctx.input(0), ctx.input(1)
    _last_axis(ctx, x)
    _no_training_outputs(ctx, (1,))
    y = ctx.emit("RMSNorm", [x, scale], {"eps": float(ctx.attr("epsilon", 1e-5))}, shape=x.shape)
    return _as(ctx, y, scale.dtype)  # the op's output has the scale's type (V)


def _skip_sum(ctx: NodeContext, x: Value, skip: Value, bias: Value | None) -> Value:
    """input + skip (+ bias): the residual stream both skip norms also return (output #3)."""
    total = ctx.emit("Add", [x, skip], shape=x.shape)
    return total if bias is None else ctx.emit("Add", [total, bias], shape=x.shape)


@onnx_op(MS_DOMAIN, "SkipSimplifiedLayerNormalization", 1)
def skip_simplified_layer_normalization(ctx: NodeContext) -> list[Value | None]:
    """Add + RMSNorm (output #3: the sum)"""
    x = ctx.input(0)
    _no_training_outputs(ctx, (1, 2))
    total = _skip_sum(ctx, x, ctx.input(1), ctx.optional(3))
    y = ctx.emit("RMSNorm", [total, ctx.input(2)], {"eps": float(ctx.attr("epsilon", 1e-12))}, shape=x.shape)
    return [y, None, None, total if ctx.output_used(3) else None][: ctx.n_outputs]


@onnx_op(MS_DOMAIN, "SkipLayerNormalization", 1)
def skip_layer_normalization(ctx: NodeContext) -> list[Value | None]:
    """Add + LayerNorm (output #3: the sum)"""
    x = ctx.input(0)
    _no_training_outputs(ctx, (1, 2))
    total = _skip_sum(ctx, x, ctx.input(1), ctx.optional(4))
    y = ctx.emit("LayerNorm", [total, ctx.input(2), ctx.optional(3)], {"eps": float(ctx.attr("epsilon", 1e-12))},
                 shape=x.shape)
    return [y, None, None, total if ctx.output_used(3) else None][: ctx.n_outputs]


# --- block-quantized weights ------------------------------------------------------------------------------------
NBITS = (4, 8)
"""Bit widths the IR's MatMulNBits runs (onnxruntime also knows 2; the IR refuses what it has no kernel for)."""


@onnx_op(MS_DOMAIN, "MatMulNBits", 1)
def matmul_nbits(ctx: NodeContext) -> Value:
    """MatMulNBits (packed weights, never dequantized at load); accuracy_level passes through: it says whether a
    backend may quantize A to int8 (4) or must keep it in float (0..3)"""
    a, b, scales = ctx.input(0), ctx.input(1), ctx.input(2)
    k, n = int(ctx.need_attr("K")), int(ctx.need_attr("N"))
    bits, block = int(ctx.attr("bits", 4)), int(ctx.need_attr("block_size"))
    if bits not in NBITS:
        ctx.fail(f"bits={bits} is not supported (the IR's MatMulNBits runs {' and '.join(map(str, NBITS))} bits)")
    if block < 16 or block & (block - 1):
        ctx.fail(f"block_size={block} must be a power of two >= 16")
    if int(ctx.attr("weight_prepacked", 0)):
        ctx.fail("weight_prepacked: B holds an execution provider's private layout, not the documented one")
    if ctx.optional(4) is not None:
        ctx.fail("g_idx (deprecated act-order group indices) is not supported")
    n_blocks = math.ceil(k / block)
    want = (n, n_blocks, block * bits // 8)
    if tuple(b.shape) != want:
        ctx.fail(f"B has shape {list(b.shape)}; K={k}, N={n}, bits={bits}, block_size={block} give {list(want)}")
    if b.dtype is not DType.U8:
        ctx.fail(f"B must be uint8, found {b.dtype.value}")
    if a.shape and isinstance(a.shape[-1], int) and a.shape[-1] != k:
        ctx.fail(f"A's last dim {a.shape[-1]} differs from K={k}")
    level = int(ctx.attr("accuracy_level", 0))
    if not 0 <= level <= 4:
        ctx.fail(f"accuracy_level={level} is outside the contrib spec's 0..4 (0/1 f32, 2 f16, 3 bf16, 4 int8)")
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block, "accuracy_level": level}
    y = ctx.emit("MatMulNBits", [a, b, scales, ctx.optional(3), ctx.optional(5)], attrs, shape=(*a.shape[:-1], n))
    return _as(ctx, y, a.dtype)


def _unpack(ctx: NodeContext, packed: Value, bits: int, count: Dim) -> Value:
    """uint8 bytes [..., n] holding 8/bits values each (low bits first) as f32 [..., n * 8/bits], the first
    ``count`` of them."""
    lead, n = packed.shape[:-1], int(packed.shape[-1])
    if bits == 8:
        values = packed
    else:
        sixteen = ctx.constant(np.asarray(16, np.uint8))
        lo = reshape_to(ctx, ctx.emit("Mod", [packed, sixteen], shape=packed.shape), (*lead, n, 1))
        hi = reshape_to(ctx, ctx.emit("Div", [packed, sixteen], shape=packed.shape), (*lead, n, 1))
        pairs = ctx.emit("Concat", [lo, hi], {"axis": -1}, shape=(*lead, n, 2))
        values = reshape_to(ctx, pairs, (*lead, 2 * n))
        if values.shape[-1] != count:
            values = ctx.emit("Slice", [values], {"starts": (0,), "ends": (int(count),), "axes": (-1,)},
                              shape=(*lead, count))
    return ctx.emit("Cast", [values], {"to": DType.F32.value}, dtype=DType.F32, shape=values.shape)


@onnx_op(MS_DOMAIN, "GatherBlockQuantized", 1)
def gather_block_quantized(ctx: NodeContext) -> Value:
    """Gather of packed rows, dequantized after the gather (uint8 data, 4/8 bits: the table stays packed)"""
    data, idx, scales, zp = ctx.input(0), ctx.input(1), ctx.input(2), ctx.optional(3)
    bits, block = int(ctx.attr("bits", 4)), int(ctx.attr("block_size", 128))
    if data.dtype is not DType.U8 or data.rank != 2:
        ctx.fail(f"only 2-D uint8 data is supported (int4/uint4/float8 element types are not), found "
                 f"{data.dtype.value} {list(data.shape)}")
    if int(ctx.attr("gather_axis", 0)) not in (0, -2) or int(ctx.attr("quantize_axis", 1)) not in (1, -1):
        ctx.fail("only gather_axis 0 with quantize_axis 1 (an embedding table quantized along its rows) is supported")
    if bits not in NBITS or block < 16 or block & (block - 1):
        ctx.fail(f"bits={bits}, block_size={block}: supported are 4 or 8 bits and a power-of-two block >= 16")
    rows, width = data.shape
    if not isinstance(width, int) or (width * 8 // bits) % block:
        ctx.fail(f"rows of {width} bytes are not whole blocks of {block} {bits}-bit values")
    k = width * 8 // bits
    blocks = k // block
    if tuple(scales.shape) != (rows, blocks):
        ctx.fail(f"scales must be [{rows}, {blocks}], found {list(scales.shape)}")
    lead = idx.shape
    q = _unpack(ctx, ctx.emit("Gather", [data, idx], {"axis": 0}, shape=(*lead, width)), bits, k)
    q = reshape_to(ctx, q, (*lead, blocks, block))
    if zp is None:
        z: Value = ctx.constant(np.asarray(1 << (bits - 1), np.float32))
    else:
        zrows = ctx.emit("Gather", [zp, idx], {"axis": 0}, shape=(*lead, zp.shape[-1]))
        z = reshape_to(ctx, _unpack(ctx, zrows, bits, blocks), (*lead, blocks, 1))
    s = ctx.emit("Gather", [scales, idx], {"axis": 0}, shape=(*lead, blocks))
    s = reshape_to(ctx, _as(ctx, s, DType.F32), (*lead, blocks, 1))
    y = ctx.emit("Mul", [ctx.emit("Sub", [q, z], shape=q.shape), s], shape=q.shape)
    return _as(ctx, reshape_to(ctx, y, (*lead, k)), scales.dtype)


from . import contrib_attention, contrib_rotary  # noqa: E402,F401  (register their handlers with this module)

__all__ = ["NBITS", "gather_block_quantized", "matmul_nbits", "simplified_layer_normalization",
           "skip_layer_normalization", "skip_simplified_layer_normalization"]

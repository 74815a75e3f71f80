"""MatMulNBits: a product with a weight in ONNX's block-quantized layout (the com.microsoft contrib op), which a
backend keeps packed (uaii-kernels runs it through IGemm without dequantizing it at load)."""

from __future__ import annotations

from collections.abc import Sequence

from uaii.ir.dtype import Dim, DType
from uaii.ir.ops.opset import Op
from uaii.ir.ops.schema import FLOATS, Cost, InferCtx, OpKind, OpSchema, Param, int_attr
from uaii.ir.shapes import Shape, ShapeError, fmt_shape, unify

BLOCK_SIZES = (16, 32, 64, 128, 256)
U8 = frozenset({DType.U8})


def layout_dims(k: int, bits: int, block_size: int) -> tuple[int, int, int]:
    """(k_blocks, bytes per block, packed zero-point bytes per row) of a weight with ``k`` inputs."""
    kb = -(-k // block_size)
    return kb, block_size * bits // 8, -(-kb * bits // 8)


def _per_block(ctx: InferCtx, i: int, n: int, per_row: int, what: str) -> None:
    """A per-block input: [n * per_row] or [n, per_row]."""
    want: Sequence[Dim] = (n * per_row,) if len(ctx.shape(i)) == 1 else (n, per_row)
    ctx.expect(i, want, what)


def nbits_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    k, n, bits, bs = (int(ctx.attr(a)) for a in ("K", "N", "bits", "block_size"))
    kb, blob, zrow = layout_dims(k, bits, bs)
    a = ctx.rank(0, 1)
    try:
        unify(a[-1], k)
    except ShapeError:
        ctx.fail(f"A {fmt_shape(a)} has {a[-1]} columns; attribute K is {k}")
    ctx.expect(1, (n, kb, blob), f"B (N={n}, ceil(K/block_size)={kb} blocks of {blob} bytes)")
    _per_block(ctx, 2, n, kb, f"scales (N={n} x {kb} blocks)")
    if ctx.has(3):
        if ctx.dtype(3) is DType.U8:
            _per_block(ctx, 3, n, zrow, f"packed uint8 zero_points (N={n} x {zrow} bytes)")
        else:
            _per_block(ctx, 3, n, kb, f"float zero_points (N={n} x {kb} blocks)")
    if ctx.has(4):
        ctx.expect(4, (n,), "bias")
    return [(*a[:-1], n)]


MATMUL_NBITS = OpSchema(
    Op.MATMUL_NBITS, 1,
    "Y = A @ W^T (+ bias) with W [N, K] block-quantized along K in ONNX's MatMulNBits layout (com.microsoft "
    "contrib op): blocks of block_size values (kb = ceil(K / block_size) per row, the last one padded), B uint8 "
    "[N, kb, block_size * bits / 8] packed along K (4 bits: value 2i in the low nibble of byte i, 2i + 1 in the "
    "high one), scales [N * kb] or [N, kb], zero_points optional: uint8 packed like B ([N * ceil(kb * bits / 8)] "
    "or [N, ceil(kb * bits / 8)], each row padded to whole bytes) or floats [N * kb] (absent: 2^(bits-1)); "
    "W = (q - zero_point) * scale. Y is float32 [..., N] whatever A's float type. Backends keep B packed. "
    "accuracy_level is ONNX's: the least accurate arithmetic the model's author accepts for A — 0 (unset) and 1 "
    "float32, 2 float16, 3 bfloat16 (onnxruntime's CPU computes those in float32 too), 4 int8 (A may be quantized "
    "to 8 bits per block, onnxruntime's integer kernels). It allows a backend a faster, less exact product; it "
    "never changes what Y is (the reference computes it exactly at every level).",
    inputs=(Param("A", "T", "activations [..., K]"),
            Param("B", U8, "packed weight [N, kb, block_size * bits / 8]"),
            Param("scales", "S", "per-block scales [N * kb] or [N, kb]"),
            Param("zero_points", U8 | FLOATS, "per-block zero points: uint8 packed, or floats", optional=True),
            Param("bias", "T", "[N]", optional=True)),
    outputs=(Param("Y", frozenset({DType.F32}), "[..., N]"),),
    attrs=(int_attr("K", None, "input features (columns of A)", required=True, min=1),
           int_attr("N", None, "output features (rows of W)", required=True, min=1),
           int_attr("bits", 4, "bits per quantized value", choices=(4, 8)),
           int_attr("block_size", None, "values per quantization block along K", required=True,
                    choices=BLOCK_SIZES),
           int_attr("accuracy_level", 0, "the least accurate arithmetic allowed for A: 0/1 f32, 2 f16, 3 bf16, "
                    "4 int8 (ONNX's meaning)", min=0, max=4)),
    types={"T": FLOATS, "S": FLOATS}, infer=nbits_shape, kind=OpKind.LINALG, cost=Cost.HIGH)

SCHEMAS = (MATMUL_NBITS,)

__all__ = ["BLOCK_SIZES", "MATMUL_NBITS", "SCHEMAS", "layout_dims", "nbits_shape"]

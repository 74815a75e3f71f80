"""QuantizedMatMul, QuantizedEmbedding and QuantizedMoEExperts: products, row lookups and expert FFNs with weights in
MLX's quantized layout (mlx.core.quantize), which a backend keeps packed.

An MLX-quantized weight is three tensors, not one: the packed values, per-group scales and (affine mode) per-group
biases. That is why its layout is an op's attributes (mode, bits, group_size) and not a row of the dtype table,
whose rows describe one tensor's bytes each (GGUF's blocks carry their scales inside). The modes, as mlx 0.32
defines them (``mx.quantize``'s table):

=======  ====================  ===============  =====================  ======
mode     bits                  group sizes      scales                 biases
=======  ====================  ===============  =====================  ======
affine   1, 2, 3, 4, 5, 6, 8   32, 64, 128      the model's float type yes
mxfp4    4 (E2M1)              32               E8M0 (uint8)           no
mxfp8    8 (E4M3)              32               E8M0 (uint8)           no
nvfp4    4 (E2M1)              16               E4M3 (uint8)           no
=======  ====================  ===============  =====================  ======

The packed tensor is uint32 ``[N, K * bits / 32]``; each row is one bit stream, least significant bit first
(value j occupies bits ``j*bits .. j*bits+bits-1`` of the row's little-endian words), so a value may straddle two
words at 3, 5 and 6 bits. Scales (and biases) are ``[N, K / group_size]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from uaii.ir.dtype import FLOAT_TYPES, DType
from uaii.ir.ops.access import WeightAccess
from uaii.ir.ops.opset import Op
from uaii.ir.ops.schema import (
    FLOATS,
    INDEX_TYPES,
    Cost,
    InferCtx,
    OpKind,
    OpSchema,
    Param,
    int_attr,
    ints_attr,
    str_attr,
)
from uaii.ir.shapes import Shape, ShapeError, fmt_shape, unify


@dataclass(frozen=True)
class QuantMode:
    """One row of MLX's table of quantization modes."""

    name: str
    bits: tuple[int, ...]
    group_sizes: tuple[int, ...]
    element: str  # "int" (affine), "e2m1" or "e4m3"
    scale: str  # "float" (the model's type), "e8m0" or "e4m3"

    @property
    def has_biases(self) -> bool:
        return self.name == "affine"


QUANT_MODES: dict[str, QuantMode] = {m.name: m for m in (
    QuantMode("affine", (1, 2, 3, 4, 5, 6, 8), (32, 64, 128), "int", "float"),
    QuantMode("mxfp4", (4,), (32,), "e2m1", "e8m0"),
    QuantMode("mxfp8", (8,), (32,), "e4m3", "e8m0"),
    QuantMode("nvfp4", (4,), (16,), "e2m1", "e4m3"),
)}
U32 = frozenset({DType.U32})
SCALE_TYPES = FLOATS | frozenset({DType.U8})


def packed_words(k: int, bits: int) -> int:
    """uint32 words of one packed row of ``k`` values."""
    return k * bits // 32


def check_layout(mode: str, bits: int, group_size: int, k: int) -> str | None:
    """Why (mode, bits, group_size) cannot describe rows of ``k`` values, or None when it can."""
    m = QUANT_MODES.get(mode)
    if m is None:
        return f"mode {mode!r} is not one of {', '.join(QUANT_MODES)}"
    if bits not in m.bits:
        return f"{mode} takes bits {', '.join(map(str, m.bits))}, not {bits}"
    if group_size not in m.group_sizes:
        return f"{mode} takes group sizes {', '.join(map(str, m.group_sizes))}, not {group_size}"
    if k % group_size:
        return f"{k} values per row is not a whole number of groups of {group_size}"
    return None


def _check_weight(ctx: InferCtx, slots: tuple[int, int, int], n: int, k: int,
                  layout: tuple[str, int, int] | None = None, outer: Sequence[int] = ()) -> None:
    """The packed values, scales and biases at input ``slots`` of a [*outer, n, k] weight; layout: (mode, bits,
    group_size), by default the node's attributes."""
    w_slot, s_slot, b_slot = slots
    mode, bits, gs = layout or (str(ctx.attr("mode")), int(ctx.attr("bits")), int(ctx.attr("group_size")))
    problem = check_layout(mode, bits, gs, k)
    if problem:
        ctx.fail(problem, "attr-range")
    m = QUANT_MODES[mode]
    ctx.expect(w_slot, (*outer, n, packed_words(k, bits)), f"the packed weight ({n} rows of {k} {bits}-bit values)")
    ctx.expect(s_slot, (*outer, n, k // gs), f"scales ({n} rows of {k // gs} groups)")
    st = ctx.dtype(s_slot)
    if (st is DType.U8) != (m.scale != "float"):
        want = f"uint8 {m.scale} codes" if m.scale != "float" else "the model's float type"
        ctx.fail(f"{mode} scales are {want}, found {st.value}", "dtype")
    if m.has_biases != ctx.has(b_slot):
        ctx.fail(f"{mode} {'needs' if m.has_biases else 'has no'} biases", "arity")
    if m.has_biases:
        ctx.expect(b_slot, (*outer, n, k // gs), f"biases ({n} rows of {k // gs} groups)")
        if ctx.dtype(b_slot) is not st:
            ctx.fail(f"biases are {ctx.dtype(b_slot).value}, scales {st.value}; MLX stores both in one type",
                     "dtype")


def quantized_matmul_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    k, n = int(ctx.attr("K")), int(ctx.attr("N"))
    a = ctx.rank(0, 1)
    try:
        unify(a[-1], k)
    except ShapeError:
        ctx.fail(f"A {fmt_shape(a)} has {a[-1]} columns; attribute K is {k}")
    _check_weight(ctx, (1, 2, 3), n, k)
    if ctx.has(4):
        ctx.expect(4, (n,), "bias")
    return [(*a[:-1], n)]


def quantized_embedding_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    dim = int(ctx.attr("dim"))
    w = ctx.rank(1, 2, 2)
    rows = w[0]
    if not isinstance(rows, int):
        ctx.fail(f"the packed table {fmt_shape(w)} needs a static row count")
    _check_weight(ctx, (1, 2, 3), rows, dim)
    return [(*ctx.shape(0), dim)]


_LAYOUT_ATTRS = (
    str_attr("mode", "affine", "MLX quantization mode", choices=tuple(QUANT_MODES)),
    int_attr("bits", 4, "bits per packed value", choices=(1, 2, 3, 4, 5, 6, 8)),
    int_attr("group_size", 64, "values per scale (and bias) along a row (16: nvfp4 only)", choices=(16, 32, 64, 128)),
)
_MODES_DOC = ("mode affine: W = scale * q + bias per group of group_size values (bits 1, 2, 3, 4, 5, 6 or 8, groups "
              "32/64/128; "
              "mlx rounds scale * q to the scales' type before adding the bias); mxfp4/nvfp4: E2M1 values, mxfp8: "
              "E4M3 values, times an E8M0 (mx, groups of 32) or E4M3 (nv, groups of 16) scale code per group, no "
              "biases. The packed weight is uint32 [rows, cols * bits / 32], each row one LSB-first bit stream.")

QUANTIZED_MATMUL = OpSchema(
    Op.QUANTIZED_MATMUL, 1,
    "Y = A @ W^T (+ bias) with W [N, K] in MLX's quantized layout (mlx.core.quantized_matmul with transpose=True). "
    + _MODES_DOC + " Y is float32 [..., N] whatever A's float type. Backends keep W packed.",
    inputs=(Param("A", "T", "activations [..., K]"),
            Param("W", U32, "packed values [N, K * bits / 32]"),
            Param("scales", SCALE_TYPES, "[N, K / group_size]: the model's float type (affine) or uint8 codes"),
            Param("biases", FLOATS, "[N, K / group_size], affine mode only", optional=True),
            Param("bias", "T", "[N]", optional=True)),
    outputs=(Param("Y", frozenset({DType.F32}), "[..., N]"),),
    attrs=(int_attr("K", None, "input features (columns of A)", required=True, min=1),
           int_attr("N", None, "output features (rows of W)", required=True, min=1),
           *_LAYOUT_ATTRS),
    types={"T": FLOATS}, infer=quantized_matmul_shape, kind=OpKind.LINALG, cost=Cost.HIGH)

QUANTIZED_EMBEDDING = OpSchema(
    Op.QUANTIZED_EMBEDDING, 1,
    "Y[..., :] = W[indices[...], :] dequantized to float32, W [vocab, dim] in MLX's quantized layout "
    "(mlx.nn.QuantizedEmbedding). " + _MODES_DOC,
    inputs=(Param("indices", "I", "token ids, any shape"),
            Param("W", U32, "packed rows [vocab, dim * bits / 32]"),
            Param("scales", SCALE_TYPES, "[vocab, dim / group_size]"),
            Param("biases", FLOATS, "[vocab, dim / group_size], affine mode only", optional=True)),
    outputs=(Param("Y", frozenset({DType.F32}), "[*indices.shape, dim]"),),
    attrs=(int_attr("dim", None, "values per row", required=True, min=1), *_LAYOUT_ATTRS),
    types={"I": INDEX_TYPES}, infer=quantized_embedding_shape, kind=OpKind.INDEX, cost=Cost.MEDIUM,
    weight_access={1: WeightAccess.ROWS, 2: WeightAccess.ROWS, 3: WeightAccess.ROWS})

BANKS = ("gate", "up", "down")
BANK_SLOTS = {bank: (3 + 2 * i, 4 + 2 * i, 9 + i) for i, bank in enumerate(BANKS)}
"""Input slots of each bank's packed values, scales and (affine) biases: the required inputs first (gate, up, down
values and scales in turn), then the three optional biases."""


def quantized_experts_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    n, k = int(ctx.attr("n_experts")), int(ctx.attr("top_k"))
    bits, groups = tuple(ctx.attr("bits")), tuple(ctx.attr("group_sizes"))
    if len(bits) != 3 or len(groups) != 3:
        ctx.fail(f"bits {list(bits)} and group_sizes {list(groups)} must hold one value per bank (gate, up, down)",
                 "attr-range")
    x = ctx.rank(0, 1)
    d = x[-1]
    for i, what in ((1, "router weights"), (2, "router indices")):
        ctx.expect(i, (*x[:-1], k), what)
    gate = ctx.rank(BANK_SLOTS["gate"][0], 3, 3)
    d_ff = gate[1]
    if not isinstance(d, int) or not isinstance(d_ff, int):
        ctx.fail("quantized expert banks need a static d_model and d_ff")
    mode = str(ctx.attr("mode"))
    for i, bank in enumerate(BANKS):
        rows, cols = (d, d_ff) if bank == "down" else (d_ff, d)
        _check_weight(ctx, BANK_SLOTS[bank], rows, cols, (mode, int(bits[i]), int(groups[i])), (n,))
    return [x]


QUANTIZED_MOE_EXPERTS = OpSchema(
    Op.QUANTIZED_MOE_EXPERTS, 1,
    "MoEExperts with expert banks in MLX's quantized layout (mlx-lm's SwitchGLU over QuantizedSwitchLinear): "
    "Y[t] = sum_j weights[t, j] * down_e(act(gate_e(X[t])) * up_e(X[t])), e = indices[t, j]. Each bank is "
    "[n_experts, rows, cols] as three tensors: packed values [n_experts, rows, cols * bits / 32], scales and "
    "(affine) biases [n_experts, rows, cols / group_size]; inputs: X, weights, indices, then gate, up, down "
    "values and scales in turn, then the gate, up, down biases; gate and up are [d_ff, d_model] per expert, down "
    "[d_model, d_ff]. One mode for the three banks; bits and group_sizes per bank (gate, up, down). " + _MODES_DOC,
    inputs=(Param("X", "T", "[..., d_model]"), Param("weights", "F", "[..., top_k] from MoERouter"),
            Param("indices", "I", "[..., top_k] from MoERouter"),
            *(p for bank in BANKS for p in (
                Param(f"{bank}_exps", U32, "packed values [n_experts, rows, cols * bits / 32]"),
                Param(f"{bank}_scales", SCALE_TYPES, "[n_experts, rows, cols / group_size]"))),
            *(Param(f"{bank}_biases", FLOATS, "[n_experts, rows, cols / group_size], affine mode only", optional=True)
              for bank in BANKS)),
    outputs=(Param("Y", "T", "[..., d_model]"),),
    attrs=(int_attr("n_experts", None, "experts per layer", required=True, min=1),
           int_attr("top_k", None, "experts per token", required=True, min=1),
           str_attr("activation", "silu", "gate activation: silu (SwiGLU) or gelu (GeGLU)", choices=("silu", "gelu")),
           str_attr("mode", "affine", "MLX quantization mode of the three banks", choices=tuple(QUANT_MODES)),
           ints_attr("bits", (4, 4, 4), "bits per packed value of the gate, up and down banks"),
           ints_attr("group_sizes", (64, 64, 64), "group size of the gate, up and down banks")),
    types={"T": FLOATS, "F": FLOAT_TYPES, "I": INDEX_TYPES}, infer=quantized_experts_shape, kind=OpKind.MOE,
    cost=Cost.HIGH, weight_access=dict.fromkeys(range(3, 12), WeightAccess.EXPERTS))

SCHEMAS = (QUANTIZED_MATMUL, QUANTIZED_EMBEDDING, QUANTIZED_MOE_EXPERTS)

__all__ = ["BANKS", "BANK_SLOTS", "QUANTIZED_EMBEDDING", "QUANTIZED_MATMUL", "QUANTIZED_MOE_EXPERTS", "QUANT_MODES",
           "SCHEMAS", "QuantMode", "check_layout", "packed_words"]

"""Mixture of experts: the router and the expert FFN over packed expert banks.

Expert banks are single tensors whose outermost dim is the expert (``ffn_gate_exps`` etc. in GGUF). The
storage layer addresses expert ``e`` of a bank through the weight reference ``path#tensor#e=N``, so after
routing only the selected experts are read; the IR itself stays one tensor per bank.
"""

from __future__ import annotations

from collections.abc import Sequence

from uaii.ir.dtype import FLOAT_TYPES, DType
from uaii.ir.ops.access import WeightAccess
from uaii.ir.ops.opset import Op
from uaii.ir.ops.schema import (
    FLOATS,
    INDEX_TYPES,
    WEIGHT_TYPES,
    Cost,
    InferCtx,
    OpKind,
    OpSchema,
    Param,
    bool_attr,
    int_attr,
    str_attr,
)
from uaii.ir.shapes import Shape, fmt_shape, shapes_unify


def _same(ctx: InferCtx, a: Shape, b: Shape, what: str) -> None:
    if not shapes_unify(a, b):
        ctx.fail(f"{what}: {fmt_shape(a)} vs {fmt_shape(b)}")


def _top_k(ctx: InferCtx) -> tuple[int, int]:
    n, k = int(ctx.attr("n_experts")), int(ctx.attr("top_k"))
    if k > n:
        ctx.fail(f"top_k {k} exceeds n_experts {n}", "attr-range")
    return n, k


def router_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    logits = ctx.rank(0, 1)
    n, k = _top_k(ctx)
    _same(ctx, logits[-1:], (n,), "logits must end in n_experts")
    out = (*logits[:-1], k)
    return [out, out]


MOE_ROUTER = OpSchema(
    Op.MOE_ROUTER, 1,
    "scores = softmax(logits) (or sigmoid with scoring='sigmoid') over the experts; the top_k experts by "
    "score are chosen (exact, ties to the lower index); weights are their scores, divided by their sum when "
    "normalize is set.",
    inputs=(Param("logits", "T", "[..., n_experts] router logits"),),
    outputs=(Param("weights", frozenset({DType.F32}), "[..., top_k] f32"),
             Param("indices", "I", "[..., top_k] expert ids")),
    attrs=(int_attr("n_experts", None, "experts per layer", required=True, min=1),
           int_attr("top_k", None, "experts per token; <= n_experts", required=True, min=1),
           bool_attr("normalize", True, "rescale the chosen weights to sum to 1"),
           str_attr("scoring", "softmax", "score function", choices=("softmax", "sigmoid"))),
    types={"T": FLOATS, "I": INDEX_TYPES}, infer=router_shape, kind=OpKind.MOE, cost=Cost.MEDIUM)


def experts_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    x, w, idx = ctx.rank(0, 1), ctx.rank(1, 1), ctx.rank(2, 1)
    n, k = _top_k(ctx)
    _same(ctx, w, idx, "router weights and indices differ in shape")
    _same(ctx, w, (*x[:-1], k), "router outputs must be [*X.shape[:-1], top_k]")
    gate, up, down = ctx.rank(3, 3, 3), ctx.rank(4, 3, 3), ctx.rank(5, 3, 3)
    _same(ctx, gate, up, "gate and up banks differ")
    _same(ctx, gate, (n, gate[1], x[-1]), "gate bank must be [n_experts, d_ff, d_model]")
    _same(ctx, down, (n, x[-1], gate[1]), "down bank must be [n_experts, d_model, d_ff]")
    return [x]


def _experts(op: str, activations: tuple[str, ...], note: str) -> OpSchema:
    return OpSchema(
        op, 1,
        "Y[t] = sum_j weights[t, j] * down_e(act(gate_e(X[t])) * up_e(X[t])), e = indices[t, j]: a gated FFN "
        "per selected expert. Bank rows are output features (as MatMul with transpose_b) and may be "
        "block-quantized, each bank in its own type; each expert's slice is addressed as its own weight "
        "reference (#e=N)." + note,
        inputs=(Param("X", "T", "[..., d_model]"), Param("weights", "F", "[..., top_k] from MoERouter"),
                Param("indices", "I", "[..., top_k] from MoERouter"),
                Param("gate_exps", WEIGHT_TYPES, "[n_experts, d_ff, d_model]"),
                Param("up_exps", WEIGHT_TYPES, "[n_experts, d_ff, d_model]"),
                Param("down_exps", WEIGHT_TYPES, "[n_experts, d_model, d_ff]")),
        outputs=(Param("Y", "T", "[..., d_model]"),),
        attrs=(int_attr("n_experts", None, "experts per layer", required=True, min=1),
               int_attr("top_k", None, "experts per token", required=True, min=1),
               str_attr("activation", "silu", "gate activation: silu (SwiGLU) or gelu (GeGLU)",
                        choices=activations)),
        types={"T": FLOATS, "F": FLOAT_TYPES, "I": INDEX_TYPES}, infer=experts_shape,
        kind=OpKind.MOE, cost=Cost.HIGH, weight_access=dict.fromkeys((3, 4, 5), WeightAccess.EXPERTS))


MOE_EXPERTS = _experts(Op.MOE_EXPERTS, ("silu", "gelu"), "")
MOE_EXPERTS_SWIGLU = _experts(Op.MOE_EXPERTS_SWIGLU, ("silu",), " The C++ runtime's name for MoEExperts with "
                              "activation='silu'.")

SCHEMAS = (MOE_ROUTER, MOE_EXPERTS, MOE_EXPERTS_SWIGLU)

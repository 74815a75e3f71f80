"""Rotary position embedding and scaled dot-product attention with a KV cache.

Layout: heads are split, ``[..., seq, heads, head_dim]``, for q, k, v, the caches and the attention output; a
Reshape packs ``[..., seq, heads * head_dim]`` before the output projection.
"""

from __future__ import annotations

from collections.abc import Sequence

from uaii.ir.dtype import FLOAT_TYPES, Dim, DType
from uaii.ir.ops.opset import Op
from uaii.ir.ops.schema import (
    FLOATS,
    INDEX_TYPES,
    Cost,
    InferCtx,
    OpKind,
    OpSchema,
    Param,
    bool_attr,
    float_attr,
    int_attr,
    positive,
    str_attr,
)
from uaii.ir.shapes import Shape, ShapeError, broadcast_shapes, dim_add, dim_div, fmt_shape, unify


def _same(ctx: InferCtx, a: Dim, b: Dim, what: str) -> None:
    try:
        unify(a, b)
    except ShapeError:
        ctx.fail(f"{what}: {a} vs {b}")


def rope_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    x = ctx.rank(0, 3)
    pos = ctx.rank(1, 1)
    _same(ctx, pos[-1], x[-3], f"positions {fmt_shape(pos)} must hold one position per token of X "
          f"{fmt_shape(x)}")
    rot = int(ctx.attr("rotary_dims")) or x[-1]
    if isinstance(rot, int) and rot % 2:
        ctx.fail(f"the rotated channels ({rot}) must be an even count", "attr-range")
    if isinstance(rot, int) and isinstance(x[-1], int) and rot > x[-1]:
        ctx.fail(f"rotary_dims {rot} exceeds head_dim {x[-1]}", "attr-range")
    scaling = ctx.attr("scaling_type")
    if scaling in ("llama3", "yarn") and int(ctx.attr("original_max_position")) <= 0:
        ctx.fail(f"scaling_type {scaling!r} needs original_max_position > 0", "attr-range")
    if scaling == "llama3" and ctx.attr("high_freq_factor") <= ctx.attr("low_freq_factor"):
        ctx.fail("llama3 scaling needs high_freq_factor > low_freq_factor", "attr-range")
    if ctx.has(2):
        ff = ctx.rank(2, 1, 1)
        _same(ctx, ff[0], dim_div(rot, 2), "freq_factors must hold rotary_dims/2 values")
    return [x]


ROPE = OpSchema(
    Op.ROPE, 1,
    "Rotates pairs of channels of each head by angle pos * theta^(-2i/rotary_dims), i = 0..rotary_dims/2-1. "
    "mode 'normal' pairs adjacent channels (2i, 2i+1) (GGUF llama, GPT-J); 'neox' pairs (i, i + "
    "rotary_dims/2) (HF, GPT-NeoX). Only the first rotary_dims channels rotate; the rest pass through. "
    "Frequency scaling: 'linear' divides positions by factor; 'llama3' scales low frequencies by 1/factor "
    "with a smooth band between low_freq_factor and high_freq_factor (wavelengths relative to "
    "original_max_position); 'yarn' blends interpolation and extrapolation between beta_slow and beta_fast "
    "and multiplies by attn_factor. freq_factors, when given, divide the base frequencies (GGUF "
    "rope_freqs). Positions are absolute.",
    inputs=(Param("X", "T", "[..., seq, heads, head_dim]"),
            Param("positions", "P", "absolute position of each token, [seq] or [..., seq]"),
            Param("freq_factors", "F", "per-frequency divisors [rotary_dims/2]", optional=True)),
    outputs=(Param("Y", "T", "same shape as X"),),
    attrs=(str_attr("mode", "normal", "channel pairing", choices=("normal", "neox")),
           int_attr("rotary_dims", 0, "channels rotated per head, even; 0 = all of head_dim", min=0),
           float_attr("theta", 10000.0, "frequency base (rope_theta); > 0", check=positive),
           str_attr("scaling_type", "none", "context-extension scheme",
                    choices=("none", "linear", "llama3", "yarn")),
           float_attr("factor", 1.0, "scaling factor; > 0", check=positive),
           int_attr("original_max_position", 0, "training context length (llama3, yarn)", min=0),
           float_attr("low_freq_factor", 1.0, "llama3 low-frequency band edge", check=positive),
           float_attr("high_freq_factor", 4.0, "llama3 high-frequency band edge", check=positive),
           float_attr("beta_fast", 32.0, "yarn extrapolation edge", min=0.0),
           float_attr("beta_slow", 1.0, "yarn interpolation edge", min=0.0),
           float_attr("attn_factor", 1.0, "yarn magnitude scale; > 0", check=positive)),
    types={"T": FLOATS, "P": INDEX_TYPES, "F": FLOAT_TYPES}, infer=rope_shape, kind=OpKind.ATTENTION,
    fusible=True, inplace=((0, 0),), cost=Cost.MEDIUM)


def _attention_heads(ctx: InferCtx, q: Shape, k: Shape, v: Shape) -> None:
    n_heads, n_kv, head_dim = (int(ctx.attr(a)) for a in ("n_heads", "n_kv_heads", "head_dim"))
    if n_heads and n_kv and n_heads % n_kv:
        ctx.fail(f"n_heads {n_heads} is not a multiple of n_kv_heads {n_kv}", "attr-range")
    if n_heads:
        _same(ctx, q[-2], n_heads, "q heads differ from n_heads")
    if n_kv:
        _same(ctx, k[-2], n_kv, "k heads differ from n_kv_heads")
    if head_dim:
        _same(ctx, q[-1], head_dim, "q head_dim differs from the head_dim attribute")
    _same(ctx, q[-1], k[-1], "q and k head_dim differ")
    _same(ctx, k[-3], v[-3], "k and v sequence lengths differ")
    _same(ctx, k[-2], v[-2], "k and v head counts differ")
    hq, hk = q[-2], k[-2]
    if isinstance(hq, int) and isinstance(hk, int) and (hk == 0 or hq % hk):
        ctx.fail(f"q has {hq} heads, not a multiple of the {hk} kv heads")


def _cache(ctx: InferCtx, i: int, new: Shape, what: str) -> Shape:
    """Shape of present = concat(past, new) along the sequence axis."""
    if not ctx.has(i):
        return new
    past = ctx.rank(i, len(new), len(new))
    _same(ctx, past[-2], new[-2], f"{what} heads differ from the new {what[-1]}")
    _same(ctx, past[-1], new[-1], f"{what} head_dim differs from the new {what[-1]}")
    return (*new[:-3], dim_add(past[-3], new[-3]), *new[-2:])


def attention_shape(ctx: InferCtx) -> Sequence[Shape | None]:
    q = ctx.rank(0, 3)
    k, v = ctx.rank(1, len(q), len(q)), ctx.rank(2, len(q), len(q))
    _attention_heads(ctx, q, k, v)
    if ctx.has(3) != ctx.has(4):
        ctx.fail("past_k and past_v must be given together", "arity")
    present_k, present_v = _cache(ctx, 3, k, "past_k"), _cache(ctx, 4, v, "past_v")
    if ctx.has(5):
        m = ctx.shape(5)
        want = (*q[:-3], q[-2], q[-3], present_k[-3])
        try:
            broadcast_shapes(want, m)
        except ShapeError:
            ctx.fail(f"mask {fmt_shape(m)} does not broadcast to [..., heads, seq, total] = "
                     f"{fmt_shape(want)}")
    y = (*q[:-1], v[-1])
    return [y, present_k, present_v][: ctx.n_outputs]


ATTENTION = OpSchema(
    Op.ATTENTION, 1,
    "Y = softmax(scale * Q K^T + mask) V per head, with K = concat(past_k, k) and V = concat(past_v, v) "
    "along the sequence axis. GQA/MQA: query head h reads kv head h // (n_heads / n_kv_heads). causal masks "
    "key j > past + i for query i; sliding_window > 0 also masks keys older than that many tokens, except "
    "the first `sinks` positions (attention-sink tokens), which stay visible. softcap > 0 applies softcap * "
    "tanh(s / softcap) to the scores. mask is additive (float) or a keep-mask (bool, true = attend), "
    "broadcast to [..., n_heads, seq, total]. present_k/present_v return the updated caches.",
    inputs=(Param("q", "T", "[..., seq, n_heads, head_dim]"),
            Param("k", "T", "[..., seq, n_kv_heads, head_dim]"),
            Param("v", "T", "[..., seq, n_kv_heads, head_dim_v]"),
            Param("past_k", "T", "[..., past, n_kv_heads, head_dim]", optional=True),
            Param("past_v", "T", "[..., past, n_kv_heads, head_dim_v]", optional=True),
            Param("mask", "M", "additive or boolean mask", optional=True)),
    outputs=(Param("Y", "T", "[..., seq, n_heads, head_dim_v]"),
             Param("present_k", "T", "[..., past + seq, n_kv_heads, head_dim]", optional=True),
             Param("present_v", "T", "[..., past + seq, n_kv_heads, head_dim_v]", optional=True)),
    attrs=(bool_attr("causal", True, "mask future keys"),
           int_attr("n_heads", 0, "query heads; 0 = from q's shape", min=0),
           int_attr("n_kv_heads", 0, "key/value heads (GQA/MQA); 0 = n_heads", min=0),
           int_attr("head_dim", 0, "channels per head; 0 = from q's shape", min=0),
           float_attr("scale", 0.0, "score scale; 0 = 1/sqrt(head_dim)", min=0.0),
           int_attr("sliding_window", 0, "keys visible per query; 0 = no window", min=0),
           int_attr("sinks", 0, "attention-sink tokens kept visible outside the window", min=0),
           float_attr("softcap", 0.0, "score soft-capping bound; 0 = none", min=0.0)),
    types={"T": FLOATS, "M": FLOATS | frozenset({DType.BOOL})}, infer=attention_shape, kind=OpKind.ATTENTION,
    cost=Cost.HIGH)

SCHEMAS = (ROPE, ATTENTION)

"""Attention contrib ops as IR Attention: com.microsoft GroupQueryAttention and MultiHeadAttention, and the two
internal ``uaii.kv`` ops the KV mapping (:mod:`.kv`) writes in their place.

Functional form (any ONNX graph): the op's caches are BNSH ``[batch, kv_heads, past, head]`` tensors; they are
transposed to the IR's ``[batch, past, kv_heads, head]`` and the presents transposed back, so ``Session.run`` gives
what onnxruntime gives. GroupQueryAttention's ``seqlens_k`` / ``total_sequence_length`` describe padded batches and
shared past/present buffers: onnxruntime takes each row's past length from ``seqlens_k`` and sizes the presents by
``total_sequence_length``. The IR's Attention has neither: it reads the past length from ``past_key``'s shape
(positions past .. past + seq - 1, every key visible up to the causal limit). So a functional GroupQueryAttention is
imported only where both are provably those of a batch without padding whose past buffer holds exactly the past
(``seqlens_k`` = past + seq - 1 in every row, ``total_sequence_length`` = past + seq, folded from shapes at load
time); one whose lengths come from run-time values (an ``attention_mask`` that may pad) is refused. A generative
model's layers are the cached form instead, where the KV mapping checks those lengths for generation.

Cached form (``uaii.kv`` domain, written by the KV mapping for batch-1 generation): the caches are the graph inputs
``past_k.N``/``past_v.N`` in the IR's KV convention (``[past, kv_heads, head]``, batch squeezed), the presents are
graph outputs, the positions are the graph input ``positions`` and there is no mask input: exactly what
``uaii.ir.kvcache.kv_layers`` recognises, so a backend binds the layer to its KV state (window and sinks included).
"""

from __future__ import annotations

import numpy as np

from uaii.ir import Dim, DType

from .context import NodeContext
from .contrib_rotary import arange_positions, cache_fit, rope
from .dispatch import MS_DOMAIN, onnx_op
from .fold import dim_binary, reshape_to
from .values import Value

KV_DOMAIN = "uaii.kv"
"""The domain of the ops the KV mapping writes; never found in a file (the mapping adds it to the opsets)."""
KV_GQA = "GroupQueryAttention"
KV_ATTENTION = "Attention"
POSITIONS_SLOT = 9
"""Where the cached GroupQueryAttention takes the graph's ``positions`` (GroupQueryAttention's position_ids slot)."""

_BNSH = (0, 2, 1, 3)  # [batch, heads, seq, head] <-> [batch, seq, heads, head]


def _static(ctx: NodeContext, d: Dim, what: str) -> int:
    if not isinstance(d, int):
        ctx.fail(f"{what} must be static, found the symbolic size {d!r}")
    return d


def _bsnh_cache(ctx: NodeContext, past: Value | None, heads: int, head: int, what: str) -> Value | None:
    """A functional BNSH cache input as the IR's [batch, past, heads, head]."""
    if past is None:
        return None
    if past.rank != 4 or past.shape[1] != heads or past.shape[3] != head:
        ctx.fail(f"{what} must be [batch, {heads}, past, {head}] (BNSH), found {list(past.shape)}")
    b, n, p, h = past.shape
    return ctx.emit("Transpose", [past], {"perm": _BNSH}, shape=(b, p, n, h))


def _bnsh(ctx: NodeContext, present: Value, used: bool) -> Value | None:
    if not used:
        return None
    b, s, n, h = present.shape
    return ctx.emit("Transpose", [present], {"perm": _BNSH}, shape=(b, n, s, h))


# --- GroupQueryAttention ----------------------------------------------------------------------------------------
def _gqa_refusals(ctx: NodeContext, cached: bool) -> None:
    """GroupQueryAttention features the IR's Attention has no counterpart for."""
    if int(ctx.attr("smooth_softmax", -1)) == 1 or ctx.optional(11) is not None:
        ctx.fail("smooth softmax / head_sink (a softmax with an extra sink term) is not supported")
    if int(ctx.attr("qk_output", 0)) and ctx.output_used(3):
        ctx.fail("output_qk (the attention scores) is not supported")
    quant = {str(ctx.attr(a, "NONE")).upper() for a in ("k_quant_type", "v_quant_type")}
    if quant != {"NONE"} or ctx.optional(12) is not None or ctx.optional(13) is not None:
        ctx.fail("a quantized KV cache (k_quant_type/v_quant_type, k_scale/v_scale) is not supported")
    if ctx.optional(14) is not None or ctx.optional(15) is not None:
        ctx.fail("q_norm_weight/k_norm_weight are not supported (the exported model normalizes q/k before this op "
                 "unless an execution provider fused it in)")
    if int(ctx.attr("sliding_window_cache", 0)) and not cached:
        ctx.fail("sliding_window_cache=1 (window-sized past/present buffers) is not supported outside generation")
    if cached and ctx.optional(10) is not None:
        ctx.fail("attention_bias on a cached layer is not supported (generation attends causally)")


def _split_qkv(ctx: NodeContext, heads: int, kv: int) -> tuple[Value, Value, Value, int]:
    """q, k, v [batch, seq, width] and the head size, from separate inputs or a packed query."""
    q = ctx.input(0)
    if q.rank != 3:
        ctx.fail(f"query must be [batch, seq, hidden], found {list(q.shape)}")
    batch, seq, width = q.shape
    width = _static(ctx, width, "the query's hidden size")
    key, value = ctx.optional(1), ctx.optional(2)
    if (key is None) != (value is None):
        ctx.fail("key and value must be given together (or both omitted for a packed query)")
    if key is None or value is None:
        if width % (heads + 2 * kv):
            ctx.fail(f"packed QKV width {width} is not (num_heads + 2 * kv_num_heads) = {heads + 2 * kv} heads")
        head = width // (heads + 2 * kv)
        sizes = (heads * head, kv * head, kv * head)
        q, key, value = ctx.emit_n("Split", [q], {"axis": -1, "split": sizes}, outputs=3,
                                   shapes=[(batch, seq, s) for s in sizes])
        return q, key, value, head
    if width % heads:
        ctx.fail(f"query width {width} is not a multiple of num_heads {heads}")
    head = width // heads
    for v, what in ((key, "key"), (value, "value")):
        if v.rank != 3 or v.shape[-1] != kv * head:
            ctx.fail(f"{what} must be [batch, seq, {kv * head}], found {list(v.shape)}")
    return q, key, value, head


def _gqa(ctx: NodeContext, cached: bool) -> list[Value | None]:
    heads, kv = int(ctx.need_attr("num_heads")), int(ctx.need_attr("kv_num_heads"))
    if heads <= 0 or kv <= 0 or heads % kv:
        ctx.fail(f"num_heads {heads} must be a positive multiple of kv_num_heads {kv}")
    _gqa_refusals(ctx, cached)
    q, k, v, head = _split_qkv(ctx, heads, kv)
    batch, seq = q.shape[0], q.shape[1]
    if cached and batch != 1:
        ctx.fail(f"a cached layer runs one sequence (batch 1), found batch {batch}")
    lead: tuple[Dim, ...] = () if cached else (batch,)
    q4 = reshape_to(ctx, q, (*lead, seq, heads, head))
    k4 = reshape_to(ctx, k, (*lead, seq, kv, head))
    v4 = reshape_to(ctx, v, (*lead, seq, kv, head))
    past_k: Value | None
    past_v: Value | None
    if cached:
        past_k, past_v = ctx.input(3), ctx.input(4)
        for p, what in ((past_k, "past_k"), (past_v, "past_v")):
            if p.rank != 3 or p.shape[1:] != (kv, head):
                ctx.fail(f"the cached {what} must be [past, {kv}, {head}], found {list(p.shape)}")
    else:
        past_k = _bsnh_cache(ctx, ctx.optional(3), kv, head, "past_key")
        past_v = _bsnh_cache(ctx, ctx.optional(4), kv, head, "past_value")
        if (past_k is None) != (past_v is None):
            ctx.fail("past_key and past_value must be given together")
        _full_lengths(ctx, batch, seq, past_k)
    if int(ctx.attr("do_rotary", 0)):
        fit = cache_fit(ctx, 7, 8)
        positions = _gqa_positions(ctx, cached, seq, past_k)
        interleaved = bool(ctx.attr("rotary_interleaved", 0))
        q4, k4 = rope(ctx, q4, positions, fit, interleaved), rope(ctx, k4, positions, fit, interleaved)
    causal = bool(ctx.attr("causal", 1))
    window = int(ctx.attr("local_window_size", -1))
    attrs = {"causal": causal, "n_heads": heads, "n_kv_heads": kv, "head_dim": head,
             "scale": float(ctx.attr("scale", 0.0)), "softcap": float(ctx.attr("softcap", 0.0)),
             "sliding_window": max(window, 0)}  # onnxruntime: the query sees local_window_size keys, itself included
    mask = None if cached else ctx.optional(10)
    y, present_k, present_v = ctx.emit_n("Attention", [q4, k4, v4, past_k, past_v, mask], attrs, outputs=3)
    out = reshape_to(ctx, y, (batch, seq, heads * head))
    if cached:
        cached_outs: list[Value | None] = [out, present_k, present_v]
        return cached_outs[: ctx.n_outputs]
    presents = [_bnsh(ctx, present_k, ctx.output_used(1)), _bnsh(ctx, present_v, ctx.output_used(2))]
    return [out, *presents][: ctx.n_outputs]


def _full_lengths(ctx: NodeContext, batch: Dim, seq: Dim, past_k: Value | None) -> None:
    """Refuse unless seqlens_k is past + seq - 1 in every row and total_sequence_length past + seq, as load-time
    dims (the module docstring says why)."""
    past: Dim = past_k.shape[1] if past_k is not None else 0
    total = dim_binary(ctx, "Add", past, seq)
    last = dim_binary(ctx, "Sub", total, 1) if total is not None else None
    seqlens, given = ctx.dims(5), ctx.dims(6)
    if isinstance(batch, int) and last is not None and seqlens == (last,) * batch and given == (total,):
        return

    def shown(dims: tuple[Dim, ...] | None) -> str:
        return "computed at run time" if dims is None else str(list(dims))

    ctx.fail(f"seqlens_k {shown(seqlens)} and total_sequence_length {shown(given)} (batch {batch}) are not provably "
             f"{[last] * batch if isinstance(batch, int) else f'[{last}] * batch'} and {[total]}: onnxruntime takes "
             "each row's past length from them and the IR's Attention from past_key's shape, which agree only for a "
             "batch without padding (run a generative model through the KV mapping, which checks them)")


def _gqa_positions(ctx: NodeContext, cached: bool, seq: Dim, past_k: Value | None) -> Value:
    """The rotary positions: the graph's ``positions`` when cached, else position_ids or past .. past + seq - 1."""
    given = ctx.optional(POSITIONS_SLOT)
    if cached:
        if given is None or given.rank != 1:
            ctx.fail("a cached layer takes the 1-D positions input")
        return given
    if given is not None:
        return given
    return arange_positions(ctx, past_k.shape[1] if past_k is not None else 0, seq)


@onnx_op(MS_DOMAIN, "GroupQueryAttention", 1)
def group_query_attention(ctx: NodeContext) -> list[Value | None]:
    """Attention (+ RoPE for do_rotary; BNSH caches transposed; seqlens_k/total_sequence_length provably unpadded)"""
    return _gqa(ctx, cached=False)


@onnx_op(KV_DOMAIN, KV_GQA, 1)
def cached_group_query_attention(ctx: NodeContext) -> list[Value | None]:
    """Attention on the KV cache (internal: what the KV mapping makes of a GroupQueryAttention)"""
    return _gqa(ctx, cached=True)


# --- MultiHeadAttention -----------------------------------------------------------------------------------------
def _padding_mask(ctx: NodeContext, mask: Value, filter_value: float) -> Value:
    """A [batch, total] key padding mask (1 = attend) as the additive mask (1 - m) * mask_filter_value."""
    if mask.rank != 2:
        ctx.fail(f"only a [batch, total] key_padding_mask is supported, found {list(mask.shape)}")
    b, t = mask.shape
    m = ctx.emit("Cast", [mask], {"to": DType.F32.value}, dtype=DType.F32, shape=mask.shape)
    off = ctx.emit("Sub", [ctx.constant(np.float32(1.0)), m], shape=mask.shape)
    add = ctx.emit("Mul", [off, ctx.constant(np.float32(filter_value))], shape=mask.shape)
    return reshape_to(ctx, add, (b, 1, 1, t))


@onnx_op(MS_DOMAIN, "MultiHeadAttention", 1)
def multi_head_attention(ctx: NodeContext) -> list[Value | None]:
    """Attention (separate 3-D q/k/v, optional bias, masks and BNSH past)"""
    heads = int(ctx.need_attr("num_heads"))
    q, k, v = ctx.input(0), ctx.optional(1), ctx.optional(2)
    if k is None or v is None or q.rank != 3 or k.rank != 3 or v.rank != 3:
        ctx.fail("only separate 3-D query, key and value are supported (not packed QKV/KV or BNSH key/value)")
    for i, what in ((8, "past_sequence_length"), (9, "cache_indirection")):
        if ctx.optional(i) is not None:
            ctx.fail(f"{what} (shared past/present buffers, beam search) is not supported")
    if ctx.output_used(3):
        ctx.fail("output qk (the attention scores) is not supported")
    batch, seq, width = q.shape
    width = _static(ctx, width, "the query's hidden size")
    v_width = _static(ctx, v.shape[-1], "the value's hidden size")
    if width % heads or v_width % heads or k.shape[-1] != width:
        ctx.fail(f"hidden sizes q {width}, k {k.shape[-1]}, v {v_width} do not split into {heads} heads")
    head, v_head = width // heads, v_width // heads
    bias = ctx.optional(3)
    if bias is not None:
        parts = ctx.emit_n("Split", [bias], {"axis": 0, "split": (width, width, v_width)}, outputs=3,
                           shapes=[(width,), (width,), (v_width,)])
        q, k, v = (ctx.emit("Add", [x, b], shape=x.shape) for x, b in zip((q, k, v), parts, strict=True))
    q4 = reshape_to(ctx, q, (batch, seq, heads, head))
    k4 = reshape_to(ctx, k, (batch, k.shape[1], heads, head))
    v4 = reshape_to(ctx, v, (batch, v.shape[1], heads, v_head))
    past_k = _bsnh_cache(ctx, ctx.optional(6), heads, head, "past_key")
    past_v = _bsnh_cache(ctx, ctx.optional(7), heads, v_head, "past_value")
    if (past_k is None) != (past_v is None):
        ctx.fail("past_key and past_value must be given together")
    mask: Value | None = None
    padding = ctx.optional(4)
    if padding is not None:
        mask = _padding_mask(ctx, padding, float(ctx.attr("mask_filter_value", -10000.0)))
    bias_mask = ctx.optional(5)
    if bias_mask is not None:
        mask = bias_mask if mask is None else ctx.emit("Add", [mask, bias_mask])
    attrs = {"causal": bool(ctx.attr("unidirectional", 0)), "n_heads": heads, "n_kv_heads": heads,
             "head_dim": head, "scale": float(ctx.attr("scale", 0.0))}
    y, present_k, present_v = ctx.emit_n("Attention", [q4, k4, v4, past_k, past_v, mask], attrs, outputs=3)
    out = reshape_to(ctx, y, (batch, seq, heads * v_head))
    presents = [_bnsh(ctx, present_k, ctx.output_used(1)), _bnsh(ctx, present_v, ctx.output_used(2))]
    return [out, *presents][: ctx.n_outputs]


# --- the decomposed attention of an exported model, replaced by the KV mapping -----------------------------------
@onnx_op(KV_DOMAIN, KV_ATTENTION, 1)
def cached_attention(ctx: NodeContext) -> list[Value | None]:
    """Attention on the KV cache (internal: what the KV mapping makes of an exporter's MatMul/Softmax attention)"""
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    past_k, past_v = ctx.input(3), ctx.input(4)
    if q.rank != 4 or k.rank != 4 or v.rank != 4 or q.shape[0] != 1:
        ctx.fail(f"q/k/v must be [1, heads, seq, head], found {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    _, heads, _seq, head = q.shape
    kv = _static(ctx, k.shape[1], "the number of kv heads")
    heads = _static(ctx, heads, "the number of heads")
    if heads % kv:
        ctx.fail(f"{heads} query heads do not share {kv} kv heads evenly")

    def seq_major(x: Value) -> Value:  # [1, n, seq, h] -> [seq, n, h]
        _, n, s, h = x.shape
        return ctx.emit("Transpose", [reshape_to(ctx, x, (n, s, h))], {"perm": (1, 0, 2)}, shape=(s, n, h))

    attrs = {"causal": bool(ctx.attr("causal", 1)), "n_heads": heads, "n_kv_heads": kv, "head_dim": head,
             "scale": float(ctx.need_attr("scale")), "softcap": float(ctx.attr("softcap", 0.0)),
             "sliding_window": int(ctx.attr("sliding_window", 0))}
    y, present_k, present_v = ctx.emit_n("Attention", [seq_major(q), seq_major(k), seq_major(v), past_k, past_v],
                                         attrs, outputs=3)
    s, n, h = y.shape
    heads_major = ctx.emit("Transpose", [y], {"perm": (1, 0, 2)}, shape=(n, s, h))
    outs: list[Value | None] = [reshape_to(ctx, heads_major, (1, n, s, h)), present_k, present_v]
    return outs[: ctx.n_outputs]


__all__ = ["KV_ATTENTION", "KV_DOMAIN", "KV_GQA", "POSITIONS_SLOT", "cached_attention",
           "cached_group_query_attention", "group_query_attention", "multi_head_attention"]

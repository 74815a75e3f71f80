"""Rotary embeddings from cos/sin caches: com.microsoft RotaryEmbedding, ai.onnx RotaryEmbedding-23, and the
rotation GroupQueryAttention applies with ``do_rotary``.

ONNX Runtime's ops rotate by *tables*: row p of ``cos_cache``/``sin_cache`` holds cos/sin(p * inv_freq[i]) (times a
magnitude, for YaRN/longrope exports). The IR's RoPE computes those angles from a frequency rule instead, which is
what keeps positions unbounded, lets the KV cache re-rotate keys when a window compacts, and runs without a table.
So a cache is *fitted*: its per-channel frequencies are recovered (phase unwrapped row by row) and the IR RoPE
reproduces them exactly, through ``theta`` alone when they are theta^(-2i/rot), otherwise through ``freq_factors``
(the same per-frequency divisors a GGUF llama3/longrope model carries), and a constant magnitude through RoPE's
yarn ``attn_factor`` with factor 1 (which leaves the frequencies alone). A table that is not cos/sin of
position x frequency at a constant magnitude is refused with the row and channel that disagree: the IR cannot
express it, and a silent approximation would change every token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from uaii.ir import Dim, DType

from .context import NodeContext
from .dispatch import AI_ONNX, MS_DOMAIN, onnx_op
from .fold import dim_binary, reshape_known, reshape_to
from .values import Value

CACHE_LIMIT = 1 << 28
"""Bytes of one cos/sin cache read at load time to fit it (a 1M-position table of 64 float32 columns); a larger
one is refused before it is read."""
FIT_CHUNK = 1 << 16
"""Elements of the cache :func:`fit_rotary` works on at a time: its float64 temporaries stay a few MiB whatever the
table's size (the tables themselves are the only large arrays)."""


@dataclass(frozen=True)
class RotaryFit:
    """IR RoPE parameters that reproduce a cos/sin cache: ``rot`` rotated channels, ``theta``, ``freq_factors``
    (None when theta alone gives the frequencies), ``magnitude`` (1 unless the table is scaled) and ``rows`` (the
    positions the table holds: the model's context, as far as the exporter knew)."""

    rot: int
    theta: float
    freq_factors: np.ndarray | None
    magnitude: float
    rows: int

    def attrs(self, head_dim: Dim, interleaved: bool) -> dict[str, object]:
        """IR RoPE attributes; ``interleaved`` pairs (2i, 2i+1) (RoPE 'normal'), else halves (RoPE 'neox')."""
        attrs: dict[str, object] = {"mode": "normal" if interleaved else "neox",
                                    "rotary_dims": 0 if head_dim == self.rot else self.rot, "theta": self.theta}
        if abs(self.magnitude - 1.0) > 1e-6:
            attrs.update(scaling_type="yarn", factor=1.0, attn_factor=self.magnitude,
                         original_max_position=max(self.rows, 1))
        return attrs


def fit_rotary(cos: np.ndarray, sin: np.ndarray, chunk: int = FIT_CHUNK) -> RotaryFit | str:
    """The RoPE that gives the tables ``cos``/``sin`` ([rows, rot/2]), or why there is none (a message). Works on
    ``chunk`` elements at a time (rows in float64)."""
    if cos.ndim != 2 or cos.shape != sin.shape:
        return f"cos/sin caches must be 2-D and alike, found {list(cos.shape)} and {list(sin.shape)}"
    rows, half = cos.shape
    if rows < 2 or half < 1:
        return f"a cos/sin cache of shape {list(cos.shape)} holds too few positions to tell its frequencies"
    eps = float(np.finfo(cos.dtype).eps) if cos.dtype.kind == "f" else 1e-7
    step = max(1, chunk // half)
    spans = [(a, min(a + step, rows)) for a in range(0, rows, step)]

    def part(a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        return cos[a:b].astype(np.float64), sin[a:b].astype(np.float64)

    for a, b in spans:
        c, s = part(a, b)
        if not (np.isfinite(c).all() and np.isfinite(s).all()):
            r = a + int(np.nonzero(~(np.isfinite(c) & np.isfinite(s)))[0][0])
            return f"the cos/sin caches hold a value that is not finite (row {r})"
    magnitude = float(np.hypot(*part(0, 1)).mean())
    if not magnitude > 0:
        return "the cos/sin caches do not rotate: their first row is all zeros"
    for a, b in spans:
        if np.max(np.abs(np.hypot(*part(a, b)) - magnitude)) > 8 * eps * magnitude + 1e-6:
            return "the cos/sin caches do not have one magnitude (cos^2 + sin^2 varies), so no rotation gives them"
    inv = _frequencies(cos, sin, rows)
    for a, b in spans:
        c, s = part(a, b)
        angle = np.arange(a, b, dtype=np.float64)[:, None] * inv[None, :]
        tol = 4 * eps * magnitude + 2.5 * eps * np.abs(angle) * magnitude + 1e-7
        bad = (np.abs(magnitude * np.cos(angle) - c) > tol) | (np.abs(magnitude * np.sin(angle) - s) > tol)
        if bad.any():
            r, i = (int(v[0]) for v in np.nonzero(bad))
            return (f"the cos/sin caches are not cos/sin(position x frequency): row {a + r}, column {i} differs from "
                    f"the frequency the first rows give ({inv[i]:.6g})")
    if np.any(inv <= 0):
        return "the cos/sin caches rotate some channel pair backwards or not at all (frequency <= 0)"
    rot = 2 * half
    theta = float(inv[1] ** (-rot / 2)) if half > 1 else 10000.0
    if not math.isfinite(theta) or theta <= 1.0:
        theta = 10000.0
    base = theta ** (-np.arange(0, rot, 2, dtype=np.float64) / rot)
    factors = base / inv
    pure = bool(np.max(np.abs(factors - 1.0)) <= 1e-5)
    return RotaryFit(rot, theta, None if pure else factors.astype(np.float32), magnitude, rows)


def _frequencies(cos: np.ndarray, sin: np.ndarray, rows: int) -> np.ndarray:
    """Each column's angular frequency, unwrapped over rows 1, 2, 4, ..., rows - 1: each row's phase refines the
    frequency the previous rows fixed (one row at a time in float64)."""
    def phase(p: int) -> np.ndarray:
        return np.arctan2(sin[p].astype(np.float64), cos[p].astype(np.float64))

    inv = phase(1)
    p = 2
    while p < rows:
        k = np.round((p * inv - phase(p)) / (2 * math.pi))
        inv = (phase(p) + 2 * math.pi * k) / p
        p = p * 2 if p * 2 < rows or p == rows - 1 else rows - 1
    return inv


def cache_fit(ctx: NodeContext, cos_slot: int, sin_slot: int) -> RotaryFit:
    """The fit of the node's cos/sin cache inputs, which must be known at load time. Every layer of a model names
    the same two initializers: they are fitted once per import (remembered on the graph being built)."""
    names = tuple(v.name if v is not None else "" for v in (ctx.optional(cos_slot), ctx.optional(sin_slot)))
    fits: dict[tuple[str, ...], RotaryFit] = ctx.builder.__dict__.setdefault("_rotary_fits", {})
    if all(names) and names in fits:
        return fits[names]
    fit = _cache_fit(ctx, cos_slot, sin_slot)
    if all(names):
        fits[names] = fit
    return fit


def _cache_fit(ctx: NodeContext, cos_slot: int, sin_slot: int) -> RotaryFit:
    for slot, what in ((cos_slot, "cos_cache"), (sin_slot, "sin_cache")):
        v = ctx.optional(slot)
        if v is not None and all(isinstance(d, int) for d in v.shape):
            nbytes = math.prod(int(d) for d in v.shape) * np.dtype(v.dtype.numpy).itemsize
            if nbytes > CACHE_LIMIT:
                ctx.fail(f"{what} {list(v.shape)} is {nbytes} bytes; a rotary cache is read at load time to fit the "
                         f"IR's RoPE to it, and one of more than {CACHE_LIMIT} bytes is not")
    cos, sin = ctx.const(cos_slot, CACHE_LIMIT), ctx.const(sin_slot, CACHE_LIMIT)
    if cos is None or sin is None:
        ctx.fail("the cos/sin caches must be initializers or constants (computed at run time, the IR's RoPE cannot "
                 "take them)")
    if cos.dtype.kind != "f" or sin.dtype.kind != "f":
        ctx.fail(f"cos/sin caches must be floating point, found {cos.dtype} and {sin.dtype}")
    fit = fit_rotary(np.asarray(cos), np.asarray(sin))
    if isinstance(fit, str):
        ctx.fail(fit)
    return fit


def rope(ctx: NodeContext, x: Value, positions: Value, fit: RotaryFit, interleaved: bool) -> Value:
    """IR RoPE of ``x`` ([..., seq, heads, head_dim]) at ``positions`` ([seq] or [..., seq]) with a fitted cache."""
    head_dim = x.shape[-1]
    if isinstance(head_dim, int) and fit.rot > head_dim:
        ctx.fail(f"the cos/sin caches rotate {fit.rot} channels but a head has {head_dim}")
    inputs: list[Value | None] = [x, positions]
    if fit.freq_factors is not None:
        inputs.append(ctx.constant(fit.freq_factors))
    return ctx.emit("RoPE", inputs, fit.attrs(head_dim, interleaved), shape=x.shape)


def arange_positions(ctx: NodeContext, start: Dim, count: Dim) -> Value:
    """Positions ``start .. start + count - 1`` as a 1-D int64 value (folded when both are numbers)."""
    if isinstance(start, int) and isinstance(count, int):
        return ctx.constant(np.arange(start, start + count, dtype=np.int64))
    end = dim_binary(ctx, "Add", start, count)
    if end is None:
        ctx.fail(f"cannot compute the positions {start} .. {start} + {count}")
    lo = reshape_known(Value.of_dims([start]), ())
    hi = reshape_known(Value.of_dims([end]), ())
    return ctx.emit("Range", [lo, hi, ctx.constant(np.asarray(1, np.int64))], dtype=DType.I64, shape=(count,))


def _offset_positions(ctx: NodeContext, offset: Value, seq: Dim) -> Value:
    """A [1] position offset: positions = offset + 0 .. seq-1 (the contrib op's 1-D position_ids form)."""
    base = arange_positions(ctx, 0, seq)
    scalar = reshape_to(ctx, offset, ()) if offset.name else reshape_known(offset, ())
    return ctx.emit("Add", [base, scalar], shape=(seq,))


def _rotary_embedding(ctx: NodeContext, x: Value, positions: Value | None, cos_slot: int, sin_slot: int) -> Value:
    """Shared by both RotaryEmbedding ops: 3-D [batch, seq, hidden] or 4-D [batch, heads, seq, head] input."""
    interleaved = bool(ctx.attr("interleaved", 0))
    num_heads = int(ctx.attr("num_heads", 0))
    fit = cache_fit(ctx, cos_slot, sin_slot)
    rot_attr = int(ctx.attr("rotary_embedding_dim", 0))
    if rot_attr and rot_attr != fit.rot:
        ctx.fail(f"rotary_embedding_dim {rot_attr} differs from the {fit.rot} channels the cos/sin caches rotate")
    if x.rank == 4:
        batch, heads, seq, head = x.shape
        x4 = ctx.emit("Transpose", [x], {"perm": (0, 2, 1, 3)}, shape=(batch, seq, heads, head))
    elif x.rank == 3:
        batch, seq, hidden = x.shape
        if not isinstance(hidden, int):
            ctx.fail("a 3-D input needs a static hidden size")
        head = hidden // num_heads if num_heads else fit.rot
        if head <= 0 or hidden % head:
            ctx.fail(f"hidden size {hidden} is not a whole number of heads of {head} channels")
        heads = hidden // head
        x4 = reshape_to(ctx, x, (batch, seq, heads, head))
    else:
        ctx.fail(f"the input must be 3-D or 4-D, found rank {x.rank}")
    if positions is None:
        pos = arange_positions(ctx, 0, seq)
    elif positions.rank == 1 and positions.shape[0] == 1 and seq != 1:
        pos = _offset_positions(ctx, positions, seq)
    elif positions.rank in (1, 2):
        pos = positions
    else:
        ctx.fail(f"position_ids must be [batch, seq] or [1], found {list(positions.shape)}")
    y = rope(ctx, x4, pos, fit, interleaved)
    if x.rank == 4:
        return ctx.emit("Transpose", [y], {"perm": (0, 2, 1, 3)}, shape=x.shape)
    return reshape_to(ctx, y, x.shape)


@onnx_op(MS_DOMAIN, "RotaryEmbedding", 1)
def rotary_embedding(ctx: NodeContext) -> Value:
    """RoPE (cos/sin caches fitted to theta / freq_factors; 3-D inputs reshaped to heads, 4-D transposed)"""
    if int(ctx.attr("is_packed_batching", 0)):
        ctx.fail("is_packed_batching=1 (ragged batches) is not supported")
    scale = float(ctx.attr("scale", 1.0))
    if scale != 1.0:
        ctx.fail(f"scale={scale} is not supported (only 1.0)")
    return _rotary_embedding(ctx, ctx.input(0), ctx.input(1), 2, 3)


@onnx_op(AI_ONNX, "RotaryEmbedding", 23)
def rotary_embedding_23(ctx: NodeContext) -> Value:
    """RoPE (2-D cos/sin caches with position_ids, fitted to theta / freq_factors)"""
    positions = ctx.optional(3)
    if ctx.input(0).rank == 3 and not int(ctx.attr("num_heads", 0)):
        ctx.fail("a 3-D input needs the num_heads attribute")
    if positions is None:
        ctx.fail("cos/sin caches indexed by position (3-D, no position_ids) are not supported; the IR's RoPE needs "
                 "the positions")
    return _rotary_embedding(ctx, ctx.input(0), positions, 1, 2)


__all__ = ["CACHE_LIMIT", "FIT_CHUNK", "RotaryFit", "arange_positions", "cache_fit", "fit_rotary", "rope"]

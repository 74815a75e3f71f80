"""Proof that what the KV mapping dropped was what the IR Attention does, and the graph without the probes.

An exporter's attention adds a mask built from ``attention_mask``, positions and the cache length, and repeats the
kv heads with shapes it computes at run time; a GroupQueryAttention reads the past length from ``seqlens_k``. The
mapping replaced each attention by an IR Attention (causal, maybe a sliding window, kv head h serving query heads
h*g .. h*g+g-1, the past length from the cache) and kept each such value as an extra graph output, a *probe*
(:class:`~.kv_match.Probe`). Here the probes are evaluated with uaii.ir's reference on the imported graph — only
that arithmetic runs: the cache inputs are fed as zero-stride arrays and no weight is read — at a few (seq, past)
sizes and, where there are masks, at the model's whole context (where a sliding window of any length up to it
shows). Each must say exactly what the IR Attention does; a layer's Attention gets the ``causal`` and
``sliding_window`` its masks show, and the probes are removed with every node only they needed.

Evaluating a mask at a long context is cheap when its computation grows linearly with the tokens (one query row);
one that grows faster is measured at two small sizes first and refused when the whole context would take more than
:data:`PROBE_BYTES`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from uaii.ir import Graph, Node, Tensor, UaiiError, needed_nodes, restricted
from uaii.ir.reference import evaluate, visible

from .kv import POSITIONS, TOKENS, Layer, NotMappable
from .kv_match import MASK_KINDS, MASKED

SIZES = ((4, 0), (1, 5), (3, 6), (2, 9))
"""(new tokens, cached tokens) at which every probe is checked: a prefill, decode steps, a chunk after a past."""
DEFAULT_CONTEXT = 8192
"""Tokens the masks are checked at when the model does not tell its context (the mapping then records it as the
model's ``context_length``, so that no sequence runs past what was checked)."""
PROBE_BYTES = 1 << 29
"""The most memory the long mask probe may take (values it computes, summed)."""
GAUGE = 512
"""Tokens of the two small probes that measure how a mask's computation grows (GAUGE and 2 * GAUGE)."""


class _WeightRead(Exception):
    pass


def _no_weights(t: Tensor) -> np.ndarray:
    raise _WeightRead(t.name)


def _feeds(graph: Graph, seq: int, past: int) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {TOKENS: np.zeros(seq, np.int64),
                                    POSITIONS: np.arange(past, past + seq, dtype=np.int64)}
    for name in graph.inputs:
        if name.startswith(("past_k.", "past_v.")):
            t = graph.tensor(name)
            dims = tuple(int(d) for d in t.shape[1:])
            feeds[name] = np.broadcast_to(np.zeros((), t.dtype.numpy), (past, *dims))
    return feeds


def _evaluate(graph: Graph, probes: Sequence[str], seq: int, past: int) -> dict[str, np.ndarray]:
    try:
        return evaluate(graph, _feeds(graph, seq, past), _no_weights, outputs=probes)
    except _WeightRead as exc:
        raise NotMappable(f"the attention's masks or shapes read the weight {exc.args[0]!r}, so they are not only a "
                          "function of positions") from None
    except (UaiiError, MemoryError, ValueError) as exc:
        raise NotMappable(f"the attention's masks or shapes cannot be evaluated to check them ({exc})") from None


# --- masks ----------------------------------------------------------------------------------------------------
def _visible(layer: Layer, values: dict[str, np.ndarray], seq: int, total: int) -> np.ndarray:
    """Bool [seq, total]: the keys each query sees under all of the layer's masks."""
    keep = np.ones((seq, total), dtype=bool)
    for probe in layer.probes:
        if probe.kind not in MASK_KINDS:
            continue
        name, arr = probe.value, np.asarray(values[probe.value])
        if probe.kind == "add":
            if arr.dtype.kind != "f":
                raise NotMappable(f"layer {layer.index}: the additive mask {name!r} is not floating point")
            vis = arr == 0
            hidden = arr.astype(np.float64) * probe.factor <= MASKED  # as large negative after the scales too
            if np.any(~vis & ~hidden):
                raise NotMappable(f"layer {layer.index}: the attention adds values other than 0 and a large "
                                  f"negative number ({name!r}"
                                  f"{f', scaled by {probe.factor:g} afterwards' if probe.factor != 1.0 else ''}: "
                                  "a bias such as ALiBi, not a mask)")
        else:
            vis = arr.astype(bool) if probe.kind == "keep" else ~arr.astype(bool)
        try:
            full = np.broadcast_to(vis, np.broadcast_shapes(vis.shape, (seq, total)))
        except ValueError:
            raise NotMappable(f"layer {layer.index}: the mask {name!r} has shape {list(arr.shape)}, not [..., "
                              f"{seq}, {total}]") from None
        rows = full.reshape(-1, seq, total)
        if not (rows == rows[0]).all():
            raise NotMappable(f"layer {layer.index}: the mask {name!r} differs between heads or batch rows")
        keep &= rows[0]
    return keep


def _pattern(layer: Layer, first: np.ndarray, long: np.ndarray) -> tuple[bool, int]:
    """(causal, sliding_window) that the prefill probe ``first`` [4, 4] and the long probe [1, N] show (then
    checked at every size by the caller)."""
    later = first[0, 1:]  # what the first query of a prompt sees of the tokens after it
    if later.all() or not later.any():
        causal = not later.any()
    else:
        raise NotMappable(f"layer {layer.index}: the first token of a prompt sees some later tokens and not others")
    row = long[0]
    n = int(row.sum())
    if n == row.size:
        return causal, 0
    if n == 0 or not row[-n:].all() or row[:-n].any():
        raise NotMappable(f"layer {layer.index}: after {row.size - 1} tokens the mask is not a window of the most "
                          "recent keys")
    return causal, n


def _mask_settings(layer: Layer, seen: dict[tuple[int, int], dict[str, np.ndarray]], long: tuple[int, int]) -> \
        tuple[bool, int]:
    vis = {(s, p): _visible(layer, values, s, s + p) for (s, p), values in seen.items()}
    causal, window = _pattern(layer, vis[(4, 0)], vis[long])
    for (s, p), got in vis.items():
        want = visible(s, s + p, causal=causal, sliding_window=window)
        if not np.array_equal(got, want):
            raise NotMappable(f"layer {layer.index}: the attention mask is not causal"
                              f"{f' with a window of {window}' if window else ''} at {s} new and {p} cached tokens")
    return causal, window


# --- head repeats and GroupQueryAttention's lengths ---------------------------------------------------------------
def _onnx_reshape(src: tuple[int, ...], target: np.ndarray) -> tuple[int, ...] | None:
    """ONNX Reshape's output shape (allowzero=0: a 0 copies the input's dim, one -1 is inferred); None if invalid."""
    dims = [int(d) for d in target.reshape(-1)]
    if any(d == 0 and i >= len(src) for i, d in enumerate(dims)) or dims.count(-1) > 1 or min(dims, default=0) < -1:
        return None
    out = [src[i] if d == 0 else d for i, d in enumerate(dims)]
    size, known = math.prod(src), math.prod(d for d in out if d != -1)
    if -1 in out:
        if known == 0 or size % known:
            return None
        out[out.index(-1)] = size // known
    return tuple(out) if math.prod(out) == size else None


def _broadcast(src: tuple[int, ...], shape: np.ndarray) -> tuple[int, ...]:
    """ONNX Expand's output shape for ``src`` and the shape vector ``shape``; () when they do not broadcast."""
    if shape.dtype.kind not in "iu" or shape.ndim != 1:
        return ()
    try:
        return tuple(int(d) for d in np.broadcast_shapes(src, tuple(int(d) for d in shape)))
    except ValueError:
        return ()


def _check_repeat(layer: Layer, values: dict[str, np.ndarray], total: int, heads: int) -> None:
    """Each head repeat (``expand:<side>`` / ``reshape:<side>``) must turn the cache [1, kv, total, d] into
    [1, kv * g, total, d] by repeating every kv head g times in place, with kv * g the query heads (or one head
    for all): what the IR Attention's grouping does."""
    for side, what, dim in (("k", "keys", layer.head_dim), ("v", "values", layer.v_head_dim or layer.head_dim)):
        expand = next((p for p in layer.probes if p.kind == f"expand:{side}"), None)
        target = next((p for p in layer.probes if p.kind == f"reshape:{side}"), None)
        if expand is None or target is None:
            continue
        kv, shape = layer.kv_heads, np.asarray(values[expand.value])
        src = (1, kv, 1, total, dim)
        out = _broadcast(src, shape)
        if not out:
            raise NotMappable(f"layer {layer.index}: the head repeat of the {what} expands {list(src)} by "
                              f"{shape.tolist()}, which does not broadcast")
        group = out[2] if len(out) == 5 else 0
        if len(out) != 5 or out[:2] != (1, kv) or out[3:] != (total, dim) or group < 1:
            raise NotMappable(f"layer {layer.index}: the head repeat of the {what} expands {list(src)} to "
                              f"{list(out)}, not [1, {kv}, g, {total}, {dim}] (each kv head repeated in place)")
        got = _onnx_reshape(out, np.asarray(values[target.value]))
        if got != (1, kv * group, total, dim) or kv * group not in (heads, 1):
            raise NotMappable(f"layer {layer.index}: the head repeat of the {what} reshapes {list(out)} to "
                              f"{list(got) if got else 'an invalid shape'}, not [1, {heads}, {total}, {dim}]: its kv "
                              "heads do not serve the query heads as the IR's Attention groups them")


def _check_gqa(layer: Layer, values: dict[str, np.ndarray], seq: int, past: int) -> None:
    """seqlens_k = total - 1, total_sequence_length = total and position_ids = past .. total - 1: one sequence
    without padding, which is what the cached layer assumes (it reads the past length from the cache)."""
    total = seq + past
    wants = {"seqlens": ("seqlens_k", [total - 1]), "total": ("total_sequence_length", [total]),
             "positions": ("position_ids", list(range(past, total)))}
    for probe in layer.probes:
        if probe.kind not in wants:
            continue
        name, want = wants[probe.kind]
        arr = np.asarray(values[probe.value])
        if arr.dtype.kind not in "iu" or arr.reshape(-1).tolist() != want:
            raise NotMappable(f"layer {layer.index}: GroupQueryAttention's {name} is {arr.reshape(-1)[:8].tolist()} "
                              f"at {seq} new and {past} cached tokens, not {want[:8]} (one sequence without padding, "
                              "which generation feeds)")


def _heads(graph: Graph, layers: list[Layer]) -> dict[int, int]:
    """Query heads of each layer's IR Attention."""
    by_present = {la.present_k: la.index for la in layers}
    found: dict[int, int] = {}
    for n in graph.nodes:
        idx = next((by_present[o] for o in n.outputs if o in by_present), None)
        if n.op == "Attention" and idx is not None:
            found[idx] = int(n.get("n_heads") or 0)
    return found


# --- the cost of the long probe -----------------------------------------------------------------------------------
def _inner(graph: Graph, outputs: Sequence[str]) -> list[str]:
    """Every value the reference computes for ``outputs``."""
    needed = needed_nodes([(n.inputs, n.outputs) for n in graph.nodes], outputs)
    return [o for i in needed for o in graph.nodes[i].outputs if o]


def _held(arr: np.ndarray) -> int:
    """Bytes ``arr`` holds: a zero-stride (broadcast) axis holds one element."""
    a = np.asarray(arr)
    return a.itemsize * math.prod(d for d, st in zip(a.shape, a.strides, strict=True) if st != 0)


def _check_cost(graph: Graph, probes: Sequence[str], total: int) -> None:
    """Refuse a long probe whose values would take more than :data:`PROBE_BYTES`, measured at GAUGE and
    2 * GAUGE tokens and extrapolated with the growth they show (linear for every exporter's mask)."""
    if total <= 4 * GAUGE:
        return
    inner = _inner(graph, probes)
    small, big = (sum(_held(v) for v in _evaluate(graph, inner, 1, n - 1).values()) for n in (GAUGE, 2 * GAUGE))
    growth = max(1.0, math.log2(big / small)) if small else 1.0
    estimate = big * (total / (2 * GAUGE)) ** growth
    if estimate > PROBE_BYTES:
        raise NotMappable(f"checking the attention masks at the model's context of {total} tokens would take about "
                          f"{estimate / (1 << 30):.1f} GiB (their computation grows as tokens^{growth:.1f}), more "
                          f"than the {PROBE_BYTES >> 20} MiB allowed")


# --- the whole check ----------------------------------------------------------------------------------------------
def verify_layers(graph: Graph, layers: Iterable[Layer], context: int) -> Graph:
    """``graph`` with each decomposed layer's causal/window set from its probes and the probes removed; raises
    NotMappable when a probe is not what the IR Attention does. ``context``: the most tokens a sequence holds (the
    long mask probe's length; at least a few)."""
    layers = list(layers)
    probes = list(dict.fromkeys(p.value for la in layers for p in la.probes))
    sizes: list[tuple[int, int]] = list(SIZES)
    long = (1, max(context, 16) - 1)
    if any(la.masked for la in layers):
        sizes += [long, (3, long[1] - 2)]  # a decode step and a chunk that end at the context
        _check_cost(graph, probes, long[1] + 1)
    seen = {(s, p): _evaluate(graph, probes, s, p) for s, p in sizes} if probes else {}
    heads = _heads(graph, layers)
    settings: dict[int, tuple[bool, int]] = {}
    for la in layers:
        for (s, p), values in seen.items():
            _check_repeat(la, values, s + p, heads.get(la.index, 0))
            _check_gqa(la, values, s, p)
        if la.kind == "attention":  # without a mask every query sees every key, as in the export
            settings[la.index] = _mask_settings(la, seen, long) if la.masked else (False, 0)
    return _without(_patched(graph, layers, settings), set(probes))


def _patched(graph: Graph, layers: list[Layer], settings: dict[int, tuple[bool, int]]) -> Graph:
    by_present = {la.present_k: la.index for la in layers if la.index in settings}
    nodes: list[Node] = []
    for n in graph.nodes:
        idx = next((by_present[o] for o in n.outputs if o in by_present), None)
        if n.op == "Attention" and idx is not None:
            causal, window = settings[idx]
            attrs: dict[str, Any] = {k: a.value for k, a in n.attributes}
            attrs.update(causal=causal, sliding_window=window)
            n = Node(n.name, n.op, n.inputs, n.outputs, tuple(attrs.items()), n.version)
        nodes.append(n)
    return replace(graph, nodes=tuple(nodes))


def _without(graph: Graph, outputs: set[str]) -> Graph:
    """``graph`` without the given outputs and whatever only they needed."""
    if not outputs:
        return graph
    return restricted(graph, [o for o in graph.outputs if o not in outputs])


__all__ = ["DEFAULT_CONTEXT", "PROBE_BYTES", "SIZES", "verify_layers"]

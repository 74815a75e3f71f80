"""Find the attention of one layer in an exporter's graph: the nodes between the cache and the output.

Exporters (``torch.onnx.export`` of a transformers model, Optimum) write attention as plain ops. Per layer:

    present_k = Concat(past_k, k_new, axis=2)            (also present_v)
    scores    = MatMul(q [* s1], Transpose(repeat(present_k)) [* s2]) [* s3 | / s3]
                [-> Div(cap) -> Tanh -> Mul(cap)]         (soft-capping)
                [+ mask | Where(keep, ., -inf)]           (causal / window / padding masks)
    probs     = Softmax(scores, axis=-1) [-> Cast] [-> Where(IsNaN(.), 0, .)]
    out       = MatMul(probs, repeat(present_v))          ([batch, heads, seq, head])

``repeat`` is transformers' ``repeat_kv`` (Unsqueeze at axis 2 -> Expand -> Reshape: kv head h serves query heads
h*g .. h*g+g-1, the IR's grouping) or nothing. :func:`match_attention` walks this backwards from each Softmax and
returns the values the KV mapping needs — q, the new k/v, the output, the total scale and the soft-cap — and
*probes*: the values it cannot judge from structure alone, evaluated after import (:mod:`.kv_verify`): the masks,
and the shapes a head repeat expands and reshapes to (which decide which kv head serves which query head).

Every degree of freedom of the pattern is either carried into the IR Attention exactly or refused:

* scalar Mul/Div on q, on the keys and on the scores multiply into ``scale`` (a "scalar" is one element of rank at
  most 4, so that it adds no axis); a product that is 0 or not a finite float32 is refused (the IR reads scale 0
  as 1/sqrt(head_dim)). The IR Attention has no scale for the values: one on them is refused unless it is 1;
* a mask the scores are scaled *after* is recorded with that factor, and must still hide its keys once scaled
  (``MASKED``; a factor <= 0 is refused); a mask before soft-capping, a scale after it and a cap whose two
  constants differ (beyond float32 rounding of 1/cap) are refused;
* Softmax must normalize the keys axis (axis -1 or 3; before opset 13 the default axis is 1, which is refused);
* the keys must be transposed with perm [0, 1, 3, 2]; anything else between the caches and the MatMuls (an Add, a
  Mul by a tensor, a Transpose of the values) stops the walk, and the layer is not mapped;
* which kv head serves which query head is the head repeat's Expand shape and Reshape target, probes checked
  after import to repeat each kv head in place; a repeat that tiles the heads (h % kv) is refused there;
* an op of another domain that shares an ai.onnx op's name is not that op (:func:`op_of`).

Anything else between the cache and the output makes the layer unmappable, with a message naming the node.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ConstOf = Callable[[str], "np.ndarray | None"]
FLOAT_TYPES = frozenset({1, 10, 11, 16})  # TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16
MASKED = -1e4
"""An additive mask value at or below this hides a key (exporters use -inf, finfo.min or -10000)."""
MASK_KINDS = frozenset({"add", "keep", "drop"})
MAX_RANK = 4
"""The rank of the attention's tensors: a "scalar" constant of higher rank would broadcast them to more axes."""


class NoMatch(Exception):
    """The layer's attention is not the pattern (the message says where it differs). ``root`` names the keys
    cache when the walk got that far, so the mapping can say which layer it was."""

    def __init__(self, message: str, root: str = "") -> None:
        super().__init__(message)
        self.root = root


@dataclass(frozen=True)
class Probe:
    """A value the mapping cannot judge from the graph's structure, evaluated after import (:mod:`.kv_verify`).

    ``kind``: ``add`` (an additive mask: 0 or at most :data:`MASKED`), ``keep`` / ``drop`` (a bool mask: true =
    attend / true = hide), ``expand:k`` / ``expand:v`` (the shape a head repeat of the keys / values expands to),
    ``reshape:k`` / ``reshape:v`` (its Reshape target), ``seqlens`` / ``total`` / ``positions`` (a
    GroupQueryAttention's seqlens_k, total_sequence_length and position_ids). ``factor``: what an additive mask is
    multiplied by afterwards (the scales between it and the Softmax)."""

    value: str
    kind: str
    factor: float = 1.0


@dataclass
class Region:
    """One layer's attention: inputs q/k_new/v_new (BNSH), the output value, and how the scores are formed."""

    q: str
    k_new: str
    v_new: str
    out: str
    scale: float
    softcap: float
    probes: list[Probe] = field(default_factory=list)  # masks and head-repeat shapes
    k_root: str = ""  # the caches (present keys/values) the region reads
    v_root: str = ""


class GraphIndex:
    """Producers, consumers and load-time constants of an ONNX graph (by value name)."""

    def __init__(self, nodes: Sequence[Any], const_of: ConstOf, opset: int) -> None:
        self.nodes = list(nodes)
        self.opset = opset  # the ai.onnx opset (Softmax's default axis depends on it)
        self.producer: dict[str, Any] = {o: n for n in self.nodes for o in n.output if o}
        self.consumers: dict[str, list[Any]] = {}
        for n in self.nodes:
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(n)
        self._const_of = const_of

    def const(self, name: str) -> np.ndarray | None:
        return self._const_of(name)

    def scalar(self, name: str) -> float | None:
        """A one-element numeric constant that broadcasts over an attention tensor without adding axes."""
        c = self.const(name)
        if c is None or c.size != 1 or c.dtype.kind not in "fiu" or c.ndim > MAX_RANK:
            return None
        return float(c.reshape(-1)[0])

    def made_by(self, name: str, op: str) -> Any | None:
        n = self.producer.get(name)
        return n if n is not None and n.op_type == op and n.domain in ("", "ai.onnx") else None


def op_of(node: Any) -> str:
    """The op of ``node`` as the walks compare it: ai.onnx ops by name, any other domain's qualified (an op of
    another domain that shares an ai.onnx name is not that op)."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def called(node: Any) -> str:
    """A node as messages name it: its op and name, or the value it writes when it has no name."""
    return f"{node.op_type} {node.name!r}" if node.name else f"the {node.op_type} writing {node.output[0]!r}"


def attr(node: Any, name: str, default: Any = None) -> Any:
    from .onnx_api import onnx_module

    for a in node.attribute:
        if a.name == name:
            return onnx_module().helper.get_attribute_value(a)
    return default


def through_identity(g: GraphIndex, name: str) -> str:
    """``name`` followed back through Identity and one-input Concat (DynamicCache's first update writes one)."""
    for _ in range(16):
        n = g.producer.get(name)
        if n is None or n.domain not in ("", "ai.onnx"):
            return name
        if n.op_type == "Identity" or (n.op_type == "Concat" and len([i for i in n.input if i]) == 1):
            name = next(i for i in n.input if i)
            continue
        return name
    return name


def _float_cast(g: GraphIndex, name: str) -> str | None:
    n = g.made_by(name, "Cast")
    return n.input[0] if n is not None and int(attr(n, "to", 0)) in FLOAT_TYPES else None


def _unsqueeze_axes(g: GraphIndex, n: Any) -> list[int] | None:
    if len(n.input) > 1 and n.input[1]:
        c = g.const(n.input[1])
        return None if c is None else [int(x) for x in c.reshape(-1)]
    axes = attr(n, "axes")
    return None if axes is None else [int(x) for x in axes]


def _through_repeat(g: GraphIndex, name: str, side: str) -> tuple[str, list[Probe]]:
    """Back through transformers' repeat_kv (Reshape <- Expand <- Unsqueeze(axis 2)) when it is there. Which kv
    head serves which query head depends on the Expand's shape and the Reshape's target, which exporters compute
    from shapes at run time: they become probes (``expand:<side>``, ``reshape:<side>``), checked after import to
    repeat each kv head in place (axis 2 only)."""
    r = g.made_by(name, "Reshape")
    e = g.made_by(r.input[0], "Expand") if r is not None else None
    u = g.made_by(e.input[0], "Unsqueeze") if e is not None else None
    if r is None or e is None or u is None:
        return name, []
    if _unsqueeze_axes(g, u) not in ([2], [-3]):
        raise NoMatch(f"{called(u)}: a head repeat must unsqueeze axis 2 (repeat_kv), found "
                      f"{_unsqueeze_axes(g, u)}")
    if int(attr(r, "allowzero", 0)):
        raise NoMatch(f"{called(r)}: a head repeat's Reshape with allowzero=1")
    return u.input[0], [Probe(e.input[1], f"expand:{side}"), Probe(r.input[1], f"reshape:{side}")]


def _scaled(g: GraphIndex, name: str, scale: list[float]) -> str:
    """Back through Mul/Div by a scalar constant (multiplied into ``scale``), float Casts and Identity."""
    for _ in range(16):
        cast = _float_cast(g, name)
        if cast is not None:
            name = cast
            continue
        n = g.producer.get(name)
        if n is not None and op_of(n) == "Identity":
            name = n.input[0]
            continue
        if n is not None and op_of(n) in ("Mul", "Div"):
            a, b = n.input[0], n.input[1]
            sb, sa = g.scalar(b), g.scalar(a) if op_of(n) == "Mul" else None
            if sb is not None and (sb != 0.0 or op_of(n) == "Mul"):
                scale[0] = scale[0] * sb if op_of(n) == "Mul" else scale[0] / sb
                name = a
                continue
            if sa is not None:
                scale[0] *= sa
                name = b
                continue
        return name
    return name


def _key_side(g: GraphIndex, name: str, scale: list[float]) -> tuple[str, list[Probe]]:
    """The cache value the scores' second MatMul input comes from (scaled, transposed, repeated), and the
    repeat's probes."""
    name = _scaled(g, name, scale)
    t = g.made_by(name, "Transpose")
    if t is None or list(attr(t, "perm", [])) != [0, 1, 3, 2]:
        made = g.producer.get(name)
        found = f"Transpose with perm {list(attr(t, 'perm', []))}" if t is not None else \
            made.op_type if made is not None else "no node"
        raise NoMatch(f"the keys of the score MatMul are not transposed with perm [0, 1, 3, 2] (found {found} "
                      f"producing {name!r})")
    name = _scaled(g, t.input[0], scale)
    root, probes = _through_repeat(g, through_identity(g, name), "k")
    return through_identity(g, root), probes


def _reaches_matmul(g: GraphIndex, name: str, depth: int = 8) -> bool:
    """Whether a MatMul produces ``name`` through score arithmetic (how the scores side of an Add is told from the
    mask side: a mask is computed from positions, never by a MatMul). Breadth-first, each value once."""
    frontier, seen = [name], {name}
    for _ in range(depth):
        nxt: list[str] = []
        for v in frontier:
            n = g.producer.get(v)
            if n is None:
                continue
            if op_of(n) == "MatMul":
                return True
            if op_of(n) in ("Cast", "Mul", "Div", "Add", "Where", "Tanh", "Identity"):
                nxt += [i for i in n.input if i and i not in seen]
                seen.update(nxt)
        frontier = nxt
    return False


def _scores(g: GraphIndex, name: str) -> tuple[Any, float, float, list[Probe]]:
    """Back from the Softmax input to the score MatMul: (MatMul, scale after it, softcap, mask probes)."""
    scale, softcap = [1.0], 0.0  # walking backwards: what comes first here is applied last
    masks: list[Probe] = []
    for _ in range(24):
        n = g.producer.get(name)
        if n is None:
            raise NoMatch(f"the Softmax input {name!r} is not computed from a score MatMul")
        op = op_of(n)
        if op == "MatMul":
            return n, scale[0], softcap, masks
        if (op == "Cast" and _float_cast(g, name) is not None) or op == "Identity":
            name = n.input[0]
        elif op in ("Add", "Where") and softcap:
            raise NoMatch(f"{called(n)}: a mask applied before soft-capping (which would undo it)")
        elif op in ("Add", "Where") and not scale[0] > 0:
            raise NoMatch(f"{called(n)}: the masked scores are multiplied by {scale[0]:g} afterwards, which "
                          "does not keep the masked keys hidden")
        elif op == "Add":
            a, b = n.input[0], n.input[1]
            main = [x for x in (a, b) if _reaches_matmul(g, x)]
            if len(main) != 1:
                raise NoMatch(f"{called(n)}: cannot tell the scores from the mask in this Add")
            masks.append(Probe(b if main[0] == a else a, "add", scale[0]))
            name = main[0]
        elif op == "Where":
            name = _where_mask(g, n, scale[0], masks)
        elif op == "Mul" and _softcap(g, n) is not None:
            if softcap or scale[0] != 1.0:
                raise NoMatch(f"{called(n)}: soft-capping twice, or scaling after soft-capping")
            softcap, name = _softcap(g, n)  # type: ignore[misc]
        elif op in ("Mul", "Div"):
            before = name
            name = _scaled(g, name, scale)
            if name == before:
                raise NoMatch(f"{called(n)}: by a value that is not a nonzero scalar constant")
        else:
            raise NoMatch(f"{called(n)} between the attention scores and the Softmax")
    raise NoMatch("too many nodes between the attention scores and the Softmax")


def _where_mask(g: GraphIndex, n: Any, factor: float, masks: list[Probe]) -> str:
    """Where(keep, scores, fill) or Where(hide, fill, scores) with a fill that, times the scales after it
    (``factor``), still hides a key: the mask's probe is appended and the scores' value returned."""
    c, x, y = n.input
    fx, fy = g.scalar(x), g.scalar(y)
    for fill, scores, how in ((fy, x, "keep"), (fx, y, "drop")):
        if fill is not None and _reaches_matmul(g, scores):
            if not fill * factor <= MASKED:
                raise NoMatch(f"{called(n)}: the masked scores are {fill:g}"
                              f"{f' x {factor:g}' if factor != 1.0 else ''}, not a large negative number")
            masks.append(Probe(c, how))
            return str(scores)
    raise NoMatch(f"{called(n)}: a Where on the scores that is not a mask")


def _softcap(g: GraphIndex, mul: Any) -> tuple[float, str] | None:
    """Mul(Tanh(Div(x, cap)), cap) -> (cap, x): the same constant twice; the Div may be a Mul by 1/cap (equal to
    1/cap within float32 rounding)."""
    for t_in, c_in in ((mul.input[0], mul.input[1]), (mul.input[1], mul.input[0])):
        cap, tanh = g.scalar(c_in), g.made_by(t_in, "Tanh")
        if cap is None or tanh is None or not 0 < cap < math.inf:
            continue
        inner = g.producer.get(tanh.input[0])
        if inner is None or op_of(inner) not in ("Div", "Mul"):
            continue
        by = g.scalar(inner.input[1])
        if by is None:
            continue
        if (by == cap) if op_of(inner) == "Div" else bool(np.isclose(by * cap, 1.0, rtol=1e-6, atol=0.0)):
            return cap, inner.input[0]
    return None


def _probs_to_output(g: GraphIndex, softmax: Any) -> tuple[Any, str]:
    """Forward from the Softmax to the MatMul with the values: (that MatMul, its values input)."""
    name = softmax.output[0]
    for _ in range(8):
        users = g.consumers.get(name, [])
        nan = [u for u in users if op_of(u) == "IsNaN"]
        if len(users) == 1 and op_of(users[0]) == "Cast" and int(attr(users[0], "to", 0)) in FLOAT_TYPES:
            name = users[0].output[0]
        elif len(users) == 1 and op_of(users[0]) == "MatMul" and users[0].input[0] == name:
            return users[0], users[0].input[1]
        elif len(users) == 2 and len(nan) == 1:  # Where(IsNaN(p), 0, p): rows that see no key give 0, as the IR
            where = next(u for u in users if u is not nan[0])
            if op_of(where) != "Where" or list(where.input) != [nan[0].output[0], where.input[1], name] or \
                    g.scalar(where.input[1]) != 0.0:
                raise NoMatch(f"{called(where)}: an unexpected use of the attention probabilities")
            name = where.output[0]
        else:
            ops = ", ".join(op_of(u) for u in users) or "nothing"
            raise NoMatch(f"{called(softmax)} output goes to {ops}, not to a MatMul with the values")
    raise NoMatch(f"too many nodes after {called(softmax)}")


def match_attention(g: GraphIndex, softmax: Any) -> Region:
    """The attention region around ``softmax`` (its ``k_root``/``v_root`` name the caches it reads); NoMatch when
    the nodes around it are not the pattern."""
    axis = int(attr(softmax, "axis", -1 if g.opset >= 13 else 1))
    if axis not in (-1, 3):
        raise NoMatch(f"{called(softmax)} normalizes axis {axis}"
                      f"{' (the default before opset 13)' if attr(softmax, 'axis') is None else ''}, not the keys "
                      "axis alone")
    qk, scale, softcap, masks = _scores(g, softmax.input[0])
    s = [scale]
    k_root, k_probes = _key_side(g, qk.input[1], s)
    q = _scaled(g, qk.input[0], s)
    as_attr = float(np.float32(s[0])) if abs(s[0]) < 3.4e38 else math.inf  # ONNX float attributes are float32
    if not math.isfinite(as_attr) or as_attr == 0.0:
        raise NoMatch(f"the attention scores are scaled by {s[0]:g} (the IR's Attention reads scale 0 as "
                      "1/sqrt(head_dim) and needs a finite float32 one)", k_root)
    pv, values = _probs_to_output(g, softmax)
    v_scale = [1.0]
    v_root, v_probes = _through_repeat(g, through_identity(g, _scaled(g, values, v_scale)), "v")
    v_root = through_identity(g, v_root)
    if v_scale[0] != 1.0:
        raise NoMatch(f"the values of {called(pv)} are scaled by {v_scale[0]:g} before the MatMul with the attention "
                      "probabilities; the IR's Attention has no scale for the values", k_root)
    k_cat, v_cat = g.made_by(k_root, "Concat"), g.made_by(v_root, "Concat")
    if k_cat is None or v_cat is None or len(k_cat.input) != 2 or len(v_cat.input) != 2:
        raise NoMatch(f"the keys/values of {called(softmax)} are not a concatenated cache (found "
                      f"{_made(g, k_root)} and {_made(g, v_root)})", k_root)
    return Region(q, k_cat.input[1], v_cat.input[1], pv.output[0], s[0], softcap, [*masks, *k_probes, *v_probes],
                  k_root, v_root)


def _made(g: GraphIndex, name: str) -> str:
    n = g.producer.get(name)
    return called(n) if n is not None else f"the input {name!r}"


def match_kv_concat(g: GraphIndex, present: str, past: str) -> str | None:
    """Why ``present`` is not Concat(past, new) along the sequence axis of a BNSH cache (None when it is)."""
    n = g.made_by(present, "Concat")
    if n is None:
        made = g.producer.get(present)
        return f"it is computed by {made.op_type if made is not None else 'no node'}, not a Concat of past and new"
    if int(attr(n, "axis", 0)) not in (2, -2) or len(n.input) != 2:
        return f"{called(n)} concatenates {len(n.input)} values on axis {attr(n, 'axis', 0)}, not past and new " \
               "on the sequence axis"
    if through_identity(g, n.input[0]) != past:
        return f"{called(n)} does not start from the past input {past!r}"
    return None


def softmaxes(g: GraphIndex) -> list[Any]:
    return [n for n in g.nodes if n.op_type == "Softmax" and n.domain in ("", "ai.onnx")]


__all__ = ["MASKED", "MASK_KINDS", "GraphIndex", "NoMatch", "Probe", "Region", "attr", "match_attention",
           "match_kv_concat", "softmaxes", "through_identity"]

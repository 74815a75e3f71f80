"""Static analysis of a graph for the CPU executor: concrete shapes, views, in-place reuse and the arena layout.

``analyze`` walks the nodes once with concrete input shapes (the schemas' own shape functions do the inference),
decides which outputs are free views of an input (Reshape, Identity, leading-axis Slice/Split), which may reuse an
input's buffer in place (the schema's ``inplace`` pairs, when the input dies at that node), and places every other
buffer in one arena by liveness (first fit, 64-byte aligned). Bindings for smaller shapes (fewer tokens) reuse the
same offsets: every buffer shrinks, none moves.

This is the CPU backend's arena rule (:data:`ARENA_RULE`), the only one: :func:`plan_layout` lays it out,
:func:`to_arena` states it as the plan's :class:`~uaii.ir.plan.ArenaLayout` (``CpuBackend.plan_arena``, which the
planner asks), and :func:`from_arena` turns a plan's arena back into the layout an executable carves its buffers
from — after checking that it covers every buffer this analysis finds, at the same lifetimes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from uaii.backends.analysis import (
    NodeInfo,
    VType,
    arena_inputs,
    infer_types,
    nbytes_of,
    node_infos,
    topological,
)
from uaii.backends.base import BackendError, arena_problems
from uaii.ir import Graph
from uaii.ir.plan import ArenaLayout, BufferSlot

ALIGN = 64
END = 1 << 62  # "live until the end of the run" (graph outputs)
ARENA_RULE = "cpu/1"
"""The identity of this rule (``Capabilities.arena``): bump the version when the layout it makes changes, so that
plans cached with the old one are keyed apart."""


# --- views --------------------------------------------------------------------------------------------------
def view_source(info: NodeInfo, types: Mapping[str, VType]) -> str | None:
    """The input an op's (single) output is a free view of, or None when the op must compute: Reshape and Identity
    always, Transpose when only unit axes move, Slice when it cuts one contiguous range."""
    op, node = info.node.op, info.node
    if op in ("Reshape", "Identity"):
        return node.inputs[0]
    if op == "Transpose":
        shape = types[node.inputs[0]].shape
        perm = info.attrs.get("perm") or tuple(range(len(shape)))[::-1]
        moved = [a for a in perm if shape[a] != 1]
        return node.inputs[0] if moved == sorted(moved) else None  # only unit axes move: same memory order
    if op == "Slice" and not types[node.inputs[0]].dtype.is_quantized:
        return node.inputs[0] if _leading_slice(info, types[node.inputs[0]].shape) else None
    return None


def _leading_slice(info: NodeInfo, shape: tuple[int, ...]) -> bool:
    """A Slice whose result is one contiguous range: only the outermost non-unit axis is cut, with step 1."""
    starts, ends = info.attrs["starts"], info.attrs["ends"]
    axes = info.attrs.get("axes") or tuple(range(len(starts)))
    steps = info.attrs.get("steps") or (1,) * len(starts)
    cut = []
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        a = a + len(shape) if a < 0 else a
        if len(range(*slice(s, e, st).indices(shape[a]))) != shape[a]:
            if st != 1:
                return False
            cut.append(a)
    if not cut:
        return True
    return len(cut) == 1 and all(shape[d] == 1 for d in range(cut[0]))


# --- arena layout ---------------------------------------------------------------------------------------------
@dataclass
class Layout:
    """Buffer placement: ``root[value]`` is the value whose buffer it lives in (itself for an owner), ``offset``
    and ``nbytes`` are per owner; ``size`` is the arena size in bytes."""

    types: dict[str, VType]
    root: dict[str, str]
    views: dict[str, str]  # value -> the input it is a view of
    offset: dict[str, int]
    nbytes: dict[str, int]
    size: int
    born: dict[str, int] = field(default_factory=dict)  # owner -> node index that writes it (-1: a feed)
    end: dict[str, int] = field(default_factory=dict)  # owner -> last node index any value in it is read (END)

    def fits(self, types: Mapping[str, VType]) -> bool:
        """Whether bindings for ``types`` fit in this layout (no owner grows)."""
        for v, owner in self.root.items():
            if v == owner and v in self.offset and nbytes_of(types[v]) > self.nbytes[v]:
                return False
        return True


def plan_layout(graph: Graph, infos: Sequence[NodeInfo], types: dict[str, VType], feeds: Sequence[str],
                stateful: AbstractSet[str], reuse: bool = True) -> Layout:
    """Place every feed and computed value in one arena. ``stateful`` values live elsewhere (the KV state)."""
    root, views, born, end = _buffers(graph, infos, types, feeds, stateful, reuse)
    offset, nbytes, size = _first_fit(born, end, {o: nbytes_of(types[o]) for o in born}, reuse)
    return Layout(types, root, views, offset, nbytes, size, born, end)


def _buffers(graph: Graph, infos: Sequence[NodeInfo], types: dict[str, VType], feeds: Sequence[str],
             stateful: AbstractSet[str],
             reuse: bool) -> tuple[dict[str, str], dict[str, str], dict[str, int], dict[str, int]]:
    """(root, views, born, end): which buffer each value lives in, and when each owner is written and last read."""
    fixed = {t.name for t in graph.tensors if t.is_weight or t.is_constant}
    root: dict[str, str] = {}
    views: dict[str, str] = {}
    for f in feeds:
        root[f] = f
    last: dict[str, int] = {}
    for info in infos:
        for name in info.node.inputs:
            if name:
                last[name] = info.index
    for name in graph.outputs:
        last[name] = END
    born: dict[str, int] = dict.fromkeys(feeds, -1)
    for info in infos:
        node = info.node
        src = view_source(info, types)
        for slot, name in enumerate(node.outputs):
            if not name or name in stateful:
                continue
            if src is not None and slot == 0 and src not in stateful:
                views[name] = src
                root[name] = root.get(src, src)
                continue
            target = _inplace_target(info, slot, types, root, last, fixed, graph) if reuse else None
            if target is not None:
                root[name] = root[target]
            else:
                root[name] = name
                born[name] = info.index
    # an owner lives until the last use of any value sharing its buffer
    end: dict[str, int] = {}
    for v, owner in root.items():
        end[owner] = max(end.get(owner, -1), last.get(v, born.get(owner, 0)))
    return root, views, born, end


# --- the plan's arena -----------------------------------------------------------------------------------------
def arena_of(graph: Graph, infos: Sequence[NodeInfo], max_tokens: int, memory_reuse: bool = True) -> ArenaLayout:
    """The arena an executable of ``graph`` with its KV state bound (``kv_state=True``) lays out for
    ``max_tokens`` tokens (:func:`~uaii.backends.analysis.token_shapes`, as ``compile`` prepares with a plan): the
    CPU backend's ``plan_arena``."""
    a = arena_inputs(graph, infos, max_tokens)
    return to_arena(plan_layout(graph, infos, a.types, a.feeds, set(a.stateful), memory_reuse), len(infos), a.tokens)


def _slot(layout: Layout, owner: str, steps: int) -> BufferSlot:
    """The plan's slot of an owner: steps are node indices, a feed is live from step 0, an output to the last."""
    first = max(layout.born[owner], 0)
    last = max(min(layout.end[owner], steps - 1), first)
    return BufferSlot(owner, layout.offset[owner], layout.nbytes[owner], layout.types[owner].dtype.value, first, last)


def to_arena(layout: Layout, steps: int, max_tokens: int) -> ArenaLayout:
    """``layout`` (made for ``max_tokens`` tokens of a graph of ``steps`` nodes) as a plan's arena: one slot per
    buffer owner (views and in-place results live in their owner's slot), and the size the executable allocates —
    the layout and :data:`ALIGN` bytes more, so that the arena's start can be aligned."""
    slots = sorted((_slot(layout, o, steps) for o in layout.offset), key=lambda s: (s.first_step, s.value))
    return ArenaLayout(size=layout.size + ALIGN, alignment=ALIGN, max_tokens=max_tokens, slots=tuple(slots),
                       rule=ARENA_RULE)


def from_arena(graph: Graph, infos: Sequence[NodeInfo], types: dict[str, VType], feeds: Sequence[str],
               stateful: AbstractSet[str], reuse: bool, arena: ArenaLayout) -> Layout:
    """The layout of a plan's ``arena``: this rule's buffers (views, in-place reuse) at the plan's offsets.
    Raises a BackendError naming the first buffer the arena does not cover (missing, smaller, another lifetime,
    misaligned, outside the arena, sharing live bytes) or holds that this analysis does not find."""
    root, views, born, end = _buffers(graph, infos, types, feeds, stateful, reuse)
    mine = Layout(types, root, views, {o: 0 for o in born}, {o: nbytes_of(types[o]) for o in born}, 0, born, end)
    problem = next(_uncovered(mine, arena, len(infos)), None)
    if problem is not None:
        raise BackendError(f"[backend] cpu: the plan's arena ({arena.rule}, {arena.max_tokens} tokens) does not fit "
                           f"graph {graph.name!r} as this executable binds it: {problem} (plan with the cpu "
                           f"backend's arena rule, {ARENA_RULE}, at these max_tokens and memory_reuse; the plan's "
                           "arena binds the KV state: compile with kv_state=True)")
    slots = {s.value: s for s in arena.slots}
    return Layout(types, root, views, {o: slots[o].offset for o in born}, {o: slots[o].nbytes for o in born},
                  arena.size - ALIGN, born, end)


def _uncovered(mine: Layout, arena: ArenaLayout, steps: int) -> Iterator[str]:
    """The check every backend runs (:func:`uaii.backends.base.arena_problems`) on this rule's buffers; the arena
    is :data:`ALIGN` bytes larger than its slots use, so that its start can be aligned."""
    wanted = (_slot(mine, o, steps) for o in mine.born)
    return arena_problems(arena, wanted, rule=ARENA_RULE, align=ALIGN, usable=arena.size - ALIGN)


def _inplace_target(info: NodeInfo, slot: int, types: Mapping[str, VType], root: Mapping[str, str],
                    last: Mapping[str, int], fixed: AbstractSet[str], graph: Graph) -> str | None:
    """An input whose buffer output ``slot`` may take over: the schema allows it, the input is computed (not a
    feed, weight or constant), nothing reads its buffer after this node, and the sizes match."""
    out = info.node.outputs[slot]
    for in_slot, out_slot in info.schema.inplace:
        if out_slot != slot or in_slot >= len(info.node.inputs):
            continue
        name = info.node.inputs[in_slot]
        if not name or name in fixed or name in graph.inputs or name not in root:
            continue
        owner = root[name]
        if owner in graph.inputs or owner in fixed:
            continue
        sharing = [v for v, o in root.items() if o == owner]
        if any(last.get(v, -1) > info.index for v in sharing):
            continue
        others = [x for j, x in enumerate(info.node.inputs) if j != in_slot and x]
        if any(root.get(x) == owner for x in others):
            continue
        if types[name].dtype is types[out].dtype and nbytes_of(types[name]) == nbytes_of(types[out]):
            return name
    return None


def _first_fit(born: Mapping[str, int], end: Mapping[str, int], size: Mapping[str, int],
               reuse: bool) -> tuple[dict[str, int], dict[str, int], int]:
    offset: dict[str, int] = {}
    live: list[tuple[int, int, int]] = []  # (offset, end offset, last use)
    top = 0
    for name in sorted(born, key=lambda n: (born[n], n)):
        t = born[name]
        if reuse:
            live = [x for x in live if x[2] >= t]
        need = (size[name] + ALIGN - 1) // ALIGN * ALIGN or ALIGN
        pos = 0
        for lo, hi, _ in sorted(live):
            if pos + need <= lo:
                break
            pos = max(pos, hi)
        offset[name] = pos
        live.append((pos, pos + need, end[name]))
        top = max(top, pos + need)
    return offset, dict(size), top


__all__ = ["ALIGN", "ARENA_RULE", "Layout", "NodeInfo", "VType", "arena_of", "from_arena", "infer_types", "nbytes_of",
           "node_infos", "plan_layout", "to_arena", "topological", "view_source"]

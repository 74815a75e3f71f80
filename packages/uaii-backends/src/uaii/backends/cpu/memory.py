"""Static analysis of a graph for the CPU executor: concrete shapes, views, in-place reuse and the arena layout.

``analyze`` walks the nodes once with concrete input shapes (the schemas' own shape functions do the inference),
decides which outputs are free views of an input (Reshape, Identity, leading-axis Slice/Split), which may reuse an
input's buffer in place (the schema's ``inplace`` pairs, when the input dies at that node), and places every other
buffer in one arena by liveness (first fit, 64-byte aligned). Bindings for smaller shapes (fewer tokens) reuse the
same offsets: every buffer shrinks, none moves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from uaii.backends.analysis import NodeInfo, VType, infer_types, nbytes_of, node_infos, topological
from uaii.ir import Graph

ALIGN = 64
END = 1 << 62  # "live until the end of the run" (graph outputs)


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

    def fits(self, types: Mapping[str, VType]) -> bool:
        """Whether bindings for ``types`` fit in this layout (no owner grows)."""
        for v, owner in self.root.items():
            if v == owner and v in self.offset and nbytes_of(types[v]) > self.nbytes[v]:
                return False
        return True


def plan_layout(graph: Graph, infos: Sequence[NodeInfo], types: dict[str, VType], feeds: Sequence[str],
                stateful: set[str], reuse: bool = True) -> Layout:
    """Place every feed and computed value in one arena. ``stateful`` values live elsewhere (the KV state)."""
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
    offset, nbytes, size = _first_fit(born, end, {o: nbytes_of(types[o]) for o in born}, reuse)
    return Layout(types, root, views, offset, nbytes, size)


def _inplace_target(info: NodeInfo, slot: int, types: Mapping[str, VType], root: Mapping[str, str],
                    last: Mapping[str, int], fixed: set[str], graph: Graph) -> str | None:
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


__all__ = ["ALIGN", "Layout", "NodeInfo", "VType", "infer_types", "nbytes_of", "node_infos", "plan_layout",
           "topological", "view_source"]

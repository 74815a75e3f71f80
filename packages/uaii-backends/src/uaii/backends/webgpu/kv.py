"""The KV cache on the device: which Attention nodes keep their cache in a state, and the state itself.

(The state class, GpuKVState, is written in kv_state.py.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from uaii.backends.analysis import NodeInfo, VType
from uaii.ir import Graph, Tensor


@dataclass
class KvLayout:
    """Cached Attention nodes of a graph: node name → layer index, per layer (kv heads, k dim, v dim), and the
    graph values the state replaces (past/present K and V)."""

    layer: dict[str, int] = field(default_factory=dict)
    dims: list[tuple[int, int, int]] = field(default_factory=list)
    past: dict[str, tuple[str, str]] = field(default_factory=dict)  # node → (past_k, past_v)
    values: frozenset[str] = frozenset()

    def past_types(self, tmap: Mapping[str, Tensor]) -> dict[str, VType]:
        out = {}
        for pk, pv in self.past.values():
            for v in (pk, pv):
                t = tmap[v]
                out[v] = VType(t.dtype, (0, *(int(d) for d in t.shape[1:])))
        return out


def find_kv(graph: Graph, infos: list[NodeInfo]) -> KvLayout | None:
    """The cached Attention layers: past K/V are graph inputs and present K/V graph outputs, unmasked."""
    tmap = graph.tensor_map
    kv = KvLayout()
    values: set[str] = set()
    for info in infos:
        node = info.node
        if node.op != "Attention" or len(node.inputs) < 5 or not node.inputs[3]:
            continue
        pk, pv = node.inputs[3], node.inputs[4]
        outs = [*node.outputs, "", ""]
        nk, nv = outs[1], outs[2]
        if pk not in graph.inputs or pv not in graph.inputs or any(o and o not in graph.outputs for o in (nk, nv)):
            continue
        if len(node.inputs) > 5 and node.inputs[5]:
            continue
        ks, vs = tmap[pk].shape, tmap[pv].shape
        if len(ks) != 3 or not all(isinstance(d, int) for d in (*ks[1:], vs[-1])):
            continue
        kv.layer[node.name] = len(kv.dims)
        kv.dims.append((int(ks[1]), int(ks[2]), int(vs[2])))
        kv.past[node.name] = (pk, pv)
        values.update(x for x in (pk, pv, nk, nv) if x)
    if not kv.dims:
        return None
    kv.values = frozenset(values)
    return kv


__all__ = ["KvLayout", "find_kv"]

"""Which Attention nodes of a graph keep their KV cache in a state (the state itself, GpuKVState, is kv_state.py).

The analysis is uaii-ir's :func:`~uaii.ir.kvcache.kv_layers`, shared with the CPU backend and the runtime's budget;
this module only arranges its answer the way the executable binds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from uaii.backends.analysis import VType
from uaii.ir import Graph, Tensor
from uaii.ir.kvcache import kv_layers


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


def find_kv(graph: Graph) -> KvLayout | None:
    """The cached Attention layers of ``graph`` (see :func:`~uaii.ir.kvcache.kv_layers`), or None."""
    kv = KvLayout()
    values: set[str] = set()
    for layer in kv_layers(graph):
        kv.layer[layer.node] = len(kv.dims)
        kv.dims.append((layer.n_kv_heads, layer.k_dim, layer.v_dim))
        kv.past[layer.node] = (layer.past_k, layer.past_v)
        values.update(x for x in (layer.past_k, layer.past_v, layer.present_k, layer.present_v) if x)
    if not kv.dims:
        return None
    kv.values = frozenset(values)
    return kv


__all__ = ["KvLayout", "find_kv"]

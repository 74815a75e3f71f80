"""Which Attention nodes of a graph keep a KV cache, and how large one token of it is.

A *cached* Attention node reads its past keys and values from graph inputs and writes the presents to graph outputs
(or drops them), without an explicit mask: that is what a backend may bind to a KV state instead of copying the cache
every step, and what a memory budget must count. One analysis of the graph's structure, by the Attention schema's
parameter names, shared by the backends (which layers to bind) and the runtime (bytes of the cache it plans for):
never by value-name prefixes.
"""

from __future__ import annotations

from typing import NamedTuple

from uaii.ir.graph import Graph
from uaii.ir.registry import Registry, default_registry


class KVLayer(NamedTuple):
    """A cached Attention node: its past/present values ("" where an output is dropped) and per-token dims."""

    node: str
    past_k: str
    past_v: str
    present_k: str
    present_v: str
    n_kv_heads: int
    k_dim: int
    v_dim: int

    def elements_per_token(self) -> int:
        """Key plus value elements one token adds to this layer's cache."""
        return self.n_kv_heads * (self.k_dim + self.v_dim)


def kv_layers(graph: Graph, registry: Registry | None = None) -> list[KVLayer]:
    """The cached Attention nodes of ``graph``, in graph order (see the module docstring). Past caches must be
    ``[past, n_kv_heads, head_dim]`` with static heads and dims; any other Attention node stays functional."""
    reg = registry or default_registry()
    tmap, inputs, outputs = graph.tensor_map, set(graph.inputs), set(graph.outputs)
    found: list[KVLayer] = []
    for node in graph.nodes:
        if node.op != "Attention":
            continue
        schema = reg.get(node.op, node.version)
        ins = dict(zip((p.name for p in schema.inputs), (*node.inputs, *[""] * len(schema.inputs)), strict=False))
        outs = dict(zip((p.name for p in schema.outputs), (*node.outputs, *[""] * len(schema.outputs)),
                        strict=False))
        pk, pv, nk, nv = ins["past_k"], ins["past_v"], outs["present_k"], outs["present_v"]
        if not pk or not pv or pk not in inputs or pv not in inputs or ins["mask"]:
            continue  # no cache, a cache computed inside the graph, or a masked attention: stays functional
        if any(o and o not in outputs for o in (nk, nv)):
            continue
        k_shape, v_shape = tmap[pk].shape, tmap[pv].shape
        dims = (*k_shape[1:], *v_shape[1:])
        if len(k_shape) != 3 or len(v_shape) != 3 or not all(isinstance(d, int) for d in dims):
            continue
        found.append(KVLayer(node.name, pk, pv, nk, nv, int(k_shape[1]), int(k_shape[2]), int(v_shape[2])))
    return found


def kv_bytes_per_token(graph: Graph, dtype_bytes: int = 4) -> int:
    """Bytes one token adds to a KV cache of ``graph`` whose elements take ``dtype_bytes`` (4: f32, 2: f16)."""
    return sum(layer.elements_per_token() for layer in kv_layers(graph)) * dtype_bytes


__all__ = ["KVLayer", "kv_bytes_per_token", "kv_layers"]

"""Which Attention nodes of a graph keep their KV cache in a state (the state itself, GpuKVState, is kv_state.py).

The analysis is the one both backends bind by (:class:`uaii.backends.analysis.KvLayout`, built on uaii-ir's
:func:`~uaii.ir.kvcache.kv_layers`); this module only gives the executable its "no cached layer: None" view.
"""

from __future__ import annotations

from uaii.backends.analysis import KvLayout, kv_layout
from uaii.ir import Graph


def find_kv(graph: Graph) -> KvLayout | None:
    """The cached Attention layers of ``graph`` (:func:`~uaii.backends.analysis.kv_layout`), or None."""
    kv = kv_layout(graph)
    return kv if kv.layers else None


__all__ = ["KvLayout", "find_kv"]

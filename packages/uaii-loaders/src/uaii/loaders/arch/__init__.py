"""Architecture builders: normalized config + canonical weights → UAII IR graph.

Builders are registered by architecture name. Plugins add theirs through the entry-point group
``uaii.architectures`` (an object with ``build(cfg, weights, name) -> Graph``, or a class taking
``(cfg, weights)`` with a ``build(name)`` method, as the built-ins are).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from uaii.ir import Graph

from ..config import ARCHITECTURES, ModelConfig, unknown_architecture
from ..errors import LoaderError
from ..weights import WeightSet
from .bert import Bert
from .decoder import BUILDERS as _DECODERS
from .gpt2 import GPT2

ENTRY_POINT_GROUP = "uaii.architectures"

_BUILTIN: dict[str, Any] = {**_DECODERS, "gpt2": GPT2, "bert": Bert}
assert set(_BUILTIN) == set(ARCHITECTURES), "every listed architecture needs a builder"


def _registry() -> dict[str, Any]:
    found = dict(_BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            found[ep.name] = ep.load()
        except Exception as exc:
            raise LoaderError(f"architecture plugin {ep.name!r} ({ep.value}) failed to import: "
                              f"{exc}") from exc

    return found


def supported_architectures() -> tuple[str, ...]:
    """Canonical names of every architecture a builder is registered for."""
    return tuple(sorted(_registry()))


def build_graph(cfg: ModelConfig, weights: WeightSet, name: str = "model") -> Graph:
    """Build the IR graph of ``cfg.architecture`` (not yet validated)."""
    builders = _registry()
    builder = builders.get(cfg.architecture)
    if builder is None:
        raise unknown_architecture(cfg.architecture, weights.where)
    if isinstance(builder, type):
        graph: Graph = builder(cfg, weights).build(name)
        return graph
    fn: Callable[..., Graph] = builder.build
    return fn(cfg, weights, name)


__all__ = ["ENTRY_POINT_GROUP", "build_graph", "supported_architectures"]

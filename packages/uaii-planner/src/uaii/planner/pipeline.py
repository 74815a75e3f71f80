"""Pipeline stages: a decoder graph cut into K contiguous runs of layers, each a graph of its own.

A stage runs on its own machine with its own memory budget and holds only its own layers' weights and KV caches,
so what crosses between stages per token must be small: the cuts are placed where the fewest activations are live
(the residual stream, ``d_model`` values a token), found from the graph's structure — the cached Attention nodes
(:func:`uaii.ir.kvcache.kv_layers`) mark the layers, value liveness marks where a layer ends — never from value
names. The split itself is chosen from per-stage budgets: a token passes the stages one after the other, so its
time is the sum of the stages' and the bytes streamed from disk, summed over the stages, are what to minimize;
among splits that stream the same, the most even one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise

from uaii.ir import Graph, Tensor, num_elements
from uaii.ir.graph import topological_order
from uaii.ir.kvcache import kv_layers
from uaii.planner.errors import PlannerError


@dataclass(frozen=True)
class LayerCut:
    """Where the graph may be cut before cached layer ``layer`` (1 .. layers - 1): the nodes before ``position``
    (in :func:`node_order`) run in the earlier stage; ``crossing`` are the values live across it."""

    layer: int
    position: int
    crossing: tuple[str, ...]


@dataclass(frozen=True)
class PipelineStage:
    """One stage: ``graph`` computes layers ``first`` .. ``last - 1`` (and the embedding in the first stage, the
    head in the last). ``receives``: the earlier stages' values it takes (its graph inputs beside the model's own
    inputs), ``sends``: the values the later stages take from it or through it, ``forwards`` those of them it only
    passes on (they are not computed here). ``weight_bytes``: its weights, each counted once."""

    index: int
    first: int
    last: int
    graph: Graph
    receives: tuple[str, ...]
    sends: tuple[str, ...]
    forwards: tuple[str, ...]
    weight_bytes: int

    @property
    def layers(self) -> int:
        return self.last - self.first


def node_order(graph: Graph) -> list[int]:
    """The graph's nodes in a topological order (their own order where it is one); a cycle is a PlannerError."""
    producer = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs if o}
    deps = {i: [producer[x] for x in n.inputs if x in producer] for i, n in enumerate(graph.nodes)}
    order = topological_order(deps)
    if len(order) != len(graph.nodes):
        raise PlannerError(f"[planner] graph {graph.name!r} has a cycle: it cannot be cut into pipeline stages")
    return order


class _Liveness:
    """Which activation values (not the model's inputs, weights or constants) are live at each cut position."""

    def __init__(self, graph: Graph, order: Sequence[int]) -> None:
        tmap = graph.tensor_map
        self.graph, self.order = graph, list(order)
        fixed = {t.name for t in graph.tensors if t.is_weight or t.is_constant} | set(graph.inputs)
        self.born: dict[str, int] = {}
        self.last_read: dict[str, int] = {}
        for pos, i in enumerate(self.order):
            node = graph.nodes[i]
            for x in node.inputs:
                if x and x not in fixed and x in tmap:
                    self.last_read[x] = pos
            for o in node.outputs:
                if o:
                    self.born.setdefault(o, pos)

    def crossing(self, position: int) -> tuple[str, ...]:
        """Values made before ``position`` and read at or after it, in the order they were made."""
        live = [v for v, b in self.born.items() if b < position <= self.last_read.get(v, -1)]
        return tuple(sorted(live, key=self.born.__getitem__))


def layer_cuts(graph: Graph) -> list[LayerCut]:
    """The cut before each cached layer but the first: between layer j - 1's Attention and layer j's, the position
    with the fewest live values, the latest of those (after layer j - 1's last node, before layer j's first), so
    a layer's feed-forward stays with its attention. A PlannerError when the graph has no cached layers."""
    order = node_order(graph)
    at = {graph.nodes[i].name: pos for pos, i in enumerate(order)}
    layers = kv_layers(graph)
    if not layers:
        raise PlannerError(f"[planner] graph {graph.name!r} has no cached Attention layers: there is nothing to "
                           "split into pipeline stages")
    attn = [at[kv.node] for kv in layers]
    live = _Liveness(graph, order)
    cuts: list[LayerCut] = []
    for j in range(1, len(attn)):
        best: tuple[int, int] | None = None
        for pos in range(attn[j - 1] + 1, attn[j] + 1):
            n = len(live.crossing(pos))
            if best is None or n <= best[0]:
                best = (n, pos)
        assert best is not None
        cuts.append(LayerCut(j, best[1], live.crossing(best[1])))
    return cuts


def _weight_bytes(t: Tensor) -> int:
    dims = [int(d) for d in t.shape if isinstance(d, int)]
    return t.dtype.nbytes(num_elements(dims)) if len(dims) == len(t.shape) else 0


class _Units:
    """The graph as ``layers`` units (unit j: the nodes from the cut before layer j to the cut before layer j + 1)
    and the weights each one reads."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.order = node_order(graph)
        self.cuts = layer_cuts(graph)
        self.bounds = [0, *(c.position for c in self.cuts), len(self.order)]
        tmap = graph.tensor_map
        self.weights: list[set[str]] = []
        for u in range(len(self.bounds) - 1):
            names = {x for i in self.order[self.bounds[u]:self.bounds[u + 1]] for x in graph.nodes[i].inputs
                     if x in tmap and tmap[x].is_weight}
            self.weights.append(names)

    @property
    def count(self) -> int:
        return len(self.weights)

    @cached_property
    def sizes(self) -> dict[str, int]:
        return {t.name: _weight_bytes(t) for t in self.graph.tensors if t.is_weight}

    def bytes_of(self, first: int, last: int) -> int:
        """Weight bytes of units first .. last - 1 together (a weight two of them read counted once)."""
        names: set[str] = set().union(*self.weights[first:last])
        return sum(self.sizes[n] for n in names)


def split_graph(graph: Graph, starts: Sequence[int]) -> list[PipelineStage]:
    """The stages that begin at layers ``starts`` (ascending, each in 1 .. layers - 1; stage 0 begins at layer 0):
    ``len(starts) + 1`` graphs that, run one after the other with each one's ``sends`` fed to the next, compute
    what ``graph`` computes, node for node."""
    units = _Units(graph)
    layers = units.count
    starts = list(starts)
    if any(b <= a for a, b in pairwise(starts)) or any(not 0 < s < layers for s in starts):
        raise PlannerError(f"[planner] pipeline stages must begin at ascending layers in 1..{layers - 1} (graph "
                           f"{graph.name!r} has {layers} cached layers), found {starts}")
    bounds = [0, *starts, layers]
    crossing = {0: (), layers: ()} | {c.layer: c.crossing for c in units.cuts}
    tmap = graph.tensor_map
    stages: list[PipelineStage] = []
    for s in range(len(bounds) - 1):
        first, last = bounds[s], bounds[s + 1]
        nodes = [graph.nodes[i] for i in units.order[units.bounds[first]:units.bounds[last]]]
        made = {o for n in nodes for o in n.outputs if o}
        read = {x for n in nodes for x in n.inputs if x}
        incoming, outgoing = crossing[first], crossing[last]
        receives = tuple(v for v in incoming if v in read)
        forwards = tuple(v for v in outgoing if v not in made)
        inputs = tuple(x for x in graph.inputs if x in read) + receives
        outputs = tuple(v for v in outgoing if v in made) + tuple(o for o in graph.outputs if o in made)
        used = set(inputs) | set(outputs) | read | made
        tensors = tuple(t for t in graph.tensors if t.name in used)
        weights = {x for x in read if x in tmap and tmap[x].is_weight}
        meta = {**graph.meta, "pipeline.stage": f"{s}/{len(bounds) - 1}", "pipeline.layers": f"{first}:{last}"}
        sub = Graph(name=f"{graph.name}.stage{s}", inputs=inputs, outputs=outputs, nodes=tuple(nodes),
                    tensors=tensors, metadata=tuple(meta.items()), producer=graph.producer, domain=graph.domain,
                    ir_version=graph.ir_version)
        stages.append(PipelineStage(s, first, last, sub, receives, outgoing, forwards,
                            sum(units.sizes[w] for w in weights)))
    return stages


def choose_split(graph: Graph, stages: int, budgets: Sequence[int], unit_extra: Sequence[int] = ()) -> list[int]:
    """The layers where stages 1 .. ``stages`` - 1 begin (for :func:`split_graph`), chosen for per-stage weight
    budgets ``budgets`` (one per stage, or one for all; 0: unlimited): fewest bytes over the budgets in all (what
    streams from disk every token), then the smallest largest stage (relative to its budget). ``unit_extra``:
    bytes each layer needs beside its weights (its KV cache), counted against the budget of the stage holding it."""
    units = _Units(graph)
    n = units.count
    if not 1 <= stages <= n:
        raise PlannerError(f"[planner] {stages} pipeline stages for {n} cached layers: give 1 to {n}")
    if len(budgets) == 1:
        budgets = list(budgets) * stages
    if len(budgets) != stages:
        raise PlannerError(f"[planner] {len(budgets)} stage budgets for {stages} stages: give one or one per stage")
    extra = list(unit_extra) or [0] * n
    if len(extra) != n:
        raise PlannerError(f"[planner] unit_extra has {len(extra)} entries for {n} layers")
    need = {(a, b): units.bytes_of(a, b) + sum(extra[a:b]) for a in range(n) for b in range(a + 1, n + 1)}

    def cost(s: int, a: int, b: int) -> tuple[int, float]:
        budget = budgets[s]
        over = max(0, need[a, b] - budget) if budget else 0
        return over, need[a, b] / budget if budget else float(need[a, b])

    # best[s][b]: (bytes over, largest load, starts) of stages 0..s covering units 0..b-1
    best: list[dict[int, tuple[int, float, tuple[int, ...]]]] = [{} for _ in range(stages)]
    for b in range(1, n - stages + 2):
        over, load = cost(0, 0, b)
        best[0][b] = (over, load, ())
    for s in range(1, stages):
        for b in range(s + 1, n - stages + s + 2):
            options = []
            for a in range(s, b):
                if a not in best[s - 1]:
                    continue
                po, pl, ps = best[s - 1][a]
                over, load = cost(s, a, b)
                options.append((po + over, max(pl, load), (*ps, a)))
            best[s][b] = min(options, key=lambda o: (o[0], o[1]))
    return list(best[stages - 1][n][2])


__all__ = ["LayerCut", "PipelineStage", "choose_split", "layer_cuts", "node_order", "split_graph"]

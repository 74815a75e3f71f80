"""Run one node (:func:`run_node`) or a whole graph (:func:`evaluate`) with the NumPy references.

evaluate() runs only the nodes the requested outputs need, in graph order when that order is valid and in a
topological order otherwise; binds symbolic dims from the feeds and checks every produced value against its
declared shape (one binding per symbol for the whole run); rounds each result to its declared dtype (a float
result to a declared float type, an index result to a declared index type; block-quantized values stay
float32); and drops each intermediate once its last consumer has run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from uaii.ir.dtype import DType
from uaii.ir.graph import Graph, Node, Tensor, needed_nodes, topological_order
from uaii.ir.reference._common import Array, EvaluationError, f64, is_floatlike, to_dtype
from uaii.ir.reference.table import REFERENCE_OPS, wants_output_count
from uaii.ir.registry import Registry, default_registry

WeightSource = Callable[[Tensor], np.ndarray] | Mapping[str, np.ndarray]


def _fail(where: str, detail: str) -> EvaluationError:
    return EvaluationError(f"[reference] {where}: {detail}")


def _run(node: Node, inputs: Sequence[Array | None], registry: Registry | None, where: str) -> list[Array]:
    schema = (registry or default_registry()).get(node.op, node.version)
    fn = REFERENCE_OPS.get((node.op, node.version))
    if fn is None:
        raise _fail(where, f"no reference implementation for {node.op} version {node.version}")
    attrs, problems = schema.resolve_attrs(node)
    problems += [("arity", p) for p in schema.check_arity(node)]
    if problems:
        raise _fail(where, "; ".join(msg for _, msg in problems))
    if len(inputs) != len(node.inputs):
        raise _fail(where, f"the node has {len(node.inputs)} inputs but {len(inputs)} arrays were given")
    kwargs = dict(attrs)
    if wants_output_count(fn):
        kwargs["num_outputs"] = len(node.outputs)
    try:
        result = fn(*inputs, **kwargs)
    except EvaluationError as exc:
        raise _fail(where, str(exc).removeprefix("[reference] ").removeprefix(f"{node.op}: ")) from None
    except (ValueError, IndexError, TypeError) as exc:
        raise _fail(where, f"{type(exc).__name__}: {exc}") from exc
    outs = [np.asarray(r) for r in (result if isinstance(result, tuple) else (result,))]
    if len(outs) < len(node.outputs):
        raise _fail(where, f"the reference returned {len(outs)} outputs for {len(node.outputs)} output slots")
    return outs[: len(node.outputs)]


def run_node(node: Node, inputs: Sequence[Array | None], registry: Registry | None = None) -> list[Array]:
    """Run one node: ``inputs`` holds one array per input slot (None for an omitted optional input).

    Attributes are resolved against the node's schema (defaults filled in, problems raised). Returns one
    array per output slot, in the dtype the reference computes (see :func:`evaluate` for declared types).
    """
    return _run(node, inputs, registry, f"node {node.name!r} ({node.op})")


# --- graph evaluation ---------------------------------------------------------------------------------------
def _schedule(graph: Graph, needed: list[int], producers: dict[str, int]) -> list[int]:
    """Graph order if every node's producers come first, else Kahn's algorithm (lowest index first)."""
    pos = {i: n for n, i in enumerate(needed)}
    deps = {i: {producers[x] for x in graph.nodes[i].inputs if x in producers} for i in needed}
    if all(pos[d] < pos[i] for i in needed for d in deps[i]):
        return needed
    order = topological_order(deps)
    if len(order) != len(needed):
        done = set(order)
        stuck = [graph.nodes[i].name for i in needed if i not in done]
        raise _fail(f"graph {graph.name!r}", f"nodes {stuck[:5]} depend on themselves (a cycle)")
    return order


class _Run:
    """The state of one evaluate() call: values, symbol bindings and remaining uses."""

    def __init__(self, graph: Graph, weights: WeightSource, check_shapes: bool) -> None:
        self.g = graph
        self.weights = weights
        self.check_shapes = check_shapes
        self.dims: dict[str, int] = {}
        self.values: dict[str, Array] = {}

    def match_shape(self, t: Tensor, shape: tuple[int, ...], where: str) -> None:
        if len(shape) != len(t.shape):
            raise _fail(where, f"{t.name!r} has rank {len(shape)} {list(shape)}; declared {list(t.shape)}")
        for d, n in zip(t.shape, shape, strict=True):
            bound = self.dims.setdefault(d, n) if isinstance(d, str) else d
            if bound != n:
                binding = f" ({d} = {bound} so far)" if isinstance(d, str) else ""
                raise _fail(where, f"{t.name!r} has shape {list(shape)}; declared {list(t.shape)}{binding}")

    def feed(self, name: str, value: np.ndarray) -> None:
        where = f"graph {self.g.name!r}, input {name!r}"
        t = self.g.tensor_map.get(name)
        if t is None or name not in self.g.inputs:
            raise _fail(where, f"is not an input of the graph (inputs: {list(self.g.inputs)})")
        arr = np.asarray(value)
        if arr.dtype != t.dtype.numpy:
            raise _fail(where, f"fed dtype {arr.dtype}; declared {t.dtype.value} (numpy {t.dtype.numpy})")
        self.match_shape(t, arr.shape, where)
        self.values[name] = arr

    def stored(self, t: Tensor) -> Array:
        """An inline constant or a weight, in its declared type (block types as float32)."""
        where = f"graph {self.g.name!r}, weight {t.name!r}"
        if t.is_constant:
            return t.numpy()
        if isinstance(self.weights, Mapping):
            if t.name not in self.weights:
                raise _fail(where, "no array for this weight in the weights mapping")
            arr = np.asarray(self.weights[t.name])
        else:
            arr = np.asarray(self.weights(t))
        static = tuple(int(d) for d in t.shape)
        if arr.shape != static:
            raise _fail(where, f"the weight source gave shape {list(arr.shape)}; declared {list(static)}")
        return arr.astype(np.float32) if t.dtype.is_quantized else _coerce(arr, t.dtype, where)

    def lookup(self, name: str, where: str) -> Array:
        if name not in self.values:
            t = self.g.tensor_map.get(name)
            if t is None or not (t.is_constant or t.is_weight):
                raise _fail(where, f"value {name!r} is neither fed, produced, a weight nor a constant")
            self.values[name] = self.stored(t)
        return self.values[name]

    def store(self, name: str, arr: Array, where: str) -> None:
        t = self.g.tensor_map.get(name)
        if t is not None:
            arr = arr.astype(np.float32) if t.dtype.is_quantized else _coerce(arr, t.dtype, where)
            if self.check_shapes:
                self.match_shape(t, arr.shape, where)
        self.values[name] = arr


def _coerce(arr: Array, dtype: DType, where: str) -> Array:
    """``arr`` in the plain ``dtype``: floats round, integers convert; float ↔ integer is an error."""
    want = dtype.numpy
    if arr.dtype == want:
        return arr
    if is_floatlike(arr) and (dtype.is_float or dtype is DType.BF16):
        return to_dtype(f64(arr), want)
    if arr.dtype.kind in "iu" and dtype.is_integer:
        return arr.astype(want)
    raise _fail(where, f"produced {arr.dtype} where {dtype.value} is declared")


def evaluate(graph: Graph, feeds: Mapping[str, np.ndarray], weights: WeightSource, *,
             outputs: Sequence[str] | None = None, registry: Registry | None = None,
             check_shapes: bool = True) -> dict[str, np.ndarray]:
    """Run ``graph`` with the references and return ``outputs`` (default: the graph outputs) by name.

    ``feeds`` maps graph input names to arrays of exactly the declared dtype (bf16 as raw uint16 words) and
    rank. ``weights`` is a mapping from weight name to array, or a callback ``weights(tensor) -> array``; a
    block-quantized weight must come back dequantized (float32), a plain one is rounded to its declared type.
    Inline constants come from the graph itself.
    """
    wanted = list(dict.fromkeys(graph.outputs if outputs is None else outputs))
    producers = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs if o}
    run = _Run(graph, weights, check_shapes)
    for name, value in feeds.items():
        run.feed(name, value)
    order = _schedule(graph, needed_nodes([(n.inputs, n.outputs) for n in graph.nodes], wanted), producers)
    uses = Counter(x for i in order for x in graph.nodes[i].inputs if x)
    keep = set(wanted)
    for name in [*wanted, *(x for x in uses if x in graph.inputs)]:
        if name in graph.inputs and name not in run.values:
            raise _fail(f"graph {graph.name!r}", f"input {name!r} is needed but was not fed")
        if name not in producers and name not in graph.inputs and name not in graph.tensor_map:
            raise _fail(f"graph {graph.name!r}", f"{name!r} is not a value of the graph")
    for i in order:
        node = graph.nodes[i]
        where = f"node {i} {node.name!r} ({node.op}) in graph {graph.name!r}"
        args = [run.lookup(x, where) if x else None for x in node.inputs]
        for name, arr in zip(node.outputs, _run(node, args, registry, where), strict=True):
            if name:
                run.store(name, arr, where)
        for x in node.inputs:
            uses[x] -= 1
        for x in {*node.inputs, *node.outputs}:
            if x and uses[x] <= 0 and x not in keep:
                run.values.pop(x, None)
    return {name: run.lookup(name, f"graph {graph.name!r}") for name in wanted}

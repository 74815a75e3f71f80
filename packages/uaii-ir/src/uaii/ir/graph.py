"""The immutable IR: tensors, nodes and graphs.

Values are addressed by name inside a graph (files address them by numeric id; the serializers translate).
Every object here is a frozen dataclass: passes build new graphs with ``dataclasses.replace`` instead of mutating
what a loader produced. Attributes carry their type explicitly because the file formats do (``int`` 1 and
``float`` 1.0 are different attributes to the C++ runtime).
"""

from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from uaii.ir.dtype import Dim, DType, num_elements
from uaii.ir.errors import GraphError
from uaii.ir.weightref import WeightRef

IR_VERSION = (1, 1)
"""IR version we write. 1.0 is the C++ runtime's; 1.1 adds block dtypes, symbolic dims and inline constants."""

MAX_INLINE_BYTES = 1 << 16
"""Inline constants are for small things (shape vectors, scalars). Weights always go through a WeightRef."""


class AttrType(enum.Enum):
    """Attribute types, numbered as in the C++ runtime's codec 1."""

    STRING = "string"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    INT_ARRAY = "int_array"
    FLOAT_ARRAY = "float_array"

    @property
    def code(self) -> int:
        return _ATTR_CODES[self]

    @classmethod
    def from_code(cls, code: int) -> AttrType:
        for t, c in _ATTR_CODES.items():
            if c == code:
                return t
        raise ValueError(f"unknown attribute type code {code}")


_ATTR_CODES = {AttrType.STRING: 0, AttrType.INT: 1, AttrType.FLOAT: 2, AttrType.BOOL: 3, AttrType.INT_ARRAY: 4,
               AttrType.FLOAT_ARRAY: 5}

AttrValue = str | int | float | bool | tuple[int, ...] | tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Attribute:
    """A typed attribute value. Use :func:`attr` to infer the type from a Python value."""

    type: AttrType
    value: AttrValue

    def __post_init__(self) -> None:
        t, v = self.type, self.value
        ok = {
            AttrType.STRING: lambda: isinstance(v, str),
            AttrType.INT: lambda: isinstance(v, int) and not isinstance(v, bool),
            AttrType.FLOAT: lambda: isinstance(v, float),
            AttrType.BOOL: lambda: isinstance(v, bool),
            AttrType.INT_ARRAY: lambda: isinstance(v, tuple)
            and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
            AttrType.FLOAT_ARRAY: lambda: isinstance(v, tuple) and all(isinstance(x, float) for x in v),
        }[t]()
        if not ok:
            raise GraphError(f"attribute value {v!r} does not have type {t.value}")
        if t in (AttrType.INT, AttrType.INT_ARRAY):
            vals = (v,) if t is AttrType.INT else v
            for x in vals:  # type: ignore[union-attr]
                if not -(1 << 63) <= int(x) < (1 << 63):  # type: ignore[arg-type]
                    raise GraphError(f"int attribute {x} does not fit in 64 bits")


def attr(value: Any) -> Attribute:
    """Wrap a Python value: bool → bool, int → int, float → float, str → string, sequences → arrays."""
    if isinstance(value, Attribute):
        return value
    if isinstance(value, bool):
        return Attribute(AttrType.BOOL, value)
    if isinstance(value, (int, np.integer)):
        return Attribute(AttrType.INT, int(value))
    if isinstance(value, (float, np.floating)):
        return Attribute(AttrType.FLOAT, float(value))
    if isinstance(value, str):
        return Attribute(AttrType.STRING, value)
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
        if all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in items):
            return Attribute(AttrType.INT_ARRAY, tuple(int(x) for x in items))
        if all(isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) for x in items):
            return Attribute(AttrType.FLOAT_ARRAY, tuple(float(x) for x in items))
    raise GraphError(f"cannot store {value!r} ({type(value).__name__}) as an attribute")


class StorageHint(enum.Enum):
    """Where a tensor's bytes are expected to live (C++ runtime codes 0..3)."""

    UNSPECIFIED = ""
    RAM = "ram"
    MMAP = "mmap"
    EXTERNAL = "external"

    @property
    def code(self) -> int:
        return list(StorageHint).index(self)

    @classmethod
    def parse(cls, text: str) -> StorageHint:
        return cls.UNSPECIFIED if text in ("", "unspecified") else cls(text)


def _check_shape(shape: Sequence[Dim]) -> tuple[Dim, ...]:
    out: list[Dim] = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, str, np.integer)):
            raise GraphError(f"dimension {d!r} must be an int or a symbolic name")
        if isinstance(d, str):
            if not d.isidentifier():
                raise GraphError(f"symbolic dimension {d!r} must be an identifier")
            out.append(d)
        else:
            if int(d) < 0:
                raise GraphError(f"dimension {d} must be >= 0")
            out.append(int(d))
    return tuple(out)


@dataclass(frozen=True)
class Tensor:
    """A value of the graph: an input, an intermediate, an output, a weight or an inline constant.

    ``weight`` points at the bytes of a weight; ``data`` holds a small constant's raw little-endian bytes. A
    tensor with ``is_weight`` but neither is a weight the caller must supply (the C API may fill it).
    """

    name: str
    dtype: DType
    shape: tuple[Dim, ...]
    weight: WeightRef | None = None
    data: bytes | None = None
    storage_hint: StorageHint = StorageHint.UNSPECIFIED
    is_weight: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _check_shape(self.shape))
        object.__setattr__(self, "dtype", DType.parse(self.dtype))
        if self.weight is not None and self.data is not None:
            raise GraphError(f"tensor {self.name!r} cannot have both a weight reference and inline data")
        if self.weight is not None and not self.is_weight:
            object.__setattr__(self, "is_weight", True)
        if self.data is not None:
            if len(self.data) > MAX_INLINE_BYTES:
                raise GraphError(f"tensor {self.name!r}: inline constant of {len(self.data)} bytes exceeds "
                                 f"{MAX_INLINE_BYTES}; store it as a weight reference")
            expected = self.dtype.nbytes(num_elements(self.shape))
            if len(self.data) != expected:
                raise GraphError(f"tensor {self.name!r}: inline data has {len(self.data)} bytes, dtype "
                                 f"{self.dtype.value} x shape {list(self.shape)} needs {expected}")

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    @property
    def rank(self) -> int:
        return len(self.shape)

    def numpy(self) -> np.ndarray:
        """The inline constant as a numpy array (only for plain dtypes)."""
        if self.data is None:
            raise GraphError(f"tensor {self.name!r} has no inline data")
        return np.frombuffer(self.data, dtype=self.dtype.numpy).reshape([int(d) for d in self.shape])

    @classmethod
    def constant(cls, name: str, array: np.ndarray) -> Tensor:
        arr = np.ascontiguousarray(array).reshape(np.shape(array))  # ascontiguousarray makes a scalar 1-D
        dt = DType.from_numpy(arr.dtype)
        return cls(name, dt, tuple(arr.shape), data=arr.astype(dt.numpy, copy=False).tobytes())


@dataclass(frozen=True)
class Node:
    """One operation. Inputs and outputs are value names; ``""`` marks an omitted optional input."""

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: tuple[tuple[str, Attribute], ...] = ()
    version: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        attrs = self.attributes
        if isinstance(attrs, Mapping):
            attrs = tuple(attrs.items())
        object.__setattr__(self, "attributes", tuple(sorted((k, attr(v)) for k, v in attrs)))
        keys = [k for k, _ in self.attributes]
        if len(keys) != len(set(keys)):
            raise GraphError(f"node {self.name!r} has duplicate attribute keys")

    @cached_property
    def attrs(self) -> dict[str, Attribute]:
        return dict(self.attributes)

    def get(self, key: str, default: Any = None) -> Any:
        """The plain value of attribute ``key`` (arrays as tuples), or ``default``."""
        a = self.attrs.get(key)
        return default if a is None else a.value


@dataclass(frozen=True)
class Graph:
    """A complete model or subgraph. ``tensors`` declares every value (inputs, weights, intermediates)."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    tensors: tuple[Tensor, ...]
    metadata: tuple[tuple[str, str], ...] = ()
    producer: str = "uaii"
    domain: str = "uaii"
    ir_version: tuple[int, int] = IR_VERSION

    def __post_init__(self) -> None:
        for f in ("inputs", "outputs", "nodes", "tensors"):
            object.__setattr__(self, f, tuple(getattr(self, f)))
        meta = self.metadata
        if isinstance(meta, Mapping):
            meta = tuple(meta.items())
        object.__setattr__(self, "metadata", tuple(sorted((str(k), str(v)) for k, v in meta)))

    @cached_property
    def tensor_map(self) -> dict[str, Tensor]:
        """Name → tensor (the first one, where a broken graph declares a name twice)."""
        out: dict[str, Tensor] = {}
        for t in self.tensors:
            out.setdefault(t.name, t)
        return out

    def tensor(self, name: str) -> Tensor:
        try:
            return self.tensor_map[name]
        except KeyError:
            raise GraphError(f"graph {self.name!r} declares no tensor {name!r}") from None

    @cached_property
    def meta(self) -> dict[str, str]:
        return dict(self.metadata)

    @property
    def weights(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors if t.is_weight)

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    out.setdefault(i, []).append(n)
        return out


def float_equal(a: float, b: float) -> bool:
    """Bit-level equality for round-trip checks (NaN equals NaN, 0.0 differs from -0.0)."""
    if math.isnan(a) and math.isnan(b):
        return True
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def topological_order(deps: Mapping[int, Iterable[int]]) -> list[int]:
    """Kahn's order of the keys of ``deps`` (node → the nodes it depends on), stable: a node comes as early as its
    dependencies allow, ties by the smaller key. Nodes on or behind a cycle are left out, so a result shorter than
    ``deps`` means a cycle; each caller reports that in its own terms. Dependencies outside ``deps`` are ignored."""
    users: dict[int, list[int]] = {i: [] for i in deps}
    waiting: dict[int, int] = {}
    for i, ds in deps.items():
        inside = {d for d in ds if d in users}
        waiting[i] = len(inside)
        for d in inside:
            users[d].append(i)
    ready = [i for i, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    return order


def needed_nodes(nodes_io: Sequence[tuple[Iterable[str], Iterable[str]]], wanted: Iterable[str]) -> list[int]:
    """Indices, ascending, of the nodes the ``wanted`` values depend on; ``nodes_io[i]`` = node i's (inputs,
    outputs) names, "" for an omitted slot. Importers prune what only fed folded shape arithmetic with it, the
    reference evaluator runs no more than a request needs."""
    producer = {o: i for i, (_, outs) in enumerate(nodes_io) for o in outs if o}
    seen: set[int] = set()
    stack = [producer[w] for w in wanted if w in producer]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        stack += [producer[x] for x in nodes_io[i][0] if x in producer]
    return sorted(seen)


def restricted(graph: Graph, outputs: Sequence[str]) -> Graph:
    """``graph`` computing only ``outputs``: the nodes they need and the tensors those nodes, the inputs or the
    outputs name (an importer drops what only fed folded shape arithmetic, a rewrite an output it replaced)."""
    nodes = tuple(graph.nodes[i] for i in needed_nodes([(n.inputs, n.outputs) for n in graph.nodes], outputs))
    used = set(graph.inputs) | set(outputs) | {x for n in nodes for x in (*n.inputs, *n.outputs) if x}
    tensors = tuple(t for t in graph.tensors if t.name in used)
    return replace(graph, outputs=tuple(outputs), nodes=nodes, tensors=tensors)


def make_graph(name: str, nodes: Iterable[Node], tensors: Iterable[Tensor], inputs: Sequence[str],
               outputs: Sequence[str], metadata: Mapping[str, str] | None = None, **kw: Any) -> Graph:
    """Convenience constructor for builders and tests."""
    return Graph(name=name, inputs=tuple(inputs), outputs=tuple(outputs), nodes=tuple(nodes),
                 tensors=tuple(tensors), metadata=tuple((metadata or {}).items()), **kw)


__all__ = ["IR_VERSION", "MAX_INLINE_BYTES", "AttrType", "AttrValue", "Attribute", "Graph", "Node",
           "StorageHint", "Tensor", "attr", "float_equal", "make_graph", "needed_nodes",
           "restricted", "topological_order"]


"""The backend interface: what every execution backend implements, and the small types it exchanges.

A backend is found by name (entry-point group ``uaii.backends``). It reports whether it can run here
(:meth:`Backend.probe`), what it can run (:attr:`Backend.capabilities`, :meth:`Backend.supports_op`), owns device
memory (:meth:`Backend.alloc`, :meth:`Backend.copy`) and turns a validated graph (plus, when there is one, the
planner's :class:`~uaii.ir.plan.ExecutionPlan`) into an :class:`Executable`. Weights reach ``compile`` through a
:class:`WeightSource` — anything with ``acquire(ref) -> np.ndarray`` (a uaii-storage store, or
:class:`ArrayWeights` in tests): plain dtypes come back as typed views, block-quantized tensors as raw ``uint8``.

Optional slots follow ggml's habit: :class:`BackendBase` gives every method a default that either works
(``alloc``/``copy`` on host memory) or raises :class:`BackendUnavailable` naming the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from uaii.ir import Graph, Node, Tensor, UaiiError
from uaii.ir.plan import ExecutionPlan


class BackendError(UaiiError):
    """A backend could not compile or run a graph: says which node, which op and why."""

    component = "backend"


class BackendUnavailable(BackendError):
    """The backend cannot run on this machine (no SDK, no driver, no device); ``reason`` says which."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"[backend] {name} is not available: {reason}")


class UnsupportedOpError(BackendError):
    """Nodes of a graph that the backend cannot run, each with the reason."""

    def __init__(self, backend: str, problems: list[tuple[str, str, str]]) -> None:
        self.problems = problems  # (node name, op, reason)
        shown = "; ".join(f"node {n!r} ({op}): {why}" for n, op, why in problems[:5])
        more = f" and {len(problems) - 5} more" if len(problems) > 5 else ""
        super().__init__(f"[backend] {backend} cannot run {len(problems)} node(s): {shown}{more}")


@dataclass(frozen=True)
class DeviceStatus:
    """What a probe found: ``available`` with the physical ``devices`` it enumerated, or the ``reason`` it
    cannot run here."""

    available: bool
    reason: str = ""
    devices: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if self.available:
            return "available: " + ", ".join(self.devices)
        return "unavailable: " + self.reason


@dataclass(frozen=True)
class Capabilities:
    """What a backend runs: activation dtypes, weight dtypes (kept packed) and op names; ``unsupported`` maps
    registered ops it deliberately does not run to the reason."""

    activation_dtypes: frozenset[str] = frozenset()
    weight_dtypes: frozenset[str] = frozenset()
    ops: frozenset[str] = frozenset()
    unsupported: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class WeightSource(Protocol):
    """Resolves weight references (``str(WeightRef)``, or the tensor name for caller-supplied weights)."""

    def acquire(self, ref: str) -> np.ndarray: ...

    def release(self, ref: str) -> None: ...


class ArrayWeights:
    """A :class:`WeightSource` over in-memory arrays (tests, conformance, caller-supplied weights)."""

    def __init__(self, arrays: Mapping[str, np.ndarray] | None = None) -> None:
        self.arrays: dict[str, np.ndarray] = dict(arrays or {})

    def acquire(self, ref: str) -> np.ndarray:
        try:
            return self.arrays[str(ref)]
        except KeyError:
            raise BackendError(f"[backend] no weight {str(ref)!r} among {len(self.arrays)} supplied "
                               "arrays") from None

    def release(self, ref: str) -> None:
        """Arrays stay valid while the object lives."""


def weight_key(t: Tensor) -> str:
    """The key a :class:`WeightSource` is asked for: the reference string, else the tensor name."""
    return str(t.weight) if t.weight is not None else t.name


def plan_graph(graph: Graph, plan: ExecutionPlan) -> Graph:
    """The graph a plan's steps describe: one node per step, in step order (fused nodes included), over the
    tensors of ``graph`` (fusion only removes values, so every value a step names is declared there)."""
    from uaii.ir import attr

    names = {n.name for n in graph.nodes}
    if [s.node for s in plan.steps] == [n.name for n in graph.nodes]:
        return graph
    nodes = []
    for s in plan.steps:
        op, _, rest = s.kernel.partition("/")
        version = int(rest.split("/", 1)[0]) if rest else 1
        nodes.append(Node(s.node, op, tuple(s.inputs), tuple(s.outputs),
                          tuple((k, attr(v)) for k, v in s.attributes), version))
    used = {v for n in nodes for v in (*n.inputs, *n.outputs) if v} | set(graph.inputs) | set(graph.outputs)
    tensors = tuple(t for t in graph.tensors if t.name in used)
    unknown = [v for v in used if v not in graph.tensor_map]
    if unknown or not names:
        raise BackendError(f"[backend] plan {plan.key[:12]} names values the graph does not declare: {unknown[:3]}")
    from dataclasses import replace

    return replace(graph, nodes=tuple(nodes), tensors=tensors)


@runtime_checkable
class KVStateLike(Protocol):
    """The per-sequence state an executable carries between runs (the KV cache)."""

    @property
    def length(self) -> int: ...

    def reset(self) -> None: ...

    def truncate(self, n: int) -> None: ...


@runtime_checkable
class Executable(Protocol):
    """A compiled graph. ``run`` takes the feeds (graph inputs that the state does not provide) and returns the
    outputs (graph outputs that the state does not keep) by name; returned arrays are views of the executable's
    buffers, valid until the next ``run``."""

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    def run(self, feeds: Mapping[str, np.ndarray], state: Any = None) -> dict[str, np.ndarray]: ...

    def new_state(self, capacity: int) -> Any: ...

    def close(self) -> None: ...


@runtime_checkable
class Backend(Protocol):
    name: str

    def probe(self) -> DeviceStatus: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def supports_op(self, node: Node) -> bool: ...

    def alloc(self, nbytes: int) -> Any: ...

    def copy(self, src: Any, dst: Any) -> None: ...

    def compile(self, graph: Graph, plan: ExecutionPlan | None, weights: WeightSource,
                **options: Any) -> Executable: ...


class BackendBase:
    """Defaults for the optional slots: host memory for ``alloc``/``copy``; ``compile`` unavailable."""

    name = "base"
    kind = "cpu"  # "cpu" or "gpu": select_device("auto") prefers the first available gpu backend

    def probe(self) -> DeviceStatus:
        return DeviceStatus(False, "not implemented")

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities()

    def supports_op(self, node: Node) -> bool:
        return self.unsupported_reason(node) is None

    def unsupported_reason(self, node: Node) -> str | None:
        """Why ``node`` cannot run here, or None when it can."""
        caps = self.capabilities
        if node.op in caps.ops:
            return None
        return caps.unsupported.get(node.op, f"op {node.op!r} is not implemented by the {self.name} backend")

    def alloc(self, nbytes: int) -> Any:
        """A zero-initialized host buffer, 64-byte aligned."""
        raw = np.zeros(int(nbytes) + 64, dtype=np.uint8)
        start = (-raw.ctypes.data) % 64
        return raw[start:start + int(nbytes)]

    def copy(self, src: Any, dst: Any) -> None:
        np.copyto(np.asarray(dst).reshape(-1).view(np.uint8), np.asarray(src).reshape(-1).view(np.uint8))

    def compile(self, graph: Graph, plan: ExecutionPlan | None, weights: WeightSource,
                **options: Any) -> Executable:
        status = self.probe()
        raise BackendUnavailable(self.name, status.reason or "this backend does not execute graphs")

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


__all__ = [
    "ArrayWeights",
    "Backend",
    "BackendBase",
    "BackendError",
    "BackendUnavailable",
    "Capabilities",
    "DeviceStatus",
    "Executable",
    "KVStateLike",
    "UnsupportedOpError",
    "WeightSource",
    "plan_graph",
    "weight_key",
]

"""The backend interface: what every execution backend implements, and the small types it exchanges.

A backend is found by name (entry-point group ``uaii.backends``). It reports whether it can run here
(:meth:`Backend.probe`), what it can run (:attr:`Backend.capabilities`, :meth:`Backend.supports_op`), owns device
memory (:meth:`Backend.alloc`, :meth:`Backend.copy`) and turns a validated graph (plus, when there is one, the
planner's :class:`~uaii.ir.plan.ExecutionPlan`) into an :class:`Executable`. Weights reach ``compile`` through a
:class:`WeightSource` — anything with ``acquire(ref) -> np.ndarray`` (a uaii-storage store, or
:class:`ArrayWeights` in tests): plain dtypes come back as typed views, block-quantized tensors as raw ``uint8``.

The activation arena has one owner. A backend whose executables lay out their arena by their own rule (views,
in-place steps, a device's alignment) declares that rule's identity in :attr:`Capabilities.arena` and computes the
layout in :meth:`Backend.plan_arena`; the planner asks it (an arena policy), so the plan's arena is what the
executable allocates and consumes. A backend that runs the planner's generic offsets declares ``"planner"``.

Optional slots follow ggml's habit: :class:`BackendBase` gives every method a default that either works
(``alloc``/``copy`` on host memory) or raises :class:`BackendUnavailable` naming the reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from uaii.ir import Graph, Node, Tensor, UaiiError
from uaii.ir.plan import PLANNER_ARENA, ArenaLayout, BufferSlot, ExecutionPlan, overlapping_slots


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
    cannot run here. ``software``: the device is a software rasterizer (lavapipe, SwiftShader, WARP) that the
    caller opted into; it runs when named (``device="webgpu"``), ``select_device("auto")`` never picks it.
    ``not_auto``: why ``select_device("auto")`` passes this available backend by although it runs when named
    (empty: auto may pick it)."""

    available: bool
    reason: str = ""
    devices: list[str] = field(default_factory=list)
    software: bool = False
    not_auto: str = ""

    def __str__(self) -> str:
        if self.available:
            return "available: " + ", ".join(self.devices)
        return "unavailable: " + self.reason


STANDARD_COMPILE_OPTIONS = frozenset({"max_tokens", "kv_state", "memory_reuse"})
"""Keyword options every backend's ``compile`` takes (ignoring what does not apply to it): the largest token batch
(default: the plan's), whether cached Attention binds to a KV state, and arena reuse."""
STREAMING_COMPILE_OPTIONS = frozenset({"streamed", "prefetch_order", "expert_cache", "chunk_bytes", "host_resident"})
"""The options of a backend with :attr:`Capabilities.streams_weights`: the weight references it acquires around the
steps that read them instead of binding them, the plan's prefetch order, the MoE expert cache, one staging buffer's
bytes (a larger MatMul weight streams in row chunks), and — for a device backend — those of the streamed references
that host memory may hold as well (no host budget applies): the host-pinned tier between device and disk."""


@dataclass(frozen=True)
class Capabilities:
    """What a backend declares, so that a caller (the runtime Session) asks only for what it has, by these fields,
    never by the backend's name or by probing its methods.

    ``activation_dtypes``, ``weight_dtypes`` (kept packed) and ``ops``: what it runs; ``unsupported`` maps registered
    ops it deliberately does not run to the reason. ``streams_weights``: ``compile`` takes the
    :data:`STREAMING_COMPILE_OPTIONS`. ``kv_dtypes``: the ``new_state(dtype=)`` values it accepts (empty: it keeps
    no KV state); ``kv_positions``: the ``new_state(positions=)`` values; ``kv_window``: ``new_state(window=,
    sinks=)`` keeps a resident window. ``batched_kv``: ``run(feeds, KVBatch(states))`` works — one decode row per
    sequence, row ``i`` of the feeds a new token of ``states[i]``, each row's outputs bit-identical to a run of that
    state alone (False: the caller runs one sequence per pass, as a Session's decode then does; such a backend's
    ``run`` refuses a KVBatch). ``device_memory``: bytes of device memory its executables allocate from (0: host
    RAM, which a Session's budget covers). ``threads``: ``set_threads(n)`` means something.
    ``compile_options``: the keyword options ``compile`` understands beyond the standard and streaming ones (the
    CPU's ``gemm``). ``arena``: who lays out the activation arena of its executables — the identity of its own rule
    and version (``cpu/1``), which :meth:`Backend.plan_arena` computes and a plan made with it carries;
    ``"planner"`` (:data:`~uaii.ir.plan.PLANNER_ARENA`): it consumes the planner's generic offsets; ``""``: it
    declares none, and a Session does not plan for it. ``step_profile``: its executables time their steps on
    request — ``set_profiling(on)`` and ``take_profile() -> list[StepProfile]`` (:mod:`uaii.backends.profile`).
    ``staging_buffers``: how many staging buffers of ``chunk_bytes`` a device backend streams weights through (the
    device budget counts them). ``expert_staging``: a streamed expert bank's chosen experts pass through one more
    buffer of a staging buffer's bytes (the CUDA executable's expert area), which the device budget counts when a
    bank streams."""

    activation_dtypes: frozenset[str] = frozenset()
    weight_dtypes: frozenset[str] = frozenset()
    ops: frozenset[str] = frozenset()
    unsupported: Mapping[str, str] = field(default_factory=dict)
    streams_weights: bool = False
    kv_dtypes: frozenset[str] = frozenset()
    kv_positions: frozenset[str] = frozenset({"absolute"})
    kv_window: bool = False
    batched_kv: bool = False
    device_memory: int = 0
    threads: bool = False
    compile_options: frozenset[str] = frozenset()
    arena: str = ""
    step_profile: bool = False
    staging_buffers: int = 1
    expert_staging: bool = False


@dataclass(frozen=True)
class ExecutableMemory:
    """What a compiled executable allocates, as it reports it (not what a plan estimated): ``arena_bytes`` of
    activations, ``weight_bytes`` of weights it keeps resident (bound at compile time: mapped or pinned, expert
    slices it acquired, and its own converted copies), ``staging_bytes`` it streams weights through (staging
    buffers, row buffers, the expert cache), ``kv_bytes_per_token`` one token adds to an f32 KV state (f16: half;
    a state's ``nbytes`` is what it holds). ``device``: ``"host"`` (RAM, a Session's budget) or ``"device"``
    (the backend's :attr:`Capabilities.device_memory`)."""

    arena_bytes: int = 0
    weight_bytes: int = 0
    staging_bytes: int = 0
    kv_bytes_per_token: int = 0
    device: str = "host"

    @property
    def total(self) -> int:
        """Arena, resident weights and staging (a KV state counts on its own: its ``nbytes``)."""
        return self.arena_bytes + self.weight_bytes + self.staging_bytes


@runtime_checkable
class WeightSource(Protocol):
    """Resolves weight references (``str(WeightRef)``, or the tensor name for caller-supplied weights).

    A source with a ``pinned`` set (uaii.storage's stores) also lets a backend keep pinned tensors in a held form
    of its kernels: ``pinned.reform(ref, form, rewrite)``, then ``acquire(ref, form=form)``."""

    def acquire(self, ref: str) -> np.ndarray: ...

    def release(self, ref: str) -> None: ...


class ArrayWeights:
    """A :class:`WeightSource` over in-memory arrays (tests, conformance, caller-supplied weights)."""

    def __init__(self, arrays: Mapping[str, np.ndarray] | None = None) -> None:
        self.arrays: dict[str, np.ndarray] = dict(arrays or {})

    def acquire(self, ref: str) -> np.ndarray:
        key = str(ref)
        try:
            return self.arrays[key]
        except KeyError:
            raise BackendError(f"[backend] no weight {str(ref)!r} among {len(self.arrays)} supplied "
                               "arrays") from None

    def release(self, ref: str) -> None:
        """Arrays stay valid while the object lives."""


def weight_key(t: Tensor) -> str:
    """The key a :class:`WeightSource` is asked for: the reference string, else the tensor name."""
    return str(t.weight) if t.weight is not None else t.name


def per_expert(t: Tensor) -> bool:
    """Whether ``t`` is an expert bank stored as one tensor per expert (an ``experts.*`` reference, as HF checkpoints
    have): a store serves it expert by expert (``#e=N``), never whole."""
    return t.weight is not None and len(t.shape) == 3 and "*" in str(t.weight)


def gather_experts(source: WeightSource, t: Tensor, start: int, stop: int, *, release: bool) -> np.ndarray:
    """Experts ``[start, stop)`` of a bank stored per expert, their stored bytes in one host buffer; with
    ``release`` each is released once copied (else the caller releases them: they stay acquired)."""
    assert t.weight is not None
    parts = []
    for e in range(start, stop):
        ref = str(t.weight.with_expert(e))
        try:
            parts.append(np.ascontiguousarray(source.acquire(ref)).reshape(-1).view(np.uint8).copy()
                         if release else np.ascontiguousarray(source.acquire(ref)).reshape(-1).view(np.uint8))
        finally:
            if release:
                source.release(ref)
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def plan_graph(graph: Graph, plan: ExecutionPlan) -> Graph:
    """The graph a plan's steps describe: one node per step, in step order (fused nodes included), over the
    tensors of ``graph`` (fusion only removes values, so every value a step names is declared there). Each node is
    the step's ``op`` and ``version``; the display string ``kernel`` is never parsed."""
    from uaii.ir import attr

    names = {n.name for n in graph.nodes}
    if [s.node for s in plan.steps] == [n.name for n in graph.nodes]:
        return graph
    nodes = [Node(s.node, s.op, tuple(s.inputs), tuple(s.outputs), tuple((k, attr(v)) for k, v in s.attributes),
                  s.version) for s in plan.steps]
    used = {v for n in nodes for v in (*n.inputs, *n.outputs) if v} | set(graph.inputs) | set(graph.outputs)
    tensors = tuple(t for t in graph.tensors if t.name in used)
    unknown = [v for v in used if v not in graph.tensor_map]
    if unknown or not names:
        raise BackendError(f"[backend] plan {plan.key[:12]} names values the graph does not declare: {unknown[:3]}")
    from dataclasses import replace

    return replace(graph, nodes=tuple(nodes), tensors=tensors)


def check_plan_arena(backend: str, rule: str, arena: ArenaLayout, max_tokens: int) -> None:
    """Raise unless a plan's ``arena`` is one ``backend`` can follow before it binds: laid out by its ``rule``, for
    at least ``max_tokens`` tokens. That it holds every buffer is checked when the executable binds
    (:func:`arena_problems`)."""
    problem = (f"it is laid out by the {arena.rule!r} rule, not this backend's {rule!r} (plan with "
               "arena=<the backend's policy>, as a Session does)" if arena.rule != rule
               else f"it is laid out for {arena.max_tokens} tokens, compile asks for {max_tokens}"
               if max_tokens > arena.max_tokens else "")
    if problem:
        raise BackendError(f"[backend] {backend} cannot run the plan's arena: {problem}")


def arena_problems(arena: ArenaLayout, wanted: Iterable[BufferSlot], *, rule: str, align: int,
                   usable: int | None = None) -> Iterator[str]:
    """Why a plan's ``arena`` cannot hold the buffers an executable binds, at the plan's offsets, first problem
    first (nothing: it can). ``wanted``: one slot per buffer owner as the backend's rule lays it out (bytes and
    lifetime; its offset is ignored); ``align``: the offset alignment the backend binds at; ``usable``: the bytes
    of the arena slots may occupy (default its size; less where the backend pads it to align its start).

    The one check both backends run (each keeps only its rule and sizes): its rule, every buffer in a slot of
    enough bytes, live at the same steps, aligned and inside, no slot for what it does not bind, and no two slots
    live at the same step sharing bytes (:func:`uaii.ir.plan.overlapping_slots`)."""
    if arena.rule != rule:
        yield f"it is laid out by the {arena.rule!r} rule, not {rule!r}"
        return
    if arena.alignment % align:
        yield f"its offsets are {arena.alignment}-aligned, the backend binds buffers at multiples of {align}"
        return
    limit = arena.size if usable is None else usable
    slots = {s.value: s for s in arena.slots}
    want = {w.value: w for w in wanted}
    for owner, w in want.items():
        s = slots.get(owner)
        if s is None:
            yield f"no slot holds buffer {owner!r}"
        elif s.nbytes < w.nbytes:
            yield f"slot {owner!r} has {s.nbytes} bytes, the buffer needs {w.nbytes}"
        elif (s.first_step, s.last_step) != (w.first_step, w.last_step):
            yield (f"slot {owner!r} is live at steps {s.first_step}..{s.last_step}, the buffer at "
                   f"{w.first_step}..{w.last_step}")
        elif s.offset % align or s.offset + s.nbytes > limit:
            yield f"slot {owner!r} at [{s.offset}, {s.offset + s.nbytes}) is not {align}-aligned inside the arena"
    extra = [v for v in slots if v not in want]
    if extra:
        yield f"it has a slot for {extra[0]!r}, which is no buffer of this executable"
    pair = next(iter(overlapping_slots(arena)), None)
    if pair is not None:
        yield f"slots {pair[0].value!r} and {pair[1].value!r} are live at the same step and share bytes"


@runtime_checkable
class KVStateLike(Protocol):
    """The per-sequence state an executable carries between runs (the KV cache)."""

    @property
    def length(self) -> int: ...

    @property
    def nbytes(self) -> int:
        """Bytes the state holds at capacity (keys and values of every slot)."""
        ...

    def reset(self) -> None: ...

    def truncate(self, n: int) -> None: ...

    def reserve(self, n: int) -> int:
        """Make room for the next ``n`` tokens and return the rotary position of the first (a cache slot with
        ``positions="cache"``, else ``length``): called only on backends whose ``kv_positions`` has "cache"."""
        ...


@runtime_checkable
class Executable(Protocol):
    """A compiled graph. ``run`` takes the feeds (graph inputs that the state does not provide) and returns the
    outputs (graph outputs that the state does not keep) by name; returned arrays are views of the executable's
    buffers, valid until the next ``run``. ``state``: one sequence's (from ``new_state``), or where
    :attr:`Capabilities.batched_kv` a :class:`~uaii.backends.kv_book.KVBatch` of several, one feed row each."""

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    def run(self, feeds: Mapping[str, np.ndarray], state: Any = None) -> dict[str, np.ndarray]: ...

    def new_state(self, capacity: int, *, window: int = 0, sinks: int = 4, dtype: str = "f32",
                  positions: str = "absolute") -> KVStateLike:
        """A KV state of ``capacity`` tokens; callers pass only what the backend's :class:`Capabilities` declare
        (``dtype`` in ``kv_dtypes``, ``positions`` in ``kv_positions``, ``window``/``sinks`` with ``kv_window``)."""
        ...

    def memory(self) -> ExecutableMemory:
        """What this executable allocates (see :class:`ExecutableMemory`)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Backend(Protocol):
    name: str
    kind: str
    """``"cpu"`` or ``"gpu"``: ``select_device("auto")`` prefers the first available gpu backend."""

    def probe(self) -> DeviceStatus: ...

    def devices(self) -> list[dict[str, Any]] | None:
        """Every device (adapter) the backend sees, for ``uaii devices`` (see :meth:`BackendBase.devices`)."""
        ...

    @property
    def capabilities(self) -> Capabilities: ...

    def supports_op(self, node: Node) -> bool: ...

    def set_threads(self, n: int | None) -> None: ...

    def alloc(self, nbytes: int) -> Any: ...

    def copy(self, src: Any, dst: Any) -> None: ...

    def compile(self, graph: Graph, plan: ExecutionPlan | None, weights: WeightSource,
                **options: Any) -> Executable: ...

    def plan_arena(self, graph: Graph, max_tokens: int, *, memory_reuse: bool = True) -> ArenaLayout:
        """The arena an executable of ``graph`` (a plan's fused graph in step order, :func:`plan_graph`) allocates
        at ``max_tokens`` tokens, laid out by the rule :attr:`Capabilities.arena` names (the layout's ``rule``)."""
        ...


class BackendBase:
    """Defaults for the optional slots: host memory for ``alloc``/``copy``; ``compile`` unavailable."""

    name = "base"
    kind = "cpu"  # "cpu" or "gpu": select_device("auto") prefers the first available gpu backend

    def probe(self) -> DeviceStatus:
        return DeviceStatus(False, "not implemented")

    def devices(self) -> list[dict[str, Any]] | None:
        """Every device (adapter) this backend can see, software ones included and marked, as ``uaii devices``
        lists them: one dict each with ``index``, ``name``, ``vendor``, ``driver``, ``backend``, ``type``,
        ``software``, ``usable``, ``memory_bytes``, ``limits`` (name → value) and ``features``. None (the
        default): the backend lists no devices beyond its probe. A backend that cannot enumerate raises a
        :class:`BackendUnavailable` whose reason the listing shows. Why here: the CLI names no backend's modules."""
        return None

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

    def set_threads(self, n: int | None) -> None:
        """Threads of the backend's compute pool (None: its default). Only a backend that declares
        ``capabilities.threads`` has one (and overrides this)."""
        why = ("it declares threads but does not implement set_threads" if self.capabilities.threads
               else "it declares no thread pool (capabilities.threads is False)")
        raise BackendError(f"[backend] {self.name} cannot set {n} threads: {why}")

    def device_compile_args(self, options: Mapping[str, Any], expert_cache: Any, why_no_cache: str = "") -> None:
        """What a device backend's ``compile`` refuses: options it does not take, and the host expert cache (a
        host-memory structure; ``why_no_cache`` says what the device does instead)."""
        if options:
            raise BackendError(f"[backend] {self.name}: compile does not take the options "
                               f"{', '.join(sorted(options))}")
        if expert_cache is not None:
            raise BackendError(f"[backend] {self.name}: an expert cache is a host-memory structure"
                               f"{'; ' + why_no_cache if why_no_cache else ''} (compile without expert_cache)")

    def graph_to_run(self, graph: Graph, plan: ExecutionPlan | None, max_tokens: int) -> Graph:
        """What ``compile`` runs: with a plan, its steps (``plan_graph``) once its arena is one this backend can
        follow (:func:`check_plan_arena` against ``capabilities.arena``); then every node must be supported."""
        if plan is not None:
            check_plan_arena(self.name, self.capabilities.arena, plan.arena, max_tokens)
            graph = plan_graph(graph, plan)
        problems = [(n.name, n.op, self.unsupported_reason(n) or "") for n in graph.nodes if not self.supports_op(n)]
        if problems:
            raise UnsupportedOpError(self.name, problems)
        return graph

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

    def plan_arena(self, graph: Graph, max_tokens: int, *, memory_reuse: bool = True) -> ArenaLayout:
        """No rule of its own: the planner's generic layout is never used in its place unless the backend declares
        ``Capabilities.arena == "planner"`` (then the planner lays it out, and this is not asked)."""
        rule = self.capabilities.arena
        why = ("it consumes the planner's layout (capabilities.arena is 'planner')" if rule == PLANNER_ARENA
               else f"it declares the rule {rule!r} but does not implement plan_arena" if rule
               else "it declares no arena rule (capabilities.arena is empty)")
        raise BackendError(f"[backend] {self.name} lays out no arena for graph {graph.name!r}: {why}")

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


__all__ = [
    "STANDARD_COMPILE_OPTIONS",
    "STREAMING_COMPILE_OPTIONS",
    "ArrayWeights",
    "Backend",
    "BackendBase",
    "BackendError",
    "BackendUnavailable",
    "Capabilities",
    "DeviceStatus",
    "Executable",
    "ExecutableMemory",
    "KVStateLike",
    "UnsupportedOpError",
    "WeightSource",
    "arena_problems",
    "check_plan_arena",
    "plan_graph",
    "weight_key",
]

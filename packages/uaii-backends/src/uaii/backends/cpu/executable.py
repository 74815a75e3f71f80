"""The CPU executable: weights prepared once, and per input-shape key a *binding* — the list of pre-bound steps over
views of one arena — so that ``run`` is a copy of the feeds, a tight loop over the steps and nothing else.

Bindings are cached by the shapes of the feeds (a decode step always hits the same one; a prefill chunk of
``max_batch`` tokens another). Every binding carves its views from the same arena at the offsets planned for the
largest shapes, so a smaller binding never needs more memory. Compiled with a plan, those offsets are the plan's
arena (laid out by this backend's rule, memory.py, when the planner asked ``CpuBackend.plan_arena``): the executable
checks that it covers its buffers and allocates exactly its size; only a binding larger than the plan's max_tokens
lays the arena out again, by the same rule. Attention nodes whose caches are graph inputs and
outputs are bound to a :class:`~uaii.backends.cpu.kv.KVState` instead (see kv.py).

A binding is keyed by the feed shapes and the kind of state (one sequence, or a :class:`~uaii.backends.kv_book.
KVBatch` of one decode row per sequence), never by which state: its cached-attention steps find the run's state(s)
through a :class:`~uaii.backends.cpu.bind.KVSlot` that ``run`` fills, so a server that alternates sequences does not
rebind. Batched, the GEMMs run over all rows at once and each row attends to its own cache with the call a run of
that row alone makes; as the GEMM kernels promise a row's bits do not depend on the batch, every row's outputs are
bit-identical to its own run's.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from uaii.backends.analysis import KvLayout, feed_types, kv_layout, shape_values
from uaii.backends.base import BackendError, ExecutableMemory, WeightSource, weight_key
from uaii.backends.config import GEMM_MODES as CONFIG_GEMM_MODES
from uaii.backends.cpu.bind import Bind, CacheRows, KVSlot, Step, WeightData, status_fail, to_f32
from uaii.backends.cpu.kv import KVState
from uaii.backends.cpu.memory import (
    ALIGN,
    Layout,
    NodeInfo,
    VType,
    from_arena,
    infer_types,
    nbytes_of,
    plan_layout,
)
from uaii.backends.cpu.ops_extra import EXTRA, expert_banks
from uaii.backends.cpu.ops_fast import FAST
from uaii.backends.cpu.ops_logic import SELECT
from uaii.backends.cpu.ops_math import MATH
from uaii.backends.cpu.ops_mlxq import MLXQ
from uaii.backends.cpu.ops_nbits import NBITS
from uaii.backends.cpu.ops_numpy import NUMPY, slice_index
from uaii.backends.cpu.ops_shape import SHAPE
from uaii.backends.cpu.streaming import StreamingWeights
from uaii.backends.kv_book import KeyRope, KVBatch, key_ropes
from uaii.backends.profile import NodeTiming, StepProfile
from uaii.ir import Graph, Tensor
from uaii.ir.kvcache import kv_bytes_per_token
from uaii.ir.ops import UNARY
from uaii.ir.plan import ArenaLayout
from uaii.kernels import PackedWeight, held_form, write_held

GENERIC: dict[str, Callable[[Bind, NodeInfo], list[Step]]] = {**NUMPY, **EXTRA, **MATH, **SELECT, **SHAPE, **NBITS,
                                                                   **MLXQ}
MAX_BINDINGS = 16
"""Bindings kept, least recently used dropped first: a server's decode batches of 1..max_sequences rows stay bound
while prefills of many prompt lengths come and go (binding SmolLM2 costs ~30 ms, several decode steps)."""
GEMM_MODES = {name: mode for mode, name in enumerate(CONFIG_GEMM_MODES)}   # in uk_gemm's mode order: 0, 1
"""``fast``: the kernels' fastest path per weight type (int8 dot products on 8-bit quantized activations for block
types, as llama.cpp), and 16-bit activations for the output projection where the type has them (see
:meth:`CpuExecutable.gemm_mode_for`); ``f32``: weights dequantized row by row and float32 dot products (exact,
slower), everywhere."""
PRECISE = 2
"""uk_gemm's mode 2 ("precise"): 16-bit activations for the weight types that have such a kernel (Q8_0), else mode 0."""
GEMM_OPS = frozenset({"MatMul", "MatMulRelu", "GroupedMatMul"})
PACKED_PRODUCTS = frozenset({"MatMulNBits", "QuantizedMatMul"})
"""Products whose weight is several packed tensors (values, scales, zeros): a profile names them by mode and bits."""


@dataclass
class Binding:
    steps: list[Step]
    names: list[str]  # node of each step, for error messages
    feeds: list[tuple[str, np.ndarray]]
    outputs: dict[str, np.ndarray]
    slot: KVSlot | None  # where the steps find the run's KV state(s); None: bound without one
    n_new: int  # tokens this run adds to the KV state (batched: one per row)
    rows: int = 1  # rows the feeds carry (a profile's kind of run)
    step_ns: list[int] | None = None  # while profiling: nanoseconds per step, summed over the runs since a take
    runs: int = 0
    run_ns: int = 0


class CpuExecutable:
    """A graph compiled for the CPU backend. See the module docstring."""

    def __init__(self, graph: Graph, infos: list[NodeInfo], weights: WeightSource, *, max_tokens: int = 512,
                 kv_state: bool = True, memory_reuse: bool = True, gemm: str = "fast",
                 streamed: Collection[str] = (), prefetch_order: Sequence[str] = (),
                 expert_cache: Any = None, chunk_bytes: int = 0, arena: ArenaLayout | None = None) -> None:
        """``arena``: a plan's arena, which the first layout (compile's :meth:`prepare`) follows."""
        if gemm not in GEMM_MODES:
            raise BackendError(f"[backend] gemm must be one of {', '.join(GEMM_MODES)}, found {gemm!r}")
        self.gemm_mode = GEMM_MODES[gemm]
        self.graph = graph
        self._kv_per_token: int | None = None
        self._weight_bytes: tuple[tuple[int, int, int], int] | None = None  # memory(): (sizes it was counted at, bytes)
        self.output_projections = output_projections(graph) if gemm == "fast" else frozenset()
        self.infos = infos
        self.max_tokens = max(int(max_tokens), 1)
        self.memory_reuse = memory_reuse
        self._source = weights
        self.weight_names = {t.name for t in graph.tensors if t.is_weight or t.is_constant}
        self._weights: dict[str, WeightData] = {}
        self._cache: dict[Any, Any] = {}
        self._extra_refs: list[str] = []
        self._acquired: list[np.ndarray] = []  # what acquire() returned (memory() counts it)
        # the cached Attention layers bound to a KV state (analysis.py: the layout the webgpu backend binds by)
        self.kv = kv_layout(graph) if kv_state else KvLayout()
        self.kv_layer, self.kv_dims, self.stateful = self.kv.layer, self.kv.dims, self.kv.values
        self.input_names = tuple(n for n in graph.inputs if n not in self.stateful)
        # values that shapes depend on (Shape -> Gather -> Range ...: computed per binding); the feeds among them
        # decide a binding by their values too, so they join its key (analysis.ShapeValues)
        self.shape_deps = shape_values(graph, infos)
        self.shape_feeds = tuple(n for n in self.shape_deps.feeds if n in self.input_names)
        self.output_names = tuple(n for n in graph.outputs if n not in self.stateful)
        self._layout: Layout | None = None
        self._planned = arena
        self._arena = np.empty(0, np.uint8)
        self._bindings: dict[Any, Binding] = {}  # by (feed shapes, batched): never by which state runs
        self._state_rows: weakref.WeakKeyDictionary[KVState, CacheRows] = weakref.WeakKeyDictionary()
        self.closed = False
        self._banks = {n for i in infos for n in expert_banks(i, self.weight_names)}  # read by expert: see _Bank
        self._profiled: dict[int, Binding] | None = None  # while profiling: the bindings run since the last take
        self.streaming = StreamingWeights(self, weights, streamed, prefetch_order, expert_cache,
                                          chunk_bytes) if streamed else None
        self._gemm_only = gemm_only_weights(graph, infos)
        eager = self.weight_names - self._banks - (self.streaming.names if self.streaming else set())
        for name in sorted(eager):  # banks may be separate per-expert tensors: see _Bank
            self.weight(name)

    # --- compile-time analysis -----------------------------------------------------------------------------
    def gemm_mode_for(self, value: str) -> int:
        """The uk_gemm mode of the GEMM step that writes ``value``: mode 2 for the output projections in the
        ``fast`` mode, else the compile option's mode.

        Why: with Q8_0 weights the 8-bit activations are the larger error of the product, and the output projection's
        error reaches the next-token distribution directly (SmolLM2's KL from the exact model fell by a third with
        that one layer exact). 16-bit activations there cost little: in generation the Session computes the logits
        of one row per step, while on every other layer they would make a Q8_0 model's prefill ~2.5x slower. Mode 2
        keeps the kernels' guarantee (a row's bits do not depend on the batch or the threads), so prefill and
        decode still agree. The mapped and the streamed paths both ask here, so they choose the same."""
        return PRECISE if value in self.output_projections else self.gemm_mode

    @property
    def has_kv(self) -> bool:
        return bool(self.kv_dims)

    def new_state(self, capacity: int, *, window: int = 0, sinks: int = 4, dtype: str = "f32",
                  positions: str = "absolute") -> KVState:
        """A fresh KV cache for this graph: ``capacity`` tokens (``window + sinks`` slots when windowed).
        ``positions="cache"``: rotary positions are cache slots (StreamingLLM; see kv.py), which needs every cached
        key to come out of a RoPE node fed by a graph input that only RoPE nodes read."""
        slots = window + sinks if window else capacity
        rotations = self.key_rotations() if positions == "cache" else ()
        return KVState(self.kv_dims, slots, dtype=dtype, window=window, sinks=sinks, max_tokens=max(slots, 1),
                       positions=positions, rotations=rotations)

    def key_rotations(self) -> list[KeyRope]:
        """Per cached layer, the RoPE its keys were rotated with (:func:`uaii.backends.kv_book.key_ropes`, the
        analysis every backend shares; it raises where cache positions would not mean what they should)."""
        return key_ropes(self.graph, self.infos, self.kv_layer, [dk for _, dk, _ in self.kv_dims], self.f32_weight,
                         self.weight_names)

    # --- weights -------------------------------------------------------------------------------------------
    def weight(self, name: str) -> WeightData:
        w = self._weights.get(name)
        if w is None and self.streaming is not None and name in self.streaming.names:
            return self.streaming.live_weight(name)
        if w is None:
            t = self.graph.tensor(name)
            form = self._held_form(t)
            raw = _tensor_bytes(t, self._source, form)
            w = self._weights[name] = WeightData(name, t.dtype, tuple(int(d) for d in t.shape), raw, form=form)
        return w

    def _held_form(self, t: Tensor) -> str | None:
        """The held form (uaii.kernels.held) a pinned weight is kept in, rewritten in place by the store the first
        time a CPU executable binds it (the session's executables then share it): only where every node reading it
        is a GEMM over its transposed rows, which reads it through PackedWeight (a numpy fallback converts it back:
        WeightData.as_f32). None keeps the file's layout: a streamed or mapped weight, another consumer, a type or
        row length without a held form on this machine, or a tensor already handed out as it is."""
        if t.name not in self._gemm_only or t.weight is None or len(t.shape) != 2:
            return None
        form = held_form(t.dtype, int(t.shape[1]))
        reform = getattr(getattr(self._source, "pinned", None), "reform", None)
        if form is None or reform is None:
            return None
        shape = (int(t.shape[0]), int(t.shape[1]))
        ok = reform(weight_key(t), form, lambda buf: write_held(buf, buf, t.dtype, shape, form))
        return form if ok else None

    def acquire(self, ref: str) -> np.ndarray:
        """Raw bytes of any reference of the weight source (an expert slice ``#e=N``), released on close."""
        arr = np.asarray(self._source.acquire(ref))
        self._extra_refs.append(ref)
        raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        self._acquired.append(raw)
        return raw

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        if self.streaming is not None and len(key) > 1 and key[1] in self.streaming.names:
            return make()  # a streamed weight's data lives in a staging extent: never cache it by name
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def packed(self, name: str, transpose_b: bool = True) -> PackedWeight:
        def make() -> PackedWeight:
            w = self.weight(name)
            if transpose_b:
                return PackedWeight.from_raw(w.raw, w.dtype, (w.shape[0], w.shape[1]), form=w.form)
            return PackedWeight.from_array(np.ascontiguousarray(to_f32(w.raw, w.dtype).reshape(w.shape).T))
        return self.cached(("packed", name, transpose_b), make)

    def f32_weight(self, name: str) -> np.ndarray:
        return self.cached(("f32", name), lambda: np.ascontiguousarray(self.weight(name).as_f32(), np.float32))

    # --- binding -------------------------------------------------------------------------------------------
    def feed_types(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, VType]:
        return feed_types(self.graph, self.input_names, shapes, self.kv)

    def prepare(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Plan the arena for the largest feed shapes a run will see (e.g. ``max_tokens`` tokens). A graph whose
        shapes depend on the values of its feeds (:attr:`shape_feeds`) is laid out by its first run instead."""
        if self.shape_feeds:
            return
        types = infer_types(self.graph, self.infos, self.feed_types(shapes), deps=self.shape_deps)
        self._relayout(types)

    def _relayout(self, types: dict[str, VType]) -> None:
        """The first layout follows the plan's arena when there is one; a later one (a binding beyond it) and any
        without a plan are laid out here, by the same rule (memory.py)."""
        if self._planned is not None and self._layout is None:
            self._layout = from_arena(self.graph, self.infos, types, self.input_names, self.stateful,
                                      self.memory_reuse, self._planned)
        else:
            self._layout = plan_layout(self.graph, self.infos, types, self.input_names, self.stateful,
                                       self.memory_reuse)
        self._arena = np.zeros(self._layout.size + ALIGN, np.uint8)  # zeroed lazily by the OS
        self._bindings.clear()

    @property
    def arena_bytes(self) -> int:
        return int(self._arena.nbytes)

    def memory(self) -> ExecutableMemory:
        """What this executable holds (Executable.memory): the arena as allocated, the distinct bytes of weight
        data it references (bound weights, acquired expert slices, cached conversions; views of one buffer count
        once), and what streaming reads through (StreamingWeights.staging_bytes)."""
        grown = (len(self._weights), len(self._acquired), len(self._cache))  # they only grow, until close()
        if self._weight_bytes is None or self._weight_bytes[0] != grown:  # the engine asks per admission
            arrays = [w.raw for w in self._weights.values()]
            arrays += self._acquired
            for v in self._cache.values():
                arrays += _arrays_of(v)
            self._weight_bytes = (grown, distinct_bytes(arrays))
        if self._kv_per_token is None:  # the graph's type analysis (~0.5 ms): once; the engine asks per admission
            self._kv_per_token = kv_bytes_per_token(self.graph)  # f32: what the runtime's budget counts by too
        per_token = self._kv_per_token
        staging = self.streaming.staging_bytes() if self.streaming is not None else 0
        return ExecutableMemory(arena_bytes=self.arena_bytes, weight_bytes=self._weight_bytes[1],
                                staging_bytes=staging, kv_bytes_per_token=per_token, device="host")

    def _bind(self, shapes: dict[str, tuple[int, ...]], slot: KVSlot | None,
              values: Mapping[str, np.ndarray] | None = None) -> Binding:
        types = infer_types(self.graph, self.infos, self.feed_types(shapes), values, self.shape_deps)
        if self._layout is None or not self._layout.fits(types):
            self._relayout(types)
        assert self._layout is not None
        arrays = self._arrays(types, self._layout)
        b = Bind(self, arrays, types, slot)
        steps: list[Step] = []
        names: list[str] = []
        n_new = 0
        wrap = -1  # after the last step that acquires streamed weights
        for info in self.infos:
            node = info.node
            if node.outputs and node.outputs[0] in self._layout.views:
                continue
            if node.name in self.kv_layer:
                n_new = types[node.inputs[0]].shape[0]
            got = self.streaming.lower(b, info) if self.streaming is not None else None
            if got is not None and self.streaming is not None and self.streaming.acquired_refs(info):
                wrap = len(steps) + len(got)
            if got is None:
                got = lower_node(b, info)
            steps += got
            names += [node.name] * len(got)
        if self.streaming is not None and wrap >= 0:
            # wrap around as soon as the last streamed weight is released: the next run's first weights are read
            # while the rest of this run (the final norm, a pinned lm_head) computes and the caller samples
            steps.insert(wrap, self.streaming.start)
            names.insert(wrap, "(prefetch of the next run)")
        steps = b.prologue + steps
        names = ["(feeds)"] * len(b.prologue) + names
        feeds = [(n, arrays[n]) for n in self.input_names]
        outputs = {n: arrays[n] for n in self.output_names}
        rows = next((int(s[0]) for s in shapes.values() if len(s)), 1)
        binding = Binding(steps, names, feeds, outputs, slot, n_new, rows)
        binding.keep = b.keep  # type: ignore[attr-defined]  # scratch buffers live as long as the binding
        return binding

    def _arrays(self, types: dict[str, VType], layout: Layout) -> dict[str, np.ndarray]:
        arrays: dict[str, np.ndarray] = {}
        streamed = self.streaming.names if self.streaming is not None else set()
        for name in self.weight_names - self._banks - streamed:  # streamed weights: see StreamingWeights.lower_with
            w = self.weight(name)
            arrays[name] = w.raw if w.dtype.is_quantized else w.raw.reshape(w.shape)
        for v, owner in layout.root.items():
            if v in layout.views or owner not in layout.offset:
                continue
            arrays[v] = _carve(self._arena, layout.offset[owner], types[v])
        for s in self.stateful:
            t = types.get(s)
            if t is not None and s in self.graph.inputs:
                arrays[s] = np.empty(t.shape, t.dtype.numpy)
        for info in self.infos:  # views, in node order so that chains resolve
            out = info.node.outputs[0] if info.node.outputs else ""
            if out in layout.views:
                arrays[out] = _view(info, arrays[layout.views[out]], types[layout.views[out]], types[out])
        return arrays

    # --- running -------------------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, np.ndarray], state: KVState | KVBatch | None = None) -> dict[str, np.ndarray]:
        """Run once. Outputs are views of the executable's buffers, valid until the next run. ``state``: one
        sequence's KV state (every row of the feeds is one of its new tokens), or a :class:`KVBatch` (row ``i`` is
        one new token of ``rows[i]``: GEMMs run over all rows, each row attends to its own cache)."""
        try:
            shapes = tuple(np.shape(feeds[n]) for n in self.input_names)
        except KeyError as exc:
            raise BackendError(f"[backend] missing input {exc.args[0]!r}; the graph takes "
                               f"{', '.join(self.input_names)}") from None
        if self.kv_dims and state is None:
            raise BackendError("[backend] this graph keeps a KV cache: pass a state from new_state()")
        t_start = time.perf_counter_ns() if self._profiled is not None else 0
        batched = isinstance(state, KVBatch)
        values = {n: np.asarray(feeds[n]).astype(self.graph.tensor(n).dtype.numpy, copy=False)
                  for n in self.shape_feeds}
        binding = self._binding(shapes, state is not None, batched, values)
        for name, dst in binding.feeds:
            np.copyto(dst, feeds[name], casting="unsafe")
        n = binding.n_new
        slot = binding.slot if self.kv_dims else None
        adds = n or batched  # an empty batch is refused by its prepare
        if state is not None and slot is not None:
            rows = [self._own_state(row) for row in (state.rows if isinstance(state, KVBatch) else [state])]
            if adds:
                state.prepare(n)
            slot.states = rows
            slot.rows = [self._cache_rows(row) for row in rows]  # after prepare: it may grow q_pos
        try:
            if self.streaming is not None:
                self.streaming.start()
            if self._profiled is None:
                for f in binding.steps:
                    if f():
                        self._fail(binding, f)
            else:
                self._run_timed(binding)
        finally:
            if slot is not None:  # hold no state past its run: a released sequence's cache is freed at once
                slot.states, slot.rows = [], []
        if state is not None and slot is not None and adds:
            state.advance(n)
        if self._profiled is not None and binding.step_ns is not None:
            binding.runs += 1
            binding.run_ns += time.perf_counter_ns() - t_start
        return dict(binding.outputs)

    # --- profiling (Capabilities.step_profile; see uaii.backends.profile) -----------------------------------------
    def _run_timed(self, binding: Binding) -> None:
        """The step loop with each step timed (the profiling twin of run's loop)."""
        assert self._profiled is not None
        if binding.step_ns is None:
            binding.step_ns = [0] * len(binding.steps)
            binding.runs = binding.run_ns = 0
        self._profiled[id(binding)] = binding
        ns = binding.step_ns
        clock = time.perf_counter_ns
        for i, f in enumerate(binding.steps):
            t = clock()
            rc = f()
            ns[i] += clock() - t
            if rc:
                self._fail(binding, f)

    def set_profiling(self, on: bool) -> None:
        """Start (or stop) timing every step of every run; turning it on discards anything not yet taken."""
        for b in (self._profiled or {}).values():
            b.step_ns = None
        self._profiled = {} if on else None

    def take_profile(self) -> list[StepProfile]:
        """What the runs since the last take (or since profiling began) spent, one profile per number of rows
        fed; the counts start again from zero."""
        if self._profiled is None:
            return []
        nodes = {n.name: n for n in self.graph.nodes}
        by_rows: dict[int, StepProfile] = {}
        for b in self._profiled.values():
            if b.step_ns is None or not b.runs:
                continue
            prof = by_rows.setdefault(b.rows, StepProfile(b.rows))
            prof.runs += b.runs
            prof.run_seconds += b.run_ns / 1e9
            index = {t.node: t for t in prof.nodes}
            per_run = Counter(b.names)
            for name, ns in zip(b.names, b.step_ns, strict=True):
                t = index.get(name)
                if t is None:
                    node = nodes.get(name)
                    family, wbytes = self._family(node) if node is not None else (name, 0)
                    t = index[name] = NodeTiming(name, node.op if node is not None else name, family,
                                                 weight_bytes=wbytes)
                    prof.nodes.append(t)
                t.seconds += ns / 1e9
                t.calls += b.runs
                t.steps = max(t.steps, per_run[name])
            b.step_ns, b.runs, b.run_ns = [0] * len(b.steps), 0, 0
        self._profiled = {}
        return sorted(by_rows.values(), key=lambda p: p.rows)

    def _family(self, node: Any) -> tuple[str, int]:
        """A node's op family for a profile, and the weight bytes one run of it reads where that is its whole
        weights (the dense products: their GB/s is the figure that matters in decode)."""
        if node.op not in GEMM_OPS and node.op not in PACKED_PRODUCTS:
            return node.op, 0
        weights = [self.graph.tensor(n) for n in node.inputs if n in self.weight_names]
        if not weights:
            return "gemm (activations)", 0
        nbytes = sum(t.dtype.nbytes(int(np.prod([int(d) for d in t.shape]))) for t in weights)
        if node.op in PACKED_PRODUCTS:
            kind = f"{node.attrs.get('mode', 'nbits')} {node.attrs.get('bits', '')}-bit".replace(" -bit", "")
            return f"gemm {kind}", nbytes
        dtypes = sorted({t.dtype.value for t in weights if t.dtype.value != "f32" or len(t.shape) > 1})
        return f"gemm {'+'.join(dtypes)}", nbytes

    def _binding(self, shapes: tuple[tuple[int, ...], ...], stateful: bool, batched: bool,
                 values: Mapping[str, np.ndarray] | None = None) -> Binding:
        """The binding of these feed shapes and state kind (a single state or a KVBatch), bound on first use;
        ``values``: those of the :attr:`shape_feeds`, which join the key."""
        key: Any = (shapes, batched)
        if self.shape_feeds:
            vals = values or {}
            key = (*key, tuple((str(vals[n].dtype), vals[n].tobytes()) if n in vals else None
                               for n in self.shape_feeds))
        binding = self._bindings.pop(key, None)
        if binding is None:
            if self.closed:
                raise BackendError("[backend] the executable is closed")
            if len(self._bindings) >= MAX_BINDINGS:
                self._bindings.pop(next(iter(self._bindings)))  # the least recently used
            slot = KVSlot(batched) if stateful else None
            binding = self._bind(dict(zip(self.input_names, shapes, strict=True)), slot, values)
        self._bindings[key] = binding  # most recently used last
        return binding

    def _own_state(self, state: Any) -> KVState:
        """``state``, checked before a run touches any state: a KVState whose layers have this graph's dims (one
        made by another executable is refused unless they match: the steps would read and write past its arrays)."""
        if not isinstance(state, KVState):
            raise BackendError(f"[backend] the cpu executable runs with a KVState from its new_state() (or a "
                               f"KVBatch of them), found {type(state).__name__}")
        self._cache_rows(state)
        return state

    def _cache_rows(self, state: KVState) -> CacheRows:
        """The pointers into ``state`` its attention steps use, made once per state (and again if its positions
        array was replaced), after checking its layer dims."""
        rows = self._state_rows.get(state)
        if rows is not None and rows.q_pos is state.q_pos:
            return rows
        if len(state.k) != len(self.kv_dims):
            raise BackendError(f"[backend] the KV state caches {len(state.k)} layers, graph {self.graph.name!r} "
                               f"has {len(self.kv_dims)} cached attention layers: a state of another executable")
        for i, ((h, dk, dv), k, v) in enumerate(zip(self.kv_dims, state.k, state.v, strict=True)):
            if k.shape[1:] != (h, dk) or v.shape[1:] != (h, dv):
                raise BackendError(f"[backend] the KV state's layer {i} caches keys {list(k.shape[1:])} and values "
                                   f"{list(v.shape[1:])} per slot; graph {self.graph.name!r} needs {[h, dk]} and "
                                   f"{[h, dv]}: a state of another executable")
        rows = self._state_rows[state] = CacheRows(state)
        return rows

    def _fail(self, binding: Binding, step: Step) -> None:
        i = binding.steps.index(step)
        rc = step()
        raise status_fail(f"node {binding.names[i]!r}", int(rc) if isinstance(rc, int) else -99)

    def steps_for(self, shapes: Mapping[str, tuple[int, ...]], state: KVState | KVBatch | None = None,
                  values: Mapping[str, np.ndarray] | None = None) -> int:
        """How many steps a run with these feed shapes (and values of the :attr:`shape_feeds`) executes (views cost
        none)."""
        key = tuple(tuple(shapes[n]) for n in self.input_names)
        return len(self._binding(key, state is not None, isinstance(state, KVBatch), values).steps)

    def close(self) -> None:
        if self.streaming is not None:
            self.streaming.close()
        self._bindings.clear()
        self._state_rows.clear()
        self._cache.clear()
        for name, w in self._weights.items():
            t = self.graph.tensor(name)
            if not t.is_constant:
                with contextlib.suppress(Exception):  # best effort: the store may already be closed
                    self._source.release(weight_key(t))
            del w
        for ref in self._extra_refs:
            with contextlib.suppress(Exception):
                self._source.release(ref)
        self._acquired.clear()
        self._weights.clear()
        self._weight_bytes = None
        self._arena = np.empty(0, np.uint8)
        self.closed = True


def output_projections(graph: Graph) -> frozenset[str]:
    """The values written by GEMM nodes (MatMul, MatMulRelu, GroupedMatMul) that are graph outputs, directly or
    through unary element-wise ops (a final Softcap or Cast, as Session's last-row rewrite allows): the logits of a
    language model. Asked of the graph's outputs, never of value names."""
    producers = graph.producers()
    found: set[str] = set()
    for value in graph.outputs:
        node = producers.get(value)
        while node is not None and (node.op in UNARY or node.op == "Identity"):
            value = node.inputs[0]
            node = producers.get(value)
        if node is not None and node.op in GEMM_OPS:
            found.add(value)
    return frozenset(found)


def lower_node(b: Bind, info: NodeInfo) -> list[Step]:
    """The steps of one node: the kernel lowering when it fits, else the generic (numpy) one."""
    fast = FAST.get(info.node.op)
    got = fast(b, info) if fast is not None else None
    if got is None:
        got = GENERIC[info.node.op](b, info)
    return got


def _tensor_bytes(t: Tensor, source: WeightSource, form: str | None = None) -> np.ndarray:
    """A weight's or constant's data as the kernels want it: typed array, or flat uint8 for block types;
    ``form``: the held form the source keeps it in (None: the file's layout)."""
    if t.is_constant:
        assert t.data is not None
        raw = np.frombuffer(t.data, np.uint8)
        return raw if t.dtype.is_quantized else raw.view(t.dtype.numpy).reshape([int(d) for d in t.shape])
    if form is not None:
        return weight_array(t, source.acquire(weight_key(t), form=form))  # type: ignore[call-arg]
    return weight_array(t, source.acquire(weight_key(t)))


GEMM_OPS = frozenset({"MatMul", "MatMulRelu", "GroupedMatMul"})


def gemm_only_weights(graph: Graph, infos: Sequence[NodeInfo]) -> frozenset[str]:
    """The weights that only GEMMs read, each as a transposed weight operand (inputs 1.. of MatMul, MatMulRelu,
    GroupedMatMul with ``transpose_b``): the ones a held form may rearrange (see CpuExecutable._held_form)."""
    weights = {t.name for t in graph.tensors if t.is_weight}
    gemm: set[str] = set()
    other: set[str] = set(graph.outputs)
    for info in infos:
        node = info.node
        for i, name in enumerate(node.inputs):
            if name not in weights:
                continue
            if node.op in GEMM_OPS and i >= 1 and bool(info.attrs.get("transpose_b", False)):
                gemm.add(name)
            else:
                other.add(name)
    return frozenset(gemm - other)


def weight_array(t: Tensor, data: Any) -> np.ndarray:
    """``data`` (what a store returned for ``t``) as the kernels want it, without a copy where it is already so."""
    arr = np.asarray(data)
    if t.dtype.is_quantized:
        flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        need = t.dtype.nbytes(int(np.prod([int(d) for d in t.shape])))
        if flat.size != need:
            raise BackendError(f"[backend] weight {t.name!r}: {flat.size} bytes, a {t.dtype.value} tensor of shape "
                               f"{list(t.shape)} needs {need}")
        return flat
    want = t.dtype.numpy
    if arr.dtype == np.uint8 and want != np.uint8:
        arr = arr.reshape(-1).view(want)
    return np.ascontiguousarray(arr, dtype=want).reshape([int(d) for d in t.shape])


def _arrays_of(obj: Any) -> list[np.ndarray]:
    """The arrays a cached object keeps alive: an array, a PackedWeight's bytes, an expert bank's packed experts."""
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, PackedWeight):
        return [obj.data]
    found: list[np.ndarray] = []
    for item in getattr(obj, "experts", ()):
        found += _arrays_of(item)
    return found


def distinct_bytes(arrays: Sequence[np.ndarray]) -> int:
    """Bytes of memory that ``arrays`` cover together: a view and its base, or two views of one buffer, count
    once (the union of their address ranges)."""
    spans = sorted((a.__array_interface__["data"][0], a.nbytes) for a in arrays if a.nbytes)
    total, end = 0, 0
    for start, size in spans:
        stop = start + size
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def _carve(arena: np.ndarray, offset: int, t: VType) -> np.ndarray:
    nbytes = nbytes_of(t)
    base = (-arena.ctypes.data) % 64
    raw = arena[base + offset: base + offset + nbytes]
    return raw if t.dtype.is_quantized else raw.view(t.dtype.numpy).reshape(t.shape)


def _view(info: NodeInfo, src: np.ndarray, src_t: VType, out_t: VType) -> np.ndarray:
    if out_t.dtype.is_quantized:
        return src
    if info.node.op == "Slice":
        return src[slice_index(info, src_t.shape)].reshape(out_t.shape)
    return src.reshape(out_t.shape)


__all__ = ["Binding", "CpuExecutable", "lower_node", "output_projections", "weight_array"]

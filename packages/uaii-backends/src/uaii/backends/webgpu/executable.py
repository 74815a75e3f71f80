"""The WebGPU executable: weights on the device once, and per feed-shape key a *binding* — the program of
dispatches over regions of one activation arena — so that ``run`` is: write the feeds, submit, read the outputs.

Activations live in one arena buffer laid out by liveness (first fit, offsets aligned for storage bindings);
Reshape and Identity of an activation are views (the same region). The rule is arena.py's; compiled with a plan,
every binding the plan's arena holds uses its offsets (the compile-time binding must: its size is what the plan
counted), and only a larger one is laid out here, growing the arena. Weights are uploaded at compile time in the form
their readers ask for: the stored encoding for GEMV/gather readers (``Lower.packed``: block-quantized bytes, f16/bf16
words; sharded by rows when larger than one storage binding), f32/i32 for everything else. Weights named in
``streamed`` stay on the host and are uploaded into a staging buffer before the node that reads them, which is how a
model larger than the device budget runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from uaii.backends.analysis import KvLayout, NodeInfo, VType, feed_types, infer_types, kv_layout
from uaii.backends.base import (
    BackendError,
    ExecutableMemory,
    WeightSource,
    gather_experts,
    per_expert,
    weight_key,
)
from uaii.backends.kv_book import KVBatch
from uaii.backends.webgpu.arena import VIEW_OPS, lay_out, uncovered
from uaii.backends.webgpu.device import GpuDevice
from uaii.backends.webgpu.lower import GpuWeight, Lower, Shard
from uaii.backends.webgpu.program import (
    Dispatch,
    Op,
    Region,
    Upload,
    from_device,
    pack_params,
    padded,
    to_device,
)
from uaii.ir import Graph
from uaii.ir.kvcache import kv_bytes_per_token
from uaii.ir.plan import ArenaLayout
from uaii.storage import rows_ref

MAX_BINDINGS = 8


@dataclass
class Binding:
    program: list[Op]
    feeds: list[tuple[str, Region, Any]]
    outputs: list[tuple[str, Region, Any, tuple[int, ...]]]
    state: Any
    n_new: int
    keep: list[Any] = field(default_factory=list)


class WebGpuExecutable:
    """A graph compiled for the WebGPU backend (see the module doc)."""

    def __init__(self, graph: Graph, infos: list[NodeInfo], weights: WeightSource, dev: GpuDevice, *,
                 lowerings: Mapping[str, Any], max_tokens: int = 512, kv_state: bool = True,
                 streamed: Collection[str] = (), chunk_bytes: int = 0, arena: ArenaLayout | None = None) -> None:
        """``arena``: a plan's arena (arena.py's rule), whose offsets the bindings it holds use."""
        self.graph = graph
        self.infos = infos
        self.dev = dev
        self.lowerings = lowerings
        self.max_tokens = max(int(max_tokens), 1)
        self.chunk_bytes = max(int(chunk_bytes), 0)  # the largest shard of a streamed weight (0: one binding)
        self._source = weights
        tmap = graph.tensor_map
        self.weight_names = {t.name for t in graph.tensors if t.is_weight or t.is_constant}
        refs = set(streamed)
        self.streamed = {t.name for t in graph.tensors if t.is_weight and weight_key(t) in refs}
        self._plain: dict[str, Region] = {}
        self._packed: dict[str, GpuWeight] = {}
        self._wholes: dict[str, Region] = {}
        self._derived: dict[str, Region] = {}
        self._acquired: set[str] = set()
        self._staging: list[Any] = []
        self._staging_bytes = 0
        self.weight_bytes = 0
        self._tmap = tmap
        self._slot_bytes = self._slot_size()
        kv = kv_layout(graph)
        self.kv: KvLayout | None = kv if kv_state and kv.layers else None  # None: no cached attention to bind
        stateful = self.kv.values if self.kv is not None else frozenset()
        self.input_names = tuple(n for n in graph.inputs if n not in stateful)
        self.output_names = tuple(n for n in graph.outputs if n not in stateful)
        self._bindings: dict[Any, Binding] = {}
        self._arena: Any = None
        self._arena_bytes = 0
        self._planned = arena
        self.closed = False

    # --- weights -------------------------------------------------------------------------------------------
    def is_weight(self, name: str) -> bool:
        return name in self.weight_names

    def _host(self, name: str) -> np.ndarray:
        t = self._tmap[name]
        if t.is_constant:
            assert t.data is not None
            raw = np.frombuffer(t.data, np.uint8)
            return raw if t.dtype.is_quantized else raw.view(t.dtype.numpy)
        ref = weight_key(t)
        self._acquired.add(ref)
        return np.asarray(self._source.acquire(ref))

    def is_streamed(self, name: str) -> bool:
        return name in self.streamed

    def _device_form(self, name: str, data: np.ndarray) -> np.ndarray:
        """Host data of a weight or constant → what the device holds when it is read whole: f32 (floats; block types
        dequantized on the host) or i32 (ints)."""
        t = self._tmap[name]
        if not t.dtype.is_quantized:
            return to_device(data, t.dtype)
        from uaii.kernels import dequantize

        data = dequantize(np.ascontiguousarray(data).reshape(-1).view(np.uint8), t.dtype,
                          int(np.prod([int(d) for d in t.shape])))
        return np.ascontiguousarray(data, np.float32).reshape(-1)

    def host_value(self, name: str) -> np.ndarray:
        """A weight's or constant's device form (:meth:`_device_form`) on the host. A streamed weight is released
        again (a copy is returned), so reading it does not pin it in host memory."""
        if name not in self.streamed:
            return self._device_form(name, self._host(name))
        ref = weight_key(self._tmap[name])
        try:
            return np.array(self._device_form(name, np.asarray(self._source.acquire(ref))), copy=True)
        finally:
            self._source.release(ref)

    def plain_weight(self, name: str) -> Region:
        """A resident weight or constant in its device form (:meth:`_device_form`), whole."""
        r = self._plain.get(name)
        if r is None:
            r = self._plain[name] = self._upload(self._device_form(name, self._host(name)).view(np.uint8))
        return r

    def derived(self, key: str, build: Callable[[], np.ndarray]) -> Region:
        """Data a lowering computes on the host from weights and attributes only (RoPE frequencies), uploaded once
        per executable under ``key`` and counted with the weights: every binding of the node shares it."""
        r = self._derived.get(key)
        if r is None:
            r = self._derived[key] = self._upload(np.ascontiguousarray(build()).reshape(-1).view(np.uint8))
        return r

    def staged_whole(self, name: str, node: str, slot: int) -> Upload:
        """A streamed weight read whole in its device form (as :meth:`plain_weight`), through staging buffer
        ``slot``: the upload's region is what the reader binds, refilled from the store before each use."""
        t = self._tmap[name]
        key = f"{name}\0{slot}"
        region = self._wholes.get(key)
        if region is None:
            nbytes = 4 * int(np.prod([int(d) for d in t.shape], dtype=np.int64))
            if nbytes > self._slot_bytes:
                raise BackendError(f"[backend] webgpu: node {node!r} reads streamed weight {name!r} whole: its "
                                   f"{nbytes} bytes as the device holds them exceed the staging buffer of "
                                   f"{self._slot_bytes} bytes (chunk_bytes {self.chunk_bytes}); keep it resident")
            region = self._wholes[key] = Region(self._slot_buffer(slot), 0, nbytes)
        return Upload(node, weight_key(t), region, partial(self._write_whole, name, region))

    def _write_whole(self, name: str, region: Region, queue: Any) -> None:
        ref = weight_key(self._tmap[name])
        try:
            data = self._device_form(name, np.asarray(self._source.acquire(ref)))
            queue.write_buffer(region.buffer, region.offset, padded(data.view(np.uint8)))
        finally:
            self._source.release(ref)

    def _upload(self, raw: np.ndarray) -> Region:
        if raw.nbytes > self.dev.max_binding:
            raise BackendError(f"[backend] webgpu: a weight of {raw.nbytes} bytes read whole exceeds the storage "
                               f"binding limit {self.dev.max_binding}")
        buf = self.dev.buffer(raw.nbytes)
        self.dev.queue.write_buffer(buf, 0, padded(raw))
        self.weight_bytes += buf.size
        return Region(buf, 0, raw.nbytes)

    def packed_weight(self, name: str, node: str, slot: int = 0) -> tuple[GpuWeight, list[Upload]]:
        """The weight in its stored encoding, sharded by rows. A streamed weight's shards are regions of staging
        buffer ``slot`` (one buffer per streamed weight a node reads), with one upload op per shard that the
        lowering context places right before the first dispatch reading that shard (see Lower.dispatch)."""
        t = self._tmap[name]
        shape = tuple(int(d) for d in t.shape)
        if name in self.streamed:
            key = f"{name}\0{slot}"
            w = self._packed.get(key)
            if w is None:
                w = self._packed[key] = self._staged(name, shape, slot)
            staged = w
            return w, [Upload(node, weight_key(t), s.region, partial(self._write_rows, name, staged, s))
                       for s in w.shards]
        w = self._packed.get(name)
        if w is None:
            flat = self._packed_bytes(name)
            need = t.dtype.nbytes(int(np.prod(shape, dtype=np.int64)))
            if flat.size != need:
                raise BackendError(f"[backend] webgpu: weight {name!r}: {flat.size} bytes, a {t.dtype.value} tensor "
                                   f"of shape {list(shape)} needs {need}")
            shards = []
            for start, stop in self._row_splits(t.dtype, shape):
                lo, hi = self._byte_range(t.dtype, shape, start, stop)
                shards.append(Shard(start, stop, self._upload(flat[lo:hi])))
            w = self._packed[name] = GpuWeight(name, t.dtype, shape, tuple(shards))
        return w, []

    def _packed_bytes(self, name: str) -> np.ndarray:
        """A weight's stored bytes, flat. An expert bank stored as one tensor per expert (HF checkpoints: a
        ``experts.*`` reference the store cannot serve whole) is read expert by expert (``#e=N``), as the CPU does."""
        t = self._tmap[name]
        if not per_expert(t):
            return np.ascontiguousarray(self._host(name)).reshape(-1).view(np.uint8)
        out = gather_experts(self._source, t, 0, int(t.shape[0]), release=False)
        self._acquired.update(str(t.weight.with_expert(e)) for e in range(int(t.shape[0])))  # type: ignore[union-attr]
        return out

    def _row_splits(self, dtype: Any, shape: tuple[int, ...], limit: int = 0) -> list[tuple[int, int]]:
        """Rows [start, stop) of each shard: as many whole rows (axis 0) as fit ``limit`` bytes (default: one
        storage binding). A 1-D weight is one shard."""
        rows = shape[0] if shape else 1
        if len(shape) <= 1:
            return [(0, rows)]
        row_bytes = max(1, dtype.nbytes(int(np.prod(shape[1:], dtype=np.int64))))
        per = max(1, min(limit or self.dev.max_binding, self.dev.max_binding) // row_bytes)
        return [(s, min(rows, s + per)) for s in range(0, rows, per)]

    @staticmethod
    def _byte_range(dtype: Any, shape: tuple[int, ...], start: int, stop: int) -> tuple[int, int]:
        if len(shape) <= 1:
            return 0, dtype.nbytes(int(np.prod(shape, dtype=np.int64)))
        row = dtype.nbytes(int(np.prod(shape[1:], dtype=np.int64)))
        return start * row, stop * row

    def _slot_size(self) -> int:
        """Bytes of every staging buffer, fixed at construction so that a buffer never grows (bind groups keep
        pointing at it): the largest piece a streamed weight uploads at once — its largest shard (at most
        ``chunk_bytes`` and one binding), and for a 1-D weight (norms read them whole) its f32/i32 form."""
        need = 0
        for name in self.streamed:
            t = self._tmap[name]
            shape = tuple(int(d) for d in t.shape)
            for a, b in self._row_splits(t.dtype, shape, self.chunk_bytes):
                lo, hi = self._byte_range(t.dtype, shape, a, b)
                need = max(need, hi - lo)
            if len(shape) <= 1:
                need = max(need, 4 * int(np.prod(shape, dtype=np.int64)))
        return need

    def _slot_buffer(self, slot: int) -> Any:
        """Staging buffer ``slot`` (one per streamed weight a node reads), created on first use at the fixed size."""
        while len(self._staging) <= slot:
            self._staging.append(None)
        buf = self._staging[slot]
        if buf is None:
            buf = self._staging[slot] = self.dev.buffer(self._slot_bytes)
            self._staging_bytes += buf.size
        return buf

    def _staged(self, name: str, shape: tuple[int, ...], slot: int) -> GpuWeight:
        """A streamed weight as shards of at most ``chunk_bytes`` (and one binding), all in staging buffer ``slot``:
        the shards take turns in it, each uploaded after the work that read the previous one was submitted."""
        t = self._tmap[name]
        splits = self._row_splits(t.dtype, shape, self.chunk_bytes)
        spans = [self._byte_range(t.dtype, shape, a, b) for a, b in splits]
        buf = self._slot_buffer(slot)
        shards = tuple(Shard(a, b, Region(buf, 0, hi - lo)) for (a, b), (lo, hi) in zip(splits, spans, strict=True))
        return GpuWeight(name, t.dtype, shape, shards, streamed=True)

    def _write_rows(self, name: str, w: GpuWeight, s: Shard, queue: Any) -> None:
        """Write the stored bytes of one shard of a streamed weight into its staging region, straight from the host
        store's buffer (rows read by ``@rows=``; a caller's array sliced); a bank stored as one tensor per expert is
        gathered expert by expert into one host buffer first."""
        t = self._tmap[name]
        ref = weight_key(t)
        if per_expert(t):
            queue.write_buffer(s.region.buffer, s.region.offset,
                               padded(gather_experts(self._source, t, s.start, s.stop, release=True)))
            return
        whole = s.start == 0 and s.stop == w.rows
        if t.weight is not None and not whole and len(w.shape) > 1:  # a file's tensor: the store reads the rows
            key, span = rows_ref(ref, s.start, s.stop), slice(None)
        else:  # caller-supplied arrays, or the whole tensor
            key, span = ref, slice(*self._byte_range(t.dtype, w.shape, s.start, s.stop))
        try:
            data = np.ascontiguousarray(self._source.acquire(key)).reshape(-1).view(np.uint8)
            queue.write_buffer(s.region.buffer, s.region.offset, padded(data[span]))
        finally:
            self._source.release(key)

    # --- binding -------------------------------------------------------------------------------------------
    def feed_types(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, VType]:
        return feed_types(self.graph, self.input_names, shapes, self.kv)

    def _bind(self, shapes: Mapping[str, tuple[int, ...]], state: Any) -> Binding:
        types = infer_types(self.graph, self.infos, self.feed_types(shapes))
        regions = self._layout(types)
        ctx = Lower(self, regions, types, state)
        n_new = 0
        for info in self.infos:
            node = info.node
            ctx.node = node.name
            if node.op in VIEW_OPS and node.outputs[0] in regions and node.inputs[0] in regions \
                    and regions[node.outputs[0]] == regions[node.inputs[0]]:
                continue
            if self.kv is not None and node.name in self.kv.layer:
                n_new = types[node.inputs[0]].shape[0]
            lower = self.lowerings.get(node.op)
            if lower is None:
                raise BackendError(f"[backend] webgpu: no lowering for op {node.op!r} (node {node.name!r})")
            lower(ctx, info)
        feeds = [(n, regions[n], self.graph.tensor(n).dtype) for n in self.input_names]
        outputs = [(n, ctx.region(n), types[n].dtype, types[n].shape) for n in self.output_names]
        return Binding(ctx.program, feeds, outputs, state, n_new, ctx.keep)

    def _layout(self, types: dict[str, VType]) -> dict[str, Region]:
        """Regions of every activation (arena.py's rule); at the plan's offsets when its arena holds them."""
        align = self.dev.offset_align
        stateful = self.kv.values if self.kv is not None else frozenset()
        r = lay_out(self.infos, self.input_names, self.output_names, stateful, types, align)
        offset, total = r.offset, r.total
        if self._planned is not None:
            problem = next(uncovered(r, self._planned, len(self.infos), types, align), None)
            if problem is None:
                offset = {s.value: s.offset for s in self._planned.slots}
                total = self._planned.size
            elif not self._arena_bytes:  # the first binding (prepare's, at the plan's max_tokens) must follow it
                raise BackendError(f"[backend] webgpu: the plan's arena ({self._planned.rule}, "
                                   f"{self._planned.max_tokens} tokens) does not fit graph {self.graph.name!r} as "
                                   f"this executable binds it: {problem}")
        if total > self._arena_bytes:
            self._arena = self.dev.buffer(total)
            self._arena_bytes = total
            self._bindings.clear()  # earlier bindings point into the old arena
        return {v: Region(self._arena, offset[o], r.size[o]) for v, o in r.root.items() if o in offset}

    # --- running -------------------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, np.ndarray], state: Any = None) -> dict[str, np.ndarray]:
        """Run once: write the feeds, submit the program, read the outputs back. One sequence per pass: a
        :class:`KVBatch` is refused (``Capabilities.batched_kv`` is False; its attention reads one state's cache)."""
        if self.closed:
            raise BackendError("[backend] the executable is closed")
        if isinstance(state, KVBatch):
            raise BackendError(f"[backend] the webgpu backend runs one sequence per pass (Capabilities.batched_kv is "
                               f"False); found a KVBatch of {len(state)} states: run each sequence with its own "
                               "state")
        try:
            key = tuple(np.shape(feeds[n]) for n in self.input_names)
        except KeyError as exc:
            raise BackendError(f"[backend] missing input {exc.args[0]!r}; the graph takes "
                               f"{', '.join(self.input_names)}") from None
        if self.kv is not None and state is None:
            raise BackendError("[backend] this graph keeps a KV cache: pass a state from new_state()")
        binding = self._bindings.get(key)
        if binding is None or binding.state is not state:
            self._bindings.pop(key, None)  # a stale binding of this key makes no room by itself
            if len(self._bindings) >= MAX_BINDINGS:
                self._bindings.pop(next(iter(self._bindings)))
            binding = self._bind(dict(zip(self.input_names, key, strict=True)), state)
            self._bindings[key] = binding
        q = self.dev.queue
        for name, region, dtype in binding.feeds:
            data = to_device(np.asarray(feeds[name]), dtype).view(np.uint8)
            if data.size:  # an empty feed (a past of 0 tokens) writes nothing; wgpu refuses empty writes
                q.write_buffer(region.buffer, region.offset, padded(data))
        if state is not None and binding.n_new:
            state.prepare(binding.n_new)
        self._execute(binding.program)
        out = {}
        for name, region, dtype, shape in binding.outputs:
            if not int(np.prod(shape, dtype=np.int64)):
                out[name] = np.zeros(shape, dtype.numpy)
                continue
            raw = q.read_buffer(region.buffer, region.offset, -(-region.nbytes // 4) * 4)
            out[name] = from_device(raw, dtype, shape)
        if state is not None and binding.n_new:
            state.advance(binding.n_new)
        return out

    def _execute(self, program: list[Op]) -> None:
        q = self.dev.queue
        enc = self.dev.device.create_command_encoder()
        cpass = enc.begin_compute_pass()
        pending = False
        for op in program:
            if isinstance(op, Upload):
                if pending:
                    cpass.end()
                    q.submit([enc.finish()])
                    enc = self.dev.device.create_command_encoder()
                    cpass = enc.begin_compute_pass()
                    pending = False
                op.write(q)
                continue
            assert isinstance(op, Dispatch)
            if op.refresh is not None:
                q.write_buffer(op.params, 0, pack_params(op.refresh()))
            cpass.set_pipeline(op.pipeline)
            cpass.set_bind_group(0, op.bind_group)
            cpass.dispatch_workgroups(*op.groups)
            pending = True
        cpass.end()
        q.submit([enc.finish()])

    def new_state(self, capacity: int, *, window: int = 0, sinks: int = 4, dtype: str = "f32",
                  positions: str = "absolute") -> Any:
        """A KV cache resident in device buffers (see kv_state.py): ``capacity`` tokens, or ``window + sinks``
        slots when windowed. ``positions="cache"``: rotary positions are cache slots (StreamingLLM), which needs
        every cached key to come out of a RoPE node fed by a graph input that only RoPE nodes read."""
        if self.kv is None:
            raise BackendError(f"[backend] graph {self.graph.name!r} keeps no KV cache")
        from uaii.backends.kv_book import key_ropes
        from uaii.backends.webgpu.kv_state import GpuKVState

        slots = window + sinks if window else capacity
        rotations = key_ropes(self.graph, self.infos, self.kv.layer, [dk for _, dk, _ in self.kv.dims],
                              lambda n: to_device(self._host(n), self._tmap[n].dtype), self.weight_names) \
            if positions == "cache" else ()
        return GpuKVState(self.dev, self.kv.dims, slots, dtype=dtype, window=window, sinks=sinks,
                          max_tokens=max(slots, 1), positions=positions, rotations=rotations)

    def prepare(self) -> None:
        """Bind once for ``max_tokens`` tokens at compile time when every symbolic feed dim is the token count, so
        that weights are uploaded, pipelines compiled and the arena sized before the first run (and ``memory()``
        reports them). A graph with a KV cache binds with a temporary state of ``max_tokens`` slots. With a plan,
        every symbolic feed dim is ``max_tokens``: the shapes the plan's arena was laid out at (arena.py, by the
        same :func:`~uaii.backends.analysis.token_shapes`)."""
        from uaii.backends.analysis import token_shapes

        shapes = token_shapes(self.graph, self.input_names, self.max_tokens, batched_only=self._planned is None)
        if shapes is None:
            return
        state = self.new_state(self.max_tokens) if self.kv is not None else None
        self._bind(shapes, state)  # the temporary state's buffers go with it; weights and the arena stay

    def memory(self) -> ExecutableMemory:
        """Device bytes this executable holds: the arena, the weights it uploaded and its staging buffers."""
        per_token = kv_bytes_per_token(self.graph) if self.kv is not None else 0
        return ExecutableMemory(arena_bytes=self._arena_bytes, weight_bytes=self.weight_bytes,
                                staging_bytes=self._staging_bytes, kv_bytes_per_token=per_token, device="device")

    def steps_for(self, shapes: Mapping[str, tuple[int, ...]], state: Any = None) -> int:
        """How many dispatches and uploads a run with these feed shapes executes."""
        key = tuple(tuple(shapes[n]) for n in self.input_names)
        if key not in self._bindings:
            self._bindings[key] = self._bind({n: tuple(shapes[n]) for n in self.input_names}, state)
        return len(self._bindings[key].program)

    def close(self) -> None:
        self._bindings.clear()
        for ref in self._acquired:
            with contextlib.suppress(Exception):  # best effort: the store may already be closed
                self._source.release(ref)
        self._acquired.clear()
        self._plain.clear()
        self._packed.clear()
        self._wholes.clear()
        self._derived.clear()
        self._staging.clear()
        self._arena = None
        self.closed = True


__all__ = ["Binding", "WebGpuExecutable"]

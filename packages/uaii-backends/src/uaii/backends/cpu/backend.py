"""The CPU backend object: probe, capabilities, host memory, and ``compile`` into a :class:`CpuExecutable`."""

from __future__ import annotations

import functools
import platform
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from uaii.backends.analysis import token_shapes
from uaii.backends.base import (
    Backend,
    BackendBase,
    Capabilities,
    DeviceStatus,
    Executable,
    KVStateLike,
    WeightSource,
)
from uaii.backends.config import cpu_gemm
from uaii.backends.cpu.bind import BindHost
from uaii.backends.cpu.executable import GENERIC, CpuExecutable
from uaii.backends.cpu.kv import KV_DTYPES, POSITIONS, KVState
from uaii.backends.cpu.memory import ARENA_RULE, arena_of, node_infos
from uaii.backends.cpu.ops_fast import FAST
from uaii.ir import PLAIN_TYPES, Graph, Node
from uaii.ir.plan import ArenaLayout, ExecutionPlan
from uaii.kernels import DEQUANT_TYPES, best_isa, get_isa, get_num_threads, set_num_threads
from uaii.kernels.config import usable_cores

UNSUPPORTED: dict[str, str] = {}
"""Registered ops the CPU backend deliberately does not run, with the reason (none today)."""


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def _capabilities() -> Capabilities:
    return Capabilities(activation_dtypes=frozenset(d.value for d in PLAIN_TYPES),
                        weight_dtypes=frozenset(d.value for d in DEQUANT_TYPES | PLAIN_TYPES),
                        ops=frozenset(GENERIC) | frozenset(FAST), unsupported=dict(UNSUPPORTED),
                        streams_weights=True, kv_dtypes=frozenset(KV_DTYPES), kv_positions=frozenset(POSITIONS),
                        kv_window=True, batched_kv=True, device_memory=0, threads=True,
                        compile_options=frozenset({"gemm"}), arena=ARENA_RULE, step_profile=True)


class CpuBackend(BackendBase):
    """Runs every op of the registry; the hot ones on the C kernels (see ops_fast.py)."""

    name = "cpu"
    kind = "cpu"

    def probe(self) -> DeviceStatus:
        cores = usable_cores()
        return DeviceStatus(True, "", [f"cpu:0 {cpu_name()} ({cores} usable cores, kernels {best_isa()}, "
                                       f"{get_num_threads()} threads)"])

    @property
    def capabilities(self) -> Capabilities:
        """Host memory, weights streamed from a streaming store, KV states in f32/f16 with a resident window and
        either positioning (kv.py), the kernels' thread pool, the ``gemm`` compile option, and its own arena rule
        (memory.py, :meth:`plan_arena`). One value, made once: it is the same for every instance, and a session
        reads it on every pass (building it took ~10 us)."""
        return _capabilities()

    def set_threads(self, n: int | None) -> None:
        """Threads of the kernel pool (None: the usable cores)."""
        set_num_threads(n)

    def info(self) -> dict[str, Any]:
        return {"isa": get_isa(), "threads": get_num_threads()}

    def plan_arena(self, graph: Graph, max_tokens: int, *, memory_reuse: bool = True) -> ArenaLayout:
        """The arena ``compile(graph, plan)`` allocates at ``max_tokens`` tokens with the KV state bound (memory.py's
        rule: views, in-place reuse, first fit, 64-byte aligned; every symbolic feed dim at ``max_tokens``)."""
        return arena_of(graph, node_infos(graph), max_tokens, memory_reuse)

    def compile(self, graph: Graph, plan: ExecutionPlan | None, weights: WeightSource, *, max_tokens: int = 0,
                kv_state: bool = True, memory_reuse: bool = True, gemm: str | None = None,
                streamed: Collection[str] = (), prefetch_order: Sequence[str] = (), expert_cache: Any = None,
                chunk_bytes: int = 0, **_: Any) -> CpuExecutable:
        """Bind ``graph`` for execution. ``max_tokens`` sizes the arena for prefill chunks (default: the plan's
        ``max_tokens``, else 512); ``kv_state`` binds cached Attention nodes to a KVState (``new_state``).
        ``gemm``: ``"fast"`` (int8 dot products for block-quantized weights; the output projection of Q8_0 weights
        over 16-bit activations, see CpuExecutable.gemm_mode_for) or ``"f32"`` (exact float dots); default
        ``$UAII_CPU_GEMM`` or fast.
        ``streamed``: weight references that are not bound at compile time but acquired from ``weights`` (a
        streaming store) around the steps that read them, queued in execution order (see cpu/streaming.py);
        ``expert_cache`` serves streamed MoE expert banks by expert; a streamed MatMul weight whose read window
        exceeds ``chunk_bytes`` (one staging buffer) streams in chunks of rows.
        With a plan, its steps are what runs: fused nodes (GroupedMatMul, AddRMSNorm, SwiGLU) in its order, and its
        arena is what is allocated — laid out by this backend's rule (:meth:`plan_arena`), for the plan's
        max_tokens with every symbolic feed dim at that count; a plan laid out by another rule, or one that does
        not cover the buffers (``kv_state``, ``memory_reuse`` or ``max_tokens`` other than planned), is an error."""
        graph = self.graph_to_run(graph, plan, max_tokens)
        infos = node_infos(graph)
        tokens = (plan.arena.max_tokens if plan is not None else max_tokens) or 512
        exe = CpuExecutable(graph, infos, weights, max_tokens=tokens, kv_state=kv_state, memory_reuse=memory_reuse,
                            gemm=gemm or cpu_gemm(), streamed=streamed, prefetch_order=prefetch_order,
                            expert_cache=expert_cache, chunk_bytes=chunk_bytes,
                            arena=plan.arena if plan is not None else None)
        shapes = token_shapes(graph, exe.input_names, tokens, batched_only=plan is None)  # plan_arena's, with a plan
        if shapes is not None:
            exe.prepare(shapes)
        return exe

    def unsupported_reason(self, node: Node) -> str | None:
        if node.op in GENERIC or node.op in FAST:
            return None
        return UNSUPPORTED.get(node.op, f"op {node.op!r} is not implemented by the cpu backend")


if TYPE_CHECKING:  # mypy holds the CPU classes to the contract they implement (base.py), structurally
    _BACKEND: type[Backend] = CpuBackend
    _EXECUTABLE: type[Executable] = CpuExecutable
    _STATE: type[KVStateLike] = KVState
    _HOST: type[BindHost] = CpuExecutable

__all__ = ["UNSUPPORTED", "CpuBackend"]

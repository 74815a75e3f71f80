"""The WebGPU backend object: probe (adapters), capabilities, and ``compile`` into a :class:`WebGpuExecutable`."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from uaii.backends.analysis import node_infos
from uaii.backends.base import (
    BackendBase,
    BackendUnavailable,
    Capabilities,
    DeviceStatus,
    WeightSource,
)
from uaii.ir import Graph, Node
from uaii.ir.plan import ArenaLayout, ExecutionPlan

WEIGHT_DTYPES = frozenset({"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q6_k"})
KV_DTYPES = frozenset({"f32", "f16"})
"""Element types of the device KV state (kv_state.py's GpuKVState)."""

_ONNX_OPS = ("Erf Reciprocal Cos Sin Abs Log Not Pow Max Min Mod Equal Less Greater LessOrEqual GreaterOrEqual And Or "
             "Xor Where Trilu ReduceSum ReduceMax ReduceMin CumSum Shape Range Fill Expand")
UNSUPPORTED: dict[str, str] = {
    **dict.fromkeys(_ONNX_OPS.split(), "no WGSL kernel yet: the ops ONNX graphs bring (issue #14) run on the cpu "
                                       "backend"),
    "MatMulNBits": "no WGSL kernel for ONNX's MatMulNBits weight layout yet: it runs packed on the cpu backend",
    **dict.fromkeys(("QuantizedMatMul", "QuantizedEmbedding", "QuantizedMoEExperts"),
                    "no WGSL kernel for MLX's quantized weight layout yet: it runs packed on the cpu backend"),
}
"""Registered ops this backend deliberately does not run, with the reason (Capabilities.unsupported). A graph with
one of them is refused by ``compile`` (UnsupportedOpError naming every such node), never run in part."""


class WebGpuBackend(BackendBase):
    """WGSL compute shaders through wgpu (Vulkan, Metal, D3D12); software adapters only when allowed."""

    name = "webgpu"
    kind = "gpu"

    def __init__(self, allow_software: bool | None = None) -> None:
        self.allow_software = allow_software

    def probe(self) -> DeviceStatus:
        from uaii.backends.webgpu.device import choose

        try:
            info, _ = choose(self.allow_software)
        except BackendUnavailable as exc:
            return DeviceStatus(False, exc.reason)
        except Exception as exc:  # a probe never raises
            return DeviceStatus(False, f"probe failed: {type(exc).__name__}: {exc}")
        return DeviceStatus(True, "", [info.describe()], software=info.software)

    def devices(self) -> list[dict[str, Any]]:
        """Every adapter wgpu enumerates, software ones included and marked (:meth:`AdapterInfo.as_dict`); raises
        BackendUnavailable (``wgpu`` not installed) with the reason the listing shows."""
        from uaii.backends.webgpu.device import adapters

        return [a.as_dict() for a in adapters()]

    @property
    def capabilities(self) -> Capabilities:
        """Streams the weights named in ``streamed`` (uploaded before the node that reads them); ``device_memory``
        is the chosen adapter's (:attr:`AdapterInfo.device_memory`; 0 when no adapter can be used, and then
        ``compile`` fails anyway); KV states in device buffers (kv_state.py); its own arena rule (arena.py)."""
        from uaii.backends.webgpu.arena import ARENA_RULE
        from uaii.backends.webgpu.ops import LOWERINGS

        return Capabilities(activation_dtypes=frozenset({"f32", "f16", "bf16", "i32", "i64"}),
                            weight_dtypes=WEIGHT_DTYPES, ops=frozenset(LOWERINGS),
                            unsupported={op: why for op, why in UNSUPPORTED.items() if op not in LOWERINGS},
                            streams_weights=True,
                            kv_dtypes=KV_DTYPES, kv_positions=frozenset({"absolute", "cache"}), kv_window=True,
                            batched_kv=False, device_memory=self.device_memory(), arena=ARENA_RULE)

    def device_memory(self) -> int:
        """Bytes of memory of the adapter this backend runs on (0: none it may use)."""
        from uaii.backends.webgpu.device import choose

        try:
            info, _ = choose(self.allow_software)
        except Exception:  # unavailable: the probe says why
            return 0
        return info.device_memory

    def plan_arena(self, graph: Graph, max_tokens: int, *, memory_reuse: bool = True) -> ArenaLayout:
        """The device arena ``compile(graph, plan)`` allocates at ``max_tokens`` tokens (arena.py's rule, offsets
        aligned for any adapter; no adapter is opened). The arena always reuses memory: ``memory_reuse`` is
        accepted for the contract."""
        from uaii.backends.webgpu.arena import arena_of

        return arena_of(graph, node_infos(graph), max_tokens)

    def unsupported_reason(self, node: Node) -> str | None:
        from uaii.backends.webgpu.ops import LOWERINGS

        if node.op in LOWERINGS:
            return None
        return UNSUPPORTED.get(node.op, f"op {node.op!r} is not implemented by the webgpu backend")

    def compile(self, graph: Graph, plan: ExecutionPlan | None, weights: WeightSource, *, max_tokens: int = 0,
                kv_state: bool = True, memory_reuse: bool = True, streamed: Collection[str] = (),
                prefetch_order: Sequence[str] = (), expert_cache: Any = None, chunk_bytes: int = 0,
                host_resident: Collection[str] = (), **options: Any) -> Any:
        """Upload the weights (those in ``streamed`` are uploaded before each node that reads them, in shards of at
        most ``chunk_bytes``), compile the kernels and size the arena for ``max_tokens``. ``prefetch_order`` needs
        nothing more: uploads happen in step order, which is the plan's order. The arena always reuses memory
        (``memory_reuse`` is accepted for the contract). The host expert cache does not apply to a device: banks
        stream shard by shard instead, so an ``expert_cache`` is an error. ``host_resident`` changes nothing here:
        wgpu writes a shard straight from the store's buffer (no staging copy to save)."""
        from uaii.backends.webgpu.device import open_device
        from uaii.backends.webgpu.executable import WebGpuExecutable
        from uaii.backends.webgpu.ops import LOWERINGS

        self.device_compile_args(options, expert_cache, "the device streams expert banks shard by shard")
        graph = self.graph_to_run(graph, plan, max_tokens)
        dev = open_device(self.allow_software)
        tokens = (plan.arena.max_tokens if plan is not None else max_tokens) or 512
        exe = WebGpuExecutable(graph, node_infos(graph), weights, dev, lowerings=LOWERINGS, max_tokens=tokens,
                               kv_state=kv_state, streamed=streamed, chunk_bytes=chunk_bytes,
                               arena=plan.arena if plan is not None else None)
        exe.prepare()
        return exe


__all__ = ["UNSUPPORTED", "WebGpuBackend"]

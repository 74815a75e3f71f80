"""The WebGPU backend object: probe (adapters), capabilities, and ``compile`` into a :class:`WebGpuExecutable`."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from uaii.backends.analysis import node_infos
from uaii.backends.base import (
    BackendBase,
    BackendUnavailable,
    Capabilities,
    DeviceStatus,
    UnsupportedOpError,
    WeightSource,
    plan_graph,
)
from uaii.ir import Graph, Node
from uaii.ir.plan import ExecutionPlan

WEIGHT_DTYPES = frozenset({"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q6_k"})


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
        return DeviceStatus(True, "", [info.describe()])

    @property
    def capabilities(self) -> Capabilities:
        from uaii.backends.webgpu.ops import LOWERINGS

        return Capabilities(activation_dtypes=frozenset({"f32", "f16", "bf16", "i32", "i64"}),
                            weight_dtypes=WEIGHT_DTYPES, ops=frozenset(LOWERINGS))

    def unsupported_reason(self, node: Node) -> str | None:
        from uaii.backends.webgpu.ops import LOWERINGS

        if node.op in LOWERINGS:
            return None
        return f"op {node.op!r} is not implemented by the webgpu backend"

    def compile(self, graph: Graph, plan: ExecutionPlan | None, weights: WeightSource, *, max_tokens: int = 0,
                kv_state: bool = True, streamed: Collection[str] = (), **_: Any) -> Any:
        from uaii.backends.webgpu.device import open_device
        from uaii.backends.webgpu.executable import WebGpuExecutable
        from uaii.backends.webgpu.ops import LOWERINGS

        if plan is not None:
            graph = plan_graph(graph, plan)
        problems = [(n.name, n.op, self.unsupported_reason(n) or "") for n in graph.nodes if not self.supports_op(n)]
        if problems:
            raise UnsupportedOpError(self.name, problems)
        dev = open_device(self.allow_software)
        tokens = max_tokens or (plan.arena.max_tokens if plan is not None else 0) or 512
        return WebGpuExecutable(graph, node_infos(graph), weights, dev, lowerings=LOWERINGS, max_tokens=tokens,
                                kv_state=kv_state, streamed=streamed)


__all__ = ["WebGpuBackend"]

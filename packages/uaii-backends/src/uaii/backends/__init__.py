"""uaii.backends — execution backends of UAII: the backend interface, the CPU backend, the WebGPU backend
(:mod:`uaii.backends.webgpu`; ``wgpu`` is imported only when it enumerates adapters, so this package imports without
it), GPU device probes, the registry (entry-point group ``uaii.backends``) and the conformance suite
(:mod:`uaii.backends.testing`).

    from uaii.backends import get_backend, list_backends, select_device
    cpu = get_backend("cpu")
    exe = cpu.compile(graph, None, store)          # store: anything with acquire(ref) -> np.ndarray
    # or with a plan laid out by the backend's arena rule: uaii.planner.plan(graph, arena=policy), where policy is
    # what uaii.runtime.planning.arena_policy(cpu) builds from cpu.plan_arena (docs/backends.md, "arena")
    state = exe.new_state(4096)                     # KV cache for graphs with cached Attention
    out = exe.run({"tokens": ids, "positions": pos}, state)
    # several sequences, one decode row each (Capabilities.batched_kv): row i of the feeds belongs to rows[i]
    out = exe.run({"tokens": next_ids, "positions": [s.reserve(1) for s in states]}, KVBatch(states))
"""

from importlib.metadata import version as _version

from uaii.backends.base import (
    ArrayWeights,
    Backend,
    BackendBase,
    BackendError,
    BackendUnavailable,
    Capabilities,
    DeviceStatus,
    Executable,
    KVStateLike,
    UnsupportedOpError,
    WeightSource,
    plan_graph,
    weight_key,
)
from uaii.backends.cpu import CpuBackend, CpuExecutable, KVCacheFull, KVState
from uaii.backends.gpu import CudaBackend, GpuProbeBackend, MetalBackend, RocmBackend, VulkanBackend
from uaii.backends.kv_book import KVBatch
from uaii.backends.profile import FamilyTiming, NodeTiming, StepProfile, merge_profiles
from uaii.backends.registry import ENTRY_POINT_GROUP, backend_names, get_backend, list_backends, select_device
from uaii.backends.webgpu import WebGpuBackend

__version__ = _version("uaii-backends")
__all__ = [
    "ENTRY_POINT_GROUP", "ArrayWeights", "Backend", "BackendBase", "BackendError", "BackendUnavailable",
    "Capabilities", "CpuBackend", "CpuExecutable", "CudaBackend", "DeviceStatus", "Executable", "FamilyTiming",
    "GpuProbeBackend", "KVBatch", "KVCacheFull", "KVState", "KVStateLike", "MetalBackend", "NodeTiming", "RocmBackend",
    "StepProfile", "UnsupportedOpError", "VulkanBackend", "WebGpuBackend", "WeightSource", "__version__",
    "backend_names", "get_backend", "list_backends", "merge_profiles", "plan_graph", "select_device", "weight_key",
]

"""The CUDA backend object: probe (the driver, cuda-bindings and NVRTC), capabilities, ``compile`` into a
:class:`~uaii.backends.cuda.executable.CudaExecutable`.

``device="auto"`` does not pick it yet (:data:`NOT_AUTO`): no part of the executor has run on a GPU — it is verified
on the host model of a device against the CPU backend, and its kernels on the host compiler — so a user with an
NVIDIA card gets it only by naming it (``--device cuda``) until a device run confirms it. ``CudaBackend(device=...)``
runs on a given device object: the tests pass :class:`~uaii.backends.cuda.host.HostDevice`, which the probe reports
as a software device, so ``auto`` never picks it either.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Collection, Sequence
from typing import Any

from uaii.backends.analysis import node_infos
from uaii.backends.base import BackendBase, BackendError, BackendUnavailable, Capabilities, DeviceStatus, WeightSource
from uaii.backends.config import GEMM_MODES
from uaii.backends.cuda.nvrtc import EXTRA
from uaii.backends.cuda.sources import TYPES
from uaii.ir import Graph
from uaii.ir.plan import ArenaLayout, ExecutionPlan

NOT_AUTO = ("device auto does not pick cuda yet: its executor has not run on a GPU (verified on a host model of "
            "the device, issue #18); --device cuda runs it")
WEIGHT_DTYPES = frozenset(d.value for d in TYPES)


class CudaBackend(BackendBase):
    """CUDA C kernels compiled by NVRTC, launched through the driver API (see the module doc)."""

    name = "cuda"
    kind = "gpu"
    sdk = "the NVIDIA driver (libcuda.so.1)"

    def __init__(self, device: Any = None) -> None:
        self._device = device

    # --- the device ------------------------------------------------------------------------------------------
    def enumerate(self) -> tuple[list[str], str]:
        """(CUDA devices the driver reports, why there are none) — through ctypes, so it needs no package."""
        from uaii.backends.gpu import cuda_devices

        return cuda_devices()

    def probe(self) -> DeviceStatus:
        if self._device is not None:
            return DeviceStatus(True, "", [f"cuda:0 {self._device.name}"],
                                software=type(self._device).__name__ == "HostDevice")
        try:
            devices, why = self.enumerate()
        except Exception as exc:  # a probe never raises
            return DeviceStatus(False, f"probe failed: {type(exc).__name__}: {exc}")
        if not devices:
            return DeviceStatus(False, why or "no CUDA device")
        if importlib.util.find_spec("cuda.bindings") is None:
            return DeviceStatus(False, f"found {', '.join(devices)}, but cuda-bindings is not installed: {EXTRA}",
                                devices)
        return DeviceStatus(True, "", devices, not_auto=NOT_AUTO)

    def device(self) -> Any:
        """The device this backend runs on: the given one, or CUDA device 0 (opened once)."""
        if self._device is None:
            from uaii.backends.cuda.device import CudaDevice

            status = self.probe()
            if not status.available:
                raise BackendUnavailable(self.name, status.reason)
            self._device = CudaDevice.open(0)
        return self._device

    def device_memory(self) -> int:
        try:
            return int(self.device().total_bytes)
        except Exception:  # unavailable: the probe says why
            return 0

    @property
    def capabilities(self) -> Capabilities:
        """Streams the weights named in ``streamed`` (two staging slots, pieces of ``chunk_bytes``); KV states in
        device memory, f32 or f16, with a resident window, absolute positions; one decode row per state in a
        KVBatch; its own arena rule."""
        from uaii.backends.cuda.executable import ARENA_RULE
        from uaii.backends.cuda.lower import OPS

        return Capabilities(activation_dtypes=frozenset({"f32", "i32", "i64"}), weight_dtypes=WEIGHT_DTYPES,
                            ops=OPS, streams_weights=True, kv_dtypes=frozenset({"f32", "f16"}),
                            kv_positions=frozenset({"absolute"}), kv_window=True, batched_kv=True,
                            device_memory=self.device_memory(), arena=ARENA_RULE, staging_buffers=2,
                            expert_staging=True, compile_options=frozenset({"expert_cache_bytes", "gemm"}))

    def plan_arena(self, graph: Graph, max_tokens: int, *, memory_reuse: bool = True) -> ArenaLayout:
        """The device arena ``compile(graph, plan)`` allocates at ``max_tokens`` tokens (no device is opened)."""
        from uaii.backends.cuda.executable import ALIGN, ARENA_RULE
        from uaii.backends.webgpu.arena import arena_of

        return arena_of(graph, node_infos(graph), max_tokens, rule=ARENA_RULE, align=ALIGN)

    def compile(self, graph: Graph, plan: ExecutionPlan | None, weights: WeightSource, *, max_tokens: int = 0,
                kv_state: bool = True, memory_reuse: bool = True, streamed: Collection[str] = (),
                prefetch_order: Sequence[str] = (), expert_cache: Any = None, chunk_bytes: int = 0,
                host_resident: Collection[str] = (), expert_cache_bytes: int = 0, cuda_graphs: bool = True,
                gemm: str = "fast", **options: Any) -> Any:
        """Resident weights are uploaded on first use at compile time; those in ``streamed`` move through the
        staging slots in pieces of at most ``chunk_bytes`` every run, in step order (``prefetch_order`` adds
        nothing: the steps are the plan's order) — the pieces of those also in ``host_resident`` from page-locked
        host copies made once (the host-pinned tier), the others read from the store into a page-locked staging
        buffer first. The host expert cache does not apply to a device; ``expert_cache_bytes`` of device memory
        keep streamed banks' recently chosen experts between steps (expert_cache.py). ``cuda_graphs``: replay a
        binding's launches as one CUDA graph once it repeats (executable.py's module doc); False launches each
        kernel every run. ``gemm`` as the CPU's: ``"fast"`` multiplies the block types' weights with activations
        quantized to int8 blocks (the int8 GEMV and GEMM: the CPU's integer path's quantizer, __dp4a), ``"f32"``
        with the float activations (the float GEMV for every product: the CPU's exact path, slower)."""
        from uaii.backends.cuda.executable import CudaExecutable

        self.device_compile_args(options, expert_cache)
        if gemm not in GEMM_MODES:
            raise BackendError(f"[cuda] gemm must be one of {', '.join(GEMM_MODES)}, found {gemm!r}")
        graph = self.graph_to_run(graph, plan, max_tokens)
        dev = self.device()
        tokens = (plan.arena.max_tokens if plan is not None else max_tokens) or 512
        exe = CudaExecutable(graph, node_infos(graph), weights, dev, max_tokens=tokens, kv_state=kv_state,
                             streamed=streamed, chunk_bytes=chunk_bytes, host_resident=host_resident,
                             expert_cache_bytes=expert_cache_bytes, graphs=cuda_graphs, gemm=gemm,
                             arena=plan.arena if plan is not None else None)
        try:
            exe.prepare()
        except BaseException:
            exe.close()
            raise
        return exe


__all__ = ["NOT_AUTO", "CudaBackend"]

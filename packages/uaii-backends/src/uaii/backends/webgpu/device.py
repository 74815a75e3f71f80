"""WebGPU adapters and the device UAII runs on: enumeration, software-adapter policy, limits and features.

Why a policy: on Linux without a GPU, wgpu finds Mesa's lavapipe (llvmpipe), a Vulkan driver that runs shaders on
the CPU. It is correct and slow — what the tests run on, never what ``device="auto"`` should pick. A software
adapter is used only when asked for (``allow_software=True``, ``--allow-software-adapter`` or
``UAII_ALLOW_SOFTWARE_GPU=1``).

Limits are what the adapter allows, requested in full (WebGPU's defaults are far below what GPUs have: 128 MiB per
storage binding, 256 MiB per buffer, 8 storage buffers per stage). ``UAII_WEBGPU_MAX_BINDING`` lowers the storage
binding size the backend plans with, so tests can force the sharding paths on any adapter.

Subgroups: where the adapter has the ``subgroup`` feature the device requests it and :attr:`GpuDevice.subgroups`
is true; the GEMV kernels then reduce a row with ``subgroupAdd`` instead of a tree in workgroup memory
(ops/linalg.py). ``UAII_WEBGPU_SUBGROUPS=0`` forces the portable path (to compare the two, or to step around a
driver whose subgroup operations are wrong).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from uaii.backends.base import BackendError, BackendUnavailable
from uaii.backends.config import ALLOW_SOFTWARE_ENV

MAX_BINDING_ENV = "UAII_WEBGPU_MAX_BINDING"
ADAPTER_ENV = "UAII_WEBGPU_ADAPTER"
SUBGROUPS_ENV = "UAII_WEBGPU_SUBGROUPS"
SOFTWARE_NAMES = ("llvmpipe", "lavapipe", "softpipe", "swiftshader", "microsoft basic render")
COMPUTE_BACKENDS = ("Vulkan", "Metal", "D3D12")
"""Adapter backends that run compute shaders well: the only ones wgpu's instance is asked to enumerate
(:func:`_compute_instance`)."""
INSTANCE_BACKENDS = ("Vulkan", "Metal", "DX12")  # the same, as wgpu-native's instance flags spell them


KEY_LIMITS = ("max-buffer-size", "max-storage-buffer-binding-size", "max-storage-buffers-per-shader-stage",
              "max-compute-workgroup-storage-size")
"""The limits ``uaii devices`` shows: what decides sharding (binding size), kernel shape and the device budget."""
KEY_FEATURES = ("shader-f16", "subgroup", "timestamp-query")


@dataclass(frozen=True)
class AdapterInfo:
    """One adapter as ``uaii devices`` lists it. ``memory``: device-local bytes its driver reports (Vulkan only,
    through :func:`uaii.backends.gpu.vulkan_memory`; 0 unknown)."""

    index: int
    name: str
    vendor: str
    backend: str  # Vulkan, Metal, D3D12 (OpenGL: an instance someone else created)
    adapter_type: str  # DiscreteGPU, IntegratedGPU, CPU, ...
    driver: str
    software: bool
    limits: dict[str, int] = field(default_factory=dict)
    features: frozenset[str] = frozenset()
    vendor_id: int = 0
    device_id: int = 0
    memory: int = 0

    @property
    def usable(self) -> bool:
        return self.backend in COMPUTE_BACKENDS

    @property
    def device_memory(self) -> int:
        """Bytes of device memory to plan with: what the driver reports, else the largest buffer the adapter
        allows (a lower bound: WebGPU has no memory query)."""
        return self.memory or int(self.limits.get("max-buffer-size", 0))

    def describe(self) -> str:
        soft = ", software" if self.software else ""
        return f"webgpu:{self.index} {self.name} ({self.backend}, {self.adapter_type or 'unknown type'}{soft})"

    def as_dict(self) -> dict[str, Any]:
        """What ``uaii devices --json`` prints for the adapter."""
        return {"index": self.index, "name": self.name, "backend": self.backend, "vendor": self.vendor,
                "type": self.adapter_type, "software": self.software, "usable": self.usable, "driver": self.driver,
                "memory_bytes": self.memory, "device_memory_bytes": self.device_memory,
                "limits": {k: self.limits[k] for k in KEY_LIMITS if k in self.limits},
                "features": [f for f in KEY_FEATURES if f in self.features]}


def adapter_info(index: int, info: dict[str, Any], limits: dict[str, Any], features: Any,
                 memory: int = 0) -> AdapterInfo:
    """An :class:`AdapterInfo` from what wgpu reports (``adapter.info``, ``adapter.limits``, ``adapter.features``)."""
    return AdapterInfo(
        index=index, name=str(info.get("device", "") or "adapter"), vendor=str(info.get("vendor", "")),
        backend=str(info.get("backend_type", "")), adapter_type=str(info.get("adapter_type", "")),
        driver=str(info.get("description", "")), software=is_software(info),
        limits={str(k): int(v) for k, v in dict(limits).items()}, features=frozenset(str(f) for f in features),
        vendor_id=int(info.get("vendor_id", 0) or 0), device_id=int(info.get("device_id", 0) or 0), memory=memory)


def software_allowed(explicit: bool | None = None) -> bool:
    """Whether a software adapter may be used: the explicit choice, else ``$UAII_ALLOW_SOFTWARE_GPU``."""
    if explicit is not None:
        return explicit
    return os.environ.get(ALLOW_SOFTWARE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def is_software(info: dict[str, Any]) -> bool:
    """A CPU adapter (lavapipe/llvmpipe, SwiftShader, WARP) by its type or its name."""
    kind = str(info.get("adapter_type", "")).lower()
    text = " ".join(str(info.get(k, "")) for k in ("device", "vendor", "description")).lower()
    return kind == "cpu" or any(s in text for s in SOFTWARE_NAMES)


def _quiet_mesa() -> None:
    """Give Mesa's window-system code the ``XDG_RUNTIME_DIR`` it looks for (a private directory of this user under
    the temporary directory) when the environment has none: enumerating adapters otherwise prints "error:
    XDG_RUNTIME_DIR is invalid or not set" four times on stderr of a headless machine, although compute needs no
    window system."""
    current = os.environ.get("XDG_RUNTIME_DIR", "")
    if not current or not os.path.isdir(current):
        import tempfile

        path = os.path.join(tempfile.gettempdir(), f"uaii-xdg-{os.getuid() if hasattr(os, 'getuid') else 0}")
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = path


def _wgpu() -> Any:
    _quiet_mesa()
    try:
        import wgpu
    except ImportError as exc:
        raise BackendUnavailable("webgpu", "the `wgpu` package is not installed (pip install "
                                 "'uaii-backends[webgpu]')") from exc
    _compute_instance()
    return wgpu


def _compute_instance() -> None:
    """Ask wgpu-native for an instance of the compute backends only (before it creates its one instance): an
    OpenGL adapter is never used, and enumerating Mesa's (EGL + llvmpipe) loads a second LLVM into the process —
    importing torch's models afterwards then crashes the interpreter (seen with Mesa 22.3.6). Too late when
    something else in the process created the instance first: that is kept."""
    try:
        from wgpu.backends.wgpu_native.extras import set_instance_extras

        set_instance_extras(backends=list(INSTANCE_BACKENDS))
    except Exception:  # another wgpu version or backend: enumerate what it enumerates
        pass


_adapters: list[tuple[AdapterInfo, Any]] | None = None
_lock = threading.Lock()


def _enumerate() -> list[tuple[AdapterInfo, Any]]:
    global _adapters
    with _lock:
        if _adapters is None:
            wgpu = _wgpu()
            from uaii.backends.gpu import vulkan_memory

            found = []
            for i, a in enumerate(wgpu.gpu.enumerate_adapters_sync()):
                info = dict(a.info)
                memory = 0
                if info.get("backend_type") == "Vulkan":
                    memory = vulkan_memory(int(info.get("vendor_id", 0) or 0), int(info.get("device_id", 0) or 0),
                                           str(info.get("device", "")))
                found.append((adapter_info(i, info, dict(a.limits), a.features, memory), a))
            _adapters = found
        return list(_adapters)


def adapters() -> list[AdapterInfo]:
    """Every adapter wgpu enumerates (all backends, software ones included), in wgpu's order."""
    return [info for info, _ in _enumerate()]


def choose(allow_software: bool | None = None) -> tuple[AdapterInfo, Any]:
    """The adapter to run on: ``$UAII_WEBGPU_ADAPTER`` (an index) when set, else the first hardware adapter of a
    compute backend (discrete before integrated), else — only when allowed — a software one."""
    found = _enumerate()
    if not found:
        raise BackendUnavailable("webgpu", "wgpu found no adapter (no Vulkan/Metal/D3D12 driver)")
    want = os.environ.get(ADAPTER_ENV, "").strip()
    allow = software_allowed(allow_software)
    if want:
        try:
            info, adapter = found[int(want)]
        except (ValueError, IndexError):
            raise BackendError(f"[backend] {ADAPTER_ENV}={want!r} names no adapter; there are {len(found)} "
                               "(see `uaii devices`)") from None
        if info.software and not allow:
            raise BackendUnavailable("webgpu", f"{info.describe()} is a software adapter; set {ALLOW_SOFTWARE_ENV}=1 "
                                     "or pass --allow-software-adapter to use it")
        return info, adapter
    rank = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2}
    hardware = sorted((p for p in found if p[0].usable and not p[0].software),
                      key=lambda p: rank.get(p[0].adapter_type, 3))
    if hardware:
        return hardware[0]
    soft = [p for p in found if p[0].usable and p[0].software]
    if soft and allow:
        return soft[0]
    names = ", ".join(p[0].describe() for p in found)
    hint = f"; set {ALLOW_SOFTWARE_ENV}=1 or pass --allow-software-adapter to run on a software adapter" if soft else ""
    raise BackendUnavailable("webgpu", f"no hardware adapter (found: {names}){hint}")


class GpuDevice:
    """A wgpu device with every limit the adapter allows, its queue and a pipeline cache."""

    def __init__(self, info: AdapterInfo, adapter: Any) -> None:
        wgpu = _wgpu()
        self.wgpu = wgpu
        self.info = info
        wanted = [f for f in KEY_FEATURES if f in info.features]
        limits = {k: v for k, v in info.limits.items() if k.startswith("max-") or k.startswith("min-")}
        self.device = adapter.request_device_sync(required_features=wanted, required_limits=limits)
        self.queue = self.device.queue
        lim = dict(self.device.limits)
        self.max_buffer = int(lim["max-buffer-size"])
        self.max_binding = min(int(lim["max-storage-buffer-binding-size"]), self.max_buffer)
        forced = os.environ.get(MAX_BINDING_ENV, "").strip()
        if forced:
            try:
                self.max_binding = min(self.max_binding, int(forced))
            except ValueError:
                raise BackendError(f"[backend] {MAX_BINDING_ENV} must be a byte count, found {forced!r}") from None
        self.max_binding -= self.max_binding % 256
        self.offset_align = max(256, int(lim["min-storage-buffer-offset-alignment"]))
        self.max_storage_buffers = int(lim["max-storage-buffers-per-shader-stage"])
        self.max_workgroups = int(lim["max-compute-workgroups-per-dimension"])
        self.features = frozenset(str(f) for f in self.device.features)
        self._pipelines: dict[str, Any] = {}

    @property
    def has_f16(self) -> bool:
        return "shader-f16" in self.features

    @property
    def subgroups(self) -> bool:
        """Whether kernels may use subgroup operations: the device has the ``subgroup`` feature and
        ``$UAII_WEBGPU_SUBGROUPS`` is not ``0`` (read on every call, so a test can flip it for a fresh lowering)."""
        off = os.environ.get(SUBGROUPS_ENV, "").strip().lower() in ("0", "false", "no", "off")
        return "subgroup" in self.features and not off

    def pipeline(self, source: str, entry: str = "main") -> Any:
        """The compute pipeline of a WGSL module (compiled once per source text); a WGSL error names the kernel."""
        key = entry + "\0" + source
        p = self._pipelines.get(key)
        if p is None:
            try:
                module = self.device.create_shader_module(code=source)
                p = self.device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": entry})
            except Exception as exc:
                first = source.strip().splitlines()[0] if source.strip() else ""
                raise BackendError(f"[backend] webgpu: WGSL kernel {first!r} does not compile: {exc}") from exc
            self._pipelines[key] = p
        return p

    def buffer(self, nbytes: int, *, storage: bool = True, uniform: bool = False) -> Any:
        """A device buffer of ``nbytes`` (rounded up to 16) that can be written from the host and read back."""
        if nbytes > self.max_buffer:
            raise BackendError(f"[backend] webgpu: a buffer of {nbytes} bytes exceeds the adapter's max-buffer-size "
                               f"{self.max_buffer}")
        u = self.wgpu.BufferUsage
        usage = u.COPY_DST | u.COPY_SRC | (u.STORAGE if storage else 0) | (u.UNIFORM if uniform else 0)
        return self.device.create_buffer(size=max(16, -(-int(nbytes) // 16) * 16), usage=usage)


_devices: dict[int, GpuDevice] = {}


def open_device(allow_software: bool | None = None) -> GpuDevice:
    """The device of the chosen adapter (one per adapter per process)."""
    info, adapter = choose(allow_software)
    with _lock:
        dev = _devices.get(info.index)
        if dev is None:
            dev = _devices[info.index] = GpuDevice(info, adapter)
        return dev


__all__ = ["ADAPTER_ENV", "ALLOW_SOFTWARE_ENV", "KEY_FEATURES", "KEY_LIMITS", "MAX_BINDING_ENV", "SUBGROUPS_ENV",
           "AdapterInfo", "GpuDevice", "adapter_info", "adapters", "choose", "is_software", "open_device",
           "software_allowed"]

"""GPU backends: the WebGPU backend (:mod:`uaii.backends.webgpu`), the CUDA backend (:mod:`uaii.backends.cuda`)
and honest device probes for ROCm, Vulkan and Metal (no executor of their own yet).

Each probe creates a context through the vendor's own driver library (loaded with ctypes, so no SDK is needed at
build time) and enumerates physical devices; software devices (llvmpipe, SwiftShader, CPU adapters) do not count.
A probe never raises: every failure becomes ``DeviceStatus(False, reason)``.

The probe-only backends report ``available=False`` even when they find devices — with the devices listed and the
reason — so ``select_device("auto")`` passes them by. WebGPU runs on Vulkan, Metal or D3D12 adapters; its probe
(imported from uaii.backends.webgpu, which imports ``wgpu`` only when it enumerates) says "not installed" without
the package. :func:`vulkan_memory` reads a Vulkan device's local heap, the device memory WebGPU does not report.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable
from dataclasses import dataclass

from uaii.backends.base import BackendBase, DeviceStatus
from uaii.backends.cuda.backend import CudaBackend
from uaii.backends.webgpu.backend import WebGpuBackend

NO_EXECUTOR = "the {name} backend is a device probe only in this release (no GPU executor is built)"


def _load(names: tuple[str, ...]) -> tuple[ctypes.CDLL | None, str]:
    """The first driver library that loads, or None and why none did."""
    first = ""
    for n in names:
        try:
            return ctypes.CDLL(n), ""
        except OSError as exc:
            first = first or (f"{n} not found" if "cannot open shared object" in str(exc) else f"{n}: {exc}")
    return None, first


class GpuProbeBackend(BackendBase):
    """A GPU backend whose probe enumerates devices; ``EXECUTES`` says whether it can run graphs."""

    kind = "gpu"
    EXECUTES = False
    sdk = ""

    def enumerate(self) -> tuple[list[str], str]:
        """(device names, reason when there are none)."""
        raise NotImplementedError

    def probe(self) -> DeviceStatus:
        try:
            devices, why = self.enumerate()
        except Exception as exc:  # a probe must never take the process down with it
            return DeviceStatus(False, f"probe failed: {type(exc).__name__}: {exc}")
        if not devices:
            return DeviceStatus(False, why or "no device found")
        if not self.EXECUTES:
            return DeviceStatus(False, f"found {', '.join(devices)}; " + NO_EXECUTOR.format(name=self.name),
                                devices)
        return DeviceStatus(True, "", devices)


def cuda_devices() -> tuple[list[str], str]:
    """The CUDA devices the driver reports (``cuda:<i> <name>``), or none and why — through ctypes on libcuda, so
    the probe needs no package (the CUDA backend, :mod:`uaii.backends.cuda.backend`, runs on them)."""
    lib, err = _load(("libcuda.so.1", "libcuda.so", "nvcuda.dll"))
    if lib is None:
        return [], f"the NVIDIA driver (libcuda.so.1) is not installed ({err})"
    rc = lib.cuInit(0)
    if rc != 0:
        return [], f"cuInit failed with CUresult {rc}" + (" (CUDA_ERROR_NO_DEVICE)" if rc == 100 else "")
    count = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0:
        return [], f"cuDeviceGetCount failed with CUresult {rc}"
    names = []
    for i in range(count.value):
        dev = ctypes.c_int(0)
        buf = ctypes.create_string_buffer(256)
        if lib.cuDeviceGet(ctypes.byref(dev), i) == 0 and lib.cuDeviceGetName(buf, 256, dev) == 0:
            names.append(f"cuda:{i} {buf.value.decode(errors='replace')}")
        else:
            names.append(f"cuda:{i}")
    return names, "the driver reports 0 CUDA devices"


class RocmBackend(GpuProbeBackend):
    name = "rocm"
    sdk = "the ROCm HIP runtime (libamdhip64.so)"

    def enumerate(self) -> tuple[list[str], str]:
        lib, err = _load(("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"))
        if lib is None:
            return [], f"{self.sdk} is not installed ({err})"
        if lib.hipInit(0) != 0:
            return [], "hipInit failed (no AMD GPU or no kernel driver)"
        count = ctypes.c_int(0)
        rc = lib.hipGetDeviceCount(ctypes.byref(count))
        if rc != 0:
            return [], f"hipGetDeviceCount failed with hipError {rc}"
        names = []
        for i in range(count.value):
            buf = ctypes.create_string_buffer(256)
            ok = lib.hipDeviceGetName(buf, 256, i) == 0
            names.append(f"rocm:{i} {buf.value.decode(errors='replace')}" if ok else f"rocm:{i}")
        return names, "the HIP runtime reports 0 devices"


class _VkInstanceCreateInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int32), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),  # noqa: RUF012
                ("pApplicationInfo", ctypes.c_void_p), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


VK_TYPES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}
VK_LIBS = ("libvulkan.so.1", "libvulkan.so", "vulkan-1.dll", "libvulkan.1.dylib")
VK_HEAP_DEVICE_LOCAL = 1


@dataclass(frozen=True)
class VkDevice:
    """A Vulkan physical device: its index, name, type (VK_TYPES), PCI ids and device-local bytes (0: not read)."""

    index: int
    name: str
    type: int
    vendor_id: int
    device_id: int
    local_bytes: int = 0


def device_local_bytes(raw: bytes) -> int:
    """The largest device-local heap of a ``VkPhysicalDeviceMemoryProperties`` (memoryTypeCount at 0, 32 types of
    8 bytes, memoryHeapCount at 260, 16 heaps of {u64 size, u32 flags, pad} from 264)."""
    n = min(int.from_bytes(raw[260:264], "little"), 16)
    best = 0
    for h in range(n):
        off = 264 + 16 * h
        if int.from_bytes(raw[off + 8:off + 12], "little") & VK_HEAP_DEVICE_LOCAL:
            best = max(best, int.from_bytes(raw[off:off + 8], "little"))
    return best


def _vk_devices(lib: ctypes.CDLL, with_memory: bool = False) -> tuple[list[VkDevice], str]:
    """Every physical device of a Vulkan instance, or why there is no instance."""
    info = _VkInstanceCreateInfo(sType=1)  # VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO
    instance = ctypes.c_void_p()
    rc = lib.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance))
    if rc != 0:
        return [], f"vkCreateInstance failed with VkResult {rc} (no Vulkan driver / ICD)"
    try:
        count = ctypes.c_uint32(0)
        lib.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        handles = (ctypes.c_void_p * max(count.value, 1))()
        lib.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        found = []
        for i in range(count.value):
            props = ctypes.create_string_buffer(4096)  # VkPhysicalDeviceProperties is < 1 KiB
            lib.vkGetPhysicalDeviceProperties(ctypes.c_void_p(handles[i]), props)
            raw = props.raw
            local = 0
            if with_memory:
                mem = ctypes.create_string_buffer(1024)  # VkPhysicalDeviceMemoryProperties is 520 bytes
                lib.vkGetPhysicalDeviceMemoryProperties(ctypes.c_void_p(handles[i]), mem)
                local = device_local_bytes(mem.raw)
            found.append(VkDevice(i, raw[20:276].split(b"\0", 1)[0].decode(errors="replace"),
                                  int.from_bytes(raw[16:20], "little"), int.from_bytes(raw[8:12], "little"),
                                  int.from_bytes(raw[12:16], "little"), local))
    finally:
        lib.vkDestroyInstance(instance, None)
    return found, ""


def vulkan_memory(vendor_id: int, device_id: int, name: str) -> int:
    """Device-local bytes of the Vulkan device with these PCI ids and this name, 0 when there is no Vulkan loader
    or no such device. WebGPU reports no memory size (its max-buffer-size is a per-buffer cap, 2 GiB on Linux
    whatever the card), so the WebGPU backend asks Vulkan for the adapter it runs on. Never raises."""
    try:
        lib, _ = _load(VK_LIBS)
        if lib is None:
            return 0
        devices, _ = _vk_devices(lib, with_memory=True)
    except Exception:  # a memory query must not take the process down with it
        return 0
    for d in devices:
        if (d.vendor_id, d.device_id, d.name) == (vendor_id, device_id, name):
            return d.local_bytes
    return 0


class VulkanBackend(GpuProbeBackend):
    name = "vulkan"
    sdk = "the Vulkan loader (libvulkan.so.1)"

    def enumerate(self) -> tuple[list[str], str]:
        lib, err = _load(VK_LIBS)
        if lib is None:
            return [], f"{self.sdk} is not installed ({err})"
        devices, why = _vk_devices(lib)
        if why:
            return [], why
        names = [f"vulkan:{d.index} {d.name} ({VK_TYPES.get(d.type)})" for d in devices if d.type != 4]
        software = [f"vulkan:{d.index} {d.name} ({VK_TYPES.get(d.type)})" for d in devices if d.type == 4]
        return names, "no physical Vulkan device" + (f"; software only: {', '.join(software)}" if software else "")


class MetalBackend(GpuProbeBackend):
    name = "metal"
    sdk = "Metal.framework"

    def enumerate(self) -> tuple[list[str], str]:
        if sys.platform != "darwin":
            return [], f"Metal exists only on macOS (this is {sys.platform})"
        path = ctypes.util.find_library("Metal") or "/System/Library/Frameworks/Metal.framework/Metal"
        lib, err = _load((path,))
        if lib is None:
            return [], f"{self.sdk} cannot be loaded ({err})"
        lib.MTLCreateSystemDefaultDevice.restype = ctypes.c_void_p
        dev = lib.MTLCreateSystemDefaultDevice()
        return (["metal:0 system default device"] if dev else []), "MTLCreateSystemDefaultDevice returned nil"


GPU_BACKENDS: dict[str, Callable[[], BackendBase]] = {
    "cuda": CudaBackend, "rocm": RocmBackend, "metal": MetalBackend, "vulkan": VulkanBackend,
    "webgpu": WebGpuBackend,
}

__all__ = [
    "GPU_BACKENDS",
    "VK_TYPES",
    "CudaBackend",
    "GpuProbeBackend",
    "MetalBackend",
    "RocmBackend",
    "VkDevice",
    "VulkanBackend",
    "WebGpuBackend",
    "cuda_devices",
    "device_local_bytes",
    "vulkan_memory",
]

"""GPU backends: honest device probes for CUDA, ROCm, Vulkan, Metal and WebGPU (no GPU execution yet).

Each probe creates a context through the vendor's own driver library (loaded with ctypes, so no SDK is needed at
build time) and enumerates physical devices; software devices (llvmpipe, SwiftShader, CPU adapters) do not count.
A probe never raises: every failure becomes ``DeviceStatus(False, reason)``.

None of these backends executes graphs in this release, so a probe that finds devices still reports
``available=False`` — with the devices listed and the reason — and ``select_device("auto")`` falls back to the CPU,
saying why. When a backend gains an executor, its ``EXECUTES`` flag turns on and a device makes it available.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable

from uaii.backends.base import BackendBase, DeviceStatus

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


class CudaBackend(GpuProbeBackend):
    name = "cuda"
    sdk = "the NVIDIA driver (libcuda.so.1)"

    def enumerate(self) -> tuple[list[str], str]:
        lib, err = _load(("libcuda.so.1", "libcuda.so", "nvcuda.dll"))
        if lib is None:
            return [], f"{self.sdk} is not installed ({err})"
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


class VulkanBackend(GpuProbeBackend):
    name = "vulkan"
    sdk = "the Vulkan loader (libvulkan.so.1)"

    def enumerate(self) -> tuple[list[str], str]:
        lib, err = _load(("libvulkan.so.1", "libvulkan.so", "vulkan-1.dll", "libvulkan.1.dylib"))
        if lib is None:
            return [], f"{self.sdk} is not installed ({err})"
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
            names: list[str] = []
            software: list[str] = []
            for i in range(count.value):
                props = ctypes.create_string_buffer(4096)  # VkPhysicalDeviceProperties is < 1 KiB
                lib.vkGetPhysicalDeviceProperties(ctypes.c_void_p(handles[i]), props)
                dev_type = int.from_bytes(props.raw[16:20], "little")
                name = props.raw[20:276].split(b"\0", 1)[0].decode(errors="replace")
                (software if dev_type == 4 else names).append(f"vulkan:{i} {name} ({VK_TYPES.get(dev_type)})")
        finally:
            lib.vkDestroyInstance(instance, None)
        why = "no physical Vulkan device" + (f"; software only: {', '.join(software)}" if software else "")
        return names, why


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


class WebGpuBackend(GpuProbeBackend):
    name = "webgpu"
    sdk = "wgpu-native (the `wgpu` Python package)"

    def enumerate(self) -> tuple[list[str], str]:
        try:
            import wgpu
        except ImportError:
            return [], f"{self.sdk} is not installed"
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            return [], "wgpu found no adapter"
        info = dict(getattr(adapter, "info", {}) or {})
        if str(info.get("adapter_type", "")).lower() == "cpu":
            return [], f"only a software adapter: {info.get('device', '?')}"
        return [f"webgpu:0 {info.get('device', 'adapter')} ({info.get('backend_type', '?')})"], ""


GPU_BACKENDS: dict[str, Callable[[], GpuProbeBackend]] = {
    "cuda": CudaBackend, "rocm": RocmBackend, "metal": MetalBackend, "vulkan": VulkanBackend,
    "webgpu": WebGpuBackend,
}

__all__ = ["GPU_BACKENDS", "CudaBackend", "GpuProbeBackend", "MetalBackend", "RocmBackend", "VulkanBackend",
           "WebGpuBackend"]

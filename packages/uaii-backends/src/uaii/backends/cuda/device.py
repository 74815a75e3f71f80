"""One CUDA device through the driver API (``cuda.bindings.driver``): its primary context, kernel modules loaded
from the CUBINs of :mod:`uaii.backends.cuda.nvrtc`, device buffers, copies and launches.

Why the driver API and not the runtime or a framework: it needs only the driver (libcuda) that every NVIDIA system
has, loads the CUBINs NVRTC made without a toolkit, and keeps the process free of torch and cupy. Every call's
status is checked: a failure raises BackendError naming the call and the driver's error, never a later wrong result.
The kernel tests that need a device (tests/backends/test_cuda_kernels.py) run through this class; without a device
they skip with "no CUDA device".
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from uaii.backends.base import BackendError
from uaii.backends.cuda.geometry import Launch
from uaii.backends.cuda.nvrtc import ARCHS, EXTRA, compile_module


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise BackendError(f"[cuda] cuda-bindings is not installed ({exc.name or exc}): {EXTRA}") from None
    return driver


def _init(cu: Any) -> None:
    """cuInit, or BackendError: without a driver cuda-bindings raises its own error from the library search."""
    try:
        result = cu.cuInit(0)
    except Exception as exc:  # DynamicLibNotFoundError and the like: no libcuda on this machine
        raise BackendError(f"[cuda] no NVIDIA driver: {exc}") from None
    _ok(cu, result, "cuInit")


def _ok(cu: Any, result: Any, what: str) -> Any:
    """The values of a cuda-bindings call (its first item is the status), or BackendError."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise BackendError(f"[cuda] {what} failed: {name.decode() if isinstance(name, bytes) else err}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def arch_for(major: int, minor: int) -> str:
    """The kernels' architecture for a device of compute capability major.minor: the same major and the highest
    minor not above the device's (a CUBIN runs on later minors of its major), e.g. 8.9 -> sm_89, 8.7 -> sm_86."""
    fits = [a for a in ARCHS if int(a[3:-1]) == major and int(a[-1]) <= minor]
    if not fits:
        raise BackendError(f"[cuda] compute capability {major}.{minor}: the kernels are built for "
                           f"{', '.join(ARCHS)} (Ampere and later)")
    return max(fits, key=lambda a: int(a[-1]))


@dataclass
class DeviceBuffer:
    """Device memory of ``nbytes`` bytes at ``ptr`` (freed by :meth:`CudaDevice.free` or when the device closes)."""

    ptr: int
    nbytes: int


@dataclass
class CudaDevice:
    """Device ``index``: its name, compute capability, memory, and the modules loaded on it."""

    index: int = 0
    name: str = ""
    capability: tuple[int, int] = (0, 0)
    total_bytes: int = 0
    _ctx: Any = None
    _dev: Any = None
    _modules: dict[str, Any] = field(default_factory=dict)
    _functions: dict[tuple[str, str], Any] = field(default_factory=dict)
    _buffers: dict[int, DeviceBuffer] = field(default_factory=dict)

    @classmethod
    def open(cls, index: int = 0) -> CudaDevice:
        cu = _driver()
        _init(cu)
        count = _ok(cu, cu.cuDeviceGetCount(), "cuDeviceGetCount")
        if not 0 <= index < count:
            raise BackendError(f"[cuda] no CUDA device {index} ({count} found)")
        dev = _ok(cu, cu.cuDeviceGet(index), "cuDeviceGet")
        name = _ok(cu, cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
        attr = cu.CUdevice_attribute
        major = _ok(cu, cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "attribute")
        minor = _ok(cu, cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "attribute")
        total = _ok(cu, cu.cuDeviceTotalMem(dev), "cuDeviceTotalMem")
        ctx = _ok(cu, cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _ok(cu, cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        text = bytes(name).split(b"\0", 1)[0].decode("utf-8", "replace")
        return cls(index, text, (int(major), int(minor)), int(total), ctx, dev)

    @property
    def arch(self) -> str:
        return arch_for(*self.capability)

    def function(self, module: str, kernel: str) -> Any:
        """Kernel ``kernel`` of module ``module``, compiled (or taken from the disk cache) and loaded once."""
        key = (module, kernel)
        if key not in self._functions:
            cu = _driver()
            if module not in self._modules:
                cubin = compile_module(module, self.arch).cubin
                self._modules[module] = _ok(cu, cu.cuModuleLoadData(cubin), f"cuModuleLoadData({module})")
            self._functions[key] = _ok(cu, cu.cuModuleGetFunction(self._modules[module], kernel.encode()),
                                       f"cuModuleGetFunction({kernel})")
        return self._functions[key]

    def alloc(self, nbytes: int) -> DeviceBuffer:
        cu = _driver()
        ptr = _ok(cu, cu.cuMemAlloc(max(int(nbytes), 1)), f"cuMemAlloc({nbytes})")
        buf = DeviceBuffer(int(ptr), int(nbytes))
        self._buffers[buf.ptr] = buf
        return buf

    def free(self, buf: DeviceBuffer) -> None:
        if self._buffers.pop(buf.ptr, None) is not None:
            cu = _driver()
            _ok(cu, cu.cuMemFree(buf.ptr), "cuMemFree")

    def upload(self, array: np.ndarray) -> DeviceBuffer:
        a = np.ascontiguousarray(array)
        buf = self.alloc(a.nbytes)
        cu = _driver()
        _ok(cu, cu.cuMemcpyHtoD(buf.ptr, a.ctypes.data, a.nbytes), "cuMemcpyHtoD")
        return buf

    def download(self, buf: DeviceBuffer, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        out = np.empty(shape, dtype)
        if out.nbytes > buf.nbytes:
            raise BackendError(f"[cuda] {out.nbytes} bytes asked of a {buf.nbytes}-byte buffer")
        cu = _driver()
        _ok(cu, cu.cuMemcpyDtoH(out.ctypes.data, buf.ptr, out.nbytes), "cuMemcpyDtoH")
        return out

    def launch(self, module: str, kernel: str, at: Launch, *args: Any) -> None:
        """Run ``kernel`` with ``args``: DeviceBuffer (a pointer) or a ctypes scalar (c_int, c_longlong, c_float),
        in the kernel's parameter order; returns when the launch is queued (:meth:`synchronize` waits)."""
        cu = _driver()
        fn = self.function(module, kernel)
        held = [ctypes.c_uint64(a.ptr) if isinstance(a, DeviceBuffer) else a for a in args]
        for a in held:
            if not isinstance(a, ctypes._SimpleCData):
                raise BackendError(f"[cuda] {kernel}: argument {a!r} is neither a DeviceBuffer nor a ctypes scalar")
        params = np.array([ctypes.addressof(a) for a in held] or [0], dtype=np.uint64)
        _ok(cu, cu.cuLaunchKernel(fn, *at.grid, *at.block, at.shared, 0, params.ctypes.data, 0), f"launch {kernel}")

    def synchronize(self) -> None:
        cu = _driver()
        _ok(cu, cu.cuCtxSynchronize(), "cuCtxSynchronize")

    def close(self) -> None:
        """Free every buffer, unload the modules and release the primary context (idempotent)."""
        if self._ctx is None:
            return
        cu = _driver()
        for buf in list(self._buffers.values()):
            self.free(buf)
        for mod in self._modules.values():
            cu.cuModuleUnload(mod)
        self._modules.clear()
        self._functions.clear()
        cu.cuDevicePrimaryCtxRelease(self._dev)
        self._ctx = None

    def __enter__(self) -> CudaDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def device_count() -> int:
    """CUDA devices the driver reports (0 without a driver or without cuda-bindings)."""
    try:
        cu = _driver()
        _init(cu)
        return int(_ok(cu, cu.cuDeviceGetCount(), "cuDeviceGetCount"))
    except BackendError:
        return 0


__all__ = ["CudaDevice", "DeviceBuffer", "arch_for", "device_count"]

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
from uaii.backends.cuda.sources import check_args


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


def _on(stream: Any) -> Any:
    """The stream handle a call takes: the legacy default stream (0) for None."""
    return 0 if stream is None else stream


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
    _pinned: dict[int, int] = field(default_factory=dict)
    _streams: list[Any] = field(default_factory=list)
    _events: list[Any] = field(default_factory=list)
    _capturing: set[int] = field(default_factory=set)  # streams in graph capture (by handle)
    _graphs: dict[int, Any] = field(default_factory=dict)  # instantiated graphs not yet destroyed
    _deferred: list[Any] = field(default_factory=list)  # frees asked for during a capture (a collected KV state)

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
        """Free after the queued work (which may still read it) is done: frees are rare (a buffer grows, an
        executable or a state closes), so the synchronization costs nothing that matters."""
        if self._buffers.pop(buf.ptr, None) is not None:
            if self._capturing:  # synchronizing would break the capture: freed when it ends
                self._deferred.append(("device", buf.ptr))
                return
            cu = _driver()
            _ok(cu, cu.cuCtxSynchronize(), "cuCtxSynchronize")
            _ok(cu, cu.cuMemFree(buf.ptr), "cuMemFree")

    def alloc_host(self, nbytes: int) -> np.ndarray:
        """Page-locked host memory (cuMemHostAlloc): what an asynchronous host -> device copy reads from while the
        host goes on (pageable memory would make the driver copy it synchronously)."""
        cu = _driver()
        n = max(int(nbytes), 1)
        ptr = int(_ok(cu, cu.cuMemHostAlloc(n, 0), f"cuMemHostAlloc({n})"))
        array = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))
        self._pinned[ptr] = n  # by address: an id() of an array dropped unfreed is reused, and its memory was lost
        return array

    def free_host(self, array: np.ndarray) -> None:
        """Free a buffer of :meth:`alloc_host` (the array it returned; anything else is refused). After
        :meth:`close`, which freed them all, nothing to do."""
        if self._ctx is None:
            return
        ptr = int(array.__array_interface__["data"][0])
        if self._pinned.pop(ptr, None) is None:
            raise BackendError(f"[cuda] free_host of {ptr:#x}: not a page-locked buffer of this device (or freed)")
        if self._capturing:
            self._deferred.append(("host", ptr))
        else:
            cu = _driver()
            _ok(cu, cu.cuCtxSynchronize(), "cuCtxSynchronize")  # a queued copy may still read it
            _ok(cu, cu.cuMemFreeHost(ptr), "cuMemFreeHost")

    def upload(self, array: np.ndarray) -> DeviceBuffer:
        a = np.ascontiguousarray(array)
        buf = self.alloc(a.nbytes)
        cu = _driver()
        _ok(cu, cu.cuMemcpyHtoD(buf.ptr, a.ctypes.data, a.nbytes), "cuMemcpyHtoD")
        return buf

    def download(self, buf: DeviceBuffer | int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        out = np.empty(shape, dtype)
        if isinstance(buf, DeviceBuffer) and out.nbytes > buf.nbytes:
            raise BackendError(f"[cuda] {out.nbytes} bytes asked of a {buf.nbytes}-byte buffer")
        cu = _driver()
        ptr = buf.ptr if isinstance(buf, DeviceBuffer) else int(buf)
        _ok(cu, cu.cuCtxSynchronize(), "cuCtxSynchronize")
        _ok(cu, cu.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes), "cuMemcpyDtoH")
        return out

    # --- streams and events (the executor's compute stream and its weight copy stream) ---------------------------
    def stream(self) -> Any:
        cu = _driver()
        s = _ok(cu, cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self._streams.append(s)
        return s

    def event(self) -> Any:
        cu = _driver()
        e = _ok(cu, cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        self._events.append(e)
        return e

    def record(self, event: Any, stream: Any = None) -> None:
        cu = _driver()
        _ok(cu, cu.cuEventRecord(event, _on(stream)), "cuEventRecord")

    def wait(self, stream: Any, event: Any) -> None:
        cu = _driver()
        _ok(cu, cu.cuStreamWaitEvent(_on(stream), event, 0), "cuStreamWaitEvent")

    def sync_event(self, event: Any) -> None:
        cu = _driver()
        _ok(cu, cu.cuEventSynchronize(event), "cuEventSynchronize")

    def sync_stream(self, stream: Any = None) -> None:
        cu = _driver()
        _ok(cu, cu.cuStreamSynchronize(_on(stream)), "cuStreamSynchronize")

    def copy_htod(self, dst: int, src: np.ndarray, stream: Any = None) -> None:
        """Queue a copy of ``src`` (page-locked: :meth:`alloc_host`; kept alive until the stream passes it)."""
        cu = _driver()
        _ok(cu, cu.cuMemcpyHtoDAsync(int(dst), src.ctypes.data, src.nbytes, _on(stream)), "cuMemcpyHtoDAsync")

    def copy_dtoh(self, dst: np.ndarray, src: int, stream: Any = None) -> None:
        cu = _driver()
        _ok(cu, cu.cuMemcpyDtoHAsync(dst.ctypes.data, int(src), dst.nbytes, _on(stream)), "cuMemcpyDtoHAsync")

    def copy_dtod(self, dst: int, src: int, nbytes: int, stream: Any = None) -> None:
        cu = _driver()
        _ok(cu, cu.cuMemcpyDtoDAsync(int(dst), int(src), int(nbytes), _on(stream)), "cuMemcpyDtoDAsync")

    # --- CUDA graphs (the executor replays a binding's launches as one) -----------------------------------------
    def begin_capture(self, stream: Any) -> None:
        """Record what is queued on ``stream`` from now on into a graph instead of running it. Thread-local mode:
        a call of this thread that could synchronize with the capture (an allocation's free, a host wait) fails
        with an error instead of being recorded wrong."""
        cu = _driver()
        _ok(cu, cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
            "cuStreamBeginCapture")
        self._capturing.add(int(stream))

    def capturing(self, stream: Any) -> bool:
        return int(stream) in self._capturing

    def end_capture(self, stream: Any) -> Any:
        """End the capture and instantiate what it recorded (the graph itself is dropped: the instance is
        independent of it)."""
        cu = _driver()
        self._capturing.discard(int(stream))
        try:
            graph = _ok(cu, cu.cuStreamEndCapture(stream), "cuStreamEndCapture")
            try:
                exe = _ok(cu, cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
            finally:
                cu.cuGraphDestroy(graph)
        finally:
            self._free_deferred()
        self._graphs[int(exe)] = exe
        return exe

    def _free_deferred(self) -> None:
        if not self._deferred or self._capturing:
            return
        cu = _driver()
        _ok(cu, cu.cuCtxSynchronize(), "cuCtxSynchronize")
        while self._deferred:
            kind, ptr = self._deferred.pop()
            _ok(cu, cu.cuMemFree(ptr) if kind == "device" else cu.cuMemFreeHost(ptr), f"free of {ptr:#x}")

    def graph_launch(self, graph: Any, stream: Any) -> None:
        cu = _driver()
        _ok(cu, cu.cuGraphLaunch(graph, stream), "cuGraphLaunch")

    def graph_destroy(self, graph: Any) -> None:
        """Destroy an instantiated graph (one still running is freed when it completes)."""
        if self._graphs.pop(int(graph), None) is not None:
            cu = _driver()
            _ok(cu, cu.cuGraphExecDestroy(graph), "cuGraphExecDestroy")

    def launch(self, module: str, kernel: str, at: Launch, *args: Any, stream: Any = None) -> None:
        """Queue ``kernel`` with ``args`` on ``stream`` (default: the null stream): DeviceBuffer or
        ``ctypes.c_uint64`` for a pointer, ``c_int``/``c_longlong``/``c_float`` for the scalars, in the kernel's
        parameter order — checked against :func:`uaii.backends.cuda.sources.signature` before the launch."""
        check_args(module, kernel, args)
        cu = _driver()
        fn = self.function(module, kernel)
        held = [ctypes.c_uint64(a.ptr) if isinstance(a, DeviceBuffer) else a for a in args]
        params = np.array([ctypes.addressof(a) for a in held] or [0], dtype=np.uint64)
        _ok(cu, cu.cuLaunchKernel(fn, *at.grid, *at.block, at.shared, _on(stream), params.ctypes.data, 0),
            f"launch {kernel}")

    def synchronize(self) -> None:
        cu = _driver()
        _ok(cu, cu.cuCtxSynchronize(), "cuCtxSynchronize")

    def close(self) -> None:
        """Free every buffer, unload the modules and release the primary context (idempotent)."""
        if self._ctx is None:
            return
        cu = _driver()
        cu.cuCtxSynchronize()
        for g in self._graphs.values():
            cu.cuGraphExecDestroy(g)
        self._graphs.clear()
        for buf in list(self._buffers.values()):
            self.free(buf)
        for ptr in self._pinned:
            cu.cuMemFreeHost(ptr)
        self._pinned.clear()
        for e in self._events:
            cu.cuEventDestroy(e)
        for st in self._streams:
            cu.cuStreamDestroy(st)
        self._events.clear()
        self._streams.clear()
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


def first_device() -> CudaDevice | None:
    """CUDA device 0, opened; None without cuda-bindings, a driver or a device (the tests skip "no CUDA device")."""
    import importlib.util

    if importlib.util.find_spec("cuda.bindings") is None or device_count() == 0:
        return None
    return CudaDevice.open(0)


__all__ = ["CudaDevice", "DeviceBuffer", "arch_for", "device_count", "first_device"]

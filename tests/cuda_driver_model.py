"""A model of the CUDA driver (libcuda.so.1) under cuda-bindings, so that CudaDevice itself runs without a GPU.

Why: the host model of a device (uaii.backends.cuda.host.HostDevice) stands in for CudaDevice, so everything above
the device is tested in CI — but CudaDevice, the one class that talks to the driver, ran nowhere before a GPU was
lent: a wrong argument to a cuda-bindings call, a result unpacked wrong, kernel parameters packed wrong for
cuLaunchKernel, a handle used after it was destroyed would all surface first on the device, in minutes that are
scarce. :func:`install` loads a C library (cuda_driver_model.c) with the soname ``libcuda.so.1`` before
cuda-bindings looks for the driver; cuda-bindings finds it already loaded, takes its entry points from its
cuGetProcAddress, and every driver call CudaDevice makes goes through cuda-bindings' real argument conversion into
:class:`DriverModel`, which runs it on a HostDevice. ``first_device()`` then opens a CudaDevice, and the tests
that run on a GPU (their "cuda" variants) run on this model instead of skipping.

What the model checks that a GPU would too: the ELF image given to cuModuleLoadData is the CUBIN NVRTC builds for
the module that defines the kernel asked for (sm_90, the model reports compute capability 9.0); a launch's kernel
parameters, read through the void** array as the kernel's signature says (sources.signature), have the values
CudaDevice meant; the block (at most 1024 threads), grid and dynamic shared memory (48 KiB unless
cuFuncSetAttribute raised it, 227 KiB at most) limits; handles of the right kind and still alive; cuInit and a
current context before use; a stream capture of the legacy stream refused; events made without timing refuse
cuEventElapsedTime. What it adds: when the context is released, every allocation, page-locked buffer, stream,
event, module and graph made in it must have been freed (:attr:`DriverModel.leaks`). Each failure is returned as
the driver's error code and kept with its reason in :attr:`DriverModel.errors` (printed to stderr).

What it cannot check: the kernels on real hardware (races, speed, the device's math library): that is the GPU run.

Use: ``UAII_CUDA_DRIVER_MODEL=compiled pytest ...`` (tests/conftest.py calls :func:`install`; the value is the
HostDevice's ``kernels``), or ``make check-cuda-model``.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from uaii.backends.base import BackendError
from uaii.backends.cuda.device import DeviceBuffer
from uaii.backends.cuda.geometry import Launch
from uaii.backends.cuda.host import HostDevice, HostEvent, HostGraph, HostStream
from uaii.backends.cuda.sources import MODULES, signature

SOURCE = Path(__file__).with_suffix(".c")
ENV = "UAII_CUDA_DRIVER_MODEL"
NAME = "UAII model of a CUDA driver (HostDevice)"
CAPABILITY = (9, 0)
DRIVER_VERSION = 13000

# status codes (cuda.h)
SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, NOT_INITIALIZED = 0, 1, 2, 3
INVALID_DEVICE, INVALID_IMAGE, INVALID_CONTEXT, INVALID_HANDLE, NOT_FOUND = 101, 200, 201, 400, 500
NOT_READY, ILLEGAL_ADDRESS, OUT_OF_RESOURCES, CAPTURE_UNSUPPORTED, UNKNOWN = 600, 700, 701, 900, 999

ATTRIBUTE_CC_MAJOR, ATTRIBUTE_CC_MINOR = 75, 76
FUNC_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
EVENT_DISABLE_TIMING = 2
SHARED_DEFAULT, SHARED_OPT_IN = 48 << 10, 227 << 10  # without and with cuFuncSetAttribute (sm_90)
EM_CUDA = 190
ARCH = "sm_90"


class DriverError(Exception):
    """A driver call the model refuses: its status code and why."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


@dataclass
class _Function:
    owner: int  # the module handle
    module: str
    kernel: str
    max_dynamic_shared: int = SHARED_DEFAULT


@dataclass
class _Event:
    host: HostEvent
    timing: bool


@dataclass
class DriverModel:
    """The driver's state: handles by kind (each kind its own range of values, so one passed as another is
    CUDA_ERROR_INVALID_HANDLE), the HostDevice that runs the work, and what went wrong."""

    device: HostDevice
    initialized: bool = False
    current: bool = False
    retained: int = 0
    errors: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    _handles: dict[int, tuple[str, Any]] = field(default_factory=dict)
    _next: dict[str, int] = field(default_factory=dict)
    _buffers: dict[int, DeviceBuffer] = field(default_factory=dict)
    _pinned: dict[int, np.ndarray] = field(default_factory=dict)
    _cubins: dict[str, bytes] = field(default_factory=dict)

    KINDS: ClassVar[dict[str, int]] = {"context": 0xC0, "module": 0x10, "function": 0x20, "stream": 0x30,
                                       "event": 0x40, "graph": 0x50, "exec": 0x60}

    # --- dispatch ----------------------------------------------------------------------------------------------
    def call(self, name: str, args: list[int]) -> int:
        """Run driver call ``name`` with its words; the status code (never an exception: it returns into C)."""
        self.calls[name] = self.calls.get(name, 0) + 1
        try:
            if name not in ("cuInit", "cuDriverGetVersion") and not self.initialized:
                raise DriverError(NOT_INITIALIZED, "cuInit has not been called")
            if name not in _NO_CONTEXT and not self.current:
                raise DriverError(INVALID_CONTEXT, "no current context (cuCtxSetCurrent)")
            getattr(self, "_" + name)(*args)
            return SUCCESS
        except DriverError as exc:
            return self._fail(name, exc.code, str(exc))
        except BackendError as exc:  # the host model refused: a capture broken, memory out of bounds, ...
            text = str(exc)
            code = (OUT_OF_MEMORY if "OUT_OF_MEMORY" in text else CAPTURE_UNSUPPORTED if "captur" in text
                    else ILLEGAL_ADDRESS if "not inside one allocation" in text else UNKNOWN)
            return self._fail(name, code, text)
        except Exception as exc:  # a bug of the model or of a reference: named, not swallowed
            return self._fail(name, UNKNOWN, f"{type(exc).__name__}: {exc}")

    def _fail(self, name: str, code: int, why: str) -> int:
        line = f"{name}: error {code}: {why}"
        self.errors.append(line)
        print(f"[cuda driver model] {line}", file=sys.stderr)
        return code

    def _new(self, kind: str, value: Any) -> int:
        n = self._next.get(kind, 0) + 1
        self._next[kind] = n
        handle = (self.KINDS[kind] << 32) | n
        self._handles[handle] = (kind, value)
        return handle

    def _get(self, kind: str, handle: int) -> Any:
        got = self._handles.get(handle)
        if got is None or got[0] != kind:
            what = "destroyed or never made" if got is None else f"a {got[0]}"
            raise DriverError(INVALID_HANDLE, f"{handle:#x} is not a live {kind} ({what})")
        return got[1]

    def _drop(self, kind: str, handle: int) -> Any:
        value = self._get(kind, handle)
        del self._handles[handle]
        return value

    def _stream(self, handle: int) -> HostStream | None:
        """The legacy default stream (0, or CU_STREAM_LEGACY = 1) is the HostDevice's stream 0."""
        return None if handle in (0, 1) else self._get("stream", handle)

    # --- device and context ------------------------------------------------------------------------------------
    def _cuInit(self, flags: int) -> None:
        if flags != 0:
            raise DriverError(INVALID_VALUE, f"cuInit flags must be 0, given {flags}")
        self.initialized = True

    def _cuDriverGetVersion(self, out: int) -> None:
        ctypes.c_int.from_address(out).value = DRIVER_VERSION

    def _cuDeviceGetCount(self, out: int) -> None:
        ctypes.c_int.from_address(out).value = 1

    def _cuDeviceGet(self, out: int, ordinal: int) -> None:
        if ordinal != 0:
            raise DriverError(INVALID_DEVICE, f"device {ordinal} (the model has one, 0)")
        ctypes.c_int.from_address(out).value = 0

    def _check_device(self, dev: int) -> None:
        if ctypes.c_int(dev).value != 0:
            raise DriverError(INVALID_DEVICE, f"device {dev}")

    def _cuDeviceGetName(self, out: int, length: int, dev: int) -> None:
        self._check_device(dev)
        text = NAME.encode()[:max(ctypes.c_int(length).value - 1, 0)] + b"\0"
        ctypes.memmove(out, text, len(text))

    def _cuDeviceGetAttribute(self, out: int, attrib: int, dev: int) -> None:
        self._check_device(dev)
        values = {ATTRIBUTE_CC_MAJOR: CAPABILITY[0], ATTRIBUTE_CC_MINOR: CAPABILITY[1]}
        if attrib not in values:
            raise DriverError(INVALID_VALUE, f"the model answers no device attribute {attrib}")
        ctypes.c_int.from_address(out).value = values[attrib]

    def _cuDeviceTotalMem(self, out: int, dev: int) -> None:
        self._check_device(dev)
        ctypes.c_size_t.from_address(out).value = self.device.total_bytes

    def _cuDevicePrimaryCtxRetain(self, out: int, dev: int) -> None:
        self._check_device(dev)
        if self.retained == 0:
            self._context = self._new("context", None)
        self.retained += 1
        ctypes.c_uint64.from_address(out).value = self._context

    def _cuDevicePrimaryCtxRelease(self, dev: int) -> None:
        self._check_device(dev)
        if self.retained == 0:
            raise DriverError(INVALID_CONTEXT, "the primary context was not retained")
        self.retained -= 1
        if self.retained == 0:  # the context goes: whatever was made in it and not freed is a leak
            self.device.synchronize()
            left = [f"{len(self._buffers)} device allocations"] if self._buffers else []
            left += [f"{len(self._pinned)} page-locked buffers"] if self._pinned else []
            kinds: dict[str, int] = {}
            for kind, _ in self._handles.values():
                if kind != "context":
                    kinds[kind] = kinds.get(kind, 0) + 1
            left += [f"{n} {kind}s" for kind, n in sorted(kinds.items())]
            if left:
                self.leaks.append("context released with " + ", ".join(left) + " not freed")
            for buf in self._buffers.values():
                self.device.free(buf)
            self._buffers.clear()
            self._pinned.clear()
            self._handles.clear()
            self.current = False

    def _cuCtxSetCurrent(self, ctx: int) -> None:
        if ctx == 0:
            self.current = False
            return
        self._get("context", ctx)
        self.current = True

    def _cuCtxSynchronize(self) -> None:
        self.device.synchronize()

    # --- modules and functions ---------------------------------------------------------------------------------
    def _cubin(self, module: str) -> bytes:
        if module not in self._cubins:
            from uaii.backends.cuda.nvrtc import compile_module

            self._cubins[module] = compile_module(module, ARCH).cubin
        return self._cubins[module]

    def _cuModuleLoadData(self, out: int, image: int) -> None:
        head = ctypes.string_at(image, 64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            raise DriverError(INVALID_IMAGE, f"not a 64-bit ELF image: {head[:8]!r}")
        machine = int.from_bytes(head[18:20], "little")
        if machine != EM_CUDA:
            raise DriverError(INVALID_IMAGE, f"ELF machine {machine}, not EM_CUDA ({EM_CUDA})")
        phoff, shoff = int.from_bytes(head[32:40], "little"), int.from_bytes(head[40:48], "little")
        phentsize, phnum, shentsize, shnum = (int.from_bytes(head[i:i + 2], "little") for i in (54, 56, 58, 60))
        size = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
        data = ctypes.string_at(image, size)
        module = next((m for m in MODULES if self._cubin(m) == data), None)
        if module is None:
            raise DriverError(INVALID_IMAGE, f"a {size}-byte CUBIN that is none of the modules built for {ARCH}")
        ctypes.c_uint64.from_address(out).value = self._new("module", module)

    def _cuModuleGetFunction(self, out: int, mod: int, name_at: int) -> None:
        module = self._get("module", mod)
        kernel = ctypes.string_at(name_at).decode()
        if kernel not in MODULES[module].kernels or b"\0" + kernel.encode() + b"\0" not in self._cubin(module):
            raise DriverError(NOT_FOUND, f"module {module} has no kernel {kernel!r}")
        ctypes.c_uint64.from_address(out).value = self._new("function", _Function(mod, module, kernel))

    def _cuModuleUnload(self, mod: int) -> None:
        self._drop("module", mod)
        for h, (kind, fn) in list(self._handles.items()):  # its functions go with it
            if kind == "function" and fn.owner == mod:
                del self._handles[h]

    def _cuFuncSetAttribute(self, f: int, attrib: int, value: int) -> None:
        fn = self._get("function", f)
        if attrib != FUNC_MAX_DYNAMIC_SHARED:
            raise DriverError(INVALID_VALUE, f"the model sets no function attribute {attrib}")
        if not 0 <= value <= SHARED_OPT_IN:
            raise DriverError(INVALID_VALUE, f"dynamic shared memory {value} > {SHARED_OPT_IN}")
        fn.max_dynamic_shared = value

    # --- memory and copies -------------------------------------------------------------------------------------
    def _cuMemAlloc(self, out: int, nbytes: int) -> None:
        if nbytes == 0:
            raise DriverError(INVALID_VALUE, "cuMemAlloc of 0 bytes")
        buf = self.device.alloc(nbytes)
        self._buffers[buf.ptr] = buf
        ctypes.c_uint64.from_address(out).value = buf.ptr

    def _cuMemFree(self, ptr: int) -> None:
        buf = self._buffers.pop(ptr, None)
        if buf is None:
            raise DriverError(INVALID_VALUE, f"cuMemFree({ptr:#x}): not an allocation's start")
        self.device.free(buf)

    def _cuMemHostAlloc(self, out: int, nbytes: int, flags: int) -> None:
        if nbytes == 0:
            raise DriverError(INVALID_VALUE, "cuMemHostAlloc of 0 bytes")
        array = np.zeros(nbytes, np.uint8)
        self._pinned[array.ctypes.data] = array
        ctypes.c_uint64.from_address(out).value = array.ctypes.data

    def _cuMemFreeHost(self, ptr: int) -> None:
        if self._pinned.pop(ptr, None) is None:
            raise DriverError(INVALID_VALUE, f"cuMemFreeHost({ptr:#x}): not a page-locked buffer's start")

    def _host(self, ptr: int, nbytes: int) -> tuple[np.ndarray, bool]:
        """Host memory ``[ptr, ptr + nbytes)`` as a view, and whether it is page-locked (inside one buffer of
        cuMemHostAlloc: an asynchronous copy then reads it when the stream gets there)."""
        for start, array in self._pinned.items():
            if start <= ptr and ptr + nbytes <= start + array.size:
                return array[ptr - start:ptr - start + nbytes], True
        return np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr))[:nbytes], False

    def _cuMemcpyHtoD(self, dst: int, src: int, nbytes: int) -> None:
        view, _ = self._host(src, nbytes)
        self.device.copy_htod(dst, view.copy(), None)
        self.device.synchronize()

    def _cuMemcpyDtoH(self, dst: int, src: int, nbytes: int) -> None:
        view, _ = self._host(dst, nbytes)
        self.device.copy_dtoh(view, src, None)
        self.device.synchronize()

    def _cuMemcpyDtoD(self, dst: int, src: int, nbytes: int) -> None:
        self.device.copy_dtod(dst, src, nbytes, None)
        self.device.synchronize()

    def _cuMemcpyHtoDAsync(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        view, pinned = self._host(src, nbytes)
        # pageable memory is staged before the call returns (the driver's rule): only page-locked is read late
        self.device.copy_htod(dst, view if pinned else view.copy(), self._stream(stream))

    def _cuMemcpyDtoHAsync(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        view, pinned = self._host(dst, nbytes)
        self.device.copy_dtoh(view, src, self._stream(stream))
        if not pinned:  # to pageable memory the call returns when the copy is done
            self.device.sync_stream(self._stream(stream))

    def _cuMemcpyDtoDAsync(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self.device.copy_dtod(dst, src, nbytes, self._stream(stream))

    # --- streams, events, graphs -------------------------------------------------------------------------------
    def _cuStreamCreate(self, out: int, flags: int) -> None:
        ctypes.c_uint64.from_address(out).value = self._new("stream", self.device.stream())

    def _cuStreamDestroy(self, s: int) -> None:
        self._drop("stream", s)

    def _cuStreamSynchronize(self, s: int) -> None:
        self.device.sync_stream(self._stream(s))

    def _cuStreamWaitEvent(self, s: int, e: int, flags: int) -> None:
        self.device.wait(self._stream(s), self._get("event", e).host)

    def _cuStreamBeginCapture(self, s: int, mode: int) -> None:
        stream = self._stream(s)
        if stream is None:
            raise DriverError(CAPTURE_UNSUPPORTED, "the legacy default stream cannot be captured")
        self.device.begin_capture(stream)

    def _cuStreamEndCapture(self, s: int, out: int) -> None:
        stream = self._stream(s)
        if stream is None or not self.device.capturing(stream):
            raise DriverError(INVALID_VALUE, f"stream {s:#x} is not capturing")
        ctypes.c_uint64.from_address(out).value = self._new("graph", self.device.end_capture(stream))

    def _cuEventCreate(self, out: int, flags: int) -> None:
        event = _Event(self.device.event(), not flags & EVENT_DISABLE_TIMING)
        ctypes.c_uint64.from_address(out).value = self._new("event", event)

    def _cuEventDestroy(self, e: int) -> None:
        self._drop("event", e)

    def _cuEventRecord(self, e: int, s: int) -> None:
        self.device.record(self._get("event", e).host, self._stream(s))

    def _cuEventSynchronize(self, e: int) -> None:
        self.device.sync_event(self._get("event", e).host)

    def _cuEventElapsedTime(self, out: int, start: int, end: int) -> None:
        a, b = self._get("event", start), self._get("event", end)
        if not (a.timing and b.timing):
            raise DriverError(INVALID_HANDLE, "an event made with CU_EVENT_DISABLE_TIMING has no time")
        if a.host.at is None or b.host.at is None or a.host.reached < a.host.queued \
                or b.host.reached < b.host.queued:
            raise DriverError(NOT_READY, "an event's record has not run")
        ctypes.c_float.from_address(out).value = (b.host.at - a.host.at) * 1e3

    def _cuGraphInstantiate(self, out: int, graph: int, flags: int) -> None:
        captured: HostGraph = self._get("graph", graph)
        ctypes.c_uint64.from_address(out).value = self._new("exec", HostGraph(list(captured.items)))

    def _cuGraphDestroy(self, graph: int) -> None:
        self._drop("graph", graph)

    def _cuGraphExecDestroy(self, exe: int) -> None:
        self.device.graph_destroy(self._drop("exec", exe))

    def _cuGraphLaunch(self, exe: int, s: int) -> None:
        self.device.graph_launch(self._get("exec", exe), self._stream(s))

    # --- launches ----------------------------------------------------------------------------------------------
    def _cuLaunchKernel(self, f: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int,
                        s: int, params: int, extra: int) -> None:
        fn: _Function = self._get("function", f)
        if bx * by * bz > 1024 or bx > 1024 or by > 1024 or bz > 64:
            raise DriverError(INVALID_VALUE, f"{fn.kernel}: block ({bx}, {by}, {bz}) over the device's limits")
        if gx >= 1 << 31 or gy > 65535 or gz > 65535 or min(gx, gy, gz, bx, by, bz) < 1:
            raise DriverError(INVALID_VALUE, f"{fn.kernel}: grid ({gx}, {gy}, {gz})")
        if shared > fn.max_dynamic_shared:
            raise DriverError(INVALID_VALUE, f"{fn.kernel}: {shared} bytes of dynamic shared memory, "
                              f"{fn.max_dynamic_shared} allowed (cuFuncSetAttribute raises it)")
        if extra:
            raise DriverError(INVALID_VALUE, f"{fn.kernel}: the model takes parameters through kernelParams only")
        kinds = signature(fn.kernel)
        if kinds and not params:
            raise DriverError(INVALID_VALUE, f"{fn.kernel}: takes {len(kinds)} parameters, kernelParams is NULL")
        args = []
        for i, kind in enumerate(kinds):
            at = ctypes.c_uint64.from_address(params + 8 * i).value
            ctype = _CTYPES[kind]
            args.append(ctype(ctype.from_address(at).value))
        self.device.launch(fn.module, fn.kernel, Launch((gx, gy, gz), (bx, by, bz), shared), *args,
                           stream=self._stream(s))


_NO_CONTEXT = {"cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName",
               "cuDeviceGetAttribute", "cuDeviceTotalMem", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease",
               "cuCtxSetCurrent"}
_CTYPES = {"p": ctypes.c_uint64, "i": ctypes.c_int, "l": ctypes.c_longlong, "f": ctypes.c_float}
_WORDS = {"cuCtxSynchronize": 1}  # the C side passes a placeholder word for a call without arguments

MODEL: DriverModel | None = None
"""The model that the loaded library calls (one per process: the driver is a process's)."""


def _build() -> Any:
    """The C library as a cffi module (built once per source digest under the system's temporary folder)."""
    from cffi import FFI

    text = SOURCE.read_text()
    tag = "_uaii_cuda_driver_model_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / "uaii-cuda-driver-model"
    out.mkdir(parents=True, exist_ok=True)
    built = next(iter(out.glob(f"{tag}*.so")), None)
    ffi = FFI()
    ffi.cdef('extern "Python+C" int uaii_driver_call(const char *, unsigned long long *, int);')
    if built is None:
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            ffi.set_source(tag, text, extra_compile_args=["-O1", "-Wall", "-Werror"],
                           extra_link_args=["-Wl,-soname,libcuda.so.1"])
            path = Path(ffi.compile(tmpdir=tmp))
            built = out / path.name
            os.replace(path, built)
    spec = importlib.util.spec_from_file_location(tag, built)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules[tag] = mod
    return mod


def install(kernels: str = "compiled", total_bytes: int = 8 << 30) -> DriverModel:
    """Load the model as this process's CUDA driver, running on a ``HostDevice(kernels=kernels)``; the model (its
    errors and leaks) is returned. Must run before cuda-bindings looks for the driver (its first driver call)."""
    global MODEL
    if MODEL is not None:
        return MODEL
    try:
        ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        pass
    else:
        raise RuntimeError("a CUDA driver is already loaded in this process: the model cannot stand in for it")
    mod = _build()
    MODEL = DriverModel(HostDevice(total_bytes=total_bytes, kernels=kernels))

    @mod.ffi.def_extern()
    def uaii_driver_call(name: Any, args: Any, n: int) -> int:
        model = MODEL
        assert model is not None
        call = mod.ffi.string(name).decode()
        words = [int(args[i]) for i in range(n)][: n - _WORDS.get(call, 0)] if n else []
        return model.call(call, words)

    _keep.append(uaii_driver_call)
    return MODEL


_keep: list[Callable[..., int]] = []  # the extern "Python" function must outlive the process's driver calls

__all__ = ["ENV", "DriverModel", "install"]

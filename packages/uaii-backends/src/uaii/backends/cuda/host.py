"""A host model of a CUDA device: :class:`HostDevice` has :class:`~uaii.backends.cuda.device.CudaDevice`'s
interface, keeps device memory in host arrays and runs each launch through the kernel's CPU reference
(:mod:`uaii.backends.cuda.reference`).

Why it exists: everything the executor decides — which kernel, which pointers and sizes in which order, where the
arena's regions lie, which staging buffer a streamed weight goes through and which event guards it — is host code
that a wrong number turns into wrong tokens. Run on this model, a whole model's steps can be compared with the CPU
backend on any machine (CI has no GPU); on a device the kernels themselves are compared with the same references
(tests/backends/test_cuda_kernels.py). With ``kernels="compiled"`` the kernels whose threads are independent run as
their CUDA source built by the host compiler instead, with ``kernels="all"`` every kernel
(:mod:`uaii.backends.cuda.host_kernels`). It is a test
instrument, never a device a user can choose.

What it checks that a GPU would not tell you: every pointer a launch or copy touches lies inside one live
allocation (a stray offset is a BackendError naming the kernel, not silent corruption); every argument has the
C type of the kernel's parameter (:data:`uaii.backends.cuda.sources.SIGNATURES`); and streams are *asynchronous*:
work queued on a stream runs only when the host waits (an event, a stream, the device, a download), and then in an
adversarial order: the first stream in priority that can move runs as far as its waits allow before any other
moves — with ``order="ahead"`` the most recently created stream first (an executor's copy stream, made after its
compute stream, runs ahead of the kernels), with ``order="behind"`` the earliest (the copies lag).
A missing event wait — a staging slot overwritten before the kernel that reads it ran (ahead), a kernel reading a
slot before its copy arrived or a page-locked buffer refilled before its copy left (behind) — therefore shows as
wrong results here.

Graph capture is modelled as strictly: while a stream captures, what is queued on it is recorded (a launch with
the argument values it was queued with, a copy with its addresses), and a replay queues the record again — so a
step that changes an argument from run to run but was captured replays the stale value, and the tokens show it.
Anything that would synchronize with the capture or escape it (a host wait, an allocation, an event, work on
another stream) is a BackendError naming it; a free (a KV state the garbage collector takes) waits for the end of
the capture, as on the device.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from uaii.backends.base import BackendError
from uaii.backends.cuda.device import DeviceBuffer
from uaii.backends.cuda.geometry import Launch
from uaii.backends.cuda.sources import check_args

ALIGN = 256  # cuMemAlloc's alignment (at least 256 bytes)


class HostMemory:
    """Allocations (host byte arrays) at their real addresses, so that pointers — also those stored in device memory,
    as the attention tables hold them — can be followed by the references and by the host build of the kernels.
    Each block sits inside a larger array with a guard of ALIGN bytes on either side: an overrun lands in no other
    allocation, and the bounds check names it."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._blocks: dict[int, np.ndarray] = {}
        self._raw: dict[int, np.ndarray] = {}

    def alloc(self, nbytes: int) -> int:
        n = max(int(nbytes), 1)
        raw = np.zeros(n + 3 * ALIGN, np.uint8)
        at = (-raw.ctypes.data) % ALIGN + ALIGN
        block = raw[at:at + n]
        ptr = int(block.ctypes.data)
        bisect.insort(self._starts, ptr)
        self._blocks[ptr] = block
        self._raw[ptr] = raw
        return ptr

    def free(self, ptr: int) -> None:
        if ptr not in self._blocks:
            raise BackendError(f"[cuda-host] free of {ptr:#x}, which is not an allocation")
        del self._blocks[ptr]
        del self._raw[ptr]
        self._starts.remove(ptr)

    def bytes(self, ptr: int, nbytes: int, what: str = "access") -> np.ndarray:
        """A writable uint8 view of ``[ptr, ptr + nbytes)``, which must lie inside one live allocation."""
        i = bisect.bisect_right(self._starts, int(ptr)) - 1
        if i >= 0:
            start = self._starts[i]
            block = self._blocks[start]
            off = int(ptr) - start
            if off >= 0 and off + int(nbytes) <= block.size:
                return block[off:off + int(nbytes)]
        raise BackendError(f"[cuda-host] {what}: {nbytes} bytes at {int(ptr):#x} are not inside one allocation")

    def array(self, ptr: int, dtype: Any, count: int, what: str = "access") -> np.ndarray:
        """A writable view of ``count`` values of ``dtype`` at ``ptr``."""
        dt = np.dtype(dtype)
        if int(ptr) % dt.itemsize:
            raise BackendError(f"[cuda-host] {what}: {dt} at {int(ptr):#x} is misaligned")
        return self.bytes(ptr, int(count) * dt.itemsize, what).view(dt)

    @property
    def live_bytes(self) -> int:
        return sum(b.size for b in self._blocks.values())


@dataclass
class HostStream:
    """Queued work of one stream: callables, event records and event waits, run in order."""

    index: int
    queue: deque[tuple[str, Any]] = field(default_factory=deque)


@dataclass
class HostGraph:
    """A captured stream's work, replayed by :meth:`HostDevice.graph_launch` until destroyed."""

    items: list[tuple[str, Any]]
    live: bool = True


@dataclass
class HostEvent:
    """An event: ``queued`` records so far, ``reached`` of them run; a wait holds until the record it was queued
    behind has run. ``at``: when the latest record ran (host seconds), what an elapsed time is measured between."""

    queued: int = 0
    reached: int = 0
    at: float | None = None


class HostDevice:
    """CudaDevice's interface on host memory (see the module doc). Stream 0 is the default (null) stream; streams
    made by :meth:`stream` are numbered from 1 in the order they were made."""

    name = "host model of a CUDA device"
    capability = (9, 0)
    arch = "sm_90"

    def __init__(self, total_bytes: int = 8 << 30, order: str = "ahead", kernels: str = "reference") -> None:
        if order not in ("ahead", "behind"):
            raise BackendError(f"[cuda-host] order must be 'ahead' or 'behind', found {order!r}")
        if kernels not in ("reference", "compiled", "all"):
            raise BackendError(f"[cuda-host] kernels must be 'reference', 'compiled' or 'all', found {kernels!r}")
        self.order = order
        self.kernels = kernels  # "compiled": the thread-local kernels' CUDA source built for the host; "all": every
        # kernel's (the warp- and block-level ones with a thread per CUDA thread: slow, for the kernel tests)
        self.mem = HostMemory()
        self.total_bytes = int(total_bytes)
        self._streams: list[HostStream] = [HostStream(0)]
        self._buffers: dict[int, DeviceBuffer] = {}
        self.launches: list[str] = []  # kernel names in the order they ran (tests read it)
        self.compiled_launches = 0  # of them, run by the host build of the CUDA source
        self.h2d_bytes = 0  # host -> device bytes queued (tests read what a step moved)
        self.closed = False
        self._draining = False
        self._deferred: list[int] = []  # frees asked for while queued work ran
        self._capture: HostStream | None = None  # the stream in graph capture, if any
        self._captured: list[tuple[str, Any]] = []
        self.graph_launches = 0

    # --- memory ------------------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> DeviceBuffer:
        self._not_capturing("cuMemAlloc")
        if self.mem.live_bytes + int(nbytes) > self.total_bytes:
            raise BackendError(f"[cuda-host] cuMemAlloc({nbytes}) failed: CUDA_ERROR_OUT_OF_MEMORY "
                               f"({self.mem.live_bytes} of {self.total_bytes} bytes in use)")
        buf = DeviceBuffer(self.mem.alloc(nbytes), int(nbytes))
        self._buffers[buf.ptr] = buf
        return buf

    def free(self, buf: DeviceBuffer) -> None:
        """Free once the queued work is done. Called while work runs (a KV state collected by the garbage collector
        in the middle of a launch's reference), the free waits until the queues are drained: draining again from
        inside would run later work before the launch in progress ends."""
        if self._buffers.pop(buf.ptr, None) is not None:
            if self._draining or self._capture is not None:  # (a state collected during a capture: as CudaDevice)
                self._deferred.append(buf.ptr)
                return
            self.synchronize()
            self.mem.free(buf.ptr)

    def alloc_host(self, nbytes: int) -> np.ndarray:
        """Page-locked host memory in the real device; plain host memory here."""
        return np.zeros(max(int(nbytes), 1), np.uint8)

    def free_host(self, array: np.ndarray) -> None:
        if self._capture is None:
            self.synchronize()

    def upload(self, array: np.ndarray) -> DeviceBuffer:
        a = np.ascontiguousarray(array)
        buf = self.alloc(a.nbytes)
        self.synchronize()
        self.mem.bytes(buf.ptr, a.nbytes, "upload")[:] = a.reshape(-1).view(np.uint8)
        return buf

    def download(self, buf: DeviceBuffer | int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        self.synchronize()
        out = np.empty(shape, dtype)
        ptr = buf.ptr if isinstance(buf, DeviceBuffer) else int(buf)
        out.reshape(-1).view(np.uint8)[:] = self.mem.bytes(ptr, out.nbytes, "download")
        return out

    # --- streams and events ------------------------------------------------------------------------------------
    def stream(self) -> HostStream:
        s = HostStream(len(self._streams))
        self._streams.append(s)
        return s

    def event(self) -> HostEvent:
        return HostEvent()

    def _on(self, stream: HostStream | None) -> HostStream:
        return stream if stream is not None else self._streams[0]

    def record(self, event: HostEvent, stream: HostStream | None = None) -> None:
        self._not_capturing("cuEventRecord")
        event.queued += 1
        self._on(stream).queue.append(("record", event))

    def wait(self, stream: HostStream | None, event: HostEvent) -> None:
        """``stream`` waits for the work before ``event``'s latest record (cuStreamWaitEvent; no record: no wait)."""
        self._not_capturing("cuStreamWaitEvent")
        if event.queued:
            self._on(stream).queue.append(("wait", (event, event.queued)))

    def sync_event(self, event: HostEvent) -> None:
        target = event.queued
        self._drain(lambda: event.reached >= target)

    def sync_stream(self, stream: HostStream | None = None) -> None:
        s = self._on(stream)
        self._drain(lambda: not s.queue)

    def synchronize(self) -> None:
        self._drain(lambda: all(not s.queue for s in self._streams))

    def _step(self, s: HostStream) -> bool:
        """Run the head of ``s`` if it is not a wait still held; True when something ran."""
        if not s.queue:
            return False
        kind, item = s.queue[0]
        if kind == "wait":
            event, target = item
            if event.reached < target:  # the record this wait was queued behind has not run yet
                return False
            s.queue.popleft()
            return True
        s.queue.popleft()
        if kind == "record":
            item.reached += 1
            item.at = time.perf_counter()
        else:
            item()
        return True

    def _queue(self, stream: HostStream | None, item: tuple[str, Any]) -> None:
        s = self._on(stream)
        if self._capture is None:
            s.queue.append(item)
        elif s is self._capture:
            self._captured.append(item)
        else:
            raise BackendError(f"[cuda-host] work queued on stream {s.index} while stream {self._capture.index} "
                               "captures a graph (it would escape the graph)")

    def _not_capturing(self, what: str) -> None:
        if self._capture is not None:
            raise BackendError(f"[cuda-host] {what} while stream {self._capture.index} captures a graph "
                               "(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)")

    # --- graphs ------------------------------------------------------------------------------------------------
    def begin_capture(self, stream: HostStream) -> None:
        self._not_capturing("cuStreamBeginCapture")
        self._capture, self._captured = stream, []

    def capturing(self, stream: HostStream) -> bool:
        return self._capture is stream

    def end_capture(self, stream: HostStream) -> HostGraph:
        if self._capture is not stream:
            raise BackendError("[cuda-host] cuStreamEndCapture on a stream that is not capturing")
        graph = HostGraph(self._captured)
        self._capture, self._captured = None, []
        if self._deferred:
            self.synchronize()  # frees asked for during the capture
        return graph

    def graph_launch(self, graph: HostGraph, stream: HostStream) -> None:
        if not graph.live:
            raise BackendError("[cuda-host] cuGraphLaunch of a destroyed graph")
        self._not_capturing("cuGraphLaunch")
        self.graph_launches += 1
        self._on(stream).queue.extend(graph.items)

    def graph_destroy(self, graph: HostGraph) -> None:
        graph.live = False

    def _drain(self, done: Callable[[], bool]) -> None:
        """Run queued work until ``done()``: the first stream in the order's priority that can move runs as far as
        it can, then the priorities are looked at again (see the module doc). Not re-entered: a wait from inside
        queued work (a finalizer's free) is deferred to the end of this drain."""
        self._not_capturing("a host wait (cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize)")
        if self._draining:
            return
        self._draining = True
        try:
            self._drain_until(done)
        finally:
            self._draining = False
        while self._deferred:
            self.mem.free(self._deferred.pop())

    def _drain_until(self, done: Callable[[], bool]) -> None:
        prio = sorted(self._streams, key=lambda s: -s.index if self.order == "ahead" else s.index)
        while not done():
            for s in prio:
                if self._step(s):
                    while self._step(s):
                        pass
                    break
            else:
                raise BackendError("[cuda-host] deadlock: every stream waits for an event no stream will record")

    # --- copies and launches -----------------------------------------------------------------------------------
    def copy_htod(self, dst: int, src: np.ndarray, stream: HostStream | None = None) -> None:
        """Copy ``src`` (pinned host memory, kept alive by the caller until the stream passes this copy)."""
        view = src.reshape(-1).view(np.uint8)
        self.mem.bytes(dst, view.size, "copy_htod")  # the destination is checked when queued
        self.h2d_bytes += view.size

        def run() -> None:
            self.mem.bytes(dst, view.size, "copy_htod")[:] = view
        self._queue(stream, ("run", run))

    def copy_dtoh(self, dst: np.ndarray, src: int, stream: HostStream | None = None) -> None:
        view = dst.reshape(-1).view(np.uint8)

        def run() -> None:
            view[:] = self.mem.bytes(src, view.size, "copy_dtoh")
        self._queue(stream, ("run", run))

    def copy_dtod(self, dst: int, src: int, nbytes: int, stream: HostStream | None = None) -> None:
        def run() -> None:
            data = self.mem.bytes(src, nbytes, "copy_dtod").copy()
            self.mem.bytes(dst, nbytes, "copy_dtod")[:] = data
        self._queue(stream, ("run", run))

    def launch(self, module: str, kernel: str, at: Launch, *args: Any, stream: HostStream | None = None) -> None:
        """Queue the CPU reference of ``kernel`` with ``args`` (checked against the kernel's parameter types)."""
        from uaii.backends.cuda.reference import reference

        check_args(module, kernel, args)
        values = tuple(a.ptr if isinstance(a, DeviceBuffer) else a.value for a in args)
        compiled = None
        if self.kernels != "reference":
            from uaii.backends.cuda.host_kernels import host_kernel

            compiled = host_kernel(kernel, threaded=self.kernels == "all")
        fn = reference(kernel)

        def run() -> None:
            self.launches.append(kernel)
            if compiled is not None:
                self.compiled_launches += 1
                compiled(at, values)
            else:
                fn(self.mem, at, values)
        self._queue(stream, ("run", run))

    def close(self) -> None:
        if self.closed:
            return
        self.synchronize()
        for buf in list(self._buffers.values()):
            self.free(buf)
        self.closed = True


__all__ = ["HostDevice", "HostEvent", "HostGraph", "HostMemory", "HostStream"]

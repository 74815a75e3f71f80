"""The model of the CUDA driver (tests/cuda_driver_model.py) under CudaDevice: what it passes and what it refuses.

Each test runs in a fresh interpreter: the model becomes that process's libcuda.so.1, which cannot be undone (and
must not leak into the other tests, whose "cuda" variants skip without a device). `make check-cuda-model` runs
every test that needs a CUDA device on the model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cuda.bindings", reason="cuda-bindings is not installed (uaii-backends[cuda])")

TESTS = Path(__file__).resolve().parents[1]

PRELUDE = f"""
import ctypes, json, sys
sys.path.insert(0, {str(TESTS)!r})
import numpy as np
import cuda_driver_model as M
model = M.install(kernels="reference")
from uaii.backends.base import BackendError
from uaii.backends.cuda import geometry
from uaii.backends.cuda.device import CudaDevice, _driver, _ok
cu = _driver()
"""


def on_model(code: str) -> dict[str, Any]:
    """Run ``code`` after :data:`PRELUDE` in a fresh interpreter; the JSON object it prints last."""
    env = {k: v for k, v in os.environ.items() if k != "UAII_CUDA_DRIVER_MODEL"}
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_cuda_device_opens_runs_a_kernel_and_closes_clean_on_the_model() -> None:
    out = on_model("""
        from uaii.backends.cuda.device import first_device
        dev = first_device()
        a, b = np.arange(1000, dtype=np.float32), np.full(1000, 0.5, np.float32)
        da, db, dy = dev.upload(a), dev.upload(b), dev.alloc(4000)
        dev.launch("ops", "add", geometry.elementwise(1000), da, db, dy, ctypes.c_longlong(1000))
        y = dev.download(dy, (1000,), np.float32)
        name, cap, arch = dev.name, dev.capability, dev.arch
        dev.close()
        print(json.dumps({"ok": bool(np.array_equal(y, a + b)), "name": name, "cap": list(cap), "arch": arch,
                          "calls": model.calls, "errors": model.errors, "leaks": model.leaks}))
    """)
    assert out["ok"] and out["name"] == "UAII model of a CUDA driver (HostDevice)"
    assert out["cap"] == [9, 0] and out["arch"] == "sm_90"
    # the module was loaded from its CUBIN, the kernel found by name and launched through cuda-bindings
    assert out["calls"]["cuModuleLoadData"] == 1 and out["calls"]["cuLaunchKernel"] == 1
    assert out["errors"] == [] and out["leaks"] == []


def test_kernel_parameters_reach_the_driver_as_the_kernel_declares_them() -> None:
    """Every C kind through cuLaunchKernel's void** array: a pointer, negative ints, a long long beyond 32 bits,
    a float — read back by the model as the kernel's signature says."""
    out = on_model("""
        with CudaDevice.open() as dev:
            seen = []
            real = model.device.launch
            model.device.launch = lambda module, kernel, at, *args, stream=None: seen.append(
                [module, kernel, list(at.grid), list(at.block), at.shared,
                 [a.value for a in args], [type(a).__name__ for a in args]])
            buf = dev.alloc(64)
            dev.launch("ops", "rope", geometry.Launch((3, 2, 1), (64, 1, 1)), buf, buf, buf, ctypes.c_int(-7),
                       ctypes.c_int(2 ** 31 - 1), ctypes.c_int(5), ctypes.c_int(0), ctypes.c_int(-1),
                       ctypes.c_float(-1.5e-3))
            dev.launch("ew", "copy_nd", geometry.Launch((1, 1, 1), (32, 1, 1)), buf, ctypes.c_longlong(-(1 << 40)),
                       buf, ctypes.c_longlong((1 << 62) + 3), buf, ctypes.c_int(3), ctypes.c_longlong(9))
            model.device.launch = real
            print(json.dumps({"seen": seen, "ptr": buf.ptr}))
    """)
    p = out["ptr"]
    rope, copy = out["seen"]
    assert rope[:5] == ["ops", "rope", [3, 2, 1], [64, 1, 1], 0]
    assert rope[5][:8] == [p, p, p, -7, 2 ** 31 - 1, 5, 0, -1] and abs(rope[5][8] - -1.5e-3) < 1e-9
    assert rope[6] == ["c_ulong", "c_ulong", "c_ulong", "c_int", "c_int", "c_int", "c_int", "c_int", "c_float"]
    assert copy[5] == [p, -(1 << 40), p, (1 << 62) + 3, p, 3, 9]


def test_the_model_refuses_what_a_driver_refuses() -> None:
    out = on_model("""
        said = {}
        def attempt(what, fn):
            try:
                fn()
                said[what] = "passed"
            except BackendError as exc:
                said[what] = str(exc)
        with CudaDevice.open() as dev:
            buf = dev.alloc(256)
            # 64 KiB of dynamic shared memory: over the 48 KiB a kernel gets without cuFuncSetAttribute
            attempt("shared", lambda: dev.launch("ops", "add", geometry.Launch((1, 1, 1), (32, 1, 1), 64 << 10),
                                                 buf, buf, buf, ctypes.c_longlong(1)))
            s = dev.stream()
            cu.cuStreamDestroy(s)
            dev._streams.remove(s)
            attempt("destroyed stream", lambda: dev.sync_stream(s))
            attempt("legacy capture", lambda: dev.begin_capture(cu.CUstream(0)))
            e0, e1 = dev.event(), dev.event()  # CU_EVENT_DISABLE_TIMING: no elapsed time
            dev.record(e0)
            dev.record(e1)
            dev.sync_event(e1)
            attempt("untimed events", lambda: _ok(cu, cu.cuEventElapsedTime(e0, e1), "elapsed"))
            attempt("not a CUBIN", lambda: _ok(cu, cu.cuModuleLoadData(b"\\x7fELF" + bytes(60)), "load"))
            attempt("stray free", lambda: _ok(cu, cu.cuMemFree(buf.ptr + 16), "free"))
            attempt("out of bounds", lambda: (dev.launch("ops", "add", geometry.elementwise(1000), buf, buf, buf,
                                                         ctypes.c_longlong(1000)), dev.synchronize()))
        print(json.dumps({"said": said, "errors": model.errors}))
    """)
    said = out["said"]
    assert "CUDA_ERROR_INVALID_VALUE" in said["shared"]
    assert "CUDA_ERROR_INVALID_HANDLE" in said["destroyed stream"]
    assert "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" in said["legacy capture"]
    assert "CUDA_ERROR_INVALID_HANDLE" in said["untimed events"]
    assert "CUDA_ERROR_INVALID_IMAGE" in said["not a CUBIN"]
    assert "CUDA_ERROR_INVALID_VALUE" in said["stray free"]
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in said["out of bounds"]
    assert any("65536 bytes of dynamic shared memory, 49152 allowed" in e for e in out["errors"])


def test_a_context_released_with_memory_still_allocated_is_a_leak() -> None:
    out = on_model("""
        dev = CudaDevice.open()
        dev.alloc(1024)
        dev.stream()
        cu.cuDevicePrimaryCtxRelease(dev._dev)  # without close(): its buffer and stream are left behind
        print(json.dumps({"leaks": model.leaks}))
    """)
    assert out["leaks"] == ["context released with 1 device allocations, 1 streams not freed"]


def test_the_bandwidth_probes_time_with_device_events_on_the_model() -> None:
    """bench-gpu's CUDA probes (uaii.backends.cuda.measure) end to end at toy sizes: timing events made, recorded
    on the legacy stream, read with cuEventElapsedTime — what the GPU run times its figures with."""
    out = on_model("""
        from uaii.backends.cuda import measure
        from uaii.ir import DType
        with CudaDevice.open() as dev:
            got = {"copy": measure.copy_bandwidth(dev, 1 << 20, 2), "h2d": measure.h2d_bandwidth(dev, 1 << 20, 2),
                   "gemv": measure.gemv_bandwidth(dev, DType.Q4_0, 64, 256, 2),
                   "gemvq": measure.gemv_bandwidth(dev, DType.Q4_0, 64, 256, 2, int8=True),
                   "mmq": measure.mmq_rate(dev, DType.Q4_0, 64, 256, 8, 2)}
        print(json.dumps({"got": got, "errors": model.errors, "leaks": model.leaks,
                          "elapsed": model.calls["cuEventElapsedTime"]}))
    """)
    assert all(v > 0 for v in out["got"].values()), out["got"]
    assert out["elapsed"] == 5 and out["errors"] == [] and out["leaks"] == []


def test_page_locked_memory_dropped_unfreed_is_still_freed_at_close() -> None:
    """Regression: CudaDevice kept page-locked buffers by the id() of the array it returned; an array dropped
    without free_host left its id to the next one, whose entry overwrote it, and close() never freed the first
    (`make check-cuda-model` in CI: "context released with 1 page-locked buffers not freed")."""
    out = on_model("""
        import gc
        with CudaDevice.open() as dev:
            for _ in range(50):
                dev.alloc_host(4096)  # dropped at once: its id is free for the next
                gc.collect()
            kept = dev.alloc_host(64)
            dev.free_host(kept)
            try:
                dev.free_host(np.zeros(8, np.uint8))
                refused = ""
            except BackendError as exc:
                refused = str(exc)
        print(json.dumps({"leaks": model.leaks, "freed": model.calls["cuMemFreeHost"], "refused": refused}))
    """)
    assert out["leaks"] == [] and out["freed"] == 51
    assert "not a page-locked buffer of this device" in out["refused"]

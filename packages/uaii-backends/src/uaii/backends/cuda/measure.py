"""Bandwidth probes of a CUDA device: the GEMV kernels per weight type, and a device-to-device copy to compare with.

A decode step is a chain of GEMVs that each read their whole weight once, so a GEMV's weight bytes per second bound
tokens per second; :func:`copy_bandwidth` measures what the device moves on ``cuMemcpyDtoD`` in the same run (bytes
read + written, as the WebGPU probe counts them), the ceiling a GEMV approaches (issue #18's goal: >= 0.7 of it for
Q4 types). Both time ``reps`` launches between two CUDA events after a warm-up: device time, not host time.
:func:`h2d_bandwidth` is the ceiling of weight streaming (page-locked host -> device), :func:`mmq_rate` the int8
prefill GEMM's rate.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from uaii.backends.cuda import geometry
from uaii.backends.cuda.device import CudaDevice, _driver, _ok
from uaii.backends.cuda.sources import TYPES
from uaii.ir import DType
from uaii.kernels import random_weight


def _timed(dev: CudaDevice, run: Any, reps: int) -> float:
    """Seconds of one ``run()`` on the device (events around ``reps`` runs, after one warm-up)."""
    cu = _driver()
    run()
    start = _ok(cu, cu.cuEventCreate(0), "cuEventCreate")
    end = _ok(cu, cu.cuEventCreate(0), "cuEventCreate")
    try:
        _ok(cu, cu.cuEventRecord(start, 0), "cuEventRecord")
        for _ in range(reps):
            run()
        _ok(cu, cu.cuEventRecord(end, 0), "cuEventRecord")
        _ok(cu, cu.cuEventSynchronize(end), "cuEventSynchronize")
        ms = _ok(cu, cu.cuEventElapsedTime(start, end), "cuEventElapsedTime")
    finally:
        cu.cuEventDestroy(start)
        cu.cuEventDestroy(end)
    return float(ms) / 1e3 / reps


def copy_bandwidth(dev: CudaDevice, nbytes: int, reps: int = 20) -> float:
    """GB/s (bytes read + written) of a device-to-device copy of ``nbytes``."""
    cu = _driver()
    src, dst = dev.alloc(nbytes), dev.alloc(nbytes)
    try:
        s = _timed(dev, lambda: _ok(cu, cu.cuMemcpyDtoD(dst.ptr, src.ptr, nbytes), "cuMemcpyDtoD"), reps)
    finally:
        dev.free(src)
        dev.free(dst)
    return 2 * nbytes / s / 1e9


def gemv_bandwidth(dev: CudaDevice, dtype: DType, n: int, k: int, reps: int = 20, m: int = 1,
                   int8: bool = False) -> float:
    """GB/s of weight bytes the GEMV kernel of ``dtype`` reads on an [n, k] weight against ``m`` activation rows:
    the float form (gemv_), or with ``int8`` the int8 form the lowering runs on the block types (quant_act +
    gemvq_, both timed: a decode step launches both)."""
    raw = random_weight(dtype, n, k)
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    w, xb, y = dev.upload(raw), dev.upload(x), dev.alloc(m * n * 4)
    quantized = _quantized_scratch(dev, m, k) if int8 else ()
    c = ctypes
    suffix, at = TYPES[dtype][1], geometry.gemv(n)

    def run() -> None:
        if int8:
            _quant_act(dev, xb, m, k, *quantized)
            dev.launch("gemv", f"gemvq_{suffix}_m{m}", at, w, c.c_longlong(dtype.nbytes(k)), c.c_int(n), c.c_int(k),
                       *quantized, y, c.c_longlong(n))
        else:
            dev.launch("gemv", f"gemv_{suffix}_m{m}", at, w, c.c_longlong(dtype.nbytes(k)), c.c_int(n), c.c_int(k),
                       xb, c.c_longlong(k), y, c.c_longlong(n))
    try:
        s = _timed(dev, run, reps)
    finally:
        for b in (w, xb, y, *quantized):
            dev.free(b)
    return raw.nbytes / s / 1e9


def _quantized_scratch(dev: CudaDevice, m: int, k: int) -> tuple[Any, Any, Any]:
    """Device buffers for quant_act's int8 values, d and s of m rows of k values."""
    return dev.alloc(m * k), dev.alloc(4 * m * (k // 32)), dev.alloc(4 * m * (k // 32))


def _quant_act(dev: CudaDevice, x: Any, m: int, k: int, q: Any, d: Any, s: Any) -> None:
    """quant_act over the m rows of k floats at x (k apart) into q, d, s."""
    dev.launch("mmq", "quant_act", geometry.elementwise(m * (k // 32)), x, ctypes.c_longlong(k), ctypes.c_int(m),
               ctypes.c_int(k), q, d, s)


def h2d_bandwidth(dev: CudaDevice, nbytes: int, reps: int = 10) -> float:
    """GB/s of a host -> device copy of ``nbytes`` from page-locked memory (what a streamed weight's piece moves
    at, the ceiling of the executor's streaming: issue #18's goal >= 0.8 of it)."""
    host = dev.alloc_host(nbytes)
    dst = dev.alloc(nbytes)
    try:
        s = _timed(dev, lambda: dev.copy_htod(dst.ptr, host), reps)
    finally:
        dev.free(dst)
        dev.free_host(host)
    return nbytes / s / 1e9


def mmq_rate(dev: CudaDevice, dtype: DType, n: int, k: int, m: int, reps: int = 10) -> float:
    """Tera-operations per second (2 n k m) of the int8 prefill GEMM of ``dtype`` on an [n, k] weight and ``m``
    activation rows, the activation quantizer included."""
    raw = random_weight(dtype, n, k)
    x = np.random.default_rng(2).standard_normal((m, k)).astype(np.float32)
    w, xb, y = dev.upload(raw), dev.upload(x), dev.alloc(4 * m * n)
    q, d, sc = _quantized_scratch(dev, m, k)
    c = ctypes
    suffix = TYPES[dtype][1]

    def run() -> None:
        _quant_act(dev, xb, m, k, q, d, sc)
        dev.launch("mmq", f"mmq_{suffix}", geometry.mmq(n, m), w, c.c_longlong(dtype.nbytes(k)), c.c_int(n),
                   c.c_int(k), q, d, sc, c.c_int(m), y, c.c_longlong(n))
    try:
        s = _timed(dev, run, reps)
    finally:
        for b in (w, xb, y, q, d, sc):
            dev.free(b)
    return 2 * n * k * m / s / 1e12


__all__ = ["copy_bandwidth", "gemv_bandwidth", "h2d_bandwidth", "mmq_rate"]

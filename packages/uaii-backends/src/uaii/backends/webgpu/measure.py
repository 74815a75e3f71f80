"""Bandwidth probes of a WebGPU device: the GEMV kernel per weight type, and a plain buffer copy to compare with.

A decode step is a chain of GEMVs, each reading its whole weight once, so tokens per second follow the weight
bytes a GEMV reads per second. :func:`gemv_bandwidth` measures exactly that with the backend's own kernel
(linalg.gemv_source); :func:`copy_bandwidth` measures what the adapter reaches on a ``copy_buffer_to_buffer`` in the
same run, the ceiling a GEMV can approach. Both time ``reps`` commands in one submission after a warm-up, and end
the clock on a read-back (which waits for the queue): host-side wall clock, so keep ``reps`` large enough that the
submission overhead (~0.1 ms) is small.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from uaii.backends.base import BackendError
from uaii.backends.webgpu.device import GpuDevice
from uaii.backends.webgpu.ops.dequant import SUPPORTED, UNIT, decoder
from uaii.backends.webgpu.ops.linalg import gemv_params, gemv_source, threads_per_row
from uaii.backends.webgpu.program import Region, bind, padded, split_groups
from uaii.ir import DType
from uaii.kernels import random_weight


def _storage(dev: GpuDevice, raw: np.ndarray) -> Any:
    buf = dev.buffer(raw.nbytes)
    dev.queue.write_buffer(buf, 0, padded(raw))
    return buf


def _timed(dev: GpuDevice, encode: Any, reps: int, sync: Any) -> float:
    """Seconds for ``reps`` commands (``encode(encoder, reps)``), after one warm-up command."""
    for count in (1, reps):
        enc = dev.device.create_command_encoder()
        encode(enc, count)
        start = time.perf_counter()
        dev.queue.submit([enc.finish()])
        dev.queue.read_buffer(sync, 0, 4)
    return time.perf_counter() - start


def gemv_bandwidth(dev: GpuDevice, dtype: DType | str, n: int, k: int, reps: int = 50) -> float:
    """Weight GB/s of the backend's GEMV kernel (one decode row, Y[n] = W[n, k] @ x) for ``dtype``."""
    dt = DType.parse(dtype)
    if dt not in SUPPORTED or k % max(dt.block_size, UNIT):
        raise BackendError(f"[backend] webgpu: gemv_bandwidth needs a decodable type and k a multiple of its "
                           f"block; got {dt.value}, k={k}")
    raw = random_weight(dt, n, k)
    row_bytes = dt.nbytes(k)
    rows = max(1, min(n, dev.max_binding // row_bytes))
    tpr = threads_per_row(k // UNIT)
    pipeline = dev.pipeline(gemv_source(decoder(dt), tpr, 1, subgroups=dev.subgroups))
    x, y = _storage(dev, np.ones(k, np.float32)), dev.buffer(4 * n)
    keep, groups = [], []
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        w = _storage(dev, raw[start * row_bytes:stop * row_bytes])
        params = gemv_params(stop - start, k, row_bytes, 1, n, start, tpr)
        group, ubuf = bind(dev, pipeline, params, [Region(b, 0, b.size) for b in (w, x, y)])
        keep += [w, ubuf]
        groups.append((group, split_groups(int(params[7]), dev.max_workgroups)))

    def encode(enc: Any, count: int) -> None:
        cpass = enc.begin_compute_pass()
        cpass.set_pipeline(pipeline)
        for _ in range(count):
            for group, g in groups:
                cpass.set_bind_group(0, group)
                cpass.dispatch_workgroups(*g)
        cpass.end()

    seconds = _timed(dev, encode, reps, y)
    return reps * raw.nbytes / seconds / 1e9


def copy_bandwidth(dev: GpuDevice, nbytes: int, reps: int = 50) -> float:
    """Memory GB/s of ``copy_buffer_to_buffer`` of ``nbytes``: bytes read plus bytes written per second (2 x the
    bytes copied), the figure comparable with a GEMV's weight reads and the adapter's peak bandwidth."""
    nbytes = max(16, int(nbytes) // 16 * 16)
    src, dst = dev.buffer(nbytes), dev.buffer(nbytes)

    def encode(enc: Any, count: int) -> None:
        for _ in range(count):
            enc.copy_buffer_to_buffer(src, 0, dst, 0, nbytes)

    seconds = _timed(dev, encode, reps, dst)
    return reps * 2 * nbytes / seconds / 1e9


__all__ = ["copy_bandwidth", "gemv_bandwidth"]

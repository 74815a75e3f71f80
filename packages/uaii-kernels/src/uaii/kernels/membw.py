"""The machine's memory bandwidth as the kernels see it: a parallel copy (``uk_copy`` on the kernels' thread pool)
over buffers far larger than the caches, counting bytes read + written, best of a few timed batches.

Why here: decode reads every weight once per token, so a GEMV's GB/s means something only next to what this
machine's memory gives the same threads in the same minute; ``uaii bench --profile`` and ``bench/bench_kernels.py``
both divide by this one figure.
"""

from __future__ import annotations

import math
import time

import numpy as np

from uaii.kernels.native import check, lib, ptr


def copy_bandwidth(nbytes: int = 256 << 20, min_time: float = 0.5, repeats: int = 5) -> float:
    """GB/s (1e9 bytes) of read + written bytes of one ``nbytes`` copy on the current thread count: the best mean
    over ``repeats`` batches of about ``min_time / repeats`` seconds each (the first copy, which faults the pages
    in, is not timed)."""
    if nbytes < 1 << 20:
        raise ValueError(f"copy_bandwidth: nbytes must be >= 1 MiB (larger than the caches), got {nbytes}")
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros_like(src)
    ps, pd = ptr(src), ptr(dst)

    def copy() -> None:
        check(lib.uk_copy(pd, ps, nbytes), "copy_bandwidth")

    copy()
    t0 = time.perf_counter()
    copy()
    once = max(time.perf_counter() - t0, 1e-7)
    per_batch = max(1, int(min_time / max(repeats, 1) / once))
    best = math.inf
    for _ in range(max(repeats, 1)):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            copy()
        best = min(best, (time.perf_counter() - t0) / per_batch)
    return 2 * nbytes / best / 1e9


__all__ = ["copy_bandwidth"]

"""Knobs of uaii-kernels. The C library reads them itself when it starts; they are declared here in one place.

``UAII_NUM_THREADS``  threads of the kernel pool, including the caller (default: the usable cores). Change it at run
                      time with :func:`uaii.kernels.set_num_threads`.
``UAII_KERNELS_ISA``  force an instruction set at import (``scalar``, ``avx2``, ``avxvnni``, ``avx512``, ``neon``);
                      default: the best one this CPU supports.
"""

from __future__ import annotations

import os

NUM_THREADS_ENV = "UAII_NUM_THREADS"
ISA_ENV = "UAII_KERNELS_ISA"


def env_isa() -> str | None:
    value = os.environ.get(ISA_ENV, "").strip().lower()
    return value or None


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; the machine's count where there is none), as the C pool
    counts them for its default size (threadpool.c). The one definition behind the Session's cap on thread counts
    and the CPU backend's probe."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)

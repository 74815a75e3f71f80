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

"""uaii.kernels.native — the compiled C library of uaii-kernels, public for backends that bind kernels themselves.

``ffi`` and ``lib`` are the cffi (API / out-of-line mode) objects of the extension ``uaii.kernels._uaii_kernels``:
``lib.uk_*`` are the C functions, ``ffi`` casts and wraps buffers for them (``ptr``, ``f32`` and ``view_ptr``
below do it without copying). The Python functions of ``uaii.kernels`` check arguments and then call ``lib``;
a backend's hot loop (uaii.backends' CPU backend) binds ``lib`` functions with ``functools.partial`` once at
compile time and calls them directly, with no Python check per step. That is why this module is public.

Stability: the contract is the C declarations between the ``CDEF`` markers of ``csrc/uaii_kernels.h`` (the cdef,
read verbatim by build_kernels.py), together with the helpers defined here. A declared function keeps its name,
signature and meaning within a minor version of uaii-kernels; a change adds a function (``uk_x_v2``) or an enum
value, never reuses a status or mode number. ``lib`` holds exactly the cdef's declarations (cffi API mode), so
nothing internal to the C library can be reached through it.

Threads: every call into ``lib`` releases the GIL (cffi API mode) and never calls back into Python, so any thread
may call any kernel. The kernels that run on the persistent pool (GEMM, attention, the row operators) take one
process-wide call lock, which also guards the pool's scratch buffers: calls from several threads are correct but
run one after another. ``uk_set_isa`` (``set_isa``) must not run while kernels run in other threads;
``uk_set_num_threads`` may (it waits for the call lock). Output buffers are the caller's: two concurrent calls must
not write the same one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from uaii.ir.errors import UaiiError
from uaii.kernels import config

try:
    from uaii.kernels._uaii_kernels import ffi, lib
except ImportError as exc:  # pragma: no cover - only when the extension was not built
    raise ImportError(
        "[kernels] the C extension uaii.kernels._uaii_kernels is not built; reinstall the package "
        "(`uv sync --all-packages` builds it) or run `python packages/uaii-kernels/build_kernels.py`") from exc


class KernelError(UaiiError):
    """A kernel rejected its arguments (sizes, strides, ranges) or could not allocate scratch memory."""

    component = "kernels"


ISAS: dict[str, int] = {"scalar": 0, "avx2": 1, "avxvnni": 2, "avx512": 3, "neon": 4}
_ISA_NAMES = {v: k for k, v in ISAS.items()}


def check(rc: int, what: str) -> None:
    """Turn a C status into an exception naming the operation."""
    if rc == 0:
        return
    reason = {-1: "unsupported type", -2: "invalid arguments", -3: "out of memory", -4: "ISA not available"}
    raise KernelError(f"[kernels] {what}: {reason.get(rc, f'status {rc}')}")


def ptr(arr: Any, ctype: str = "void *") -> Any:
    """A C pointer to the memory of a contiguous array or buffer (no copy)."""
    if arr is None:
        return ffi.NULL
    return ffi.cast(ctype, ffi.from_buffer(arr))


def f32(arr: np.ndarray) -> Any:
    return ffi.cast("float *", ffi.from_buffer(arr))


def view_ptr(a: np.ndarray, ctype: str = "float *") -> Any:
    """Pointer to the first element of a (possibly strided) view of a C-contiguous array, without a copy."""
    if a.flags.c_contiguous:
        return ffi.cast(ctype, ffi.from_buffer(a))
    base = a
    while isinstance(base.base, np.ndarray):
        base = base.base
    if not base.flags.c_contiguous:
        raise KernelError("[kernels] strided views must come from a C-contiguous array")
    offset = a.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return ffi.cast("uint8_t *", ffi.from_buffer(base)) + offset if ctype == "uint8_t *" else ffi.cast(
        ctype, ffi.cast("uint8_t *", ffi.from_buffer(base)) + offset)


# --- instruction sets -----------------------------------------------------------------------------------------
def available_isas() -> list[str]:
    """The instruction sets this machine can run, scalar first (every SIMD path is tested against it)."""
    return [name for name, v in ISAS.items() if lib.uk_isa_available(v)]


def best_isa() -> str:
    return _ISA_NAMES[lib.uk_best_isa()]


def get_isa() -> str:
    return _ISA_NAMES[lib.uk_get_isa()]


def set_isa(name: str) -> None:
    """Force the kernels of one instruction set (tests, benchmarks). Not while kernels run in other threads."""
    key = name.strip().lower()
    if key not in ISAS:
        raise KernelError(f"[kernels] unknown ISA {name!r}; expected one of: {', '.join(ISAS)}")
    if lib.uk_set_isa(ISAS[key]) != 0:
        raise KernelError(f"[kernels] ISA {key!r} is not available on this CPU; available: "
                          f"{', '.join(available_isas())}")


@contextmanager
def use_isa(name: str) -> Iterator[None]:
    """Run a block with one instruction set forced, then restore the previous one."""
    previous = get_isa()
    set_isa(name)
    try:
        yield
    finally:
        set_isa(previous)


# --- threads --------------------------------------------------------------------------------------------------
def set_num_threads(n: int | None = None) -> None:
    """Size the persistent pool (including the calling thread); None: $UAII_NUM_THREADS or the usable cores."""
    check(lib.uk_set_num_threads(0 if n is None else int(n)), "set_num_threads")


def get_num_threads() -> int:
    return int(lib.uk_get_num_threads())


@contextmanager
def num_threads(n: int) -> Iterator[None]:
    previous = get_num_threads()
    set_num_threads(n)
    try:
        yield
    finally:
        set_num_threads(previous)


_env_isa = config.env_isa()
if _env_isa:
    set_isa(_env_isa)

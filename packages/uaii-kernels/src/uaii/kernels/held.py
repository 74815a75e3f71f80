"""Held forms: the rows of a resident weight rearranged once into the order this machine's GEMM kernels read.

A weight that stays in memory (pinned) is read every decode step for as long as the model is loaded; a streamed
one is read once per step from disk, where its file layout is what arrives. For a held weight the kernels may
prefer another order of the same bytes: Q4_1 rows whose 16-block groups are stored as the AVX-512 tiles hold them
in registers (``q4_1x16``) spare a 4-row decode step 13 permutes per weight row and 16 blocks (~20 % of its Q4_1
GEMM time). A held form has the byte size of its type and gives exactly the bits of the file layout in every GEMM
mode, so a pinned and a streamed copy of one weight compute the same numbers. It is a kernel detail, not a
format: nothing but :class:`~uaii.kernels.PackedWeight` reads it.
"""

from __future__ import annotations

import numpy as np

from uaii.ir.dtype import DType
from uaii.kernels.native import KernelError, check, lib, ptr

_FORMS: dict[str, tuple[DType, int]] = {"q4_1x16": (DType.Q4_1, 40)}
"""form name -> (the GGUF type it rearranges, its kernel type id: uk_held_type in uaii_kernels.h)"""
_NAMES = {kt: name for name, (_, kt) in _FORMS.items()}


def held_form(dtype: DType | str, k: int) -> str | None:
    """The held form this machine's kernels read rows of ``k`` values of ``dtype`` fastest in, or None (keep the
    file's layout: there is none for the type, or the rows are too short to gain, or the ISA has no such kernel)."""
    dt = DType.parse(dtype)
    if dt.gguf_id is None or k <= 0:
        return None
    return _NAMES.get(int(lib.uk_held_type(dt.gguf_id, int(k))))


def held_kernel_type(dtype: DType, form: str | None) -> int:
    """The kernel type id of ``dtype`` in ``form`` (None: the type's own id)."""
    if form is None:
        assert dtype.gguf_id is not None, dtype
        return dtype.gguf_id
    base = _FORMS.get(form)
    if base is None or base[0] is not dtype:
        raise KernelError(f"[kernels] {form!r} is not a held form of {dtype.value} (known: {sorted(_FORMS)})")
    return base[1]


def _relayout(src: np.ndarray, dst: np.ndarray, dtype: DType | str, shape: tuple[int, int], form: str,
              to_held: bool) -> None:
    dt = DType.parse(dtype)
    kt = held_kernel_type(dt, form)
    n, k = (int(s) for s in shape)
    need = dt.nbytes(n * k)
    for a in (src, dst):
        if a.nbytes != need:
            raise KernelError(f"[kernels] held form {form}: a [{n}, {k}] {dt.value} weight is {need} bytes, "
                              f"got an array of {a.nbytes}")
    assert dt.gguf_id is not None
    frm, to = (dt.gguf_id, kt) if to_held else (kt, dt.gguf_id)
    check(lib.uk_relayout(frm, to, ptr(src), ptr(dst), n, k), f"held form {form} of [{n}, {k}] {dt.value}")


def write_held(src: np.ndarray, dst: np.ndarray, dtype: DType | str, shape: tuple[int, int], form: str) -> None:
    """Write the rows of ``src`` (a [n, k] weight of ``dtype`` in its file layout) into ``dst`` in ``form``:
    another buffer of the same size, or ``src`` itself (rewritten in place, a 320-byte group at a time: a pinned
    tensor needs no second copy); any other overlap is refused."""
    _relayout(src, dst, dtype, shape, form, True)


def from_held(data: np.ndarray, dtype: DType | str, shape: tuple[int, int], form: str) -> np.ndarray:
    """The file layout of a weight held in ``form`` (a new uint8 array)."""
    out = np.empty(data.nbytes, np.uint8)
    _relayout(data, out, dtype, shape, form, False)
    return out


__all__ = ["from_held", "held_form", "held_kernel_type", "write_held"]

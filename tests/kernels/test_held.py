"""Held forms (uaii.kernels.held): a pinned weight's rows rewritten into the order the GEMM tiles read must give the
file layout's bits in every mode and batch size, round-trip byte for byte, and be refused where no kernel reads
them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import uaii.kernels as K
from uaii.ir.dtype import DType
from uaii.kernels.held import held_kernel_type
from uaii.kernels.native import KernelError, check, ffi, lib
from uaii.kernels.testing import random_weight

FORM = "q4_1x16"
HELD = K.held_form(DType.Q4_1, 576) is not None  # AVX-512 VBMI: the tiles that read the form
needs_kernel = pytest.mark.skipif(not HELD, reason="no AVX-512 VBMI tiles on this CPU: no held form is offered")


def _held(w: np.ndarray, n: int, k: int) -> np.ndarray:
    out = np.empty_like(w)
    K.write_held(w, out, DType.Q4_1, (n, k), FORM)
    return out


def _gemm(w: K.PackedWeight, x: np.ndarray, mode: int) -> np.ndarray:
    y = np.empty((x.shape[0], w.n), np.float32)
    rc = lib.uk_gemm(w.kernel_type, w.pointer(), w.n, w.k, ffi.cast("float *", ffi.from_buffer(x)), x.shape[0], w.k,
                     ffi.cast("float *", ffi.from_buffer(y)), w.n, mode)
    check(rc, f"gemm {w.form or w.dtype.value}")
    return y


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 9), blocks=st.integers(1, 70), seed=st.integers(0, 2**31))
def test_the_held_form_round_trips_and_moves_only_whole_groups(n: int, blocks: int, seed: int) -> None:
    k = 32 * blocks
    w = random_weight(DType.Q4_1, n, k, seed=seed)
    h = _held(w, n, k)
    assert np.array_equal(K.from_held(h, DType.Q4_1, (n, k), FORM), w)
    inplace = w.copy()
    K.write_held(inplace, inplace, DType.Q4_1, (n, k), FORM)
    assert np.array_equal(inplace, h)
    if n:
        rows_w, rows_h = w.reshape(n, -1), h.reshape(n, -1)
        head = 320 * (blocks // 16)  # whole 16-block groups move; the last blocks % 16 stay as in the file
        assert np.array_equal(rows_w[:, head:], rows_h[:, head:])
        if head:
            assert not np.array_equal(rows_w[:, :head], rows_h[:, :head])


def test_held_form_is_offered_only_where_it_gains() -> None:
    assert K.held_form(DType.Q4_0, 576) is None
    assert K.held_form(DType.Q8_0, 576) is None
    assert K.held_form(DType.Q4_1, 480) is None  # rows of 15 blocks: no whole 16-block group
    assert K.held_form(DType.Q4_1, 512) == (FORM if HELD else None)
    with K.use_isa("scalar"):
        assert K.held_form(DType.Q4_1, 576) is None


@needs_kernel
@pytest.mark.parametrize("k", [512, 544, 576, 608, 1024, 1536, 2144])
def test_a_held_weight_gives_the_file_layouts_bits(k: int, rng: np.random.Generator) -> None:
    """Every path of uk_gemm (decode rows, the batched-decode tiles, prefill batches; modes 0, 1 and 2; the tails of
    1-2 and of 3+ blocks past the last 16-block group) on the held form against the file's layout, bit for bit."""
    n = 37
    w = random_weight(DType.Q4_1, n, k, seed=k)
    plain = K.PackedWeight.from_raw(w, DType.Q4_1, (n, k))
    held = K.PackedWeight.from_raw(_held(w, n, k), DType.Q4_1, (n, k), form=FORM)
    for m in (1, 2, 3, 4, 5, 8, 17, 40):
        x = rng.standard_normal((m, k)).astype(np.float32)
        for mode in (0, 1, 2):
            a, b = _gemm(plain, x, mode), _gemm(held, x, mode)
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (m, mode)
    assert np.array_equal(held.dequantize(), plain.dequantize())
    x = rng.standard_normal((3, k)).astype(np.float32)
    assert np.array_equal(K.matmul(x, held), K.matmul(x, plain))


@needs_kernel
def test_a_held_weight_is_refused_by_kernels_that_cannot_read_it(rng: np.random.Generator) -> None:
    """After switching to an ISA without the tiles, the integer modes say so; mode 1 (rows dequantized from the
    held form) still computes the same values."""
    n, k = 8, 576
    w = random_weight(DType.Q4_1, n, k, seed=5)
    plain = K.PackedWeight.from_raw(w, DType.Q4_1, (n, k))
    held = K.PackedWeight.from_raw(_held(w, n, k), DType.Q4_1, (n, k), form=FORM)
    x = rng.standard_normal((2, k)).astype(np.float32)
    for isa in [i for i in K.available_isas() if i in ("scalar", "avx2")]:
        with K.use_isa(isa):
            with pytest.raises(KernelError, match="ISA not available"):
                _gemm(held, x, 0)
            assert np.array_equal(_gemm(held, x, 1).view(np.uint32), _gemm(plain, x, 1).view(np.uint32))


def test_misuse_of_held_forms_is_refused() -> None:
    n, k = 4, 576
    w = random_weight(DType.Q4_1, n, k, seed=1)
    with pytest.raises(KernelError, match="not a held form of q4_0"):
        K.PackedWeight.from_raw(random_weight(DType.Q4_0, n, k, seed=1), DType.Q4_0, (n, k), form=FORM)
    with pytest.raises(KernelError, match="not a held form"):
        held_kernel_type(DType.Q4_1, "q4_1x8")
    with pytest.raises(KernelError, match="bytes"):
        K.write_held(w, np.empty(w.size - 20, np.uint8), DType.Q4_1, (n, k), FORM)
    # the C API: overlapping buffers, a pair that is not a type and its form, and the flat converters
    buf = ffi.from_buffer(w)
    assert lib.uk_relayout(3, 40, buf, ffi.from_buffer(w[20:]), n - 1, k) == -2  # overlapping, not in place
    assert lib.uk_relayout(2, 40, buf, ffi.from_buffer(np.empty_like(w)), n, k) == -1
    assert lib.uk_relayout(3, 40, buf, ffi.from_buffer(np.empty_like(w)), n, 100) == -2
    out = np.empty(n * k, np.float32)
    assert lib.uk_dequantize(40, buf, ffi.cast("float *", ffi.from_buffer(out)), n * k) == -1

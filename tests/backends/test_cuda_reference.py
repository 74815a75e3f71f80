"""The CPU references of the CUDA kernels (uaii.backends.cuda.reference), launched through the host model of a
device as the executor launches the kernels, against independent CPU implementations: the C kernels of
uaii.kernels (dequantize, get_rows, the C GEMMs, rms_norm, the GLUs, rope, attention) and numpy. The same tests run
every kernel's CUDA source itself, built by the host compiler (``compiled``: the warp- and block-level kernels with
an OS thread per CUDA thread, their shuffles and barriers emulated), and where a CUDA device exists on it
(``cuda``; skipped with "no CUDA device" elsewhere), so the kernels are held to the same independent
implementations as their references.

Besides the values: every kernel the modules name has a reference; a launch computes only what its grid covers (a
grid too small leaves the rest untouched, as on a device); buffers sized exactly as the kernel indexes them are
enough (a reference touching more would fail the host model's bounds check); kernels that assume their block shape
refuse another one.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

import uaii.kernels as K
from uaii.backends.base import BackendError
from uaii.backends.cuda import geometry
from uaii.backends.cuda.device import DeviceBuffer
from uaii.backends.cuda.geometry import Launch
from uaii.backends.cuda.host import HostDevice
from uaii.backends.cuda.reference import reference
from uaii.backends.cuda.sources import MMQ_TYPES, MODULES, TYPES
from uaii.ir import DType
from uaii.ir.reference.attention import attention as ir_attention
from uaii.kernels.testing import random_weight

Int, Long, Flt, Ptr = ctypes.c_int, ctypes.c_longlong, ctypes.c_float, ctypes.c_uint64
Mask = tuple[np.ndarray, bool, list[int], int, int]
NULL = Ptr(0)
SENTINEL = np.float32(-7.25)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240607)


@pytest.fixture
def dev(cuda_dev: Any) -> Any:
    """conftest's cuda_dev: the host model (references, or the kernels' CUDA source) and a device where there is one."""
    return cuda_dev


@pytest.fixture
def host() -> Any:
    """The host model alone (what only it checks: block shapes, bounds)."""
    d = HostDevice()
    yield d
    d.close()


def _filled(dev: HostDevice, count: int, dtype: Any = np.float32) -> DeviceBuffer:
    """A buffer of ``count`` values, all SENTINEL: what a launch leaves untouched stays so."""
    return dev.upload(np.full(count, SENTINEL, dtype))


def _bits(x: np.ndarray) -> np.ndarray:
    """The float32 bits, a NaN's quiet bit set: decode.cuh keeps a signaling NaN's bits exactly where the CPU's F16C
    path quiets it (test_cuda_kernels.py compares the same way), so payload and sign are compared, not that bit."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).copy()
    bits[np.isnan(np.ascontiguousarray(x, np.float32))] |= 0x00400000
    return bits


def _quantized(dev: HostDevice, x: np.ndarray) -> tuple[DeviceBuffer, DeviceBuffer, DeviceBuffer]:
    """quant_act over the rows of x [m, k] on ``dev``: the int8 values, d and s buffers."""
    m, k = x.shape
    nb = k // 32
    dq, dd, ds = dev.alloc(m * k), dev.alloc(4 * m * nb), dev.alloc(4 * m * nb)
    dev.launch("mmq", "quant_act", geometry.elementwise(m * nb), dev.upload(x), Long(k), Int(m), Int(k), dq, dd, ds)
    return dq, dd, ds


def _int8_rows(qa: np.ndarray, da: np.ndarray, m: int, k: int) -> np.ndarray:
    """float64 [m, k]: the values the int8 blocks (qa, da) of m rows stand for."""
    return (qa.reshape(m, k // 32, 32).astype(np.float64) * da.reshape(m, k // 32, 1)).reshape(m, k)


def test_every_kernel_of_every_module_has_a_reference() -> None:
    for module in MODULES.values():
        for kernel in module.kernels:
            assert callable(reference(kernel)), kernel
    with pytest.raises(BackendError, match=r"\[cuda-host\] no CPU reference for kernel gemv_q4_0_m3"):
        reference("gemv_q4_0_m3")


# ------------------------------------------------------------------------------------------ weights
@pytest.mark.parametrize("dtype", list(TYPES), ids=lambda t: t.value)
def test_gemv_of_every_type_against_the_cpu_gemm(dtype: DType, dev: HostDevice, rng: np.random.Generator) -> None:
    """M = 1 and M = 3 (launches of gemv_splits: m2 then m1), x and y strided, buffers sized exactly; K of 40 units:
    a whole step of gemv.cu's shared activation tile and a partial one."""
    n, k = 37, 1280
    raw = random_weight(dtype, n, k, seed=7)
    want_w = K.PackedWeight.from_raw(raw, dtype, (n, k))
    dw = dev.upload(raw)
    for m in (1, 3):
        ldx, ldy = k + 32, n + 5
        x = rng.standard_normal((m, k)).astype(np.float32)
        xbuf = np.zeros((m - 1) * ldx + k, np.float32)
        for i in range(m):
            xbuf[i * ldx:i * ldx + k] = x[i]
        dx, dy = dev.upload(xbuf), _filled(dev, (m - 1) * ldy + n)
        for start, size in geometry.gemv_splits(m):
            dev.launch("gemv", f"gemv_{TYPES[dtype][1]}_m{size}", geometry.gemv(n), dw, Long(dtype.nbytes(k)), Int(n),
                       Int(k), Ptr(dx.ptr + 4 * start * ldx), Long(ldx), Ptr(dy.ptr + 4 * start * ldy), Long(ldy))
        y = dev.download(dy, ((m - 1) * ldy + n,), np.float32)
        got = np.stack([y[i * ldy:i * ldy + n] for i in range(m)])
        want = K.matmul(x, want_w, provider="c-f32")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
        assert all((y[i * ldy + n:(i + 1) * ldy] == SENTINEL).all() for i in range(m - 1))  # the gaps untouched


@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q5_1, DType.Q8_0, DType.Q6_K, DType.F16],
                         ids=lambda t: t.value)
def test_gemv_reads_rows_at_any_even_byte_offset(dtype: DType, dev: HostDevice, rng: np.random.Generator) -> None:
    """gemv.cu stages each warp's stretch of a row as the aligned words holding it: rows starting 2 bytes past a
    word (the weight 2 bytes past one, rows of 2 mod 4 bytes), a stretch ending mid-word and a last row ending where
    its allocation ends give the CPU's products, in both forms (gemvq_: the int8 one). Weights are at even addresses
    (the arena's 256-byte regions, streamed pieces of whole rows of even bytes: every type's blocks are), which the
    decoders' 16-bit loads need."""
    n, k = 9, (768 if dtype.block_size == 256 else 1248)     # 3 super-blocks, or 39 units: a partial tile
    raw = random_weight(dtype, n, k, seed=11)
    x = rng.standard_normal((1, k)).astype(np.float32)
    pw = K.PackedWeight.from_raw(raw, dtype, (n, k))
    want = K.matmul(x, pw, provider="c-f32")
    dx = dev.upload(x)
    dq, dd, ds = _quantized(dev, x) if dtype in MMQ_TYPES else (NULL,) * 3
    for offset in (0, 2, 6):
        buf = np.zeros(offset + raw.nbytes, np.uint8)
        buf[offset:] = raw.reshape(-1).view(np.uint8)
        dw, dy = dev.upload(buf), _filled(dev, n)
        dev.launch("gemv", f"gemv_{TYPES[dtype][1]}_m1", geometry.gemv(n), Ptr(dw.ptr + offset),
                   Long(dtype.nbytes(k)), Int(n), Int(k), dx, Long(k), dy, Long(n))
        got = dev.download(dy, (n,), np.float32)
        np.testing.assert_allclose(got, want[0], rtol=1e-4, atol=1e-5 * float(np.abs(want).max()), err_msg=str(offset))
        if dtype in MMQ_TYPES:
            dy = _filled(dev, n)
            dev.launch("gemv", f"gemvq_{TYPES[dtype][1]}_m1", geometry.gemv(n), Ptr(dw.ptr + offset),
                       Long(dtype.nbytes(k)), Int(n), Int(k), dq, dd, ds, dy, Long(n))
            got = dev.download(dy, (n,), np.float32)
            cpu = K.matmul(x, pw)  # the CPU's int8 path: activations quantized as quant_act does
            np.testing.assert_allclose(got, cpu[0], rtol=1e-3, atol=1e-3 * float(np.abs(cpu).max()),
                                       err_msg=str(offset))


@pytest.mark.parametrize("dtype", MMQ_TYPES, ids=lambda t: t.value)
def test_int8_gemv_against_the_exact_product_and_the_cpus_int8_gemm(dtype: DType, dev: HostDevice,
                                                                    rng: np.random.Generator) -> None:
    """gemvq_<type>_m<M> over M = 1 .. 8 rows as the lowering splits them (7: m4, m2, m1 launches), K of 40 units
    (a step of 32 and a part of one; 5 super-blocks), n = 37 (a last block of one warp's row): the exact product of
    quant_act's blocks and the weight up to rounding, the CPU's int8 GEMM up to its order of addition; y strided,
    its gaps untouched."""
    n, k = 37, 1280
    nb, ldy = k // 32, n + 5
    raw = random_weight(dtype, n, k, seed=13)
    w = K.dequantize(raw, dtype, n * k).reshape(n, k).astype(np.float64)
    dw = dev.upload(raw)
    for m in (1, 7, 8):
        x = rng.standard_normal((m, k)).astype(np.float32)
        (dq, dd, ds), dy = _quantized(dev, x), _filled(dev, (m - 1) * ldy + n)
        for start, size in geometry.gemv_splits(m):
            dev.launch("gemv", f"gemvq_{TYPES[dtype][1]}_m{size}", geometry.gemv(n), dw, Long(dtype.nbytes(k)),
                       Int(n), Int(k), Ptr(dq.ptr + start * k), Ptr(dd.ptr + 4 * start * nb),
                       Ptr(ds.ptr + 4 * start * nb), Ptr(dy.ptr + 4 * start * ldy), Long(ldy))
        y = dev.download(dy, ((m - 1) * ldy + n,), np.float32)
        got = np.stack([y[i * ldy:i * ldy + n] for i in range(m)])
        assert all((y[i * ldy + n:(i + 1) * ldy] == SENTINEL).all() for i in range(m - 1))
        xq = _int8_rows(*K.quantize_activations(x)[:2], m, k)
        exact = xq @ w.T
        assert np.all(np.abs(got - exact) <= 1e-5 * (np.abs(xq) @ np.abs(w).T) + 1e-30), m
        cpu = K.matmul(x, K.PackedWeight.from_raw(raw, dtype, (n, k)))
        np.testing.assert_allclose(got, cpu, rtol=1e-3, atol=1e-3 * float(np.abs(cpu).max()))


@pytest.mark.parametrize("dtype", list(TYPES), ids=lambda t: t.value)
def test_dequant_and_rows_are_bit_exact(dtype: DType, dev: HostDevice, rng: np.random.Generator) -> None:
    n_rows, k = 9, 512
    units = n_rows * k // 32
    raw = rng.integers(0, 256, dtype.nbytes(n_rows * k), dtype=np.uint8)
    dw, dy = dev.upload(raw), _filled(dev, n_rows * k)
    dev.launch("dequant", f"dequant_{TYPES[dtype][1]}", geometry.elementwise(units), dw, Long(units), dy)
    got, want = dev.download(dy, (n_rows * k,), np.float32), K.dequantize(raw, dtype, n_rows * k)
    assert np.array_equal(_bits(got), _bits(want))
    table = random_weight(dtype, n_rows, k, seed=2)
    ids = np.array([4, 0, 8, 4, 3], np.int32)
    dt, di, dy = dev.upload(table), dev.upload(ids), _filled(dev, ids.size * k)
    fault = dev.upload(np.zeros(1, np.int32))
    dev.launch("dequant", f"rows_{TYPES[dtype][1]}", geometry.elementwise(ids.size * k // 32), dt,
               Long(dtype.nbytes(k)), Long(k // 32), di, Int(ids.size), dy, Long(n_rows), fault, Int(7))
    got = dev.download(dy, (ids.size, k), np.float32)
    assert np.array_equal(_bits(got), _bits(K.get_rows(table, dtype, k, ids)))
    assert dev.download(fault, (1,), np.int32)[0] == 0
    bad = dev.upload(np.array([4, n_rows, -1], np.int32))  # ids outside the table: zeros and the fault code
    dev.launch("dequant", f"rows_{TYPES[dtype][1]}", geometry.elementwise(3 * k // 32), dt, Long(dtype.nbytes(k)),
               Long(k // 32), bad, Int(3), dy, Long(n_rows), fault, Int(7))
    got = dev.download(dy, (3, k), np.float32)
    assert np.array_equal(_bits(got[0]), _bits(K.get_rows(table, dtype, k, [4])[0])) and not got[1:].any()
    assert dev.download(fault, (1,), np.int32)[0] == 7


def test_partial_rows_touch_only_what_the_grid_covers(dev: HostDevice) -> None:
    """rows_ with 40 of 3 x 16 units: rows 0, 1 whole, row 2 half; and an idx array only as long as that."""
    dtype, k = DType.Q4_K, 512
    table = random_weight(dtype, 4, k, seed=1)
    dt, di, dy = dev.upload(table), dev.upload(np.array([3, 1, 2], np.int32)), _filled(dev, 3 * k)
    dev.launch("dequant", "rows_q4_k", Launch((5, 1, 1), (8, 1, 1)), dt, Long(dtype.nbytes(k)), Long(16), di, Int(3),
               dy, Long(4), NULL, Int(1))
    got = dev.download(dy, (3 * k,), np.float32)
    want = K.get_rows(table, dtype, k, [3, 1, 2]).reshape(-1)
    assert np.array_equal(got[:40 * 32], want[:40 * 32]) and (got[40 * 32:] == SENTINEL).all()


@pytest.mark.parametrize("dtype", MMQ_TYPES, ids=lambda t: t.value)
def test_int8_gemm_against_the_exact_product_and_the_cpus_int8_gemm(dtype: DType, dev: HostDevice,
                                                                    rng: np.random.Generator) -> None:
    """quant_act (x rows strided) gives the CPU's activation blocks bit for bit; mmq over tiles past both edges
    (n = 70, m = 67: four tiles, three of them partial) sums their exact product up to rounding."""
    n, k, m = 70, 256, 67
    nb, ldx, ldy = k // 32, k + 64, n + 3
    raw = random_weight(dtype, n, k, seed=5)
    x = rng.standard_normal((m, k)).astype(np.float32)
    xbuf = np.zeros((m, ldx), np.float32)
    xbuf[:, :k] = x
    dw, dx = dev.upload(raw), dev.upload(xbuf)
    dq, dd, ds = dev.alloc(m * k), _filled(dev, m * nb), _filled(dev, m * nb)
    dy = _filled(dev, (m - 1) * ldy + n)
    dev.launch("mmq", "quant_act", geometry.elementwise(m * nb), dx, Long(ldx), Int(m), Int(k), dq, dd, ds)
    dev.launch("mmq", f"mmq_{TYPES[dtype][1]}", geometry.mmq(n, m), dw, Long(dtype.nbytes(k)), Int(n), Int(k), dq, dd,
               ds, Int(m), dy, Long(ldy))
    qa, da, sa = K.quantize_activations(x)
    assert np.array_equal(dev.download(dq, (m * k,), np.int8), qa)
    assert np.array_equal(_bits(dev.download(dd, (m * nb,), np.float32)), _bits(da))
    assert np.array_equal(_bits(dev.download(ds, (m * nb,), np.float32)), _bits(sa))
    y = dev.download(dy, ((m - 1) * ldy + n,), np.float32)
    got = np.stack([y[c * ldy:c * ldy + n] for c in range(m)])
    w = K.dequantize(raw, dtype, n * k).reshape(n, k).astype(np.float64)
    xq = _int8_rows(qa, da, m, k)
    exact = xq @ w.T
    assert np.all(np.abs(got - exact) <= 1e-5 * (np.abs(xq) @ np.abs(w).T) + 1e-30)
    cpu = K.matmul(x, K.PackedWeight.from_raw(raw, dtype, (n, k)))
    np.testing.assert_allclose(got, cpu, rtol=1e-3, atol=1e-3 * float(np.abs(cpu).max()))


@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q8_0, DType.Q4_K, DType.Q6_K], ids=lambda t: t.value)
@pytest.mark.parametrize("x_div", [3, 1], ids=["gate", "down"])
def test_experts_int8_gemm_multiplies_each_experts_listed_rows(dtype: DType, x_div: int, dev: HostDevice,
                                                               rng: np.random.Generator) -> None:
    """moe_group lists each expert's pairs (ascending; an expert nobody chose has none), and mmq_idx gives every
    pair s the int8 GEMM's row of activation s / x_div with its expert's weights — bit for bit what mmq computes on
    the same rows (gate and up read a token's row, top_k = 3 pairs to it; down the pair's own). Each token's
    experts are distinct, as a router's top_k are: expert 1 is every token's (70, more than a tile), 5 nobody's."""
    e, top_k, n, k, tokens = 6, 3, 40, 256, 70
    pairs = tokens * top_k
    experts = np.stack([np.concatenate([[1], rng.choice([0, 2, 3, 4], 2, replace=False)])[rng.permutation(3)]
                        for _ in range(tokens)]).astype(np.int32).reshape(-1)
    m = pairs // x_div
    raw = np.concatenate([random_weight(dtype, n, k, seed=j) for j in range(e)])
    x = rng.standard_normal((m, k)).astype(np.float32)
    nb, eb = k // 32, dtype.nbytes(n * k)
    dw, dx, didx = dev.upload(raw), dev.upload(x), dev.upload(experts)
    dq, dd, ds = dev.alloc(m * k), dev.alloc(4 * m * nb), dev.alloc(4 * m * nb)
    order, counts = _filled(dev, e * pairs, np.int32), _filled(dev, e, np.int32)
    dy = _filled(dev, pairs * n)
    dev.launch("mmq", "quant_act", geometry.elementwise(m * nb), dx, Long(k), Int(m), Int(k), dq, dd, ds)
    dev.launch("moe", "moe_group", geometry.elementwise(e), didx, Int(pairs), Int(0), Int(e), order, counts)
    dev.launch("mmq", f"mmq_idx_{TYPES[dtype][1]}", geometry.mmq_idx(n, tokens, e), dw, Long(eb),
               Long(dtype.nbytes(k)), Int(n), Int(k), dq, dd, ds, Int(x_div), order, counts, Int(pairs), dy, Long(n))
    got_counts = dev.download(counts, (e,), np.int32)
    lists = dev.download(order, (e, pairs), np.int32)
    assert list(got_counts) == [int((experts == j).sum()) for j in range(e)] and got_counts[1] == 70
    assert got_counts[5] == 0
    for j in range(e):
        assert list(lists[j, :got_counts[j]]) == list(np.flatnonzero(experts == j))
    y = dev.download(dy, (pairs, n), np.float32)
    # each expert's rows through the plain int8 GEMM on the same device: the same CUDA code, the same bits (the
    # host's references sum in float64 through BLAS, whose rounding follows the shapes: equal to 1e-6 there)
    exact = getattr(dev, "kernels", "device") != "reference"
    for j in range(e):
        mine = np.flatnonzero(experts == j)
        if not mine.size:
            continue
        c = mine.size
        rx, rq, rd, rs, ry = dev.upload(x[mine // x_div]), dev.alloc(c * k), dev.alloc(4 * c * nb), \
            dev.alloc(4 * c * nb), dev.alloc(4 * c * n)
        dev.launch("mmq", "quant_act", geometry.elementwise(c * nb), rx, Long(k), Int(c), Int(k), rq, rd, rs)
        dev.launch("mmq", f"mmq_{TYPES[dtype][1]}", geometry.mmq(n, c), dev.upload(raw[j * eb:(j + 1) * eb]),
                   Long(dtype.nbytes(k)), Int(n), Int(k), rq, rd, rs, Int(c), ry, Long(n))
        want = dev.download(ry, (c, n), np.float32)
        if exact:
            assert np.array_equal(_bits(y[mine]), _bits(want)), j
        else:
            np.testing.assert_allclose(y[mine], want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max()))


# -------------------------------------------------------------------------------------- row operators
@pytest.mark.parametrize("unit_offset", [0, 1])
def test_norms(unit_offset: int, dev: HostDevice, rng: np.random.Generator) -> None:
    rows, n = 5, 300
    a, r = (rng.standard_normal((rows, n)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(n).astype(np.float32)
    da, dr, dw, ds, dy = dev.upload(a), dev.upload(r), dev.upload(w), _filled(dev, rows * n), _filled(dev, rows * n)
    dev.launch("ops", "rms_norm", geometry.norm(rows), da, dw, dy, Int(n), Flt(1e-5), Int(unit_offset))
    want = K.rms_norm(a, w, 1e-5, add_one=bool(unit_offset))
    np.testing.assert_allclose(dev.download(dy, (rows, n), np.float32), want, rtol=2e-6, atol=2e-6)
    dev.launch("ops", "add_rms_norm", geometry.norm(rows), da, dr, ds, dw, dy, Int(n), Flt(1e-5), Int(unit_offset))
    assert np.array_equal(dev.download(ds, (rows, n), np.float32), a + r)
    want = K.rms_norm(a + r, w, 1e-5, add_one=bool(unit_offset))
    np.testing.assert_allclose(dev.download(dy, (rows, n), np.float32), want, rtol=2e-6, atol=2e-6)
    dz = _filled(dev, rows * n)  # no sum pointer, no residual: rms_norm's result, nothing else written
    dev.launch("ops", "add_rms_norm", geometry.norm(rows), da, NULL, NULL, dw, dz, Int(n), Flt(1e-5), Int(unit_offset))
    np.testing.assert_allclose(dev.download(dz, (rows, n), np.float32), K.rms_norm(a, w, 1e-5,
                               add_one=bool(unit_offset)), rtol=2e-6, atol=2e-6)
    dr2 = dev.upload(r)  # the residual stream updated in place (sum aliasing res): y is still of a + r
    dev.launch("ops", "add_rms_norm", geometry.norm(rows), da, dr2, dr2, dw, dy, Int(n), Flt(1e-5), Int(unit_offset))
    assert np.array_equal(dev.download(dr2, (rows, n), np.float32), a + r)
    np.testing.assert_allclose(dev.download(dy, (rows, n), np.float32), want, rtol=2e-6, atol=2e-6)


def test_glus_on_a_fused_gate_up_row(dev: HostDevice, rng: np.random.Generator) -> None:
    rows, ff = 3, 200
    gu = (rng.standard_normal((rows, 2 * ff)) * 3).astype(np.float32)
    g, u = gu[:, :ff], gu[:, ff:]
    dgu = dev.upload(gu)
    args = (dgu, Ptr(dgu.ptr + 4 * ff), Long(2 * ff), Int(ff), Long(rows * ff))
    dy = _filled(dev, rows * ff)
    dev.launch("ops", "swiglu", geometry.elementwise(rows * ff), *args, dy)
    np.testing.assert_allclose(dev.download(dy, (rows, ff), np.float32), K.swiglu(g, u), rtol=2e-6, atol=1e-6)
    for approx, tanh in (("none", 0), ("tanh", 1)):
        dev.launch("ops", "geglu", geometry.elementwise(rows * ff), *args, dy, Int(tanh))
        # the CPU's GELU is a fast approximation: absolute errors up to 5e-7, times |u| (< 15)
        np.testing.assert_allclose(dev.download(dy, (rows, ff), np.float32), K.geglu(g, u, approx), rtol=2e-6,
                                   atol=1e-5)


def test_add_and_bcast_are_exact(dev: HostDevice, rng: np.random.Generator) -> None:
    """add of equal shapes; bcast with a row (a bias, a scale), a column (a gate per row) and one value."""
    a, b = rng.standard_normal((2, 3, 100)).astype(np.float32)
    da, db, dy = dev.upload(a), dev.upload(b), _filled(dev, 300)
    dev.launch("ops", "add", geometry.elementwise(300), da, db, dy, Long(300))
    assert np.array_equal(dev.download(dy, (3, 100), np.float32), a + b)
    row, col = dev.upload(b[0]), dev.upload(b[:, :1].copy())
    for op, fn in ((0, np.add), (1, np.multiply)):
        dev.launch("ops", "bcast", geometry.elementwise(300), da, row, Long(100), Long(1), Long(300), dy, Int(op))
        assert np.array_equal(dev.download(dy, (3, 100), np.float32), fn(a, b[0]))
        dev.launch("ops", "bcast", geometry.elementwise(300), da, col, Long(3), Long(100), Long(300), dy, Int(op))
        assert np.array_equal(dev.download(dy, (3, 100), np.float32), fn(a, b[:, :1]))
    one = dev.upload(np.array([1.5], np.float32))
    dev.launch("ops", "bcast", geometry.elementwise(300), da, one, Long(1), Long(1), Long(300), dy, Int(1))
    assert np.array_equal(dev.download(dy, (3, 100), np.float32), a * np.float32(1.5))


def test_unary_activations(dev: HostDevice, rng: np.random.Generator) -> None:
    """sigmoid, gelu (erf and tanh), silu, tanh, relu, neg and exp against uaii-ir's references."""
    from uaii.ir.reference.elementwise import exp, gelu, neg, relu, sigmoid, silu, tanh

    x = (rng.standard_normal(500) * 4).astype(np.float32)
    dx, dy = dev.upload(x), _filled(dev, 500)
    for op, want in ((0, sigmoid(x)), (1, gelu(x)), (2, gelu(x, approximate="tanh")), (3, silu(x)), (4, tanh(x)),
                     (5, relu(x)), (6, neg(x)), (7, exp(x))):
        dev.launch("ops", "unary", geometry.elementwise(500), dx, Long(500), dy, Int(op), Flt(0.0), Int(0))
        np.testing.assert_allclose(dev.download(dy, (500,), np.float32), want, rtol=2e-6, atol=2e-6)


def test_copy_rows_and_layer_norm(dev: HostDevice, rng: np.random.Generator) -> None:
    """A Split along the last axis as row copies; LayerNorm with and without a bias against uaii-ir's reference."""
    from uaii.ir.reference.norm import layer_norm

    x = rng.standard_normal((5, 96)).astype(np.float32)
    dx, dy = dev.upload(x), _filled(dev, 5 * 32)
    dev.launch("ops", "copy_rows", geometry.elementwise(5 * 32), Ptr(dx.ptr + 4 * 32), Long(96), dy, Long(32), Int(5),
               Int(32))
    assert np.array_equal(dev.download(dy, (5, 32), np.float32), x[:, 32:64])
    w, b = rng.standard_normal((2, 96)).astype(np.float32)
    dw, db, dz = dev.upload(w), dev.upload(b), _filled(dev, 5 * 96)
    for bias, ptr in ((b, db), (None, NULL)):
        dev.launch("ops", "layer_norm", geometry.norm(5), dx, dw, ptr, dz, Int(96), Flt(1e-5))
        np.testing.assert_allclose(dev.download(dz, (5, 96), np.float32), layer_norm(x, w, bias, eps=1e-5),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scoring,normalize", [("softmax", True), ("softmax", False), ("sigmoid", True)])
def test_moe_route_picks_the_references_experts(scoring: str, normalize: bool, dev: HostDevice,
                                                rng: np.random.Generator) -> None:
    """Top-k of softmax or sigmoid scores, best first, ties to the lower index (tied logits included)."""
    from uaii.ir.reference.moe import moe_router

    tokens, experts, k = 9, 8, 3
    z = rng.standard_normal((tokens, experts)).astype(np.float32)
    z[0, :] = 0.5  # every expert tied
    z[1, 2] = z[1, 5] = z[1].max() + 1  # two tied best
    dw, di = _filled(dev, tokens * k), dev.upload(np.full(tokens * k, -9, np.int32))
    dev.launch("moe", "moe_route", geometry.elementwise(tokens), dev.upload(z), Int(tokens), Int(experts), Int(k),
               Int(int(normalize)), Int(int(scoring == "sigmoid")), dw, di)
    want_w, want_i = moe_router(z, n_experts=experts, top_k=k, normalize=normalize, scoring=scoring)
    assert np.array_equal(dev.download(di, (tokens, k), np.int32), want_i)
    np.testing.assert_allclose(dev.download(dw, (tokens, k), np.float32), want_w, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [DType.F32, DType.Q4_0, DType.Q4_K], ids=lambda t: t.value)
def test_expert_products_and_their_sum(dtype: DType, dev: HostDevice, rng: np.random.Generator) -> None:
    """gemv_idx over a bank for each (token, slot) pair's expert — the whole bank, and a piece of experts
    [2, 4) that computes only its pairs — then moe_combine, against the dequantized experts in numpy."""
    experts, rows, cols, tokens, k = 5, 40, 256, 3, 2
    bank = np.concatenate([random_weight(dtype, rows, cols, seed=e) for e in range(experts)])
    per = dtype.nbytes(rows * cols)
    dense = [K.dequantize(bank[e * per:(e + 1) * per], dtype, rows * cols).reshape(rows, cols)
             for e in range(experts)]
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    idx = np.array([[3, 0], [2, 3], [4, 2]], np.int32)
    pairs = tokens * k
    at = Launch((geometry.gemv(rows).grid[0], pairs, 1), (geometry.WARP, geometry.GEMV_WARPS, 1))
    dbank, dx, didx, dy = dev.upload(bank), dev.upload(x), dev.upload(idx), _filled(dev, pairs * rows)
    dev.launch("gemv", f"gemv_idx_{TYPES[dtype][1]}", at, dbank, Long(per), Long(dtype.nbytes(cols)), Int(rows),
               Int(cols), dx, Long(cols), Int(k), didx, Int(0), Int(experts), dy, Long(rows))
    want = np.stack([dense[idx[s // k, s % k]] @ x[s // k] for s in range(pairs)])
    got = dev.download(dy, (pairs, rows), np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    piece = dev.upload(bank[2 * per:4 * per])  # experts [2, 4) as one streamed piece
    dz = _filled(dev, pairs * rows)
    dev.launch("gemv", f"gemv_idx_{TYPES[dtype][1]}", at, piece, Long(per), Long(dtype.nbytes(cols)), Int(rows),
               Int(cols), dx, Long(cols), Int(k), didx, Int(2), Int(4), dz, Long(rows))
    part = dev.download(dz, (pairs, rows), np.float32)
    mine = np.isin(idx.reshape(-1), [2, 3])
    np.testing.assert_allclose(part[mine], want[mine], rtol=1e-4, atol=1e-4)
    assert (part[~mine] == SENTINEL).all()
    w = rng.random((tokens, k)).astype(np.float32)
    dout = _filled(dev, tokens * rows)
    dev.launch("moe", "moe_combine", geometry.elementwise(tokens * rows), dy, dev.upload(w), Int(tokens), Int(k),
               Int(rows), dout)
    np.testing.assert_allclose(dev.download(dout, (tokens, rows), np.float32),
                               (w[:, :, None] * got.reshape(tokens, k, rows)).sum(axis=1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q5_1, DType.Q8_0, DType.Q4_K, DType.Q6_K], ids=lambda t: t.value)
@pytest.mark.parametrize("x_div", [2, 1], ids=["gate", "down"])
def test_int8_expert_products(dtype: DType, x_div: int, dev: HostDevice, rng: np.random.Generator) -> None:
    """gemvq_idx over a bank for each (token, slot) pair's expert on quant_act's rows (gate and up read the token's
    row, x_div = top_k; down the pair's own, 1) — the whole bank, and a piece of experts [2, 4) that computes only
    its pairs: the exact product of the quantized rows with each pair's expert up to rounding."""
    experts, rows, cols = 5, 40, 512
    idx = np.array([[3, 0], [2, 3], [4, 2]], np.int32)  # top_k 2
    pairs = idx.size
    bank = np.concatenate([random_weight(dtype, rows, cols, seed=e) for e in range(experts)])
    per = dtype.nbytes(rows * cols)
    dense = [K.dequantize(bank[e * per:(e + 1) * per], dtype, rows * cols).reshape(rows, cols).astype(np.float64)
             for e in range(experts)]
    x = rng.standard_normal((pairs // x_div, cols)).astype(np.float32)
    dq, dd, ds = _quantized(dev, x)
    xq = _int8_rows(*K.quantize_activations(x)[:2], x.shape[0], cols)
    want = np.stack([dense[idx.reshape(-1)[s]] @ xq[s // x_div] for s in range(pairs)])
    bound = np.stack([np.abs(dense[idx.reshape(-1)[s]]) @ np.abs(xq[s // x_div]) for s in range(pairs)])
    at, didx = geometry.gemv_pairs(rows, pairs), dev.upload(idx)
    for buf, e0, e1 in ((dev.upload(bank), 0, experts), (dev.upload(bank[2 * per:4 * per]), 2, 4)):
        dy = _filled(dev, pairs * rows)
        dev.launch("gemv", f"gemvq_idx_{TYPES[dtype][1]}", at, buf, Long(per), Long(dtype.nbytes(cols)), Int(rows),
                   Int(cols), dq, dd, ds, Int(x_div), didx, Int(e0), Int(e1), dy, Long(rows))
        got = dev.download(dy, (pairs, rows), np.float32)
        mine = (idx.reshape(-1) >= e0) & (idx.reshape(-1) < e1)
        assert np.all(np.abs(got[mine] - want[mine]) <= 1e-5 * bound[mine] + 1e-30), (e0, e1)
        assert (got[~mine] == SENTINEL).all()


@pytest.mark.parametrize("neox", [0, 1])
def test_rope_in_place_with_partial_rotary_dims(neox: int, dev: HostDevice, rng: np.random.Generator) -> None:
    rows, heads, d, n_rot = 4, 3, 64, 48
    x = rng.standard_normal((rows, heads, d)).astype(np.float32)
    pos = np.array([0, 7, 31_000, 131_071], np.int32)  # far positions: the angle is the CPU's double product
    inv = K.rope_inv_freq(n_rot, 500000.0)
    dx = dev.upload(x)
    dev.launch("ops", "rope", geometry.elementwise(rows * heads * n_rot // 2), dx, dev.upload(pos), dev.upload(inv),
               Int(rows), Int(heads), Int(d), Int(n_rot), Int(neox), Flt(1.0))
    got = dev.download(dx, x.shape, np.float32)
    np.testing.assert_allclose(got, K.rope(x, pos, inv, neox=bool(neox)), rtol=1e-6, atol=1e-6)
    assert np.array_equal(got[..., n_rot:], x[..., n_rot:])


# ------------------------------------------------------------------------------------------- attention
def _attend(dev: HostDevice, q: np.ndarray, caches: list[tuple[np.ndarray, np.ndarray]], k_pos: list[np.ndarray],
            q_pos: list[int], used: list[int], *, scale: float, window: int = 0, n_sink: int = 0,
            softcap: float = 0.0, sinks: np.ndarray | None = None, mask: Mask | None = None) -> np.ndarray:
    """The executor's launches over rows of [hq, d] queries, row i reading caches[i] (the same arrays may serve
    several rows: uploaded once), per-row device tables of pointers, flags, lengths and positions: attn_scores,
    attn_softmax, attn_wsum (+ attn_wsum_sum) — with a ``mask`` (its values, additive or not, per-row offsets, head
    and key strides) attn_mask between the first two. Without one also the fused form (attn_flash +
    attn_flash_sum), which must agree with them; its output is returned."""
    rows, hq, d = q.shape
    hkv, dv = caches[0][0].shape[1], caches[0][1].shape[2]
    uploaded: dict[int, DeviceBuffer] = {}

    def up(a: np.ndarray) -> int:
        if id(a) not in uploaded:
            uploaded[id(a)] = dev.upload(a)
        return uploaded[id(a)].ptr

    def table(values: list[int], dtype: Any) -> DeviceBuffer:
        return dev.upload(np.array(values, dtype))

    kp, vp = table([up(k) for k, _ in caches], np.uint64), table([up(v) for _, v in caches], np.uint64)
    posp = table([up(p) for p in k_pos], np.uint64)
    flags = table([int(k.dtype == np.float16) for k, _ in caches], np.int32)
    du, dqp = table(used, np.int64), table(q_pos, np.int32)
    s_max = max(used)
    at = geometry.attention(rows, hq, hkv, s_max, dv)
    scores, out = _filled(dev, rows * hq * s_max), _filled(dev, rows * hq * dv)
    dev.launch("attention", "attn_scores", at.scores, dev.upload(q), kp, flags, du, dqp, posp, Int(hq), Int(hkv),
               Int(d), Flt(scale), Flt(softcap), Int(window), Int(n_sink), scores, Long(s_max))
    if mask is not None:
        values, additive, row_off, h_stride, key_stride = mask
        dev.launch("attention", "attn_mask", at.mask, scores, du, dev.upload(values), Int(additive),
                   table(row_off, np.int64), Long(h_stride), Long(key_stride), Int(hq), Long(s_max))
    dev.launch("attention", "attn_softmax", at.softmax, scores, du, dev.upload(sinks) if sinks is not None else NULL,
               Int(hq), Long(s_max))
    partial = _filled(dev, at.partial_bytes // 4) if at.splits > 1 else out
    dev.launch("attention", "attn_wsum", at.wsum, scores, vp, flags, du, Int(hq), Int(hkv), Int(dv), Long(s_max),
               Int(at.splits), partial)
    if at.splits > 1:
        dev.launch("attention", "attn_wsum_sum", at.wsum_sum, partial, Int(hq), Int(dv), Int(at.splits), out)
    split = dev.download(out, (rows, hq, dv), np.float32)
    if mask is not None:
        return split
    parts, fused = _filled(dev, at.flash_bytes // 4), _filled(dev, rows * hq * dv)
    dev.launch("attention", "attn_flash", at.flash, dev.upload(q), kp, vp, flags, du, dqp, posp, Int(hq), Int(hkv),
               Int(d), Int(dv), Flt(scale), Flt(softcap), Int(window), Int(n_sink), Long(s_max), Int(at.splits),
               parts)
    dev.launch("attention", "attn_flash_sum", at.flash_sum, parts, dev.upload(sinks) if sinks is not None else NULL,
               Int(hq), Int(dv), Int(at.splits), fused)
    got = dev.download(fused, (rows, hq, dv), np.float32)
    np.testing.assert_allclose(got, split, rtol=1e-5, atol=1e-6)
    return got


def _cache(rng: np.random.Generator, s: int, hkv: int, d: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    return rng.standard_normal((s, hkv, d)).astype(dtype), rng.standard_normal((s, hkv, d)).astype(dtype)


@pytest.mark.parametrize("f16", [False, True])
@pytest.mark.parametrize("hq,hkv,d", [(8, 2, 32), (24, 2, 40)])
def test_decode_attention_with_gqa(f16: bool, hq: int, hkv: int, d: int, dev: HostDevice,
                                   rng: np.random.Generator) -> None:
    """3 rows over up to 200 slots (the value sums in stretches); groups of 4 heads, and of 12 (a block of 8
    heads and one of 4 per group) with a head dim of 40 (a partial stage of 8 dimensions)."""
    used = [37, 5, 200]
    caches = [_cache(rng, s, hkv, d, np.float16 if f16 else np.float32) for s in used]
    k_pos = [np.arange(s, dtype=np.int32) for s in used]
    k_pos[2][[3, 11]] = -1                                          # empty slots
    q = rng.standard_normal((len(used), hq, d)).astype(np.float32)
    got = _attend(dev, q, caches, k_pos, [s - 1 for s in used], used, scale=0.2)
    for i, (k, v) in enumerate(caches):
        want = K.attention(q[i:i + 1], k, v, q_pos=np.array([used[i] - 1], np.int32), k_pos=k_pos[i], scale=0.2)[0]
        np.testing.assert_allclose(got[i], want, rtol=1e-4, atol=1e-5)


def test_a_window_with_sink_tokens_sink_logits_and_softcap(dev: HostDevice, rng: np.random.Generator) -> None:
    hq, hkv, d, s = 4, 4, 16, 50
    k, v = _cache(rng, s, hkv, d, np.float32)
    k_pos = np.arange(s, dtype=np.int32)
    q = (rng.standard_normal((2, hq, d)) * 4).astype(np.float32)
    sinks = rng.standard_normal(hq).astype(np.float32)
    kw: dict[str, Any] = {"scale": 0.25, "window": 8, "n_sink": 3, "softcap": 5.0}
    got = _attend(dev, q, [(k, v)] * 2, [k_pos] * 2, [49, 20], [s, 21], sinks=sinks, **kw)
    for i, (qp, used) in enumerate(((49, s), (20, 21))):
        want = K.attention(q[i:i + 1], k[:used], v[:used], q_pos=np.array([qp], np.int32), k_pos=k_pos[:used],
                           sinks=sinks, **kw)[0]
        np.testing.assert_allclose(got[i], want, rtol=1e-4, atol=1e-5)


def test_prefill_rows_share_one_cache_with_their_own_positions(dev: HostDevice, rng: np.random.Generator) -> None:
    """A prefill of 6 tokens (positions 18..23) after 18 cached ones: 6 rows over the same cache, pointer tables and
    length, masked by their q_pos; a 7th row whose query precedes every key sees nothing: zeros."""
    hq, hkv, d, s = 6, 2, 32, 24
    k, v = _cache(rng, s, hkv, d, np.float16)
    k_pos = np.arange(s, dtype=np.int32)
    q = rng.standard_normal((7, hq, d)).astype(np.float32)
    q_pos = [18, 19, 20, 21, 22, 23, -1]
    got = _attend(dev, q, [(k, v)] * 7, [k_pos] * 7, q_pos, [s] * 7, scale=0.15, window=4, n_sink=1)
    want = K.attention(q[:6], k, v, q_pos=np.array(q_pos[:6], np.int32), k_pos=k_pos, scale=0.15, window=4, n_sink=1)
    np.testing.assert_allclose(got[:6], want, rtol=1e-4, atol=1e-5)
    assert np.array_equal(got[6], np.zeros((hq, d), np.float32))


@pytest.mark.parametrize("additive", [False, True])
def test_a_mask_input_on_the_scores(additive: bool, dev: HostDevice, rng: np.random.Generator) -> None:
    """A prefill of 5 queries (positions 7..11) over 12 keys with an Attention mask input, against the IR
    reference: a bool [seq, keys] keep-mask broadcast over the heads (head stride 0; one query keeps no key: zeros),
    or an additive [heads, seq, keys] one with -inf entries and +inf on keys the causal mask hides (they stay
    hidden: -inf, not +inf - inf = NaN)."""
    hq, hkv, d, s, t = 4, 2, 16, 12, 5
    k, v = _cache(rng, s, hkv, d, np.float32)
    q = rng.standard_normal((t, hq, d)).astype(np.float32)
    rows = [i * s for i in range(t)]
    if additive:
        m = rng.standard_normal((hq, t, s)).astype(np.float32)
        m[:, 1, :3] = -np.inf
        m[:, 0, s - t + 1:] = np.inf                                # query 0 (position 7) sees keys 0..7 only
        mask: Mask = (m, True, rows, t * s, 1)
    else:
        m = rng.random((t, s)) > 0.4
        m[2] = False
        mask = (m.astype(np.int32), False, rows, 0, 1)
    got = _attend(dev, q, [(k, v)] * t, [np.arange(s, dtype=np.int32)] * t, list(range(s - t, s)), [s] * t,
                  scale=0.3, softcap=4.0, mask=mask)
    want = ir_attention(q, k, v, mask=m, scale=0.3, softcap=4.0)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.isfinite(got).all() and (additive or np.array_equal(got[2], np.zeros((hq, d), np.float32)))


def test_a_bidirectional_window_by_shifted_positions(dev: HostDevice, rng: np.random.Generator) -> None:
    """Non-causal attention with a window as the executor expresses it (lower.py: Binder._query_positions): every
    query at s - 1, query i's key j at min(t - 1 - i + j, s - 1) of one shared array, so every key passes the
    causal test and the window hides exactly the keys p - j >= window (the IR reference's visible() without
    causal), later keys included."""
    hq, hkv, d, s, t, w = 2, 1, 16, 9, 6, 3
    k, v = _cache(rng, s, hkv, d, np.float32)
    q = rng.standard_normal((t, hq, d)).astype(np.float32)
    shared = np.minimum(np.arange(s + t - 1), s - 1).astype(np.int32)
    k_pos = [shared[t - 1 - i:t - 1 - i + s] for i in range(t)]
    got = _attend(dev, q, [(k, v)] * t, k_pos, [s - 1] * t, [s] * t, scale=0.25, window=w)
    want = ir_attention(q, k, v, causal=False, sliding_window=w, scale=0.25)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_attn_mask_touches_only_the_live_keys_its_grid_covers(dev: HostDevice) -> None:
    """One block of 128 keys over 200, head 0 of 2 (grid.y 1): those keys get the mask added (exactly: one f32
    sum), a hidden key (-inf) stays -inf and its mask value is never read, the rest keep their values."""
    hq, s = 2, 200
    sc = np.full((hq, s), SENTINEL, np.float32)
    sc[0, 5] = -np.inf
    scores = dev.upload(sc)
    m = np.full(s, 1.5, np.float32)
    m[5] = np.nan
    dev.launch("attention", "attn_mask", Launch((1, 1, 1), (128, 1, 1)), scores, dev.upload(np.array([s], np.int64)),
               dev.upload(m), Int(1), dev.upload(np.array([0], np.int64)), Long(0), Long(1), Int(hq), Long(s))
    want = sc.copy()
    want[0, :128] += np.float32(1.5)
    want[0, 5] = -np.inf
    assert np.array_equal(dev.download(scores, (hq, s), np.float32), want)


@pytest.mark.parametrize("f16", [0, 1])
@pytest.mark.parametrize("batch", [False, True])
def test_kv_store_rounds_as_numpy(f16: int, batch: bool, dev: HostDevice, rng: np.random.Generator) -> None:
    """Each row into its table entry's cache at used - seq_rows + r % seq_rows: a prefill's rows one after another
    in one cache (seq_rows = rows), a batch's rows one token each in their own caches at their own lengths (seq_rows
    = 1); f16 rounded as numpy's astype."""
    slots, width, rows, ldx = 10, 24, 3, 40
    x = (rng.standard_normal((rows, ldx)) * 100).astype(np.float32)
    x[0, :3] = [1e6, -7e4, 3e-8]                                   # overflow and a subnormal half
    dt = np.float16 if f16 else np.float32
    caches = [dev.upload(np.zeros((slots, width), dt)) for _ in range(rows if batch else 1)]
    table = [caches[r].ptr if batch else caches[0].ptr for r in range(rows)]
    used = [5, 9, 1] if batch else [7] * rows                     # a prefill of 3 tokens after 4 cached
    dev.launch("attention", "kv_store", geometry.elementwise(rows * width), dev.upload(x), Long(ldx), Int(rows),
               Int(width), dev.upload(np.array(table, np.uint64)), dev.upload(np.array(used, np.int64)),
               dev.upload(np.full(rows, f16, np.int32)), Int(1 if batch else rows))
    want = [np.zeros((slots, width), dt) for _ in caches]
    with np.errstate(over="ignore"):
        for r in range(rows):
            slot = used[r] - 1 if batch else used[r] - rows + r
            want[r if batch else 0][slot] = x[r, :width].astype(dt)
    for c, w in zip(caches, want, strict=True):
        assert np.array_equal(dev.download(c, (slots, width), dt).view(np.uint8), w.view(np.uint8))


# --------------------------------------------------------------------------------------------- coverage
def test_a_grid_too_small_leaves_the_rest_untouched(dev: HostDevice, rng: np.random.Generator) -> None:
    n, k = 10, 64
    raw = random_weight(DType.Q8_0, n, k, seed=3)
    x = rng.standard_normal(k).astype(np.float32)
    dy = _filled(dev, n)
    dev.launch("gemv", "gemv_q8_0_m1", Launch((2, 1, 1), (32, 4, 1)), dev.upload(raw), Long(DType.Q8_0.nbytes(k)),
               Int(n), Int(k), dev.upload(x), Long(k), dy, Long(n))
    y = dev.download(dy, (n,), np.float32)
    assert (y[8:] == SENTINEL).all() and (y[:8] != SENTINEL).all()

    a = rng.standard_normal(300).astype(np.float32)
    dy = _filled(dev, 300)
    dev.launch("ops", "add", Launch((1, 1, 1), (256, 1, 1)), dev.upload(a), dev.upload(a), dy, Long(300))
    y = dev.download(dy, (300,), np.float32)
    assert np.array_equal(y[:256], 2 * a[:256]) and (y[256:] == SENTINEL).all()

    dy = _filled(dev, 3 * 64)
    dev.launch("ops", "rms_norm", Launch((2, 1, 1), (256, 1, 1)), dev.upload(np.ones(3 * 64, np.float32)),
               dev.upload(np.ones(64, np.float32)), dy, Int(64), Flt(0.0), Int(0))
    y = dev.download(dy, (3, 64), np.float32)
    assert (y[:2] == 1).all() and (y[2] == SENTINEL).all()

    n = m = 70
    raw = random_weight(DType.Q4_0, n, k, seed=4)
    qa, da, sa = K.quantize_activations(rng.standard_normal((m, k)).astype(np.float32))
    dy = _filled(dev, m * n)
    dev.launch("mmq", "mmq_q4_0", Launch((1, 1, 1), (16, 16, 1)), dev.upload(raw), Long(DType.Q4_0.nbytes(k)), Int(n),
               Int(k), dev.upload(qa), dev.upload(da), dev.upload(sa), Int(m), dy, Long(n))
    y = dev.download(dy, (m, n), np.float32)
    assert (y[:64, :64] != SENTINEL).all() and (y[64:] == SENTINEL).all() and (y[:, 64:] == SENTINEL).all()

    hq, d, s = 2, 16, 200              # one block of 128 keys, kv head 0's group only (2 heads over 2 kv heads)
    kc = dev.upload(rng.standard_normal((s, 2, d)).astype(np.float32))
    k_table, pos_table = (dev.upload(np.array([b.ptr], np.uint64))
                          for b in (kc, dev.upload(np.arange(s, dtype=np.int32))))
    flags, used, q_pos = dev.upload(np.array([0], np.int32)), dev.upload(np.array([s], np.int64)), \
        dev.upload(np.array([s], np.int32))
    scores = _filled(dev, hq * s)
    dev.launch("attention", "attn_scores", Launch((1, 1, 1), (128, 1, 1)), dev.upload(np.ones((hq, d), np.float32)),
               k_table, flags, used, q_pos, pos_table, Int(hq), Int(2), Int(d), Flt(1.0), Flt(0.0), Int(0), Int(0),
               scores, Long(s))
    got = dev.download(scores, (hq, s), np.float32)
    assert (got[0, :128] != SENTINEL).all() and (got[0, 128:] == SENTINEL).all() and (got[1] == SENTINEL).all()
    scores = _filled(dev, hq * s)  # over one kv head, one block row is the whole group: both heads
    dev.launch("attention", "attn_scores", Launch((1, 1, 1), (128, 1, 1)), dev.upload(np.ones((hq, d), np.float32)),
               k_table, flags, used, q_pos, pos_table, Int(hq), Int(1), Int(d), Flt(1.0), Flt(0.0), Int(0), Int(0),
               scores, Long(s))
    got = dev.download(scores, (hq, s), np.float32)
    assert (got[:, :128] != SENTINEL).all() and (got[:, 128:] == SENTINEL).all()


def test_kernels_refuse_a_block_shape_they_do_not_assume(host: HostDevice) -> None:
    dev = host
    buf = dev.alloc(4096)
    for block in ((16, 4, 1), (32, 8, 1)):  # a warp per row; the shared tiles hold 4 warps' rows
        with pytest.raises(BackendError, match=r"gemv_f32_m1 assumes blocks of \(32, 4, 1\)"):
            dev.launch("gemv", "gemv_f32_m1", Launch((1, 1, 1), block), buf, Long(128), Int(1), Int(32), buf,
                       Long(32), buf, Long(1))
            dev.synchronize()
    with pytest.raises(BackendError, match=r"attn_scores assumes blocks of \(128, \.\.\.\)"):
        dev.launch("attention", "attn_scores", Launch((1, 1, 1), (256, 1, 1)), buf, buf, buf, buf, buf, buf, Int(1),
                   Int(1), Int(32), Flt(1.0), Flt(0.0), Int(0), Int(0), buf, Long(8))
        dev.synchronize()
    with pytest.raises(BackendError, match=r"attn_wsum assumes blocks of \(128, \.\.\.\)"):
        dev.launch("attention", "attn_wsum", Launch((1, 1, 1), (64, 1, 1)), buf, buf, buf, buf, Int(1), Int(1),
                   Int(32), Long(8), Int(1), buf)
        dev.synchronize()
    with pytest.raises(BackendError, match="rms_norm assumes blocks of"):
        dev.launch("ops", "rms_norm", Launch((1, 1, 1), (128, 1, 1)), buf, buf, buf, Int(32), Flt(1e-6), Int(0))
        dev.synchronize()


def test_a_launch_reading_past_its_buffer_fails(host: HostDevice) -> None:
    """n = 5 rows of a weight holding 4: the host model names the access (a device would read garbage)."""
    dev = host
    raw = random_weight(DType.F16, 4, 32, seed=0)
    with pytest.raises(BackendError, match="not inside one allocation"):
        dev.launch("gemv", "gemv_f16_m1", geometry.gemv(5), dev.upload(raw), Long(64), Int(5), Int(32),
                   dev.upload(np.ones(32, np.float32)), Long(32), dev.alloc(20), Long(5))
        dev.synchronize()


@pytest.mark.parametrize("threaded", [False, True], ids=["sequential", "threaded"])
def test_a_misaligned_access_fails_the_launch_as_on_a_gpu(threaded: bool) -> None:
    """x86 reads a float at an odd address, a GPU faults (CUDA_ERROR_MISALIGNED_ADDRESS): both host builds check
    every access's alignment and the launch says which kernel, where and what."""
    dev = HostDevice(kernels="all" if threaded else "compiled")
    try:
        x, w, y = dev.upload(np.arange(40, dtype=np.float32)), dev.upload(np.ones(32, np.float32)), dev.alloc(256)

        def launch(xp: int) -> None:
            if threaded:
                dev.launch("ops", "rms_norm", geometry.norm(1), Ptr(xp), w, y, Int(32), Flt(1e-6), Int(0))
            else:
                dev.launch("ops", "add", geometry.elementwise(8), Ptr(xp), w, y, Long(8))
            dev.synchronize()
        with pytest.raises(BackendError, match=rf"{'rms_norm' if threaded else 'add'}: a 4-byte access at the "
                                               r"misaligned address 0x[0-9a-f]+ \(ops.cu:\d+\): a GPU faults there"):
            launch(x.ptr + 2)
        launch(x.ptr)  # aligned: runs, and the failure above left nothing behind
        assert dev.compiled_launches == 2
    finally:
        dev.close()


def test_the_host_builds_cover_every_kernel_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """host_kernels builds every kernel of the modules: the thread-local ones sequentially, the warp- and
    block-level ones only in the threaded build (asked for explicitly: it is slow); a build is cached under the
    sources' digest (a second process loads it, builds nothing)."""
    from uaii.backends.cuda import host_kernels as hk

    names = set(hk.host_kernel_names())
    every = {k for m in MODULES.values() for k in m.kernels}
    assert set(hk.THREAD_LOCAL) <= every and names <= every
    assert all(f"dequant_{t[1]}" in names and f"rows_{t[1]}" in names for t in TYPES.values())
    threaded = set(hk.threaded_kernel_names())
    assert not names & threaded and names | threaded == every
    for warp_level in ("gemv_q4_0_m1", "gemv_idx_q4_0", "mmq_q4_0", "rms_norm", "add_rms_norm", "layer_norm",
                       "attn_softmax"):
        assert hk.host_kernel(warp_level) is None and warp_level in threaded, warp_level
    monkeypatch.setenv("UAII_CACHE_DIR", str(tmp_path))
    hk._library.cache_clear()
    try:
        assert hk.host_kernel("bcast") is not None
        built = list((tmp_path / "cuda-host").glob("uk_cuda_host_*.so"))
        assert len(built) == 1 and hk._digest("sequential") in built[0].name
        hk._library.cache_clear()
        assert hk.host_kernel("bcast") is not None  # loaded from the cache
        assert list((tmp_path / "cuda-host").glob("uk_cuda_host_*.so")) == built
    finally:
        hk._library.cache_clear()

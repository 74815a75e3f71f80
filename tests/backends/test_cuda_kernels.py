"""The CUDA backend's kernels without a GPU, and with one when there is.

Without a device (CI): every module compiles with NVRTC for sm_80 and sm_90 and defines the kernels the host
names; the on-disk cache reuses a CUBIN under a key of source digest, architecture and NVRTC version, written
whole or not at all; the GGUF decoders (kernels/decode.cuh) are also built by the host C compiler and decode every
type bit for bit as uaii.kernels.dequantize; the launch geometry covers every row once within the device limits.
With a device (tests marked by ``needs_device``, skipped with "no CUDA device" elsewhere): every GEMV type and row
count against numpy, dequantize bit for bit, RMSNorm, SwiGLU, RoPE and decode attention against the CPU kernels.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import uaii.kernels as K
from uaii.backends.base import BackendError
from uaii.backends.cuda import geometry
from uaii.backends.cuda.device import arch_for, device_count
from uaii.backends.cuda.nvrtc import cache_key, compile_module, nvrtc_version, write_atomic
from uaii.backends.cuda.sources import GEMV_ROWS, MODULES, TYPES, source
from uaii.ir import DType

HAVE_NVRTC = importlib.util.find_spec("cuda.bindings") is not None
if not HAVE_NVRTC and os.environ.get("CI"):
    pytest.fail("CI installs cuda-bindings and the NVRTC wheel (dependency group 'cuda'): they are missing",
                pytrace=False)
needs_nvrtc = pytest.mark.skipif(not HAVE_NVRTC, reason="NVRTC not installed: pip install 'uaii-backends[cuda]'")
DEVICES = device_count() if HAVE_NVRTC else 0
needs_device = pytest.mark.skipif(DEVICES == 0, reason="no CUDA device")
KERNELS = Path(__file__).resolve().parents[2] / "packages/uaii-backends/src/uaii/backends/cuda/kernels"


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(18)


# --------------------------------------------------------------------------------------------- compilation
@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_compiles_and_defines_its_kernels(name: str, arch: str,
                                                       monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("UAII_CACHE_DIR", str(tmp_path))
    compiled = compile_module(name, arch, use_cache=False)
    assert compiled.cubin[:4] == b"\x7fELF" and not compiled.cached
    missing = [k for k in MODULES[name].kernels if k.encode() + b"\0" not in compiled.cubin]
    assert not missing, f"{name}.cu for {arch} does not define {missing[:5]}"


@needs_nvrtc
def test_the_disk_cache_reuses_a_cubin_under_its_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("UAII_CACHE_DIR", str(tmp_path))
    first = compile_module("ops", "sm_90")
    again = compile_module("ops", "sm_90")
    assert not first.cached and again.cached and again.cubin == first.cubin
    files = sorted(p.name for p in (tmp_path / "cuda").iterdir())
    version = nvrtc_version()
    assert files == [f"{cache_key(MODULES['ops'], 'sm_90', version)}.cubin"]
    assert f"nvrtc{version[0]}.{version[1]}" in files[0] and "-sm_90-" in files[0]
    assert cache_key(MODULES["ops"], "sm_80", version) != cache_key(MODULES["ops"], "sm_90", version)
    assert cache_key(MODULES["ops"], "sm_90", (version[0], version[1] + 1)) != files[0][:-6]


def test_a_changed_source_changes_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from uaii.backends.cuda import sources

    before = cache_key(MODULES["ops"], "sm_90", (13, 2))
    original = sources.source
    sources.source.cache_clear()
    monkeypatch.setattr(sources, "source", lambda f: original(f) + ("// edited\n" if f == "decode.cuh" else ""))
    assert cache_key(MODULES["ops"], "sm_90", (13, 2)) != before  # a header edit recompiles every module


def test_a_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "cuda" / "x.cubin"

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, b"\x7fELF" * 100)
    assert list(target.parent.iterdir()) == []


def test_bad_module_and_architecture_are_refused() -> None:
    with pytest.raises(BackendError, match="no kernel module 'nope'"):
        compile_module("nope", "sm_90")
    with pytest.raises(BackendError, match="sm_70"):
        compile_module("ops", "sm_70")


def test_architecture_of_a_device() -> None:
    assert [arch_for(*c) for c in [(8, 0), (8, 6), (8, 7), (8, 9), (9, 0)]] == ["sm_80", "sm_86", "sm_86", "sm_89",
                                                                             "sm_90"]
    with pytest.raises(BackendError, match="Ampere and later"):
        arch_for(7, 5)


# --------------------------------------------------------------------------------- decoders on the host
HOST_WRAPPER = """
#include <string.h>
#define UK_DEV static inline
static inline float uk_bits_float(unsigned int b) { float f; memcpy(&f, &b, 4); return f; }
#define UK_AS_FLOAT(b) uk_bits_float((unsigned int)(b))
#include "decode.cuh"
void uk_decode_units(int t, const unsigned char *row, long long units, float *y) {
    for (long long u = 0; u < units; u++) uk_row_unit(t, row, u, y + 32 * u);
}
"""


@pytest.fixture(scope="module")
def host_decode(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """decode.cuh built by the host compiler (cffi, as the package builds its C kernels), with the C reference's
    floating-point rule (-ffp-contract=off)."""
    from cffi import FFI

    ffi = FFI()
    ffi.cdef("void uk_decode_units(int t, const unsigned char *row, long long units, float *y);")
    ffi.set_source("_uk_cuda_decode_host", HOST_WRAPPER, include_dirs=[str(KERNELS)],
                   extra_compile_args=["-O2", "-ffp-contract=off", "-std=c99"])
    out = tmp_path_factory.mktemp("cuda_decode")
    lib_path = ffi.compile(tmpdir=str(out))
    spec = importlib.util.spec_from_file_location("_uk_cuda_decode_host", lib_path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _decode(host: Any, dtype: DType, raw: np.ndarray, n: int) -> np.ndarray:
    y = np.empty(n, np.float32)
    ffi = host.ffi
    host.lib.uk_decode_units(TYPES[dtype][0], ffi.from_buffer("unsigned char[]", raw), n // 32,
                             ffi.from_buffer("float[]", y))
    return y


def _quieted(x: np.ndarray) -> np.ndarray:
    """The bits, a NaN's quiet bit set: the CPU's own f16 paths differ there (its F16C conversion quiets a
    signaling NaN, its scalar tail keeps it as numpy does), so payload and sign are compared, not that bit."""
    bits = x.view(np.uint32).copy()
    bits[np.isnan(x)] |= 0x00400000
    return bits


@pytest.mark.parametrize("dtype", list(TYPES), ids=lambda t: t.value)
def test_decoders_match_dequantize_bit_for_bit(dtype: DType, host_decode: Any, rng: np.random.Generator) -> None:
    """Every block a file can hold: random bytes (any scale bits, negative and subnormal halves, infinities, NaN
    payloads) and, where uaii quantizes the type, quantized random weights."""
    n = 256 * 12
    samples = [rng.integers(0, 256, dtype.nbytes(n), dtype=np.uint8)]
    if dtype in K.QUANT_TYPES:
        samples.append(K.quantize(rng.standard_normal(n).astype(np.float32) * 3, dtype))
    for raw in samples:
        want = K.dequantize(raw, dtype, n).astype(np.float32)
        got = _decode(host_decode, dtype, raw, n)
        bad = np.flatnonzero(_quieted(got) != _quieted(want))
        assert bad.size == 0, (f"{dtype.value}: value {bad[0]}: {got[bad[0]]!r} != {want[bad[0]]!r} (bits "
                               f"{got.view(np.uint32)[bad[0]]:#x}, {want.view(np.uint32)[bad[0]]:#x})")


def test_the_type_table_agrees_with_the_ir() -> None:
    for dtype, (_, suffix, nbytes, units) in TYPES.items():
        assert dtype.nbytes(32 * units) == nbytes, dtype
        assert f"UK_{suffix.upper()} {TYPES[dtype][0]}" in source("decode.cuh"), dtype


# ------------------------------------------------------------------------------------------------ geometry
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 576, 49152, 151936])
def test_gemv_launch_covers_every_row_once(rows: int) -> None:
    at = geometry.gemv(rows)
    per_block = at.block[1]
    assert at.block[0] == 32 and at.grid[0] * per_block >= rows > (at.grid[0] - 1) * per_block


@pytest.mark.parametrize("m", [1, 2, 3, 7, 8, 11, 16, 33])
def test_gemv_splits_cover_the_rows_with_instantiated_sizes(m: int) -> None:
    parts = geometry.gemv_splits(m)
    assert [s for s, _ in parts] == list(np.cumsum([0] + [k for _, k in parts])[:-1])
    assert sum(k for _, k in parts) == m and all(k in GEMV_ROWS for _, k in parts)
    assert len(parts) <= m // 8 + 3


def test_launch_limits_are_refused() -> None:
    with pytest.raises(BackendError, match="device limits"):
        geometry.Launch((1, 70000, 1), (32, 1, 1))
    with pytest.raises(BackendError, match="more than 1024 threads"):
        geometry.Launch((1, 1, 1), (32, 64, 1))
    with pytest.raises(BackendError, match="empty launch"):
        geometry.elementwise(10).__class__((0, 1, 1), (1, 1, 1))
    with pytest.raises(BackendError, match="at least one activation row"):
        geometry.gemv_splits(0)
    scores, softmax, wsum = geometry.attention(4, 32, 4097, 128)
    assert scores.grid == (33, 32, 4) and softmax.grid == (32, 4, 1) and wsum.grid == (1, 32, 4)
    assert geometry.elementwise(1).threads >= 1 and geometry.norm(7).grid == (7, 1, 1)


# ---------------------------------------------------------------------------------------------- on a device
@pytest.fixture(scope="module")
def device() -> Any:
    from uaii.backends.cuda.device import CudaDevice

    with CudaDevice.open() as dev:
        yield dev


@needs_device
@pytest.mark.parametrize("m", GEMV_ROWS)
@pytest.mark.parametrize("dtype", list(TYPES), ids=lambda t: t.value)
def test_gemv_on_the_device(dtype: DType, m: int, device: Any, rng: np.random.Generator) -> None:
    n, k = 67, 512
    raw = (K.quantize(rng.standard_normal((n, k)).astype(np.float32), dtype) if dtype in K.QUANT_TYPES
           else rng.integers(0, 256, dtype.nbytes(n * k), dtype=np.uint8))
    w = K.dequantize(raw, dtype, n * k).reshape(n, k).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    dw, dx, dy = device.upload(raw), device.upload(x), device.alloc(m * n * 4)
    c = ctypes
    device.launch("gemv", f"gemv_{TYPES[dtype][1]}_m{m}", geometry.gemv(n), dw, c.c_longlong(dtype.nbytes(k)),
                  c.c_int(n), c.c_int(k), dx, c.c_longlong(k), dy, c.c_longlong(n))
    device.synchronize()
    got = device.download(dy, (m, n), np.float32)
    want = x.astype(np.float64) @ w.T
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3 * float(np.abs(want).max() + 1))


@needs_device
@pytest.mark.parametrize("dtype", list(TYPES), ids=lambda t: t.value)
def test_dequantize_on_the_device_is_bit_exact(dtype: DType, device: Any, rng: np.random.Generator) -> None:
    n = 256 * 40
    raw = rng.integers(0, 256, dtype.nbytes(n), dtype=np.uint8)
    dw, dy = device.upload(raw), device.alloc(n * 4)
    device.launch("dequant", f"dequant_{TYPES[dtype][1]}", geometry.elementwise(n // 32), dw,
                  ctypes.c_longlong(n // 32), dy)
    device.synchronize()
    got, want = device.download(dy, (n,), np.float32), K.dequantize(raw, dtype, n).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@needs_device
def test_row_ops_on_the_device(device: Any, rng: np.random.Generator) -> None:
    rows, n = 5, 576
    a, r, w = (rng.standard_normal((rows, n)).astype(np.float32) for _ in range(3))
    da, dr, dw, ds, dy = device.upload(a), device.upload(r), device.upload(w[0]), device.alloc(a.nbytes), \
        device.alloc(a.nbytes)
    device.launch("ops", "add_rms_norm", geometry.norm(rows), da, dr, ds, dw, dy, ctypes.c_int(n),
                  ctypes.c_float(1e-6), ctypes.c_int(0))
    device.synchronize()
    np.testing.assert_allclose(device.download(ds, (rows, n), np.float32), a + r, rtol=0, atol=0)
    np.testing.assert_allclose(device.download(dy, (rows, n), np.float32), K.rms_norm(a + r, w[0], 1e-6),
                               rtol=2e-5, atol=2e-5)
    g, u = rng.standard_normal((rows, 2, n)).astype(np.float32).transpose(1, 0, 2)
    gu = np.concatenate([g, u], axis=1)
    dgu, dout = device.upload(gu), device.alloc(rows * n * 4)
    device.launch("ops", "swiglu", geometry.elementwise(rows * n), dgu, ctypes.c_uint64(dgu.ptr + n * 4),
                  ctypes.c_longlong(2 * n), ctypes.c_int(n), ctypes.c_longlong(rows * n), dout)
    device.synchronize()
    np.testing.assert_allclose(device.download(dout, (rows, n), np.float32), K.swiglu(g, u), rtol=2e-6, atol=1e-6)


@needs_device
@pytest.mark.parametrize("f16", [False, True])
def test_decode_attention_on_the_device(f16: bool, device: Any, rng: np.random.Generator) -> None:
    hq, hkv, d, used = 8, 2, 64, [37, 5, 120]
    rows = len(used)
    dt = np.float16 if f16 else np.float32
    caches = [(rng.standard_normal((s, hkv, d)).astype(dt), rng.standard_normal((s, hkv, d)).astype(dt))
              for s in used]
    q = rng.standard_normal((rows, hq, d)).astype(np.float32)
    kb = [device.upload(k) for k, _ in caches]
    vb = [device.upload(v) for _, v in caches]
    pos = [device.upload(np.arange(s, dtype=np.int32)) for s in used]
    dq = device.upload(q)
    kp = device.upload(np.array([b.ptr for b in kb], np.uint64))
    vp = device.upload(np.array([b.ptr for b in vb], np.uint64))
    posp = device.upload(np.array([b.ptr for b in pos], np.uint64))
    flags = device.upload(np.full(rows, int(f16), np.int32))
    du = device.upload(np.array(used, np.int64))
    qpos = device.upload(np.array([s - 1 for s in used], np.int32))
    s_max = max(used)
    scores, out = device.alloc(rows * hq * s_max * 4), device.alloc(rows * hq * d * 4)
    l1, l2, l3 = geometry.attention(rows, hq, s_max, d)
    c = ctypes
    device.launch("attention", "attn_scores", l1, dq, kp, flags, du, qpos, posp, c.c_int(hq), c.c_int(hkv),
                  c.c_int(d), c.c_float(0.125), c.c_float(0.0), c.c_int(16), c.c_int(2), scores, c.c_longlong(s_max))
    device.launch("attention", "attn_softmax", l2, scores, du, c.c_uint64(0), c.c_int(hq), c.c_longlong(s_max))
    device.launch("attention", "attn_wsum", l3, scores, vp, flags, du, c.c_int(hq), c.c_int(hkv), c.c_int(d),
                  c.c_longlong(s_max), out)
    device.synchronize()
    got = device.download(out, (rows, hq, d), np.float32)
    for i, (k, v) in enumerate(caches):
        want = K.attention(q[i:i + 1], k, v, scale=0.125, window=16, n_sink=2)[0]
        np.testing.assert_allclose(got[i], want, rtol=1e-4, atol=1e-5)

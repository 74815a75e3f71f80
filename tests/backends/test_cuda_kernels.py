"""The CUDA backend's kernels without a GPU, and with one when there is.

Without a device (CI): every module compiles with NVRTC for sm_80 and sm_90 and defines the kernels the host
names; the on-disk cache reuses a CUBIN under a key of source digest, architecture and NVRTC version, written
whole or not at all; the GGUF decoders (kernels/decode.cuh) are also built by the host C compiler and decode every
type bit for bit as uaii.kernels.dequantize; the launch geometry covers every row once within the device limits.
The int8 prefill GEMM's arithmetic (mmq.cu: decode.cuh's integer units, the activation quantizer, the per-pair
sums) is built on the host too: units decode to the float decoders' values, activations quantize to the CPU's bits,
and the sums are the exact product of their inputs up to rounding.
With a device (tests marked by ``needs_device``, skipped with "no CUDA device" elsewhere): every GEMV type and row
count against numpy, the int8 GEMM against its host build, dequantize bit for bit, RMSNorm, SwiGLU, RoPE and decode
attention against the CPU kernels.
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
from uaii.backends.cuda.nvrtc import cache_key, compile_module, nvrtc_version, resources, unit_costs, write_atomic
from uaii.backends.cuda.sources import GEMV_ROWS, MMQ_TYPES, MODULES, TYPES, source
from uaii.ir import DType
from uaii.kernels.testing import random_weight

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


MAX_REGISTERS = 128
"""Registers per thread a kernel may take: at least 16 warps an SM (65536 registers), where 255 (attn_scores once,
all its loads in flight at once) left 4 — the latency a load waits is hidden by the warps an SM can switch to."""


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_kernel_spills_or_takes_more_than_128_registers(name: str, arch: str) -> None:
    got = resources(name, arch)
    assert set(got) == set(MODULES[name].kernels)
    spilled = {k: r.spill_bytes for k, r in got.items() if r.spill_bytes}
    assert not spilled, f"{name}.cu for {arch}: kernels spill registers to local memory: {spilled}"
    heavy = {k: r.registers for k, r in got.items() if r.registers > MAX_REGISTERS}
    assert not heavy, f"{name}.cu for {arch}: more than {MAX_REGISTERS} registers a thread: {heavy}"
    assert all(r.shared_bytes <= 48 << 10 for r in got.values())


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_int8_gemv_costs_a_unit_less_than_the_float_gemv(arch: str) -> None:
    """What a 32-value unit costs a lane once the step is staged, counted in the SASS (nvrtc.unit_costs): the int8
    form (gemvq_) takes fewer instructions and shared-memory loads than the float one for every block type and row
    count — for Q4_0 at one row under half of both (float: 239 and 41 on sm_90, int8: 100 and 18), which is why the
    lowering runs it (gemv.cu's head). And the decoders read 16-bit words: Q6_K's float unit took 100 shared loads
    when they read bytes, 67 now."""
    costs = unit_costs("gemv", arch)
    for dtype in MMQ_TYPES:
        for m in GEMV_ROWS:
            q, f = costs[f"gemvq_{TYPES[dtype][1]}_m{m}"], costs[f"gemv_{TYPES[dtype][1]}_m{m}"]
            assert q.instructions < f.instructions and q.shared_loads < f.shared_loads, (dtype, m, q, f)
    q4, f4 = costs["gemvq_q4_0_m1"], costs["gemv_q4_0_m1"]
    assert 2 * q4.instructions < f4.instructions and 2 * q4.shared_loads < f4.shared_loads, (q4, f4)
    assert costs["gemv_q6_k_m1"].shared_loads <= 70, costs["gemv_q6_k_m1"]


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
#include <math.h>
#include <string.h>
#define UK_DEV static inline
static inline float uk_bits_float(unsigned int b) { float f; memcpy(&f, &b, 4); return f; }
#define UK_AS_FLOAT(b) uk_bits_float((unsigned int)(b))
static inline unsigned int uk_float_bits(float f) { unsigned int b; memcpy(&b, &f, 4); return b; }
#define UK_AS_BITS(f) uk_float_bits(f)
static inline int __dp4a(int a, int b, int c) {  /* CUDA's: four signed byte products added to c */
    for (int i = 0; i < 4; i++) c += (signed char)(a >> (8 * i)) * (signed char)(b >> (8 * i));
    return c;
}
#include "decode.cuh"
void uk_f2h_all(const float *x, long long n, unsigned short *h) {
    for (long long i = 0; i < n; i++) h[i] = uk_f2h(x[i]);
}
void uk_decode_units(int t, const unsigned char *row, long long units, float *y) {
    for (long long u = 0; u < units; u++) uk_row_unit(t, row, u, y + 32 * u);
}
void uk_decode_units_int(int t, const unsigned char *row, long long units, signed char *q, float *sc, float *mn) {
    for (long long u = 0; u < units; u++) {
        uk_u32 w[8];
        uk_row_unit_int(t, row, u, w, sc + 2 * u, mn + u);
        memcpy(q + 32 * u, w, 32);  /* byte j of the words is value j (little-endian, as a GPU) */
    }
}
void uk_quant_act_blocks(const float *x, long long blocks, signed char *q, float *d, float *s) {
    for (long long b = 0; b < blocks; b++) uk_quant_act_block(x + 32 * b, q + 32 * b, d + b, s + b);
}
/* mmq.cu's sums, one pair at a time in the kernel's order: units in turn, each half's integer sum, uk_unit_dot */
void uk_mmq_host(int t, const unsigned char *w, long long row_bytes, int n, int k, const signed char *qa,
                 const float *da, const float *sa, int m, float *y) {
    for (int r = 0; r < n; r++)
        for (int c = 0; c < m; c++) {
            float acc = 0.0f;
            for (long long u = 0; u < k / 32; u++) {
                uk_u32 words[8];
                signed char q[32];
                float sc[2], mn;
                uk_row_unit_int(t, w + r * row_bytes, u, words, sc, &mn);
                memcpy(q, words, 32);
                const signed char *a = qa + (long long)c * k + 32 * u;
                int lo = 0, hi = 0;
                for (int j = 0; j < 16; j++) { lo += q[j] * a[j]; hi += q[j + 16] * a[j + 16]; }
                acc += uk_unit_dot(lo, hi, sc, mn, da[c * (k / 32) + u], sa[c * (k / 32) + u]);
            }
            y[(long long)c * n + r] = acc;
        }
}
"""


@pytest.fixture(scope="module")
def host_decode(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """decode.cuh built by the host compiler (cffi, as the package builds its C kernels), with the C reference's
    floating-point rule (-ffp-contract=off)."""
    from cffi import FFI

    ffi = FFI()
    ffi.cdef("""
        void uk_decode_units(int t, const unsigned char *row, long long units, float *y);
        void uk_decode_units_int(int t, const unsigned char *row, long long units, signed char *q, float *sc,
                                 float *mn);
        void uk_quant_act_blocks(const float *x, long long blocks, signed char *q, float *d, float *s);
        void uk_f2h_all(const float *x, long long n, unsigned short *h);
        void uk_mmq_host(int t, const unsigned char *w, long long row_bytes, int n, int k, const signed char *qa,
                         const float *da, const float *sa, int m, float *y);
    """)
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


def test_f16_rounding_matches_numpy(host_decode: Any, rng: np.random.Generator) -> None:
    """uk_f2h (the f16 KV cache's rows) rounds as numpy's astype(float16): every f16 value, the halfway points
    between neighbours (ties to even), overflow, subnormals and random floats of every exponent."""
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    exact = h[np.isfinite(h)].astype(np.float32)
    up = np.nextafter(h[np.isfinite(h)], np.float16(np.inf)).astype(np.float32)
    mid = ((exact.astype(np.float64) + up.astype(np.float64)) / 2).astype(np.float32)
    rand = (rng.standard_normal(100000) * np.exp2(rng.integers(-30, 20, 100000))).astype(np.float32)
    x = np.concatenate([exact, mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(np.inf)), rand,
                        np.float32([np.inf, -np.inf, 65504, 65519.99, 65520, 1e9, -1e-9, 2.0**-25, 2.0**-24])])
    x = x[np.isfinite(x) | np.isinf(x)]
    got = np.empty(x.size, np.uint16)
    host_decode.lib.uk_f2h_all(_ptr(host_decode, "float", x), x.size, _ptr(host_decode, "unsigned short", got))
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{x[bad[0]]!r}: {got[bad[0]]:#x} != {want[bad[0]]:#x}"
    nan = np.float32([np.nan])
    host_decode.lib.uk_f2h_all(_ptr(host_decode, "float", nan), 1, _ptr(host_decode, "unsigned short", got))
    assert np.isnan(got[:1].view(np.float16)[0])


def _ptr(host: Any, ctype: str, a: np.ndarray) -> Any:
    return host.ffi.from_buffer(f"{ctype}[]", a)


def _decode_int(host: Any, dtype: DType, raw: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q, sc, mn = np.empty(n, np.int8), np.empty(n // 16, np.float32), np.empty(n // 32, np.float32)
    host.lib.uk_decode_units_int(TYPES[dtype][0], _ptr(host, "unsigned char", raw), n // 32,
                                 _ptr(host, "signed char", q), _ptr(host, "float", sc), _ptr(host, "float", mn))
    return q, sc, mn


def _quantize_act(host: Any, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    flat = np.ascontiguousarray(x, np.float32).reshape(-1)
    q, d, s = np.empty(flat.size, np.int8), np.empty(flat.size // 32, np.float32), np.empty(flat.size // 32, np.float32)
    host.lib.uk_quant_act_blocks(_ptr(host, "float", flat), flat.size // 32, _ptr(host, "signed char", q),
                                 _ptr(host, "float", d), _ptr(host, "float", s))
    return q, d, s


def _host_mmq(host: Any, dtype: DType, raw: np.ndarray, n: int, k: int, qa: np.ndarray, da: np.ndarray,
              sa: np.ndarray, m: int) -> np.ndarray:
    """[m, n]: mmq.cu's sums of the activation blocks (qa, da, sa) with the weight, host-built (uk_mmq_host)."""
    want = np.empty((m, n), np.float32)
    host.lib.uk_mmq_host(TYPES[dtype][0], _ptr(host, "unsigned char", raw), dtype.nbytes(k), n, k,
                         _ptr(host, "signed char", qa), _ptr(host, "float", da), _ptr(host, "float", sa), m,
                         _ptr(host, "float", want))
    return want


@pytest.mark.parametrize("dtype", MMQ_TYPES, ids=lambda t: t.value)
def test_integer_units_decode_to_the_float_decoders_values(dtype: DType, host_decode: Any,
                                                           rng: np.random.Generator) -> None:
    """The int8 GEMM's form of every unit (q, two half scales, an additive term) gives uk_unit's values: quantized
    random weights, and random bytes with finite scales."""
    n = 256 * 12
    samples = [K.quantize(rng.standard_normal(n).astype(np.float32) * 3, dtype)] if dtype in K.QUANT_TYPES else []
    samples.append(random_weight(dtype, 1, n, seed=3))
    for raw in samples:
        q, sc, mn = _decode_int(host_decode, dtype, raw, n)
        values = np.repeat(sc, 16) * q.astype(np.float32) + np.repeat(mn, 32)
        want = _decode(host_decode, dtype, raw, n)
        assert np.isfinite(want).all() and np.array_equal(values, want), dtype  # +0 and -0 compare equal


def test_the_activation_quantizer_is_the_cpus_bit_for_bit(host_decode: Any, rng: np.random.Generator) -> None:
    x = rng.standard_normal(32 * 64).astype(np.float32) * np.repeat(rng.uniform(1e-3, 1e3, 64), 32).astype(np.float32)
    x[:32] = 0.0                                                   # an all-zero block
    x[32:64] = np.arange(32, dtype=np.float32) - 15.5              # rounding ties (x * 127 / 16.5 ...)
    x[64:96] = np.float32(3e38) * np.sign(rng.standard_normal(32)).astype(np.float32)
    got, want = _quantize_act(host_decode, x), K.quantize_activations(x)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g.view(np.uint8) if g.dtype == np.int8 else g.view(np.uint32),
                              w.view(np.uint8) if w.dtype == np.int8 else w.view(np.uint32))


@pytest.mark.parametrize("dtype", MMQ_TYPES, ids=lambda t: t.value)
def test_the_int8_gemm_sums_the_exact_product_of_its_inputs(dtype: DType, host_decode: Any,
                                                            rng: np.random.Generator) -> None:
    """mmq.cu's arithmetic (built on the host, pair by pair in the kernel's order) against the exact product of
    the dequantized weight and the quantized activations: it may only round (what a device adds is the tiling)."""
    n, k, m = 37, 512, 5
    raw = random_weight(dtype, n, k, seed=11)
    x = rng.standard_normal((m, k)).astype(np.float32)
    qa, da, sa = _quantize_act(host_decode, x)
    y = _host_mmq(host_decode, dtype, raw, n, k, qa, da, sa, m)
    w = K.dequantize(raw, dtype, n * k).reshape(n, k).astype(np.float64)
    xq = (qa.reshape(m, k // 32, 32).astype(np.float64) * da.reshape(m, k // 32, 1)).reshape(m, k)
    want = xq @ w.T
    scale = np.abs(xq) @ np.abs(w).T
    assert np.all(np.abs(y - want) <= 1e-5 * scale + 1e-30), np.abs(y - want).max()
    cpu = K.matmul(x, K.PackedWeight.from_raw(raw, dtype, (n, k)))  # the CPU's int8 path: the same inputs
    np.testing.assert_allclose(y, cpu, rtol=1e-4, atol=1e-4 * float(np.abs(cpu).max()))


def test_the_type_table_agrees_with_the_ir() -> None:
    for dtype, (_, suffix, nbytes, units) in TYPES.items():
        assert dtype.nbytes(32 * units) == nbytes, dtype
        assert f"UK_{suffix.upper()} {TYPES[dtype][0]}" in source("decode.cuh"), dtype


# ------------------------------------------------------------------------------------------------ geometry
@pytest.mark.parametrize("define,module,constant", [("UK_GEMV_WARPS", "gemv", "GEMV_WARPS"),
                                                    ("UK_BLOCK", "ops", "NORM_BLOCK"),
                                                    ("UK_ATTN_BLOCK", "attention", "ATTN_SOFTMAX"),
                                                    ("UK_ATTN_KEYS", "attention", "ATTN_KEYS"),
                                                    ("MMQ_TILE", "mmq", "MMQ_TILE"), ("MMQ_SIDE", "mmq", "MMQ_SIDE"),
                                                    ("UK_FLASH_VALUES", "attention", "FLASH_VALUES")])
def test_the_launch_geometry_is_the_sources(define: str, module: str, constant: str) -> None:
    """A block size the kernels assume (their shared arrays are sized by it) and the one geometry launches with
    are the same number: a larger block would write past a shared array."""
    import re

    found = re.search(rf"^#define {define} (\d+)", source(f"{module}.cu"), re.M)
    assert found is not None, f"{module}.cu defines no {define}"
    assert int(found.group(1)) == getattr(geometry, constant)


def test_the_gemv_tile_sizes_are_the_types_units() -> None:
    """gemv.cu sizes each type's shared weight tile by a table of its own (constexpr, where decode.cuh's block sizes
    are C functions): 32 units' bytes of every type but f32 (read directly), as TYPES has them."""
    import re

    text = source("gemv.cu")
    body = text[text.index("constexpr int gemv_tile_bytes()"):]
    body = body[body.index("return") + len("return"):body.index("}")]
    table = {}
    for clause in body.split(":"):  # "T == UK_A || T == UK_B ? bytes", the last "bytes; /* UK_Q6_K */"
        names, size = re.findall(r"UK_(\w+)", clause), re.search(r"(\d+)", clause.split("?")[-1])
        assert names and size, clause
        table.update(dict.fromkeys(names, int(size[1])))
    for dtype, (_, suffix, nbytes, units) in TYPES.items():
        assert table[suffix.upper()] == (0 if dtype is DType.F32 else 32 // units * nbytes), dtype


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


@pytest.mark.parametrize(("n", "m"), [(1, 1), (64, 64), (65, 3), (576, 512), (1536, 17), (49152, 130)])
def test_mmq_launch_covers_every_pair_once(n: int, m: int) -> None:
    at = geometry.mmq(n, m)
    assert at.block == (16, 16, 1)
    tiles = geometry.mmq_tiles(at, n, m)
    assert sum((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in tiles) == n * m
    assert all(r0 < r1 and c0 < c1 for r0, r1, c0, c1 in tiles)
    with pytest.raises(BackendError, match="weight and activation rows"):
        geometry.mmq(0, m)


def test_launch_limits_are_refused() -> None:
    with pytest.raises(BackendError, match="device limits"):
        geometry.Launch((1, 70000, 1), (32, 1, 1))
    with pytest.raises(BackendError, match="more than 1024 threads"):
        geometry.Launch((1, 1, 1), (32, 64, 1))
    with pytest.raises(BackendError, match="empty launch"):
        geometry.elementwise(10).__class__((0, 1, 1), (1, 1, 1))
    with pytest.raises(BackendError, match="at least one activation row"):
        geometry.gemv_splits(0)
    at = geometry.attention(4, 32, 8, 4097, 128)
    assert at.scores.grid == (33, 8, 4) and at.mask.grid == (33, 32, 4) and at.softmax.grid == (32, 4, 1)
    assert at.wsum.grid == (8, 8, 4)  # 4 rows x 8 kv heads (groups of 4) in 8 stretches of keys: 256 blocks
    assert at.splits == 8 and at.partial_bytes == 4 * 4 * 32 * 8 * 128
    assert geometry.elementwise(1).threads >= 1 and geometry.norm(7).grid == (7, 1, 1)


@pytest.mark.parametrize("hq,hkv,blocks", [(9, 3, 3), (32, 8, 8), (32, 2, 4), (4, 1, 1), (24, 1, 3), (8, 8, 8)])
def test_attention_scores_a_gqa_group_per_block(hq: int, hkv: int, blocks: int) -> None:
    """attn_scores and attn_wsum load a block's keys or values once for up to ATTN_HEADS query heads of one kv head's
    group: a group of 16 is two block rows, 24 three; the mask keeps a block row per query head."""
    at = geometry.attention(1, hq, hkv, 300, 64)
    assert at.scores.grid == (3, blocks, 1) and at.wsum.grid[1] == blocks and at.mask.grid == (3, hq, 1)
    with pytest.raises(BackendError, match="not whole GQA groups"):
        geometry.attention(1, 9, 2, 300, 64)


@pytest.mark.parametrize("rows,hq,s_max", [(1, 9, 2048), (1, 9, 10), (1, 32, 100_000), (2, 4, 300), (30, 9, 64),
                                           (200, 9, 4096)])
def test_attention_sums_stretches_of_keys_when_there_are_few_heads(rows: int, hq: int, s_max: int) -> None:
    """A decode step's few (row, head group) blocks each sum stretches of keys (no more stretches than s_max /
    ATTN_STRETCH rounded up, until there are ATTN_BLOCKS blocks), every key in exactly one stretch; many (a
    prefill) sum all keys in one. One kv head here: its hq heads are ceil(hq / ATTN_HEADS) block rows."""
    at = geometry.attention(rows, hq, 1, s_max, 64)
    groups = -(-hq // geometry.ATTN_HEADS)
    pairs = rows * groups
    assert at.wsum.grid == (at.splits, groups, rows) and at.wsum_sum.grid == (1, hq, rows)
    chunk = -(-s_max // at.splits)
    assert chunk * at.splits >= s_max > chunk * (at.splits - 1)  # every key in exactly one stretch
    assert at.splits <= -(-s_max // geometry.ATTN_STRETCH) and pairs * (at.splits - 1) < geometry.ATTN_BLOCKS
    assert at.partial_bytes == (4 * rows * hq * at.splits * 64 if at.splits > 1 else 0)
    assert (at.splits > 1) == (pairs < geometry.ATTN_BLOCKS and s_max > geometry.ATTN_STRETCH)
    # the fused form: attn_wsum's blocks and stretches, a thread per key; its combine a thread per output value
    assert at.flash.grid == at.wsum.grid and at.flash.block == (geometry.ATTN_KEYS, 1, 1)
    assert at.flash_sum.grid == (-(-64 // geometry.ATTN_KEYS), hq, rows)
    assert at.flash_bytes == 4 * rows * hq * at.splits * (64 + 2)


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
    raw = random_weight(dtype, n, k, seed=m)  # (random bytes would hold NaN scales where no quantizer exists)
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
    # random bytes hold NaN scales: a GPU's arithmetic gives its one canonical NaN where numpy keeps the payload,
    # so a NaN is compared as a NaN, every other value bit for bit
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def _quantized_on_device(device: Any, x: np.ndarray) -> tuple[Any, Any, Any]:
    """x's rows quantized on the device by quant_act: its int8 values, d and s."""
    m, k = x.shape
    nb = k // 32
    dx, dq, dd, ds = device.upload(x), device.alloc(m * k), device.alloc(m * nb * 4), device.alloc(m * nb * 4)
    device.launch("mmq", "quant_act", geometry.elementwise(m * nb), dx, ctypes.c_longlong(k), ctypes.c_int(m),
                  ctypes.c_int(k), dq, dd, ds)
    return dq, dd, ds


@needs_device
@pytest.mark.parametrize("dtype", MMQ_TYPES, ids=lambda t: t.value)
def test_int8_gemm_on_the_device(dtype: DType, device: Any, host_decode: Any, rng: np.random.Generator) -> None:
    """quant_act gives the CPU's int8 blocks bit for bit; mmq_<type> (tiles past both edges) the host-built sums up
    to the rounding of contracted float operations."""
    n, k, m = 131, 768, 70
    nb = k // 32
    raw = random_weight(dtype, n, k, seed=5)
    x = rng.standard_normal((m, k)).astype(np.float32)
    dw, (dq, dd, ds), dy = device.upload(raw), _quantized_on_device(device, x), device.alloc(m * n * 4)
    c = ctypes
    device.launch("mmq", f"mmq_{TYPES[dtype][1]}", geometry.mmq(n, m), dw, c.c_longlong(dtype.nbytes(k)),
                  c.c_int(n), c.c_int(k), dq, dd, ds, c.c_int(m), dy, c.c_longlong(n))
    device.synchronize()
    qa, da, sa = _quantize_act(host_decode, x)
    assert np.array_equal(device.download(dq, (m * k,), np.int8), qa)
    assert np.array_equal(device.download(dd, (m * nb,), np.float32).view(np.uint32), da.view(np.uint32))
    assert np.array_equal(device.download(ds, (m * nb,), np.float32).view(np.uint32), sa.view(np.uint32))
    want = _host_mmq(host_decode, dtype, raw, n, k, qa, da, sa, m)
    got = device.download(dy, (m, n), np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@needs_device
@pytest.mark.parametrize("m", GEMV_ROWS)
@pytest.mark.parametrize("dtype", MMQ_TYPES, ids=lambda t: t.value)
def test_int8_gemv_on_the_device(dtype: DType, m: int, device: Any, host_decode: Any,
                                 rng: np.random.Generator) -> None:
    """gemvq_<type>_m<M> gives the int8 GEMM's sums (the host-built mmq pairs; only their order of addition differs):
    a step of 32 units and a part of one, rows of odd units (every other one starting 2 bytes into a word, where the
    16-bit loads must stay aligned), rows past the last warp's."""
    n, k = 67, 1536 if dtype.block_size == 256 else 1568
    raw = random_weight(dtype, n, k, seed=7 + m)
    x = rng.standard_normal((m, k)).astype(np.float32)
    dw, (dq, dd, ds), dy = device.upload(raw), _quantized_on_device(device, x), device.alloc(m * n * 4)
    c = ctypes
    device.launch("gemv", f"gemvq_{TYPES[dtype][1]}_m{m}", geometry.gemv(n), dw, c.c_longlong(dtype.nbytes(k)),
                  c.c_int(n), c.c_int(k), dq, dd, ds, dy, c.c_longlong(n))
    device.synchronize()
    qa, da, sa = _quantize_act(host_decode, x)
    want = _host_mmq(host_decode, dtype, raw, n, k, qa, da, sa, m)
    got = device.download(dy, (m, n), np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    exact = x.astype(np.float64) @ K.dequantize(raw, dtype, n * k).reshape(n, k).astype(np.float64).T
    np.testing.assert_allclose(got, exact, rtol=0, atol=0.02 * float(np.abs(exact).max()))  # int8 activations


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
    at = geometry.attention(rows, hq, hkv, s_max, d)
    assert at.splits > 1  # 3 rows of 8 heads: the sums run over stretches of keys, then add up
    partial = device.alloc(at.partial_bytes)
    c = ctypes
    device.launch("attention", "attn_scores", at.scores, dq, kp, flags, du, qpos, posp, c.c_int(hq), c.c_int(hkv),
                  c.c_int(d), c.c_float(0.125), c.c_float(0.0), c.c_int(16), c.c_int(2), scores, c.c_longlong(s_max))
    device.launch("attention", "attn_softmax", at.softmax, scores, du, c.c_uint64(0), c.c_int(hq),
                  c.c_longlong(s_max))
    device.launch("attention", "attn_wsum", at.wsum, scores, vp, flags, du, c.c_int(hq), c.c_int(hkv), c.c_int(d),
                  c.c_longlong(s_max), c.c_int(at.splits), partial)
    device.launch("attention", "attn_wsum_sum", at.wsum_sum, partial, c.c_int(hq), c.c_int(d), c.c_int(at.splits), out)
    device.synchronize()
    got = device.download(out, (rows, hq, d), np.float32)
    for i, (k, v) in enumerate(caches):
        want = K.attention(q[i:i + 1], k, v, scale=0.125, window=16, n_sink=2)[0]
        np.testing.assert_allclose(got[i], want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------- launch signatures
_C_KINDS = {"int": "i", "long long": "l", "float": "f"}


def _kernel_params(module: str) -> dict[str, str]:
    """Every ``extern "C" __global__`` kernel of ``module`` with its parameters' kinds, from the source as the host
    compiler's preprocessor expands it (the kernel families are macros)."""
    import re
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no host C compiler to preprocess the kernel sources")
    defs = ["-D__global__=", "-D__device__=", "-D__forceinline__=", "-D__restrict__=", "-D__shared__=",
            "-D__launch_bounds__(x)="]
    text = subprocess.run([cc, "-E", "-P", "-x", "c++", *defs, "-I", str(KERNELS), str(KERNELS / f"{module}.cu")],
                          check=True, capture_output=True, text=True).stdout
    out = {}
    for m in re.finditer(r'extern\s+"C"\s+void\s+(\w+)\s*\(([^)]*)\)', text):
        kinds = ""
        for p in m.group(2).split(","):
            p = p.strip()
            if "*" in p:
                kinds += "p"
                continue
            base = " ".join(w for w in p.split()[:-1] if w != "const")
            kinds += _C_KINDS[base]
        out[m.group(1)] = kinds
    return out


@pytest.mark.parametrize("module", sorted(MODULES))
def test_the_launch_signatures_are_the_sources(module: str) -> None:
    """sources.signature (what both devices check every launch's arguments against) is each kernel's parameter
    list, and a launch with a wrong count or C type is refused before it reaches a device."""
    from uaii.backends.cuda.sources import check_args, signature

    params = _kernel_params(module)
    assert sorted(params) == sorted(MODULES[module].kernels)
    for kernel, kinds in params.items():
        assert signature(kernel) == kinds, kernel
    kernel = MODULES[module].kernels[0]
    kinds = signature(kernel)
    wrong = {"p": ctypes.c_int(0), "i": ctypes.c_longlong(0), "l": ctypes.c_int(0), "f": ctypes.c_double(0)}
    good = {"p": ctypes.c_uint64(0), "i": ctypes.c_int(0), "l": ctypes.c_longlong(0), "f": ctypes.c_float(0)}
    check_args(module, kernel, tuple(good[k] for k in kinds))
    with pytest.raises(BackendError, match=f"{kernel}: argument 0 must be"):
        check_args(module, kernel, (wrong[kinds[0]], *(good[k] for k in kinds[1:])))
    with pytest.raises(BackendError, match="takes"):
        check_args(module, kernel, tuple(good[k] for k in kinds[:-1]))
    with pytest.raises(BackendError, match="has no kernel"):
        check_args(module, "nope", ())

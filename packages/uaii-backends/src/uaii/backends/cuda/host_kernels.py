"""The CUDA kernels themselves, built by the host C++ compiler, for the host model of a device.

Why: the references (reference.py) say what each kernel must compute, and the host model runs a whole model through
them — but the CUDA C a GPU runs is checked against them only on a GPU. Every kernel whose threads do not talk to
each other (no shared memory, no warp shuffles, no barriers: one thread per item) computes the same thing when its
threads run one after another, so the host compiler can build the very source NVRTC compiles and run it over the
launch's grid. ``HostDevice(kernels="compiled")`` then runs those launches through this build (and the others —
GEMV, the norms, the softmax, the int8 GEMM — through their references): a model's tokens on it check the indexing,
the strides and the arithmetic of the CUDA source on any machine.

The warp- and block-level kernels (GEMV, the int8 GEMM, the norms, the softmax) are built too, in a second library
whose blocks run one after another as one OS thread per CUDA thread: ``__syncthreads`` is a barrier of the block's
threads, ``__shfl_down_sync`` an exchange through a per-warp array between two barriers of the warp, ``__shared__``
one static array (a block at a time). That is exact for these kernels (their shuffles and barriers are reached by
every thread of a warp or block) and slow — thousands of threads per launch — so ``kernels="all"`` uses it (the
kernel tests), ``kernels="compiled"`` not (model runs: those launches go through their references).

What it shows beyond the values: a load or store at a misaligned address, which x86 performs and a GPU faults on
(both builds are compiled with ``-fsanitize=alignment``; the launch raises BackendError naming the source line).
What it cannot show: races between threads, and speed. The math library is the host's (expf, erff, tanhf, sincos:
within an ulp or two of CUDA's). Builds are cached under ``$UAII_CACHE_DIR/cuda-host`` keyed by the sources' digest,
like NVRTC's CUBINs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from uaii.backends.base import BackendError
from uaii.backends.cuda.nvrtc import cache_dir
from uaii.backends.cuda.sources import HEADERS, MODULES, source

HOST_MODULES = ("ops", "attention", "moe", "dequant", "mmq", "ew", "packed")
"""Modules whose one-thread-per-item kernels are built for the host."""
THREAD_LOCAL = ("swiglu", "geglu", "add", "bcast", "unary", "copy_rows", "rope", "attn_mask",
                "attn_wsum", "attn_wsum_sum", "attn_flash_sum", "kv_store", "moe_route", "moe_group", "moe_combine",
                "quant_act", "pk_rows", *MODULES["ew"].kernels)
"""Kernels whose threads never communicate (plus every dequant_/rows_): a sequential run over the grid is exact."""

_BUILTINS = r"""
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
#define __launch_bounds__(x)
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fmul_rn(float a, float b) { return a * b; }  /* never contracted: -ffp-contract=off */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (signed char)(a >> (8 * i)) * (signed char)(b >> (8 * i));
    return c;
}
/* -fsanitize=alignment calls this on a load or store through a misaligned pointer (the layout is the sanitizer
 * ABI's TypeMismatchData, v1): the first one is kept for uk_misaligned, which the host reports */
struct uk_ubsan_loc { const char *file; unsigned line, column; };
struct uk_ubsan_mismatch { uk_ubsan_loc loc; const void *type; unsigned char log_align, kind; };
static uk_ubsan_loc uk_bad_loc;
static unsigned long long uk_bad_ptr;
static int uk_bad_align, uk_bad;
extern "C" __attribute__((visibility("hidden"))) void __ubsan_handle_type_mismatch_v1(void *data, void *ptr) {
    if (__atomic_exchange_n(&uk_bad, 1, __ATOMIC_SEQ_CST) == 0) {
        const uk_ubsan_mismatch *d = (const uk_ubsan_mismatch *)data;
        uk_bad_loc = d->loc;
        uk_bad_ptr = (unsigned long long)ptr;
        uk_bad_align = 1 << d->log_align;
    }
}
extern "C" int uk_misaligned(const char **file, unsigned *line, unsigned long long *ptr, int *align) {
    if (!uk_bad) return 0;
    *file = uk_bad_loc.file; *line = uk_bad_loc.line; *ptr = uk_bad_ptr; *align = uk_bad_align;
    uk_bad = 0;
    return 1;
}
"""
"""The CUDA built-ins the kernels use, for the host compiler (both builds), and the handler of the alignment check:
a GPU faults on a load or store of a misaligned address (CUDA_ERROR_MISALIGNED_ADDRESS) where x86 reads it
without complaint, so both builds are compiled with ``-fsanitize=alignment`` (the handler above, not the sanitizer's
runtime) and every launch on the host ends with a BackendError naming the first misaligned access, if any."""

SHIM = r"""
#include <math.h>
#include <string.h>
struct uk_dim3 { unsigned x, y, z; };
static uk_dim3 blockIdx, threadIdx, blockDim, gridDim;
""" + _BUILTINS + r"""
static inline void __syncthreads() {}
static inline float __shfl_down_sync(unsigned, float v, int) { return v; }  /* never called: warp kernels excluded */
"""


THREADED_MODULES = ("gemv", "ops", "attention", "mmq", "packed")
THREADED = ("rms_norm", "add_rms_norm", "layer_norm", "attn_scores", "attn_softmax", "attn_flash", "pk_gemv",
            "pk_gemv_idx")
"""Kernels whose threads meet in shuffles or barriers (plus every gemv_, gemv_idx_, gemvq_ and mmq_): the threaded
build."""

THREADED_SHIM = r"""
#include <math.h>
#include <string.h>
#include <barrier>
#include <memory>
#include <thread>
#include <vector>
struct uk_dim3 { unsigned x, y, z; };
static thread_local uk_dim3 threadIdx;
static uk_dim3 blockIdx, blockDim, gridDim;
static std::barrier<> *uk_block_bar;
static std::vector<std::unique_ptr<std::barrier<>>> uk_warp_bars;
static unsigned uk_threads;
static float uk_lanes[32][32];
""" + _BUILTINS + r"""
static inline unsigned uk_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
static inline void __syncthreads() { uk_block_bar->arrive_and_wait(); }
static inline float __shfl_down_sync(unsigned, float v, int off) {
    const unsigned t = uk_tid(), w = t / 32, l = t % 32, width = uk_threads - 32 * w < 32 ? uk_threads - 32 * w : 32;
    uk_lanes[w][l] = v;
    uk_warp_bars[w]->arrive_and_wait();
    const float r = l + off < width ? uk_lanes[w][l + off] : v;
    uk_warp_bars[w]->arrive_and_wait();
    return r;
}
"""


def threaded_kernel_names() -> tuple[str, ...]:
    """Every kernel the threaded build runs."""
    return tuple(k for m in THREADED_MODULES for k in MODULES[m].kernels
                 if k in THREADED or k.startswith(("gemv_", "gemvq_", "mmq_")))


def host_kernel_names() -> tuple[str, ...]:
    """Every kernel this build runs: the thread-local ones and the whole dequant family."""
    names = [k for m in HOST_MODULES for k in MODULES[m].kernels
             if k in THREAD_LOCAL or k.startswith(("dequant_", "rows_"))]
    return tuple(names)


def _params(module: str) -> dict[str, list[tuple[str, str]]]:
    """Each kernel of ``module`` with its parameters (C type text, name), from the source as the host
    preprocessor expands it."""
    cc = shutil.which("c++") or shutil.which("g++")
    if cc is None:
        raise BackendError("[cuda-host] no host C++ compiler (c++ / g++) to build the kernels")
    defs = ["-D__global__=", "-D__device__=", "-D__forceinline__=inline", "-D__restrict__=", "-D__shared__=static",
            "-D__launch_bounds__(x)="]
    kernels = Path(str(_kernels_dir()))
    text = subprocess.run([cc, "-E", "-P", "-x", "c++", *defs, "-I", str(kernels), str(kernels / f"{module}.cu")],
                          check=True, capture_output=True, text=True).stdout
    out = {}
    for m in re.finditer(r'extern\s+"C"\s+void\s+(\w+)\s*\(([^)]*)\)', text):
        params = []
        for p in m.group(2).split(","):
            p = " ".join(p.split())
            name = re.findall(r"\w+$", p)[0]
            params.append((p[:-len(name)].strip(), name))
        out[m.group(1)] = params
    return out


def _kernels_dir() -> Any:
    from importlib import resources

    return resources.files("uaii.backends.cuda") / "kernels"


def _wrapper(kernel: str, params: list[tuple[str, str]], threaded: bool = False) -> tuple[str, str]:
    """(C++ definition, cffi declaration) of ``run_<kernel>``: the grid loop around the kernel, arguments passed as
    void pointers and plain scalars, cast to the kernel's own types; ``threaded``: each block's threads as OS
    threads with the block's and the warps' barriers."""
    def generic(ctype: str) -> str:
        return "void *" if "*" in ctype else ctype.replace("const ", "")
    args = ", ".join(f"{generic(t)} a{i}" for i, (t, _) in enumerate(params))
    head = f'extern "C" void run_{kernel}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, ' \
           f'unsigned bz{", " + args if args else ""})'
    call = ", ".join(f"({t})a{i}" for i, (t, _) in enumerate(params))
    blocks = "  for (unsigned z = 0; z < gz; z++) for (unsigned y = 0; y < gy; y++) for (unsigned x = 0; x < gx; x++)"
    if not threaded:
        body = (f"{head} {{\n  gridDim = {{gx, gy, gz}}; blockDim = {{bx, by, bz}};\n{blocks}\n"
                "    for (unsigned tz = 0; tz < bz; tz++) for (unsigned ty = 0; ty < by; ty++)\n"
                "      for (unsigned tx = 0; tx < bx; tx++) {\n"
                "        blockIdx = {x, y, z}; threadIdx = {tx, ty, tz};\n"
                f"        {kernel}({call});\n      }}\n}}\n")
    else:
        body = (f"{head} {{\n  gridDim = {{gx, gy, gz}}; blockDim = {{bx, by, bz}};\n"
                "  const unsigned nt = bx * by * bz;\n  uk_threads = nt;\n"
                "  std::barrier<> bar(nt);\n  uk_block_bar = &bar;\n  uk_warp_bars.clear();\n"
                "  for (unsigned w = 0; w * 32 < nt; w++)\n"
                "    uk_warp_bars.emplace_back(new std::barrier<>(nt - 32 * w < 32 ? nt - 32 * w : 32));\n"
                f"{blocks} {{\n    blockIdx = {{x, y, z}};\n    std::vector<std::thread> ts;\n"
                "    for (unsigned t = 0; t < nt; t++) ts.emplace_back([&, t] {\n"
                "      threadIdx = {t % bx, (t / bx) % by, t / (bx * by)};\n"
                f"      {kernel}({call});\n    }});\n    for (auto &th : ts) th.join();\n  }}\n}}\n")
    return body, head.removeprefix('extern "C" ') + ";"


FLAGS = ("-O2", "-ffp-contract=off", "-w", "-fsanitize=alignment")
"""The host compiler's options for both builds (part of a build's digest)."""


def _digest(flavour: str) -> str:
    shim, modules, names = _FLAVOURS[flavour]
    h = hashlib.sha256(shim.encode() + " ".join(FLAGS).encode())
    for name in (*HEADERS, *(f"{m}.cu" for m in modules)):
        h.update(name.encode() + b"\0" + source(name).encode() + b"\0")
    h.update(",".join(names()).encode())
    return h.hexdigest()[:20]


@cache
def _library(flavour: str = "sequential") -> Any:
    """The built module of ``flavour`` (cffi, C++), from the cache when its digest matches."""
    from cffi import FFI

    shim, modules, names_of = _FLAVOURS[flavour]
    threaded = flavour == "threaded"
    tag = f"uk_cuda_host_{flavour}_{_digest(flavour)}"
    out = cache_dir().parent / "cuda-host"
    out.mkdir(parents=True, exist_ok=True)
    built = next(iter(out.glob(f"{tag}*.so")), None)
    names = set(names_of())
    sources, decls = [], []
    for module in modules:
        for kernel, params in _params(module).items():
            if kernel in names:
                body, decl = _wrapper(kernel, params, threaded)
                sources.append(body)
                decls.append(decl)
    ffi = FFI()
    ffi.cdef("\n".join(decls) + "\nint uk_misaligned(const char **, unsigned *, unsigned long long *, int *);")
    if built is None:
        code = shim + "".join(f'#include "{m}.cu"\n' for m in modules) + "\n".join(sources)
        flags = [*FLAGS, *(["-std=c++20", "-pthread"] if threaded else [])]
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            ffi.set_source(tag, code, source_extension=".cpp", include_dirs=[str(_kernels_dir())],
                           extra_compile_args=flags, extra_link_args=["-pthread"] if threaded else [])
            path = Path(ffi.compile(tmpdir=tmp))
            built = out / path.name
            os.replace(path, built)  # whole or not at all, as NVRTC's cache
    spec = importlib.util.spec_from_file_location(tag, built)
    if spec is None or spec.loader is None:
        raise BackendError(f"[cuda-host] cannot load the host build {built}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules.setdefault(tag, mod)
    return mod


def host_kernel(kernel: str, threaded: bool = False) -> Callable[[Any, tuple[Any, ...]], None] | None:
    """``fn(launch, values)`` running the host build of ``kernel`` over the launch's grid (pointers as real
    addresses): a thread-local kernel from the sequential build, a warp- or block-level one from the threaded build
    when ``threaded``; None otherwise."""
    if kernel in host_kernel_names():
        mod = _library("sequential")
    elif threaded and kernel in threaded_kernel_names():
        mod = _library("threaded")
    else:
        return None
    fn = getattr(mod.lib, f"run_{kernel}")
    ffi = mod.ffi

    def run(at: Any, values: tuple[Any, ...]) -> None:
        ptrs = set(i for i, k in enumerate(_kinds(kernel)) if k == "p")
        args = [ffi.cast("void *", int(v)) if i in ptrs else v for i, v in enumerate(values)]
        fn(*at.grid, *at.block, *args)
        file, line, ptr, align = (ffi.new("const char **"), ffi.new("unsigned *"), ffi.new("unsigned long long *"),
                                  ffi.new("int *"))
        if mod.lib.uk_misaligned(file, line, ptr, align):
            where = f"{Path(ffi.string(file[0]).decode()).name}:{line[0]}"
            raise BackendError(f"[cuda-host] {kernel}: a {align[0]}-byte access at the misaligned address "
                               f"{ptr[0]:#x} ({where}): a GPU faults there (CUDA_ERROR_MISALIGNED_ADDRESS)")
    return run


def _kinds(kernel: str) -> str:
    from uaii.backends.cuda.sources import signature

    return signature(kernel)


_FLAVOURS: dict[str, tuple[str, tuple[str, ...], Callable[[], tuple[str, ...]]]] = {
    "sequential": (SHIM, HOST_MODULES, host_kernel_names),
    "threaded": (THREADED_SHIM, THREADED_MODULES, threaded_kernel_names),
}

__all__ = ["HOST_MODULES", "THREADED", "THREADED_MODULES", "THREAD_LOCAL", "host_kernel", "host_kernel_names",
           "threaded_kernel_names"]

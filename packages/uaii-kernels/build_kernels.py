"""cffi build script of uaii-kernels (API / out-of-line mode), named by setup.py's ``cffi_modules``.

Compiles csrc/*.c into the extension module ``uaii.kernels._uaii_kernels``. The cdef is the region between the
CDEF markers of csrc/uaii_kernels.h, so the header stays the single source of truth. Builds are portable: no
-march=native; SIMD functions carry their own target attributes and are picked at run time by cpuid.
Run directly (``python build_kernels.py``) to compile in place for development.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc"
HEADER = CSRC / "uaii_kernels.h"
# x86_*.c hold AVX2 / AVX-VNNI / AVX-512 variants behind __attribute__((target)); neon.c only builds on aarch64.
SOURCES = [
    "cpu.c", "threadpool.c", "quant_ref.c", "quantize.c", "repack.c", "held.c", "kernels_scalar.c", "gemm.c", "api.c",
    "ops.c", "attention.c", "nbits.c", "mlxq.c", "x86_avx2.c", "x86_avxvnni.c", "x86_avx512.c", "neon.c",
]


def _cdef() -> str:
    text = HEADER.read_text()
    start = text.index("/* CDEF BEGIN */") + len("/* CDEF BEGIN */")
    return text[start:text.index("/* CDEF END */")]


def _compile_args() -> list[str]:
    if sys.platform == "win32":
        return ["/O2", "/fp:precise"]
    # -fno-trapping-math: no FP exception flags are read anywhere, and without it GCC will not if-convert the
    # clamps of the row kernels' exp (ops_impl.inc), so SiLU/GELU/GLU stayed scalar on every ISA (10 ns per
    # element). It changes no value: no reassociation, no contraction (-ffp-contract=off), same bits per lane.
    # -fno-tree-loop-distribute-patterns: GCC turned the zeroing of small register arrays (a kernel's accumulators,
    # a zero-padded group) into memset, expanded as `rep stos`, whose start-up cost exceeded the kernel's work per
    # weight row (a 4-row Q4_1 GEMM over k = 512 ran 1.75x slower). Explicit memset/memcpy calls are unaffected.
    args = ["-O3", "-std=c11", "-fno-math-errno", "-fno-trapping-math", "-fno-tree-loop-distribute-patterns",
            "-ffp-contract=off", "-fvisibility=hidden", "-pthread", "-Wall", "-Wno-unused-function"]
    if os.environ.get("UAII_KERNELS_DEBUG"):
        args += ["-O0", "-g"]
    return args


def make_builder(base: str = "") -> FFI:
    """The FFI builder; ``base`` prefixes the source paths (setuptools runs us from the package directory and
    wants relative paths, a direct run compiles elsewhere and needs absolute ones)."""
    ffi = FFI()
    ffi.cdef(_cdef())
    ffi.set_source(
        "uaii.kernels._uaii_kernels",
        '#include "uaii_kernels.h"\n',
        sources=[os.path.join(base, "csrc", s) for s in SOURCES],
        include_dirs=[os.path.join(base, "csrc")],
        extra_compile_args=_compile_args(),
        extra_link_args=[] if sys.platform == "win32" else ["-pthread", "-lm"],
    )
    return ffi


ffibuilder = make_builder()

if __name__ == "__main__":
    import shutil

    built = make_builder(str(HERE)).compile(tmpdir=str(HERE / "build" / "cffi"), verbose=False)
    pkg = HERE / "src" / "uaii" / "kernels"
    for old in pkg.glob("_uaii_kernels*.so"):
        old.unlink()                       # a stale build with another suffix would shadow this one
    dest = pkg / Path(built).name
    shutil.copy2(built, dest)
    print(dest)

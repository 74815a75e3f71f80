"""cffi build script (API / out-of-line mode) of ``uaii.storage._storage_cffi``.

Run by setuptools through ``cffi_modules`` in setup.py; the cdef is the block between the CDEF markers of
csrc/uaii_storage.h, so the header stays the single source of truth. Portable flags only (no -march=native).
"""

from __future__ import annotations

import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "csrc")
HEADER = os.path.join(CSRC, "uaii_storage.h")


def _cdef() -> str:
    with open(HEADER, encoding="utf-8") as fh:
        text = fh.read()
    m = re.search(r"/\* CDEF BEGIN \*/(.*?)/\* CDEF END \*/", text, re.S)
    if m is None:
        raise RuntimeError(f"{HEADER}: CDEF BEGIN/END markers not found")
    return m.group(1)


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "uaii.storage._storage_cffi",
    '#include "uaii_storage.h"\n',
    # Relative paths: setuptools rejects absolute source paths in an sdist build.
    sources=[os.path.relpath(os.path.join(CSRC, "uaii_storage.c"))],
    include_dirs=[os.path.relpath(CSRC)],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-pthread"],
    extra_link_args=["-pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)

"""Where the header and libuaii are, and the compiler/linker flags a C program needs to use them."""

from __future__ import annotations

import os
import re
import shlex
import sys
import sysconfig
from pathlib import Path

from uaii.capi.status import CapiError, Status

LIBRARY_NAME = "libuaii.so"
_PACKAGE_DIR = Path(__file__).resolve().parent


def get_include() -> str:
    """The directory to pass with ``-I``: it holds ``uaii/c_api/uaii.h`` and ``uaii/c_api/version.h``."""
    return str(_PACKAGE_DIR / "include")


def header_path() -> str:
    return str(_PACKAGE_DIR / "include" / "uaii" / "c_api" / "uaii.h")


def get_library_dir() -> str:
    """The directory that holds libuaii.so (``-L`` and the rpath)."""
    return str(_PACKAGE_DIR)


def library_path() -> str:
    """libuaii.so itself; an error that says how to build it when the package was installed without it."""
    path = _PACKAGE_DIR / LIBRARY_NAME
    if not path.is_file():
        raise CapiError(Status.ERR_NOT_FOUND,
                        f"{path} is missing: uaii-capi was installed without its library; reinstall it from source "
                        "with a C compiler (`uv sync --all-packages` in the repository)")
    return str(path)


def _c_api_version() -> str:
    text = (_PACKAGE_DIR / "include" / "uaii" / "c_api" / "version.h").read_text(encoding="utf-8")
    m = re.search(r'#define UAII_C_API_VERSION_STRING "([^"]+)"', text)
    return m.group(1) if m else "unknown"


C_API_VERSION = _c_api_version()


def python_libs() -> list[str]:
    """Linker flags for the libpython libuaii embeds: its directory, an rpath to it, and ``-lpythonX.Y``."""
    libdir = sysconfig.get_config_var("LIBDIR") or os.path.join(sys.base_prefix, "lib")
    name = f"python{sys.version_info[0]}.{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"
    return [f"-L{libdir}", f"-Wl,-rpath,{libdir}", f"-l{name}"]


def cflags() -> list[str]:
    return [f"-I{get_include()}"]


def libs() -> list[str]:
    """``-L`` and rpath of the package directory, ``-luaii``, then the libpython flags and ``-lpthread``."""
    libdir = get_library_dir()
    return [f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-luaii", *python_libs(), "-lpthread"]


def render(flags: list[str]) -> str:
    return " ".join(shlex.quote(f) for f in flags)

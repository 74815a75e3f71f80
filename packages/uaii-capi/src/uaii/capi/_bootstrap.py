"""Start-up of the Python side inside libuaii (loaded by path from the library's init code; imports nothing of uaii
before the path is set up).

A C program that links libuaii starts an interpreter whose ``sys.path`` is that of the base Python installation,
which does not see the virtual environment the uaii packages live in. Before importing them this puts in front of
``sys.path``, each processed like a site directory (``.pth`` files included, which is how editable installs are
found):

1. the directory that holds the library's own package (site-packages for a wheel install, ``src/`` for an
   editable one), so the library always runs its own Python side;
2. ``$VIRTUAL_ENV``'s site-packages when that variable is set (``uv run``, an activated venv);
3. what ``$PYTHONPATH`` says, which CPython reads on its own.
"""

from __future__ import annotations

import os
import site
import sys
from typing import Any


def _site_packages(prefix: str) -> str:
    return os.path.join(prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")


def search_dirs(library_path: str, environ: dict[str, str] | os._Environ[str]) -> list[str]:
    """The directories to add, in priority order (first wins)."""
    dirs = []
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(library_path))))
    if os.path.isdir(os.path.join(package_root, "uaii", "capi")):
        dirs.append(package_root)
    venv = environ.get("VIRTUAL_ENV")
    if venv:
        dirs.append(_site_packages(venv))
    return [d for d in dirs if os.path.isdir(d)]


def add_front(dirs: list[str]) -> None:
    """``site.addsitedir`` each directory, then move the entries it added in front of ``sys.path``."""
    before = list(sys.path)
    for d in dirs:
        site.addsitedir(d)
    added = [p for p in sys.path if p not in before]
    sys.path[:] = added + before


def start(ffi: Any, lib: Any) -> None:
    """Set up the path and register the C API's ``def_extern`` implementations."""
    library_path = ffi.string(lib.uaii__library_path()).decode("utf-8", "surrogateescape")
    add_front(search_dirs(library_path, os.environ))
    if not getattr(sys, "argv", None):
        sys.argv = ["libuaii"]  # some libraries read sys.argv[0]; an embedded interpreter has none
    from uaii.capi import _exports

    _exports.install(ffi, lib)

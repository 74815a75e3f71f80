"""The repository's scripts (``bench/*.py``, ``scripts/*.py``) as modules for the tests: one loader instead of a
copy in each test file. They are not packages, so they are loaded by path; a module registers itself in
``sys.modules`` before it runs, because dataclasses look their module up while it executes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(relpath: str, name: str) -> ModuleType:
    """The module of ``REPO / relpath`` under ``name`` (loaded once per process)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / relpath)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod

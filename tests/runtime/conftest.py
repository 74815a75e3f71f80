"""Fixtures of the uaii-runtime tests: tiny transformers models (via tests/loaders/loader_helpers.py) and helpers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_HELPERS = Path(__file__).resolve().parents[1] / "loaders" / "loader_helpers.py"
if "loader_helpers" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("loader_helpers", _HELPERS)
    assert _spec is not None and _spec.loader is not None
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules["loader_helpers"] = _mod
    _spec.loader.exec_module(_mod)

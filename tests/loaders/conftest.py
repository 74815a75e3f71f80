"""Fixtures of the uaii-loaders tests. Helpers live in loader_helpers.py, importable as `loader_helpers`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("loader_helpers", Path(__file__).with_name("loader_helpers.py"))
assert _spec is not None and _spec.loader is not None
_mod = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("loader_helpers", _mod)
_spec.loader.exec_module(_mod)

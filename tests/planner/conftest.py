"""Fixtures of the uaii-planner tests. Helpers live in planner_helpers.py, importable as `planner_helpers`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_HELPERS = Path(__file__).with_name("planner_helpers.py")
_spec = importlib.util.spec_from_file_location("planner_helpers", _HELPERS)
assert _spec is not None and _spec.loader is not None
_mod = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("planner_helpers", _mod)
_spec.loader.exec_module(_mod)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own plan cache folder: nothing is written to the real ~/.cache."""
    root = tmp_path / "uaii-cache"
    monkeypatch.setenv("UAII_CACHE_DIR", str(root))
    return root

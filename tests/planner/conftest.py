"""Fixtures of the uaii-planner tests. Helpers live in planner_helpers.py, importable as `planner_helpers`."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own plan cache folder: nothing is written to the real ~/.cache."""
    root = tmp_path / "uaii-cache"
    monkeypatch.setenv("UAII_CACHE_DIR", str(root))
    return root

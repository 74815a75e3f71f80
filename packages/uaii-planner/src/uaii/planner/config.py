"""The knobs of uaii-planner (environment variables ``UAII_*``), read at the moment they are needed."""

from __future__ import annotations

import os
from pathlib import Path

#: Root of UAII's caches; plans live in its ``plans/`` folder.
CACHE_DIR_ENV = "UAII_CACHE_DIR"
DEFAULT_CACHE_DIR = Path("~/.cache/uaii")
PLANS_SUBDIR = "plans"


def cache_root() -> Path:
    """``$UAII_CACHE_DIR``, or ``~/.cache/uaii`` when unset or empty."""
    raw = os.environ.get(CACHE_DIR_ENV, "").strip()
    return Path(raw).expanduser() if raw else DEFAULT_CACHE_DIR.expanduser()


def plans_dir() -> Path:
    """Where plan cache entries are stored: ``<cache root>/plans``."""
    return cache_root() / PLANS_SUBDIR


__all__ = ["CACHE_DIR_ENV", "DEFAULT_CACHE_DIR", "PLANS_SUBDIR", "cache_root", "plans_dir"]

"""The knobs of uaii-planner (environment variables ``UAII_*``), read at the moment they are needed."""

from __future__ import annotations

import os
from pathlib import Path

from uaii.planner.errors import PlannerError

#: Root of UAII's caches; plans live in its ``plans/`` folder.
CACHE_DIR_ENV = "UAII_CACHE_DIR"
DEFAULT_CACHE_DIR = Path("~/.cache/uaii")
PLANS_SUBDIR = "plans"

#: The plan cache keeps at most this many entries (0: no limit); the least recently used go first.
MAX_ENTRIES_ENV = "UAII_PLAN_CACHE_MAX_ENTRIES"
DEFAULT_MAX_ENTRIES = 64
#: ... and at most this many bytes of entries (0: no limit). Gemma-3 270M's plan is 0.15 MiB.
MAX_BYTES_ENV = "UAII_PLAN_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 256 << 20


def cache_root() -> Path:
    """``$UAII_CACHE_DIR``, or ``~/.cache/uaii`` when unset or empty."""
    raw = os.environ.get(CACHE_DIR_ENV, "").strip()
    return Path(raw).expanduser() if raw else DEFAULT_CACHE_DIR.expanduser()


def plans_dir() -> Path:
    """Where plan cache entries are stored: ``<cache root>/plans``."""
    return cache_root() / PLANS_SUBDIR


def max_entries() -> int:
    """``$UAII_PLAN_CACHE_MAX_ENTRIES`` (default 64; 0 = no limit)."""
    return _env_count(MAX_ENTRIES_ENV, DEFAULT_MAX_ENTRIES)


def max_bytes() -> int:
    """``$UAII_PLAN_CACHE_MAX_BYTES`` (default 256 MiB; 0 = no limit)."""
    return _env_count(MAX_BYTES_ENV, DEFAULT_MAX_BYTES)


def _env_count(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw, 0)
    except ValueError:
        raise PlannerError(f"{name} must be an integer >= 0 (0: no limit), found {raw!r}") from None
    if value < 0:
        raise PlannerError(f"{name} must be an integer >= 0 (0: no limit), found {value}")
    return value


__all__ = ["CACHE_DIR_ENV", "DEFAULT_CACHE_DIR", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_ENTRIES", "MAX_BYTES_ENV",
           "MAX_ENTRIES_ENV", "PLANS_SUBDIR", "cache_root", "max_bytes", "max_entries", "plans_dir"]

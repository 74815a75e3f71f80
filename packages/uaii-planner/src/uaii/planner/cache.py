"""The disk plan cache: one canonical-JSON file per plan key under ``$UAII_CACHE_DIR/plans/``.

An entry is ``<key>.json`` where key is the hex sha256 the planner computes (graph + options + versions; see
:func:`uaii.planner.planner.plan_key`). Writes are atomic: a temporary file in the same folder, fsync, then
``os.replace`` — a reader sees the old entry or the new one, never half of one. An entry that cannot be read or
parsed, or whose key does not match its name, is treated as missing; the planner rebuilds and overwrites it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from uaii.ir.errors import UaiiError
from uaii.ir.plan import ExecutionPlan
from uaii.planner import config

SUFFIX = ".json"
_TMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class CacheStatus:
    """What is on disk: the folder, how many entries, their total size."""

    path: str
    entries: int
    total_bytes: int


class PlanCache:
    """Plan entries in one folder (default: ``config.plans_dir()``, read when used so the env var can change)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self._directory = Path(directory) if directory is not None else None

    @property
    def directory(self) -> Path:
        return self._directory if self._directory is not None else config.plans_dir()

    def path_for(self, key: str) -> Path:
        if not key or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"plan cache key must be lower-case hex, found {key!r}")
        return self.directory / f"{key}{SUFFIX}"

    def load(self, key: str) -> ExecutionPlan | None:
        """The cached plan for ``key``, or None when absent, unreadable, corrupt or for another key."""
        path = self.path_for(key)
        try:
            data = path.read_bytes()
            plan = ExecutionPlan.from_json(data, path=str(path))
        except (OSError, UaiiError, ValueError):
            return None
        return plan if plan.key == key else None

    def store(self, plan: ExecutionPlan) -> Path:
        """Write ``plan`` atomically under its key; returns the entry's path."""
        path = self.path_for(plan.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_TMP_PREFIX, suffix=SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(plan.to_json().encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(path.parent)
        return path

    def entries(self) -> list[Path]:
        """Entry files (not temporary files of interrupted writes), sorted by name."""
        try:
            return sorted(p for p in self.directory.iterdir()
                          if p.suffix == SUFFIX and not p.name.startswith(_TMP_PREFIX) and p.is_file())
        except (FileNotFoundError, NotADirectoryError):
            return []

    def status(self) -> CacheStatus:
        total = 0
        files = self.entries()
        for p in files:
            with contextlib.suppress(OSError):
                total += p.stat().st_size
        return CacheStatus(str(self.directory), len(files), total)

    def clear(self) -> int:
        """Delete every entry (and leftovers of interrupted writes); returns how many entries were removed."""
        removed = 0
        for p in self.entries():
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed += 1
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for p in self.directory.glob(f"{_TMP_PREFIX}*"):
                with contextlib.suppress(OSError):
                    p.unlink()
        return removed


def _fsync_dir(path: Path) -> None:
    """Make the rename durable where the platform allows opening a directory."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def status() -> CacheStatus:
    """Entries in the default plan cache folder."""
    return PlanCache().status()


def clear() -> int:
    """Empty the default plan cache folder; returns how many entries were removed."""
    return PlanCache().clear()


__all__ = ["CacheStatus", "PlanCache", "clear", "status"]

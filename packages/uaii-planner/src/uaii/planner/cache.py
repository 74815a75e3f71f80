"""The disk plan cache: one canonical-JSON file per plan key under ``$UAII_CACHE_DIR/plans/``.

An entry is ``<key>.json`` where key is the hex sha256 the planner computes (graph + options + versions; see
:func:`uaii.planner.planner.plan_key`). Writes are atomic: a temporary file in the same folder, fsync, then
``os.replace`` — a reader sees the old entry or the new one, never half of one. An entry that cannot be read or
parsed, or whose key does not match its name, is treated as missing; the planner rebuilds and overwrites it. An entry
that parses is not trusted either: the planner checks it against the graph before use (:mod:`uaii.planner.check`).

The folder is bounded: after every store the least recently used entries go until at most
``$UAII_PLAN_CACHE_MAX_ENTRIES`` entries of at most ``$UAII_PLAN_CACHE_MAX_BYTES`` bytes remain (see
:mod:`uaii.planner.config`). "Used" is the file's mtime: a store writes it and a hit touches it. Several processes
may share the folder: a file that another process removed or replaced meanwhile is skipped, and a temporary file is
removed only when it is older than :data:`TMP_MAX_AGE_S` (its writer is gone), never while a writer may still rename
it into place. ``uaii cache status`` / ``uaii cache clear`` show and empty the folder.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from uaii.ir.errors import UaiiError
from uaii.ir.plan import ExecutionPlan
from uaii.planner import config

SUFFIX = ".json"
_TMP_PREFIX = ".tmp-"
TMP_MAX_AGE_S = 3600.0
"""A temporary file this old is a leftover of a writer that was killed; eviction removes it."""


@dataclass(frozen=True)
class CacheStatus:
    """What is on disk: the folder, how many entries, their total size."""

    path: str
    entries: int
    total_bytes: int


class PlanCache:
    """Plan entries in one folder (default: ``config.plans_dir()``, read when used so the env var can change)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, max_entries: int | None = None,
                 max_bytes: int | None = None) -> None:
        """``max_entries`` / ``max_bytes``: the eviction limits (0: none); None reads the ``UAII_*`` knob when used."""
        self._directory = Path(directory) if directory is not None else None
        self._max_entries = max_entries
        self._max_bytes = max_bytes

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
        if plan.key != key:
            return None
        with contextlib.suppress(OSError):  # least recently used: a hit counts as a use (a read-only folder: no)
            os.utime(path)
        return plan

    def store(self, plan: ExecutionPlan) -> Path:
        """Write ``plan`` atomically under its key, then evict (:meth:`evict`); returns the entry's path."""
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
        self.evict(keep=path)
        return path

    def evict(self, keep: Path | None = None) -> int:
        """Remove the least recently used entries (oldest mtime first) until at most the entry and byte limits
        remain, and temporary files older than :data:`TMP_MAX_AGE_S`; ``keep`` (the entry just written) stays
        whatever its size. Returns how many entries were removed.

        Files removed or replaced by another process meanwhile are skipped: an entry whose mtime changed since it
        was listed was just written or used, so it is not the least recently used any more."""
        limit_n = config.max_entries() if self._max_entries is None else self._max_entries
        limit_b = config.max_bytes() if self._max_bytes is None else self._max_bytes
        listed = []
        for p in self.entries():
            with contextlib.suppress(OSError):
                st = p.stat()
                listed.append((p != keep, -st.st_mtime_ns, p.name, p, st.st_size))
        listed.sort()  # keep first, then the most recently used
        count = total = removed = 0
        full = False
        for is_other, neg_mtime, _, p, size in listed:
            full = full or (is_other and (0 < limit_n <= count or 0 < limit_b < total + size))
            if not full:
                count, total = count + 1, total + size
            elif _unlink_if_unchanged(p, -neg_mtime):
                removed += 1
        self._remove_stale_temporaries()
        return removed

    def _remove_stale_temporaries(self) -> None:
        now = time.time()
        with contextlib.suppress(OSError):
            for p in self.directory.glob(f"{_TMP_PREFIX}*"):
                with contextlib.suppress(OSError):
                    if now - p.stat().st_mtime > TMP_MAX_AGE_S:
                        p.unlink()

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


def _unlink_if_unchanged(path: Path, mtime_ns: int) -> bool:
    """Remove ``path`` unless another process wrote or used it since it was listed (its mtime moved) or removed
    it already; whether this call removed it."""
    try:
        if path.stat().st_mtime_ns != mtime_ns:
            return False
        path.unlink()
    except OSError:
        return False
    return True


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

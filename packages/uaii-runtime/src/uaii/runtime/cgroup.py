"""The memory limit of the cgroup this process runs in (cgroup v1 or v2, host or container), and what of it is free.

Why: the ``auto`` preset sizes its budget from the memory the process may use. In a container, or a systemd slice,
or a ``memory.max`` a user set for the run, that is the cgroup's limit, not the host's MemAvailable: a 64 GiB host
reporting 50 GiB available would give a process limited to 8 GiB a 25 GiB budget, and the kernel's OOM killer the
last word. Page cache counts against a cgroup's limit too, so what a run may still take is the limit less what the
cgroup holds that cannot be reclaimed (its usage less its inactive file pages).

Where: ``/proc/self/cgroup`` names the cgroup (``N:memory:/path`` on v1, ``0::/path`` on v2) and
``/proc/self/mountinfo`` where its hierarchy is mounted (with the mount's root: in a container the hierarchy is
mounted at the container's own cgroup). v1 reads ``memory.stat``'s ``hierarchical_memory_limit`` (the smallest limit
of the cgroup and its ancestors) or ``memory.limit_in_bytes``; v2 the smallest ``memory.max`` from the cgroup up to
the mount. No limit anywhere (or no cgroup filesystem: another OS) gives None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

UNLIMITED_V1 = 1 << 62
"""v1 reports "no limit" as the largest page-aligned int64 (9223372036854771712): anything this large is none."""


@dataclass(frozen=True)
class CgroupMemory:
    """A cgroup's memory limit and what it holds now, in bytes. ``reclaimable``: its inactive file pages (page
    cache the kernel takes back first under the limit)."""

    version: int
    path: str
    limit: int
    usage: int
    reclaimable: int = 0

    @property
    def available(self) -> int:
        """What a process may still take before the limit: the limit less what cannot be reclaimed."""
        return max(self.limit - max(self.usage - self.reclaimable, 0), 0)


@dataclass(frozen=True)
class _Mount:
    root: str
    point: str
    fstype: str
    options: frozenset[str]


def cgroup_memory(proc: str | os.PathLike[str] = "/proc/self") -> CgroupMemory | None:
    """The memory limit of the cgroup of the process whose ``/proc`` entry is ``proc``; None when it has none (or
    none can be read). v2 is asked first where both are mounted (a hybrid host), then v1's memory controller."""
    proc = Path(proc)
    try:
        groups = _read(proc / "cgroup").splitlines()
        mounts = _mounts(_read(proc / "mountinfo"))
    except OSError:
        return None
    v1_path = v2_path = None
    for line in groups:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif "memory" in parts[1].split(","):
            v1_path = parts[2]
    if v2_path is not None:
        for m in mounts:
            if m.fstype == "cgroup2":
                found = _v2(m, v2_path)
                if found is not None:
                    return found
    if v1_path is not None:
        for m in mounts:
            if m.fstype == "cgroup" and "memory" in m.options:
                found = _v1(m, v1_path)
                if found is not None:
                    return found
    return None


def _v2(mount: _Mount, path: str) -> CgroupMemory | None:
    here = _inside(mount, path)
    top = Path(mount.point)
    limit = 0
    d = here
    while True:
        text = _maybe(d / "memory.max")
        if text is not None and text != "max":
            value = _int(text)
            if value is not None and (limit == 0 or value < limit):
                limit = value
        if d == top or top not in d.parents:
            break
        d = d.parent
    if not limit:
        return None
    usage = _int(_maybe(here / "memory.current") or "") or 0
    stat = _stat(here / "memory.stat")
    return CgroupMemory(2, str(here), limit, usage, stat.get("inactive_file", 0))


def _v1(mount: _Mount, path: str) -> CgroupMemory | None:
    here = _inside(mount, path)
    stat = _stat(here / "memory.stat")
    limit = stat.get("hierarchical_memory_limit") or _int(_maybe(here / "memory.limit_in_bytes") or "") or 0
    if not limit or limit >= UNLIMITED_V1:
        return None
    usage = _int(_maybe(here / "memory.usage_in_bytes") or "") or 0
    reclaimable = stat.get("total_inactive_file", stat.get("inactive_file", 0))
    return CgroupMemory(1, str(here), limit, usage, reclaimable)


def _inside(mount: _Mount, path: str) -> Path:
    """The directory of cgroup ``path`` under ``mount``: relative to the mount's root (a container's hierarchy
    is mounted at its own cgroup, whose path /proc shows in full or, with a cgroup namespace, as /)."""
    root = mount.root.rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    elif root:  # a path outside the mounted subtree: the mount itself is the nearest we can see
        path = "/"
    return Path(mount.point) / path.lstrip("/")


def _mounts(mountinfo: str) -> list[_Mount]:
    """cgroup and cgroup2 mounts of a mountinfo text (fields: id parent dev root point options [optional...] -
    fstype source super-options)."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 5 or len(fields) < sep + 3:
            continue
        fstype = fields[sep + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        options = frozenset(fields[sep + 3].split(",")) if len(fields) > sep + 3 else frozenset()
        found.append(_Mount(_unescape(fields[3]), _unescape(fields[4]), fstype, options))
    return found


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _stat(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (_maybe(path) or "").splitlines():
        parts = line.split()
        if len(parts) == 2:
            value = _int(parts[1])
            if value is not None:
                out[parts[0]] = value
    return out


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _maybe(path: Path) -> str | None:
    try:
        return _read(path).strip()
    except OSError:
        return None


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


__all__ = ["CgroupMemory", "cgroup_memory"]

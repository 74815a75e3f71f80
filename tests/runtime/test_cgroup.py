"""The auto preset inside a cgroup with a memory limit (uaii.runtime.cgroup): v1 and v2, nested limits, a
container's own mount, hybrid hosts, no limit; fake /proc and cgroup trees, a parser that never raises on what a
kernel (or anything else) writes there, and, where this machine lets the test make one, a real memory cgroup."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uaii.runtime.cgroup import CgroupMemory, cgroup_memory
from uaii.runtime.presets import GiB, MiB, auto_budget, get_preset

MOUNT_V2 = "41 31 0:38 {root} {point} rw,relatime - cgroup2 cgroup2 rw\n"
MOUNT_V1 = "35 31 0:32 {root} {point} rw,relatime - cgroup cgroup rw,memory\n"
MOUNT_CPU = "32 31 0:29 / {point} rw,relatime - cgroup cgroup rw,cpu\n"


def _proc(tmp: Path, cgroup: str, mountinfo: str) -> Path:
    proc = tmp / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    return proc


def _files(d: Path, **files: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name.replace("__", ".")).write_text(text)


def test_v2_takes_the_smallest_limit_up_to_the_mount(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    _files(cg / "user.slice", memory__max=str(8 * GiB))
    _files(cg / "user.slice" / "run.scope", memory__max="max", memory__current=str(GiB),
           memory__stat=f"anon {600 * MiB}\nfile {424 * MiB}\ninactive_file {400 * MiB}\n")
    _files(cg, memory__max=str(64 * GiB))  # above the mount point's subtree: the root's, larger, not the answer
    proc = _proc(tmp_path, "0::/user.slice/run.scope\n", MOUNT_V2.format(root="/", point=cg))
    got = cgroup_memory(proc)
    assert got == CgroupMemory(2, str(cg / "user.slice" / "run.scope"), 8 * GiB, GiB, 400 * MiB)
    assert got.available == 8 * GiB - (GiB - 400 * MiB)


def test_v1_in_a_container_reads_its_own_mount(tmp_path: Path) -> None:
    """A container's memory hierarchy is mounted at its own cgroup (mount root /docker/abc), which /proc shows in
    full: the directory is the mount point itself."""
    mem = tmp_path / "memory"
    _files(mem, memory__limit_in_bytes=str(4 * GiB), memory__usage_in_bytes=str(3 * GiB),
           memory__stat=f"cache {2 * GiB}\nhierarchical_memory_limit {2 * GiB}\ntotal_inactive_file {GiB}\n")
    proc = _proc(tmp_path, "9:cpu:/\n4:memory:/docker/abc\n0::/\n",
                 MOUNT_V1.format(root="/docker/abc", point=mem) + MOUNT_CPU.format(point=tmp_path / "cpu"))
    got = cgroup_memory(proc)
    assert got is not None and got.version == 1 and got.path == str(mem)
    assert got.limit == 2 * GiB  # the hierarchical limit (an ancestor's) is smaller than the group's own
    assert got.available == 0  # 3 GiB held, 1 GiB of it reclaimable, against 2 GiB


def test_no_limit_is_none(tmp_path: Path) -> None:
    mem = tmp_path / "memory"
    _files(mem / "a", memory__limit_in_bytes="9223372036854771712", memory__usage_in_bytes="1000",
           memory__stat="hierarchical_memory_limit 9223372036854771712\n")
    _files(tmp_path / "unified")
    proc = _proc(tmp_path, "4:memory:/a\n0::/\n", MOUNT_V1.format(root="/", point=mem)
                 + MOUNT_V2.format(root="/", point=tmp_path / "unified"))
    assert cgroup_memory(proc) is None
    assert cgroup_memory(tmp_path / "nowhere") is None  # no /proc entry (another OS)


def test_a_hybrid_host_falls_back_to_v1(tmp_path: Path) -> None:
    """v2 mounted without the memory controller (no memory.max), the limit on v1's memory hierarchy."""
    _files(tmp_path / "unified", cgroup__procs="")
    mem = tmp_path / "memory"
    _files(mem / "job", memory__limit_in_bytes=str(GiB), memory__usage_in_bytes=str(100 * MiB))
    proc = _proc(tmp_path, "4:memory:/job\n0::/\n", MOUNT_V2.format(root="/", point=tmp_path / "unified")
                 + MOUNT_V1.format(root="/", point=mem))
    got = cgroup_memory(proc)
    assert got is not None and (got.version, got.limit, got.available) == (1, GiB, GiB - 100 * MiB)


def test_auto_sizes_its_budget_from_the_limit_not_the_host(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {64 * GiB // 1024} kB\nMemAvailable: {50 * GiB // 1024} kB\n")
    cg = tmp_path / "cg"
    _files(cg / "run", memory__max=str(8 * GiB), memory__current=str(GiB), memory__stat="inactive_file 0\n")
    proc = _proc(tmp_path, "0::/run\n", MOUNT_V2.format(root="/", point=cg))
    auto = get_preset("auto", meminfo=str(meminfo), proc=str(proc))
    assert auto.budget_bytes == auto_budget(7 * GiB) == 3584 * MiB
    assert "cgroup v2 limit 8.0 GiB" in auto.description
    host = get_preset("auto", meminfo=str(meminfo), proc=str(tmp_path / "none"))
    assert host.budget_bytes == 25 * GiB and "MemAvailable" in host.description
    _files(cg / "run", memory__current=str(9 * GiB))  # over the limit: the smallest budget, never "unlimited"
    assert get_preset("auto", meminfo=str(meminfo), proc=str(proc)).budget_bytes == 64 * MiB


@settings(max_examples=300, deadline=None)
@given(cgroup=st.text(max_size=200), mountinfo=st.text(max_size=400), limit=st.text(max_size=30))
def test_whatever_proc_holds_it_never_raises(tmp_path_factory: pytest.TempPathFactory, cgroup: str, mountinfo: str,
                                             limit: str) -> None:
    tmp = tmp_path_factory.mktemp("fuzz")
    cg = tmp / "cg"
    cg.mkdir()
    (cg / "memory.max").write_text(limit, errors="replace")
    proc = tmp / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup + "\n0::/\n", errors="replace")
    (proc / "mountinfo").write_text(mountinfo + "\n" + MOUNT_V2.format(root="/", point=cg), errors="replace")
    got = cgroup_memory(proc)
    assert got is None or (got.limit > 0 and got.available >= 0)


def _writable_v1_memory() -> Path | None:
    root = Path("/sys/fs/cgroup/memory")
    return root if (root / "memory.limit_in_bytes").exists() and os.access(root, os.W_OK) else None


@pytest.mark.skipif(_writable_v1_memory() is None, reason="no writable cgroup v1 memory hierarchy here (needs root)")
def test_a_real_memory_cgroup_sizes_auto() -> None:
    """A child process moved into a fresh 1 GiB memory cgroup sees a budget of at most half of that."""
    root = _writable_v1_memory()
    assert root is not None
    group = root / f"uaii-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(GiB))
        code = ("import os; open(os.environ['CG'] + '/cgroup.procs', 'w').write(str(os.getpid()));"
                "from uaii.runtime.presets import get_preset; p = get_preset('auto'); print(p.budget_bytes);"
                "print(p.description)")
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CG": str(group)}, capture_output=True,
                             text=True, timeout=120, check=True).stdout.splitlines()
        assert 0 < int(out[0]) <= 512 * MiB, out
        assert "cgroup v1 limit 1.0 GiB" in out[1]
    finally:
        group.rmdir()

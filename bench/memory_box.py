"""A memory cgroup around benchmark processes: the "laptop" of the scale benchmark (bench/bench_scale.py).

Why a cgroup and not a smaller budget: a budget is what UAII promises to stay under; a cgroup is what a machine with
that much RAM enforces on everything the process touches, page cache included (llama.cpp's mmap'd weights count
against it as UAII's staging does), and it is what the ``auto`` preset must find and size itself from
(``uaii.runtime.cgroup``). Each run gets a fresh group, so its peak is its own: cgroup v1 ``memory.limit_in_bytes`` /
``memory.max_usage_in_bytes`` or v2 ``memory.max`` / ``memory.peak``, whichever hierarchy has the memory
controller. The child joins the group itself before it execs (its first byte is already counted); the group is
removed when the run ends, whatever happened. Creating one needs root (or a delegated subtree): ``available()``
says why not.

    with MemoryBox("uaii-scale", 8 << 30) as box:
        proc = box.run([sys.executable, "-c", "..."], timeout=600)
        print(box.peak_bytes(), proc.returncode)
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")


def _v2_has_memory(root: Path) -> bool:
    controllers = root / "cgroup.controllers"
    return controllers.exists() and "memory" in controllers.read_text().split()


def hierarchy() -> tuple[str, Path] | None:
    """("v1" | "v2", the root a group is made under) of the memory controller, or None."""
    if (V1_ROOT / "memory.limit_in_bytes").exists():
        return "v1", V1_ROOT
    if _v2_has_memory(V2_ROOT):
        return "v2", V2_ROOT
    return None


def available() -> str | None:
    """None when a box can be made here, else why not."""
    found = hierarchy()
    if found is None:
        return "no cgroup hierarchy with the memory controller is mounted (/sys/fs/cgroup)"
    if not os.access(found[1], os.W_OK):
        return f"{found[1]} is not writable (creating a memory cgroup needs root or a delegated subtree)"
    return None


class MemoryBox:
    """One memory cgroup of ``limit`` bytes; :meth:`run` starts a process inside it and waits for it."""

    def __init__(self, name: str, limit: int) -> None:
        why = available()
        if why is not None:
            raise RuntimeError(f"[bench] cannot make a memory box: {why}")
        found = hierarchy()
        assert found is not None
        self.version, root = found
        self.limit = int(limit)
        self.path = root / f"{name}-{os.getpid()}-{time.monotonic_ns()}"
        self.path.mkdir()
        try:
            if self.version == "v1":
                (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
                swap = self.path / "memory.memsw.limit_in_bytes"
                if swap.exists():  # no swapping past the box either
                    swap.write_text(str(self.limit))
            else:
                (self.path / "memory.max").write_text(str(self.limit))
                if (self.path / "memory.swap.max").exists():
                    (self.path / "memory.swap.max").write_text("0")
        except BaseException:
            self.path.rmdir()
            raise

    def run(self, cmd: list[str], *, timeout: float, env: dict[str, str] | None = None,
            cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
        """Runs ``cmd`` inside the box (stdout and stderr captured); on a timeout the process is killed and
        ``returncode`` is -9 with the time-out said in stderr."""
        procs = str(self.path / "cgroup.procs")

        def join() -> None:  # in the child, before exec: everything it maps from here on is counted
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))

        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                                preexec_fn=join)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\n[bench] killed after {timeout:.0f} s"
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def peak_bytes(self) -> int | None:
        """The most memory the group held (page cache included) since it was made; None where the kernel does not
        say (cgroup v2 before Linux 5.19)."""
        name = "memory.max_usage_in_bytes" if self.version == "v1" else "memory.peak"
        f = self.path / name
        return int(f.read_text().split()[0]) if f.exists() else None

    def oom_kills(self) -> int:
        """Processes the kernel killed in this box for lack of memory."""
        f = self.path / ("memory.oom_control" if self.version == "v1" else "memory.events")  # "key value" lines
        fields = dict(line.split() for line in f.read_text().splitlines()) if f.exists() else {}
        return int(fields.get("oom_kill", 0))

    def close(self) -> None:
        """Removes the group (its processes have exited: :meth:`run` waits for them)."""
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # a process is still leaving it
                time.sleep(0.1)
        self.path.rmdir()

    def __enter__(self) -> MemoryBox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def drop_caches() -> bool:
    """Drops the page cache machine-wide (needs root); False where it cannot."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("1")
        return True
    except OSError:
        return False

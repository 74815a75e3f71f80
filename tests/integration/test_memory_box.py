"""bench/memory_box.py, the memory cgroup of the scale benchmark: a child runs inside the limit from its first byte,
the peak reads back, a child that outgrows the box is killed by the kernel (and counted), the auto preset sizes its
budget from the box, and the group is gone afterwards. Needs a writable memory hierarchy (root); skipped elsewhere,
with the reason ``available()`` gives."""

from __future__ import annotations

import sys

import pytest
from repo_scripts import load_script

box_mod = load_script("bench/memory_box.py", "memory_box")
MiB = 1 << 20
WHY = box_mod.available()

pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no memory box here: {WHY}")


def test_a_child_runs_inside_the_box_and_its_peak_reads_back() -> None:
    code = "import numpy as np; a = np.ones(96 << 20, np.uint8); print(int(a.sum()))"
    with box_mod.MemoryBox("uaii-test", 512 * MiB) as box:
        proc = box.run([sys.executable, "-c", code], timeout=120)
        peak = box.peak_bytes()
        path = box.path
        assert (path / "cgroup.procs").exists()
    assert proc.returncode == 0 and proc.stdout.strip() == str(96 << 20), proc.stderr
    assert peak is not None and 96 * MiB <= peak <= 512 * MiB
    assert not path.exists()  # removed on exit


def test_a_child_that_outgrows_the_box_is_killed_and_counted() -> None:
    code = "import numpy as np; a = np.ones(512 << 20, np.uint8); print(int(a.sum()))"
    with box_mod.MemoryBox("uaii-test", 128 * MiB) as box:
        proc = box.run([sys.executable, "-c", code], timeout=120)
        kills = box.oom_kills()
        peak = box.peak_bytes()
    assert proc.returncode == -9 and kills >= 1
    assert peak is not None and peak <= 128 * MiB


def test_the_auto_preset_sees_the_box() -> None:
    code = "from uaii.runtime.presets import get_preset; print(get_preset('auto').budget_bytes)"
    with box_mod.MemoryBox("uaii-test", 768 * MiB) as box:
        proc = box.run([sys.executable, "-c", code], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 0 < int(proc.stdout.strip()) <= 384 * MiB


def test_a_run_past_its_time_is_killed_and_said() -> None:
    with box_mod.MemoryBox("uaii-test", 256 * MiB) as box:
        proc = box.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
    assert proc.returncode == -9 and "killed after 1 s" in proc.stderr

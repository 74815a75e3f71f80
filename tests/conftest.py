"""Fixtures shared by every package's tests: the real models of shared/MODELS.md, fetched once into the cache."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from repo_scripts import load_script


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF (98 MB), verified by sha256."""
    return load_script("scripts/models.py", "uaii_scripts_models").ensure_model("smollm2")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """Gemma-3-270M Q4_K_M GGUF (253 MB), verified by sha256."""
    return load_script("scripts/models.py", "uaii_scripts_models").ensure_model("gemma3")


DEVICE_SKIPS = {"no CUDA device": "they run where an NVIDIA GPU is: make check-cuda, scripts/cuda_device_check.sh"}
"""Skip reasons that mean "this machine lacks the device", and where those tests do run."""


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name how many tests skipped for want of a device (issue #18: the suite says so, not only a skip count), and
    what the model of the CUDA driver refused or found leaked when it stood in for one."""
    model = sys.modules.get("cuda_driver_model")
    if model is not None and model.MODEL is not None:
        m = model.MODEL
        terminalreporter.write_line(f"CUDA driver model: {sum(m.calls.values())} driver calls "
                                    f"({m.calls.get('cuLaunchKernel', 0)} kernel launches, "
                                    f"{m.calls.get('cuGraphLaunch', 0)} graph launches), {len(m.errors)} refused, "
                                    f"{len(m.leaks)} contexts released with leaks")
        for line in (*m.errors, *m.leaks):
            terminalreporter.write_line(f"  {line}")
    for reason, where in DEVICE_SKIPS.items():
        n = sum(1 for rep in terminalreporter.stats.get("skipped", [])
                if reason in (rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)))
        if n:
            terminalreporter.write_line(f"{n} tests skipped: {reason} ({where})")


if os.environ.get("UAII_CUDA_DRIVER_MODEL"):
    # CudaDevice on the model of the CUDA driver (tests/cuda_driver_model.py): installed before anything asks
    # cuda-bindings for the driver, so that the tests' "cuda" variants run on it instead of skipping
    import cuda_driver_model

    cuda_driver_model.install(kernels=os.environ["UAII_CUDA_DRIVER_MODEL"])

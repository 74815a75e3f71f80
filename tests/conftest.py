"""Fixtures shared by every package's tests: the real models of shared/MODELS.md, fetched once into the cache."""

from __future__ import annotations

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
    """Name how many tests skipped for want of a device (issue #18: the suite says so, not only a skip count)."""
    for reason, where in DEVICE_SKIPS.items():
        n = sum(1 for rep in terminalreporter.stats.get("skipped", [])
                if reason in (rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)))
        if n:
            terminalreporter.write_line(f"{n} tests skipped: {reason} ({where})")

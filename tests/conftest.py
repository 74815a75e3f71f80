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

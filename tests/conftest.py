"""Fixtures shared by every package's tests: the real models of shared/MODELS.md, fetched once into the cache."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _models_module():
    spec = importlib.util.spec_from_file_location("uaii_scripts_models", REPO / "scripts" / "models.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("uaii_scripts_models", mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF (98 MB), verified by sha256."""
    return _models_module().ensure_model("smollm2")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """Gemma-3-270M Q4_K_M GGUF (253 MB), verified by sha256."""
    return _models_module().ensure_model("gemma3")

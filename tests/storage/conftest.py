"""Fixtures of the uaii-storage tests. Helpers live in storage_helpers.py, importable as `storage_helpers`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_HELPERS = Path(__file__).with_name("storage_helpers.py")
_spec = importlib.util.spec_from_file_location("storage_helpers", _HELPERS)
assert _spec is not None and _spec.loader is not None
_mod = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("storage_helpers", _mod)
_spec.loader.exec_module(_mod)

from storage_helpers import MiB, WeightFile, random_weight_file  # noqa: E402


@pytest.fixture
def weights(tmp_path: Path) -> WeightFile:
    """8 MiB of random bytes with 60 tensors up to 1.5 MiB at random (mostly unaligned) offsets."""
    return random_weight_file(tmp_path / "weights.bin", 8 * MiB + 123, 60, seed=1, max_tensor=3 * MiB // 2)

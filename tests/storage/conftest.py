"""Fixtures of the uaii-storage tests. Helpers live in storage_helpers.py, importable as `storage_helpers`."""

from __future__ import annotations

from pathlib import Path

import pytest
from storage_helpers import MiB, WeightFile, random_weight_file


@pytest.fixture
def weights(tmp_path: Path) -> WeightFile:
    """8 MiB of random bytes with 60 tensors up to 1.5 MiB at random (mostly unaligned) offsets."""
    return random_weight_file(tmp_path / "weights.bin", 8 * MiB + 123, 60, seed=1, max_tensor=3 * MiB // 2)

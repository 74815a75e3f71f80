"""One RoPE frequency formula: the CPU kernels' float32 frequencies are ``kv_book.rope_frequencies`` rounded to
float32, bit for bit what the CPU backend computed with its own copy of the formula before (kept below, frozen, as
the expectation), for every scaling type with and without frequency factors."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from uaii.backends.cpu.ops_fast import rope_inv_freq
from uaii.backends.kv_book import rope_frequencies

BASE: dict[str, Any] = {"theta": 10000.0, "scaling_type": "none", "factor": 1.0, "original_max_position": 0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0}
SCALINGS: list[dict[str, Any]] = [
    {},
    {"scaling_type": "linear", "factor": 4.0},
    {"theta": 500000.0, "scaling_type": "llama3", "factor": 8.0, "original_max_position": 8192},
    {"scaling_type": "yarn", "factor": 4.0, "original_max_position": 4096},
    {"theta": 1e6, "scaling_type": "yarn", "factor": 40.0, "original_max_position": 4096, "beta_fast": 16.0},
]


def _former_cpu_formula(rot: int, attrs: dict[str, Any], freq_factors: np.ndarray | None) -> np.ndarray:
    """cpu/ops_fast.py's copy of the formula before it was replaced by the shared one (frozen here)."""
    theta = float(attrs["theta"])
    inv = theta ** (-np.arange(0, rot, 2, dtype=np.float64) / rot)
    if freq_factors is not None:
        inv = inv / np.asarray(freq_factors, np.float64).reshape(-1)
    kind, factor = attrs["scaling_type"], float(attrs["factor"])
    original = int(attrs["original_max_position"])
    if kind == "linear":
        inv = inv / factor
    elif kind == "llama3":
        low, high = float(attrs["low_freq_factor"]), float(attrs["high_freq_factor"])
        wavelen = 2.0 * math.pi / inv
        smooth = (original / wavelen - low) / (high - low)
        blended = (1.0 - smooth) * inv / factor + smooth * inv
        out = np.where(wavelen > original / low, inv / factor, inv)
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        inv = np.where(medium, blended, out)
    elif kind == "yarn":
        def corr(rotations: float) -> float:
            return rot * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        lo = max(math.floor(corr(float(attrs["beta_fast"]))), 0)
        hi = min(math.ceil(corr(float(attrs["beta_slow"]))), rot - 1)
        ramp = np.clip((np.arange(rot // 2) - lo) / ((hi - lo) or 0.001), 0.0, 1.0)
        inv = inv / factor * ramp + inv * (1.0 - ramp)
    return inv.astype(np.float32)


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s.get("scaling_type", "none"))
@pytest.mark.parametrize("rot", [32, 64, 128])
@pytest.mark.parametrize("factors", [False, True])
def test_cpu_frequencies_are_the_shared_formula_bit_for_bit(scaling: dict[str, Any], rot: int, factors: bool) -> None:
    attrs = {**BASE, **scaling}
    ff = np.random.default_rng(rot).uniform(1.0, 8.0, rot // 2).astype(np.float32) if factors else None
    got = rope_inv_freq(rot, attrs, ff)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, _former_cpu_formula(rot, attrs, ff))
    np.testing.assert_array_equal(got, rope_frequencies(rot, attrs, ff).astype(np.float32))

"""Fixtures of the kernel tests: every instruction set this machine has, and a seeded generator."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import uaii.kernels as K

ISAS = K.available_isas()
SIMD_ISAS = [i for i in ISAS if i != "scalar"]


@pytest.fixture(params=ISAS)
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test once per available ISA (scalar included), restoring the default afterwards."""
    with K.use_isa(request.param):
        yield request.param


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)

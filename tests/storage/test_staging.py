from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uaii.storage import ExtentAllocator, StagingError


def test_first_fit_and_coalescing() -> None:
    a = ExtentAllocator(10 * 4096)
    x, y, z = 0, 4096, 3 * 4096
    assert (a.alloc(4096), a.alloc(5000), a.alloc(1)) == (x, y, z)
    assert a.used == 4 * 4096 and a.alloc(7 * 4096) is None
    a.free(y, 5000)
    assert a.alloc(3 * 4096) == 4 * 4096  # the freed hole is too small: first fit lands after z
    a.free(x, 4096)
    assert a.largest_free == 3 * 4096  # x and y's holes merged
    assert a.alloc(3 * 4096) == 0
    with pytest.raises(StagingError, match="freed twice"):
        a.free(z, 1)
        a.free(z, 1)
    assert a.peak == 7 * 4096


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5 * 4096)), max_size=60))
def test_extents_never_overlap(ops: list[tuple[bool, int]]) -> None:
    a = ExtentAllocator(16 * 4096)
    live: dict[int, int] = {}
    for free_one, size in ops:
        if free_one and live:
            off = next(iter(live))
            a.free(off, live.pop(off))
            continue
        got = a.alloc(size)
        if got is None:
            assert a.largest_free < a.size_for(size)
            continue
        off = got
        assert off % 4096 == 0 and off + a.size_for(size) <= a.capacity
        for o, s in live.items():
            assert off + a.size_for(size) <= o or o + a.size_for(s) <= off
        live[off] = size
    for off, size in list(live.items()):
        a.free(off, size)
    assert a.used == 0 and a.largest_free == a.capacity

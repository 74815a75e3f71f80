"""The device expert cache's bookkeeping (uaii.backends.cuda.expert_cache): which slot holds which expert, what a
step copies in, how the budget is shared among the streamed banks. The copies and products themselves are checked
on models (tests/runtime/test_cuda_parity.py: the logits bit for bit, the bytes the hits saved)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uaii.backends.cuda.expert_cache import DeviceExpertCache, bank_slots
from uaii.backends.cuda.host import HostDevice


@pytest.fixture
def dev() -> Any:
    d = HostDevice()
    yield d
    d.close()


def test_hits_keep_their_slot_and_misses_take_the_least_recently_used(dev: Any) -> None:
    c = DeviceExpertCache(dev, 3, 64)
    slots, fills = c.place(np.array([5, 1]))
    assert sorted(fills) == sorted((e, slots[e]) for e in (5, 1)) and len(set(slots.values())) == 2
    slots2, fills2 = c.place(np.array([1, 7]))  # 1 held; 7 takes the free slot
    assert slots2[1] == slots[1] and fills2 == [(7, slots2[7])]
    slots3, fills3 = c.place(np.array([9, 1]))  # 5 is the least recently used: 9 takes its slot
    assert fills3 == [(9, slots[5])] and slots3[1] == slots[1]
    assert (c.hits, c.misses) == (2, 4)
    with pytest.raises(ValueError, match="4 experts chosen for a cache of 3 slots"):
        c.place(np.array([1, 2, 3, 4]))
    c.free(dev)
    assert dev.mem.live_bytes == 0


@settings(max_examples=60, deadline=None)
@given(slots=st.integers(1, 6), steps=st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=6), max_size=30))
def test_the_cache_is_an_lru_of_its_slots(slots: int, steps: list[list[int]]) -> None:
    """Against a plain LRU list (a step's hits the most recent, then its misses): the same experts held, every
    chosen expert in a distinct slot, only the ones not held copied in, and a slot never given to two held experts."""
    dev = HostDevice()
    c = DeviceExpertCache(dev, slots, 8)
    lru: list[int] = []
    held: dict[int, int] = {}
    for chosen in steps:
        chosen = list(dict.fromkeys(chosen))[:slots]
        where, fills = c.place(np.array(chosen))
        want_fills = [e for e in chosen if e not in lru]
        assert [e for e, _ in fills] == want_fills
        for e in [x for x in chosen if x in lru]:  # the hits become the most recent, then the misses arrive
            lru.remove(e)
            lru.append(e)
        lru += want_fills
        while len(lru) > slots:
            lru.pop(next(i for i, e in enumerate(lru) if e not in chosen))
        held = {e: s for e, s in held.items() if e in lru}
        held.update(where)
        assert set(held) == set(lru) and len(set(held.values())) == len(held)
        assert all(0 <= s < slots for s in where.values())
    c.free(dev)
    dev.close()


def test_banks_share_the_budget_by_their_bytes_and_a_share_under_top_k_goes_whole() -> None:
    banks = {"gate": (8, 100, 2), "up": (8, 100, 2), "down": (8, 200, 2)}
    assert bank_slots(0, banks) == {}
    assert bank_slots(1600, banks) == {"gate": 4, "up": 4, "down": 4}  # half of 3200 bytes: half of each bank
    assert bank_slots(10 ** 6, banks) == {"gate": 8, "up": 8, "down": 8}
    assert bank_slots(500, banks) == {"gate": 2, "up": 2}  # an eighth is 1 slot < top_k: whole top_k, in order
    assert bank_slots(100, banks) == {}

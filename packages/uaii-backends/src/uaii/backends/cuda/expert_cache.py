"""The device's expert cache: experts of a streamed MoE bank kept in device memory between steps, least recently
used first out.

Why: a streamed bank moves only the experts its router chose (lower.Binder.gathered_experts), but without a cache
it moves them again at every step, and routers repeat themselves — the same few experts serve many consecutive
tokens. With ``expert_cache_bytes`` the executable gives each streamed bank the same share of its experts as slots
(the budget over the streamed banks' bytes); a step copies only the chosen experts not already in a slot. It is the
device tier of the CPU's expert cache, in the device budget (uaii.runtime.gpu_budget: what the budget leaves once
the pins, staging and KV cache are placed).

Ordering: a slot is refilled by a copy on the compute stream, after the kernels queued before it that read the
expert it held — the stream's order is the only guard, so the copies never go on the copy stream.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np


class DeviceExpertCache:
    """``slots`` experts of ``expert_bytes`` each in one device buffer (``ptr``); :meth:`place` assigns slots."""

    def __init__(self, dev: Any, slots: int, expert_bytes: int) -> None:
        self.slots = int(slots)
        self.expert_bytes = int(expert_bytes)
        self.buf = dev.alloc(self.slots * self.expert_bytes)
        self.ptr = int(self.buf.ptr)
        self._where: OrderedDict[int, int] = OrderedDict()  # expert -> slot, least recently used first
        self._free = list(range(self.slots - 1, -1, -1))
        self.hits = self.misses = 0

    def place(self, chosen: np.ndarray) -> tuple[dict[int, int], list[tuple[int, int]]]:
        """Slots for the distinct experts ``chosen`` (at most ``slots`` of them): each one's slot, and the (expert,
        slot) pairs to copy in — those not held, in slots that were free or held the least recently used expert
        not chosen now."""
        wanted = [int(e) for e in chosen]
        if len(set(wanted)) > self.slots:
            raise ValueError(f"{len(set(wanted))} experts chosen for a cache of {self.slots} slots")
        keep = set(wanted)
        for e in wanted:
            if e in self._where:
                self._where.move_to_end(e)
        fills = []
        for e in wanted:
            if e in self._where:
                continue
            if self._free:
                slot = self._free.pop()
            else:
                old = next(x for x in self._where if x not in keep)
                slot = self._where.pop(old)
            self._where[e] = slot
            fills.append((e, slot))
        self.misses += len(fills)
        self.hits += len(keep) - len(fills)
        return {e: self._where[e] for e in keep}, fills

    def free(self, dev: Any) -> None:
        dev.free(self.buf)


def bank_slots(cache_bytes: int, banks: dict[str, tuple[int, int, int]]) -> dict[str, int]:
    """Slots per streamed bank (``banks``: name -> (experts, bytes per expert, top_k)): every bank the same share of
    its experts, the budget over the banks' bytes. A cache under top_k slots never holds a step's choice, so when
    the share gives a bank fewer, banks get top_k slots each, in order, while the budget lasts."""
    total = sum(e * b for e, b, _ in banks.values())
    if cache_bytes <= 0 or not total:
        return {}
    share = min(1.0, cache_bytes / total)
    if all(int(share * e) >= min(k, e) for e, _, k in banks.values()):
        return {name: min(e, int(share * e)) for name, (e, _, _) in banks.items()}
    out, left = {}, cache_bytes
    for name, (e, b, k) in banks.items():
        n = min(k, e)
        if n * b <= left:
            out[name] = n
            left -= n * b
    return out


__all__ = ["DeviceExpertCache", "bank_slots"]

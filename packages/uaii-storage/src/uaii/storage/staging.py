"""The staging pool: one fixed, page-aligned region carved into extents by a first-fit allocator.

The caller sizes the pool once (``staging_bytes``); reads land in extents of it and nothing is allocated per
token. Extents are page multiples so that every read window starts page-aligned, as O_DIRECT wants.
"""

from __future__ import annotations

import bisect

from uaii.storage._native import PAGE, AlignedBuffer, round_up
from uaii.storage.errors import StagingError


class ExtentAllocator:
    """First-fit allocation of ``[0, capacity)`` in multiples of ``align``; frees coalesce with neighbours."""

    def __init__(self, capacity: int, align: int = PAGE) -> None:
        if capacity < 0 or align <= 0:
            raise StagingError(f"staging capacity must be >= 0 and alignment > 0, found {capacity}, {align}")
        self.align = align
        self.capacity = capacity // align * align
        # free extents as (offset, size), sorted by offset
        self._free: list[tuple[int, int]] = [(0, self.capacity)] if self.capacity else []
        self.used = 0
        self.peak = 0

    def size_for(self, nbytes: int) -> int:
        """The extent size a request of ``nbytes`` takes."""
        return round_up(max(nbytes, 1), self.align)

    def alloc(self, nbytes: int) -> int | None:
        """Offset of a new extent of ``size_for(nbytes)`` bytes, or None when no free extent fits."""
        size = self.size_for(nbytes)
        for i, (off, free) in enumerate(self._free):
            if free >= size:
                if free == size:
                    del self._free[i]
                else:
                    self._free[i] = (off + size, free - size)
                self.used += size
                self.peak = max(self.peak, self.used)
                return off
        return None

    def free(self, offset: int, nbytes: int) -> None:
        size = self.size_for(nbytes)
        i = bisect.bisect_left(self._free, (offset, 0))
        prev_end = self._free[i - 1][0] + self._free[i - 1][1] if i > 0 else -1
        if prev_end > offset or (i < len(self._free) and self._free[i][0] < offset + size):
            raise StagingError(f"staging extent at {offset} ({size} bytes) freed twice or never allocated")
        self._free.insert(i, (offset, size))
        self.used -= size
        if i + 1 < len(self._free) and offset + size == self._free[i + 1][0]:  # merge with the next
            self._free[i] = (offset, size + self._free[i + 1][1])
            del self._free[i + 1]
        if i > 0 and prev_end == offset:  # merge with the previous
            poff, psize = self._free[i - 1]
            self._free[i - 1] = (poff, psize + self._free[i][1])
            del self._free[i]

    @property
    def largest_free(self) -> int:
        return max((size for _, size in self._free), default=0)


class StagingPool:
    """``capacity`` bytes of aligned memory and the allocator over them."""

    def __init__(self, capacity: int) -> None:
        self.extents = ExtentAllocator(capacity)
        self.capacity = self.extents.capacity
        self.buffer = AlignedBuffer(self.capacity)

    def alloc(self, nbytes: int) -> int | None:
        return self.extents.alloc(nbytes)

    def free(self, offset: int, nbytes: int) -> None:
        self.extents.free(offset, nbytes)

    def fits(self, nbytes: int) -> bool:
        return self.extents.size_for(nbytes) <= self.capacity

    @property
    def used(self) -> int:
        return self.extents.used

    @property
    def peak(self) -> int:
        return self.extents.peak

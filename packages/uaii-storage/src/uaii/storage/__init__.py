"""uaii.storage — the weight store of UAII: mmap mode, streaming mode, the expert LRU cache and telemetry.

A loader produces a *location index* (reference string → :class:`WeightLocation`); a store resolves
references through it. ``open_store(index)`` maps files (no budget); ``open_store(index, staging_bytes=...)``
streams weights with pread (O_DIRECT where possible) through a fixed staging pool on C I/O threads.
See docs/storage.md.

``AlignedBuffer``, ``PAGE`` (the alignment of every buffer the I/O engine reads into) and ``round_up`` are exported
here for the backends that stage weights themselves: other packages import them from ``uaii.storage``, never from
its private modules.
"""

from importlib.metadata import version as _version

from uaii.storage._native import PAGE, AlignedBuffer, drop_page_cache, resident_bytes, round_up
from uaii.storage.errors import NativeUnavailable, StagingError, StorageError
from uaii.storage.expert_cache import ExpertCache, default_layer_of
from uaii.storage.location import (
    LocationIndex,
    WeightLocation,
    as_location,
    expert_location,
    locate_raw_file,
    lookup,
    parse_rows_ref,
    row_range,
    rows_ref,
)
from uaii.storage.mmap_store import MmapStore
from uaii.storage.pinned import PinnedSet
from uaii.storage.staging import ExtentAllocator, StagingPool
from uaii.storage.store import WeightStore, open_store
from uaii.storage.streaming import StreamingStore
from uaii.storage.telemetry import StorageTelemetry

__version__ = _version("uaii-storage")
__all__ = [
    "PAGE",
    "AlignedBuffer",
    "ExpertCache",
    "ExtentAllocator",
    "LocationIndex",
    "MmapStore",
    "NativeUnavailable",
    "PinnedSet",
    "StagingError",
    "StagingPool",
    "StorageError",
    "StorageTelemetry",
    "StreamingStore",
    "WeightLocation",
    "WeightStore",
    "__version__",
    "as_location",
    "default_layer_of",
    "drop_page_cache",
    "expert_location",
    "locate_raw_file",
    "lookup",
    "open_store",
    "parse_rows_ref",
    "resident_bytes",
    "round_up",
    "row_range",
    "rows_ref",
]

"""The weight-store interface shared by both modes, and the factory that picks one."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np

from uaii.ir import WeightRef
from uaii.storage.location import LocationIndex, WeightLocation
from uaii.storage.mmap_store import MmapStore
from uaii.storage.pinned import PinnedSet
from uaii.storage.streaming import StreamingStore
from uaii.storage.telemetry import StorageTelemetry

Ref = str | WeightRef


class WeightStore(Protocol):
    """Resolves weight references to arrays: raw uint8 for block-quantized types, dtype views otherwise."""

    mode: str
    pinned: PinnedSet
    telemetry: StorageTelemetry

    def location(self, ref: Ref) -> WeightLocation: ...
    def prefetch(self, refs: Iterable[Ref]) -> None: ...
    def acquire(self, ref: Ref, form: str | None = None) -> np.ndarray: ...
    def release(self, ref: Ref) -> None: ...
    def pin(self, refs: Iterable[Ref]) -> None: ...
    def unpin(self, refs: Iterable[Ref]) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    def begin_token(self) -> None: ...
    def end_token(self) -> dict[str, int]: ...
    def close(self) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: object) -> None: ...


def open_store(index: LocationIndex, *, staging_bytes: int | None = None, **options: Any) -> WeightStore:
    """mmap mode without a staging budget; streaming mode with one (options go to :class:`StreamingStore`)."""
    if staging_bytes is None:
        return MmapStore(index, pin_budget_bytes=options.get("pin_budget_bytes"))
    return StreamingStore(index, staging_bytes, **options)

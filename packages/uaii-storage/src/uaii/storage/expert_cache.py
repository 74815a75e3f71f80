"""The expert LRU cache: recently used MoE experts stay resident within a byte budget.

After routing, a layer asks for its top-k experts with ``get_many``: hits are served from memory without I/O,
misses are read in parallel through the store's I/O threads straight into cache memory (no staging copy), and
the least recently used experts are evicted until the budget holds. The buffer of an evicted expert is reused
for the next miss that fits in it, so a warm cache of same-sized experts allocates nothing. ``resize`` changes the
budget (between ``min_bytes`` and the budget it was made with), evicting as needed.

A view returned by ``get``/``get_many`` is valid until a later call evicts that expert; the experts requested
by one call are never evicted by that same call.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from uaii.ir import WeightRef
from uaii.storage._native import AlignedBuffer
from uaii.storage.errors import StorageError
from uaii.storage.location import WeightLocation
from uaii.storage.telemetry import StorageTelemetry
from uaii.storage.tensor_view import as_tensor

Ref = str | WeightRef

_LAYER = re.compile(r"(?:^|[._/])(?:blk|layers?|h|blocks?)[._](\d+)(?:[._]|$)")


def default_layer_of(ref: str) -> str:
    """The layer of a reference: N of ``blk.N`` / ``layers.N`` / ``h.N`` in its tensor name, else the name."""
    tensor = WeightRef.parse(ref).tensor or ref
    m = _LAYER.search(tensor)
    return m.group(1) if m else tensor


class ExpertSource(Protocol):
    """What the cache needs from a store (StreamingStore and MmapStore both provide it)."""

    telemetry: StorageTelemetry

    def location(self, ref: Ref) -> WeightLocation: ...

    def buffer_bytes(self, ref: Ref) -> int: ...

    def read_many_into(self, items: Sequence[tuple[Ref, AlignedBuffer]]) -> list[np.ndarray]: ...


@dataclass
class _Entry:
    buf: AlignedBuffer
    view: np.ndarray


@dataclass
class _LayerStats:
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0

    def as_dict(self) -> dict[str, Any]:
        n = self.hits + self.misses
        return {"hits": self.hits, "misses": self.misses, "bytes_read": self.bytes_read,
                "hit_rate": self.hits / n if n else 0.0}


class ExpertCache:
    """Byte-budgeted LRU over expert references (``path#tensor#e=N``, or any reference)."""

    def __init__(self, store: ExpertSource, budget_bytes: int, *,
                 layer_of: Callable[[str], str] = default_layer_of,
                 telemetry_name: str = "expert_cache", min_bytes: int = 0) -> None:
        if budget_bytes < 0:
            raise StorageError(f"expert cache budget must be >= 0, found {budget_bytes}")
        self.store = store
        self.budget_bytes = budget_bytes
        self.min_bytes = min(min_bytes, budget_bytes)  # the smallest budget resize() accepts (one step's experts)
        self.max_bytes = budget_bytes  # the largest: the budget it was made with (what its owner counted for it)
        self._layer_of = layer_of
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._layers: dict[str, _LayerStats] = {}
        self._lock = threading.Lock()
        self.used_bytes = 0
        self.evictions = 0
        store.telemetry.attach(telemetry_name, self.stats)

    def get(self, ref: Ref, layer: str | None = None) -> np.ndarray:
        return self.get_many([ref], layer)[0]

    def get_many(self, refs: Sequence[Ref], layer: str | None = None) -> list[np.ndarray]:
        """The experts ``refs``, in order; the misses among them are read together, in parallel."""
        keys = [str(r) for r in refs]
        with self._lock:
            misses: list[str] = []
            for key in keys:
                stats = self._layer(layer if layer is not None else self._layer_of(key))
                if key in self._entries:
                    self._entries.move_to_end(key)
                    stats.hits += 1
                elif key in misses:
                    stats.hits += 1  # a repeat within one call is served by the first read
                else:
                    misses.append(key)
                    stats.misses += 1
            if misses:
                self._load(misses, set(keys), layer)
            return [self._entries[k].view for k in keys]

    def fits(self, refs: Sequence[Ref]) -> bool:
        """Whether one :meth:`get_many` of ``refs`` can hold them all at once (their buffers together within the
        budget): a MoE step then asks for all its routed experts in one call, its misses read in parallel."""
        with self._lock:
            return self._need(dict.fromkeys(str(r) for r in refs)) <= self.budget_bytes

    def resize(self, budget_bytes: int) -> None:
        """Hold the cache to a new budget, evicting the least recently used experts until it fits: a session whose
        cache is what its memory budget leaves gives bytes back when it needs them (another sequence's KV state, the
        batched executable) and takes them back when they are freed. Not while a pass reads views of the cache: an
        evicted expert's buffer is freed once no view holds it."""
        if budget_bytes < self.min_bytes:
            raise StorageError(f"the expert cache cannot shrink to {budget_bytes} bytes: one step's experts need "
                               f"{self.min_bytes}", nbytes=self.min_bytes)
        if budget_bytes > self.max_bytes:
            raise StorageError(f"the expert cache cannot grow to {budget_bytes} bytes, past the {self.max_bytes} "
                               "it was made with", nbytes=budget_bytes)
        with self._lock:
            self.budget_bytes = budget_bytes
            while self.used_bytes > budget_bytes and self._entries:
                _, entry = self._entries.popitem(last=False)
                self.used_bytes -= entry.buf.nbytes
                self.evictions += 1

    def __contains__(self, ref: object) -> bool:
        return str(ref) in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.used_bytes = 0

    def stats(self) -> dict[str, Any]:
        with self._lock:
            total = _LayerStats(sum(s.hits for s in self._layers.values()),
                                sum(s.misses for s in self._layers.values()),
                                sum(s.bytes_read for s in self._layers.values()))
            return {"budget_bytes": self.budget_bytes, "used_bytes": self.used_bytes,
                    "entries": len(self._entries), "evictions": self.evictions, **total.as_dict(),
                    "per_layer": {name: s.as_dict() for name, s in self._layers.items()}}

    # --- internals (self._lock held) --------------------------------------------------------------
    def _layer(self, name: str) -> _LayerStats:
        stats = self._layers.get(name)
        if stats is None:
            stats = self._layers[name] = _LayerStats()
        return stats

    def _need(self, keys: Iterable[str]) -> int:
        """Bytes the cache holds for ``keys`` at once: resident experts' buffers, the others' read buffers (the
        rule of :meth:`fits` and of one call's refusal)."""
        return sum(self._entries[k].buf.nbytes if k in self._entries else self.store.buffer_bytes(k) for k in keys)

    def _load(self, misses: list[str], protect: set[str], layer: str | None) -> None:
        need = self._need(protect)
        if need > self.budget_bytes:
            raise StorageError(f"the expert cache budget of {self.budget_bytes} bytes cannot hold the "
                               f"{len(protect)} experts of one request ({need} bytes, e.g. {misses[0]!r})",
                               nbytes=need)
        sizes = [self.store.buffer_bytes(k) for k in misses]
        spare: list[AlignedBuffer] = []
        bufs: list[AlignedBuffer] = []
        for size in sizes:
            while self.used_bytes + size > self.budget_bytes:
                victim = next(k for k in self._entries if k not in protect)
                spare.append(self._entries.pop(victim).buf)
                self.used_bytes -= spare[-1].nbytes
                self.evictions += 1
            fit = [b for b in spare if size <= b.nbytes <= self.budget_bytes - self.used_bytes]
            buf = min(fit, key=lambda b: b.nbytes) if fit else AlignedBuffer(size)
            if fit:
                spare.remove(buf)
            self.used_bytes += buf.nbytes
            bufs.append(buf)
        try:
            views = self.store.read_many_into(list(zip(misses, bufs, strict=True)))
        except BaseException:
            self.used_bytes -= sum(b.nbytes for b in bufs)
            raise
        for key, buf, view in zip(misses, bufs, views, strict=True):
            self._layer(layer if layer is not None else self._layer_of(key)).bytes_read += view.nbytes
            self._entries[key] = _Entry(buf, as_tensor(view, self.store.location(key)))

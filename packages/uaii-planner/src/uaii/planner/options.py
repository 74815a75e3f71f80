"""Planner options: one frozen dataclass whose canonical JSON is part of the plan cache key."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from uaii.planner.errors import PlannerError

STREAM_UNITS = ("tensor", "layer")


@dataclass(frozen=True)
class PlannerOptions:
    """What to plan for. Every field takes part in the cache key (:meth:`to_json`).

    Fusion: ``enable_fusion`` switches every pass off; ``passes`` names the passes to run, in order (None = the
    registry's default passes, in registry order; see :mod:`uaii.planner.passes`).

    Memory plan: ``max_tokens`` bounds the symbolic dim ``seq`` (the plan is made for the largest batch of tokens
    a step will see and is reused for smaller ones); ``dim_bounds`` bounds other symbolic dims (``past``,
    ``batch``); ``persistent`` names values that live across steps besides graph inputs, outputs and schema state
    (they get no arena slot); ``enable_memory_reuse`` off gives every value its own region (for debugging);
    ``alignment`` is the byte alignment of every slot (a power of two).

    Storage plan: ``budget_bytes`` (0 = unlimited: every weight is memory-mapped) covers pinned weights,
    ``staging_buffers`` staging buffers, ``kv_cache_bytes``, ``expert_cache_bytes`` and the arena.
    ``pin_layers`` trunk layers (from the first) are pinned with the embeddings and lm_head while they fit;
    ``stream_unit`` sizes each staging buffer for the largest streamed step (``"tensor"``) or the largest streamed
    layer (``"layer"``); ``fill_pins`` pins further layers, in execution order, while the budget still holds.
    1-D weights of at most ``pin_small_bytes`` (norm scales, biases) are pinned before any group and given up
    last: streamed, each would cost a page of staging, a read of its own and a read-ahead slot (0: no such rule).
    ``read_ahead`` (0: off) is a bound on the disk's read rate as a fraction of the memory's: with it the staging
    buffers together hold at least what the disk reads at the pass's pace while the longest run of pinned weights
    computes (``uaii.planner.storage.read_ahead_bytes``), at most that fraction of the run's bytes.

    Steps: ``device`` is the device of every step unless a placement callback says otherwise.
    """

    enable_fusion: bool = True
    passes: tuple[str, ...] | None = None
    enable_memory_reuse: bool = True
    max_tokens: int = 512
    dim_bounds: tuple[tuple[str, int], ...] = ()
    persistent: tuple[str, ...] = ()
    alignment: int = 64
    budget_bytes: int = 0
    pin_layers: int = 2
    kv_cache_bytes: int = 0
    expert_cache_bytes: int = 0
    staging_buffers: int = 2
    stream_unit: str = "tensor"
    fill_pins: bool = False
    read_ahead: float = 0.0
    pin_small_bytes: int = 64 * 1024
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.passes is not None:
            object.__setattr__(self, "passes", tuple(str(p) for p in self.passes))
        bounds = self.dim_bounds.items() if isinstance(self.dim_bounds, Mapping) else self.dim_bounds
        object.__setattr__(self, "dim_bounds", tuple(sorted((str(k), int(v)) for k, v in bounds)))
        object.__setattr__(self, "persistent", tuple(sorted(set(self.persistent))))
        for name in ("max_tokens", "alignment", "staging_buffers"):
            _check_int(name, getattr(self, name), 1)
        for name in ("budget_bytes", "pin_layers", "kv_cache_bytes", "expert_cache_bytes", "pin_small_bytes"):
            _check_int(name, getattr(self, name), 0)
        if not 0.0 <= float(self.read_ahead) <= 1.0:
            raise PlannerError(f"option read_ahead must be a fraction in [0, 1], found {self.read_ahead!r}")
        object.__setattr__(self, "read_ahead", float(self.read_ahead))
        if self.alignment & (self.alignment - 1):
            raise PlannerError(f"option alignment must be a power of two, found {self.alignment}")
        for dim, bound in self.dim_bounds:
            if bound < 0:
                raise PlannerError(f"option dim_bounds: {dim!r} must be bound by an int >= 0, found {bound}")
        if self.stream_unit not in STREAM_UNITS:
            raise PlannerError(f"option stream_unit must be one of {', '.join(STREAM_UNITS)}, found "
                               f"{self.stream_unit!r}")
        if not self.device:
            raise PlannerError("option device must name a device, found an empty string")

    @property
    def bounds(self) -> dict[str, int]:
        """Symbolic dim → its bound: ``seq`` is ``max_tokens`` unless ``dim_bounds`` says otherwise."""
        return {"seq": self.max_tokens, **dict(self.dim_bounds)}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["dim_bounds"] = [list(p) for p in self.dim_bounds]
        return d

    def to_json(self) -> str:
        """Canonical JSON: same options, same text (sorted keys, no spaces)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PlannerOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise PlannerError(f"unknown planner option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        kw = dict(d)
        if kw.get("passes") is not None:
            kw["passes"] = tuple(kw["passes"])
        if "dim_bounds" in kw:
            kw["dim_bounds"] = tuple((str(k), int(v)) for k, v in kw["dim_bounds"])
        if "persistent" in kw:
            kw["persistent"] = tuple(kw["persistent"])
        return cls(**kw)


def _check_int(name: str, value: object, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise PlannerError(f"option {name} must be an int >= {lo}, found {value!r}")


__all__ = ["STREAM_UNITS", "PlannerOptions"]

"""The plan representation: what the planner decides and the runtime executes.

It lives in uaii-ir (not the planner) because three packages read it — the planner writes it, the runtime and
backends walk it, the disk cache stores it — and they must agree without depending on each other. A plan is
plain data: ordered steps bound to arena slots, the arena layout, and the storage plan (which weights stay
pinned, which stream, in what order, through how much staging memory). ``to_json``/``from_json`` are canonical
(same plan, same bytes) so a cached plan can be compared and hashed.

A step names the op and version it runs (``op``, ``version``): a backend rebuilds the node of a step from them and
never parses the display string ``kernel`` (``op/version/dtype``), which an op name containing ``/`` would make
ambiguous. Plan format 2 added them; a format-1 plan does not load (``from_dict`` raises, the planner's cache
treats it as a miss and plans again).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from uaii.ir.errors import FormatError

PLAN_FORMAT_VERSION = 2


@dataclass(frozen=True)
class BufferSlot:
    """A region of the activation arena holding one value for the span of steps where it is live."""

    value: str
    offset: int
    nbytes: int
    dtype: str
    first_step: int
    last_step: int


PLANNER_ARENA = "planner"
"""The :attr:`ArenaLayout.rule` of the planner's own generic layout (a backend that consumes the planner's offsets)."""


@dataclass(frozen=True)
class ArenaLayout:
    """One allocation for all activations; slots whose lifetimes do not overlap share offsets.

    ``rule`` names who laid it out: :data:`PLANNER_ARENA` (the planner's generic rule) or the identity of a
    backend's rule (``cpu/1``), so that a backend never runs offsets made by a rule other than its own. ``size`` is
    what the backend allocates. Only buffers that own memory get slots: a value a backend places inside another
    value's buffer (a view, an in-place result) has none, and the owner's slot lasts as long as any of them."""

    size: int
    alignment: int
    max_tokens: int
    slots: tuple[BufferSlot, ...] = ()
    rule: str = PLANNER_ARENA

    def slot(self, value: str) -> BufferSlot:
        for s in self.slots:
            if s.value == value:
                return s
        raise KeyError(value)


@dataclass(frozen=True)
class Step:
    """One kernel invocation: node ``node`` running ``op`` version ``version`` with its resolved ``attributes``.
    Inputs/outputs name graph values (arena slots, weights or constants). ``kernel`` is for people (logs, ``uaii
    plan``): nothing reads it back."""

    kernel: str
    node: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    device: str = "cpu"
    attributes: tuple[tuple[str, Any], ...] = ()
    op: str = field(kw_only=True)
    version: int = field(kw_only=True)

    def __post_init__(self) -> None:
        if not self.op:
            raise ValueError(f"step {self.node!r} names no op")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"step {self.node!r} ({self.op}) has version {self.version!r}; expected an int >= 1")


@dataclass(frozen=True)
class WeightPlacement:
    """A weight and how it is held: ``pinned`` stays resident, ``streamed`` is read into staging per use."""

    ref: str
    nbytes: int
    group: str
    mode: str  # "pinned" | "streamed" | "mmap"

    def __post_init__(self) -> None:
        if self.mode not in ("pinned", "streamed", "mmap"):
            raise ValueError(f"weight placement mode must be pinned, streamed or mmap, found {self.mode!r}")


@dataclass(frozen=True)
class StoragePlan:
    """The storage side of a plan: residency of every weight, staging buffers and prefetch order."""

    budget_bytes: int = 0  # 0 = unlimited
    weights: tuple[WeightPlacement, ...] = ()
    staging_buffers: tuple[int, ...] = ()
    prefetch_order: tuple[str, ...] = ()
    expert_cache_bytes: int = 0
    kv_cache_bytes: int = 0
    streamed_bytes_per_token: int = 0  # bytes read from disk per decoded token (MoE: top_k experts; gathers: rows)

    @property
    def pinned_bytes(self) -> int:
        return sum(w.nbytes for w in self.weights if w.mode == "pinned")

    @property
    def streamed_bytes(self) -> int:
        return sum(w.nbytes for w in self.weights if w.mode == "streamed")

    @property
    def staging_bytes(self) -> int:
        return sum(self.staging_buffers)


@dataclass(frozen=True)
class ExecutionPlan:
    """Everything a backend needs to run a graph, keyed by the hash of what it was planned from."""

    key: str
    graph_name: str
    steps: tuple[Step, ...]
    arena: ArenaLayout
    storage: StoragePlan = field(default_factory=StoragePlan)
    metadata: tuple[tuple[str, str], ...] = ()

    @property
    def planned_bytes(self) -> int:
        """Every byte the plan holds, as the memory budget counts it (DESIGN §4): pinned weights, staging buffers,
        KV cache, expert cache and the activation arena. The one sum the planner's budget check, its summary and
        the runtime's budget report share."""
        s = self.storage
        return s.pinned_bytes + s.staging_bytes + s.kv_cache_bytes + s.expert_cache_bytes + self.arena.size

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["format_version"] = PLAN_FORMAT_VERSION
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, path: str | None = None) -> ExecutionPlan:
        try:
            raw = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            offset = getattr(e, "pos", None)
            raise FormatError(f"plan is not valid JSON: {e}", path=path, offset=offset, component="plan") from None
        try:
            return cls.from_dict(raw)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise FormatError(f"plan does not match the plan layout: {type(e).__name__}: {e}", path=path,
                              component="plan") from None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExecutionPlan:
        if d.get("format_version") != PLAN_FORMAT_VERSION:
            raise ValueError(f"plan format version {d.get('format_version')!r}, expected {PLAN_FORMAT_VERSION}")
        arena = d["arena"]
        storage = d["storage"]
        return cls(
            key=_str(d["key"]),
            graph_name=_str(d["graph_name"]),
            steps=tuple(Step(kernel=_str(s["kernel"]), node=_str(s["node"]), inputs=_strs(s["inputs"]),
                             outputs=_strs(s["outputs"]), device=_str(s["device"]),
                             attributes=tuple((_str(k), _freeze(v)) for k, v in s["attributes"]),
                             op=_str(s["op"]), version=_int(s["version"]))
                        for s in d["steps"]),
            arena=ArenaLayout(size=_int(arena["size"]), alignment=_int(arena["alignment"]),
                              max_tokens=_int(arena["max_tokens"]),
                              slots=tuple(BufferSlot(value=_str(s["value"]), offset=_int(s["offset"]),
                                                     nbytes=_int(s["nbytes"]), dtype=_str(s["dtype"]),
                                                     first_step=_int(s["first_step"]),
                                                     last_step=_int(s["last_step"]))
                                          for s in arena["slots"]),
                              rule=_str(arena["rule"])),
            storage=StoragePlan(
                budget_bytes=_int(storage["budget_bytes"]),
                weights=tuple(WeightPlacement(ref=_str(w["ref"]), nbytes=_int(w["nbytes"]),
                                              group=_str(w["group"]), mode=_str(w["mode"]))
                              for w in storage["weights"]),
                staging_buffers=tuple(_int(x) for x in storage["staging_buffers"]),
                prefetch_order=_strs(storage["prefetch_order"]),
                expert_cache_bytes=_int(storage["expert_cache_bytes"]),
                kv_cache_bytes=_int(storage["kv_cache_bytes"]),
                streamed_bytes_per_token=_int(storage.get("streamed_bytes_per_token", 0))),
            metadata=tuple((_str(k), _str(v)) for k, v in d["metadata"]),
        )


def overlapping_slots(arena: ArenaLayout) -> list[tuple[BufferSlot, BufferSlot]]:
    """Pairs of slots of ``arena`` that are live at the same step and share bytes; a correct plan has none. Here,
    beside the layout, because the planner checks its plans by it and every backend checks a plan's arena by it
    before running at its offsets: one definition of "overlap".

    A sweep over steps: each slot is compared only with the slots still live when it starts, not with every slot
    (the check of a cached plan runs this on every cache hit). Pairs come in the sweep's order, by first step."""
    bad = []
    live: list[BufferSlot] = []
    for s in sorted(arena.slots, key=lambda s: (s.first_step, s.offset)):
        live = [a for a in live if a.last_step >= s.first_step]
        for a in live:
            if (s.nbytes and a.nbytes and a.first_step <= s.last_step
                    and a.offset < s.offset + s.nbytes and s.offset < a.offset + a.nbytes):
                bad.append((a, s))
        live.append(s)
    return bad


def _str(x: Any) -> str:
    if not isinstance(x, str):
        raise TypeError(f"expected a string, found {type(x).__name__}")
    return x


def _strs(x: Any) -> tuple[str, ...]:
    if not isinstance(x, list):
        raise TypeError(f"expected a list of strings, found {type(x).__name__}")
    return tuple(_str(i) for i in x)


def _int(x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"expected an integer, found {type(x).__name__}")
    if x < 0:
        raise ValueError(f"expected a non-negative integer, found {x}")
    return x


def _freeze(v: Any) -> Any:
    """JSON lists come back as tuples so that a reloaded plan compares equal to the one saved."""
    if isinstance(v, list):
        return tuple(_freeze(i) for i in v)
    return v


__all__ = ["PLANNER_ARENA", "PLAN_FORMAT_VERSION", "ArenaLayout", "BufferSlot", "ExecutionPlan", "Step", "StoragePlan",
           "WeightPlacement", "overlapping_slots"]

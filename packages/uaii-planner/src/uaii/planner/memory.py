"""The memory plan: one activation arena whose offsets are reused by values whose lifetimes do not overlap.

1. Arena values are the outputs of nodes, except values that persist across steps: graph inputs and outputs,
   values the caller names (``PlannerOptions.persistent``) and outputs the op schema marks as state (the KV cache
   ``present_k``/``present_v`` of Attention). Those get no slot; the runtime owns them.
2. Sizes bind symbolic dims to their bounds (``seq`` → ``max_tokens``); the plan holds for any smaller batch.
3. Offsets: greedy by size, as TFLite's arena planner — values in decreasing size order each take the smallest gap
   between already placed values whose lifetimes overlap theirs (best fit), or the end. Every offset and
   reservation is a multiple of ``alignment``.

That is the generic rule, for a backend that consumes the planner's offsets as they are. A backend with its own
rule (views, in-place steps, its device's alignment) lays the arena out itself: the caller of
:func:`uaii.planner.plan` passes an :class:`ArenaPolicy` that asks it, and the plan carries the backend's layout —
what the backend will allocate, so that the budget is checked against that and not against an estimate.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from uaii.ir.dtype import Dim, tensor_nbytes
from uaii.ir.graph import Graph, Node
from uaii.ir.plan import PLANNER_ARENA, ArenaLayout, BufferSlot, overlapping_slots
from uaii.ir.registry import Registry, default_registry
from uaii.planner.errors import PlannerError
from uaii.planner.liveness import live_intervals
from uaii.planner.options import PlannerOptions

STATE_OUTPUTS: frozenset[tuple[str, str]] = frozenset({("Attention", "present_k"), ("Attention", "present_v")})
"""(op, output parameter) pairs that hold state across steps. A schema output parameter with a true ``state``
attribute counts as well, so a plugin op can declare its own without touching this table."""

_OPERATOR = re.compile(r"_(plus|minus|times|div|max)_")


# --- symbolic dims ------------------------------------------------------------------------------------------
def dim_bound(dim: Dim, bounds: Mapping[str, int], value: str = "") -> int:
    """An upper bound of ``dim`` given bounds of its symbols.

    ``dim`` is an int, a symbol (``seq``) or an expression that :mod:`uaii.ir.shapes` builds (``past_plus_seq``,
    ``seq_times_64``, ``_64_minus_seq``). Sums, products and maxima of bounds are bounds; for ``a - b`` and
    ``a / b`` only a literal ``b`` is subtracted or divided by (a symbolic one may be as small as 0 or 1).
    """
    if isinstance(dim, int):
        return dim
    if dim in bounds:
        return int(bounds[dim])
    parts = _OPERATOR.split(dim[1:] if dim.startswith("_") and dim[1:2].isdigit() else dim)
    if len(parts) == 1:
        what = f"value {value!r} has" if value else "found"
        raise PlannerError(f"{what} symbolic dim {dim!r} with no bound; bind it with "
                           f"PlannerOptions(dim_bounds={{{dim!r}: N}}) (seq is bound by max_tokens)")
    operands: list[tuple[int, bool]] = [_operand(p, bounds, value) for p in parts[0::2]]
    ops = parts[1::2]
    for level in (("times", "div"), ("plus", "minus"), ("max",)):
        vals, rest = [operands[0]], []
        for op, rhs in zip(ops, operands[1:], strict=True):
            if op in level:
                vals[-1] = (_apply(op, vals[-1][0], rhs), False)
            else:
                rest.append(op)
                vals.append(rhs)
        operands, ops = vals, rest
    return operands[0][0]


def _operand(text: str, bounds: Mapping[str, int], value: str) -> tuple[int, bool]:
    """(bound, is a literal)."""
    if text.isdigit():
        return int(text), True
    return dim_bound(text, bounds, value), False


def _apply(op: str, a: int, rhs: tuple[int, bool]) -> int:
    b, literal = rhs
    if op == "times":
        return a * b
    if op == "plus":
        return a + b
    if op == "max":
        return max(a, b)
    if op == "minus":
        return max(a - b, 0) if literal else a
    return -(-a // b) if literal and b > 0 else a  # div


def bound_nbytes(graph: Graph, value: str, bounds: Mapping[str, int]) -> int:
    t = graph.tensor(value)
    shape = tuple(dim_bound(d, bounds, value) for d in t.shape)
    return tensor_nbytes(t.dtype, shape)


# --- which values the arena holds ---------------------------------------------------------------------------
def state_values(graph: Graph, registry: Registry | None = None, persistent: Iterable[str] = ()) -> set[str]:
    """Values that live across steps: graph inputs/outputs, ``persistent`` and schema state outputs."""
    reg = registry if registry is not None else default_registry()
    out = {*graph.inputs, *graph.outputs, *persistent}
    for node in graph.nodes:
        schema = reg.find(node.op, node.version)
        if schema is None:
            continue
        for slot, value in enumerate(node.outputs):
            p = schema.param_at(schema.outputs, slot)
            if value and p is not None and (getattr(p, "state", False) or (node.op, p.name) in STATE_OUTPUTS):
                out.add(value)
    return out


def arena_values(graph: Graph, order: Sequence[Node], options: PlannerOptions,
                 registry: Registry | None = None) -> list[BufferSlot]:
    """One unplaced slot (offset 0) per arena value, with its bound size and lifetime."""
    keep = state_values(graph, registry, options.persistent)
    bounds = options.bounds
    slots = []
    for v, iv in live_intervals(order).items():
        t = graph.tensor_map.get(v)
        if v in keep or t is None or t.is_weight or t.is_constant:
            continue
        slots.append(BufferSlot(v, 0, bound_nbytes(graph, v, bounds), t.dtype.value, iv.first, iv.last))
    return slots


# --- offsets ------------------------------------------------------------------------------------------------
def align_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def assign_offsets(slots: Sequence[BufferSlot], alignment: int = 64, reuse: bool = True) -> tuple[int, dict[str, int]]:
    """(arena size, value → offset): greedy by size with best fit among lifetime-overlapping slots."""
    placed: list[tuple[int, int, BufferSlot]] = []  # (offset, reserved end, slot)
    offsets: dict[str, int] = {}
    size = 0
    for s in sorted(slots, key=lambda s: (-s.nbytes, s.first_step, s.value)):
        need = align_up(s.nbytes, alignment)
        offset = _best_fit(placed, s, need, alignment) if reuse else size
        placed.append((offset, offset + need, s))
        offsets[s.value] = offset
        size = max(size, offset + need)
    return size, offsets


def _best_fit(placed: Sequence[tuple[int, int, BufferSlot]], s: BufferSlot, need: int, alignment: int) -> int:
    live = sorted((off, end) for off, end, p in placed if p.first_step <= s.last_step and s.first_step <= p.last_step)
    best, best_gap, cursor = -1, math.inf, 0
    for off, end in live:
        gap = off - cursor
        if need <= gap < best_gap:
            best, best_gap = cursor, gap
        cursor = max(cursor, align_up(end, alignment))
    return best if best >= 0 else cursor


def plan_memory(graph: Graph, order: Sequence[Node], options: PlannerOptions,
                registry: Registry | None = None) -> ArenaLayout:
    """The activation arena of ``graph`` executed in ``order``."""
    return arena_layout(arena_values(graph, order, options, registry), options)


def arena_layout(slots: Sequence[BufferSlot], options: PlannerOptions) -> ArenaLayout:
    """The arena of the unplaced ``slots`` (:func:`arena_values`): offsets assigned, slots by first step."""
    size, offsets = assign_offsets(slots, options.alignment, options.enable_memory_reuse)
    placed = sorted((BufferSlot(s.value, offsets[s.value], s.nbytes, s.dtype, s.first_step, s.last_step)
                     for s in slots), key=lambda s: (s.first_step, s.value))
    return ArenaLayout(size=size, alignment=options.alignment, max_tokens=options.max_tokens, slots=tuple(placed))


@dataclass(frozen=True)
class ArenaPolicy:
    """The arena rule of the backend a plan is made for: ``layout(fused, order, options)`` returns the arena the
    backend will allocate for the fused graph executed in ``order`` at ``options.max_tokens`` tokens (with
    ``options.enable_memory_reuse``), and ``rule`` names that rule and its version (``cpu/1``).

    The planner cannot import backends, so the caller (the runtime) hands the backend's rule in, as it does
    placement. ``rule`` is part of the plan key — a plan laid out for one backend is never served to another — and
    the layout must carry it (:attr:`ArenaLayout.rule`); the layout may depend on the graph, the order, max_tokens
    and memory reuse, never on the budget."""

    rule: str
    layout: Callable[[Graph, Sequence[Node], PlannerOptions], ArenaLayout]

    def __call__(self, fused: Graph, order: Sequence[Node], options: PlannerOptions) -> ArenaLayout:
        arena = self.layout(fused, order, options)
        if arena.rule != self.rule or arena.max_tokens != options.max_tokens:
            raise PlannerError(f"the arena policy {self.rule!r} returned a layout of rule {arena.rule!r} for "
                               f"{arena.max_tokens} tokens, expected its own rule for {options.max_tokens} tokens "
                               f"(graph {fused.name!r})")
        return arena


def arena_rule(policy: ArenaPolicy | None) -> str:
    """The rule a plan's arena is laid out by: the policy's, else the planner's generic one."""
    return policy.rule if policy is not None else PLANNER_ARENA


@dataclass(frozen=True)
class MemoryReport:
    """Arena size against the sum of every intermediate's (aligned) size: what reuse saved."""

    arena_bytes: int
    intermediate_bytes: int
    values: int

    @property
    def saved_bytes(self) -> int:
        return self.intermediate_bytes - self.arena_bytes

    @property
    def reuse_ratio(self) -> float:
        """intermediate_bytes / arena_bytes (1.0 = no reuse)."""
        return self.intermediate_bytes / self.arena_bytes if self.arena_bytes else 1.0


def memory_report(arena: ArenaLayout) -> MemoryReport:
    total = sum(align_up(s.nbytes, arena.alignment) for s in arena.slots)
    return MemoryReport(arena.size, total, len(arena.slots))


__all__ = ["STATE_OUTPUTS", "ArenaPolicy", "MemoryReport", "align_up", "arena_layout", "arena_rule", "arena_values",
           "assign_offsets", "bound_nbytes", "dim_bound", "memory_report", "overlapping_slots", "plan_memory",
           "state_values"]

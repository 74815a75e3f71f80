"""Is a plan read back from the disk cache the plan of this graph? The checks it passes before it is used.

An entry that parses can still be wrong: edited by hand, written by another tool, damaged in a way JSON does not
notice (one step less, an offset changed). Run as it is, such a plan fails deep inside a backend — a ``KeyError``
for a value no step produced — on every run until the cache is emptied. So the planner compares a loaded plan with
what it knows of the graph, and rebuilds it on the first difference (:func:`uaii.planner.plan`).

The checks redo only what is cheap and deterministic, not the planner's choices (arena offsets, which weights are
pinned); they cost a small part of planning (Gemma-3 270M: see docs/planner.md), and take the order, weight uses
and arena values that ``plan()`` has already derived for the call (:mod:`uaii.planner.derive`):

- **key**: the plan's key and graph name are the ones asked for.
- **steps**: every step reads a graph input, a weight, a constant or the output of an earlier step; each value is
  written once; every graph output is written. Then the steps are exactly those the planner makes for the fused
  graph (fusion, execution order and step making are deterministic): each step's node, then the op and version the
  backend will run (the fused graph's node of that name has them), then kernel, values, device and attributes — so
  a backend is handed nothing a fresh plan would not give it.
- **arena**: laid out by the rule the plan was asked for. A backend's arena (an arena policy) is laid out again by
  the backend and must be equal, slot by slot — a corrupted offset or size is caught even where it overlaps
  nothing. The planner's generic arena: one slot per arena value with the size, dtype and lifetime that liveness
  gives, aligned, inside the arena; slots live at the same step share no bytes
  (:func:`uaii.ir.plan.overlapping_slots`).
- **storage**: the weights the steps read, each once, in first-use order, with their sizes and groups; modes the
  budget allows; prefetch order, staging buffers, expert cache and bytes per token as they follow from the modes
  (:func:`uaii.planner.storage.storage_for_modes`, which the planner makes them with); the whole within the budget.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import fields

from uaii.ir.graph import Graph
from uaii.ir.plan import PLANNER_ARENA, ArenaLayout, BufferSlot, ExecutionPlan, Step, StoragePlan, overlapping_slots
from uaii.ir.registry import Registry
from uaii.planner.derive import Derived, derive
from uaii.planner.memory import ArenaPolicy
from uaii.planner.options import PlannerOptions
from uaii.planner.steps import make_steps
from uaii.planner.storage import WeightUse, storage_for_modes


def plan_problems(plan: ExecutionPlan, graph: Graph, fused: Graph, options: PlannerOptions, *, key: str = "",
                  registry: Registry | None = None, derived: Derived | None = None,
                  arena: ArenaPolicy | None = None) -> Iterator[str]:
    """Why ``plan`` is not a plan of ``graph`` under ``options``, most basic first (nothing: it is one).

    ``fused`` is ``graph`` after the options' fusion passes (:func:`uaii.planner.fuse`); ``key``, when given, is
    the key the plan was looked up by; ``arena`` is the arena policy the plan was made with (a Session's plans are
    laid out by their backend's: without it the generic arena is expected); ``derived``, when given, is
    :func:`uaii.planner.derive.derive` of ``fused`` (under these options but for the budget, with that policy),
    which the planner has already computed. Lazy: a caller that wants the first problem pays for no further
    check."""
    if key and plan.key != key:
        yield f"its key is {plan.key[:16]}…, expected {key[:16]}…"
    if plan.graph_name != graph.name:
        yield f"it is a plan of graph {plan.graph_name!r}, expected {graph.name!r}"
    yield from _dataflow(plan.steps, graph)
    d = derived if derived is not None else derive(fused, options, registry, arena)
    yield from _steps(plan.steps, make_steps(d.fused, d.order, options.device, registry))
    if d.arena is not None:
        yield from _same_arena(plan.arena, d.arena)
    else:
        yield from _arena(plan.arena, d.slots, options)
    yield from _storage(plan, d.uses, options)


def first_problem(plan: ExecutionPlan, graph: Graph, fused: Graph, options: PlannerOptions, *, key: str = "",
                  registry: Registry | None = None, derived: Derived | None = None,
                  arena: ArenaPolicy | None = None) -> str | None:
    """The first of :func:`plan_problems`, or None."""
    return next(plan_problems(plan, graph, fused, options, key=key, registry=registry, derived=derived,
                              arena=arena), None)


# --- steps --------------------------------------------------------------------------------------------------
def _dataflow(steps: Sequence[Step], graph: Graph) -> Iterator[str]:
    """Each value read is there when read, each value written once, every graph output written."""
    tmap = graph.tensor_map
    ready = set(graph.inputs) | {t.name for t in graph.tensors if t.is_weight or t.is_constant}
    producer: dict[str, int] = {}
    for i, s in enumerate(steps):
        for v in s.outputs:
            producer.setdefault(v, i)
    for i, s in enumerate(steps):
        where = f"step {i} ({s.node!r})"
        for v in s.inputs:
            if not v or v in ready:
                continue
            if v not in tmap:
                yield f"{where} reads {v!r}, a value the graph does not declare"
            elif v in producer:
                yield f"{where} reads {v!r} before step {producer[v]} ({steps[producer[v]].node!r}) writes it"
            else:
                yield f"{where} reads {v!r}, which no step writes"
        for v in s.outputs:
            if not v:
                continue
            if v not in tmap:
                yield f"{where} writes {v!r}, a value the graph does not declare"
            elif v in ready:
                yield f"{where} writes {v!r}, which {_holder(v, graph, producer, steps)} already holds"
            ready.add(v)
    missing = [v for v in graph.outputs if v not in ready]
    if missing:
        yield f"no step writes graph output {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if missing[1:] else "")


def _holder(value: str, graph: Graph, producer: dict[str, int], steps: Sequence[Step]) -> str:
    if value in producer and value not in graph.inputs:
        return f"step {producer[value]} ({steps[producer[value]].node!r})"
    return "the graph (an input, weight or constant)"


def _steps(got: Sequence[Step], want: Sequence[Step]) -> Iterator[str]:
    """The first step that differs from the planner's, field by field (what runs first: node, op, version)."""
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if g == w:
            continue
        for name in _STEP_FIELDS:
            a, b = getattr(g, name), getattr(w, name)
            if a != b:
                yield f"step {i} ({w.node!r}) has {name} {a!r}, the planner makes {b!r}"
                return
    if len(got) != len(want):
        nxt = want[len(got)].node if len(got) < len(want) else got[len(want)].node
        yield f"it has {len(got)} steps, the planner makes {len(want)} (first unmatched: {nxt!r})"


_STEP_FIELDS = ("node", "op", "version", *(f.name for f in fields(Step) if f.name not in ("node", "op", "version")))


# --- arena --------------------------------------------------------------------------------------------------
def _same_arena(got: ArenaLayout, want: ArenaLayout) -> Iterator[str]:
    """A backend's arena: ``want`` is what its rule lays out now; the first difference."""
    if got == want:
        return
    for name in ("rule", "size", "alignment", "max_tokens"):
        if getattr(got, name) != getattr(want, name):
            yield f"its arena has {name} {getattr(got, name)!r}, the {want.rule} rule lays out {getattr(want, name)!r}"
            return
    mine = {s.value: s for s in want.slots}
    for s in got.slots:
        w = mine.pop(s.value, None)
        if w is None:
            yield f"its arena has a slot for {s.value!r}, which the {want.rule} rule does not place"
            return
        if s != w:
            name = next(f.name for f in fields(BufferSlot) if getattr(s, f.name) != getattr(w, f.name))
            yield f"arena slot {s.value!r} has {name} {getattr(s, name)!r}, the {want.rule} rule lays out " \
                  f"{getattr(w, name)!r}"
            return
    if mine:
        yield f"no arena slot holds {next(iter(mine))!r}, which the {want.rule} rule places"
    else:
        yield f"its arena slots are not in the order the {want.rule} rule lists them"


def _arena(arena: ArenaLayout, values: Sequence[BufferSlot], options: PlannerOptions) -> Iterator[str]:
    """``values``: the unplaced slots of the arena values (:func:`uaii.planner.memory.arena_values`)."""
    if arena.rule != PLANNER_ARENA:
        yield f"its arena is laid out by the {arena.rule!r} rule, expected the planner's"
        return
    if (arena.alignment, arena.max_tokens) != (options.alignment, options.max_tokens):
        yield (f"its arena is aligned to {arena.alignment} for {arena.max_tokens} tokens, the options say "
               f"{options.alignment} and {options.max_tokens}")
    want = {s.value: s for s in values}
    seen: set[str] = set()
    for s in arena.slots:
        w = want.get(s.value)
        if w is None or s.value in seen:
            yield f"arena slot {s.value!r} " + ("is listed twice" if w else "is not an activation of the steps")
            return
        seen.add(s.value)
        for name in ("nbytes", "dtype", "first_step", "last_step"):
            if getattr(s, name) != getattr(w, name):
                yield f"arena slot {s.value!r} has {name} {getattr(s, name)!r}, expected {getattr(w, name)!r}"
        if s.offset % arena.alignment or s.offset + s.nbytes > arena.size:
            yield (f"arena slot {s.value!r} at bytes [{s.offset}, {s.offset + s.nbytes}) is not "
                   f"{arena.alignment}-aligned inside the {arena.size}-byte arena")
    missing = [v for v in want if v not in seen]
    if missing:
        yield f"no arena slot holds {missing[0]!r}"
    shared = overlapping_slots(arena)
    if shared:
        a, b = shared[0]
        yield (f"arena slots {a.value!r} [{a.offset}, {a.offset + a.nbytes}) and {b.value!r} "
               f"[{b.offset}, {b.offset + b.nbytes}) are live at the same step and share bytes")


# --- storage ------------------------------------------------------------------------------------------------
def _storage(plan: ExecutionPlan, uses: Mapping[str, WeightUse], options: PlannerOptions) -> Iterator[str]:
    s = plan.storage
    if (s.budget_bytes, s.kv_cache_bytes) != (options.budget_bytes, options.kv_cache_bytes):
        yield (f"its storage plan is for a budget of {s.budget_bytes} bytes with a {s.kv_cache_bytes}-byte KV "
               f"cache, the options say {options.budget_bytes} and {options.kv_cache_bytes}")
    refs = [w.ref for w in s.weights]
    if refs != list(uses):
        yield _weights_differ(refs, list(uses))
        return
    for w in s.weights:
        u = uses[w.ref]
        if (w.nbytes, w.group) != (u.nbytes, u.group):
            yield (f"weight {w.ref!r} is placed as {w.nbytes} bytes of group {w.group!r}, expected {u.nbytes} "
                   f"bytes of {u.group!r}")
        allowed = ("mmap",) if options.budget_bytes == 0 else ("pinned", "streamed")
        if w.mode not in (allowed if u.streamable else ("pinned",)):
            yield f"weight {w.ref!r} is {w.mode}, which a budget of {options.budget_bytes} does not allow for it"
    yield from _derived(s, storage_for_modes(list(uses.values()), [w.mode for w in s.weights], options,
                                             plan.arena.size))
    total = plan.planned_bytes
    if options.budget_bytes and total > options.budget_bytes:
        yield f"it holds {total} bytes, over the budget of {options.budget_bytes}"


def _weights_differ(got: list[str], want: list[str]) -> str:
    got_set, want_set = set(got), set(want)
    extra = [r for r in got if r not in want_set]
    missing = [r for r in want if r not in got_set]
    if missing:
        return f"its storage plan does not place weight {missing[0]!r}"
    if extra:
        return f"its storage plan places {extra[0]!r}, which no step reads"
    if len(got) != len(got_set):
        return f"its storage plan places {next(r for r in got if got.count(r) > 1)!r} twice"
    i = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
    return f"its storage plan lists {got[i]!r} where the first use order has {want[i]!r}"


_FROM_MODES = ("prefetch_order", "staging_buffers", "expert_cache_bytes", "streamed_bytes_per_token")
"""The fields of a storage plan that follow from its weights' modes (:func:`uaii.planner.storage.storage_for_modes`)."""


def _derived(s: StoragePlan, expected: StoragePlan) -> Iterator[str]:
    for name in _FROM_MODES:
        got, want = getattr(s, name), getattr(expected, name)
        if got != want:
            yield f"its storage plan has {name} {_short(got)}, the weights' modes give {_short(want)}"


def _short(x: object) -> str:
    return f"({len(x)} entries)" if isinstance(x, tuple) and len(x) > 4 else repr(x)


__all__ = ["first_problem", "plan_problems"]

"""The planner's entry points: fuse, order, lay out memory and storage, and cache the result on disk.

``plan(graph, options)`` validates the graph, looks the plan up in the disk cache by its key, and otherwise runs
:func:`build_plan` and stores the result. The key is the sha256 of the graph's canonical IR bytes (codec 2), the
options' canonical JSON, the versions of uaii-ir and uaii-planner and a digest of the planner's own source, so
neither a new release nor a changed planner between releases (a development checkout) reuses a stale plan.
Placement (which device runs each step) is a callback applied to the steps after planning and after a cache hit
alike; it is not part of the key, and the cached plan holds the default device.

The arena is the backend's when the caller passes its :class:`~uaii.planner.memory.ArenaPolicy` (``arena=``): the
backend will allocate what the plan says, so the budget holds its real arena. The policy's rule is part of the key
(a plan laid out for the CPU is never served to WebGPU); without a policy the planner lays the arena out by its
generic rule (for a backend that consumes those offsets).

A cached plan is checked against the graph before it is used (:mod:`uaii.planner.check`); one that does not match
is logged with its file and its first problem, rebuilt and overwritten.

The budget is keyed by what the plan depends on. Above :func:`budget_ceiling` — more than any storage plan of the
graph can hold: every weight, staging buffers for every weight, KV and expert caches, an arena without reuse — every
total the pinning rule compares with the budget fits, so the plan no longer changes with the budget: it is keyed and
made with the ceiling instead (:func:`keyed_options`), and the plan handed out carries the caller's budget and
options (it equals what :func:`build_plan` makes with them, but for the key, which names the cache entry). A model
that fits the machine with room to spare thus keeps one cache entry however free memory (the ``auto`` preset's
budget) moves. This holds while every decision in :mod:`uaii.planner.storage` is "does this total fit the budget";
tests plan at the ceiling and far above it and compare.

Every value a step names is declared in the input graph (fusion only removes values), so a runtime can take
dtypes and shapes from the graph it loaded and the schedule from the plan.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Iterable
from dataclasses import replace
from functools import cache
from importlib import metadata
from pathlib import Path

from uaii.ir.graph import Graph
from uaii.ir.plan import PLAN_FORMAT_VERSION, PLANNER_ARENA, ArenaLayout, BufferSlot, ExecutionPlan
from uaii.ir.registry import Registry
from uaii.ir.serialize import to_bytes
from uaii.ir.validator import check
from uaii.planner.cache import PlanCache
from uaii.planner.check import first_problem
from uaii.planner.derive import Derived, derive
from uaii.planner.memory import ArenaPolicy, align_up, arena_layout, arena_rule, memory_report
from uaii.planner.options import PlannerOptions
from uaii.planner.passes import default_passes, run_passes
from uaii.planner.steps import Placement, make_steps, place
from uaii.planner.storage import WeightUse, expert_cache_need, staging_unit, storage_for_uses

log = logging.getLogger("uaii.planner")

KEYED_PACKAGES = ("uaii-ir", "uaii-planner")


def package_versions() -> dict[str, str]:
    out = {}
    for dist in KEYED_PACKAGES:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "unknown"
    return out


@cache
def source_digest() -> str:
    """sha256 of the planner's Python sources: the version stays the same across development commits, whose
    planning rules may not (a plan cached by an older checkout would otherwise be served as a hit)."""
    h = hashlib.sha256()
    for f in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f.name.encode("utf-8") + b"\0" + f.read_bytes())
    return h.hexdigest()


def plan_key(graph: Graph, options: PlannerOptions | None = None, arena: str = PLANNER_ARENA) -> str:
    """sha256 (hex) of canonical IR bytes + canonical options JSON + package versions + the planner's source digest
    + plan format + ``arena``, the rule that lays out the arena (:func:`uaii.planner.memory.arena_rule`)."""
    opts = options if options is not None else PlannerOptions()
    h = hashlib.sha256()
    for part in (b"uaii-plan", to_bytes(graph), opts.to_json().encode("utf-8"),
                 json.dumps({"versions": package_versions(), "planner_source": source_digest(),
                             "plan_format": PLAN_FORMAT_VERSION, "arena_rule": arena},
                            sort_keys=True).encode("utf-8")):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def fuse(graph: Graph, options: PlannerOptions | None = None, registry: Registry | None = None) -> Graph:
    """The graph after the fusion passes the options enable (the same object when fusion is off)."""
    opts = options if options is not None else PlannerOptions()
    if not opts.enable_fusion:
        return graph
    return run_passes(graph, opts.passes, registry)


def build_plan(graph: Graph, options: PlannerOptions | None = None, *, registry: Registry | None = None,
               key: str = "", arena: ArenaPolicy | None = None) -> ExecutionPlan:
    """Plan ``graph`` (already validated) without the cache: fusion, order, steps, arena (the backend's, with an
    ``arena`` policy), storage."""
    opts = options if options is not None else PlannerOptions()
    fused = fuse(graph, opts, registry)
    if fused is not graph:
        check(fused, registry)
    return _build(graph, derive(fused, opts, registry, arena), opts, registry,
                  key or plan_key(graph, opts, arena_rule(arena)))


def _build(graph: Graph, d: Derived, options: PlannerOptions, registry: Registry | None, key: str) -> ExecutionPlan:
    """:func:`build_plan` from what is derived of the fused graph, once that graph is validated."""
    arena = d.arena if d.arena is not None else arena_layout(d.slots, options)
    storage = storage_for_uses(list(d.uses.values()), arena, options)
    return ExecutionPlan(key=key, graph_name=graph.name, steps=make_steps(d.fused, d.order, options.device, registry),
                         arena=arena, storage=storage, metadata=plan_metadata(graph, d.fused, options, arena))


def plan_metadata(graph: Graph, fused: Graph, options: PlannerOptions,
                  arena: ArenaLayout) -> tuple[tuple[str, str], ...]:
    """The ``metadata`` of a plan: planner version and options, fusion passes and node counts, arena figures."""
    report = memory_report(arena)
    passes = (options.passes if options.passes is not None else default_passes()) if options.enable_fusion else ()
    meta = {
        "planner.version": package_versions()["uaii-planner"],
        "planner.options": options.to_json(),
        "fusion.passes": ",".join(passes),
        "fusion.nodes_before": str(len(graph.nodes)),
        "fusion.nodes_after": str(len(fused.nodes)),
        "arena.intermediate_bytes": str(report.intermediate_bytes),
        "arena.values": str(report.values),
    }
    return tuple(sorted(meta.items()))


def budget_ceiling(fused: Graph, options: PlannerOptions, registry: Registry | None = None,
                   arena: ArenaPolicy | None = None) -> int:
    """Bytes no storage plan of ``fused`` (the graph after fusion) can exceed under ``options``, whatever it pins:
    every weight, ``staging_buffers`` buffers sized as if every weight streamed, the KV cache, the expert cache as
    if every bank streamed, and the arena without reuse — or, with a backend's ``arena`` policy, the backend's arena
    (fixed whatever is pinned). (Staging and the expert cache grow with what streams.)"""
    d = derive(fused, options, registry, arena)
    return _ceiling(d.uses.values(), d.slots, options, d.arena)


def _ceiling(uses: Collection[WeightUse], slots: Iterable[BufferSlot], options: PlannerOptions,
             backend_arena: ArenaLayout | None = None) -> int:
    """:func:`budget_ceiling` of the weight uses and the unplaced arena slots of the fused graph (or the backend's
    arena)."""
    streamable = [u for u in uses if u.streamable]
    arena = (backend_arena.size if backend_arena is not None
             else sum(align_up(s.nbytes, options.alignment) for s in slots))
    return (sum(u.nbytes for u in uses) + options.staging_buffers * staging_unit(streamable, options.stream_unit)
            + options.kv_cache_bytes + max(options.expert_cache_bytes, expert_cache_need(streamable)) + arena)


def keyed_options(fused: Graph, options: PlannerOptions, registry: Registry | None = None,
                  arena: ArenaPolicy | None = None) -> PlannerOptions:
    """``options`` with a budget above :func:`budget_ceiling` lowered to the ceiling: the options a plan is keyed
    and made with (the plan is the same at any budget from the ceiling up; see the module doc)."""
    if not options.budget_bytes:
        return options
    return _lowered(derive(fused, options, registry, arena), options)


def _lowered(d: Derived, options: PlannerOptions) -> PlannerOptions:
    """:func:`keyed_options` from what is derived of the fused graph."""
    if not options.budget_bytes:
        return options
    ceiling = _ceiling(d.uses.values(), d.slots, options, d.arena)
    return replace(options, budget_bytes=ceiling) if options.budget_bytes > ceiling else options


def plan(graph: Graph, options: PlannerOptions | None = None, cache: bool | PlanCache = True, *,
         registry: Registry | None = None, placement: Placement | None = None,
         arena: ArenaPolicy | None = None) -> tuple[ExecutionPlan, bool]:
    """(plan, cache_hit). ``cache`` is True (the default cache folder), a :class:`PlanCache`, or False. ``arena``:
    the arena policy of the backend the plan is for (its rule lays the arena out and is part of the key; None: the
    planner's generic rule).

    A cache hit skips validation of the graph and planning, not the check of the cached plan against the graph
    (:mod:`uaii.planner.check`). A missing, unreadable, corrupt or mismatched entry is rebuilt and overwritten (a
    mismatch is logged with the entry's file and its first problem). A cache that cannot be written (read-only
    folder) is logged and otherwise ignored. The plan carries ``options.budget_bytes`` even when it was keyed by a
    lower ceiling (:func:`keyed_options`).
    """
    opts = options if options is not None else PlannerOptions()
    store = cache if isinstance(cache, PlanCache) else (PlanCache() if cache else None)
    derived = _derived(graph, opts, registry, arena)
    keyed = _lowered(derived, opts) if derived is not None else opts
    key = plan_key(graph, keyed, arena_rule(arena))
    if store is not None:
        hit = store.load(key)
        if hit is not None:
            problem = cached_plan_problem(hit, graph, keyed, key, derived=derived, registry=registry, arena=arena)
            if problem is None:
                return _served(hit, opts, placement), True
            log.warning("[planner] plan cache entry %s does not match graph %r: %s; planning again and overwriting "
                        "it (`uaii cache clear` empties the plan cache)", store.path_for(key), graph.name, problem)
    check(graph, registry)
    if derived is None:  # build_plan raises what stopped the derivation, after validating the fused graph
        result = build_plan(graph, keyed, registry=registry, key=key, arena=arena)
    else:
        if derived.fused is not graph:
            check(derived.fused, registry)
        result = _build(graph, derived, keyed, registry, key)
    if store is not None:
        try:
            store.store(result)
        except OSError as exc:
            log.warning("[planner] could not write the plan cache entry in %s: %s (UAII_CACHE_DIR chooses the "
                        "folder)", store.directory, exc)
    return _served(result, opts, placement), False


def cached_plan_problem(p: ExecutionPlan, graph: Graph, options: PlannerOptions, key: str, *,
                        derived: Derived | None = None, registry: Registry | None = None,
                        arena: ArenaPolicy | None = None) -> str | None:
    """Why ``p``, read from the cache under ``key``, is not the plan :func:`build_plan` makes of ``graph`` with
    ``options`` (its choices of generic offsets and pins aside; a backend's arena must be the one its ``arena``
    policy lays out), or None. ``derived``: what is derived of the fused graph (:mod:`uaii.planner.derive`, with the
    same policy), when the caller has it. Never raises: a plan whose check fails with an error is reported as that
    error, since it cannot be trusted either."""
    try:
        d = derived if derived is not None else derive(fuse(graph, options, registry), options, registry, arena)
        problem = first_problem(p, graph, d.fused, options, key=key, registry=registry, derived=d)
        if problem is None:
            got, want = dict(p.metadata), dict(plan_metadata(graph, d.fused, options, p.arena))
            name = next((k for k in sorted(got.keys() | want.keys()) if got.get(k) != want.get(k)), None)
            if name is not None:
                problem = f"its metadata {name!r} is {got.get(name)!r}, expected {want.get(name)!r}"
    except Exception as exc:  # whatever a damaged plan makes the check trip over, it is not used
        problem = f"checking it failed: {type(exc).__name__}: {exc}"
    return problem


def _derived(graph: Graph, opts: PlannerOptions, registry: Registry | None,
             arena: ArenaPolicy | None) -> Derived | None:
    """What :func:`plan` derives once for the ceiling, the check of a hit and the build of a miss, or None. The
    graph is not validated yet (a cache hit skips that): a graph that cannot be derived keeps its options, and
    planning reports the error."""
    try:
        return derive(fuse(graph, opts, registry), opts, registry, arena)
    except Exception:  # check(graph) before planning names what is wrong
        log.debug("[planner] cannot derive the plan of graph %r before validating it", graph.name, exc_info=True)
        return None


def _served(p: ExecutionPlan, options: PlannerOptions, placement: Placement | None) -> ExecutionPlan:
    """The plan as the caller asked for it — its budget and options (what :func:`build_plan` would have made with
    them), its devices."""
    if p.storage.budget_bytes != options.budget_bytes:
        meta = {**dict(p.metadata), "planner.options": options.to_json()}
        p = replace(p, storage=replace(p.storage, budget_bytes=options.budget_bytes),
                    metadata=tuple(sorted(meta.items())))
    return _placed(p, placement)


def _placed(p: ExecutionPlan, placement: Placement | None) -> ExecutionPlan:
    if placement is None:
        return p
    return replace(p, steps=place(p.steps, placement))


__all__ = ["KEYED_PACKAGES", "budget_ceiling", "build_plan", "cached_plan_problem", "fuse", "keyed_options",
           "package_versions", "plan", "plan_key", "plan_metadata"]

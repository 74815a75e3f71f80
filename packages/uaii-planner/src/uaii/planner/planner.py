"""The planner's entry points: fuse, order, lay out memory and storage, and cache the result on disk.

``plan(graph, options)`` validates the graph, looks the plan up in the disk cache by its key, and otherwise runs
:func:`build_plan` and stores the result. The key is the sha256 of the graph's canonical IR bytes (codec 2), the
options' canonical JSON, the versions of uaii-ir and uaii-planner and a digest of the planner's own source, so
neither a new release nor a changed planner between releases (a development checkout) reuses a stale plan.
Placement (which device runs each step) is a callback applied to the steps after planning and after a cache hit
alike; it is not part of the key, and the cached plan holds the default device.

Every value a step names is declared in the input graph (fusion only removes values), so a runtime can take
dtypes and shapes from the graph it loaded and the schedule from the plan.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import replace
from functools import cache
from importlib import metadata
from pathlib import Path

from uaii.ir.graph import Graph
from uaii.ir.plan import PLAN_FORMAT_VERSION, ExecutionPlan
from uaii.ir.registry import Registry
from uaii.ir.serialize import to_bytes
from uaii.ir.validator import check
from uaii.planner.cache import PlanCache
from uaii.planner.liveness import execution_order
from uaii.planner.memory import memory_report, plan_memory
from uaii.planner.options import PlannerOptions
from uaii.planner.passes import default_passes, run_passes
from uaii.planner.steps import Placement, make_steps, place
from uaii.planner.storage import plan_storage

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


def plan_key(graph: Graph, options: PlannerOptions | None = None) -> str:
    """sha256 (hex) of canonical IR bytes + canonical options JSON + package versions + the planner's source digest
    + plan format."""
    opts = options if options is not None else PlannerOptions()
    h = hashlib.sha256()
    for part in (b"uaii-plan", to_bytes(graph), opts.to_json().encode("utf-8"),
                 json.dumps({"versions": package_versions(), "planner_source": source_digest(),
                             "plan_format": PLAN_FORMAT_VERSION},
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
               key: str = "") -> ExecutionPlan:
    """Plan ``graph`` (already validated) without the cache: fusion, order, steps, arena, storage."""
    opts = options if options is not None else PlannerOptions()
    fused = fuse(graph, opts, registry)
    if fused is not graph:
        check(fused, registry)
    order = execution_order(fused)
    arena = plan_memory(fused, order, opts, registry)
    storage = plan_storage(fused, order, arena, opts, registry)
    report = memory_report(arena)
    passes = (opts.passes if opts.passes is not None else default_passes()) if opts.enable_fusion else ()
    meta = {
        "planner.version": package_versions()["uaii-planner"],
        "planner.options": opts.to_json(),
        "fusion.passes": ",".join(passes),
        "fusion.nodes_before": str(len(graph.nodes)),
        "fusion.nodes_after": str(len(fused.nodes)),
        "arena.intermediate_bytes": str(report.intermediate_bytes),
        "arena.values": str(report.values),
    }
    return ExecutionPlan(key=key or plan_key(graph, opts), graph_name=graph.name,
                         steps=make_steps(fused, order, opts.device, registry), arena=arena, storage=storage,
                         metadata=tuple(sorted(meta.items())))


def plan(graph: Graph, options: PlannerOptions | None = None, cache: bool | PlanCache = True, *,
         registry: Registry | None = None, placement: Placement | None = None) -> tuple[ExecutionPlan, bool]:
    """(plan, cache_hit). ``cache`` is True (the default cache folder), a :class:`PlanCache`, or False.

    A cache hit skips validation and planning; a missing, unreadable or corrupt entry is rebuilt and
    overwritten. A cache that cannot be written (read-only folder) is logged and otherwise ignored.
    """
    opts = options if options is not None else PlannerOptions()
    store = cache if isinstance(cache, PlanCache) else (PlanCache() if cache else None)
    key = plan_key(graph, opts)
    if store is not None:
        hit = store.load(key)
        if hit is not None:
            return _placed(hit, placement), True
    check(graph, registry)
    result = build_plan(graph, opts, registry=registry, key=key)
    if store is not None:
        try:
            store.store(result)
        except OSError as exc:
            log.warning("[planner] could not write the plan cache entry in %s: %s", store.directory, exc)
    return _placed(result, placement), False


def _placed(p: ExecutionPlan, placement: Placement | None) -> ExecutionPlan:
    if placement is None:
        return p
    return replace(p, steps=place(p.steps, placement))


__all__ = ["KEYED_PACKAGES", "build_plan", "fuse", "package_versions", "plan", "plan_key"]

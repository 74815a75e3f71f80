"""What a pipeline would do, without running it: the split for per-node budgets and each stage's storage plan.

``uaii plan --pipeline K --budget-per-node B`` prints this. Nothing is compiled and no weight is read: the stages'
graphs are planned here as each stage would plan its own on its node (the same planner, the same budget), so a split
of a model far larger than this machine can be checked before any cluster exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uaii.ir import Graph, num_elements
from uaii.runtime.bounds import ContextBounds
from uaii.runtime.budget import kv_cache_bytes, kv_layer_bytes
from uaii.runtime.errors import SessionError
from uaii.runtime.model import load_bundle
from uaii.runtime.options import SessionOptions
from uaii.runtime.planning import kv_slots, session_plan
from uaii.runtime.rewrite import last_token_logits


@dataclass(frozen=True)
class StagePlan:
    """One stage as planned: its layers, its weights and how its budget holds them, and what it sends on."""

    index: int
    first: int
    last: int
    budget_bytes: int
    weight_bytes: int
    pinned_bytes: int
    streamed_bytes_per_token: int  # read from disk per token (0: everything pinned or mapped)
    kv_cache_bytes: int
    arena_bytes: int
    total_bytes: int  # what the plan holds in memory (pins, staging, KV cache, arena, expert cache)
    sends_bytes_per_token: int  # the activations it sends to the next stage, per token (0: the last stage)


def crossing_bytes(graph: Any, values: Sequence[str]) -> int:
    """Bytes per token of ``values`` (their dims other than the token axis, times their element size)."""
    total = 0
    for v in values:
        t = graph.tensor(v)
        total += t.dtype.nbytes(num_elements([int(d) for d in t.shape if isinstance(d, int)]))
    return total


def layer_kv_bytes(graph: Graph, options: SessionOptions, context: int) -> list[int]:
    """Bytes of one sequence's KV cache per cached layer, at capacity: what a layer costs a stage beside its
    weights."""
    return kv_layer_bytes(graph, kv_slots(options, context), options.kv_dtype)


def held_and_streamed(storage: Any, weight_bytes: int) -> tuple[int, int]:
    """(weight bytes a stage holds, bytes it reads per token) under its storage plan: without a budget (or a plan)
    every weight is memory-mapped, held as far as this count goes, and nothing streams. The running stage
    (:meth:`StageRunner.summary`) and ``uaii plan --pipeline`` (:func:`plan_stages`) both report it."""
    if storage is None or not storage.budget_bytes:
        return weight_bytes, 0
    return int(storage.pinned_bytes), int(storage.streamed_bytes_per_token)


def stage_starts(graph: Any, options: SessionOptions, budgets: Sequence[int], context: int) -> list[int]:
    """Where stages 1 .. K - 1 begin: ``options.pipeline_starts`` when given, else the split
    :func:`uaii.planner.choose_split` picks for the stages' ``budgets`` (their layers' KV caches counted)."""
    from uaii.planner import choose_split

    return list(options.pipeline_starts) or choose_split(graph, options.pipeline, budgets,
                                                         layer_kv_bytes(graph, options, context))


def plan_stages(path: str | Path, stages: int, budget_bytes: int, starts: Sequence[int] = (),
                **options: Any) -> list[StagePlan]:
    """The stages of the model at ``path`` split for ``stages`` nodes of ``budget_bytes`` each (0: unlimited), or
    at ``starts``; ``options``: the other Session options the stages would run with."""
    from uaii.backends import select_device
    from uaii.planner import split_graph

    o = SessionOptions.from_kwargs({**options, "budget_bytes": budget_bytes, "pipeline": stages,
                                    "pipeline_starts": tuple(starts)})
    bundle = load_bundle(path)
    if not bundle.generative:
        raise SessionError(f"[runtime] {bundle.path.name} is not a decoder LM with a KV cache: only those run as "
                           "pipeline stages")
    bounds, o = ContextBounds.of(bundle, o)
    graph = last_token_logits(bundle.graph)
    cut = stage_starts(graph, o, [budget_bytes], bounds.context)
    backend = select_device(o.device)
    out = []
    for st in split_graph(graph, cut):
        plan, _ = session_plan(st.graph, bundle, o, backend=backend, context=bounds.context, budget=budget_bytes,
                               cached=True)
        storage = getattr(plan, "storage", None)
        kv = kv_cache_bytes(st.graph, kv_slots(o, bounds.context), o.kv_dtype)
        arena = plan.arena.size if plan is not None else 0
        pinned, streamed = held_and_streamed(storage, st.weight_bytes)
        total = (plan.planned_bytes if plan is not None and storage is not None and storage.budget_bytes
                 else st.weight_bytes + kv + arena)
        out.append(StagePlan(st.index, st.first, st.last, budget_bytes, st.weight_bytes, pinned, streamed, kv, arena,
                             total, crossing_bytes(st.graph, [v for v in st.sends if v in st.graph.tensor_map])
                             if st.sends else 0))
    return out


__all__ = ["StagePlan", "crossing_bytes", "held_and_streamed", "layer_kv_bytes", "plan_stages", "stage_starts"]

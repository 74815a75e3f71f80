"""One owner of the activation arena (issue #12): the planner asks the backend for it, the executable allocates it.

The plan's arena is the backend's own layout (``backend.plan_arena`` through the runtime's arena policy): the CPU
executable compiled with the plan allocates exactly ``plan.arena.size`` at the plan's offsets, the budget counts
that number, a plan laid out for one backend is never served to another, and a cached arena that differs from what
the backend lays out is rebuilt. WebGPU runs where an adapter exists (lavapipe counts)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from planner_helpers import llama, llama_feeds, random_weights

from uaii.backends import ArrayWeights, BackendError, plan_graph
from uaii.backends.cpu import CpuBackend
from uaii.backends.cpu.memory import ARENA_RULE
from uaii.ir import FormatError, Graph
from uaii.ir.plan import PLANNER_ARENA, ArenaLayout, ExecutionPlan
from uaii.planner import PlanCache, PlannerOptions, plan
from uaii.runtime import Session
from uaii.runtime.planning import arena_policy

CPU = CpuBackend()
OPTS = PlannerOptions(max_tokens=8, dim_bounds={"past": 32})


def _weights(graph: Graph) -> ArrayWeights:
    arrays = random_weights(graph)
    return ArrayWeights({str(t.weight) if t.weight else t.name: arrays[t.name] for t in graph.weights})


def _offsets(arena: ArenaLayout) -> dict[str, tuple[int, int]]:
    return {s.value: (s.offset, s.nbytes) for s in arena.slots}


def _exe_offsets(exe: object) -> dict[str, tuple[int, int]]:
    layout = exe._layout  # type: ignore[attr-defined]
    return {o: (layout.offset[o], layout.nbytes[o]) for o in layout.offset}


@pytest.mark.parametrize("memory_reuse", [True, False])
def test_the_cpu_executable_allocates_the_plans_arena_for_a_tiny_llama(memory_reuse: bool) -> None:
    graph = llama(2)
    opts = replace(OPTS, enable_memory_reuse=memory_reuse)
    p, _ = plan(graph, opts, cache=False, arena=arena_policy(CPU))
    assert p.arena.rule == ARENA_RULE and p.arena.max_tokens == 8
    exe = CPU.compile(graph, p, _weights(graph), memory_reuse=memory_reuse)
    assert exe.memory().arena_bytes == p.arena.size
    assert _exe_offsets(exe) == _offsets(p.arena)
    # the one rule: the executable laying out the plan's graph itself (no plan) makes the same arena
    alone = CPU.compile(plan_graph(graph, p), None, _weights(graph), max_tokens=8, memory_reuse=memory_reuse)
    assert _exe_offsets(alone) == _offsets(p.arena) and alone.memory().arena_bytes == p.arena.size
    feeds = llama_feeds(graph, seq=3, past=0)
    run = {n: feeds[n] for n in exe.input_names}
    np.testing.assert_array_equal(exe.run(run, exe.new_state(16))["logits"],
                                  alone.run(run, alone.new_state(16))["logits"])


def test_views_and_in_place_results_live_in_their_owners_slot() -> None:
    """Only buffer owners get slots: no two slots live at the same step share bytes, and the views and in-place
    results of the executable have none of their own."""
    graph = llama(1)
    p, _ = plan(graph, OPTS, cache=False, arena=arena_policy(CPU))
    exe = CPU.compile(graph, p, _weights(graph))
    layout = exe._layout
    shared = {v for v, owner in layout.root.items() if v != owner}
    assert shared and not shared & {s.value for s in p.arena.slots}
    from uaii.planner.memory import overlapping_slots

    assert overlapping_slots(p.arena) == []


def test_the_cpu_refuses_an_arena_its_rule_did_not_lay_out() -> None:
    graph = llama(1)
    generic, _ = plan(graph, OPTS, cache=False)
    assert generic.arena.rule == PLANNER_ARENA
    with pytest.raises(BackendError, match=r"laid out by the 'planner' rule, not this backend's 'cpu/1'"):
        CPU.compile(graph, generic, _weights(graph))
    p, _ = plan(graph, OPTS, cache=False, arena=arena_policy(CPU))
    with pytest.raises(BackendError, match="laid out for 8 tokens, compile asks for 16"):
        CPU.compile(graph, p, _weights(graph), max_tokens=16)
    victim = max(p.arena.slots, key=lambda s: s.nbytes)
    small = replace(p.arena, slots=tuple(replace(s, nbytes=s.nbytes - 4) if s == victim else s
                                         for s in p.arena.slots))
    with pytest.raises(BackendError, match=rf"slot '{victim.value}' has {victim.nbytes - 4} bytes"):
        CPU.compile(graph, replace(p, arena=small), _weights(graph))
    with pytest.raises(BackendError, match="kv_state=True"):
        CPU.compile(graph, p, _weights(graph), kv_state=False)
    a = next(s for s in p.arena.slots if s.offset == 0)
    b = next(s for s in p.arena.slots if s != a and s.first_step <= a.last_step and a.first_step <= s.last_step)
    moved = replace(p.arena, slots=tuple(replace(s, offset=0) if s == b else s for s in p.arena.slots))
    with pytest.raises(BackendError, match="live at the same step and share bytes"):
        CPU.compile(graph, replace(p, arena=moved), _weights(graph))


def test_a_plan_for_the_cpu_is_not_served_to_webgpu(tmp_path: Path) -> None:
    from uaii.backends.webgpu import WebGpuBackend

    graph = llama(1)
    cache = PlanCache(tmp_path)
    cpu_plan, hit = plan(graph, OPTS, cache=cache, arena=arena_policy(CPU))
    assert not hit and plan(graph, OPTS, cache=cache, arena=arena_policy(CPU)) == (cpu_plan, True)
    gpu_plan, hit = plan(graph, OPTS, cache=cache, arena=arena_policy(WebGpuBackend(allow_software=True)))
    assert not hit and gpu_plan.key != cpu_plan.key
    assert (gpu_plan.arena.rule, gpu_plan.arena.alignment) == ("webgpu/1", 256)
    assert plan(graph, OPTS, cache=cache)[0].key not in (cpu_plan.key, gpu_plan.key)  # the generic rule: a third


@pytest.mark.parametrize("damage", ["offset", "size", "rule", "drop"])
def test_a_damaged_cached_arena_is_rebuilt(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    """Even an edit that keeps the arena consistent (an offset moved into free space) is not the backend's."""
    graph = llama(1)
    cache = PlanCache(tmp_path)
    good, _ = plan(graph, OPTS, cache=cache, arena=arena_policy(CPU))
    d = json.loads(good.to_json())
    arena = d["arena"]
    if damage == "offset":
        arena["slots"][0]["offset"] = arena["size"]
        arena["size"] += 4096 + arena["slots"][0]["nbytes"]
    elif damage == "size":
        arena["size"] += 64
    elif damage == "rule":
        arena["rule"] = PLANNER_ARENA
    else:
        del arena["slots"][-1]
    cache.path_for(good.key).write_text(json.dumps(d))
    assert ExecutionPlan.from_json(cache.path_for(good.key).read_text()) != good
    served, hit = plan(graph, OPTS, cache=cache, arena=arena_policy(CPU))
    assert (served, hit) == (good, False)
    assert "its arena" in caplog.text or "arena slot" in caplog.text


def test_a_backend_without_an_arena_rule_is_not_planned_with_the_generic_one() -> None:
    from uaii.runtime.errors import SessionError

    class NoRule(CpuBackend):
        name = "norule"

        @property
        def capabilities(self):  # type: ignore[no-untyped-def]
            return replace(super().capabilities, arena="")

    class Consumer(NoRule):
        @property
        def capabilities(self):  # type: ignore[no-untyped-def]
            return replace(super().capabilities, arena=PLANNER_ARENA)

    with pytest.raises(SessionError, match="declares no arena rule"):
        arena_policy(NoRule())
    assert arena_policy(Consumer()) is None
    from uaii.backends import BackendBase

    with pytest.raises(BackendError, match="declares no arena rule"):
        BackendBase().plan_arena(llama(1), 8)  # the default: no rule, and never the planner's in silence


def test_a_smollm2_session_allocates_and_budgets_the_plans_arena(smollm2_path: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UAII_CACHE_DIR", str(tmp_path))
    with Session(smollm2_path, max_context=64, max_batch=32) as s:
        assert s.plan is not None and s.plan.arena.rule == ARENA_RULE and s.plan.arena.max_tokens == 32
        assert s._exe.memory().arena_bytes == s.plan.arena.size
        assert _exe_offsets(s._exe) == _offsets(s.plan.arena)
        tokens = list(s.generate([1, 5, 9], max_new_tokens=3, ignore_eos=True).tokens)
    budget = 3 * (1 << 20) + 2 * s.plan.arena.size + 40 * (1 << 20)
    with Session(smollm2_path, max_context=64, max_batch=32, budget_bytes=budget) as b:
        assert b.plan.arena == s.plan.arena  # the budget counts the arena the executable allocates
        assert b.plan.planned_bytes >= b._exe.memory().arena_bytes == b.plan.arena.size
        assert list(b.generate([1, 5, 9], max_new_tokens=3, ignore_eos=True).tokens) == tokens


def test_the_webgpu_executable_allocates_the_plans_arena() -> None:
    pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")
    from uaii.backends.webgpu import WebGpuBackend

    gpu = WebGpuBackend(allow_software=True)
    status = gpu.probe()
    if not status.available:
        pytest.skip(f"no WebGPU adapter: {status.reason}")
    graph = llama(1)
    p, _ = plan(graph, OPTS, cache=False, arena=arena_policy(gpu))
    exe = gpu.compile(graph, p, _weights(graph))
    assert exe.memory().arena_bytes == p.arena.size
    alone = gpu.compile(plan_graph(graph, p), None, _weights(graph), max_tokens=8)
    assert alone.memory().arena_bytes == p.arena.size  # one rule: what it lays out alone is what the plan says
    feeds = llama_feeds(graph, seq=3, past=0)
    run = {n: feeds[n] for n in exe.input_names}
    np.testing.assert_allclose(exe.run(run, exe.new_state(16))["logits"],
                               alone.run(run, alone.new_state(16))["logits"], rtol=1e-5, atol=1e-5)
    with pytest.raises(BackendError, match="not this backend's 'webgpu/1'"):
        gpu.compile(graph, plan(graph, OPTS, cache=False, arena=arena_policy(CPU))[0], _weights(graph))
    exe.close()
    alone.close()


def test_the_arena_rule_survives_the_json_round_trip() -> None:
    graph = llama(1)
    p, _ = plan(graph, OPTS, cache=False, arena=arena_policy(CPU))
    assert ExecutionPlan.from_json(p.to_json()) == p and p.arena.rule == ARENA_RULE
    d = json.loads(p.to_json())
    del d["arena"]["rule"]  # format 2 always writes it: an entry without one is damaged, never the generic rule
    with pytest.raises(FormatError, match="KeyError: 'rule'"):
        ExecutionPlan.from_json(json.dumps(d))


def test_a_policy_whose_layout_is_not_of_its_rule_is_refused() -> None:
    from uaii.planner import ArenaPolicy, PlannerError

    liar = ArenaPolicy("cpu/1", lambda fused, order, o: CPU.plan_arena(fused, o.max_tokens * 2))
    with pytest.raises(PlannerError, match="for 16 tokens, expected its own rule for 8 tokens"):
        plan(llama(1), OPTS, cache=False, arena=liar)

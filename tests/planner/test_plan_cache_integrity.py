"""The plan cache trusts no entry: a parsed entry that is not the plan of the graph is rebuilt (never a KeyError in a
backend), the folder is bounded (least recently used entries go), and budgets that cannot change the plan share one
entry (the ``auto`` preset's budget moves with free memory)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_helpers import Dims, llama

from uaii.ir import Graph
from uaii.ir.plan import ExecutionPlan
from uaii.planner import PlanCache, PlannerError, PlannerOptions, build_plan, fuse, plan
from uaii.planner import cache as cache_module
from uaii.planner.planner import budget_ceiling

Q = Dims(d=256, heads=4, kv=2, head_dim=64, ff=512, vocab=1000)
BASE = {"max_tokens": 16, "dim_bounds": {"past": 64}}
UNLIMITED = PlannerOptions(**BASE)
BUDGET = PlannerOptions(**BASE, budget_bytes=2 << 20, pin_layers=1, kv_cache_bytes=1 << 20)
Damage = Callable[[dict[str, Any]], None]


def _live_pair(d: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    slots = d["arena"]["slots"]
    return next((a, b) for a in slots for b in slots if a is not b and a["offset"] != b["offset"]
                and a["first_step"] <= b["last_step"] and b["first_step"] <= a["last_step"])


def _overlap(d: dict[str, Any]) -> None:
    a, b = _live_pair(d)
    b["offset"] = a["offset"]


def _all_pinned(d: dict[str, Any]) -> None:
    for w in d["storage"]["weights"]:
        w["mode"] = "pinned"
    d["storage"].update(staging_buffers=[], prefetch_order=[], streamed_bytes_per_token=0, expert_cache_bytes=0)


def _set(path: tuple[Any, ...], value: Any) -> Damage:
    def damage(d: dict[str, Any]) -> None:
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value(d[path[-1]]) if callable(value) else value
    return damage


# (damage, options, what the warning says)
DAMAGES: dict[str, tuple[Damage, PlannerOptions, str]] = {
    "step_deleted": (lambda d: d["steps"].pop(5), UNLIMITED, "which no step writes"),
    "last_step_deleted": (lambda d: d["steps"].pop(), UNLIMITED, "no step writes graph output 'logits'"),
    "unknown_value": (lambda d: d["steps"][3]["inputs"].__setitem__(0, "nope"), UNLIMITED, "does not declare"),
    "read_before_write": (lambda d: d["steps"].insert(0, d["steps"].pop(6)), UNLIMITED, "before step"),
    "written_twice": (lambda d: d["steps"].insert(4, d["steps"][3]), UNLIMITED, "already holds"),
    "steps_swapped": (lambda d: d["steps"].insert(3, d["steps"].pop(4)), UNLIMITED, "the planner makes"),
    "attribute": (_set(("steps", 3, "attributes", 0, 1), 999), UNLIMITED, "has attributes"),
    "kernel": (_set(("steps", 2, "kernel"), "GroupedMatMul/1/f16"), UNLIMITED, "has kernel"),
    "op": (_set(("steps", 2, "op"), "MatMul"), UNLIMITED, "has op 'MatMul', the planner makes 'GroupedMatMul'"),
    "version": (_set(("steps", 1, "version"), 2), UNLIMITED, "has version 2, the planner makes 1"),
    "slots_overlap": (_overlap, UNLIMITED, "share bytes"),
    "slot_outside_arena": (_set(("arena", "size"), 64), UNLIMITED, "inside the 64-byte arena"),
    "slot_missing": (lambda d: d["arena"]["slots"].pop(0), UNLIMITED, "no arena slot holds"),
    "slot_shrunk": (_set(("arena", "slots", 0, "nbytes"), 4), UNLIMITED, "has nbytes 4"),
    "weight_dropped": (lambda d: d["storage"]["weights"].pop(2), UNLIMITED, "does not place weight"),
    "weight_twice": (lambda d: d["storage"]["weights"].append(d["storage"]["weights"][0]), UNLIMITED, "twice"),
    "weight_size": (_set(("storage", "weights", 0, "nbytes"), lambda n: n + 1), UNLIMITED, "bytes of group"),
    "graph_name": (_set(("graph_name",), "other"), UNLIMITED, "plan of graph 'other'"),
    "options": (lambda d: d["metadata"].__setitem__(-2, ["planner.options", "{}"]), UNLIMITED,
                "metadata 'planner.options'"),
    "mode_unlimited": (_set(("storage", "weights", 0, "mode"), "streamed"), UNLIMITED, "does not allow"),
    "mode_budget": (_set(("storage", "weights", 0, "mode"), "mmap"), BUDGET, "does not allow"),
    "staging_shrunk": (_set(("storage", "staging_buffers"), [4096, 4096]), BUDGET, "staging_buffers"),
    "prefetch_reversed": (_set(("storage", "prefetch_order"), lambda o: o[::-1]), BUDGET, "prefetch_order"),
    "budget_field": (_set(("storage", "budget_bytes"), 1 << 40), BUDGET, "storage plan is for a budget"),
    "over_budget": (_all_pinned, BUDGET, "over the budget"),
}


@pytest.fixture(scope="module")
def graph() -> Graph:
    return llama(2, dims=Q, wdtype="q4_k")


@pytest.mark.parametrize("name", list(DAMAGES))
def test_a_damaged_entry_is_rebuilt_with_a_warning_naming_the_file_and_the_problem(
        name: str, graph: Graph, _cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    damage, opts, said = DAMAGES[name]
    good, _ = plan(graph, opts)
    entry = _cache_dir / "plans" / f"{good.key}.json"
    text = entry.read_text()
    d = json.loads(text)
    damage(d)
    entry.write_text(json.dumps(d))
    assert ExecutionPlan.from_json(entry.read_text()) != good  # it parses: only the check can tell
    with caplog.at_level(logging.WARNING, logger="uaii.planner"):
        again, hit = plan(graph, opts)
    assert not hit and again == good
    assert entry.read_text() == text  # overwritten with the rebuilt plan
    [record] = [r for r in caplog.records if "plan cache entry" in r.getMessage()]
    assert str(entry) in record.getMessage() and said in record.getMessage()
    assert "uaii cache clear" in record.getMessage()
    assert plan(graph, opts) == (good, True)


def test_a_fresh_plan_passes_the_check_whatever_the_options(graph: Graph, caplog: pytest.LogCaptureFixture) -> None:
    for opts in (UNLIMITED, BUDGET, replace(BUDGET, fill_pins=True), replace(BUDGET, stream_unit="layer"),
                 replace(UNLIMITED, enable_fusion=False), replace(UNLIMITED, enable_memory_reuse=False)):
        with caplog.at_level(logging.WARNING, logger="uaii.planner"):
            first, _ = plan(graph, opts)
            again, hit = plan(graph, opts)
        assert hit and again == first
    assert not [r for r in caplog.records if "plan cache entry" in r.getMessage()]


# --- eviction ------------------------------------------------------------------------------------------------
def _plans(n: int) -> list[ExecutionPlan]:
    p = build_plan(llama(1), UNLIMITED)
    return [replace(p, key=f"{i + 1:064x}") for i in range(n)]


def _aged(cache: PlanCache, p: ExecutionPlan, age_s: float) -> None:
    """Store ``p`` and date its use ``age_s`` seconds back (mtime resolution differs between file systems)."""
    path = cache.store(p)
    t = time.time() - age_s
    os.utime(path, (t, t))


def _keys(cache: PlanCache) -> set[str]:
    return {p.stem for p in cache.entries()}


def test_the_least_recently_used_entries_go_first(tmp_path: Path) -> None:
    cache = PlanCache(tmp_path, max_entries=3, max_bytes=0)
    plans = _plans(5)
    for i, p in enumerate(plans[:4]):
        _aged(cache, p, 1000 - i)
    assert _keys(cache) == {p.key for p in plans[1:4]}
    assert cache.load(plans[1].key) == plans[1]  # a hit is a use: now the most recent
    _aged(cache, plans[4], 0)
    assert _keys(cache) == {plans[1].key, plans[3].key, plans[4].key}


def test_the_byte_limit_keeps_the_newest_that_fit_and_always_the_entry_just_written(tmp_path: Path) -> None:
    plans = _plans(4)
    size = len(plans[0].to_json().encode())
    cache = PlanCache(tmp_path, max_entries=0, max_bytes=2 * size + size // 2)
    for i, p in enumerate(plans[:3]):
        _aged(cache, p, 100 - i)
    assert _keys(cache) == {plans[1].key, plans[2].key}
    PlanCache(tmp_path, max_entries=0, max_bytes=1).store(plans[3])
    assert _keys(cache) == {plans[3].key}


def test_limits_come_from_the_environment(_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UAII_PLAN_CACHE_MAX_ENTRIES", "2")
    for n in (8, 16, 32):
        plan(llama(1), PlannerOptions(max_tokens=n))
    assert len(PlanCache().entries()) == 2
    monkeypatch.setenv("UAII_PLAN_CACHE_MAX_ENTRIES", "0")  # no limit
    for n in (8, 16, 32):
        plan(llama(1), PlannerOptions(max_tokens=n))
    assert len(PlanCache().entries()) == 3
    monkeypatch.setenv("UAII_PLAN_CACHE_MAX_BYTES", "lots")
    with pytest.raises(PlannerError, match=r"UAII_PLAN_CACHE_MAX_BYTES must be an integer >= 0.*'lots'"):
        plan(llama(1), PlannerOptions(max_tokens=4))


def test_eviction_removes_old_temporaries_only(tmp_path: Path) -> None:
    young, old = tmp_path / ".tmp-young.json", tmp_path / ".tmp-old.json"
    for f in (young, old):
        f.write_text("half")
    t = time.time() - cache_module.TMP_MAX_AGE_S - 60
    os.utime(old, (t, t))
    PlanCache(tmp_path).store(_plans(1)[0])
    assert young.exists() and not old.exists()


def test_eviction_skips_entries_that_another_process_removed_or_used(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    plans = _plans(4)
    for i, p in enumerate(plans[:3]):
        _aged(PlanCache(tmp_path, max_entries=0), p, 100 - i)
    cache = PlanCache(tmp_path, max_entries=1, max_bytes=0)
    removed, used = cache.path_for(plans[0].key), cache.path_for(plans[1].key)
    real = cache_module._unlink_if_unchanged

    def meanwhile(path: Path, mtime_ns: int) -> bool:
        """Between listing and removal another process removes one entry and uses another."""
        if path == removed:
            path.unlink()
        if path == used:
            os.utime(path)
        return real(path, mtime_ns)

    monkeypatch.setattr(cache_module, "_unlink_if_unchanged", meanwhile)
    assert cache.store(plans[3]) == cache.path_for(plans[3].key)
    assert _keys(cache) == {plans[1].key, plans[3].key}  # the used entry stays (until the next store)


_STORE_MANY = """
import sys
from uaii.ir.plan import ArenaLayout, ExecutionPlan
from uaii.planner import PlanCache
folder, start = sys.argv[1], int(sys.argv[2])
cache = PlanCache(folder, max_entries=4, max_bytes=0)
for i in range(start, start + 40):
    cache.store(ExecutionPlan(key=f"{i:064x}", graph_name="g", steps=(), arena=ArenaLayout(0, 64, 1)))
"""


def test_two_processes_storing_at_once(tmp_path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", _STORE_MANY, str(tmp_path), str(start)],
                              stderr=subprocess.PIPE, text=True) for start in (0, 20)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    cache = PlanCache(tmp_path)
    assert 1 <= len(cache.entries()) <= 5 and not list(tmp_path.glob(".tmp-*"))
    assert all(cache.load(p.stem) is not None for p in cache.entries())


# --- budgets that cannot change the plan share one entry ------------------------------------------------------
def test_budgets_under_the_ceiling_keep_their_own_entries(graph: Graph) -> None:
    ceiling = budget_ceiling(fuse(graph, BUDGET), BUDGET)
    keys = [plan(graph, replace(BUDGET, budget_bytes=b))[0].key for b in (ceiling - 1, ceiling, ceiling + 1, 1 << 40)]
    assert len(set(keys)) == 2 and keys[0] != keys[1] == keys[2] == keys[3]


@settings(max_examples=25, deadline=None)
@given(layers=st.integers(1, 4), tied=st.booleans(), wdtype=st.sampled_from(["f32", "q4_k", "q8_0"]),
       fill=st.booleans(), unit=st.sampled_from(["tensor", "layer"]), buffers=st.integers(1, 3),
       pin_layers=st.integers(0, 3), kv=st.integers(0, 1 << 20), above=st.integers(0, 1 << 40))
def test_above_the_ceiling_the_plan_does_not_depend_on_the_budget(layers: int, tied: bool, wdtype: str, fill: bool,
                                                                  unit: str, buffers: int, pin_layers: int, kv: int,
                                                                  above: int) -> None:
    """What keying by the ceiling rests on: planned at the ceiling or anywhere above, the plan is the same."""
    graph = llama(layers, dims=Q, wdtype=wdtype, tied=tied)
    opts = replace(BUDGET, fill_pins=fill, stream_unit=unit, staging_buffers=buffers, pin_layers=pin_layers,
                   kv_cache_bytes=kv)
    ceiling = budget_ceiling(fuse(graph, opts), opts)
    big = replace(opts, budget_bytes=ceiling + above)
    at_ceiling, _ = plan(graph, big, cache=False)
    assert at_ceiling == build_plan(graph, big, key=at_ceiling.key)


def test_a_moe_plan_above_the_ceiling_does_not_depend_on_the_budget() -> None:
    from test_storage import moe_graph

    graph = moe_graph(layers=2, dense=1)
    for fill in (False, True):
        opts = PlannerOptions(max_tokens=4, budget_bytes=1, fill_pins=fill, expert_cache_bytes=4096)
        ceiling = budget_ceiling(fuse(graph, opts), opts)
        for budget in (ceiling, ceiling + 12345, 1 << 40):
            big = replace(opts, budget_bytes=budget)
            served, _ = plan(graph, big, cache=False)
            assert served == build_plan(graph, big, key=served.key)

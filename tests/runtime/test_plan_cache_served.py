"""What the plan cache serves runs: an edited entry is rejected or runs like a fresh plan on the CPU backend, a
streaming Session rebuilds a damaged entry, and ``auto`` budgets from nearby free memory share one entry.

These tests were in tests/planner/test_plan_cache_integrity.py; they need uaii-backends and uaii-runtime, which
uaii-planner does not depend on, so they live with the runtime (which depends on all three) and run in its
isolated environment (`make isolation-runtime`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_helpers import Dims, llama, llama_feeds, random_weights

from uaii.backends import ArrayWeights
from uaii.backends.cpu import CpuBackend
from uaii.ir import Graph
from uaii.ir.plan import ExecutionPlan
from uaii.planner import PlanCache, PlannerOptions, build_plan, plan
from uaii.runtime import Session
from uaii.runtime.planning import arena_policy
from uaii.runtime.presets import get_preset

Q = Dims(d=256, heads=4, kv=2, head_dim=64, ff=512, vocab=1000)
BASE = {"max_tokens": 16, "dim_bounds": {"past": 64}}
UNLIMITED = PlannerOptions(**BASE)
BUDGET = PlannerOptions(**BASE, budget_bytes=2 << 20, pin_layers=1, kv_cache_bytes=1 << 20)
CPU_ARENA = arena_policy(CpuBackend())  # the CPU runs only plans whose arena its own rule laid out


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own plan cache folder: nothing is written to the real ~/.cache."""
    root = tmp_path / "uaii-cache"
    monkeypatch.setenv("UAII_CACHE_DIR", str(root))
    return root


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def damage(d: dict[str, Any]) -> None:
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value(d[path[-1]]) if callable(value) else value
    return damage


def _run(graph: Graph, p: ExecutionPlan) -> dict[str, np.ndarray]:
    arrays = random_weights(graph)
    weights = ArrayWeights({str(t.weight) if t.weight else t.name: arrays[t.name] for t in graph.weights})
    exe = CpuBackend().compile(graph, p, weights, max_tokens=8)
    feeds = llama_feeds(graph, past=0)
    out = exe.run({n: feeds[n] for n in exe.input_names}, exe.new_state(16))
    return {k: np.array(v) for k, v in out.items()}


_MUTATIONS = st.tuples(st.sampled_from(["delete", "duplicate", "move", "number", "string"]), st.integers(0, 10**6),
                       st.integers(0, 10**6), st.integers(-(1 << 20), 1 << 20))


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    out = [(path, node)]
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        out += _leaves(v, (*path, k))
    return out


def _mutate(d: dict[str, Any], how: str, a: int, b: int, delta: int) -> None:
    """One edit somewhere in the plan: a list loses, repeats or moves an element, a number or a string changes."""
    want = {"delete": list, "duplicate": list, "move": list, "number": int, "string": str}[how]
    spots = [(p, v) for p, v in _leaves(d) if type(v) is want and p and (want is not list or v)]
    path, value = spots[a % len(spots)]
    parent = d
    for k in path[:-1]:
        parent = parent[k]
    if how == "delete":
        value.pop(b % len(value))
    elif how == "duplicate":
        value.insert(b % (len(value) + 1), value[b % len(value)])
    elif how == "move":
        value.insert(b % len(value), value.pop(delta % len(value)))
    else:
        parent[path[-1]] = max(value + delta, 0) if how == "number" else value[::-1] + "x"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edit=_MUTATIONS)
def test_an_edited_entry_that_is_served_runs_like_a_fresh_plan(edit: tuple[str, int, int, int], tmp_path: Path
                                                                ) -> None:
    """Any single edit of an entry: either the check rejects it (the rebuilt plan is served) or what is served runs
    on the CPU backend with the outputs of a fresh plan — never a KeyError or another error from inside."""
    graph = llama(1)
    cache = PlanCache(tmp_path)
    cache.clear()
    good, _ = plan(graph, UNLIMITED, cache=cache, arena=CPU_ARENA)
    d = json.loads(good.to_json())
    _mutate(d, *edit)
    cache.path_for(good.key).write_text(json.dumps(d))
    served, hit = plan(graph, UNLIMITED, cache=cache, arena=CPU_ARENA)
    if hit:
        for name, want in _run(graph, good).items():
            np.testing.assert_allclose(_run(graph, served)[name], want, rtol=1e-5, atol=1e-6)
    else:
        assert served == good


def test_a_streaming_session_rebuilds_a_damaged_entry(smollm2_path: Path, _cache_dir: Path) -> None:
    """The issue: a cached plan with a step deleted gave ``[internal] KeyError`` on every run."""
    kw: dict[str, Any] = {"max_context": 64, "max_batch": 16, "budget_bytes": 48 << 20}
    with Session(smollm2_path, **kw) as first:
        assert first.streaming
        want = first.generate("The capital of France is", max_new_tokens=6).tokens
    [entry] = (_cache_dir / "plans").glob("*.json")
    good = entry.read_text()
    for damage in (lambda d: d["steps"].pop(40), _set(("storage", "staging_buffers"), [4096, 4096]),
                   lambda d: d["storage"]["weights"].pop(3)):
        d = json.loads(good)
        damage(d)
        entry.write_text(json.dumps(d))
        with Session(smollm2_path, **kw) as s:
            assert not s.plan_cache_hit
            assert s.generate("The capital of France is", max_new_tokens=6).tokens == want
        assert entry.read_text() == good


def test_auto_budgets_from_nearby_free_memory_share_one_entry(tmp_path: Path, _cache_dir: Path) -> None:
    """MemAvailable 20 MB apart, across a step of the ``auto`` budget's rounding (8 GiB: 3.75 or 4 GiB)."""
    graph = llama(2, dims=Q, wdtype="q4_k")
    served = []
    for kib in (8 * 2**20 - 10_000, 8 * 2**20 + 10_000):
        meminfo = tmp_path / f"meminfo{kib}"
        meminfo.write_text(f"MemTotal: {2 * kib} kB\nMemAvailable: {kib} kB\n")
        budget = get_preset("auto", meminfo=str(meminfo)).budget_bytes
        served.append((budget, *plan(graph, replace(BUDGET, budget_bytes=budget, fill_pins=True))))
    (b1, p1, hit1), (b2, p2, hit2) = served
    assert b1 != b2 and (hit1, hit2) == (False, True) and len(PlanCache().entries()) == 1
    assert (p1.storage.budget_bytes, p2.storage.budget_bytes) == (b1, b2)  # each carries its own budget
    assert p2 == build_plan(graph, replace(BUDGET, budget_bytes=b2, fill_pins=True), key=p2.key)

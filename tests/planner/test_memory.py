"""The memory plan: liveness, one arena with reused offsets, symbolic dims bound by max_tokens, state excluded.

The property test builds random DAGs and checks, independently of the planner's own helpers, that no two slots
that are live at the same step share a byte."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_helpers import Builder, llama

from uaii.ir import Graph, make_graph
from uaii.ir.plan import ArenaLayout, BufferSlot
from uaii.planner import (
    PlannerError,
    PlannerOptions,
    assign_offsets,
    dim_bound,
    execution_order,
    fuse,
    live_intervals,
    memory_report,
    overlapping_slots,
    plan_memory,
    state_values,
)


def arena_of(graph: Graph, **opts: object) -> ArenaLayout:
    return plan_memory(graph, execution_order(graph), PlannerOptions(**opts))  # type: ignore[arg-type]


def shared_pairs(slots: Sequence[BufferSlot]) -> set[frozenset[str]]:
    """The slots live at one step that share bytes, pair by pair (independent of the planner's sweep)."""
    out = set()
    for i, a in enumerate(slots):
        for b in slots[i + 1:]:
            live_together = a.first_step <= b.last_step and b.first_step <= a.last_step
            share_bytes = a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes
            if live_together and share_bytes and a.nbytes and b.nbytes:
                out.add(frozenset((a.value, b.value)))
    return out


def assert_sound(arena: ArenaLayout) -> None:
    """Aligned, inside the arena, and no two slots live at one step share bytes (checked pair by pair)."""
    for s in arena.slots:
        assert s.offset % arena.alignment == 0 and s.offset + s.nbytes <= arena.size
    assert shared_pairs(arena.slots) == set()


# --- symbolic dims --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("dim", "want"), [
    (7, 7), ("seq", 16), ("past", 100), ("past_plus_seq", 116), ("seq_times_64", 1024), ("_64_minus_seq", 64),
    ("seq_div_4", 4), ("seq_max_past", 100), ("past_plus_seq_times_2", 132), ("seq_minus_past", 16),
    ("seq_minus_4", 12), ("_100_div_seq", 100),  # a symbolic subtrahend or divisor may be as small as 0 or 1
])
def test_dim_bounds(dim: int | str, want: int) -> None:
    assert dim_bound(dim, {"seq": 16, "past": 100}) == want


def test_an_unbound_dim_names_the_value_and_the_option() -> None:
    with pytest.raises(PlannerError, match=r"value 'h' has symbolic dim 'batch' with no bound; .*dim_bounds"):
        dim_bound("batch", {"seq": 4}, "h")
    b = Builder()
    x = b.input("x", "f32", ["batch", 8])
    b.op("Relu", [x], [("h", "f32", ["batch", 8])])
    b.outputs.append(b.op("Relu", ["h"], [("y", "f32", ["batch", 8])]))
    g = b.build()
    with pytest.raises(PlannerError, match="'batch'"):
        arena_of(g)
    assert arena_of(g, dim_bounds={"batch": 3}).slot("h").nbytes == 3 * 8 * 4


# --- the llama graph ------------------------------------------------------------------------------------------
def test_llama_arena_reuses_memory_and_excludes_state() -> None:
    g = fuse(llama(3))
    arena = arena_of(g, max_tokens=16)
    assert_sound(arena)
    assert overlapping_slots(arena) == []
    report = memory_report(arena)
    assert report.arena_bytes == arena.size < report.intermediate_bytes / 3  # reuse happens, and pays
    assert report.saved_bytes > 0 and report.reuse_ratio > 3
    names = {s.value for s in arena.slots}
    state = state_values(g)
    assert {"present_k.0", "present_v.2", "logits", "tokens", "past_k.1"} <= state
    assert not names & state and not names & {t.name for t in g.weights}
    assert arena.slot("blk.0.q").nbytes == 16 * 4 * 8 * 4  # [max_tokens, heads * head_dim] f32
    assert arena.alignment == 64 and arena.max_tokens == 16


def test_state_outputs_are_excluded_even_when_not_graph_outputs() -> None:
    g = llama(1)
    g = make_graph(g.name, g.nodes, g.tensors, g.inputs, ["logits"])  # present_k/v no longer graph outputs
    names = {s.value for s in arena_of(g, dim_bounds={"past": 8}).slots}
    assert "present_k.0" not in names and "present_v.0" not in names


def test_persistent_values_get_no_slot() -> None:
    g = fuse(llama(1))
    assert "blk.0.attn_residual" in {s.value for s in arena_of(g).slots}
    assert "blk.0.attn_residual" not in {s.value for s in arena_of(g, persistent=("blk.0.attn_residual",)).slots}


def test_arena_scales_with_max_tokens() -> None:
    g = fuse(llama(2))
    small, big = arena_of(g, max_tokens=16), arena_of(g, max_tokens=32)
    assert big.size == 2 * small.size


def test_without_reuse_every_value_has_its_own_bytes() -> None:
    g = fuse(llama(2))
    arena = arena_of(g, enable_memory_reuse=False, alignment=128)
    assert arena.size == memory_report(arena).intermediate_bytes
    ranges = sorted((s.offset, s.offset + s.nbytes) for s in arena.slots)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ranges))
    assert all(s.offset % 128 == 0 for s in arena.slots)


def test_best_fit_reuses_the_smallest_sufficient_gap() -> None:
    from uaii.ir.plan import BufferSlot

    slots = [BufferSlot("big", 0, 1000, "f32", 0, 1), BufferSlot("mid", 0, 600, "f32", 1, 2),
             BufferSlot("late", 0, 500, "f32", 3, 4), BufferSlot("small", 0, 100, "f32", 2, 3)]
    size, off = assign_offsets(slots, alignment=64)
    assert off["big"] == 0 and off["mid"] == 1024  # live together
    assert off["late"] == 0  # big is dead by step 3
    assert size == 1024 + 640


def test_execution_order_repairs_a_shuffled_graph() -> None:
    g = llama(1)
    nodes = list(g.nodes)
    random.Random(0).shuffle(nodes)
    order = execution_order(make_graph(g.name, nodes, g.tensors, g.inputs, g.outputs))
    seen = set(g.inputs) | {t.name for t in g.weights}
    for n in order:
        assert all(v in seen for v in n.inputs if v), n.name
        seen.update(n.outputs)
    assert execution_order(g) == g.nodes  # already ordered: kept as is


# --- random DAGs ----------------------------------------------------------------------------------------------
WIDTHS = (4, 8, 12, 32, 64)


@st.composite
def dags(draw: st.DrawFn) -> Graph:
    b = Builder("dag")
    values: list[tuple[str, int]] = []
    for i in range(draw(st.integers(1, 3))):
        w = draw(st.sampled_from(WIDTHS))
        values.append((b.input(f"in{i}", "f32", ["seq", w]), w))
    for i in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["relu", "add", "matmul", "split"]))
        x, w = values[draw(st.integers(0, len(values) - 1))]
        name = f"v{i}"
        if kind == "add":
            same = [v for v in values if v[1] == w]
            y = same[draw(st.integers(0, len(same) - 1))][0]
            values.append((b.op("Add", [x, y], [(name, "f32", ["seq", w])]), w))
        elif kind == "matmul":
            n = draw(st.sampled_from(WIDTHS))
            wt = b.weight(f"w{i}", "f32", [n, w])
            values.append((b.op("MatMul", [x, wt], [(name, "f32", ["seq", n])], transpose_b=True), n))
        elif kind == "split" and w % 2 == 0:
            b.op("Split", [x], [(name, "f32", ["seq", w // 2]), (name + "b", "f32", ["seq", w // 2])], axis=-1,
                 num_outputs=2)
            values += [(name, w // 2), (name + "b", w // 2)]
        else:
            values.append((b.op("Relu", [x], [(name, "f32", ["seq", w])]), w))
    produced = [v for v, _ in values if v not in b.inputs]
    picks = draw(st.lists(st.sampled_from(produced), min_size=1, max_size=3, unique=True)) if produced else []
    b.outputs += picks
    return b.build()


@settings(max_examples=120, deadline=None)
@given(graph=dags(), max_tokens=st.integers(1, 9), alignment=st.sampled_from([16, 64, 256]),
       reuse=st.booleans())
def test_random_dags_never_overlap_live_slots(graph: Graph, max_tokens: int, alignment: int, reuse: bool) -> None:
    order = execution_order(graph)
    arena = plan_memory(graph, order, PlannerOptions(max_tokens=max_tokens, alignment=alignment,
                                                     enable_memory_reuse=reuse))
    assert_sound(arena)
    # every produced non-output value has exactly one slot, with its true lifetime
    step_of = {v: i for i, n in enumerate(order) for v in n.outputs}
    last_read = {v: max([i for i, n in enumerate(order) if v in n.inputs], default=step_of[v]) for v in step_of}
    want = {v for v in step_of if v not in graph.outputs}
    assert {s.value for s in arena.slots} == want
    for s in arena.slots:
        assert (s.first_step, s.last_step) == (step_of[s.value], last_read[s.value])
        assert s.nbytes == max_tokens * graph.tensor(s.value).shape[1] * 4
    assert live_intervals(order).keys() == step_of.keys()
    assert arena.size <= memory_report(arena).intermediate_bytes


# --- overlapping_slots finds exactly the pairs the pairwise relation finds --------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 64), st.integers(0, 6), st.integers(-2, 3)),
                max_size=14))
def test_overlapping_slots_is_the_pairwise_relation(raw: list[tuple[int, int, int, int]]) -> None:
    """Offsets on a coarse grid so that slots meet often; empty slots; spans below 0 (a damaged cache entry's
    slot that ends before it starts is live at no step)."""
    slots = tuple(BufferSlot(f"v{i}", off * 16, n, "f32", first, first + span)
                  for i, (off, n, first, span) in enumerate(raw))
    got = [frozenset((a.value, b.value)) for a, b in overlapping_slots(ArenaLayout(1 << 20, 16, 1, slots))]
    assert len(got) == len(set(got))  # each pair once
    assert set(got) == shared_pairs(slots)

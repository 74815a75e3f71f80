"""The storage plan: grouping by layer, the pinning rule under a budget, staging sizes, prefetch order, summary."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import replace
from itertools import pairwise

import pytest
from planner_helpers import Builder, Dims, llama

from uaii.ir import Graph, Tensor, check, make_graph, tensor_nbytes
from uaii.ir.plan import ExecutionPlan
from uaii.planner import (
    WEIGHT_GROUP_RULES,
    BudgetError,
    PlannerOptions,
    build_plan,
    fuse,
    group_of,
    plan_problems,
    summarize,
    weight_group,
)

Q = Dims(d=256, heads=4, kv=2, head_dim=64, ff=512, vocab=1000)
PAGE = 4096
MiB = 1 << 20


def qgraph(n_layers: int = 3, tied: bool = False) -> Graph:
    return llama(n_layers, dims=Q, wdtype="q4_k", tied=tied)


def make(graph: Graph, **opts: object) -> ExecutionPlan:
    return build_plan(graph, PlannerOptions(**opts))  # type: ignore[arg-type]


def modes(p: ExecutionPlan) -> dict[str, str]:
    return {g["group"]: g["mode"] for g in summarize(p)["groups"]}


def pinned_groups(p: ExecutionPlan) -> set[str]:
    return {g for g, m in modes(p).items() if m == "pinned"}


def page(n: int) -> int:
    return -(-n // PAGE) * PAGE


def window(n: int) -> int:
    """Staging for a linear layer's [N, K] weight staged whole: its read window at any offset."""
    return page(n + PAGE - 1)


def need(graph: Graph, pinned: Collection[str], arena: int, kv: int = 0, buffers: int = 2,
         small: bool = True) -> int:
    """The budget a pin set needs, computed independently: pins + buffers x largest streamed step + arena + KV.
    With ``small``, the 1-D weights (norm scales: at most 64 KiB each) are pinned whatever their group."""
    fused = fuse(graph)
    sizes = {t.name: tensor_nbytes(t.dtype, t.shape) for t in fused.weights}

    def held_by(name: str) -> bool:
        t = fused.tensor(name)
        return group_of(t) in pinned or (small and len(t.shape) == 1 and sizes[name] <= 64 * 1024)

    held = sum(n for name, n in sizes.items() if held_by(name))
    # a streamed lookup reads rows, outside staging; a linear layer stored [N, K] (read by rows of its output) is
    # staged whole with its read window at any offset: a page more than its bytes rounded
    steps = [sum(window(sizes[v]) if n.op == "MatMul" and n.get("transpose_b") else page(sizes[v])
                 for v in n.inputs if v in sizes and not held_by(v))
             for n in fused.nodes if n.op != "Embedding"]
    return held + buffers * max(steps) + arena + kv


# --- groups ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "group"), [
    ("token_embd.weight", "embed"), ("position_embd.weight", "embed"), ("output.weight", "lm_head"),
    ("output_norm.weight", "norm"), ("blk.0.attn_q.weight", "blk.0"), ("blk.17.ffn_down_exps.weight", "blk.17"),
    ("rope_freqs.weight", "other"), ("model.layers.3.mlp.up_proj.weight", "blk.3"),
    ("model.embed_tokens.weight", "embed"), ("lm_head.weight", "lm_head"), ("model.norm.weight", "norm"),
    ("transformer.h.5.attn.c_attn.weight", "blk.5"),
])
def test_weight_groups(name: str, group: str) -> None:
    assert weight_group(name) == group


def test_group_rules_extend_and_fall_back_to_the_reference_name() -> None:
    rules = [(re.compile(r"^vision\.(\d+)\."), r"vision.\1"), *WEIGHT_GROUP_RULES]
    assert weight_group("vision.2.proj.weight", rules) == "vision.2"
    assert weight_group("vision.2.proj.weight") == "other"
    from uaii.ir import WeightRef

    t = Tensor("w7", "f32", (4,), weight=WeightRef("m.safetensors", "model.layers.7.input_layernorm.weight"))
    assert group_of(t) == "blk.7"


# --- the rule -------------------------------------------------------------------------------------------------
def test_no_budget_maps_every_weight_in_first_use_order() -> None:
    p = make(qgraph())
    assert {w.mode for w in p.storage.weights} == {"mmap"} and p.storage.staging_buffers == ()
    order = [r.split("#", 1)[1] for r in p.storage.prefetch_order]
    assert order[:5] == ["token_embd.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.weight",
                         "blk.0.attn_k.weight", "blk.0.attn_v.weight"]
    assert order[-2:] == ["output_norm.weight", "output.weight"]
    assert len(order) == len(qgraph().weights)


def test_roomy_budget_pins_globals_embed_lm_head_and_the_first_layers() -> None:
    g = qgraph()
    p = make(g, budget_bytes=64 * MiB, pin_layers=1, kv_cache_bytes=12345)
    assert pinned_groups(p) == {"embed", "lm_head", "norm", "blk.0"}
    # a streamed layer keeps its norm scales pinned (small vectors)
    assert modes(p)["blk.1"] == modes(p)["blk.2"] == "mixed"
    assert {w.ref.split("#")[1] for w in p.storage.weights if w.group == "blk.1" and w.mode == "pinned"} == {
        "blk.1.attn_norm.weight", "blk.1.ffn_norm.weight"}
    # two buffers, each the largest streamed step: the grouped gate/up MatMul stages both weights at once
    gate_up = 2 * tensor_nbytes(g.tensor("blk.1.ffn_gate.weight").dtype, (512, 256))
    assert p.storage.staging_buffers == (gate_up, gate_up)
    streamed = [w.ref.split("#")[1] for w in p.storage.weights if w.mode == "streamed"]
    assert list(p.storage.prefetch_order) == [f"model.gguf#{n}" for n in streamed]
    assert streamed[0] == "blk.1.attn_q.weight" and streamed[-1] == "blk.2.ffn_down.weight"
    assert p.storage.streamed_bytes_per_token == sum(w.nbytes for w in p.storage.weights if w.mode == "streamed")
    assert p.storage.kv_cache_bytes == 12345


def test_shrinking_budget_drops_layers_then_lm_head_then_embed_whose_lookup_streams_rows() -> None:
    g = qgraph()
    arena = make(g).arena.size
    stages = [
        {"norm", "embed", "lm_head", "blk.0", "blk.1"},
        {"norm", "embed", "lm_head", "blk.0"},
        {"norm", "embed", "lm_head"},
        {"norm", "embed"},
        # a streamed embedding reads only the looked-up rows (nothing staged): it goes before the small norm
        {"norm"},
    ]
    for pins in stages:
        budget = need(g, pins, arena, kv=4096)
        assert pinned_groups(make(g, budget_bytes=budget, pin_layers=2, kv_cache_bytes=4096)) == pins, pins
    # the smallest plan may give up the small vectors too (last)
    smallest = min(need(g, {"norm"}, arena, kv=4096), need(g, set(), arena, kv=4096),
                   need(g, set(), arena, kv=4096, small=False))
    with pytest.raises(BudgetError) as e:
        make(g, budget_bytes=smallest - 1, pin_layers=2, kv_cache_bytes=4096)
    assert e.value.required_bytes == smallest and e.value.budget_bytes == smallest - 1


def test_too_small_budget_names_every_number() -> None:
    g = qgraph()
    with pytest.raises(BudgetError) as e:
        make(g, budget_bytes=100_000, kv_cache_bytes=50_000)
    msg = str(e.value)
    arena = make(g).arena.size
    assert msg.startswith("[planner] memory budget of 100000 bytes is too small")
    assert f"arena {arena}" in msg and "KV cache 50000" in msg and "2 staging buffers x " in msg
    assert e.value.parts["kv_cache"] == 50_000 and e.value.parts["arena"] == arena
    assert "largest streamed tensor staged whole" in msg


def test_tied_embeddings_count_once() -> None:
    g = qgraph(tied=True)
    p = make(g, budget_bytes=64 * MiB)
    refs = [w.ref for w in p.storage.weights]
    assert refs.count("model.gguf#token_embd.weight") == 1 and "lm_head" not in modes(p)
    table = tensor_nbytes(g.tensor("token_embd.weight").dtype, (1000, 256))
    embed = next(grp for grp in summarize(p)["groups"] if grp["group"] == "embed")
    assert embed["bytes"] == table


def test_gathered_and_tied_tables_report_what_each_token_reads() -> None:
    g = qgraph(n_layers=1, tied=True)
    # one staging buffer: streaming the table then costs less than pinning it, so only the small vectors (the
    # norm scales) stay pinned
    p = make(g, budget_bytes=need(g, set(), make(g).arena.size, buffers=1), pin_layers=0, staging_buffers=1)
    assert pinned_groups(p) == {"norm"}
    table = tensor_nbytes(g.tensor("token_embd.weight").dtype, (1000, 256))
    # the streamed table: one row for the Embedding, the whole table for the tied lm_head
    per_token = sum(w.nbytes for w in p.storage.weights if w.mode == "streamed") + table // 1000
    assert p.storage.streamed_bytes_per_token == per_token


def test_layer_stream_unit_sizes_buffers_for_a_whole_layer() -> None:
    g = qgraph()
    p = make(g, budget_bytes=64 * MiB, pin_layers=0, stream_unit="layer")
    layer = sum(page(w.nbytes) for w in p.storage.weights if w.group == "blk.1" and w.mode == "streamed")
    assert p.storage.staging_buffers == (layer, layer)


def test_fill_pins_pins_more_layers_while_the_budget_holds() -> None:
    g = qgraph()
    arena = make(g).arena.size
    budget = need(g, {"norm", "embed", "lm_head", "blk.0", "blk.1"}, arena)
    plain = make(g, budget_bytes=budget, pin_layers=0)
    filled = make(g, budget_bytes=budget, pin_layers=0, fill_pins=True)
    assert pinned_groups(plain) == {"norm", "embed", "lm_head"}
    assert pinned_groups(filled) == {"norm", "embed", "lm_head", "blk.0", "blk.1"}
    assert summarize(filled)["total_bytes"] <= budget


def test_caller_supplied_weights_are_always_held() -> None:
    b = Builder()
    x = b.input("x", "f32", ["seq", 256])
    b.tensor("w", "f32", [256, 256], is_weight=True)  # no reference: the caller hands it over in memory
    b.outputs.append(b.op("MatMul", [x, "w"], [("y", "f32", ["seq", 256])], transpose_b=True))
    p = make(b.build(), budget_bytes=1 * MiB)
    assert [(w.ref, w.mode) for w in p.storage.weights] == [("w", "pinned")]


def moe_graph(n: int = 8, k: int = 2, layers: int = 1, dense: int = 0) -> Graph:
    """``layers`` MoE layers (router + 3 q4_k banks of n experts), each after ``dense`` f32 256x256 MatMuls."""
    b = Builder("moe")
    x = b.input("x", "f32", ["seq", 256])
    for i in range(layers):
        for j in range(dense):
            x = b.op("MatMul", [x, b.weight(f"blk.{i}.dense{j}.weight", "f32", [256, 256])],
                     [(f"d{i}.{j}", "f32", ["seq", 256])], transpose_b=True)
        logits = b.op("MatMul", [x, b.weight(f"blk.{i}.ffn_gate_inp.weight", "f32", [n, 256])],
                      [(f"logits{i}", "f32", ["seq", n])], transpose_b=True)
        b.op("MoERouter", [logits], [(f"rw{i}", "f32", ["seq", k]), (f"ri{i}", "i64", ["seq", k])], n_experts=n,
             top_k=k)
        banks = [b.weight(f"blk.{i}.ffn_{nm}_exps.weight", "q4_k", shape) for nm, shape in
                 (("gate", [n, 512, 256]), ("up", [n, 512, 256]), ("down", [n, 256, 512]))]
        x = b.op("MoEExperts", [x, f"rw{i}", f"ri{i}", *banks], [("y" if i == layers - 1 else f"h{i}", "f32",
                                                                    ["seq", 256])], n_experts=n, top_k=k)
    b.outputs.append(x)
    return check(b.build())


def test_moe_steps_read_top_k_experts_into_the_expert_cache_not_staging() -> None:
    g = moe_graph()
    p = make(g, budget_bytes=64 * MiB, pin_layers=0, expert_cache_bytes=1000)
    bank = tensor_nbytes(g.tensor("blk.0.ffn_gate_exps.weight").dtype, (8, 512, 256))
    expert = bank // 8
    router = 8 * 256 * 4
    # the experts go to the expert cache: staging holds the router only (it once also held 3 x top_k experts,
    # which the runtime never staged: the budget counted them twice)
    assert p.storage.staging_buffers == (window(router),) * 2
    assert p.storage.streamed_bytes_per_token == router + 3 * 2 * expert
    # a 1000-byte cache cannot hold one expert of each bank: the plan counts the smallest cache that can
    one_of_each = 3 * (page(expert) + 2 * PAGE)
    assert p.storage.expert_cache_bytes == one_of_each
    assert summarize(p)["total_bytes"] == (p.storage.pinned_bytes + p.storage.staging_bytes + one_of_each
                                           + p.arena.size)
    big = make(g, budget_bytes=64 * MiB, pin_layers=0, expert_cache_bytes=4 * MiB)
    assert big.storage.expert_cache_bytes == 4 * MiB and big.storage.staging_buffers == p.storage.staging_buffers


def test_streaming_several_moe_layers_pays_the_expert_cache_once() -> None:
    """Streaming one MoE layer brings in the whole expert cache and saves one layer: more than pinning it costs.
    Streaming both saves two layers for the same cache: the rule must not stop at the first drop."""
    g = moe_graph(layers=2)
    arena = make(g).arena.size
    cache = 2 * MiB
    layer = sum(w.nbytes for w in make(g).storage.weights if w.group == "blk.0")
    both = 2 * window(8 * 256 * 4) + cache + arena
    assert layer + cache > 2 * layer > both - arena - cache  # one drop costs more than it saves; two save
    p = make(g, budget_bytes=both, pin_layers=2, expert_cache_bytes=cache)
    assert modes(p) == {"blk.0": "streamed", "blk.1": "streamed"}
    assert p.storage.expert_cache_bytes == cache and summarize(p)["total_bytes"] == both
    with pytest.raises(BudgetError) as e:
        make(g, budget_bytes=both - 1, pin_layers=2, expert_cache_bytes=cache)
    assert e.value.required_bytes == both


def test_pinned_expert_banks_need_no_expert_cache() -> None:
    g = moe_graph()
    p = make(g, budget_bytes=64 * MiB, pin_layers=1, expert_cache_bytes=4 * MiB)
    assert pinned_groups(p) == {"blk.0"} and p.storage.expert_cache_bytes == 0
    assert summarize(p)["total_bytes"] == p.storage.pinned_bytes + p.arena.size


def test_a_moe_budget_counts_the_expert_cache_once() -> None:
    g = moe_graph()
    arena = make(g).arena.size
    bank = tensor_nbytes(g.tensor("blk.0.ffn_gate_exps.weight").dtype, (8, 512, 256))
    smallest = 2 * window(8 * 256 * 4) + 3 * (page(bank // 8) + 2 * PAGE) + arena
    p = make(g, budget_bytes=smallest, pin_layers=0, pin_small_bytes=0)
    assert summarize(p)["total_bytes"] == smallest
    with pytest.raises(BudgetError) as e:
        make(g, budget_bytes=smallest - 1, pin_layers=0, pin_small_bytes=0)
    assert "expert cache" in str(e.value) and e.value.required_bytes == smallest


def test_summary_has_the_documented_keys() -> None:
    p = make(qgraph(), budget_bytes=64 * MiB, pin_layers=1)
    s = summarize(p)
    assert {"budget_bytes", "pinned_bytes", "staging_bytes", "streamed_bytes_per_token", "groups"} <= set(s)
    assert s["budget_bytes"] == 64 * MiB and s["pinned_bytes"] == p.storage.pinned_bytes
    assert s["staging_bytes"] == sum(p.storage.staging_buffers)
    assert [grp["group"] for grp in s["groups"]] == ["embed", "blk.0", "blk.1", "blk.2", "norm", "lm_head"]
    assert all(set(grp) == {"group", "bytes", "mode"} for grp in s["groups"])
    assert sum(grp["bytes"] for grp in s["groups"]) == sum(w.nbytes for w in p.storage.weights)
    assert s["total_bytes"] <= 64 * MiB


def test_graph_without_weights_plans_empty_storage() -> None:
    b = Builder()
    x = b.input("x", "f32", ["seq", 8])
    b.outputs.append(b.op("Relu", [b.op("Relu", [x], [("h", "f32", ["seq", 8])])], [("y", "f32", ["seq", 8])]))
    g = make_graph("tiny", b.nodes, b.tensors.values(), b.inputs, b.outputs)
    p = make(g, budget_bytes=1 * MiB)
    assert p.storage.weights == () and p.storage.staging_buffers == () and p.storage.prefetch_order == ()


def test_row_chunkable_weights_do_not_size_the_staging_buffers() -> None:
    from uaii.planner.storage import CHUNK_MIN, WeightUse, staging_unit

    layer = WeightUse("m#blk.0.ffn_up.weight", 100_000, "blk.0", 1, True, staged={1: 100_000})
    head = WeightUse("m#output.weight", 30 * MiB, "lm_head", 9, True, staged={9: 30 * MiB}, chunk_row=20_000)
    lookup = WeightUse("m#token_embd.weight", 30 * MiB, "embed", 0, True, staged={0: 0}, chunk_row=20_000)
    assert staging_unit([layer], "tensor") == page(100_000)
    # the lm_head streams in row chunks of one buffer: at least CHUNK_MIN, else the largest unchunked step
    assert staging_unit([layer, head], "tensor") == CHUNK_MIN
    big = WeightUse("m#blk.1.ffn_up.weight", 3 * MiB, "blk.1", 2, True, staged={2: 3 * MiB})
    assert staging_unit([layer, big, head], "tensor") == page(3 * MiB)
    # an embedding lookup reads rows outside the staging pool
    assert staging_unit([layer, lookup], "tensor") == page(100_000)
    assert staging_unit([layer, head], "layer") == page(30 * MiB)  # layer mode stages whole tensors


# --- small vectors, spread layers -------------------------------------------------------------------------------
def test_small_vectors_are_pinned_first_and_given_up_last() -> None:
    """A streamed norm scale of 1 KiB would cost a staging page, a read request and a read-ahead slot every token:
    the 1-D weights of at most pin_small_bytes stay pinned while anything else can be dropped."""
    g = qgraph()
    arena = make(g).arena.size
    p = make(g, budget_bytes=need(g, set(), arena), pin_layers=2)
    norms = {w.ref.split("#")[1] for w in p.storage.weights if w.mode == "pinned"}
    assert norms == {f"blk.{i}.{n}_norm.weight" for i in range(3) for n in ("attn", "ffn")} | {"output_norm.weight"}
    assert not any("norm" in r for r in p.storage.prefetch_order)
    # the rule off: the norms stream with their layers
    off = make(g, budget_bytes=need(g, set(), arena), pin_layers=2, pin_small_bytes=0)
    assert any(r.endswith("blk.0.attn_norm.weight") for r in off.storage.prefetch_order)
    # below the smallest plan with them pinned, they are dropped too; below that, a BudgetError as before
    bare = need(g, set(), arena, small=False)
    assert bare < need(g, set(), arena)
    q = make(g, budget_bytes=bare, pin_layers=2)
    assert {w.mode for w in q.storage.weights if w.group != "embed"} == {"streamed"}
    with pytest.raises(BudgetError):
        make(g, budget_bytes=bare - 1, pin_layers=2)


def _layer(ref: str) -> int:
    return int(ref.split("#")[1].split(".")[1])


def test_even_pick_spreads_steps_evenly_over_the_trunk() -> None:
    """Error diffusion over the trunk's bytes: the picked steps track a straight line through the pass."""
    from uaii.planner.storage import WeightUse, even_pick

    trunk = [WeightUse(f"blk.{i}.{w}", n, f"blk.{i}", 3 * i + j, True, per_token=n)
             for i in range(30) for j, (w, n) in enumerate((("norm", 10), ("attn", 100), ("ffn", 190)))]
    units = [[f"blk.{i}.ffn"] for i in range(30)]
    picked = sorted(_layer("m#" + r) for r in even_pick(trunk, units, 3 * 190))
    assert len(picked) == 3 and {b - a for a, b in pairwise(picked)} == {10}
    every_other = sorted(_layer("m#" + r) for r in even_pick(trunk, units, 15 * 190))
    assert len(every_other) == 15 and {b - a for a, b in pairwise(every_other)} == {2}
    assert even_pick(trunk, units, 0) == set()
    # a unit of several weights is picked whole, at its last weight
    both = even_pick(trunk, [[f"blk.{i}.attn", f"blk.{i}.ffn"] for i in range(30)], 10 * 290)
    assert len(both) == 20 and all(f"blk.{_layer('m#' + r)}.attn" in both for r in both)


def test_fill_pins_spreads_the_streamed_weights_over_the_trunk() -> None:
    """Weights left streaming after fill_pins are evenly spread over the trunk, whole steps at a time (each read while
    the pinned weights before it compute), not the last layers in a row (read only while they compute: the staging
    pool holds a few steps ahead) - for about the bytes per token the layer-by-layer rule streams."""
    g = qgraph(n_layers=8)
    arena = make(g).arena.size
    pins = {"norm", "embed", "lm_head", *(f"blk.{i}" for i in range(6))}
    budget = need(g, pins, arena)  # six of eight layers fit
    opts = PlannerOptions(budget_bytes=budget, pin_layers=0, fill_pins=True)
    p = build_plan(g, opts)
    layers = sorted({_layer(w.ref) for w in p.storage.weights if w.mode == "streamed"})
    assert layers[0] <= 1 and layers[-1] == 7 and max(b - a for a, b in pairwise(layers)) <= 2
    assert summarize(p)["total_bytes"] <= budget
    in_order = make(g, budget_bytes=budget, pin_layers=6)  # the first six layers, the last two streamed
    assert pinned_groups(in_order) >= {f"blk.{i}" for i in range(6)}
    assert in_order.storage.streamed_bytes_per_token <= p.storage.streamed_bytes_per_token
    assert p.storage.streamed_bytes_per_token <= 1.05 * in_order.storage.streamed_bytes_per_token
    assert list(plan_problems(p, g, fuse(g, opts), opts)) == []  # the cache check derives the same staging


def test_fill_pins_spends_what_layers_leave_on_single_weights() -> None:
    """Whole layers leave up to a layer's size of the budget unused: fill_pins pins single streamed weights with it,
    which then are read no more."""
    g = qgraph(n_layers=8)
    arena = make(g).arena.size
    pins = {"norm", "embed", "lm_head", *(f"blk.{i}" for i in range(5))}
    exact = make(g, budget_bytes=need(g, pins, arena), pin_layers=0, fill_pins=True)
    streamed = [w for w in exact.storage.weights if w.mode == "streamed"]
    biggest = max(streamed, key=lambda w: w.nbytes)
    assert biggest.ref.endswith(("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"))
    more = make(g, budget_bytes=need(g, pins, arena) + biggest.nbytes, pin_layers=0, fill_pins=True)
    assert more.storage.streamed_bytes_per_token == exact.storage.streamed_bytes_per_token - biggest.nbytes
    assert summarize(more)["total_bytes"] <= need(g, pins, arena) + biggest.nbytes
    # without fill_pins the rule keeps whole groups only
    plain = make(g, budget_bytes=need(g, pins, arena) + biggest.nbytes, pin_layers=5)
    assert {w.group for w in plain.storage.weights if w.mode == "pinned" and w.nbytes > 64 * 1024} <= pins


def test_read_ahead_covers_the_longest_pinned_run_at_the_pace_of_the_reads() -> None:
    """W = g x B0: the longest pinned run's share g of a pass (around the end of a pass into the next) times what
    streams without read-ahead (B0 = B - (W - pool)), at most ``ratio`` x the run's bytes."""
    from uaii.planner.storage import WeightUse, read_ahead_bytes

    table = WeightUse("embd", 4000, "embed", 0, True, per_token=4000)  # a tied table: read whole by the lm_head
    layers = [WeightUse(f"blk.{i}.w", 100, f"blk.{i}", i + 1, True, per_token=100) for i in range(10)]
    uses = [table, *layers]
    streamed = [layers[3], layers[6]]
    # the longest run wraps around: layers 7-9, then the table and layers 0-2 of the next pass
    run, total, rate, pool = 3 * 100 + 4000 + 3 * 100, 5000, 200, 100
    assert read_ahead_bytes(uses, streamed, pool, 1.0) == -(-run * (rate + pool) // (total + run))
    assert read_ahead_bytes(uses, streamed, pool, 1 / 1000) == int(run / 1000)
    assert read_ahead_bytes(uses, [], pool, 1.0) == 0
    assert read_ahead_bytes(uses, layers, pool, 1.0) == -(-4000 * (1000 + pool) // (5000 + 4000))


def test_read_ahead_sizes_staging_to_read_through_a_pinned_lm_head() -> None:
    """With a large pinned lm_head the disk can only fill the staging pool while it computes: read_ahead makes the
    pool hold what the disk reads in that time at the pass's pace; every byte more of pool is a byte less pinned."""
    g = llama(6, dims=Dims(d=256, heads=4, kv=2, head_dim=64, ff=512, vocab=24000), wdtype="q4_k", tied=True)
    arena = make(g).arena.size
    pins = {"norm", "embed", "lm_head", *(f"blk.{i}" for i in range(4))}
    budget = need(g, pins, arena)
    plain = PlannerOptions(budget_bytes=budget, pin_layers=0, fill_pins=True)
    ahead = replace(plain, read_ahead=1 / 16)
    p, q = build_plan(g, plain), build_plan(g, ahead)
    assert sum(q.storage.staging_buffers) > sum(p.storage.staging_buffers)
    assert len(set(q.storage.staging_buffers)) == 1 and summarize(q)["total_bytes"] <= budget
    grown = sum(q.storage.staging_buffers) - sum(p.storage.staging_buffers)
    assert q.storage.streamed_bytes_per_token - p.storage.streamed_bytes_per_token >= grown * 0.9
    table = next(w.nbytes for w in q.storage.weights if w.group == "embed")
    assert sum(q.storage.staging_buffers) <= table / 16 + 2 * PAGE  # at most 1/16 of the run it reads through
    assert list(plan_problems(q, g, fuse(g, ahead), ahead)) == []
    with pytest.raises(Exception, match="read_ahead must be a fraction"):
        PlannerOptions(read_ahead=2)


def test_fill_pins_never_pins_an_expert_bank_alone() -> None:
    """A MoE step reads all its banks through the expert cache: a bank pinned alone would still be read, and would
    save only top_k / n_experts of its bytes. Single-weight fill leaves banks to whole-layer decisions."""
    g = moe_graph(layers=2)
    full = make(g, budget_bytes=64 * MiB, pin_layers=2)
    layer = sum(w.nbytes for w in full.storage.weights if w.group == "blk.1")
    bank = max(w.nbytes for w in full.storage.weights if w.group == "blk.1")
    budget = summarize(full)["total_bytes"] - layer // 2  # blk.1 cannot stay pinned; room for a bank of it
    p = make(g, budget_bytes=budget, pin_layers=2, fill_pins=True)
    banks = [w for w in p.storage.weights if "_exps" in w.ref]
    assert {w.mode for w in banks if w.group == "blk.1"} == {"streamed"}
    # the room a bank would have taken is the (auto) expert cache's
    assert summarize(p)["total_bytes"] == budget and p.storage.expert_cache_bytes >= bank // 2


def test_auto_expert_cache_takes_what_the_budget_leaves() -> None:
    """With fill_pins and expert_cache_bytes 0 (what a Session under a budget plans with by default) the expert
    cache gets every byte the pinned dense weights, staging, KV cache and arena leave, and no MoE layer is pinned
    whole; an explicit cache size keeps that size and the whole-layer rule. A cached plan's check recomputes the
    same figure (check_plan: no finding)."""
    g = moe_graph(layers=3, dense=1)
    full = make(g, budget_bytes=64 * MiB, pin_layers=3)
    layer = sum(w.nbytes for w in full.storage.weights if w.group == "blk.2")
    budget = summarize(full)["total_bytes"] - layer // 2
    auto = make(g, budget_bytes=budget, pin_layers=0, fill_pins=True)
    assert summarize(auto)["total_bytes"] == budget
    assert all(w.mode == "streamed" for w in auto.storage.weights if "_exps" in w.ref)
    assert all(w.mode == "pinned" for w in auto.storage.weights if ".dense" in w.ref)
    smallest = make(g, budget_bytes=budget, pin_layers=0)       # no fill: the smallest cache
    assert auto.storage.expert_cache_bytes > 2 * smallest.storage.expert_cache_bytes
    opts = PlannerOptions(budget_bytes=budget, pin_layers=0, fill_pins=True)
    assert list(plan_problems(auto, g, fuse(g, opts), opts)) == []
    # a cached plan whose cache is not what the budget leaves is refused
    shrunk = replace(auto, storage=replace(auto.storage, expert_cache_bytes=auto.storage.expert_cache_bytes - PAGE))
    assert any("expert_cache_bytes" in p for p in plan_problems(shrunk, g, fuse(g, opts), opts))
    explicit = make(g, budget_bytes=budget, pin_layers=0, fill_pins=True, expert_cache_bytes=1 << 20)
    assert explicit.storage.expert_cache_bytes == 1 << 20
    assert any(w.mode == "pinned" for w in explicit.storage.weights if "_exps" in w.ref)


def test_fill_pins_pins_dense_weights_before_expert_banks() -> None:
    """Pinning a whole MoE layer saves top_k / n_experts of its banks per token; a dense weight pinned saves all of
    its bytes. With room for one whole layer, pinning the dense weights of both layers reads less per token."""
    g = moe_graph(k=1, layers=2, dense=2)
    full = make(g, budget_bytes=64 * MiB, pin_layers=2)
    weights = full.storage.weights
    dense = [w for w in weights if ".dense" in w.ref]
    layer0 = sum(w.nbytes for w in weights if w.group == "blk.0")
    streaming = make(g, budget_bytes=64 * MiB, pin_layers=0, pin_small_bytes=0)  # everything streams
    base = summarize(streaming)["total_bytes"]
    budget = base + layer0  # one whole layer fits (its staging and cache share aside)
    p = make(g, budget_bytes=budget, pin_layers=0, fill_pins=True)
    assert {w.ref for w in p.storage.weights if w.mode == "pinned" and w in dense} == {w.ref for w in dense}
    assert all(w.mode == "streamed" for w in p.storage.weights if "_exps" in w.ref)
    # only the banks stream: top-1 of 8 experts of 3 banks in both layers (the routers are pinned too)
    banks = sum(w.nbytes for w in weights if "_exps" in w.ref)
    assert p.storage.streamed_bytes_per_token == banks // 8
    assert summarize(p)["total_bytes"] <= budget
    # pinning the whole first layer instead would have saved less per token: its dense weights + top-1 experts
    blk0_dense = sum(w.nbytes for w in dense if w.group == "blk.0")
    blk0_banks = sum(w.nbytes for w in weights if w.group == "blk.0" and "_exps" in w.ref)
    assert blk0_dense + blk0_banks // 8 < sum(w.nbytes for w in dense)

"""The storage plan: grouping by layer, the pinning rule under a budget, staging sizes, prefetch order, summary."""

from __future__ import annotations

import re
from collections.abc import Collection

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


def need(graph: Graph, pinned: Collection[str], arena: int, kv: int = 0, buffers: int = 2) -> int:
    """The budget a pin set needs, computed independently: pins + buffers x largest streamed step + arena + KV."""
    fused = fuse(graph)
    sizes = {t.name: tensor_nbytes(t.dtype, t.shape) for t in fused.weights}
    held = sum(n for name, n in sizes.items() if group_of(fused.tensor(name)) in pinned)
    steps = [sum(page(sizes[v]) for v in n.inputs if v in sizes and group_of(fused.tensor(v)) not in pinned)
             for n in fused.nodes if n.op != "Embedding"]  # a streamed lookup reads rows, outside staging
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
    assert modes(p)["blk.1"] == modes(p)["blk.2"] == "streamed"
    # two buffers, each the largest streamed step: the grouped gate/up MatMul stages both weights at once
    gate_up = 2 * tensor_nbytes(g.tensor("blk.1.ffn_gate.weight").dtype, (512, 256))
    assert p.storage.staging_buffers == (gate_up, gate_up)
    streamed = [w.ref.split("#")[1] for w in p.storage.weights if w.mode == "streamed"]
    assert list(p.storage.prefetch_order) == [f"model.gguf#{n}" for n in streamed]
    assert streamed[0] == "blk.1.attn_norm.weight" and streamed[-1] == "blk.2.ffn_down.weight"
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
    smallest = min(need(g, {"norm"}, arena, kv=4096), need(g, set(), arena, kv=4096))
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
    # one staging buffer: streaming the table then costs less than pinning it, so nothing stays pinned
    p = make(g, budget_bytes=need(g, set(), make(g).arena.size, buffers=1), pin_layers=0, staging_buffers=1)
    assert pinned_groups(p) == set()
    table = tensor_nbytes(g.tensor("token_embd.weight").dtype, (1000, 256))
    # the streamed table: one row for the Embedding, the whole table for the tied lm_head
    per_token = sum(w.nbytes for w in p.storage.weights if w.mode == "streamed") + table // 1000
    assert p.storage.streamed_bytes_per_token == per_token


def test_layer_stream_unit_sizes_buffers_for_a_whole_layer() -> None:
    g = qgraph()
    p = make(g, budget_bytes=64 * MiB, pin_layers=0, stream_unit="layer")
    layer = sum(page(w.nbytes) for w in p.storage.weights if w.group == "blk.1")
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


def moe_graph(n: int = 8, k: int = 2) -> Graph:
    b = Builder("moe")
    x = b.input("x", "f32", ["seq", 256])
    logits = b.op("MatMul", [x, b.weight("blk.0.ffn_gate_inp.weight", "f32", [n, 256])],
                  [("logits", "f32", ["seq", n])], transpose_b=True)
    b.op("MoERouter", [logits], [("rw", "f32", ["seq", k]), ("ri", "i64", ["seq", k])], n_experts=n, top_k=k)
    banks = [b.weight(f"blk.0.ffn_{nm}_exps.weight", "q4_k", shape) for nm, shape in
             (("gate", [n, 512, 256]), ("up", [n, 512, 256]), ("down", [n, 256, 512]))]
    b.outputs.append(b.op("MoEExperts", [x, "rw", "ri", *banks], [("y", "f32", ["seq", 256])], n_experts=n,
                          top_k=k))
    return check(b.build())


def test_moe_steps_stage_and_read_top_k_experts() -> None:
    g = moe_graph()
    p = make(g, budget_bytes=64 * MiB, pin_layers=0, expert_cache_bytes=1000)
    bank = tensor_nbytes(g.tensor("blk.0.ffn_gate_exps.weight").dtype, (8, 512, 256))
    expert = bank // 8
    assert p.storage.staging_buffers == (3 * page(2 * expert),) * 2
    router = 8 * 256 * 4
    assert p.storage.streamed_bytes_per_token == router + 3 * 2 * expert
    assert p.storage.expert_cache_bytes == 1000
    assert summarize(p)["total_bytes"] == (p.storage.pinned_bytes + p.storage.staging_bytes + 1000
                                           + p.arena.size)


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

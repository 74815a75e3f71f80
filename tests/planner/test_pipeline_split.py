"""Pipeline stages (uaii.planner.pipeline): where a decoder is cut, that the stages run one after the other compute
what the whole graph computes (NumPy reference, bit for bit: the same nodes on the same inputs), and how the split
follows the stages' budgets."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from planner_helpers import Builder, llama, llama_feeds, random_weights

from uaii.ir import check
from uaii.ir.reference import evaluate
from uaii.planner import PlannerError, choose_split, layer_cuts, split_graph


def run_stages(stages: list, feeds: dict, weights: dict) -> dict:
    """The stages in order, each fed the model's inputs it reads and what the one before it sent."""
    carried: dict = {}
    outputs: dict = {}
    for st in stages:
        ins = {x: feeds[x] for x in st.graph.inputs if x in feeds} | {v: carried[v] for v in st.receives}
        out = evaluate(st.graph, ins, weights)
        outputs.update(out)
        carried = {v: (out[v] if v in out else carried[v]) for v in st.sends}
    return outputs


def test_each_cut_is_between_layers_with_only_the_residual_stream_crossing() -> None:
    g = llama(4)
    cuts = layer_cuts(g)
    assert [c.layer for c in cuts] == [1, 2, 3]
    assert [c.crossing for c in cuts] == [("blk.0.ffn_residual",), ("blk.1.ffn_residual",), ("blk.2.ffn_residual",)]
    for c in cuts:  # the cut is right after the layer's last node: its feed-forward stays with its attention
        assert g.nodes[c.position - 1].outputs == c.crossing
        assert g.nodes[c.position].name == f"blk.{c.layer}.attn_norm/RMSNorm"


@pytest.mark.parametrize(("layers", "starts"), [(2, [1]), (4, [1, 3]), (4, [2]), (5, [1, 2, 3, 4])])
@pytest.mark.parametrize("tied", [False, True])
def test_stages_in_order_compute_the_whole_graph(layers: int, starts: list[int], tied: bool) -> None:
    g = llama(layers, tied=tied)
    stages = split_graph(g, starts)
    weights, feeds = random_weights(g), llama_feeds(g)
    want = evaluate(g, feeds, weights)
    got = run_stages(stages, feeds, weights)
    assert set(g.outputs) <= set(got)
    for name in g.outputs:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # every node runs in exactly one stage; each stage is a valid graph with its own layers' caches
    names = [n.name for st in stages for n in st.graph.nodes]
    assert sorted(names) == sorted(n.name for n in g.nodes)
    bounds = [0, *starts, layers]
    for st in stages:
        check(st.graph)  # raises on an invalid graph
        assert (st.first, st.last) == (bounds[st.index], bounds[st.index + 1])
        pasts = sorted(x for x in st.graph.inputs if x.startswith("past_k."))
        assert pasts == sorted(f"past_k.{i}" for i in range(st.first, st.last))
    assert stages[0].receives == () and stages[-1].sends == ()
    assert "token_embd.weight" in {t.name for t in stages[0].graph.weights}
    head = {t.name for t in stages[-1].graph.weights}
    assert ("token_embd.weight" if tied else "output.weight") in head


def test_a_value_read_two_stages_later_is_forwarded_by_the_stage_between() -> None:
    """A skip connection over a cut (here the embedding, read again by the head) crosses every cut in between: the
    stage that does not read it passes it on."""
    g = llama(3)
    b = Builder("skip")
    logits = next(n for n in g.nodes if n.outputs[0] == "logits")
    mixed = ("embd_plus_norm", "f32", ["seq", 32])
    extra = b.op("Add", ["embd", "output_norm"], [mixed])
    nodes = [n for n in g.nodes if n is not logits]
    new_logits = replace(logits, inputs=(extra, *logits.inputs[1:]))
    built = b.build()
    g2 = replace(g, nodes=(*nodes, *built.nodes, new_logits), tensors=(*g.tensors, *built.tensors))
    stages = split_graph(g2, [1, 2])
    assert stages[1].forwards == ("embd",) and "embd" not in stages[1].receives
    weights, feeds = random_weights(g2), llama_feeds(g2)
    np.testing.assert_array_equal(run_stages(stages, feeds, weights)["logits"], evaluate(g2, feeds, weights)["logits"])


def test_bad_starts_are_refused_with_the_layer_range() -> None:
    g = llama(3)
    for starts in ([0], [3], [2, 1], [1, 1]):
        with pytest.raises(PlannerError, match=r"ascending layers in 1\.\.2 .* 3 cached layers"):
            split_graph(g, starts)


def test_a_graph_without_cached_layers_cannot_be_split() -> None:
    b = Builder("mlp")
    x = b.input("x", "f32", ["seq", 4])
    y = b.op("Relu", [x], [("y", "f32", ["seq", 4])])
    b.outputs.append(y)
    with pytest.raises(PlannerError, match="no cached Attention layers"):
        layer_cuts(b.build())


def test_the_split_follows_the_budgets() -> None:
    g = llama(6)  # layers of equal size; stage 0 also holds the embedding, the last the head and the final norm
    layer = split_graph(g, [1])[0].weight_bytes  # embedding + layer 0
    even = choose_split(g, 3, [0])  # no budgets: the most even split
    assert even == [2, 4]
    # a small first node: fewer layers there, so that nothing streams
    sizes = [st.weight_bytes for st in split_graph(g, [1, 4])]
    small_first = choose_split(g, 3, [sizes[0], sizes[1], sizes[2]])
    assert small_first == [1, 4]
    # budgets no split fits: the one that streams the fewest bytes in all
    tight = choose_split(g, 2, [layer, layer])
    total_over = [sum(max(0, st.weight_bytes - layer) for st in split_graph(g, [s])) for s in range(1, 6)]
    assert total_over[tight[0] - 1] == min(total_over)
    with pytest.raises(PlannerError, match="7 pipeline stages for 6 cached layers"):
        choose_split(g, 7, [0])
    with pytest.raises(PlannerError, match="2 stage budgets for 3 stages"):
        choose_split(g, 3, [1, 2])
